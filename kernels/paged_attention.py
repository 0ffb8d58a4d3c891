"""Paged attention over a block-table KV cache with per-request query lengths.

Layout: the queries of all requests are packed on one flat token axis; request b owns
rows ``qo_indptr[b]:qo_indptr[b+1]``. Its KV lives in pages listed by ``block_tables[b]``
and has ``kv_lens[b]`` valid tokens, this step's tokens included. In causal mode row o
of a request with q query rows sees ``kv_lens[b] - q + o + 1`` tokens; in non-causal
mode (the drafter's block) every row sees all ``kv_lens[b]`` tokens. Rows past
``qo_indptr[-1]`` are padding and come back as zeros; so does a row that sees no token.

Three entry points share that contract:

- :func:`paged_attention_reference`: plain PyTorch, the specification (reads index
  tensors on the host, so it is neither fast nor capture-safe).
- :func:`paged_attention`: the Triton kernel's host wrapper. One program per
  (request, kv head, tile of query rows); the rows of a tile are (query row, group
  head) pairs, so every K/V page is loaded once for all query heads that share it
  (grouped-query packing), with an fp32 online softmax over the request's pages.
- :func:`write_kv_reference`: scatters this step's K/V into the cache.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def write_kv_reference(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       slot_mapping: torch.Tensor) -> None:
    """Scatter new K/V rows into the cache. k_cache: [num_blocks, block_size, Hkv, D]; k: [T, Hkv, D];
    slot_mapping: int64 [T], slot = block * block_size + offset, negative = skip (padding)."""
    nb, bs, h, d = k_cache.shape
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    k_cache.view(nb * bs, h, d).index_copy_(0, slots, k[valid].to(k_cache.dtype))
    v_cache.view(nb * bs, h, d).index_copy_(0, slots, v[valid].to(v_cache.dtype))


def paged_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                              qo_indptr: torch.Tensor, kv_lens: torch.Tensor, block_tables: torch.Tensor,
                              scale: float, causal: bool = True) -> torch.Tensor:
    """Specification of paged attention (see the module docstring for the row/visibility rules).

    q: [T, Hq, D]; k_cache/v_cache: [num_pages, page_size, Hkv, D] with Hq a multiple of Hkv
    (query head h reads kv head h // (Hq // Hkv)); qo_indptr int32 [B+1]; kv_lens int32 [B];
    block_tables int32 [B, max_pages]. Computes in fp32 and returns [T, Hq, D] in q's dtype;
    padding rows and rows that see no key are zero.
    """
    T, hq, d = q.shape
    _, page, hkv, _ = k_cache.shape
    group = hq // hkv
    out = torch.zeros_like(q)
    B = kv_lens.shape[0]
    if B == 0:
        return out
    indptr = qo_indptr.tolist()
    lens = kv_lens.tolist()
    q_lens = [indptr[b + 1] - indptr[b] for b in range(B)]
    qmax, lmax = max(q_lens), max(lens)
    if qmax == 0 or lmax == 0:
        return out
    dev = q.device
    # Gather each request's K/V into a padded dense batch: [B, Lmax, Hkv, D].
    pos = torch.arange(lmax, device=dev)
    pages = block_tables[:, : (lmax + page - 1) // page].long()
    slot = pages[:, pos // page] * page + (pos % page)  # [B, Lmax]
    kv_valid = pos[None, :] < kv_lens.to(dev).long()[:, None]
    slot = torch.where(kv_valid, slot, torch.zeros_like(slot))
    k = k_cache.reshape(-1, hkv, d)[slot].float()
    v = v_cache.reshape(-1, hkv, d)[slot].float()
    # Queries to a padded batch: [B, Qmax, Hq, D].
    row = torch.arange(qmax, device=dev)
    qlen_t = torch.tensor(q_lens, device=dev)
    q_valid = row[None, :] < qlen_t[:, None]
    q_idx = torch.tensor(indptr[:-1], device=dev)[:, None] + row[None, :]
    q_idx = torch.where(q_valid, q_idx, torch.zeros_like(q_idx))
    qb = q[q_idx].float()
    # Visible length per (request, row).
    L = kv_lens.to(dev).long()[:, None]
    if causal:
        visible = L - qlen_t[:, None] + row[None, :] + 1
    else:
        visible = L.expand(B, qmax)
    mask = pos[None, None, :] < visible[:, :, None]  # [B, Qmax, Lmax]
    mask = mask & q_valid[:, :, None]
    # GQA: expand kv heads to query heads.
    k = k.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)  # [B, Hq, L, D]
    v = v.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)
    qb = qb.permute(0, 2, 1, 3)  # [B, Hq, Q, D]
    scores = torch.matmul(qb, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # fully masked padding rows
    ob = torch.matmul(probs, v).permute(0, 2, 1, 3)  # [B, Q, Hq, D]
    out[q_idx[q_valid]] = ob[q_valid].to(q.dtype)
    return out


# --------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------

_LOG2E = 1.4426950408889634


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, qo_indptr_ptr, kv_lens_ptr, bt_ptr,
    stride_qt, stride_qh,
    stride_kp, stride_kt, stride_kh,
    stride_vp, stride_vt, stride_vh,
    stride_ot, stride_oh,
    stride_bt,
    qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    req = tl.program_id(0)
    kvh = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(qo_indptr_ptr + req)
    q_len = tl.load(qo_indptr_ptr + req + 1) - q_start
    kv_len = tl.load(kv_lens_ptr + req)
    row0 = tile * BLOCK_M
    # The grid is sized by the longest request; shorter ones leave their extra tiles idle.
    if row0 >= q_len * GROUP:
        return

    # Tile row m is (query row m // GROUP, head kvh * GROUP + m % GROUP): the group's heads
    # share every K/V tile, which is what makes decode and verification bandwidth-bound
    # on the cache rather than on repeated loads.
    offs_m = row0 + tl.arange(0, BLOCK_M)
    q_row = offs_m // GROUP
    head = kvh * GROUP + offs_m % GROUP
    row_ok = q_row < q_len
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    tok = (q_start + q_row).to(tl.int64)
    q = tl.load(q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    if CAUSAL:
        visible = kv_len - q_len + q_row + 1
        last_row = tl.minimum(row0 + BLOCK_M, q_len * GROUP) - 1
        kv_end = kv_len - q_len + last_row // GROUP + 1
    else:
        visible = tl.zeros([BLOCK_M], dtype=tl.int32) + kv_len
        kv_end = kv_len
    kv_end = tl.minimum(kv_end, kv_len)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bt_row = bt_ptr + req.to(tl.int64) * stride_bt
    k_head = k_ptr + kvh.to(tl.int64) * stride_kh
    v_head = v_ptr + kvh.to(tl.int64) * stride_vh
    for start_n in range(0, kv_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < kv_end
        page = tl.load(bt_row + offs_n // PAGE, mask=n_ok, other=0).to(tl.int64)
        slot_in_page = offs_n % PAGE
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_head + page[:, None] * stride_kp + slot_in_page[:, None] * stride_kt + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where((offs_n[None, :] < visible[:, None]) & n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no key yet keeps m = -inf; shift by 0 then so that exp2 gives 0, not NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_shift)
        p = tl.exp2(s - m_shift[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + page[:, None] * stride_vp + slot_in_page[:, None] * stride_vt + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(o_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


# --------------------------------------------------------------------------------------
# Host wrapper
# --------------------------------------------------------------------------------------

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_index(name: str, t: torch.Tensor, ndim: int, device: torch.device) -> None:
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, q is on {device}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} needs a unit stride on its last dim, got strides {t.stride()}")


def _check_device(device: torch.device) -> None:
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"the Triton kernels need CUDA tensors (got {device}); "
                           "on CPU set TRITON_INTERPRET=1 before importing triton")


def _tiles(rows: int, block_d: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for `rows` = max query rows x group heads."""
    if rows <= 64:  # decode / verification: one tile; 64-key blocks measured best on an H200
        block_m = max(16, triton.next_power_of_2(rows))
        return block_m, 64, 4, 2
    if block_d > 128:
        return 64, 32, 4, 2
    return 128, 64, 8, 2


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                    qo_indptr: torch.Tensor, kv_lens: torch.Tensor, block_tables: torch.Tensor,
                    scale: float, causal: bool = True, max_q_len: int | None = None) -> torch.Tensor:
    """Triton paged attention with the semantics of :func:`paged_attention_reference`.

    q: [T, Hq, D] (fp16/bf16/fp32, unit stride on D); k_cache/v_cache: [num_pages, page_size,
    Hkv, D] in q's dtype, page_size a power of two >= 16; qo_indptr int32 [B+1]; kv_lens int32
    [B]; block_tables int32 [B, max_pages]. Returns a new [T, Hq, D] tensor in q's dtype.

    max_q_len: an upper bound on the query rows of any request; it sizes the grid. When
    None it is read from qo_indptr on the host (a device sync), so CUDA-graph callers must
    pass it; with it given, the call never reads device values and is capture-safe. It must
    be >= the longest request: rows past the grid's reach are left zero, not computed.
    """
    if q.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(f"q must be [T, Hq, D] and k_cache [num_pages, page_size, Hkv, D]; "
                         f"got {tuple(q.shape)} and {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}")
    T, hq, d = q.shape
    _, page, hkv, dk = k_cache.shape
    if dk != d:
        raise ValueError(f"head dim of q ({d}) != head dim of the cache ({dk})")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({hkv})")
    if page < 16 or page & (page - 1):
        raise ValueError(f"page size must be a power of two >= 16, got {page}")
    if q.dtype not in _FLOAT_DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"q/k_cache/v_cache dtypes must match and be one of {_FLOAT_DTYPES}; "
                        f"got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} needs a unit stride on the head dim, got strides {t.stride()}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q is on {q.device}")
    _check_device(q.device)
    _check_index("qo_indptr", qo_indptr, 1, q.device)
    _check_index("kv_lens", kv_lens, 1, q.device)
    _check_index("block_tables", block_tables, 2, q.device)
    B = kv_lens.shape[0]
    if qo_indptr.shape[0] != B + 1 or block_tables.shape[0] != B:
        raise ValueError(f"batch mismatch: qo_indptr {tuple(qo_indptr.shape)} (want [{B + 1}]), "
                         f"block_tables {tuple(block_tables.shape)} (want [{B}, max_pages]), kv_lens [{B}]")
    if max_q_len is None:
        max_q_len = int((qo_indptr[1:] - qo_indptr[:-1]).max().item()) if B > 0 else 0
    elif max_q_len < 0:
        raise ValueError(f"max_q_len must be >= 0, got {max_q_len}")

    # Zero-filled so that padding rows (past qo_indptr[-1]) need no program of their own.
    out = torch.zeros_like(q, memory_format=torch.contiguous_format)
    group = hq // hkv
    rows = max_q_len * group
    if B == 0 or rows == 0 or T == 0:
        return out
    block_d = max(16, triton.next_power_of_2(d))
    block_m, block_n, num_warps, num_stages = _tiles(rows, block_d)
    grid = (B, hkv, triton.cdiv(rows, block_m))
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out, qo_indptr, kv_lens, block_tables,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        block_tables.stride(0),
        float(scale) * _LOG2E,
        HEAD_DIM=d, BLOCK_D=block_d, GROUP=group, PAGE=page,
        BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
