"""The garbage collector around timed work: its pauses counted, and optionally frozen or disabled.

A full (generation-2) collection of a process holding a model, a tokenizer and thousands of request
objects can pause the host for 100-200 ms; a benchmark that does not count it bills it to whichever
block it lands in. ``freeze`` collects once and moves every object alive to the permanent generation
(never scanned again), as serving engines do after start-up; ``disable`` turns automatic collection
off; ``default`` leaves it alone. Every mode counts the pauses (``gc.callbacks``).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from dspark.config import ConfigError

GC_MODES = ("default", "freeze", "disable")


class GcPauses:
    """The garbage collector's pauses while active (``gc.callbacks``), and the gc_mode around them:
    ``freeze`` collects, then moves every object alive to the permanent generation (never scanned
    again) and thaws it on exit; ``disable`` turns automatic collection off until exit."""

    def __init__(self, mode: str = "default"):
        if mode not in GC_MODES:
            raise ConfigError(f"gc_mode: {mode!r}; use one of {list(GC_MODES)}")
        self.mode = mode
        self.count = [0, 0, 0]  # collections per generation
        self.ms = 0.0
        self.max_ms = 0.0
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        ms = (time.perf_counter() - self._t0) * 1e3
        self.count[min(int(info.get("generation", 0)), 2)] += 1
        self.ms += ms
        self.max_ms = max(self.max_ms, ms)

    def __enter__(self) -> "GcPauses":
        self._was_enabled = gc.isenabled()
        if self.mode == "freeze":
            gc.collect()
            gc.freeze()
        elif self.mode == "disable":
            gc.disable()
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)
        if self.mode == "freeze":
            gc.unfreeze()
        elif self.mode == "disable" and self._was_enabled:
            gc.enable()

    def settle(self) -> None:
        """Between timed blocks, untimed: in ``freeze`` mode collect and freeze again, so that what the blocks
        so far left alive (their requests and records) joins the permanent generation instead of growing the
        heap every later collection scans; a no-op in the other modes."""
        if self.mode == "freeze":
            gc.collect()
            gc.freeze()

    def summary(self) -> dict[str, Any]:
        return {"gc_mode": self.mode, "gc_collections": list(self.count), "gc_pause_ms_total": round(self.ms, 3),
                "gc_pause_ms_max": round(self.max_ms, 3)}

    def take(self) -> dict[str, Any]:
        """The pauses since the last take() (or since entering), then start counting afresh."""
        out = self.summary()
        self.count, self.ms, self.max_ms = [0, 0, 0], 0.0, 0.0
        return out
