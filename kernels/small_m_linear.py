"""Small-M (1..16 rows) linear layers as Triton GEMV-style kernels, with the RMSNorm (and the
residual add before it) fused into the prologue and SwiGLU's silu(gate) * up into the epilogue.

Specification (``norm_linear_reference``), rounding as the unfused path does:

    h = x + residual                     (fp32 sum rounded once to x's dtype; h = x without residual)
    n = rmsnorm_reference(x, norm_weight, eps, residual)[0]      (rounded to x's dtype)
    z = n @ weight.T + bias              (fp32 accumulation, one rounding to x's dtype)
    y = silu_mul_reference(z) if silu_mul else z    (z = [gate | up] halves, y is [M, N/2])

returning ``(y, h)``. ``linear_reference`` is ``z`` for ``n = x``. ``weight`` is [N, K] (Linear layout).

Kernel: grid over output columns in blocks of ``BLOCK_N`` (16); a program holds all rows in a
fixed ``SMALL_M_MAX``-row tile (rows >= M masked), takes 1/rms of each row in a first pass over K,
then streams its weight rows (gate and up rows with ``silu_mul``) in ``BLOCK_K`` (<= 256) chunks
into ``tl.dot``. No tile shape depends on M, so the code and each output's reduction order are the
same for every M: deterministic and batch-invariant (a row is bitwise equal at M=1 and M=16).
No atomics, no host syncs, outputs are the only allocations (or pass ``out=`` / ``h_out=``):
safe in CUDA graphs. M <= ``SMALL_M_MAX`` (ValueError above; use cuBLAS), or any M with
``any_m=True``: the grid then also runs over row tiles of the same shape, so every row is computed
exactly as at M=1 (the engine's batch-invariant mode, ``engine.batch_invariant``). fp32 inputs use an
IEEE fp32 dot (no TF32). Under TRITON_INTERPRET=1 the dot operands are upcast to fp32 (exact)
because the interpreter misreads bf16 dot operands.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from kernels.rmsnorm import rmsnorm_reference
from kernels.silu_mul import silu_mul_reference

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

SMALL_M_MAX = 16
BLOCK_N = 16
NUM_WARPS = 4


def _linear32(n: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """n @ weight.T + bias in fp32, rounded once to n's dtype."""
    z = F.linear(n.float(), weight.float(), None if bias is None else bias.float())
    return z.to(n.dtype)


