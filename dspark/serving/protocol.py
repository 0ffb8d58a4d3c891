"""Request and response bodies of the OpenAI-compatible API, and its error bodies.

Requests are validated by these models (an unknown argument is refused, as OpenAI refuses it);
parameters the engine does not implement are accepted only at their no-op values (``n=1``,
penalties 0, no logprobs). ``top_k``, ``ignore_eos`` and ``return_token_ids`` are extensions under vLLM's
names. Responses carry one field beyond OpenAI's: ``acceptance``, the request's speculative-decoding
acceptance; with ``return_token_ids`` also the prompt's token ids (``prompt_token_ids``) and each choice's
output token ids (``token_ids``: the whole output, or in a streamed chunk the tokens it adds).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer


class ApiError(Exception):
    """A request failed; the server answers ``status`` with OpenAI's error body."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, type="server_error", code="service_unavailable")


# The names pydantic gives a union's members in an error's location (``prompt.str``, ``stop.list[str]``).
UNION_MEMBER_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})


def _parameter_path(loc) -> list[str]:
    """The parameter an error's location names: without the leading ``body`` and without the union member tags
    pydantic appends (``prompt.str`` is the parameter ``prompt``); list indices and nested fields stay."""
    path = []
    for part in loc:
        part = str(part)
        if part == "body" and not path:
            continue
        if part in UNION_MEMBER_TAGS or "[" in part:
            break
        path.append(part)
    return path


