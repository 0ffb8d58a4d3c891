"""Draft-free steps: a speculative engine decodes a step target-only when drafting measured slower (engine.draft_free_steps).

Drafting pays when the tokens it adds outweigh its cost: the drafter's forward and the verified drafts. At a
deep batch with low acceptance it does not (on the H200 at concurrency 256 on agentic prompts, DSpark
verifying every drafted block ran slower than target-only). A draft-free step runs only the verify stage with
no drafts: every row commits the target's next token, as a target-only engine would, and the drafter's
context is still written, so the next drafting step has it.

:class:`DraftFreeChoice` decides per step from what the engine measured, per batch bucket (the device's
step shape): the output tokens per millisecond of drafting steps and of draft-free steps, each the median
over the kind's last ``window`` steps of this bucket. It drafts until a bucket has ``min_steps``
drafting steps, then runs ``min_steps`` draft-free steps, then takes the kind with the higher rate, and
every ``explore_every`` steps of the bucket runs the other kind once so that the rates follow the load. The choice reads only past steps, never the drafts it would make,
so sampled requests keep the target's distribution.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field


class _Recent:
    """One step kind's output tokens per ms over its last steps; its rate is their median, so that a step
    timed long (a stall elsewhere in the host's cycle) or short does not move it."""

    def __init__(self, window: int):
        self.rates: deque[float] = deque(maxlen=window)
        self.n = 0  # steps counted, all time

    def add(self, tokens: int, ms: float) -> None:
        self.rates.append(tokens / ms)
        self.n += 1

    @property
    def rate(self) -> float:
        """Median output tokens per millisecond of the recent steps (0 before any step)."""
        return statistics.median(self.rates) if self.rates else 0.0


@dataclass
class _Rates:
    """One batch bucket: its drafting and its draft-free steps, and its decisions."""

    draft: _Recent
    free: _Recent
    steps: int = 0  # decisions taken for this bucket


@dataclass
class DraftFreeChoice:
    """Per batch bucket: draft this step, or decode it target-only (see the module docstring)."""

    window: int = 32
    min_steps: int = 8
    explore_every: int = 100
    _buckets: dict[int, _Rates] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.min_steps < 1 or self.explore_every < 2:
            raise ValueError(f"min_steps must be >= 1 and explore_every >= 2, got {self.min_steps}, {self.explore_every}")

    def draft_free(self, bucket: int) -> bool:
        """True: run this step of ``bucket`` rows without drafting."""
        r = self._bucket(bucket)
        r.steps += 1
        if r.draft.n < self.min_steps:
            return False
        if r.free.n < self.min_steps:
            return True
        better_free = r.free.rate > r.draft.rate
        if r.steps % self.explore_every == 0:
            return not better_free  # one step of the other kind keeps its rate current
        return better_free

    def update(self, bucket: int, *, draft_free: bool, tokens: int, step_ms: float) -> None:
        """Count a committed step of ``bucket`` rows: its output tokens and its measured time."""
        if step_ms <= 0.0:
            return
        r = self._bucket(bucket)
        (r.free if draft_free else r.draft).add(tokens, step_ms)

    def _bucket(self, bucket: int) -> _Rates:
        r = self._buckets.get(bucket)
        if r is None:
            r = self._buckets[bucket] = _Rates(_Recent(self.window), _Recent(self.window))
        return r

    def summary(self) -> dict[str, float]:
        """Per bucket: the rates (tokens/ms) and how many steps of each kind were counted."""
        out: dict[str, float] = {}
        for b, r in sorted(self._buckets.items()):
            out.update({f"draft_free/b{b}/draft_tok_per_ms": round(r.draft.rate, 4),
                        f"draft_free/b{b}/free_tok_per_ms": round(r.free.rate, 4),
                        f"draft_free/b{b}/draft_steps": r.draft.n, f"draft_free/b{b}/free_steps": r.free.n})
        return out
