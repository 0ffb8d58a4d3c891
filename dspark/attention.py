"""The one attention interface of the engine: per-step metadata and the backend call.

Every model (target and drafter) calls :func:`attend` with the metadata of the step. The
metadata also carries the engine's kernel settings (:class:`dspark.config.KernelConfig`:
attention backend, batch invariance, the ``engine.kernels`` switches), which every layer of the
step reads from it: there are no process-wide settings, so engines with different settings can
share a process.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.config import DEFAULT_KERNELS, KernelConfig
from kernels.paged_attention import paged_attention_reference, write_kv_reference


@dataclass(slots=True)
class AttentionMetadata:
    """Describes one forward over packed tokens of several requests.

    qo_indptr:    int32 [B+1], exclusive prefix sum of query rows per request.
    kv_lens:      int32 [B], KV length of each request AFTER this step's tokens are written.
    block_tables: int32 [B, max_pages], page ids of each request (unused entries arbitrary).
    slot_mapping: int64 [T], cache slot of each packed token (page * page_size + offset), -1 = padding.
    causal:       True for the target; False for the drafter's block (rows see all kv_lens[b]).
    max_q_len:    the longest request's query rows, known on the host when the step is built; kernels
                  size their grid with it, so passing it avoids a device-to-host read (and keeps
                  the call capturable in a CUDA graph).
    kernels:      the engine's kernel settings (``EngineConfig.kernel_config()``); None (the default)
                  means ``DEFAULT_KERNELS``: the torch backend with every switch at its default.
    """

    qo_indptr: torch.Tensor
    kv_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    causal: bool = True
    max_q_len: int | None = None
    trash_slot: int | None = None
    kernels: KernelConfig | None = None

    # trash_slot: a cache slot no request owns (ModelRunner allocates one spare page). When
    # set, write_kv sends padding rows (slot -1) there instead of filtering them out with a
    # boolean mask, so the write never syncs and can be captured in a CUDA graph.

    def __post_init__(self) -> None:
        if self.kernels is None:
            self.kernels = DEFAULT_KERNELS

    @property
    def batch_size(self) -> int:
        return int(self.kv_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             meta: AttentionMetadata) -> None:
    if meta.trash_slot is None:
        write_kv_reference(k_cache, v_cache, k, v, meta.slot_mapping)
        return
    nb, bs, h, d = k_cache.shape
    slots = torch.where(meta.slot_mapping >= 0, meta.slot_mapping, meta.trash_slot)
    k_cache.view(nb * bs, h, d).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(nb * bs, h, d).index_copy_(0, slots, v.to(v_cache.dtype))


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
           scale: float) -> torch.Tensor:
    """q: [T, Hq, D] -> [T, Hq, D] over the paged cache of one layer, on ``meta.kernels``' backend
    (the batch-invariant mode runs the Triton kernel unsplit, or the plain backend row by row)."""
    kc = meta.kernels
    if kc.attention_backend == "triton":
        from kernels.paged_attention import paged_attention

        return paged_attention(q, k_cache, v_cache, qo_indptr=meta.qo_indptr, kv_lens=meta.kv_lens,
                               block_tables=meta.block_tables, scale=scale, causal=meta.causal,
                               max_q_len=meta.max_q_len, batch_invariant=kc.batch_invariant,
                               num_splits=None if kc.batch_invariant else kc.attention_splits)
    if kc.batch_invariant:  # the plain backend's batch-invariant mode: row by row
        from dspark.models.row_invariant import paged_attention_rowwise

        return paged_attention_rowwise(q, k_cache, v_cache, qo_indptr=meta.qo_indptr, kv_lens=meta.kv_lens,
                                       block_tables=meta.block_tables, scale=scale, causal=meta.causal)
    return paged_attention_reference(q, k_cache, v_cache, qo_indptr=meta.qo_indptr, kv_lens=meta.kv_lens,
                                     block_tables=meta.block_tables, scale=scale, causal=meta.causal)
