"""Rotary position embedding of q and k in one kernel (HF ``rotate_half`` layout).

Specification (``rotary_reference``): for each token t at position p_t and frequency table
``inv_freq`` [D/2] (fp32), angle_i = p_t * inv_freq_i, and every head's vector x = [x1, x2]
(halves of D) becomes [x1 cos - x2 sin, x2 cos + x1 sin], computed in fp32 and cast back.
This is what :func:`dspark.models.layers.apply_rotary` computes from a cos/sin table; the
kernel forms the angles itself, so the per-layer table (eight small kernels) disappears.

The kernel, :func:`rotary_kv_write_triton`, serves the paged layers: it rotates q into a
new tensor and writes the rotated k and the untouched v straight into the paged cache at
``slot_mapping`` (negative slots = padding, skipped), which is what ``rotary_reference``
followed by ``write_kv_reference`` does (specification: ``rotary_kv_write_reference``).
One kernel replaces rotary + slot select + two scatters.
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
    def rotate_pair(a, b, ang):
        # The rotation of (first-half, second-half) values a, b by angles ang, fp32:
        # (a cos - b sin, b cos + a sin). Used by the GEMV epilogues that rotate q and k.
        c = tl.cos(ang)
        sn = tl.sin(ang)
        return a * c - b * sn, b * c + a * sn

    @triton.jit
    def _rotate_heads(src, dst, t, st, sh, row, c, s, ok, H: tl.constexpr, HALF: tl.constexpr,
                      BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
        # Token t of src (a possibly strided view, e.g. a slice of the fused QKV output) goes to
        # row `row` of dst, a contiguous [rows, H, D] tensor (token rows, or cache slots); only if ok.
        i = tl.arange(0, BLOCK_D)[None, :]
        h = tl.arange(0, BLOCK_H)[:, None]
        m = (h < tl.where(ok, H, 0)) & (i < HALF)
        src_at = t * st + h * sh + i
        dst_at = row * (H * 2 * HALF) + h * (2 * HALF) + i
        x1 = tl.load(src + src_at, mask=m, other=0.0)
        x2 = tl.load(src + src_at + HALF, mask=m, other=0.0)
        a = x1.to(tl.float32)
        b = x2.to(tl.float32)
        tl.store(dst + dst_at, (a * c - b * s).to(x1.dtype), mask=m)
        tl.store(dst + dst_at + HALF, (b * c + a * s).to(x1.dtype), mask=m)

    @triton.jit
    def _rotary_kernel(q_ptr, k_ptr, v_ptr, qo_ptr, ko_ptr, vo_ptr, pos_ptr, slot_ptr, freq_ptr,
                       sq_t, sq_h, sk_t, sk_h, sv_t, sv_h,
                       HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr,
                       BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        i = tl.arange(0, BLOCK_D)
        p = tl.load(pos_ptr + t).to(tl.float32)
        f = tl.load(freq_ptr + i, mask=i < HALF, other=0.0)
        ang = p * f
        c = tl.cos(ang)[None, :]
        s = tl.sin(ang)[None, :]
        if HQ > 0:
            _rotate_heads(q_ptr, qo_ptr, t, sq_t, sq_h, t, c, s, t >= 0, HQ, HALF, BLOCK_H, BLOCK_D)
        # k and v land in the paged cache at this token's slot; padding tokens (slot < 0) write nothing.
        slot = tl.load(slot_ptr + t).to(tl.int64)
        ok = slot >= 0
        _rotate_heads(k_ptr, ko_ptr, t, sk_t, sk_h, slot, c, s, ok, HK, HALF, BLOCK_H, BLOCK_D)
        hh = tl.arange(0, BLOCK_H)[:, None]
        dd = tl.arange(0, 2 * BLOCK_D)[None, :]
        vm = (hh < tl.where(ok, HK, 0)) & (dd < 2 * HALF)
        v = tl.load(v_ptr + t * sv_t + hh * sv_h + dd, mask=vm, other=0.0)
        tl.store(vo_ptr + slot * (HK * 2 * HALF) + hh * (2 * HALF) + dd, v, mask=vm)


def _check_rotary_args(q: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor) -> None:
    if triton is None:
        raise RuntimeError("the rotary kernels need the triton package")
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"the rotary kernels need CUDA tensors (got {q.device}); on CPU set TRITON_INTERPRET=1")
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q [T, Hq, D] and k [T, Hk, D] expected, got {tuple(q.shape)} and {tuple(k.shape)}")
    D = q.shape[-1]
    if D % 2 or inv_freq.shape != (D // 2,):
        raise ValueError(f"head dim {D} must be even and inv_freq [{D // 2}], got {tuple(inv_freq.shape)}")
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("q and k need a unit stride on the head dim")


def rotary_kv_write_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                              inv_freq: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              slot_mapping: torch.Tensor) -> torch.Tensor:
    """Rotated q [T, Hq, D]; rotated k and v [T, Hk, D] scattered into the caches [pages, page, Hk, D]
    at slot_mapping [T] (slot = page * page_size + offset; negative = skip)."""
    from kernels.paged_attention import write_kv_reference

    q_rot, k_rot = rotary_reference(q, k, positions, inv_freq)
    write_kv_reference(k_cache, v_cache, k_rot, v, slot_mapping)
    return q_rot


def rotary_kv_write_triton(q: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                           inv_freq: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> torch.Tensor | None:
    """Triton version of :func:`rotary_kv_write_reference`, one kernel; capture-safe (no host reads).
    With q None only k and v are written (the drafter's context K/V) and None is returned."""
    _check_rotary_args(k if q is None else q, k, inv_freq)
    T, D = k.shape[0], k.shape[-1]
    hq = 0 if q is None else q.shape[1]
    hk = k.shape[1]
    if v.shape != k.shape or v.stride(-1) != 1:
        raise ValueError(f"v must match k {tuple(k.shape)} with a unit stride on the head dim, got {tuple(v.shape)}")
    want = (hk, D)
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dim() != 4 or tuple(c.shape[2:]) != want or not c.is_contiguous():
            raise ValueError(f"{name} must be a contiguous [pages, page_size, {hk}, {D}] tensor, "
                             f"got {tuple(c.shape)} (contiguous={c.is_contiguous()})")
        if c.dtype != k.dtype:
            raise TypeError(f"{name} dtype {c.dtype} != k dtype {k.dtype}")
    if slot_mapping.shape != (T,) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_mapping must be int32/int64 [{T}], got {slot_mapping.dtype} {tuple(slot_mapping.shape)}")
    qo = torch.empty((T, hq, D), dtype=k.dtype, device=k.device)
    if T:
        _rotary_kernel[(T,)](k if q is None else q, k, v, qo, k_cache, v_cache, positions, slot_mapping,
                             inv_freq.to(torch.float32).contiguous(),
                             0 if q is None else q.stride(0), 0 if q is None else q.stride(1),
                             k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                             HQ=hq, HK=hk, HALF=D // 2, BLOCK_H=triton.next_power_of_2(max(hq, hk)),
                             BLOCK_D=triton.next_power_of_2(D // 2))
    return None if q is None else qo


__all__ = ["rotary_reference", "rotary_kv_write_reference", "rotary_kv_write_triton"]
