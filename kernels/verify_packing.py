"""A device-resident step's row bookkeeping: place the draft block's rows, pack the verify rows onto the token
axis, commit the result.

Draft rows (``draft_rows_reference``, the specification). Row r drafts a block of G tokens at positions
``a[r] .. a[r] + G - 1``, where ``a[r] = n[r] - 1`` (its anchor's position) on an active row and 0 on an inactive
one. Outputs: ``positions`` int64 [R*G] (row-major), ``kv_lens`` int32 [R] (``a + G`` on active rows, 1 on
inactive ones) and ``slot_mapping`` int64 [R*G] (the cache slot of each position as below, -1 on inactive rows).

Packing (``pack_verify_rows_reference``, the specification). Row r of a step verifies ``w[r]``
drafted tokens after its anchor, so it occupies ``qlen[r] = w[r] + 1`` consecutive rows of the
flat token axis (0 for an inactive row), ``[anchor, d_1 .. d_w]``, at positions
``n[r] - 1 .. n[r] - 1 + w[r]`` (n: committed length; the anchor is the last committed token, its
KV not yet written). The step's bucket holds T token rows: the running sum of qlen is clamped to
T, so rows past the bucket's end are cut (shortened or emptied) rather than written past it.
Outputs:

- ``indptr`` int32 [R+1]: row r's tokens are ``indptr[r] .. indptr[r+1]-1``;
- ``windows`` int64 [R]: the verify length after the cut (``qlen - 1``, 0 for an empty row);
- ``kv_lens`` int32 [R]: ``n - 1 + qlen`` for active rows, 1 for inactive ones;
- ``ids``, ``pos`` int64 [T]: token id and position of each packed token; padding tokens (past
  the last row) get id 0 and position 0;
- ``slot_mapping`` int64 [T]: ``tables[r, pos // page] * page + pos % page``, -1 for padding;
- ``rows_at`` int64 [R, G+1]: ``min(indptr[r] + j, T - 1)``, where the target's logits for row
  r's j-th verified token sit.

Committing (``commit_state_reference``): ``out[r] = [k, w, emitted...]`` where the emitted slots
are the drafts with ``next`` at slot k (zero past the block), ``seq_len += k + 1`` and
``anchor = next`` on active rows; in place on the decoder's persistent buffers. For greedy rows
``accept_commit_greedy_triton`` also finds k and next (``dspark.verification.accept_greedy`` over the
target's tokens at ``rows_at``, then the commit: that pair is its reference).

The Triton versions compute the same integers (bitwise), one launch each, with no host reads and
no allocation sized from device data, so they run inside a captured CUDA graph. The packing
kernel needs no search from tokens to rows: each program takes a block of rows, computes where
they start (a reduction over the rows before it, recomputed by every program: R is at most a
few thousand) and writes each row's at most G+1 tokens directly; the same program also writes
one block of the padding tokens, past the last row. Inputs are not range-checked (a check would
need a sync): windows must lie in [0, G] and every packed position inside the row's page
table; a position outside it, which the reference refuses with an index error, gets slot -1
(the cache's trash slot) from the kernel instead of a read past the table.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

try:  # Triton is optional at import time: the torch reference is the specification.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only on machines without triton
    triton = None
    tl = None

_ROWS_PER_PROGRAM = 64
_PAD_TOKENS_PER_PROGRAM = 1024
_ROW_CHUNK = 1024  # rows summed per loop iteration when a program finds where its rows start


class DraftRows(NamedTuple):
    positions: torch.Tensor  # int64 [R*G]
    kv_lens: torch.Tensor  # int32 [R]
    slot_mapping: torch.Tensor  # int64 [R*G], -1 on inactive rows


class PackedRows(NamedTuple):
    indptr: torch.Tensor  # int32 [R+1]
    windows: torch.Tensor  # int64 [R], after the cut at T
    kv_lens: torch.Tensor  # int32 [R]
    ids: torch.Tensor  # int64 [T]
    pos: torch.Tensor  # int64 [T]
    slot_mapping: torch.Tensor  # int64 [T], -1 for padding
    rows_at: torch.Tensor  # int64 [R, G+1]


def paged_slots(tables: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor, page: int) -> torch.Tensor:
    """Cache slot of each position: its page (``tables`` gathered at ``pos // page``) * page + offset;
    -1 where not ``valid`` (broadcasting: tables [..., P], pos and valid [..., K])."""
    p = torch.where(valid, pos, 0)
    pages = tables.long().gather(-1, torch.div(p, page, rounding_mode="floor"))
    slot = pages * page + torch.remainder(p, page)
    return torch.where(valid, slot, -1)


def _check_draft_rows(active: torch.Tensor, seq_len: torch.Tensor, tables: torch.Tensor, block: int,
                      page_size: int) -> int:
    if active.dim() != 1 or active.dtype != torch.bool:
        raise ValueError(f"active must be bool [R], got {active.dtype} {tuple(active.shape)}")
    R = active.shape[0]
    if R < 1 or int(block) < 1 or int(page_size) < 1:
        raise ValueError(f"a draft step needs R >= 1 rows, a block >= 1 and a page size >= 1, got R={R}, "
                         f"block={block}, page_size={page_size}")
    if seq_len.shape != (R,) or seq_len.dtype != torch.int64:
        raise ValueError(f"seq_len must be int64 [{R}], got {seq_len.dtype} {tuple(seq_len.shape)}")
    if tables.dim() != 2 or tables.shape[0] != R or tables.dtype != torch.int32:
        raise ValueError(f"tables must be int32 [{R}, pages], got {tables.dtype} {tuple(tables.shape)}")
    devs = {t.device for t in (active, seq_len, tables)}
    if len(devs) != 1:
        raise ValueError(f"every input must be on one device, got {sorted(map(str, devs))}")
    return R


def draft_rows_reference(*, active: torch.Tensor, seq_len: torch.Tensor, tables: torch.Tensor, block: int,
                         page_size: int) -> DraftRows:
    """The specification (module docstring): each row's draft block, its KV length and its cache slots."""
    R, G = _check_draft_rows(active, seq_len, tables, block, page_size), int(block)
    start = torch.where(active, seq_len - 1, 0)
    pos = start[:, None] + torch.arange(G, device=active.device)[None, :]
    slots = paged_slots(tables[:, None, :].expand(R, G, tables.shape[1]), pos[..., None], active[:, None, None],
                        page_size)
    return DraftRows(positions=pos.reshape(-1), kv_lens=torch.where(active, start + G, 1).to(torch.int32),
                     slot_mapping=slots.reshape(-1))


def _check_rows(active: torch.Tensor, seq_len: torch.Tensor, anchor: torch.Tensor, drafts: torch.Tensor,
                tables: torch.Tensor) -> tuple[int, int]:
    if active.dim() != 1 or active.dtype != torch.bool:
        raise ValueError(f"active must be bool [R], got {active.dtype} {tuple(active.shape)}")
    R = active.shape[0]
    if R < 1:
        raise ValueError("a verify step needs at least one row (R >= 1)")
    for name, t in (("seq_len", seq_len), ("anchor", anchor)):
        if t.shape != (R,) or t.dtype != torch.int64:
            raise ValueError(f"{name} must be int64 [{R}], got {t.dtype} {tuple(t.shape)}")
    if drafts.dim() != 2 or drafts.shape[0] != R or drafts.dtype != torch.int64:
        raise ValueError(f"drafts must be int64 [{R}, G] (G may be 0), got {drafts.dtype} {tuple(drafts.shape)}")
    if tables.dim() != 2 or tables.shape[0] != R or tables.dtype != torch.int32:
        raise ValueError(f"tables must be int32 [{R}, pages], got {tables.dtype} {tuple(tables.shape)}")
    devs = {t.device for t in (active, seq_len, anchor, drafts, tables)}
    if len(devs) != 1:
        raise ValueError(f"every input must be on one device, got {sorted(map(str, devs))}")
    return R, drafts.shape[1]


def pack_verify_rows_reference(*, windows: torch.Tensor, active: torch.Tensor, seq_len: torch.Tensor,
                               anchor: torch.Tensor, drafts: torch.Tensor, tables: torch.Tensor, num_tokens: int,
                               page_size: int) -> PackedRows:
    """The specification (module docstring). windows: int64 [R] in [0, G], 0 on inactive rows."""
    R, G = _check_rows(active, seq_len, anchor, drafts, tables)
    T, M, dev = int(num_tokens), G + 1, active.device
    if T < 1:
        raise ValueError(f"num_tokens must be >= 1, got {T}")
    n, act, w = seq_len, active, windows
    qlen = torch.where(act, w + 1, 0)
    # Memory safety: the packed rows never reach past the bucket's T token rows, whatever the windows say.
    csum = torch.cumsum(qlen, dim=0).clamp(max=T)
    indptr = torch.cat((torch.zeros(1, dtype=csum.dtype, device=dev), csum))
    qlen = indptr[1:] - indptr[:-1]
    w = torch.where(qlen > 0, qlen - 1, 0)
    tok = torch.arange(T, device=dev)
    row = torch.searchsorted(csum, tok, right=True).clamp(max=R - 1)
    valid = tok < csum[-1]
    off = tok - indptr[row]
    pos = torch.where(valid, n[row] - 1 + off, 0)
    if G:
        drafted = drafts[row, (off - 1).clamp(0, G - 1)]
        ids = torch.where(off == 0, anchor[row], drafted)
    else:
        ids = anchor[row]
    ids = torch.where(valid, ids, 0)
    slots = paged_slots(tables[row], pos[:, None], valid[:, None], page_size).squeeze(1)
    rows_at = (indptr[:R, None] + torch.arange(M, device=dev)[None, :]).clamp(max=T - 1)
    kv_lens = torch.where(act, n - 1 + qlen, 1).to(torch.int32)
    return PackedRows(indptr=indptr.to(torch.int32), windows=w, kv_lens=kv_lens, ids=ids, pos=pos, slot_mapping=slots,
                      rows_at=rows_at)


def commit_state_reference(*, accepted: torch.Tensor, next_token: torch.Tensor, windows: torch.Tensor,
                           active: torch.Tensor, drafts: torch.Tensor, anchor: torch.Tensor, seq_len: torch.Tensor,
                           out: torch.Tensor) -> None:
    """out[:, 0] = k, out[:, 1] = w, out[:, 2:] = drafts with ``next_token`` at slot k; on active rows
    seq_len += k + 1 and anchor = next_token (all in place; drafts [R, G], G may be 0)."""
    k, nxt = accepted, next_token
    slots_out = torch.cat((drafts, torch.zeros_like(nxt)[:, None]), dim=1)  # [R, M]
    ar = torch.arange(slots_out.shape[1], device=slots_out.device)
    slots_out = torch.where(ar[None, :] == k[:, None], nxt[:, None], slots_out)
    out[:, 0].copy_(k)
    out[:, 1].copy_(windows)
    out[:, 2:].copy_(slots_out)
    seq_len.add_(torch.where(active, k + 1, 0))
    anchor.copy_(torch.where(active, nxt, anchor))


def triton_runnable(device: torch.device | str) -> None:
    """Raise, saying what to change, where the Triton kernels of this module cannot run."""
    if triton is None:
        raise RuntimeError("the fused step-metadata kernels need the triton package: install it, or run the torch "
                           "metadata path (engine.attention_backend=torch, or engine.kernels.fused_step_metadata=false)")
    if torch.device(device).type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"the fused step-metadata kernels need CUDA tensors (got {device}); on the CPU set "
                           "TRITON_INTERPRET=1 before importing triton, or run the torch metadata path "
                           "(engine.attention_backend=torch, or engine.kernels.fused_step_metadata=false)")