def error_from_validation(errors: list[dict[str, Any]]) -> ApiError:
    """The 400 for a body that failed validation (pydantic's error list), naming the first bad parameter."""
    first = errors[0]
    loc = _parameter_path(first.get("loc", ()))
    param = ".".join(loc) or None
    kind = first.get("type", "")
    if kind == "json_invalid":
        return ApiError(400, "We could not parse the JSON body of your request. The body must be a JSON object "
                             f"({first.get('msg', 'invalid JSON')}).", code="invalid_json")
    if kind == "extra_forbidden":
        return invalid(f"Unrecognized request argument supplied: {param}", param=param, code="unknown_parameter")
    if kind == "missing":
        return invalid(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    if not loc:
        return invalid(f"The request body must be a JSON object: {first.get('msg')}", code="invalid_type")
    return invalid(f"Invalid value for '{param}': {first.get('msg')}.", param=param,
                   code="invalid_type" if kind.endswith("_type") or kind.endswith("_parsing") else "invalid_value")


# ---- requests ----------------------------------------------------------------------------------

class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False  # a last chunk with the request's usage and no choices


class GenerationRequest(BaseModel):
    """The parameters both endpoints share. Types are strict (``"stream": "yes"`` or ``"max_tokens": true`` is a
    400, not a guess) and numbers finite (``"temperature": Infinity`` or ``1e400`` is a 400); JSON integers are
    taken where a number is."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    model: str | None = None  # None: the served model
    max_tokens: int | None = None
    temperature: float | None = None  # None: 1.0, as OpenAI
    top_p: float | None = None  # None: 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Accepted at their no-op values only.
    n: int | None = 1
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    # Extensions.
    top_k: int | None = None  # None or 0: no top-k
    ignore_eos: bool | None = False
    # The prompt's and the output's token ids in the response; streamed, a chunk is sent for every engine step
    # that commits tokens, with those tokens, even when their text is held back (stop strings, a partial character).
    return_token_ids: bool | None = False

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def refuse_unsupported(self) -> None:
        """400 for a parameter set to a value this server does not implement."""
        if self.n not in (None, 1):
            raise invalid(f"n={self.n}: this server returns one choice per request (n=1)", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise invalid(f"{name} is not supported by this server (only 0)", param=name)
        if self.stream_options is not None and not self.stream:
            raise invalid("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                          param="stream_options")


class TextContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls, ...: handed to the chat template

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextContentPart] | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template reads it, its content parts joined into one string."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        return {**(self.model_extra or {}), "role": self.role, "content": content or ""}


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = False

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs:
            raise invalid("logprobs are not supported by this server", param="logprobs")


class CompletionRequest(GenerationRequest):
    # Text, or token ids; a batch of prompts is refused (one prompt per request).
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = False
    suffix: str | None = None
    logprobs: int | None = None
    best_of: int | None = None

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise invalid(f"prompt: a batch of {len(p)} prompts; send one prompt per request", param="prompt")
            p = p[0]
        if isinstance(p, list) and not p:
            raise invalid("prompt: empty list of token ids", param="prompt")
        return p

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo:
            raise invalid("echo is not supported by this server", param="echo")
        if self.suffix:
            raise invalid("suffix is not supported by this server", param="suffix")
        if self.logprobs is not None:
            raise invalid("logprobs are not supported by this server", param="logprobs")
        if self.best_of not in (None, 1):
            raise invalid("best_of is not supported by this server (only 1)", param="best_of")


# ---- responses ---------------------------------------------------------------------------------

class OmitsNoneFields(BaseModel):
    """Serialized without the fields named in ``OMIT_WHEN_NONE`` that are None (a stream chunk's delta
    carries only what changed; usage and acceptance appear on the chunks that have them)."""

    OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_none(self, handler):
        data = handler(self)
        for name in self.OMIT_WHEN_NONE:
            if data.get(name, 0) is None:
                del data[name]
        return data


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Acceptance(BaseModel):
    """A request's speculative decoding: per decode step the tokens it committed (accepted drafts plus the
    target's own token) and the drafts it sent the target to verify, its totals under vLLM's spec-decode
    counter names, and per draft position (0-based) the steps that accepted it and the steps whose
    verification reached it (``dspark.request.Request.pos_accepted`` / ``pos_reached``)."""

    num_steps: int
    accept_lengths: list[int]
    mean_accept_length: float | None
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    verify_lengths: list[int]
    per_position_accepted: list[int]
    per_position_reached: list[int]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(OmitsNoneFields):
    OMIT_WHEN_NONE = ("token_ids",)

    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None
    token_ids: list[int] | None = None  # return_token_ids: the output's token ids


class ChatCompletionResponse(OmitsNoneFields):
    OMIT_WHEN_NONE = ("prompt_token_ids",)

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    acceptance: Acceptance
    prompt_token_ids: list[int] | None = None  # return_token_ids: the prompt's token ids (chat template applied)


class ChatDelta(OmitsNoneFields):
    OMIT_WHEN_NONE = ("role", "content")

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(OmitsNoneFields):
    OMIT_WHEN_NONE = ("token_ids",)

    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: None = None
    token_ids: list[int] | None = None  # return_token_ids: the tokens this chunk adds


class ChatCompletionChunk(OmitsNoneFields):
    OMIT_WHEN_NONE = ("usage", "acceptance", "prompt_token_ids")

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    acceptance: Acceptance | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids: on the first chunk


class CompletionChoice(OmitsNoneFields):
    OMIT_WHEN_NONE = ("token_ids",)

    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: None = None
    token_ids: list[int] | None = None  # return_token_ids: the output's (streamed: this chunk's) token ids


class CompletionResponse(OmitsNoneFields):
    """A completion, or (streamed) one chunk of it."""

    OMIT_WHEN_NONE = ("usage", "acceptance", "prompt_token_ids")

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    acceptance: Acceptance | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids: the prompt's token ids (streamed: first chunk)


class ContentChunks:
    """The JSON of a stream's content chunks (a text delta and, with return_token_ids, its token ids; no finish
    reason, usage or acceptance): what ``ChatCompletionChunk`` (``chat``) or ``CompletionResponse`` serialize to
    for such a chunk, built from a prefix rendered once per request. A stream sends one per engine step or more,
    and a pydantic model per chunk was one of the larger costs of the server's event loop."""

    def __init__(self, *, chat: bool, id: str, created: int, model: str):
        kind = "chat.completion.chunk" if chat else "text_completion"
        head = json.dumps({"id": id, "object": kind, "created": created, "model": model})
        self._head = head[:-1] + ', "choices": [{"index": 0, ' + ('"delta": {"content": ' if chat else '"text": ')
        self._close = ("}" if chat else "") + ', "finish_reason": null, "logprobs": null'

    def render(self, text: str, token_ids: list[int] | None = None) -> str:
        ids = "" if token_ids is None else ', "token_ids": ' + json.dumps(token_ids)
        return self._head + json.dumps(text) + self._close + ids + "}]}"


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "dspark-bench"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
