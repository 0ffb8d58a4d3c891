"""Paged attention over a block-table KV cache with per-request query lengths.

Layout: the queries of all requests are packed on one flat token axis; request b owns
rows ``qo_indptr[b]:qo_indptr[b+1]``. Its KV lives in pages listed by ``block_tables[b]``
and has ``kv_lens[b]`` valid tokens, this step's tokens included. In causal mode row o
of a request with q query rows sees ``kv_lens[b] - q + o + 1`` tokens; in non-causal
mode (the drafter's block) every row sees all ``kv_lens[b]`` tokens. Rows past
``qo_indptr[-1]`` are padding and come back as zeros.
"""

from __future__ import annotations

import torch


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
    """q: [T, Hq, D]; k_cache/v_cache: [num_blocks, block_size, Hkv, D]; returns [T, Hq, D]."""
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