if triton is not None:

    @triton.jit
    def _row_qlen(w_ptr, w_stride, w_const, w_offset, act_ptr, r, mask, W_IS_TENSOR: tl.constexpr):
        """qlen of rows r: window + 1 on active rows, 0 on inactive and masked ones (int64)."""
        act = tl.load(act_ptr + r, mask=mask, other=0) != 0
        if W_IS_TENSOR:
            w = tl.load(w_ptr + r * w_stride, mask=mask, other=0).to(tl.int64) + w_offset
        else:
            w = r.to(tl.int64) * 0 + w_const
        return tl.where(act & mask, w + 1, 0)

    @triton.jit
    def _pack_verify_rows_kernel(w_ptr, w_stride, w_const, w_offset, act_ptr, n_ptr, anchor_ptr,
                                 drafts_ptr, d_stride, tables_ptr, t_stride, num_pages, page,
                                 indptr_ptr, wout_ptr, kv_ptr, ids_ptr, pos_ptr, slot_ptr, rows_at_ptr, ra_stride,
                                 R, T, G,
                                 W_IS_TENSOR: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr,
                                 CHUNK_R: tl.constexpr, BLOCK_T: tl.constexpr):
        pid = tl.program_id(0)
        r0 = pid * BLOCK_R
        # Where this program's rows start, and where all rows end (before the cut at T).
        before = tl.zeros([], dtype=tl.int64)
        total = tl.zeros([], dtype=tl.int64)
        for start in range(0, R, CHUNK_R):
            r = start + tl.arange(0, CHUNK_R)
            q = _row_qlen(w_ptr, w_stride, w_const, w_offset, act_ptr, r, r < R, W_IS_TENSOR)
            before += tl.sum(tl.where(r < r0, q, 0), axis=0)
            total += tl.sum(q, axis=0)
        end = tl.minimum(total, T)

        # This program's rows: bounds after the cut, window, KV length, token slice, logits rows.
        rr = r0 + tl.arange(0, BLOCK_R)
        rm = rr < R
        q = _row_qlen(w_ptr, w_stride, w_const, w_offset, act_ptr, rr, rm, W_IS_TENSOR)
        incl = before + tl.cumsum(q, axis=0)
        lo = tl.minimum(incl - q, T)
        ql = tl.minimum(incl, T) - lo
        tl.store(indptr_ptr + rr, lo.to(tl.int32), mask=rr <= R)  # rr == R: the end, min(total, T)
        tl.store(wout_ptr + rr, tl.where(ql > 0, ql - 1, 0), mask=rm)
        act = tl.load(act_ptr + rr, mask=rm, other=0) != 0
        n = tl.load(n_ptr + rr, mask=rm, other=0)
        tl.store(kv_ptr + rr, tl.where(act, n - 1 + ql, 1).to(tl.int32), mask=rm)

        j = tl.arange(0, BLOCK_M)
        M = G + 1
        tl.store(rows_at_ptr + rr[:, None] * ra_stride + j[None, :], tl.minimum(lo[:, None] + j[None, :], T - 1),
                 mask=rm[:, None] & (j[None, :] < M))
        live = rm[:, None] & (j[None, :] < ql[:, None])  # [BLOCK_R, BLOCK_M]: the packed tokens
        tok = lo[:, None] + j[None, :]
        pos = n[:, None] - 1 + j[None, :]
        anc = tl.load(anchor_ptr + rr, mask=rm, other=0)
        drafted = tl.load(drafts_ptr + rr[:, None] * d_stride + (j[None, :] - 1),
                          mask=live & (j[None, :] >= 1), other=0)
        ids = tl.where(j[None, :] == 0, anc[:, None], drafted)
        pidx = pos // page
        in_table = live & (pos >= 0) & (pidx < num_pages)
        pg = tl.load(tables_ptr + rr[:, None] * t_stride + pidx, mask=in_table, other=0).to(tl.int64)
        slot = tl.where(in_table, pg * page + pos % page, -1)
        tl.store(ids_ptr + tok, ids, mask=live)
        tl.store(pos_ptr + tok, pos, mask=live)
        tl.store(slot_ptr + tok, slot, mask=live)

        # One block of the padding tokens past the last row.
        t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
        pad = (t >= end) & (t < T)
        zero = tl.zeros([BLOCK_T], dtype=tl.int64)
        tl.store(ids_ptr + t, zero, mask=pad)
        tl.store(pos_ptr + t, zero, mask=pad)
        tl.store(slot_ptr + t, zero - 1, mask=pad)

    @triton.jit
    def _draft_rows_kernel(act_ptr, n_ptr, tables_ptr, t_stride, num_pages, page, pos_ptr, kv_ptr, slot_ptr, R, G,
                           BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr):
        rr = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rm = rr < R
        act = tl.load(act_ptr + rr, mask=rm, other=0) != 0
        n = tl.load(n_ptr + rr, mask=rm, other=1)
        start = tl.where(act, n - 1, 0)
        tl.store(kv_ptr + rr, tl.where(act, start + G, 1).to(tl.int32), mask=rm)
        j = tl.arange(0, BLOCK_G)
        cell = rm[:, None] & (j[None, :] < G)
        pos = start[:, None] + j[None, :]
        pidx = pos // page
        in_table = cell & act[:, None] & (pos >= 0) & (pidx < num_pages)
        pg = tl.load(tables_ptr + rr[:, None] * t_stride + pidx, mask=in_table, other=0).to(tl.int64)
        flat = rr[:, None].to(tl.int64) * G + j[None, :]
        tl.store(pos_ptr + flat, pos, mask=cell)
        tl.store(slot_ptr + flat, tl.where(in_table, pg * page + pos % page, -1), mask=cell)

    @triton.jit
    def _commit_state_kernel(k_ptr, nxt_ptr, w_ptr, act_ptr, drafts_ptr, d_stride, anchor_ptr, seq_ptr,
                             out_ptr, out_stride, R, G,
                             BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr):
        rr = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rm = rr < R
        k = tl.load(k_ptr + rr, mask=rm, other=0).to(tl.int64)
        nxt = tl.load(nxt_ptr + rr, mask=rm, other=0).to(tl.int64)
        j = tl.arange(0, BLOCK_M)
        drafted = tl.load(drafts_ptr + rr[:, None] * d_stride + j[None, :],
                          mask=rm[:, None] & (j[None, :] < G), other=0).to(tl.int64)
        _commit_rows(rr, rm, j, k, nxt, drafted, w_ptr, act_ptr, anchor_ptr, seq_ptr, out_ptr, out_stride, G)

    @triton.jit
    def _accept_commit_greedy_kernel(tok_ptr, rows_at_ptr, ra_stride, w_ptr, act_ptr, drafts_ptr, d_stride,
                                     anchor_ptr, seq_ptr, out_ptr, out_stride, R, G,
                                     BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr):
        rr = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rm = rr < R
        j = tl.arange(0, BLOCK_M)
        cell = rm[:, None] & (j[None, :] < G + 1)
        at = tl.load(rows_at_ptr + rr[:, None] * ra_stride + j[None, :], mask=cell, other=0)
        target = tl.load(tok_ptr + at, mask=cell, other=0).to(tl.int64)  # [BLOCK_R, BLOCK_M]: token after each
        drafted = tl.load(drafts_ptr + rr[:, None] * d_stride + j[None, :],
                          mask=rm[:, None] & (j[None, :] < G), other=0).to(tl.int64)
        w = tl.load(w_ptr + rr, mask=rm, other=0).to(tl.int64)
        # k: the first draft slot that is untested, past the block, or different from the target's token.
        ok = (drafted == target) & (j[None, :] < w[:, None]) & (j[None, :] < G)
        k = tl.min(tl.where(ok, BLOCK_M, j[None, :]), axis=1).to(tl.int64)
        nxt = tl.sum(tl.where(j[None, :] == k[:, None], target, 0), axis=1)
        _commit_rows(rr, rm, j, k, nxt, drafted, w_ptr, act_ptr, anchor_ptr, seq_ptr, out_ptr, out_stride, G)

    @triton.jit
    def _commit_rows(rr, rm, j, k, nxt, drafted, w_ptr, act_ptr, anchor_ptr, seq_ptr, out_ptr, out_stride, G):
        """commit_state_reference's writes for rows rr (k, nxt [BLOCK_R]; drafted [BLOCK_R, BLOCK_M], 0 past G)."""
        w = tl.load(w_ptr + rr, mask=rm, other=0).to(tl.int64)
        act = tl.load(act_ptr + rr, mask=rm, other=0) != 0
        emitted = tl.where(j[None, :] == k[:, None], nxt[:, None], drafted)
        row = out_ptr + rr * out_stride
        tl.store(row[:, None] + 2 + j[None, :], emitted, mask=rm[:, None] & (j[None, :] < G + 1))
        tl.store(row, k, mask=rm)
        tl.store(row + 1, w, mask=rm)
        seq = tl.load(seq_ptr + rr, mask=rm, other=0)
        tl.store(seq_ptr + rr, seq + tl.where(act, k + 1, 0), mask=rm)
        anc = tl.load(anchor_ptr + rr, mask=rm, other=0)
        tl.store(anchor_ptr + rr, tl.where(act, nxt, anc), mask=rm)


