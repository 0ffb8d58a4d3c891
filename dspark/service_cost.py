"""What a service step costs beyond the cost table's price, learnt online (engine.service_cost).

The cost table prices a steady decode step of M verified tokens on the device, T(M). A step in
service costs more: prefill forwards beside it, admissions and retirements, and the host's own
work, which with the overlap scheduler sets the step's period whenever it is longer than the
device's step. The planner values a trim by tokens per millisecond, so a price that leaves these
out overstates what trimming saves: it trims where the saving is smaller than its cost in accepted
tokens, or where the host bounds the step and a shorter device step saves nothing.

The service price of a step of M tokens is ``max(floor, scale * T(M) + extra)``:

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
  median of period minus table price (never below 0).

Medians and a robust line keep a stall (a burst of admissions, a collector pause) from moving the price;
until ``min_steps`` of each kind were seen the price is the table's own (``ServiceCost.none``).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

import numpy as np


MIN_PRICE_MS = 1e-3  # no step is priced below a microsecond: a fitted line may reach 0 at small table prices


@dataclass(frozen=True)
class ServiceCost:
    """A step's service price from its table price: max(floor_ms, scale * table_ms + extra_ms), and never
    below MIN_PRICE_MS (the planner divides by it)."""

    floor_ms: float = 0.0
    extra_ms: float = 0.0
    scale: float = 1.0

    @classmethod
    def none(cls) -> "ServiceCost":
        return cls(0.0, 0.0)

    @property
    def active(self) -> bool:
        return self.floor_ms > 0.0 or self.extra_ms != 0.0 or self.scale != 1.0

    def price(self, table_ms):
        """The service price of table price(s) ``table_ms`` (a float or a numpy array)."""
        if isinstance(table_ms, np.ndarray):
            return np.maximum(max(self.floor_ms, MIN_PRICE_MS), self.scale * table_ms + self.extra_ms)
        return max(self.floor_ms, MIN_PRICE_MS, self.scale * float(table_ms) + self.extra_ms)


def theil_sen_slope(x: np.ndarray, y: np.ndarray) -> float:
    """The Theil-Sen slope of y on x: the median of the slopes between every two points with different x (the
    slope scipy.stats.theilslopes returns). The refit runs inside a planner call, on the host's critical path:
    theilslopes also computes a confidence interval on every call, about ten times this cost at 64 points."""
    i, j = np.triu_indices(len(x), 1)
    dx, dy = x[j] - x[i], y[j] - y[i]
    keep = dx != 0.0
    return float(np.median(dy[keep] / dx[keep])) if keep.any() else 0.0


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
        self._device: deque[tuple[float, float]] = deque(maxlen=int(window))  # recent device-bound (table, period)
        self._floor: deque[float] = deque(maxlen=int(window))  # recent host parts
        self.extra_steps = 0  # device-bound steps that updated the device part (scale, extra)
        self.floor_steps = 0  # steps that updated ``floor``
        self.slope_fits = 0  # device parts that came from a fitted line (scale != 1 allowed)
        self._device_part: tuple[float, float] = (1.0, 0.0)  # (scale, extra) as last computed
        self._since_fit: int | None = None  # device-bound steps since the last computation (None: recompute)
        self._current = ServiceCost.none()  # what current() last gave the planner

    def update(self, *, step_ms: float, table_ms: float | None, host_ms: float | None, waited_ms: float) -> None:
        """Count one committed step: its measured period, the table's price of what it ran (None when
        no table priced it), the host's part of the period (None when unknown), and how long the commit
        waited for the device."""
        if host_ms is not None and math.isfinite(host_ms) and host_ms >= 0.0:
            self._floor.append(float(host_ms))
            self.floor_steps += 1
        if (table_ms is not None and waited_ms >= self.device_bound_wait_ms and math.isfinite(step_ms)
                and math.isfinite(table_ms)):
            self._device.append((float(table_ms), float(step_ms)))
            self.extra_steps += 1
            if self._since_fit is not None:
                self._since_fit += 1

    def _device_price(self) -> tuple[float, float]:
        """(scale, extra) from the recent device-bound steps (module docstring). Light on the host: sorted
        lists and medians every step, the line only every ``refit_every`` device-bound steps."""
        steps = self._device
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
        scale = min(max(theil_sen_slope(x, y), 0.0), self.max_scale)
        # The intercept as Theil-Sen's "joint" rule takes it, at the (clipped) slope: the median residual.
        self._device_part, self._since_fit = (scale, float(np.median(y - scale * x))), 0
        self.slope_fits += 1
        return self._device_part

    def current(self) -> ServiceCost:
        """The price transform the planner applies now (the table's own until enough steps were seen)."""
        floor = statistics.median(self._floor) if self.floor_steps >= self.min_steps else 0.0
        scale, extra = self._device_price() if self.extra_steps >= self.min_steps else (1.0, 0.0)
        self._current = ServiceCost(floor, extra, scale)
        return self._current

    def summary(self) -> dict[str, float]:
        """The price current() last gave the planner (read without refitting) and the steps behind it."""
        cost = self._current
        return {"service_cost/floor_ms": cost.floor_ms, "service_cost/extra_ms": cost.extra_ms,
                "service_cost/scale": cost.scale, "service_cost/floor_steps": self.floor_steps,
                "service_cost/extra_steps": self.extra_steps, "service_cost/slope_fits": self.slope_fits}
