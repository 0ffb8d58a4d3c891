"""What a service step costs beyond the cost table's price, learnt online (engine.service_cost).

The cost table prices a steady decode step of M verified tokens on the device, T(M). A step in
service costs more: prefill forwards beside it, admissions and retirements, and the host's own
work, which with the overlap scheduler sets the step's period whenever it is longer than the
device's step. The planner values a trim by tokens per millisecond, so a price that leaves these
out overstates what trimming saves: it trims where the saving is smaller than its cost in accepted
tokens, or where the host bounds the step and a shorter device step saves nothing.

The service price of a step of M tokens is ``max(floor, scale * T(M) + extra [+ trim_extra])``:

- ``floor``: the host's part of a step's period (the period less the commit's wait for the
  device): no step is shorter than the host's part of it; the median over the last ``window`` steps.
- ``scale`` and ``extra``: how a device-bound step's period (the host waited for the device to commit
  it) follows the table's price T(M) of what it ran. In service a step shares the device with prefills
  beside it and pays launches the steady-state profile did not, so its period may grow with the verified
  tokens more slowly (or faster) than the table says, and a trim saves what the service slope says, not
  the table's. When the recent device-bound steps' table prices spread enough to show a slope (their
  10th to 90th percentile over at least ``min_spread_rel`` of their median), scale and extra are the
  Theil-Sen slope of period on table price over them (clipped to [0, ``max_scale``]) and the median
  residual at that slope, refitted every ``refit_every`` such steps; otherwise scale is 1 and extra the
  median of period minus table price (never below 0). The line is read from whole-block steps.
- ``trim_extra``, added to a trimmed step's price only: how much further above that line the recent device-bound
  trimmed steps ran (the median of their period minus the line's price of their table price). A trimmed step
  replays a different pair of graphs (the draft, then a ragged verify) than a whole-block step (one fused
  graph), and in service the two drift from the steady-state profile by different amounts: prefills beside them,
  contexts that differ per row, a second launch. Without this term the planner prices a trim by the steady
  table's saving even when a trimmed step costs as much in service as the whole block it replaces. It can be
  negative (trimmed steps ran closer to the table than whole-block ones). Until ``min_steps`` of each kind were
  seen it is 0, so a new engine tries trims before it has measured them; an engine that trims every step reads
  its line from its trimmed steps, with no separate term.

Medians and a robust line keep a stall (a burst of admissions, a collector pause) from moving the price;
until ``min_steps`` of each kind were seen the price is the table's own (``ServiceCost.none``).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

import numpy as np
from scipy.stats import theilslopes  # imported with the engine, not inside a timed step


MIN_PRICE_MS = 1e-3  # no step is priced below a microsecond: a fitted line may reach 0 at small table prices


@dataclass(frozen=True)
class ServiceCost:
    """A step's service price from its table price: max(floor_ms, scale * table_ms + extra_ms), plus trim_extra_ms
    inside the max for a trimmed step, and never below MIN_PRICE_MS (the planner divides by it)."""

    floor_ms: float = 0.0
    extra_ms: float = 0.0
    scale: float = 1.0
    trim_extra_ms: float = 0.0  # added to the price of a trimmed step only

    @classmethod
    def none(cls) -> "ServiceCost":
        return cls(0.0, 0.0)

    @property
    def active(self) -> bool:
        return self.floor_ms > 0.0 or self.extra_ms != 0.0 or self.scale != 1.0 or self.trim_extra_ms != 0.0

    def price(self, table_ms, trimmed=False):
        """The service price of table price(s) ``table_ms`` (a float or a numpy array); ``trimmed``: whether the
        step (a bool) or each step (a bool array, with an array of prices) is a trimmed one."""
        if isinstance(table_ms, np.ndarray):
            device = self.scale * table_ms + self.extra_ms
            if self.trim_extra_ms:
                device = device + np.where(trimmed, self.trim_extra_ms, 0.0)
            return np.maximum(max(self.floor_ms, MIN_PRICE_MS), device)
        device = self.scale * float(table_ms) + self.extra_ms + (self.trim_extra_ms if trimmed else 0.0)
        return max(self.floor_ms, MIN_PRICE_MS, device)


class ServiceCostEstimate:
    """Online estimate of a service step's price beyond the table (see the module docstring)."""

    def __init__(self, window: int = 64, min_steps: int = 8, device_bound_wait_ms: float = 0.02,
                 min_spread_rel: float = 0.1, max_scale: float = 2.0, refit_every: int = 16):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if min_steps < 1:
            raise ValueError(f"min_steps must be >= 1, got {min_steps}")
        if refit_every < 1:
            raise ValueError(f"refit_every must be >= 1, got {refit_every}")
        if not (min_spread_rel > 0.0 and max_scale > 0.0):
            raise ValueError(f"min_spread_rel and max_scale must be > 0, got {min_spread_rel}, {max_scale}")
        self.min_steps = int(min_steps)
        self.device_bound_wait_ms = float(device_bound_wait_ms)
        self.min_spread_rel, self.max_scale, self.refit_every = float(min_spread_rel), float(max_scale), int(refit_every)
        # recent device-bound (table, period) of whole-block steps and of trimmed ones
        self._device: deque[tuple[float, float]] = deque(maxlen=int(window))
        self._trimmed: deque[tuple[float, float]] = deque(maxlen=int(window))
        self._floor: deque[float] = deque(maxlen=int(window))  # recent host parts
        self.extra_steps = 0  # device-bound steps that updated the device part (scale, extra; trim_extra)
        self.full_steps = 0  # of which whole-block steps
        self.trimmed_steps = 0  # of which trimmed steps
        self.floor_steps = 0  # steps that updated ``floor``
        self.slope_fits = 0  # device parts that came from a fitted line (scale != 1 allowed)
        self._device_part: tuple[float, float] = (1.0, 0.0)  # (scale, extra) as last computed
        self._since_fit: int | None = None  # device-bound steps since the last computation (None: recompute)
        self._line_from: str | None = None  # which steps the line was last read from ("full" or "trimmed")
        self._current = ServiceCost.none()  # what current() last gave the planner

    def update(self, *, step_ms: float, table_ms: float | None, host_ms: float | None, waited_ms: float,
               trimmed: bool = False) -> None:
        """Count one committed step: its measured period, the table's price of what it ran (None when
        no table priced it), the host's part of the period (None when unknown), how long the commit
        waited for the device, and whether it was a trimmed step."""
        if host_ms is not None and math.isfinite(host_ms) and host_ms >= 0.0:
            self._floor.append(float(host_ms))
            self.floor_steps += 1
        if (table_ms is not None and waited_ms >= self.device_bound_wait_ms and math.isfinite(step_ms)
                and math.isfinite(table_ms)):
            (self._trimmed if trimmed else self._device).append((float(table_ms), float(step_ms)))
            self.extra_steps += 1
            if trimmed:
                self.trimmed_steps += 1
            else:
                self.full_steps += 1
            if self._since_fit is not None:
                self._since_fit += 1

    def _device_price(self, steps: deque, source: str) -> tuple[float, float]:
        """(scale, extra) from the recent device-bound steps ``steps`` (module docstring). Light on the host:
        sorted lists and medians every step, the line only every ``refit_every`` device-bound steps."""
        if source != self._line_from:
            self._since_fit, self._line_from = None, source
        table = sorted(t for t, _ in steps)
        n = len(table)
        lo, mid, hi = table[n // 10], statistics.median(table), table[(9 * n) // 10]
        if not (mid > 0.0 and hi - lo >= self.min_spread_rel * mid):
            # the prices do not spread: no slope to read, only how far above the table the steps ran
            self._since_fit = None
            return 1.0, max(0.0, statistics.median(p - t for t, p in steps))
        if self._since_fit is not None and self._since_fit < self.refit_every:
            return self._device_part
        x = np.fromiter((t for t, _ in steps), float, n)
        y = np.fromiter((p for _, p in steps), float, n)
        scale = min(max(float(theilslopes(y, x)[0]), 0.0), self.max_scale)
        # The intercept as Theil-Sen's "joint" rule takes it, at the (clipped) slope: the median residual.
        self._device_part, self._since_fit = (scale, float(np.median(y - scale * x))), 0
        self.slope_fits += 1
        return self._device_part

    def current(self) -> ServiceCost:
        """The price transform the planner applies now (the table's own until enough steps were seen)."""
        floor = statistics.median(self._floor) if self.floor_steps >= self.min_steps else 0.0
        scale, extra, trim_extra = 1.0, 0.0, 0.0
        if self.full_steps >= self.min_steps:
            scale, extra = self._device_price(self._device, "full")
            if self.trimmed_steps >= self.min_steps:
                trim_extra = statistics.median(p - (scale * t + extra) for t, p in self._trimmed)
        elif self.trimmed_steps >= self.min_steps:  # (nearly) every step trimmed: the line is theirs
            scale, extra = self._device_price(self._trimmed, "trimmed")
        self._current = ServiceCost(floor, extra, scale, trim_extra)
        return self._current

    def summary(self) -> dict[str, float]:
        """The price current() last gave the planner (read without refitting) and the steps behind it."""
        cost = self._current
        return {"service_cost/floor_ms": cost.floor_ms, "service_cost/extra_ms": cost.extra_ms,
                "service_cost/scale": cost.scale, "service_cost/trim_extra_ms": cost.trim_extra_ms,
                "service_cost/floor_steps": self.floor_steps, "service_cost/extra_steps": self.extra_steps,
                "service_cost/trimmed_steps": self.trimmed_steps, "service_cost/slope_fits": self.slope_fits}
