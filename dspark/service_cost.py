"""What a service step costs beyond the cost table's price, learnt online (engine.service_cost).

The cost table prices a steady decode step of M verified tokens on the device, T(M). A step in
service costs more: prefill forwards beside it, admissions and retirements, and the host's own
work, which with the overlap scheduler sets the step's period whenever it is longer than the
device's step. The planner values a trim by tokens per millisecond, so a price that leaves these
out overstates what trimming saves: it trims where the saving is smaller than its cost in accepted
tokens, or where the host bounds the step and a shorter device step saves nothing.

The service price of a step of M tokens is ``max(floor, T(M) + extra)``:

- ``extra``: what a device-bound step (the host waited for the device to commit it) took beyond
  T(M) of the step it ran (never below 0);
- ``floor``: the host's part of a step's period (the period less the commit's wait for the
  device): no step is shorter than the host's part of it.

Both are the median over the last ``window`` steps the engine committed, whatever their decision, so
that a stall (a burst of admissions, a collector pause) moves neither; until ``min_steps`` of each
kind were seen the price is the table's own (``ServiceCost.none``).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ServiceCost:
    """A step's service price from its table price: max(floor_ms, table_ms + extra_ms)."""

    floor_ms: float = 0.0
    extra_ms: float = 0.0

    @classmethod
    def none(cls) -> "ServiceCost":
        return cls(0.0, 0.0)

    @property
    def active(self) -> bool:
        return self.floor_ms > 0.0 or self.extra_ms > 0.0

    def price(self, table_ms):
        """The service price of table price(s) ``table_ms`` (a float or a numpy array)."""
        if isinstance(table_ms, np.ndarray):
            return np.maximum(self.floor_ms, table_ms + self.extra_ms)
        return max(self.floor_ms, float(table_ms) + self.extra_ms)


class ServiceCostEstimate:
    """Online estimate of a service step's price beyond the table (see the module docstring)."""

    def __init__(self, window: int = 64, min_steps: int = 8, device_bound_wait_ms: float = 0.02):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if min_steps < 1:
            raise ValueError(f"min_steps must be >= 1, got {min_steps}")
        self.min_steps = int(min_steps)
        self.device_bound_wait_ms = float(device_bound_wait_ms)
        self._extra: deque[float] = deque(maxlen=int(window))  # recent device-bound residuals
        self._floor: deque[float] = deque(maxlen=int(window))  # recent host parts
        self.extra_steps = 0  # device-bound steps that updated ``extra``
        self.floor_steps = 0  # steps that updated ``floor``

    def update(self, *, step_ms: float, table_ms: float | None, host_ms: float | None, waited_ms: float) -> None:
        """Count one committed step: its measured period, the table's price of what it ran (None when
        no table priced it), the host's part of the period (None when unknown), and how long the commit
        waited for the device."""
        if host_ms is not None and math.isfinite(host_ms) and host_ms >= 0.0:
            self._floor.append(float(host_ms))
            self.floor_steps += 1
        if (table_ms is not None and waited_ms >= self.device_bound_wait_ms and math.isfinite(step_ms)
                and math.isfinite(table_ms)):
            self._extra.append(step_ms - table_ms)
            self.extra_steps += 1

    def current(self) -> ServiceCost:
        """The price transform the planner applies now (the table's own until enough steps were seen)."""
        floor = statistics.median(self._floor) if self.floor_steps >= self.min_steps else 0.0
        extra = max(0.0, statistics.median(self._extra)) if self.extra_steps >= self.min_steps else 0.0
        return ServiceCost(floor, extra)

    def summary(self) -> dict[str, float]:
        cost = self.current()
        return {"service_cost/floor_ms": cost.floor_ms, "service_cost/extra_ms": cost.extra_ms,
                "service_cost/floor_steps": self.floor_steps, "service_cost/extra_steps": self.extra_steps}
