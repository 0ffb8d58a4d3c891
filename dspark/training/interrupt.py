"""A Ctrl-C that long jobs answer at their next safe point instead of in the middle of a step.

Training and data generation run in steps whose state is consistent only between them (an optimizer step half
applied, a batch half committed). Inside ``with DeferredInterrupt() as stop:`` the first SIGINT only sets
``stop.requested``; the loop checks it between steps, keeps what it has (a checkpoint, the finished responses)
and raises ``KeyboardInterrupt`` itself. The first SIGINT also puts the previous handler back, so a second Ctrl-C
interrupts at once, as it would without this. Outside the main thread (where Python delivers no signal) it does
nothing and ``requested`` stays False.
"""

from __future__ import annotations

import signal
import threading


class DeferredInterrupt:
    """Context manager: the first SIGINT sets ``requested`` (see the module docstring)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None
        self._installed = False

    def _on_sigint(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self._previous)  # a second Ctrl-C acts at once

    def __enter__(self) -> "DeferredInterrupt":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed and signal.getsignal(signal.SIGINT) == self._on_sigint:
            signal.signal(signal.SIGINT, self._previous)
        self._installed = False


__all__ = ["DeferredInterrupt"]
