"""Triton JIT compilations while a benchmark runs: a timed block that compiles a kernel pays for it.

``TritonCompiles`` installs Triton's post-compile hook (``triton.knobs.runtime.jit_post_compile_hook``)
for as long as it is entered, chaining a hook that was there before and restoring it on exit, and
counts every kernel compiled meanwhile; ``take()`` returns the count since the last take. Where the
installed Triton has no such hook (``available`` is False) it counts nothing and says so.
"""

from __future__ import annotations

from typing import Any


class TritonCompiles:
    def __init__(self) -> None:
        self.count = 0
        self.names: list[str] = []
        self._previous = None
        self._runtime = None
        try:
            from triton import knobs

            self._runtime = knobs.runtime
        except (ImportError, AttributeError):
            self._runtime = None
        self.available = self._runtime is not None and hasattr(self._runtime, "jit_post_compile_hook")

    def _hook(self, *args: Any, **kwargs: Any):
        self.count += 1
        fn = kwargs.get("fn")
        self.names.append(str(getattr(fn, "name", None) or kwargs.get("repr", "?"))[:80])
        if self._previous is not None:
            return self._previous(*args, **kwargs)
        return None

    def __enter__(self) -> "TritonCompiles":
        if self.available:
            self._previous = self._runtime.jit_post_compile_hook
            self._runtime.jit_post_compile_hook = self._hook
        return self

    def __exit__(self, *exc) -> None:
        if self.available:
            self._runtime.jit_post_compile_hook = self._previous

    def take(self) -> dict[str, Any]:
        """Kernels compiled since the last take() (None when the hook is unavailable), and their names."""
        out = {"compiled": self.count if self.available else None, "kernels": sorted(set(self.names))}
        self.count, self.names = 0, []
        return out
