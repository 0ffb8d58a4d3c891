"""Whether Triton runs interpreted. (Which kernels an engine runs is its configuration,
:class:`dspark.config.KernelConfig`, never the environment.)"""

from __future__ import annotations

import os


def interpreted() -> bool:
    """Whether Triton runs its CPU interpreter (TRITON_INTERPRET=1): programs one after another,
    and bf16 dot operands misread (kernels upcast them there)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


__all__ = ["interpreted"]
