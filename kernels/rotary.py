"""Rotary position embedding of q and k in one kernel (HF ``rotate_half`` layout).

Specification (``rotary_reference``): for each token t at position p_t and frequency table
``inv_freq`` [D/2] (fp32), angle_i = p_t * inv_freq_i, and every head's vector x = [x1, x2]
(halves of D) becomes [x1 cos - x2 sin, x2 cos + x1 sin], computed in fp32 and cast back.
This is what :func:`dspark.models.layers.apply_rotary` computes from a cos/sin table; the
kernel forms the angles itself, so the per-layer table (eight small kernels) disappears.
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


def rotary_reference(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                     inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hk, D], positions int [T], inv_freq fp32 [D/2] -> rotated (q, k)."""
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]

    def rot(x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x1, x2 = x32.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rot(q), rot(k)


if triton is not None:

    @triton.jit
    def _rotate_heads(src, dst, t, st, sh, c, s, H: tl.constexpr, HALF: tl.constexpr,
                      BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
        # src may be a strided view (e.g. a slice of the fused QKV output); dst is contiguous [T, H, D].
        i = tl.arange(0, BLOCK_D)[None, :]
        h = tl.arange(0, BLOCK_H)[:, None]
        m = (h < H) & (i < HALF)
        src_at = t * st + h * sh + i
        dst_at = t * (H * 2 * HALF) + h * (2 * HALF) + i
        x1 = tl.load(src + src_at, mask=m, other=0.0)
        x2 = tl.load(src + src_at + HALF, mask=m, other=0.0)
        a = x1.to(tl.float32)
        b = x2.to(tl.float32)
        tl.store(dst + dst_at, (a * c - b * s).to(x1.dtype), mask=m)
        tl.store(dst + dst_at + HALF, (b * c + a * s).to(x1.dtype), mask=m)

    @triton.jit
    def _rotary_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, freq_ptr, sq_t, sq_h, sk_t, sk_h,
                       HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr,
                       BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        i = tl.arange(0, BLOCK_D)
        p = tl.load(pos_ptr + t).to(tl.float32)
        f = tl.load(freq_ptr + i, mask=i < HALF, other=0.0)
        ang = p * f
        c = tl.cos(ang)[None, :]
        s = tl.sin(ang)[None, :]
        _rotate_heads(q_ptr, qo_ptr, t, sq_t, sq_h, c, s, HQ, HALF, BLOCK_H, BLOCK_D)
        _rotate_heads(k_ptr, ko_ptr, t, sk_t, sk_h, c, s, HK, HALF, BLOCK_H, BLOCK_D)


def rotary_triton(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                  inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if triton is None:
        raise RuntimeError("rotary_triton needs the triton package")
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"rotary_triton needs CUDA tensors (got {q.device}); on CPU set TRITON_INTERPRET=1")
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q [T, Hq, D] and k [T, Hk, D] expected, got {tuple(q.shape)} and {tuple(k.shape)}")
    T, hq, D = q.shape
    hk = k.shape[1]
    if D % 2 or inv_freq.shape != (D // 2,):
        raise ValueError(f"head dim {D} must be even and inv_freq [{D // 2}], got {tuple(inv_freq.shape)}")
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("q and k need a unit stride on the head dim")
    qo = torch.empty((T, hq, D), dtype=q.dtype, device=q.device)
    ko = torch.empty((T, hk, D), dtype=k.dtype, device=k.device)
    if T:
        _rotary_kernel[(T,)](q, k, qo, ko, positions, inv_freq.to(torch.float32).contiguous(),
                             q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                             HQ=hq, HK=hk, HALF=D // 2, BLOCK_H=triton.next_power_of_2(max(hq, hk)),
                             BLOCK_D=triton.next_power_of_2(D // 2))
    return qo, ko


__all__ = ["rotary_reference", "rotary_triton"]
