"""Core types of the prompt sources: ``Prompt``, ``WorkloadSpec`` and ``Workload``.

A *workload* is a prompt source plus sampling settings plus an output cap. Every
source loads its full pool of prompts, assigns each prompt to the ``"train"`` or
``"eval"`` split by a stable hash of its id (:func:`split_of`), and
:meth:`Workload.prompts` draws ``num_prompts`` of the requested split
deterministically from ``seed``.

Selection is stratified by ``Prompt.source``: each source's prompts are shuffled
with the seeded RNG and the sources are then visited round-robin (in a seeded
order), so a mixed workload such as ``agentic`` keeps every category represented
even when ``num_prompts`` is small.

The split rule is what keeps drafter training honest: the drafter trains on
``split="train"`` prompts and the benchmarks evaluate on ``split="eval"`` (the
default), and no prompt id can be in both.

This module is torch-free and never imports Hydra.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Sequence

from dspark.config import ConfigError, SamplingParams

SPLITS = ("eval", "train", "all")
CHAT_ROLES = ("system", "user", "assistant")
DEFAULT_EVAL_PERCENT = 20
GREEDY_REPLICA_SUFFIX = "#greedy"


class WorkloadError(ConfigError):
    """A prompt source or its data is invalid; the message names the value and the fix."""


def split_of(prompt_id: str, eval_percent: float = DEFAULT_EVAL_PERCENT) -> str:
    """Return ``"eval"`` or ``"train"`` for a prompt id, by a stable SHA-1 bucket.

    The id's SHA-1 is mapped to a bucket in [0, 10000); buckets below
    ``eval_percent * 100`` are evaluation prompts. The mapping depends on the id
    only, never on the seed, the Python version or the order the prompts were loaded.
    """
    if not 0 <= eval_percent <= 100:
        raise WorkloadError(f"eval_percent must be in [0, 100], got {eval_percent}")
    bucket = int.from_bytes(hashlib.sha1(prompt_id.encode("utf-8")).digest()[:8], "big") % 10000
    return "eval" if bucket < eval_percent * 100 else "train"


def pick_by_id(prompt_id: str, options: Sequence[str]) -> str:
    """One of ``options``, chosen by the prompt id's SHA-1: the same for an id whatever the run, the seed or the
    order, so a generated prompt's wording (one of several templates) is as stable as its id."""
    return options[int.from_bytes(hashlib.sha1(prompt_id.encode("utf-8")).digest()[:2], "big") % len(options)]


def refuse_path(source: str, path: str | None, instead: str) -> None:
    """A source that generates its prompts reads no file: ``path`` set is refused, naming what reads one."""
    if path is not None:
        raise WorkloadError(f"workload.path: {source} generates its prompts and takes no path (got {path!r}); "
                            f"use {instead}")


def user_turn_prompt(prompt_id: str, text: str, source: str) -> Prompt:
    """A generated single-turn request: ``text`` as the one user message, the source's sampling and cap."""
    return Prompt(id=prompt_id, messages=[{"role": "user", "content": text}], prompt=None, max_tokens=None,
                  source=source)


def validate_messages(messages: Any, where: str) -> None:
    """Check a chat message list: non-empty list of {"role", "content"} with known roles.

    ``where`` is prepended to the error (for example ``"data.jsonl:12"``).
    """
    if not isinstance(messages, list) or not messages:
        raise WorkloadError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} dicts, "
                            f"got {type(messages).__name__} {messages!r:.80}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            raise WorkloadError(f"{where}: messages[{i}] must be a dict with exactly the keys 'role' and 'content', "
                                f"got {m!r:.120}")
        if m["role"] not in CHAT_ROLES:
            raise WorkloadError(f"{where}: messages[{i}] has role {m['role']!r}; allowed roles: {list(CHAT_ROLES)}")
        if not isinstance(m["content"], str) or not m["content"].strip():
            raise WorkloadError(f"{where}: messages[{i}] ({m['role']}) needs a non-empty string 'content', "
                                f"got {m['content']!r:.80}")
    if messages[-1]["role"] != "user":
        raise WorkloadError(f"{where}: the last message must come from the 'user' (the model answers it), "
                            f"got role {messages[-1]['role']!r}")


