"""The models and caches of one engine: the target, the drafter, their paged KV caches (with the
trash slot that padding rows write to) and the engine's kernel settings.

The step pipeline over them (draft, pack, verify, accept, commit; dspark/graph_decode.py) is shared
by every step, host-driven or replayed from a CUDA graph. Also here: teacher-forced forwards from a
throw-away cache (:func:`packed_hidden`) for the A/B guards' re-scoring.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.attention import AttentionMetadata
from dspark.config import EngineConfig, KernelConfig
from dspark.kv_cache import BlockManager, KVCache
from dspark.models.llama import TargetModel
from dspark.request import Request


@dataclass
class Segment:
    """A run of consecutive positions of one request in a forward."""

    req: Request
    start: int  # first position
    tokens: list[int]


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    def __init__(self, target: TargetModel, drafter, cfg: EngineConfig, blocks: BlockManager):
        self.target = target
        self.drafter = drafter
        self.cfg = cfg
        self.blocks = blocks
        self.device = torch.device(cfg.device)
        self.dtype = DTYPES[cfg.dtype]
        self.kernels = cfg.kernel_config()  # this engine's kernel settings: every step's metadata carries them
        tc = target.cfg
        # One spare page past the allocator's: padding rows of captured steps write there (trash_slot).
        self.cache = KVCache(tc.num_layers, blocks.num_pages + 1, blocks.page_size, tc.num_kv_heads, tc.head_dim,
                             self.dtype, self.device)
        self.trash_slot = blocks.num_pages * blocks.page_size
        self.draft_cache = None
        self.capture_layers: tuple[int, ...] = ()
        if drafter is not None:
            self.draft_cache = KVCache(drafter.cfg.num_layers, blocks.num_pages + 1, blocks.page_size,
                                       tc.num_kv_heads, tc.head_dim, self.dtype, self.device)
            self.capture_layers = tuple(drafter.cfg.target_layer_ids)

    @property
    def block_size(self) -> int:
        return self.drafter.cfg.block_size if self.drafter is not None else 0

    def reset(self) -> None:
        self.cache.k.zero_()
        self.cache.v.zero_()
        if self.draft_cache is not None:
            self.draft_cache.k.zero_()
            self.draft_cache.v.zero_()


@torch.inference_mode()
def packed_hidden(target: TargetModel, sequences: list[list[int]], page_size: int = 16,
                  kernels: KernelConfig | None = None) -> tuple[torch.Tensor, list[int]]:
    """One teacher-forced forward of the target over ``sequences`` packed on the token axis, from a
    throw-away cache: (final hidden states [sum of lengths, H], each sequence's offset in it). Off the hot
    path: the A/B lossless guard re-scores arms' outputs with it (dspark/bench/reference.py)."""
    p = next(target.parameters())
    if not sequences or any(not s for s in sequences):
        raise ValueError("packed_hidden: need at least one non-empty sequence")
    lens = [len(s) for s in sequences]
    pages = [-(-n // page_size) for n in lens]
    blocks = BlockManager(sum(pages), page_size)
    for i, n in enumerate(lens):
        blocks.reserve(i, n)
    tc = target.cfg
    cache = KVCache(tc.num_layers, sum(pages), page_size, tc.num_kv_heads, tc.head_dim, p.dtype, p.device)
    width = max(pages)
    tables = [blocks.table(i) + [0] * (width - len(blocks.table(i))) for i in range(len(lens))]
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    dev = p.device
    meta = AttentionMetadata(
        qo_indptr=torch.tensor(offsets, dtype=torch.int32, device=dev),
        kv_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
        slot_mapping=torch.tensor([blocks.slot(i, j) for i, n in enumerate(lens) for j in range(n)],
                                  dtype=torch.int64, device=dev),
        max_q_len=max(lens), kernels=kernels)
    ids = torch.tensor([t for s in sequences for t in s], dtype=torch.int64, device=dev)
    positions = torch.cat([torch.arange(n, device=dev) for n in lens])
    hidden, _ = target(ids, positions, cache, meta)
    return hidden, offsets[:-1]


def sequence_logits(target: TargetModel, token_ids: list[int], start: int = 0, page_size: int = 16,
                    kernels: KernelConfig | None = None) -> torch.Tensor:
    """The target's float32 logits after each of ``token_ids[start:]`` ([len - start, V]): row i predicts
    the token at position start + i + 1."""
    n = len(token_ids)
    if not 0 <= start < n:
        raise ValueError(f"sequence_logits: start {start} outside the {n} tokens")
    hidden, _ = packed_hidden(target, [list(token_ids)], page_size, kernels)
    with torch.inference_mode():
        return target.compute_logits(hidden[start:], kernels=kernels).float()


def last_position_logits(target: TargetModel, token_ids: list[int], page_size: int = 16,
                         kernels: KernelConfig | None = None) -> torch.Tensor:
    """The target's logits after ``token_ids`` (float32 [V]), from a throw-away cache."""
    return sequence_logits(target, token_ids, len(token_ids) - 1, page_size, kernels)[0]
