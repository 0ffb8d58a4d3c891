"""A validated API request -> the engine's prompt token ids and SamplingParams.

Prompts are tokenized the way ``Engine.add_request`` tokenizes them (``tokenizer.encode`` for text,
``tokenizer.encode_chat`` for messages; on the event loop or in worker processes, ``prompt_workers``), so a
request through the server and the same prompt through ``Engine.generate`` decode the same tokens. Lengths are
checked as OpenAI checks them: a prompt that leaves no room in the context, or ``max_tokens`` beyond it, is a 400
``context_length_exceeded``.
"""

from __future__ import annotations

from dspark.config import ConfigError, SamplingParams
from dspark.serving.prompt_workers import PromptRefused, PromptWorkers
from dspark.serving.protocol import ChatCompletionRequest, CompletionRequest, GenerationRequest, invalid

# OpenAI's default max_tokens for /v1/completions; chat completions may fill the context.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


async def chat_prompt_ids(workers: PromptWorkers, request: ChatCompletionRequest) -> list[int]:
    try:
        return await workers.chat_ids([m.for_template() for m in request.messages])
    except PromptRefused as e:  # a template's raise_exception("...") included
        raise invalid(f"messages: the chat template refused them: {e}", param="messages") from None


async def completion_prompt_ids(workers: PromptWorkers, request: CompletionRequest) -> list[int]:
    prompt = request.single_prompt()
    return await workers.text_ids(prompt) if isinstance(prompt, str) else list(prompt)


def sampling_params(request: GenerationRequest, prompt_len: int, max_model_len: int, prompt_param: str,
                    default_max_tokens: int | None) -> SamplingParams:
    """The request's SamplingParams. ``default_max_tokens`` None: up to the end of the context."""
    room = max_model_len - prompt_len
    if room < 1:
        raise invalid(f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
                      f"{prompt_len} tokens, which leaves no room for a completion. Please reduce the length of "
                      f"the {prompt_param}.", param=prompt_param, code="context_length_exceeded")
    max_tokens = request.requested_max_tokens()
    if max_tokens is None:
        max_tokens = room if default_max_tokens is None else min(default_max_tokens, room)
    elif max_tokens < 1:
        raise invalid(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
    elif max_tokens > room:
        raise invalid(f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                      f"{prompt_len + max_tokens} tokens ({prompt_len} in the {prompt_param}, {max_tokens} in the "
                      f"completion). Please reduce the length of the {prompt_param} or completion.",
                      param="max_tokens", code="context_length_exceeded")
    try:
        return SamplingParams(temperature=1.0 if request.temperature is None else request.temperature,
                              top_p=1.0 if request.top_p is None else request.top_p, top_k=request.top_k or 0,
                              max_tokens=max_tokens, ignore_eos=bool(request.ignore_eos),
                              stop=request.stop_strings(), seed=request.seed)
    except ConfigError as e:  # "sampling.top_p: must be in (0, 1], got 0.0"
        key, _, why = str(e).partition(": ")
        param = key.removeprefix("sampling.")
        raise invalid(f"{param}: {why}", param=param) from None