def _check_out(name: str, t: torch.Tensor, shape: tuple, dtype: torch.dtype, dev: torch.device) -> None:
    if t.shape != shape or t.dtype != dtype or t.device != dev:
        raise ValueError(f"out.{name} must be {dtype} {list(shape)} on {dev}, got {t.dtype} {tuple(t.shape)} "
                         f"on {t.device}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"out.{name} needs a unit stride on its last dim, got strides {t.stride()}")


def draft_rows_triton(*, active: torch.Tensor, seq_len: torch.Tensor, tables: torch.Tensor, block: int,
                      page_size: int) -> DraftRows:
    """One launch computing ``draft_rows_reference``'s outputs, bitwise (a position past the row's page table,
    which the reference refuses with an index error, gets slot -1)."""
    R, G = _check_draft_rows(active, seq_len, tables, block, page_size), int(block)
    dev = active.device
    triton_runnable(dev)
    for name, t in (("active", active), ("seq_len", seq_len), ("tables", tables)):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} needs a unit stride on its last dim, got strides {t.stride()}")
    out = DraftRows(positions=torch.empty(R * G, dtype=torch.int64, device=dev),
                    kv_lens=torch.empty(R, dtype=torch.int32, device=dev),
                    slot_mapping=torch.empty(R * G, dtype=torch.int64, device=dev))
    _draft_rows_kernel[(triton.cdiv(R, _ROWS_PER_PROGRAM),)](
        active, seq_len, tables, tables.stride(0), tables.shape[1], int(page_size), out.positions, out.kv_lens,
        out.slot_mapping, R, G, BLOCK_R=_ROWS_PER_PROGRAM, BLOCK_G=triton.next_power_of_2(G))
    return out


