"""Whether running the verify-budget planner on a device-resident step is expected to pay (engine.plan_gate).

On a device-resident step the host plans the verify budget from lagged survival before it launches the step
(``Engine._graph_decision``). That planning is host work: when the host sets the step's period (it did not wait
for the device), every millisecond of it lengthens the step; when the host waited for the device anyway, the
planning ran while the device computed the step in flight and cost nothing. What planning buys is the trims it
finds, and a planner that declines almost every step buys almost nothing. The gate weighs the two per batch
bucket, learnt online from the steps themselves, and lets the planner run only where its expected saving per
step is at least its expected cost per step; elsewhere the step runs exactly as verify-all does (the whole
drafted block, no planner call).

Per bucket (the step's graph batch bucket), over the steps the planner ran on:

- benefit: the mean of the milliseconds a planned step saved. A trimmed decision with predicted relative gain g
  (``PlanDecision.predicted_gain``: tokens per ms over the full block's, at the service price) that committed in
  a measured period P saved ``P * g``: the full block, at the predicted rate, would have needed ``P * (1 + g)``
  for the tokens the trimmed step is expected to commit. A declined decision saved 0.
- cost: the mean of the planner's host milliseconds, counted only where the host set the period: the step() call
  that planned then waited less than ``device_bound_wait_ms`` for the device step that ran while it planned
  (the caller passes 0 when no device step ran meanwhile: without the overlap scheduler the device is idle while
  the host plans, so planning always costs). The engine leaves out of a call's milliseconds its backlog
  (:func:`backlog_ms`: the snapshots the skipped steps queued, a refit of the service price that planning on
  every step would have spread over its steps) and adds it to the call's wait: charged in full, a probe after
  a run of skipped steps costs more than a planned step of a planning bucket, so that a bucket that skips keeps
  looking too dear to plan.

Both are running means over the last ``horizon`` planned steps or so (the exact mean of the first ``horizon``
samples, then an exponential mean of weight 1/``horizon``): O(1) per step.

A step plans when its bucket has fewer than ``warmup`` samples of either kind, when benefit >= cost, or when it
is a probe: while the rule says skip, the bucket plans anyway once ``probe_every`` steps have skipped in a row, so
that both estimates follow the workload. Each probe after which the rule still says skip doubles the bucket's probe
interval, up to ``probe_every_max``; a step where the rule says plan sets it back to ``probe_every``. A bucket the
planner never pays at thus probes rarely (each probe is a whole planner call on a host-bound step), and sees a
turn of the workload at its next probe, at most ``probe_every_max`` skipped steps later. A skipped step is
counted in the scheduling stats with reason :data:`SKIPPED_REASON` (a decline: the planner was not expected to pay).

The benefit is the planner's own prediction, so a planner whose predictions are optimistic keeps planning
where it should not; engine.min_predicted_gain is the margin against that. The gate applies to the
device-resident path only: a host-driven (eager) step plans on fresh survival with the device idle, and serves
profiling, step traces, cap_accept and greedy_stop, whose every step must be planned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SKIPPED_REASON = "skipped_plan_not_paying"


def _whole(least: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= least


# Per setting: when a value is valid, and what a bad one is told.
_SETTING_RULES = {
    "warmup": (_whole(0), "must be an integer >= 0 (planned steps per batch bucket before the gate decides)"),
    "probe_every": (_whole(1), "must be an integer >= 1 (1: every step plans)"),
    "probe_every_max": (_whole(1), "must be an integer >= 1 (the longest probe interval a skipping bucket backs "
                                   "off to)"),
    "horizon": (_whole(1), "must be an integer >= 1"),
    "device_bound_wait_ms": (lambda v: isinstance(v, (int, float)) and math.isfinite(v) and v >= 0,
                             "must be finite and >= 0"),
}


def check_plan_gate_settings(**settings: Any) -> dict[str, str]:
    """What is wrong with the given gate settings (warmup, probe_every, probe_every_max, horizon,
    device_bound_wait_ms): {setting name: the problem}, empty when they are valid. Engine config validation checks
    the three it has keys for and names the engine key; :class:`PlanGate` checks all five and names the argument."""
    problems = {}
    for name, value in settings.items():
        valid, need = _SETTING_RULES[name]
        if not valid(value):
            problems[name] = f"{need}, got {value!r}"
    least, most = settings.get("probe_every"), settings.get("probe_every_max")
    if "probe_every" not in problems and "probe_every_max" not in problems and None not in (least, most) \
            and most < least:
        problems["probe_every_max"] = f"must be >= probe_every ({least}), got {most!r}"
    return problems


def backlog_ms(catch_up_ms: float, queued_steps: int, refit_ms: float = 0.0, refit_every: int = 1) -> float:
    """The part of a planner call's host time that is backlog: work a planner running on every step spreads over
    its steps, which a call after skipped steps does at once. Of the catch-up that wrote ``queued_steps`` steps'
    survival snapshots to the lag rings, all but one step's share; of a refit of the service price's line
    (``refit_ms``, 0 when the call did not refit), all but the ``1 / refit_every`` share a planning engine pays
    per step."""
    if queued_steps < 1 or refit_every < 1:
        raise ValueError(f"queued_steps and refit_every must be >= 1, got {queued_steps}, {refit_every}")
    return max(catch_up_ms, 0.0) * (1.0 - 1.0 / queued_steps) + max(refit_ms, 0.0) * (1.0 - 1.0 / refit_every)


@dataclass(slots=True)
class BucketCounts:
    """One batch bucket's decisions since :meth:`PlanGate.reset_counts`."""

    planned: int = 0
    skipped: int = 0
    probes: int = 0  # planned steps the rule alone would have skipped
    charged: int = 0  # planner calls whose host time was charged (the host set the step's period)


