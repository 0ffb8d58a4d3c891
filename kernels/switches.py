"""Opt-in environment switches of the kernels: "1" turns one on, "0" (or unset) leaves it off, and
anything else is refused with a message that says what the switch does; and whether Triton runs
interpreted."""

from __future__ import annotations

import os


def opt_in(name: str, what: str) -> bool:
    """True when the environment variable ``name`` is "1", False when "0" or unset; ``what`` names
    what "1" turns on, for the refusal of any other value."""
    value = os.environ.get(name, "0").strip()
    if value not in ("0", "1"):
        raise ValueError(f"{name}={value!r}: use 1 ({what}) or 0 (off)")
    return value == "1"


def interpreted() -> bool:
    """Whether Triton runs its CPU interpreter (TRITON_INTERPRET=1): programs one after another,
    and bf16 dot operands misread (kernels upcast them there)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


__all__ = ["interpreted", "opt_in"]