def pack_verify_rows_triton(*, windows: torch.Tensor | int, active: torch.Tensor, seq_len: torch.Tensor,
                            anchor: torch.Tensor, drafts: torch.Tensor, tables: torch.Tensor, num_tokens: int,
                            page_size: int, window_offset: int = 0, out: PackedRows | None = None) -> PackedRows:
    """One launch computing ``pack_verify_rows_reference``'s outputs, bitwise.

    windows: an integer tensor [R] (any integer dtype and stride, a stride-0 expand included) or
    one int for every row; row r's window is ``window_offset + windows[r]`` and inactive rows
    get none whatever it says (so it need not be zeroed there). out: persistent outputs to
    write (shapes and dtypes as returned), or None to allocate them with torch.empty.
    """
    R, G = _check_rows(active, seq_len, anchor, drafts, tables)
    T, M, dev = int(num_tokens), G + 1, active.device
    if T < 1:
        raise ValueError(f"num_tokens must be >= 1, got {T}")
    if int(page_size) < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    triton_runnable(dev)
    if isinstance(windows, torch.Tensor):
        if windows.shape != (R,) or windows.dtype.is_floating_point or windows.dtype == torch.bool:
            raise ValueError(f"windows must be an integer tensor [{R}], got {windows.dtype} {tuple(windows.shape)}")
        if windows.device != dev:
            raise ValueError(f"windows is on {windows.device} but the rows on {dev}; move it to the same device")
        w_arg, w_stride, w_const, is_tensor = windows, windows.stride(0), 0, True
    else:
        w_arg, w_stride, w_const, is_tensor = active, 0, int(windows) + int(window_offset), False  # pointer unused
    for name, t in (("active", active), ("seq_len", seq_len), ("anchor", anchor), ("drafts", drafts),
                    ("tables", tables)):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} needs a unit stride on its last dim, got strides {t.stride()}")
    if out is None:
        out = PackedRows(indptr=torch.empty(R + 1, dtype=torch.int32, device=dev),
                         windows=torch.empty(R, dtype=torch.int64, device=dev),
                         kv_lens=torch.empty(R, dtype=torch.int32, device=dev),
                         ids=torch.empty(T, dtype=torch.int64, device=dev),
                         pos=torch.empty(T, dtype=torch.int64, device=dev),
                         slot_mapping=torch.empty(T, dtype=torch.int64, device=dev),
                         rows_at=torch.empty((R, M), dtype=torch.int64, device=dev))
    else:
        for name, shape, dtype in (("indptr", (R + 1,), torch.int32), ("windows", (R,), torch.int64),
                                   ("kv_lens", (R,), torch.int32), ("ids", (T,), torch.int64),
                                   ("pos", (T,), torch.int64), ("slot_mapping", (T,), torch.int64),
                                   ("rows_at", (R, M), torch.int64)):
            _check_out(name, getattr(out, name), shape, dtype, dev)
    grid = (max(triton.cdiv(R + 1, _ROWS_PER_PROGRAM), triton.cdiv(T, _PAD_TOKENS_PER_PROGRAM)),)
    _pack_verify_rows_kernel[grid](
        w_arg, w_stride, w_const, int(window_offset), active, seq_len, anchor,
        drafts if G else anchor, drafts.stride(0), tables, tables.stride(0), tables.shape[1], int(page_size),
        out.indptr, out.windows, out.kv_lens, out.ids, out.pos, out.slot_mapping, out.rows_at, out.rows_at.stride(0),
        R, T, G,
        W_IS_TENSOR=is_tensor, BLOCK_R=_ROWS_PER_PROGRAM, BLOCK_M=triton.next_power_of_2(M),
        CHUNK_R=min(_ROW_CHUNK, triton.next_power_of_2(R)), BLOCK_T=_PAD_TOKENS_PER_PROGRAM,
    )
    return out


