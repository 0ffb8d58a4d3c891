"""The batch-invariant mode of the plain-PyTorch backend (``engine.batch_invariant=true`` with
``engine.attention_backend=torch``): a row's result does not depend on the other rows of its step.

Two operations of the plain forward are not batch-invariant on a CPU. A BLAS GEMM picks its kernel by
the row count M (MKL rounds a row differently at M=1, M=2..15 and M>=16, and for a 1536-deep product
again at M=64..128), so a verified token's logits differ in the last bits from the same token decoded
alone. And the reference attention pads every request to the batch's longest context, so a row's
reductions over its keys run over a length that depends on its neighbours. In float32 either can part
two arms' greedy outputs at a near-tie.

- :func:`row_tiled_linear` runs every GEMM as a batch of tiles of :data:`ROW_TILE` rows (the last one
  padded with zeros): every tile is one GEMM problem of the same shape, and a row's result is the same
  in any tile, at any position, in a batch of any number of tiles.
- :func:`paged_attention_rowwise` computes each query row alone over exactly the keys it sees, so its
  reductions have a length fixed by its own position.

Norms, softmax, rotary and the elementwise operations are per row already (tested with the rest in
``tests/test_row_invariant.py``). The mode costs speed: padded GEMM tiles at small batches and one
attention call per query row.
"""

from __future__ import annotations

import torch

# Rows per GEMM problem. A verify step of one request (a block of 7 and its anchor) fits one tile; a one-token
# step pays for all 16 rows (2.5x its plain GEMMs on SmolLM2), and no smaller tile costs both kinds of step alike.
ROW_TILE = 16


def row_tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     rows: int = ROW_TILE) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for x [..., K] on row tiles of ``rows`` rows, every tile one problem of
    the same shape in one batched GEMM (the last tile padded with zero rows), so that each row's result
    is bitwise the same whatever the other rows are and however many there are. (A plain GEMM over all
    rows is not: MKL's result for a row changes with M, at M=64..128 for a 1536-deep product too.)"""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    lead, k = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, k)
    m = flat.shape[0]
    padded = -(-m // rows) * rows
    if padded != m:
        flat = torch.cat((flat, flat.new_zeros(padded - m, k)))
    elif not flat.is_contiguous():
        flat = flat.contiguous()
    tiles = padded // rows
    # one batched GEMM of `tiles` identical [rows, K] x [K, N] problems (the weight broadcast, not copied)
    out = torch.bmm(flat.view(tiles, rows, k), weight.t().unsqueeze(0).expand(tiles, k, weight.shape[0]))
    out = out.view(padded, weight.shape[0])[:m]
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, weight.shape[0])


def paged_attention_rowwise(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                            qo_indptr: torch.Tensor, kv_lens: torch.Tensor, block_tables: torch.Tensor,
                            scale: float, causal: bool = True) -> torch.Tensor:
    """Paged attention with the visibility rules of ``kernels.paged_attention.paged_attention_reference``
    (same arguments, same result up to rounding), each query row computed on its own over exactly its
    visible keys: row r of a request with n query rows and L keys sees keys 0..L-n+r (all L when not
    causal). Computes in float32; returns [T, Hq, D] in q's dtype, zero for rows that see no key."""
    T, hq, d = q.shape
    _, page, hkv, _ = k_cache.shape
    group = hq // hkv
    out = torch.zeros_like(q)
    indptr, lens = qo_indptr.tolist(), kv_lens.tolist()
    flat_k, flat_v = k_cache.reshape(-1, hkv, d), v_cache.reshape(-1, hkv, d)
    for b, kv_len in enumerate(lens):
        first, last = indptr[b], indptr[b + 1]
        n = last - first
        if n <= 0 or kv_len <= 0:
            continue
        pages = block_tables[b, : -(-kv_len // page)].long()
        slots = (pages[:, None] * page + torch.arange(page, device=pages.device)).flatten()[:kv_len]
        # [L, Hq, D], rows contiguous: a prefix [:vis] has the same strides at every L
        k = flat_k[slots].float().repeat_interleave(group, dim=1)
        v = flat_v[slots].float().repeat_interleave(group, dim=1)
        for r in range(n):
            vis = kv_len - n + r + 1 if causal else kv_len
            if vis <= 0:
                continue
            qr = q[first + r].float().unsqueeze(1)  # [Hq, 1, D]
            scores = torch.bmm(qr, k[:vis].permute(1, 2, 0)) * scale  # [Hq, 1, vis]
            probs = torch.softmax(scores, dim=-1)
            out[first + r] = torch.bmm(probs, v[:vis].permute(1, 0, 2))[:, 0].to(q.dtype)
    return out


__all__ = ["ROW_TILE", "paged_attention_rowwise", "row_tiled_linear"]
