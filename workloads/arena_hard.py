"""Arena-hard-style workload: hard open questions, greedy, 512 output tokens.

By default the questions come from ``workloads/data/arena_hard_style.jsonl``: 72
ORIGINAL questions written for this project in the style of arena-hard (multi-step
reasoning, coding with constraints, system design, math word problems, careful
writing, debugging), 12 per category. None is copied from arena-hard-auto.

``path=`` reads a file in the real arena-hard-auto ``question.jsonl`` format instead:
one JSON object per line with an id (``question_id``, or ``uid`` in later releases),
an optional ``category`` (else ``cluster``, else ``subcategory``) and the question as
``turns[0].content`` (or a top-level ``prompt``). Only the first turn is used, since
later turns would need the model's earlier answers. A malformed line raises an error
naming ``file:line`` and the missing field.

Arena questions are evaluation material, so ``EVAL_PERCENT`` is 80 here: most ids hash
into the eval split and only about a fifth are available to drafter training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import Prompt, Workload, WorkloadError
from .jsonl import iter_json_lines

PACKAGED_QUESTIONS = Path(__file__).resolve().parent / "data" / "arena_hard_style.jsonl"
ID_FIELDS = ("question_id", "uid")
CATEGORY_FIELDS = ("category", "cluster", "subcategory")


def _question_text(record: dict[str, Any], where: str) -> str:
    turns = record.get("turns")
    if turns is not None:
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], dict):
            raise WorkloadError(f"{where}: 'turns' must be a non-empty list of {{'content': str}} objects, "
                                f"got {turns!r:.80}")
        content = turns[0].get("content")
        if not isinstance(content, str) or not content.strip():
            raise WorkloadError(f"{where}: turns[0] is missing a non-empty string 'content'")
        return content
    prompt = record.get("prompt")
    if prompt is None:
        raise WorkloadError(f"{where}: missing the question: give 'turns': [{{'content': ...}}] or 'prompt'")
    if not isinstance(prompt, str) or not prompt.strip():
        raise WorkloadError(f"{where}: 'prompt' must be a non-empty string, got {prompt!r:.80}")
    return prompt


def load_arena_questions(path: str | Path) -> list[Prompt]:
    """Prompts from an arena-hard ``question.jsonl``-format file (see the module docstring)."""
    prompts: list[Prompt] = []
    first_line: dict[str, int] = {}
    for lineno, record in iter_json_lines(path, what="arena-hard question file"):
        where = f"{path}:{lineno}"
        qid = next((record[f] for f in ID_FIELDS if f in record), None)
        if isinstance(qid, bool) or not isinstance(qid, (str, int)) or str(qid) == "":
            raise WorkloadError(f"{where}: missing question id: give a non-empty 'question_id' (or 'uid'), "
                                f"got {qid!r}")
        qid = str(qid)
        if qid in first_line:
            raise WorkloadError(f"{where}: duplicate question_id {qid!r} (first seen on line {first_line[qid]})")
        first_line[qid] = lineno
        category = next((record[f] for f in CATEGORY_FIELDS if record.get(f)), None)
        if category is not None and not isinstance(category, str):
            raise WorkloadError(f"{where}: category must be a string, got {category!r}")
        text = _question_text(record, where)
        prompts.append(Prompt(id=f"arena_hard/{qid}", messages=[{"role": "user", "content": text}], prompt=None,
                              max_tokens=None, source=f"arena_hard:{category}" if category else "arena_hard"))
    if not prompts:
        raise WorkloadError(f"{path}: the arena-hard question file has no questions")
    return prompts


class ArenaHardWorkload(Workload):
    """Hard single-turn questions: the packaged originals, or a real ``question.jsonl`` via ``path``."""

    NAME = "arena_hard"
    EVAL_PERCENT = 80

    def load_pool(self) -> list[Prompt]:
        return load_arena_questions(self.spec.path if self.spec.path is not None else PACKAGED_QUESTIONS)


__all__ = ["ArenaHardWorkload", "PACKAGED_QUESTIONS", "load_arena_questions"]