def norm_linear_reference(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                          residual: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                          silu_mul: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    n, h = rmsnorm_reference(x, norm_weight, eps, residual)
    z = _linear32(n, weight, bias)
    return (silu_mul_reference(z) if silu_mul else z), h


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _linear32(x, weight, bias)


if triton is not None:

    @triton.jit
    def _small_m_linear_kernel(x_ptr, res_ptr, nw_ptr, w_ptr, b_ptr, y_ptr, h_ptr,
                               M, N_OUT, K, stride_xm, stride_rm, stride_ym, stride_hm, eps,
                               HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr,
                               SILU_MUL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, UPCAST_DOT: tl.constexpr):
        # Every shape here is fixed (BLOCK_M is SMALL_M_MAX whatever M is; rows >= M are masked),
        # so the code, and with it each output's reduction order, does not depend on M.
        pid = tl.program_id(0)
        row0 = tl.program_id(1).to(tl.int64) * BLOCK_M  # row tiles: any M in the batch-invariant mode
        dtype = y_ptr.dtype.element_ty
        rows = row0 + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        ks = tl.arange(0, BLOCK_K)
        cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # output columns (the gate's, with SILU_MUL)
        col_mask = cols < N_OUT
        x_rows = x_ptr + rows[:, None] * stride_xm
        r_rows = res_ptr + rows[:, None] * stride_rm
        w_rows = w_ptr + cols.to(tl.int64)[:, None] * K
        if SILU_MUL:
            wu_rows = w_ptr + (cols + N_OUT).to(tl.int64)[:, None] * K  # the matching rows of the up half

        if HAS_NORM:  # prologue: each row's 1/rms over all of K
            ss = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + ks
                xm = row_mask[:, None] & (kk < K)[None, :]
                xv = tl.load(x_rows + kk[None, :], mask=xm, other=0.0)
                if HAS_RES:
                    rv = tl.load(r_rows + kk[None, :], mask=xm, other=0.0)
                    hv = (xv.to(tl.float32) + rv.to(tl.float32)).to(dtype)  # rounded like torch's x + r
                    if pid == 0:  # one program per row tile writes the new residual stream
                        tl.store(h_ptr + rows[:, None] * stride_hm + kk[None, :], hv, mask=xm)
                else:
                    hv = xv
                h32 = hv.to(tl.float32)
                ss += h32 * h32
            rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=1) / K + eps)

        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if SILU_MUL:
            acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + ks
            km = kk < K
            xm = row_mask[:, None] & km[None, :]
            xv = tl.load(x_rows + kk[None, :], mask=xm, other=0.0)
            if HAS_NORM:
                if HAS_RES:
                    rv = tl.load(r_rows + kk[None, :], mask=xm, other=0.0)
                    hv = (xv.to(tl.float32) + rv.to(tl.float32)).to(dtype)
                else:
                    hv = xv
                nw = tl.load(nw_ptr + kk, mask=km, other=0.0).to(tl.float32)
                n = (nw[None, :] * (hv.to(tl.float32) * rstd[:, None])).to(dtype)  # the norm's output, rounded
            else:
                n = xv
            wm = col_mask[:, None] & km[None, :]
            if UPCAST_DOT:  # exact casts: the same products, summed in fp32
                n = n.to(tl.float32)
            w = tl.load(w_rows + kk[None, :], mask=wm, other=0.0)
            if UPCAST_DOT:
                w = w.to(tl.float32)
            acc = tl.dot(n, tl.trans(w), acc, input_precision="ieee")  # ieee: no TF32 for fp32 inputs
            if SILU_MUL:
                wu = tl.load(wu_rows + kk[None, :], mask=wm, other=0.0)
                if UPCAST_DOT:
                    wu = wu.to(tl.float32)
                acc_u = tl.dot(n, tl.trans(wu), acc_u, input_precision="ieee")

        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
            if SILU_MUL:
                acc_u += tl.load(b_ptr + N_OUT + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        z = acc.to(dtype)
        if SILU_MUL:
            g32 = z.to(tl.float32)
            s = (g32 / (1.0 + tl.exp(-g32))).to(dtype)  # silu rounded to dtype, as torch does
            z = (s.to(tl.float32) * acc_u.to(dtype).to(tl.float32)).to(dtype)
        tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], z, mask=row_mask[:, None] & col_mask[None, :])


def _interpreted() -> bool:
    # Triton's CPU interpreter multiplies bf16 dot operands as their raw uint16 bits: upcast there.
    return os.environ.get("TRITON_INTERPRET") == "1"