@dataclass(slots=True)
class Prompt:
    """One request: either chat ``messages`` or a raw completion ``prompt`` (exactly one).

    ``max_tokens`` overrides the workload's output cap for this prompt when set.
    ``source`` names where it came from (for example ``"bfcl:multi_turn_base"``); the
    selection is stratified by it.
    """

    id: str
    messages: list[dict] | None
    prompt: str | None
    max_tokens: int | None
    source: str

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise WorkloadError(f"Prompt.id must be a non-empty string, got {self.id!r}")
        where = f"prompt {self.id!r}"
        if (self.messages is None) == (self.prompt is None):
            raise WorkloadError(f"{where}: give exactly one of 'messages' (chat) or 'prompt' (raw text), "
                                f"got {'both' if self.messages is not None else 'neither'}")
        if self.messages is not None:
            validate_messages(self.messages, where)
        elif not isinstance(self.prompt, str) or not self.prompt.strip():
            raise WorkloadError(f"{where}: 'prompt' must be a non-empty string, got {self.prompt!r:.80}")
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int)
                                            or self.max_tokens < 1):
            raise WorkloadError(f"{where}: max_tokens must be an integer >= 1 or None, got {self.max_tokens!r}")
        if not isinstance(self.source, str) or not self.source:
            raise WorkloadError(f"{where}: source must be a non-empty string, got {self.source!r}")

    @property
    def text(self) -> str:
        """All the prompt's text, concatenated (for overlap checks and rough length estimates)."""
        if self.prompt is not None:
            return self.prompt
        return "\n".join(m["content"] for m in self.messages or [])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class WorkloadSpec:
    """What to draw from a prompt source and how to sample it.

    - ``num_prompts``: how many prompts to draw; ``None`` takes every prompt of the split.
    - ``split``: ``"eval"`` (benchmarks), ``"train"`` (drafter training) or ``"all"``.
    - ``path``: a data file for sources that read one (``custom`` needs it; ``arena_hard``
      reads the packaged questions when it is ``None``).
    - ``greedy_replica_count``: how many of the drawn prompts are *also* run at
      temperature 0 (see :meth:`Workload.greedy_replicas`), so that a sampled workload
      still gets a token-exact losslessness check between speculative and plain decoding.
    - ``repeat``: each drawn prompt is sent this many times (copies ``#r1``, ``#r2``, ... after the
      drawn list), for blocks with more requests than a split holds prompts (the engine keeps
      no prefix cache, so a repeated prompt costs what a new one does).
    """

    name: str
    num_prompts: int | None = 64
    seed: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    split: str = "eval"
    path: str | None = None
    greedy_replica_count: int = 0
    repeat: int = 1

    def __post_init__(self) -> None:
        def bad(key: str, msg: str) -> WorkloadError:
            return WorkloadError(f"workload.{key}: {msg}")

        if not isinstance(self.name, str) or not self.name:
            raise bad("name", f"must be a non-empty string, got {self.name!r}")
        if self.num_prompts is not None and (isinstance(self.num_prompts, bool) or not isinstance(self.num_prompts, int)
                                             or self.num_prompts < 1):
            raise bad("num_prompts", f"must be an integer >= 1 or null (all prompts), got {self.num_prompts!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise bad("seed", f"must be an integer, got {self.seed!r}")
        if self.split not in SPLITS:
            raise bad("split", f"{self.split!r} is not one of {list(SPLITS)}")
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            raise bad("path", f"must be a non-empty string or null, got {self.path!r}")
        if isinstance(self.greedy_replica_count, bool) or not isinstance(self.greedy_replica_count, int) \
                or self.greedy_replica_count < 0:
            raise bad("greedy_replica_count", f"must be an integer >= 0, got {self.greedy_replica_count!r}")
        if self.num_prompts is not None and self.greedy_replica_count > self.num_prompts:
            raise bad("greedy_replica_count", f"{self.greedy_replica_count} exceeds num_prompts={self.num_prompts}; "
                                              "replicas are taken from the drawn prompts")
        if isinstance(self.repeat, bool) or not isinstance(self.repeat, int) or self.repeat < 1:
            raise bad("repeat", f"must be an integer >= 1 (times each drawn prompt is sent), got {self.repeat!r}")
        for key in ("temperature", "top_p"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad(key, f"must be a number, got {value!r}")
        for key in ("top_k", "max_tokens"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(key, f"must be an integer, got {value!r}")
        if self.temperature < 0:
            raise bad("temperature", f"must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise bad("top_k", f"must be >= 0 (0 disables), got {self.top_k}")
        if self.max_tokens < 1:
            raise bad("max_tokens", f"must be >= 1, got {self.max_tokens}")
        self.temperature = float(self.temperature)
        self.top_p = float(self.top_p)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _nearest_rank(sorted_values: Sequence[int], q: float) -> int:
    """The q-quantile by the nearest-rank rule (an actual observed value)."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def _summary(values: Sequence[int]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "mean": float(statistics.fmean(ordered)),
        "median": float(statistics.median(ordered)),
        "p90": float(_nearest_rank(ordered, 0.9)),
        "min": float(ordered[0]),
        "max": float(ordered[-1]),
    }


class Workload(ABC):
    """A prompt source with sampling settings; subclasses implement :meth:`load_pool`.

    Subclasses set ``NAME`` (the registry name) and may set ``EVAL_PERCENT`` (the share
    of ids hashed into the eval split, default 20).
    """

    NAME: str = ""
    EVAL_PERCENT: float = DEFAULT_EVAL_PERCENT

    def __init__(self, spec: WorkloadSpec) -> None:
        if spec.name != self.NAME:
            raise WorkloadError(f"workload.name: {type(self).__name__} serves {self.NAME!r}, got spec for "
                                f"{spec.name!r}; build it with workloads.registry.build_workload(spec)")
        self.spec = spec
        self._pool: list[Prompt] | None = None

    # --- to implement ---------------------------------------------------------------
    @abstractmethod
    def load_pool(self) -> list[Prompt]:
        """Every prompt of the source, all splits, ids unique."""

    # --- pool and splits ------------------------------------------------------------
    def pool(self) -> list[Prompt]:
        """The full pool (loaded once, checked for duplicate ids)."""
        if self._pool is None:
            pool = self.load_pool()
            seen: set[str] = set()
            for p in pool:
                if p.id in seen:
                    raise WorkloadError(f"workload {self.NAME!r}: duplicate prompt id {p.id!r}; ids must be unique "
                                        "because the train/eval split is a hash of the id")
                seen.add(p.id)
            if not pool:
                raise WorkloadError(f"workload {self.NAME!r}: the source has no prompts")
            self._pool = pool
        return self._pool

    def split_of(self, prompt: Prompt) -> str:
        """``"train"`` or ``"eval"`` for a prompt of this source."""
        return split_of(prompt.id, self.EVAL_PERCENT)

    def available(self, split: str | None = None) -> list[Prompt]:
        """Prompts of ``split`` (default: the spec's split), in pool order."""
        split = self.spec.split if split is None else split
        if split not in SPLITS:
            raise WorkloadError(f"split {split!r} is not one of {list(SPLITS)}")
        pool = self.pool()
        if split == "all":
            return list(pool)
        return [p for p in pool if self.split_of(p) == split]

    # --- selection ------------------------------------------------------------------
    def prompts(self) -> list[Prompt]:
        """``num_prompts`` prompts of the spec's split, drawn deterministically from ``seed``.

        Stratified by ``source``: each source's prompts are shuffled (seeded), then the
        sources are visited round-robin in a seeded order until enough are taken. With
        ``repeat`` > 1 the drawn list is followed by its copies (ids ``#r1``, ``#r2``, ...).
        """
        candidates = self.available()
        wanted = len(candidates) if self.spec.num_prompts is None else self.spec.num_prompts
        if wanted > len(candidates):
            raise self._too_few_prompts(wanted, len(candidates))
        rng = random.Random(f"{self.NAME}:{self.spec.seed}")
        groups: dict[str, list[Prompt]] = {}
        for p in sorted(candidates, key=lambda p: p.id):
            groups.setdefault(p.source, []).append(p)
        order = sorted(groups)
        for source in order:
            rng.shuffle(groups[source])
        rng.shuffle(order)
        chosen: list[Prompt] = []
        cursor = {s: 0 for s in order}
        while len(chosen) < wanted:
            for source in order:
                if len(chosen) == wanted:
                    break
                if cursor[source] < len(groups[source]):
                    chosen.append(groups[source][cursor[source]])
                    cursor[source] += 1
        return self._with_repeats(chosen)

    def _too_few_prompts(self, wanted: int, available: int, detail: str = "") -> WorkloadError:
        """The error for ``num_prompts`` beyond the split's ``available`` prompts (``detail``: after the count),
        naming the settings that would fit: fewer prompts, another split, or each prompt sent several times."""
        split = self.spec.split
        return WorkloadError(
            f"workload {self.NAME!r}: num_prompts={wanted} requested but split {split!r} has only {available} "
            f"prompts available{detail}; lower workload.num_prompts to at most {available}"
            + ("" if split == "all" else " or use workload.split=all")
            + (f", or send each prompt several times (workload.repeat={-(-wanted // available)} with "
               f"workload.num_prompts={available})" if available else ""))

    def _with_repeats(self, chosen: list[Prompt]) -> list[Prompt]:
        """``chosen`` followed by ``repeat - 1`` copies of it, ids suffixed ``#r1``, ``#r2``, ..."""
        return chosen + [replace(p, id=f"{p.id}#r{k}") for k in range(1, self.spec.repeat) for p in chosen]

    def greedy_replicas(self) -> list[Prompt]:
        """Copies of the first ``greedy_replica_count`` drawn prompts, ids suffixed ``#greedy``.

        Run them with ``sampling_for(p, greedy=True)``: at temperature 0 speculative and
        plain decoding must produce identical tokens, which checks losslessness even
        for a sampled workload.
        """
        count = self.spec.greedy_replica_count
        return [replace(p, id=p.id + GREEDY_REPLICA_SUFFIX) for p in self.prompts()[:count]]

    # --- sampling -------------------------------------------------------------------
    def sampling(self) -> SamplingParams:
        """The workload-wide sampling settings (no per-prompt override, no seed)."""
        s = self.spec
        return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_tokens)

    def sampling_for(self, prompt: Prompt, *, greedy: bool = False) -> SamplingParams:
        """Sampling settings for one prompt.

        The prompt's own ``max_tokens`` replaces the workload cap when set. Sampled
        requests get a seed derived from the workload seed and the prompt id, so both
        arms of an A/B comparison draw from the same random stream. ``greedy=True``
        forces temperature 0 (for :meth:`greedy_replicas`).
        """
        base = self.sampling()
        cap = prompt.max_tokens if prompt.max_tokens is not None else base.max_tokens
        if greedy or base.greedy:
            return replace(base, temperature=0.0, top_p=1.0, top_k=0, max_tokens=cap, seed=None)
        digest = hashlib.sha1(f"{self.spec.seed}:{prompt.id}".encode("utf-8")).digest()
        return replace(base, max_tokens=cap, seed=int.from_bytes(digest[:4], "big") & 0x7FFFFFFF)

    # --- reporting ------------------------------------------------------------------
    def length_stats(self, tokenize: Callable[[Prompt], int]) -> dict[str, Any]:
        """Input token lengths (via ``tokenize``) and output caps of the drawn prompts.

        ``tokenize(prompt)`` must return the prompt's token count (chat template
        applied, for chat prompts). Returns ``{"count", "input_tokens": {mean, median,
        p90, min, max}, "output_cap": {...}, "max_total_tokens", "total_input_tokens",
        "total_output_cap"}``; ``max_total_tokens`` (input + cap) is what must fit in
        ``engine.max_model_len``.
        """
        chosen = self.prompts()
        inputs: list[int] = []
        for p in chosen:
            n = tokenize(p)
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise WorkloadError(f"length_stats: tokenize({p.id!r}) returned {n!r}; it must return the "
                                    "prompt's token count as a non-negative int")
            inputs.append(n)
        caps = [self.sampling_for(p).max_tokens for p in chosen]
        return {
            "count": len(chosen),
            "input_tokens": _summary(inputs),
            "output_cap": _summary(caps),
            "max_total_tokens": max(i + c for i, c in zip(inputs, caps)),
            "total_input_tokens": sum(inputs),
            "total_output_cap": sum(caps),
        }

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary: spec, sampling, split sizes and the drawn prompts' sources."""
        chosen = self.prompts()
        by_source: dict[str, int] = {}
        for p in chosen:
            by_source[p.source] = by_source.get(p.source, 0) + 1
        sampling = self.sampling()
        return {
            "name": self.NAME,
            "spec": self.spec.to_dict(),
            "sampling": {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                         "max_tokens": sampling.max_tokens},
            "eval_percent": self.EVAL_PERCENT,
            "available": {split: len(self.available(split)) for split in SPLITS},
            "num_selected": len(chosen),
            "selected_by_source": dict(sorted(by_source.items())),
            "greedy_replicas": self.spec.greedy_replica_count,
            "repeat": self.spec.repeat,
            "first_ids": [p.id for p in chosen[:5]],
        }


__all__ = ["CHAT_ROLES", "DEFAULT_EVAL_PERCENT", "GREEDY_REPLICA_SUFFIX", "Prompt", "SPLITS", "Workload",
           "WorkloadError", "WorkloadSpec", "split_of", "validate_messages"]