def _check_commit(rows: dict, active: torch.Tensor, drafts: torch.Tensor, anchor: torch.Tensor,
                  seq_len: torch.Tensor, out: torch.Tensor) -> tuple[int, int]:
    """(R, G) of a commit's inputs, or ValueError naming the bad one (``rows``: more integer tensors [R] by
    name)."""
    if active.dim() != 1 or active.dtype != torch.bool:
        raise ValueError(f"active must be bool [R], got {active.dtype} {tuple(active.shape)}")
    R, dev = active.shape[0], active.device
    if drafts.dim() != 2 or drafts.shape[0] != R or drafts.dtype != torch.int64:
        raise ValueError(f"drafts must be int64 [{R}, G] (G may be 0), got {drafts.dtype} {tuple(drafts.shape)}")
    G = drafts.shape[1]
    triton_runnable(dev)
    for name, t in {**rows, "anchor": anchor, "seq_len": seq_len}.items():
        if t.shape != (R,) or t.dtype.is_floating_point or t.dtype == torch.bool or t.device != dev:
            raise ValueError(f"{name} must be an integer tensor [{R}] on {dev}, got {t.dtype} {tuple(t.shape)} "
                             f"on {t.device}")
    for name, t in (("anchor", anchor), ("seq_len", seq_len)):
        if t.dtype != torch.int64:
            raise ValueError(f"{name} must be int64, got {t.dtype}")
    if out.shape != (R, G + 3) or out.dtype != torch.int64 or out.device != dev:
        raise ValueError(f"out must be int64 [{R}, {G + 3}] on {dev}, got {out.dtype} {tuple(out.shape)} "
                         f"on {out.device}")
    for name, t in {**rows, "active": active, "anchor": anchor, "seq_len": seq_len, "drafts": drafts,
                    "out": out}.items():
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} needs a unit stride on its last dim, got strides {t.stride()}")
    return R, G


