"""A per-step choice between an engine's usual kind of step and an alternative, from measured output rates.

Used where a cost model would have to predict what only the service shows: draft-free steps
(dspark/draft_free.py) and a fixed verify share (dspark/verify_share.py).

The two kinds are compared on adjacent steps. A step's output rate (tokens per millisecond of its measured
period) moves with the load far more than with its kind: the batch fills and drains, prefills join, acceptance
changes with the prompts in flight. Two kinds' rates taken at different times (each kind's recent median, say)
compare two phases of the load, not two kinds: on the H200 at concurrency 256 such medians had the share twice
as fast as the whole block while the A/B measured it 1.5% slower. So, per batch bucket (the device's step shape),
:class:`MeasuredChoice` keeps the log ratio alternative / usual of every two consecutive committed steps of the
bucket that ran different kinds, and takes the alternative while the median of the last ``window`` ratios is
positive. It alternates the kinds for the first ``2 * min_steps`` decisions of a bucket (each consecutive pair is
a comparison), then runs the kind the ratios favour, and every ``explore_every`` decisions of the bucket the
other kind once (two more comparisons: with the step before it and the step after), so that the choice follows
the load. It reads only committed steps, never what the step it decides will draft, so sampled requests keep the
target's distribution.

A limit of the comparison: with overlap a step's period runs from the previous commit to its own, and so holds the
host's launch of the step after it, not its own. Where the kinds' launches cost the host differently and the host
sets the period, the step before a costlier launch reads that much slower (a trimmed step launches two graphs
where a whole-block step may launch one).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field


class RecentRate:
    """One step kind's output tokens per ms over its last steps; its rate is their median (reported, not compared:
    see the module docstring)."""

    def __init__(self, window: int):
        self.rates: deque[float] = deque(maxlen=window)
        self.counted = 0  # steps counted since MeasuredChoice.reset_counts (reported)

    def add(self, rate: float) -> None:
        self.rates.append(rate)
        self.counted += 1

    @property
    def rate(self) -> float:
        """Median output tokens per millisecond of the recent steps (0 before any step)."""
        return statistics.median(self.rates) if self.rates else 0.0


@dataclass
class BucketRates:
    """One batch bucket: its usual and its alternative steps, the adjacent-step comparisons, and its decisions."""

    usual: RecentRate
    alternative: RecentRate
    log_ratios: deque  # log(alternative rate / usual rate) of consecutive steps of different kinds, last `window`
    pairs: int = 0  # comparisons made since MeasuredChoice.reset_counts (reported)
    steps: int = 0  # decisions taken
    last: tuple[bool, float] | None = None  # the bucket's newest committed step: (alternative?, its rate)

    @property
    def log_ratio(self) -> float | None:
        """Median log ratio alternative / usual over the recent comparisons (None before any)."""
        return statistics.median(self.log_ratios) if self.log_ratios else None


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
        ratio = r.log_ratio
        if r.steps <= 2 * self.min_steps or ratio is None:
            return r.steps % 2 == 0  # the usual kind first, then one of each in turn
        better = ratio > 0.0
        if r.steps % self.explore_every == 0:
            return not better  # one step of the other kind: two fresh comparisons
        return better

    def record(self, bucket: int, *, alternative: bool, tokens: int, step_ms: float) -> None:
        """Count a committed step of ``bucket``: its kind, its output tokens and its measured time. Call in commit
        order: a step whose bucket's previous committed step ran the other kind is compared with it."""
        if step_ms <= 0.0 or tokens <= 0:
            return
        r = self.bucket(bucket)
        rate = tokens / step_ms
        (r.alternative if alternative else r.usual).add(rate)
        if r.last is not None and r.last[0] != alternative:
            alt, usual = (rate, r.last[1]) if alternative else (r.last[1], rate)
            r.log_ratios.append(math.log(alt / usual))
            r.pairs += 1
        r.last = (alternative, rate)

    def reset_counts(self) -> None:
        """Start the reported step and comparison counts again (an engine's reset: one run's counters); the rates,
        the comparisons and the decisions persist, so a run's warm-up trains the choice for the timed blocks. The
        next committed step is compared with none before it (the steps either side of a reset are not adjacent)."""
        for r in self._buckets.values():
            r.usual.counted = r.alternative.counted = r.pairs = 0
            r.last = None

    def bucket(self, bucket: int) -> BucketRates:
        """The rates of ``bucket`` (created empty on first use)."""
        r = self._buckets.get(bucket)
        if r is None:
            r = self._buckets[bucket] = BucketRates(RecentRate(self.window), RecentRate(self.window),
                                                    deque(maxlen=self.window))
        return r

    def buckets(self) -> list[tuple[int, BucketRates]]:
        """Every bucket seen, smallest first."""
        return sorted(self._buckets.items())

    def rate_summary(self, prefix: str, usual: str, alternative: str) -> dict[str, float]:
        """Per bucket, ``<prefix>/b<bucket>/<kind>_tok_per_ms`` (the kind's recent median rate) and ``<kind>_steps``
        (steps counted since :meth:`reset_counts`) for the usual and the alternative kind, under the names given;
        ``pairs`` (adjacent-step comparisons since then) and, once there is one, ``<alternative>_vs_<usual>_pct``
        (the median comparison the choice reads, as a percentage change)."""
        out: dict[str, float] = {}
        for b, r in self.buckets():
            for name, kind in ((usual, r.usual), (alternative, r.alternative)):
                out[f"{prefix}/b{b}/{name}_tok_per_ms"] = round(kind.rate, 4)
                out[f"{prefix}/b{b}/{name}_steps"] = kind.counted
            out[f"{prefix}/b{b}/pairs"] = r.pairs
            if r.log_ratio is not None:
                out[f"{prefix}/b{b}/{alternative}_vs_{usual}_pct"] = round(100.0 * math.expm1(r.log_ratio), 3)
        return out


__all__ = ["BucketRates", "MeasuredChoice", "RecentRate"]
