"""A per-step choice between an engine's usual kind of step and an alternative, from measured output rates.

Used where a cost model would have to predict what only the service shows: draft-free steps
(dspark/draft_free.py) and a fixed verify share (dspark/verify_share.py). Per batch bucket (the device's step
shape) :class:`MeasuredChoice` keeps each kind's output tokens per millisecond over its last ``window``
committed steps (their median, so that one step timed long or short does not move it). It runs the usual kind
until a bucket has ``min_steps`` of them, then ``min_steps`` of the alternative, then the kind with the higher
rate, and every ``explore_every`` steps of the bucket the other kind once, so that the rates follow the load.
It reads only committed steps, never what the step it decides will draft, so sampled requests keep the target's
distribution.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field


class RecentRate:
    """One step kind's output tokens per ms over its last steps; its rate is their median."""

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
class BucketRates:
    """One batch bucket: its usual and its alternative steps, and how many decisions it took."""

    usual: RecentRate
    alternative: RecentRate
    steps: int = 0


@dataclass
class MeasuredChoice:
    """Per batch bucket: the usual kind of step or the alternative (see the module docstring)."""

    window: int = 32
    min_steps: int = 8
    explore_every: int = 100
    _buckets: dict[int, BucketRates] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.min_steps < 1 or self.explore_every < 2:
            raise ValueError(f"min_steps must be >= 1 and explore_every >= 2, got {self.min_steps}, "
                             f"{self.explore_every}")

    def alternative(self, bucket: int) -> bool:
        """True: run this step of ``bucket`` as the alternative kind."""
        r = self.bucket(bucket)
        r.steps += 1
        if r.usual.n < self.min_steps:
            return False
        if r.alternative.n < self.min_steps:
            return True
        better = r.alternative.rate > r.usual.rate
        if r.steps % self.explore_every == 0:
            return not better  # one step of the other kind keeps its rate current
        return better

    def record(self, bucket: int, *, alternative: bool, tokens: int, step_ms: float) -> None:
        """Count a committed step of ``bucket``: its kind, its output tokens and its measured time."""
        if step_ms <= 0.0:
            return
        r = self.bucket(bucket)
        (r.alternative if alternative else r.usual).add(tokens, step_ms)

    def bucket(self, bucket: int) -> BucketRates:
        """The rates of ``bucket`` (created empty on first use)."""
        r = self._buckets.get(bucket)
        if r is None:
            r = self._buckets[bucket] = BucketRates(RecentRate(self.window), RecentRate(self.window))
        return r

    def buckets(self) -> list[tuple[int, BucketRates]]:
        """Every bucket seen, smallest first."""
        return sorted(self._buckets.items())

    def rate_summary(self, prefix: str, usual: str, alternative: str) -> dict[str, float]:
        """Per bucket, ``<prefix>/b<bucket>/<kind>_tok_per_ms`` (the rate) and ``<kind>_steps`` (steps counted) for
        the usual and the alternative kind, under the names given."""
        out: dict[str, float] = {}
        for b, r in self.buckets():
            for name, kind in ((usual, r.usual), (alternative, r.alternative)):
                out[f"{prefix}/b{b}/{name}_tok_per_ms"] = round(kind.rate, 4)
                out[f"{prefix}/b{b}/{name}_steps"] = kind.n
        return out


__all__ = ["BucketRates", "MeasuredChoice", "RecentRate"]
