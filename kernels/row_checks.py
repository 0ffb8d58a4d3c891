"""Input checks shared by the row-reduction kernels over a vocabulary (kernels/argmax.py,
kernels/top_probability.py): logits [T, V] with a unit stride on V, an optional output [T] of the
kernel's dtype, and power-of-two tile sizes. Each raises the error type and message its kernel
documents."""

from __future__ import annotations

import os

import torch

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def power_of_two(name: str, value, low: int) -> int:
    """``value`` when it is an int power of two >= ``low``; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= {low}, got {value!r}")
    return value


def check_row_logits(logits: torch.Tensor, out: torch.Tensor | None, *, kernel: str, result: str, columns: str,
                     out_dtype: torch.dtype, contiguous_out: bool) -> tuple[int, int]:
    """(T, V) of ``logits`` after checking it and ``out`` for ``kernel`` (its name in messages); ``result``
    names what an empty vocabulary lacks, ``columns`` what V must fit in int32, ``out_dtype`` the output's
    dtype, ``contiguous_out`` whether the output must be contiguous."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [T, V], got shape {tuple(logits.shape)}")
    if logits.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"logits must be float32, bfloat16 or float16, got {logits.dtype}")
    T, V = logits.shape
    if V == 0:
        raise ValueError(f"logits has an empty vocabulary (shape {tuple(logits.shape)}): no {result}")
    if V >= 2 ** 31:
        raise ValueError(f"vocabulary of {V} entries does not fit the kernel's int32 {columns}")
    if V > 1 and logits.stride(1) != 1:
        raise ValueError(f"logits needs a unit stride on V, got strides {logits.stride()}")
    if logits.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"{kernel} needs CUDA tensors (got {logits.device}); on CPU set "
                           "TRITON_INTERPRET=1 before importing triton")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.dtype != out_dtype:
            raise TypeError(f"out must be {str(out_dtype).removeprefix('torch.')}, got {out.dtype}")
        if tuple(out.shape) != (T,):
            raise ValueError(f"out must have shape ({T},), got {tuple(out.shape)}")
        if out.device != logits.device:
            raise ValueError(f"out is on {out.device}, logits on {logits.device}")
        if contiguous_out and T > 1 and out.stride(0) != 1:
            raise ValueError(f"out must be contiguous, got strides {out.stride()}")
    return T, V
