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

Split-KV ("flash-decoding") path. At batch 1 the grid above has only B * kv_heads *
tiles programs (3 for SmolLM2 decode) on a 132-SM H200, each walking the whole KV of
its request alone, so a decode step is latency-bound on a handful of SMs. The wrapper
then splits every request's keys into ``num_splits`` contiguous, BLOCK_N-aligned chunks
(``chunk = cdiv(cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N``, computed on the device
from kv_lens) and runs one program per (request, kv head, tile, split). Each writes its
unnormalised fp32 partial (acc, running max m, running sum l, per row and head) to an
fp32 workspace ``[T, Hq, num_splits, D + 2]``; a split with no visible key writes
m = -inf, l = 0, acc = 0. A second kernel, one program per (token row, block of query
heads), merges the partials with the log-sum-exp rule and writes every row of the output,
padding rows (and rows the grid does not reach) as zeros, so the output needs no
zero-fill. :func:`default_num_splits` picks the count from shapes alone (never from
device values), so the path stays CUDA-graph capturable; 1 means the single kernel.
"""

from __future__ import annotations

import functools
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


@triton.jit
def _paged_attention_split_kernel(
    q_ptr, k_ptr, v_ptr, ws_ptr, qo_indptr_ptr, kv_lens_ptr, bt_ptr,
    stride_qt, stride_qh,
    stride_kp, stride_kt, stride_kh,
    stride_vp, stride_vt, stride_vh,
    stride_wt, stride_wh, stride_ws,
    stride_bt,
    qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Split-KV pass: like _paged_attention_kernel but program (req, kvh, tile * NUM_SPLITS +
    split) covers only keys [split * chunk, min((split + 1) * chunk, kv_end)) and writes the
    unnormalised partial (acc, m, l) of each of its rows to the workspace instead of an output."""
    req = tl.program_id(0)
    kvh = tl.program_id(1)
    pid = tl.program_id(2)
    tile = pid // NUM_SPLITS
    split = pid % NUM_SPLITS
    q_start = tl.load(qo_indptr_ptr + req)
    q_len = tl.load(qo_indptr_ptr + req + 1) - q_start
    kv_len = tl.load(kv_lens_ptr + req)
    row0 = tile * BLOCK_M
    # Tiles past this request's rows hold none of its rows: nothing to write (the combine
    # kernel reads the workspace only for rows that exist).
    if row0 >= q_len * GROUP:
        return

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
    # This split's chunk of keys. The chunk size depends only on kv_len (read here, on the
    # device), so a captured graph replays correctly with new lengths. A split whose chunk
    # starts at or past kv_end runs no iteration and writes m = -inf, l = 0, acc = 0.
    chunk = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_end)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bt_row = bt_ptr + req.to(tl.int64) * stride_bt
    k_head = k_ptr + kvh.to(tl.int64) * stride_kh
    v_head = v_ptr + kvh.to(tl.int64) * stride_vh
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # lo is a multiple of BLOCK_N, so offs_n >= lo always; keys past hi are never loaded
        # (K and V read as 0), so a stale or NaN cache slot cannot leak in through p * v.
        n_ok = offs_n < hi
        page = tl.load(bt_row + offs_n // PAGE, mask=n_ok, other=0).to(tl.int64)
        slot_in_page = offs_n % PAGE
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_head + page[:, None] * stride_kp + slot_in_page[:, None] * stride_kt + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where((offs_n[None, :] < visible[:, None]) & n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_shift)
        p = tl.exp2(s - m_shift[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + page[:, None] * stride_vp + slot_in_page[:, None] * stride_vt + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    # Workspace row (token, head, split): HEAD_DIM fp32 acc values, then m (log2 units), then l.
    w_row = ws_ptr + tok * stride_wt + head.to(tl.int64) * stride_wh + split * stride_ws
    tl.store(w_row[:, None] + offs_d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])
    tl.store(w_row + HEAD_DIM, m_i, mask=row_ok)
    tl.store(w_row + HEAD_DIM + 1, l_i, mask=row_ok)


@triton.jit
def _paged_attention_combine_kernel(
    ws_ptr, o_ptr, qo_indptr_ptr,
    B, cover_rows,
    stride_wt, stride_wh, stride_ws,
    stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_B: tl.constexpr,
):
    """One program per (token row t, block of BLOCK_H query heads): for each head,
    out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s with M = max_s m_s. Writes zeros
    for padding rows (t >= qo_indptr[B]), rows the split pass's grid did not reach, and rows
    that saw no key (every split has m = -inf, l = 0)."""
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    h_ok = offs_h < NUM_HEADS
    s_ok = offs_s < NUM_SPLITS
    d_ok = offs_d < HEAD_DIM
    # The partials are loaded without waiting for the row lookup below (one memory round
    # trip, not three). For a dead row they are unwritten memory, possibly NaN: the final
    # tl.where discards whatever they give, it never multiplies them by 0.
    w_base = ws_ptr + t.to(tl.int64) * stride_wt + offs_h.to(tl.int64)[:, None] * stride_wh \
        + offs_s[None, :] * stride_ws  # [BLOCK_H, BLOCK_S]
    hs_ok = h_ok[:, None] & s_ok[None, :]
    m = tl.load(w_base + HEAD_DIM, mask=hs_ok, other=float("-inf"))
    l = tl.load(w_base + HEAD_DIM + 1, mask=hs_ok, other=0.0)
    acc = tl.load(w_base[:, :, None] + offs_d[None, None, :], mask=hs_ok[:, :, None] & d_ok[None, None, :],
                  other=0.0)  # [BLOCK_H, BLOCK_S, BLOCK_D]

    # Start of t's request: the largest qo_indptr entry <= t (qo_indptr is non-decreasing).
    total = tl.load(qo_indptr_ptr + B)
    q_start = tl.full([], 0, dtype=tl.int32)
    for b0 in range(0, B + 1, BLOCK_B):
        offs_b = b0 + tl.arange(0, BLOCK_B)
        starts = tl.load(qo_indptr_ptr + offs_b, mask=offs_b <= B, other=0)
        q_start = tl.maximum(q_start, tl.max(tl.where(starts <= t, starts, 0), 0))
    # Tile row (t - q_start) * GROUP + h % GROUP must lie inside the split pass's tiles
    # (max_q_len sizes them; rows beyond are left zero, as in the single-kernel path).
    live = (t < total) & ((t - q_start) * GROUP + offs_h % GROUP < cover_rows)  # [BLOCK_H]

    m_max = tl.max(m, 1)
    m_shift = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_shift[:, None])  # 0 for empty splits (m = -inf)
    l_sum = tl.sum(w * l, 1)
    out = tl.sum(w[:, :, None] * acc, 1) / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
    out = tl.where(live[:, None], out, 0.0)
    tl.store(o_ptr + t.to(tl.int64) * stride_ot + offs_h.to(tl.int64)[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=h_ok[:, None] & d_ok[None, :])


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


# SM count assumed when the device cannot be asked (CPU, TRITON_INTERPRET=1): an H200's.
DEFAULT_NUM_SMS = 132
MAX_NUM_SPLITS = 32
# The split path's fp32 workspace ([T, Hq, splits, D + 2]) is kept under this many bytes by
# halving the split count (a requested num_splits too).
_WORKSPACE_BUDGET_BYTES = 64 << 20
# Keys of the longest possible request per split (default_num_splits). On the H200, a batch of 128
# one-token rows with the mixed_chat workload's prompt lengths (longest 1,573; bench/profile_graph_step.py
# with PROFILE_PROMPT_LENS=bench/prompt_lengths_mixed_chat.json) spends 1.40 ms per step in unsplit
# attention and 0.63 ms in four splits.
KEYS_PER_SPLIT = 512
_LENGTH_SPLIT_WORKSPACE_BYTES = 12 << 20
_MAX_GRID_Z = 65535  # CUDA's limit on a grid's third dimension (query tiles x splits)


@functools.lru_cache(maxsize=None)
def _cuda_num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_num_sms(device.index if device.index is not None else torch.cuda.current_device())
    return DEFAULT_NUM_SMS


def default_num_splits(base_programs: int, num_sms: int = DEFAULT_NUM_SMS, max_kv_len: int | None = None) -> int:
    """KV splits for a base grid of `base_programs` (request x kv head x query tile) programs.

    Shapes only, never device values (so it is capture-safe). Two aims, the larger wins:
    about two programs per SM, ``ceil(2 * num_sms / base_programs)``; and, when the block
    table's reach ``max_kv_len`` is given, at most ``KEYS_PER_SPLIT`` keys per split of the
    longest request the table can hold. A batch of mixed lengths waits for its longest
    request, whose keys one program reads serially: splitting bounds that wait. The count is
    rounded up to a power of two and clamped to [1, MAX_NUM_SPLITS].
    """
    if base_programs <= 0:
        return 1
    want = -(-2 * num_sms // base_programs)
    if max_kv_len:
        want = max(want, -(-int(max_kv_len) // KEYS_PER_SPLIT))
    return max(1, min(MAX_NUM_SPLITS, triton.next_power_of_2(want)))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                    qo_indptr: torch.Tensor, kv_lens: torch.Tensor, block_tables: torch.Tensor,
                    scale: float, causal: bool = True, max_q_len: int | None = None,
                    num_splits: int | None = None, batch_invariant: bool = False) -> torch.Tensor:
    """Triton paged attention with the semantics of :func:`paged_attention_reference`.

    q: [T, Hq, D] (fp16/bf16/fp32, unit stride on D); k_cache/v_cache: [num_pages, page_size,
    Hkv, D] in q's dtype, page_size a power of two >= 16; qo_indptr int32 [B+1]; kv_lens int32
    [B]; block_tables int32 [B, max_pages]. Returns a new [T, Hq, D] tensor in q's dtype.

    max_q_len: an upper bound on the query rows of any request; it sizes the grid. When
    None it is read from qo_indptr on the host (a device sync), so CUDA-graph callers must
    pass it; with it given, the call never reads device values and is capture-safe. It must
    be >= the longest request: rows past the grid's reach are left zero, not computed.

    num_splits: how many KV chunks each (request, kv head, tile) is split into (the
    split-KV path, see the module docstring). None picks :func:`default_num_splits` from
    the grid size and the GPU's SM count; 1 forces the single kernel.

    batch_invariant: one tile shape whatever the query rows, and no split (num_splits must be
    None or 1), so that a query row's output does not depend on how many rows its request
    or the batch has (a verified row equals the same row decoded alone).
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
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")

    group = hq // hkv
    rows = max_q_len * group
    if B == 0 or rows == 0 or T == 0:
        return torch.zeros_like(q, memory_format=torch.contiguous_format)
    block_d = max(16, triton.next_power_of_2(d))
    if batch_invariant:
        if num_splits not in (None, 1):
            raise ValueError(f"batch_invariant runs attention unsplit; got num_splits={num_splits}")
        num_splits = 1
        block_m, block_n, num_warps, num_stages = (64, 64, 4, 2) if block_d <= 128 else (64, 32, 4, 2)
    else:
        block_m, block_n, num_warps, num_stages = _tiles(rows, block_d)
    tiles = triton.cdiv(rows, block_m)
    if num_splits is None:
        sms = _num_sms(q.device)
        grid_splits = default_num_splits(B * hkv * tiles, sms)
        num_splits = default_num_splits(B * hkv * tiles, sms, block_tables.shape[1] * page)
        # Splits beyond the grid's aim (for a long request) pay a workspace round trip and a combine pass
        # over every row: they stop at a smaller workspace (a 256-row verify step keeps two, a decode four).
        while num_splits > grid_splits and T * hq * num_splits * (d + 2) * 4 > _LENGTH_SPLIT_WORKSPACE_BYTES:
            num_splits //= 2
        while num_splits > 1 and (T * hq * num_splits * (d + 2) * 4 > _WORKSPACE_BUDGET_BYTES
                                  or tiles * num_splits > _MAX_GRID_Z):
            num_splits //= 2
    elif num_splits > 1 and tiles * num_splits > _MAX_GRID_Z:
        raise ValueError(f"num_splits={num_splits} x {tiles} query tiles exceeds the grid limit {_MAX_GRID_Z}")
    else:  # a requested split count is an upper bound: a long prefill's workspace stays within the budget
        while num_splits > 1 and T * hq * num_splits * (d + 2) * 4 > _WORKSPACE_BUDGET_BYTES:
            num_splits //= 2
    if num_splits > 1:
        return _paged_attention_split(q, k_cache, v_cache, qo_indptr, kv_lens, block_tables, scale, causal,
                                      group, block_d, block_m, block_n, num_warps, num_stages, tiles, num_splits)

    # Zero-filled so that padding rows (past qo_indptr[-1]) need no program of their own.
    out = torch.zeros_like(q, memory_format=torch.contiguous_format)
    grid = (B, hkv, tiles)
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


def _paged_attention_split(q, k_cache, v_cache, qo_indptr, kv_lens, block_tables, scale, causal,
                           group, block_d, block_m, block_n, num_warps, num_stages, tiles, num_splits):
    """Split-KV path of :func:`paged_attention` (arguments already checked); reads no device value."""
    T, hq, d = q.shape
    hkv = k_cache.shape[2]
    B = kv_lens.shape[0]
    # Both buffers are fully defined before use: the combine kernel writes every output row
    # and reads the workspace only where the split kernel wrote it, so neither needs a memset.
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    ws = torch.empty((T, hq, num_splits, d + 2), dtype=torch.float32, device=q.device)
    _paged_attention_split_kernel[(B, hkv, tiles * num_splits)](
        q, k_cache, v_cache, ws, qo_indptr, kv_lens, block_tables,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        ws.stride(0), ws.stride(1), ws.stride(2),
        block_tables.stride(0),
        float(scale) * _LOG2E,
        HEAD_DIM=d, BLOCK_D=block_d, GROUP=group, PAGE=k_cache.shape[1],
        BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal), NUM_SPLITS=num_splits,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages,
    )
    block_s = triton.next_power_of_2(num_splits)
    # Heads per combine program: as many as keep a program's partials within ~4K fp32 values.
    block_h = max(1, min(triton.next_power_of_2(hq), 4096 // (block_s * block_d)))
    _paged_attention_combine_kernel[(T, triton.cdiv(hq, block_h))](
        ws, out, qo_indptr,
        B, tiles * block_m,
        ws.stride(0), ws.stride(1), ws.stride(2),
        out.stride(0), out.stride(1),
        NUM_HEADS=hq, HEAD_DIM=d, BLOCK_D=block_d, GROUP=group,
        NUM_SPLITS=num_splits, BLOCK_S=block_s, BLOCK_H=block_h,
        BLOCK_B=min(256, triton.next_power_of_2(B + 1)),
        num_warps=4,
    )
    return out
