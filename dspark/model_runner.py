"""The only module that builds device tensors for a step and runs the models.

It packs prefill chunks and verification windows on one flat token axis, writes the
attention metadata, runs the drafter's block forward and the target, and keeps the
drafter's context cache in step with the target (see the anchor invariant in
docs/DESIGN.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.attention import AttentionMetadata
from dspark.config import EngineConfig, KernelConfig
from dspark.kv_cache import BlockManager, KVCache
from dspark.models.llama import TargetModel
from dspark.request import Request
from dspark.sampling import RowSampling, sample_rows


@dataclass
class Segment:
    """A run of consecutive positions of one request in a forward."""

    req: Request
    start: int  # first position
    tokens: list[int]


@dataclass
class DraftResult:
    tokens: torch.Tensor  # int64 [B, G]
    probs: torch.Tensor | None  # float32 [B, G, V] processed draft distribution (None when all greedy)
    confidence_logits: torch.Tensor | None  # float32 [B, G]


@dataclass
class TargetResult:
    verify_logits: torch.Tensor  # float32 [B, G+1, V]; rows past each request's window are padding
    hidden: torch.Tensor  # [T_padded, d] final-normed
    qo_indptr: torch.Tensor  # int32 [segments+1] on the host
    num_tokens: int  # real tokens (prefill + verify)
    bucket: int  # tokens after padding to the token bucket


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

    # ---- metadata -------------------------------------------------------------------------
    def _meta(self, segments: list[Segment], *, causal: bool = True, pad_to: int | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        indptr = [0]
        kv_lens: list[int] = []
        tables: list[list[int]] = []
        for s in segments:
            n = len(s.tokens)
            ids.extend(s.tokens)
            positions.extend(range(s.start, s.start + n))
            slots.extend(self.blocks.slot(s.req.req_id, p) for p in range(s.start, s.start + n))
            indptr.append(indptr[-1] + n)
            kv_lens.append(s.start + n)
            tables.append(self.blocks.table(s.req.req_id))
        if pad_to is not None and pad_to > len(ids):
            # Padding rows past qo_indptr[-1]: attention returns zeros for them and their K/V is never written.
            extra = pad_to - len(ids)
            ids.extend([0] * extra)
            positions.extend([0] * extra)
            slots.extend([-1] * extra)
        width = max((len(t) for t in tables), default=1) or 1
        table_t = torch.zeros((len(tables), width), dtype=torch.int32)
        for i, t in enumerate(tables):
            if t:
                table_t[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        dev = self.device
        meta = AttentionMetadata(
            qo_indptr=torch.tensor(indptr, dtype=torch.int32, device=dev),
            kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=dev),
            block_tables=table_t.to(dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            causal=causal,
            max_q_len=max((len(s.tokens) for s in segments), default=0),
            kernels=self.kernels,
        )
        return (torch.tensor(ids, dtype=torch.int64, device=dev), torch.tensor(positions, dtype=torch.int64, device=dev),
                meta)

    # ---- drafting -------------------------------------------------------------------------
    @torch.inference_mode()
    def draft(self, decodes: list[Request], rows: RowSampling, uniforms: torch.Tensor | None = None) -> DraftResult:
        """Draft one block per request; ``uniforms`` [B, G] are the draft slots' (default: this step's)."""
        G = self.block_size
        anchors = [r.anchor for r in decodes]
        # Block slots at positions n-1 .. n+G-2; token values are placeholders (the drafter embeds
        # the anchor and uses its mask embedding for the other slots).
        segs = [Segment(r, r.num_tokens - 1, [r.anchor] + [0] * (G - 1)) for r in decodes]
        _, positions, meta = self._meta(segs, causal=False)
        anchor_t = torch.tensor(anchors, dtype=torch.int64, device=self.device)
        hidden = self.drafter.forward_block(anchor_t, positions.view(len(decodes), G)[:, 0], self.draft_cache, meta,
                                            self.target.embed)
        if uniforms is None:
            from dspark.verification import step_uniforms_for

            uniforms = step_uniforms_for(decodes, G, self.device)[:, :G]
        probs_per_slot: list[torch.Tensor] = []

        def sample_fn(logits: torch.Tensor, k: int) -> torch.Tensor:
            tokens, probs = sample_rows(logits, rows, uniforms[:, k])
            if not rows.all_greedy:
                probs_per_slot.append(probs)
            return tokens

        out = self.drafter.draft(hidden, anchor_t, self.target.lm_head_weight, sample_fn, keep_logits=False)
        probs = torch.stack(probs_per_slot, dim=1) if probs_per_slot else None
        return DraftResult(tokens=out.tokens, probs=probs, confidence_logits=out.confidence_logits)

    # ---- target ---------------------------------------------------------------------------
    @torch.inference_mode()
    def run_target(self, prefills: list[Segment], decodes: list[Request], drafts: torch.Tensor | None,
                   windows: list[int], buckets: tuple[int, ...] | None = None) -> TargetResult | None:
        """One target forward over prefill chunks and [anchor, d_1..d_v] of each decoding request."""
        segs = list(prefills)
        draft_rows = drafts.tolist() if drafts is not None else None
        for i, r in enumerate(decodes):
            v = windows[i]
            toks = [r.anchor] + (draft_rows[i][:v] if v else [])
            segs.append(Segment(r, r.num_tokens - 1, toks))
        if not segs:
            return None
        num_tokens = sum(len(s.tokens) for s in segs)
        bucket = num_tokens
        if buckets:
            fitting = [b for b in buckets if b >= num_tokens]
            bucket = fitting[0] if fitting else num_tokens  # above the largest bucket: run unpadded
        ids, positions, meta = self._meta(segs, pad_to=bucket)
        hidden, captured = self.target(ids, positions, self.cache, meta, self.capture_layers)
        if self.drafter is not None:
            # Every processed row becomes drafter context; rows of drafts rejected below are
            # overwritten before they are ever read (the next block covers their positions).
            self.drafter.context_kv(captured, positions, self.draft_cache, meta)
        G = self.block_size
        B = len(decodes)
        V = self.target.cfg.vocab_size
        verify_logits = torch.zeros((B, G + 1, V), dtype=torch.float32, device=self.device)
        if B:
            starts = meta.qo_indptr[len(prefills):-1].tolist()
            idx: list[int] = []
            dst: list[tuple[int, int]] = []
            for i, r in enumerate(decodes):
                for k in range(windows[i] + 1):
                    idx.append(starts[i] + k)
                    dst.append((i, k))
            logits = self.target.compute_logits(hidden[torch.tensor(idx, device=self.device)], kernels=self.kernels)
            bi = torch.tensor([d[0] for d in dst], device=self.device)
            ki = torch.tensor([d[1] for d in dst], device=self.device)
            verify_logits[bi, ki] = logits
        return TargetResult(verify_logits=verify_logits, hidden=hidden, qo_indptr=meta.qo_indptr.cpu(),
                            num_tokens=num_tokens, bucket=bucket)


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
