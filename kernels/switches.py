"""Whether Triton runs interpreted, and whether an engine's switch puts a CUDA-only step kernel on its tensors.
(Which kernels an engine runs is its configuration, :class:`dspark.config.KernelConfig`, never the environment.)"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch  # does not import triton

if TYPE_CHECKING:
    from dspark.config import KernelConfig


def interpreted() -> bool:
    """Whether Triton runs its CPU interpreter (TRITON_INTERPRET=1): programs one after another,
    and bf16 dot operands misread (kernels upcast them there)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def cuda_switch_on(kernels: KernelConfig | None, switch: str, device: torch.device | str) -> bool:
    """Whether the step kernel behind ``engine.kernels.<switch>`` runs for an engine with ``kernels`` on tensors on
    ``device``: the Triton backend, the switch on, and CUDA only (elsewhere the PyTorch reference runs)."""
    return (kernels is not None and kernels.attention_backend == "triton" and bool(getattr(kernels, switch))
            and torch.device(device).type == "cuda")


__all__ = ["cuda_switch_on", "interpreted"]