def _rows(t: torch.Tensor, K: int) -> torch.Tensor:
    t2 = t.reshape(-1, K)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _check_out(name: str, out: torch.Tensor, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    if tuple(out.shape) != tuple(shape) or out.dtype != like.dtype or out.device != like.device:
        raise ValueError(f"{name} is {tuple(out.shape)} {out.dtype} on {out.device}, "
                         f"expected {tuple(shape)} {like.dtype} on {like.device}")
    if len(shape) == 2 and out.stride(-1) == 1:
        return out  # any row stride
    if not out.is_contiguous():
        raise ValueError(f"{name} must be contiguous (or 2-D with a unit stride in its last dim)")
    return out.view(-1, shape[-1])


def _launch(fn: str, x, weight, bias, *, norm_weight=None, eps=0.0, residual=None, silu_mul=False,
            out=None, h_out=None, any_m: bool = False, block_n: int = BLOCK_N, block_k: int | None = None,
            num_warps: int = NUM_WARPS, num_stages: int | None = None):
    # block_n / block_k / num_warps / num_stages: tile settings for bench/small_m_sweep.py. They
    # may depend on the weight's shape, never on M (that keeps rows batch-invariant).
    if triton is None:
        raise RuntimeError(f"{fn} needs the triton package")
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"{fn} needs CUDA tensors (got {x.device}); on CPU set TRITON_INTERPRET=1")
    K = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != K:
        raise ValueError(f"weight has shape {tuple(weight.shape)}, expected (N, {K}) for x {tuple(x.shape)}")
    if weight.dtype != x.dtype or not weight.is_contiguous():
        raise ValueError(f"weight must be a contiguous {x.dtype} tensor (got {weight.dtype}, "
                         f"contiguous={weight.is_contiguous()})")
    N = weight.shape[0]
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({N},)")
    if norm_weight is not None and tuple(norm_weight.shape) != (K,):
        raise ValueError(f"norm_weight has shape {tuple(norm_weight.shape)}, expected ({K},)")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}")
    if silu_mul and N % 2:
        raise ValueError(f"silu_mul needs an even N (gate and up halves), weight has N={N}")
    x2 = _rows(x, K)
    M = x2.shape[0]
    if M > SMALL_M_MAX and not any_m:
        raise ValueError(f"{fn} handles at most {SMALL_M_MAX} rows (got {M}); use the cuBLAS path (F.linear), "
                         f"or any_m=True (the batch-invariant mode: same tiles, a grid over row tiles)")
    n_out = N // 2 if silu_mul else N
    y_shape = (*x.shape[:-1], n_out)
    if out is None:
        out = torch.empty(y_shape, dtype=x.dtype, device=x.device)
    y2 = _check_out("out", out, y_shape, x)
    if residual is not None:
        r2 = _rows(residual, K)
        if h_out is None:
            h_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        h2 = _check_out("h_out", h_out, tuple(x.shape), x)
        h = h_out
    else:
        if h_out is not None:
            raise ValueError("h_out is only written with a residual (without one h is x itself)")
        r2, h2, h = x2, x2, x
    if M and n_out:
        BLOCK_K = block_k or max(16, min(256, triton.next_power_of_2(K)))
        grid = (triton.cdiv(n_out, block_n), triton.cdiv(M, SMALL_M_MAX))
        extra = {} if num_stages is None else {"num_stages": num_stages}
        _small_m_linear_kernel[grid](
            x2, r2, norm_weight if norm_weight is not None else x2, weight, bias if bias is not None else x2,
            y2, h2, M, n_out, K, x2.stride(0), r2.stride(0), y2.stride(0), h2.stride(0), float(eps),
            HAS_NORM=norm_weight is not None, HAS_RES=residual is not None, HAS_BIAS=bias is not None,
            SILU_MUL=silu_mul, BLOCK_M=SMALL_M_MAX, BLOCK_N=block_n, BLOCK_K=BLOCK_K,
            UPCAST_DOT=_interpreted(), num_warps=num_warps, **extra)
    elif M and residual is not None:  # nothing to project, but h is still owed
        h.copy_(x + residual)
    return out, h


def norm_linear_triton(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                       residual: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                       silu_mul: bool = False, *, out: torch.Tensor | None = None,
                       h_out: torch.Tensor | None = None, any_m: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused (residual add +) RMSNorm + linear (+ silu*mul); see the module docstring.
    ``out`` / ``h_out``: optional preallocated outputs (``h_out`` only with a residual).
    ``any_m``: lift the M <= SMALL_M_MAX limit (row tiles of the same shape: still batch-invariant)."""
    return _launch("norm_linear_triton", x, weight, bias, norm_weight=norm_weight, eps=eps, residual=residual,
                   silu_mul=silu_mul, out=out, h_out=h_out, any_m=any_m)


def linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  out: torch.Tensor | None = None, any_m: bool = False) -> torch.Tensor:
    """y = x @ weight.T (+ bias), fp32 accumulation, one rounding to x's dtype, for M <= SMALL_M_MAX
    (any M with ``any_m``)."""
    return _launch("linear_triton", x, weight, bias, out=out, any_m=any_m)[0]


__all__ = ["SMALL_M_MAX", "norm_linear_reference", "norm_linear_triton", "linear_reference", "linear_triton"]
