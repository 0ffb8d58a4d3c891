"""Custom workload: any JSONL file of prompts given by ``path``.

One JSON object per line, with exactly one of

- ``"prompt"``: a non-empty string sent as raw text (no chat template), or
- ``"messages"``: a chat, a non-empty list of ``{"role", "content"}`` with roles
  ``system``/``user``/``assistant`` and a final ``user`` message,

and optionally ``"max_tokens"`` (an integer >= 1 that overrides the workload cap for
that prompt) and ``"id"`` (a unique non-empty string; default ``line<N>``). Any other key
is rejected so that a typo such as ``"max_token"`` does not go unnoticed. Every error
names ``file:line`` and the fix.

The train/eval split is the usual hash of the id; the registry default for this
workload is ``split="all"`` because a user's file is usually meant to be run whole.
"""

from __future__ import annotations

from pathlib import Path

from .base import Prompt, Workload, WorkloadError, validate_messages
from .jsonl import iter_json_lines

ALLOWED_KEYS = ("prompt", "messages", "max_tokens", "id")


def load_custom_prompts(path: str | Path) -> list[Prompt]:
    """Prompts from a custom JSONL file (format in the module docstring)."""
    prompts: list[Prompt] = []
    first_line: dict[str, int] = {}
    for lineno, record in iter_json_lines(path, what="custom prompt file"):
        where = f"{path}:{lineno}"
        unknown = sorted(set(record) - set(ALLOWED_KEYS))
        if unknown:
            raise WorkloadError(f"{where}: unknown keys {unknown}; allowed keys: {list(ALLOWED_KEYS)}")
        has_prompt, has_messages = "prompt" in record, "messages" in record
        if has_prompt == has_messages:
            raise WorkloadError(f"{where}: give exactly one of 'prompt' (raw text) or 'messages' (chat), got "
                                f"{'both' if has_prompt else 'neither'}")
        if has_prompt:
            text = record["prompt"]
            if not isinstance(text, str) or not text.strip():
                raise WorkloadError(f"{where}: 'prompt' must be a non-empty string, got {text!r:.80}")
        else:
            validate_messages(record["messages"], where)
        max_tokens = record.get("max_tokens")
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 1):
            raise WorkloadError(f"{where}: 'max_tokens' must be an integer >= 1, got {max_tokens!r}")
        prompt_id = record.get("id", f"line{lineno}")
        if isinstance(prompt_id, int) and not isinstance(prompt_id, bool):
            prompt_id = str(prompt_id)  # numeric ids are common in JSONL files; they stay unique as text
        if not isinstance(prompt_id, str) or not prompt_id:
            raise WorkloadError(f"{where}: 'id' must be a non-empty string, got {prompt_id!r}")
        if prompt_id in first_line:
            raise WorkloadError(f"{where}: duplicate id {prompt_id!r} (first used on line {first_line[prompt_id]}); "
                                "ids must be unique")
        first_line[prompt_id] = lineno
        prompts.append(Prompt(id=f"custom/{prompt_id}", messages=record.get("messages"), prompt=record.get("prompt"),
                              max_tokens=max_tokens, source="custom"))
    if not prompts:
        raise WorkloadError(f"{path}: the custom prompt file has no prompts (only blank lines)")
    return prompts


class CustomWorkload(Workload):
    """Prompts from the JSONL file at ``spec.path``."""

    NAME = "custom"

    def load_pool(self) -> list[Prompt]:
        if self.spec.path is None:
            raise WorkloadError("workload.path: the custom workload needs a JSONL file; set workload.path=/path/to/"
                                "prompts.jsonl (one {\"prompt\": ...} or {\"messages\": [...]} object per line)")
        return load_custom_prompts(self.spec.path)


__all__ = ["ALLOWED_KEYS", "CustomWorkload", "load_custom_prompts"]
