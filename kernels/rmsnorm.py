"""RMSNorm, optionally fused with the residual add that precedes it.

Specification (``rmsnorm_reference``), as the decoder layers compute it unfused:

    h   = x + residual            (in x's dtype: fp32 sum rounded once, as torch adds bf16)
    out = weight * h / sqrt(mean(h^2) + eps)   (fp32 math, cast back to x's dtype)

returning ``(out, h)`` (``h`` is the new residual stream); without a residual ``h = x``.
The Triton kernel does both in one pass per row (one read of x and residual, two writes)
instead of the seven elementwise kernels and one reduction of the unfused form.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float,
                      residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    h = x if residual is None else x + residual
    h32 = h.float()
    out = h32 * torch.rsqrt(h32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (weight.float() * out).to(x.dtype), h


if triton is not None:

    @triton.jit
    def _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, h_ptr, N, eps,
                        HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
        if HAS_RES:
            r = tl.load(res_ptr + row * N + cols, mask=mask, other=0.0)
            h = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded like torch's x + residual
            tl.store(h_ptr + row * N + cols, h, mask=mask)
        else:
            h = x
        h32 = h.to(tl.float32)
        ms = tl.sum(h32 * h32, axis=0) / N
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        out = w * (h32 * (1.0 / tl.sqrt(ms + eps)))
        tl.store(out_ptr + row * N + cols, out.to(x.dtype), mask=mask)


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float,
                   residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if triton is None:
        raise RuntimeError("rmsnorm_triton needs the triton package")
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"rmsnorm_triton needs CUDA tensors (got {x.device}); on CPU set TRITON_INTERPRET=1")
    N = x.shape[-1]
    if weight.shape != (N,):
        raise ValueError(f"weight has shape {tuple(weight.shape)}, expected ({N},)")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}")
    x2 = x.reshape(-1, N).contiguous()
    rows = x2.shape[0]
    out = torch.empty_like(x2)
    if residual is not None:
        r2 = residual.reshape(-1, N).contiguous()
        h = torch.empty_like(x2)
    else:
        r2, h = x2, x2
    if rows:
        _rmsnorm_kernel[(rows,)](x2, r2, weight, out, h, N, float(eps), HAS_RES=residual is not None,
                                 BLOCK=triton.next_power_of_2(N))
    return out.view(x.shape), h.view(x.shape)


__all__ = ["rmsnorm_reference", "rmsnorm_triton"]