@dataclass(slots=True)
class BucketEstimate:
    """One batch bucket's estimates and counts."""

    benefit_ms: float = 0.0  # mean ms a planned step saved
    benefit_samples: int = 0
    cost_ms: float = 0.0  # mean host ms a planned step cost
    cost_samples: int = 0
    skipped_in_a_row: int = 0  # steps skipped since the bucket last planned
    probe_interval: int = 0  # skipped steps in a row before the next probe (0: not yet set, probe_every)


class PlanGate:
    """Per batch bucket, whether the planner is expected to pay on the next step (see the module docstring).

    The engine asks :meth:`should_plan` once per device-resident step, reports the host time of each planner
    call with :meth:`record_cost` and each planned step's outcome at its commit with :meth:`record_benefit`.
    The estimates persist across :meth:`reset_counts` (a run's warm-up trains them); the counts do not.
    """

    def __init__(self, *, warmup: int = 8, probe_every: int = 16, probe_every_max: int | None = None,
                 horizon: int = 64, device_bound_wait_ms: float = 0.02):
        """``probe_every_max`` None: the same as ``probe_every`` (a fixed probe interval, no back-off)."""
        probe_every_max = probe_every if probe_every_max is None else probe_every_max
        problems = check_plan_gate_settings(warmup=warmup, probe_every=probe_every, probe_every_max=probe_every_max,
                                            horizon=horizon, device_bound_wait_ms=device_bound_wait_ms)
        if problems:
            raise ValueError("; ".join(f"{name} {problem}" for name, problem in problems.items()))
        self.warmup, self.probe_every, self.probe_every_max = warmup, probe_every, probe_every_max
        self.horizon = horizon
        self.device_bound_wait_ms = float(device_bound_wait_ms)
        self.buckets: dict[int, BucketEstimate] = {}
        self.reset_counts()

    def reset_counts(self) -> None:
        """Zero the counts :meth:`summary` reports (the estimates are kept)."""
        self._bucket_counts: dict[int, BucketCounts] = {}
        self._benefit_decided_ms = 0.0  # sums over decided steps of the estimates the decision read
        self._cost_decided_ms = 0.0

    def estimate(self, bucket: int) -> BucketEstimate:
        est = self.buckets.get(bucket)
        if est is None:
            est = self.buckets[bucket] = BucketEstimate()
        return est

    def should_plan(self, bucket: int) -> bool:
        """Decide (and count) whether the step about to launch at ``bucket`` runs the planner."""
        est = self.estimate(bucket)
        counts = self._counts_of(bucket)
        self._benefit_decided_ms += est.benefit_ms
        self._cost_decided_ms += est.cost_ms
        warm = est.benefit_samples >= self.warmup and est.cost_samples >= self.warmup
        if not warm or est.benefit_ms >= est.cost_ms:
            plan = True
            est.probe_interval = self.probe_every
        else:
            interval = est.probe_interval or self.probe_every
            plan = est.skipped_in_a_row + 1 >= interval
            if plan:  # a probe; if the rule still says skip after it, the next one waits twice as long
                counts.probes += 1
                est.probe_interval = min(2 * interval, self.probe_every_max)
        if plan:
            est.skipped_in_a_row = 0
            counts.planned += 1
        else:
            est.skipped_in_a_row += 1
            counts.skipped += 1
        return plan

    def _counts_of(self, bucket: int) -> BucketCounts:
        counts = self._bucket_counts.get(bucket)
        if counts is None:
            counts = self._bucket_counts[bucket] = BucketCounts()
        return counts

    def _mean(self, mean: float, samples: int, value: float) -> float:
        return mean + (value - mean) / min(samples, self.horizon)

    def record_cost(self, bucket: int, plan_ms: float, waited_ms: float) -> None:
        """A planner call at ``bucket`` took ``plan_ms`` of host time, and the step() call that made it then
        waited ``waited_ms`` for the device step that ran meanwhile (0 when none ran)."""
        if not math.isfinite(plan_ms):
            return
        est = self.estimate(bucket)
        charged = waited_ms < self.device_bound_wait_ms
        cost = max(plan_ms, 0.0) if charged else 0.0
        self._counts_of(bucket).charged += int(charged)
        est.cost_samples += 1
        est.cost_ms = self._mean(est.cost_ms, est.cost_samples, cost)

    def record_benefit(self, bucket: int, *, trimmed: bool, predicted_gain: float, period_ms: float) -> None:
        """A planned step at ``bucket`` committed after a period of ``period_ms``: trimmed or not, and the
        relative gain the planner predicted for its decision."""
        saved = period_ms * predicted_gain if trimmed and predicted_gain > 0.0 else 0.0
        if not math.isfinite(saved):
            return
        est = self.estimate(bucket)
        est.benefit_samples += 1
        est.benefit_ms = self._mean(est.benefit_ms, est.benefit_samples, max(saved, 0.0))

    def summary(self) -> dict[str, float]:
        """Counts since :meth:`reset_counts`, and the mean over its decided steps of the benefit and cost
        estimates each decision read (ms per step). Per batch bucket decided since then
        (``plan_gate/b<bucket>/...``): its planned, skipped and probe steps, how many of its planner calls were
        charged (the host set the period), and its benefit and cost estimates as they stand."""
        counts = self._bucket_counts
        planned = sum(c.planned for c in counts.values())
        skipped = sum(c.skipped for c in counts.values())
        decided = planned + skipped
        out = {"plan_gate/planned_steps": planned, "plan_gate/skipped_steps": skipped,
               "plan_gate/probe_steps": sum(c.probes for c in counts.values()),
               "plan_gate/benefit_ms_per_step": self._benefit_decided_ms / decided if decided else 0.0,
               "plan_gate/cost_ms_per_step": self._cost_decided_ms / decided if decided else 0.0}
        for bucket in sorted(counts):
            c, est, key = counts[bucket], self.buckets[bucket], f"plan_gate/b{bucket}/"
            out.update({key + "planned_steps": c.planned, key + "skipped_steps": c.skipped,
                        key + "probe_steps": c.probes, key + "charged_costs": c.charged,
                        key + "benefit_ms_estimate": est.benefit_ms, key + "cost_ms_estimate": est.cost_ms})
        return out


__all__ = ["SKIPPED_REASON", "BucketCounts", "BucketEstimate", "PlanGate", "backlog_ms", "check_plan_gate_settings"]