def commit_state_triton(*, accepted: torch.Tensor, next_token: torch.Tensor, windows: torch.Tensor,
                        active: torch.Tensor, drafts: torch.Tensor, anchor: torch.Tensor, seq_len: torch.Tensor,
                        out: torch.Tensor) -> None:
    """One launch doing ``commit_state_reference``'s in-place writes (out int64 [R, G+3])."""
    R, G = _check_commit({"accepted": accepted, "next_token": next_token, "windows": windows}, active, drafts,
                         anchor, seq_len, out)
    if R == 0:
        return
    block_r = 128
    _commit_state_kernel[(triton.cdiv(R, block_r),)](
        accepted, next_token, windows, active, drafts if G else anchor, drafts.stride(0), anchor, seq_len,
        out, out.stride(0), R, G,
        BLOCK_R=block_r, BLOCK_M=triton.next_power_of_2(G + 1),
    )


def accept_commit_greedy_triton(*, tokens: torch.Tensor, rows_at: torch.Tensor, windows: torch.Tensor,
                                active: torch.Tensor, drafts: torch.Tensor, anchor: torch.Tensor,
                                seq_len: torch.Tensor, out: torch.Tensor) -> None:
    """Greedy acceptance and the commit in one launch: row r's target tokens are ``tokens[rows_at[r]]`` (the
    target's token after its anchor and after each draft; tokens: the step's argmax per packed token, rows_at
    as packed), its accepted count k the longest prefix of its first ``windows[r]`` drafts equal to them
    (``dspark.verification.accept_greedy``) and its next token the target's token at k; then
    ``commit_state_reference``'s in-place writes with them, bitwise."""
    R, G = _check_commit({"windows": windows}, active, drafts, anchor, seq_len, out)
    dev = active.device
    if tokens.dim() != 1 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.device != dev:
        raise ValueError(f"tokens must be an integer tensor [T] on {dev}, got {tokens.dtype} {tuple(tokens.shape)}")
    if rows_at.shape != (R, G + 1) or rows_at.dtype != torch.int64 or rows_at.device != dev:
        raise ValueError(f"rows_at must be int64 [{R}, {G + 1}] on {dev}, got {rows_at.dtype} {tuple(rows_at.shape)}")
    for name, t in (("tokens", tokens), ("rows_at", rows_at)):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name} needs a unit stride on its last dim, got strides {t.stride()}")
    if R == 0:
        return
    block_r = 128
    _accept_commit_greedy_kernel[(triton.cdiv(R, block_r),)](
        tokens, rows_at, rows_at.stride(0), windows, active, drafts if G else anchor, drafts.stride(0), anchor,
        seq_len, out, out.stride(0), R, G,
        BLOCK_R=block_r, BLOCK_M=triton.next_power_of_2(G + 1),
    )


__all__ = ["DraftRows", "PackedRows", "paged_slots", "draft_rows_reference", "draft_rows_triton",
           "pack_verify_rows_reference", "pack_verify_rows_triton", "commit_state_reference", "commit_state_triton",
           "accept_commit_greedy_triton", "triton_runnable"]
