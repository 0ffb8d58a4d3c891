"""SwiGLU's gate: silu(g) * u from the fused gate/up projection output [.., 2I] -> [.., I].

Specification (``silu_mul_reference``): ``F.silu(g) * u`` in the input dtype, as the
unfused MLP computes it (two elementwise kernels and a read of each half twice).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    g, u = gate_up.chunk(2, dim=-1)
    return F.silu(g) * u


if triton is not None:

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, I, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < I
        g = tl.load(x_ptr + row * 2 * I + cols, mask=m, other=0.0)
        u = tl.load(x_ptr + row * 2 * I + I + cols, mask=m, other=0.0)
        g32 = g.to(tl.float32)
        s = (g32 / (1.0 + tl.exp(-g32))).to(g.dtype)  # silu rounded to the input dtype, as torch does
        tl.store(out_ptr + row * I + cols, (s.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=m)


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    if triton is None:
        raise RuntimeError("silu_mul_triton needs the triton package")
    if gate_up.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"silu_mul_triton needs CUDA tensors (got {gate_up.device}); on CPU set TRITON_INTERPRET=1")
    two_i = gate_up.shape[-1]
    if two_i % 2:
        raise ValueError(f"last dim must be even (gate and up halves), got {two_i}")
    I = two_i // 2
    x = gate_up.reshape(-1, two_i).contiguous()
    out = torch.empty((x.shape[0], I), dtype=x.dtype, device=x.device)
    BLOCK = 1024
    if x.shape[0]:
        _silu_mul_kernel[(x.shape[0], triton.cdiv(I, BLOCK))](x, out, I, BLOCK=BLOCK)
    return out.view(*gate_up.shape[:-1], I)


__all__ = ["silu_mul_reference", "silu_mul_triton"]
