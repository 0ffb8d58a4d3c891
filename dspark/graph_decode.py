"""The step pipeline (prefill, draft, pack, verify, accept, commit) over persistent device rows, captured
as CUDA graphs keyed by token bucket on the device-resident path and run uncaptured by host-driven steps
(``draft_rows`` / ``verify_rows``, with the host's windows): one implementation of every stage.

A steady decode step (every running request decoding, nothing to prefill) does not need
the host to build anything: the committed length and the anchor of each request live on
the device, the step computes positions, cache slots, attention metadata, the draft, the
target's verification, acceptance and the state update from them, and the host only reads
the accepted tokens back (one step late with the overlap scheduler, see
:meth:`dspark.engine.Engine.step`). Everything the step reads or writes is a persistent
buffer (``DecodeBuffers``), so a captured replay reads this step's values.

One graph per token bucket: a step of R padded requests processes R * (v + 1) tokens
(v = block size, or 0 target-only), and the bucket is that token count; the padded request
count follows from it. Padding rows have no KV length to speak of, write to the cache's
trash slot and are ignored by the host.

verify=full (and target-only) captures draft and verification as one graph per token
bucket (R requests -> R*(G+1) tokens). Confidence-scheduled steps (uniform, ragged) run a
draft graph keyed by the padded request count, then a verify graph keyed by the token
bucket alone: the host sizes the step from lagged survival (the planner's budget, known
before the step), the device picks the windows from fresh survival and packs the rows on
the flat token axis itself. Sampled rows sample from counter-based uniforms
(:mod:`dspark.uniforms`, keyed by seed and anchor position) with the same processing and
acceptance rule as the eager path; the batch's sampling signature (all greedy, top-k in
use, top-p in use) is part of every graph key.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from dspark.attention import AttentionMetadata
from dspark.verification import accept_greedy, accept_sampled


def _doubling_ladder(first: int, top: int) -> tuple[int, ...]:
    """first, 2*first, 4*first, ... below top, then top itself."""
    out, b = [], first
    while b < top:
        out.append(b)
        b *= 2
    return tuple(out + [top])


def _first_at_least(ladder: tuple[int, ...], n: int) -> int | None:
    return next((b for b in ladder if b >= n), None)


def _graph_name(key: tuple) -> str:
    """A graph key as a counter-friendly name: step_<tokens>, draft_<rows>, verify_<mode>_<tokens>,
    prefill_<tokens>x<chunks>; a decode graph of a batch that samples adds _sampled (and _topk, _topp)."""
    kind = key[0]
    if kind == "prefill":
        return f"prefill_{key[1]}x{key[2]}"
    name = f"verify_{key[2]}_{key[1]}" if kind == "verify" else f"{kind}_{key[1]}"
    all_greedy, needs_k, needs_p = key[-1]
    if not all_greedy:
        name += "_sampled" + "_topk" * bool(needs_k) + "_topp" * bool(needs_p)
    return name


def copy_from_host(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst <- src (a host tensor), queued on the current stream behind the work in flight. On CUDA the copy
    leaves from a fresh pinned buffer without blocking the host (the caching host allocator keeps that
    buffer until the copy has run); a copy from pageable memory would hold the host until the device's
    queue drains."""
    if dst.device.type == "cuda":
        dst.copy_(src.pin_memory(), non_blocking=True)
    else:
        dst.copy_(src)


def _committed_rows(out_rows: list[list[int]]) -> list[tuple[int, int, list[int]]]:
    """(accepted count, window, committed tokens) per row of the step's output ``[k, w, slots...]``: the k
    accepted drafts and the target's token after them."""
    return [(row[0], row[1], row[2: row[0] + 3]) for row in out_rows]


@dataclass
class Launched:
    """A step whose results are on their way to the host."""

    req_ids: tuple[int, ...]
    host: torch.Tensor  # pinned int64 [R_real, 2 + M]: accepted count, window, then the M output slots
    survival: torch.Tensor | None  # pinned float32 [R_real, G]: this step's fresh survival (planner history)
    event: object | None  # torch.cuda.Event (None on CPU)
    bucket: int
    num_tokens: int  # real tokens the target processed (sum of windows + 1)
    launch_ms: float
    decision: object = None  # the planner's PlanDecision for confidence-scheduled steps
    draft_free: bool = False  # a step without drafting: every row commits the target's next token
    num_prefill_tokens: int = 0  # prefill tokens the same step() call ran before this launch
    max_prob: torch.Tensor | None = None  # pinned float32 [R_real, G]: the drafter's top probabilities (draft_max_prob)


class GraphDecoder:
    """Persistent buffers + one captured step per token bucket for one engine's models and caches."""

    def __init__(self, runner, max_num_seqs: int, max_pages: int, buckets: tuple[int, ...], use_graphs: bool,
                 token_buckets: tuple[int, ...] | None = None, min_verify_len: int = 1, window_impl: str = "torch",
                 metadata_impl: str = "torch", max_prefill_tokens: int = 2048, max_prefill_segments: int = 16,
                 acceptance_estimate: str = "head", estimate_bins: int = 10, prefill_stream: bool = False,
                 draft_free_steps: bool = False, confidence_offsets: bool = False, confidence: bool = True,
                 confidence_min_rows: int = 0, greedy_drafter=None):
        self.runner = runner
        self.kernels = runner.kernels
        self.target = runner.target
        self.drafter = runner.drafter
        # engine.greedy_confidence_calibration: the drafter (its weights shared) with the calibration that steps whose
        # rows all decode greedily read (calibrated_drafter); None: every step reads the drafter's
        self.greedy_drafter = greedy_drafter
        self.G = runner.block_size
        self.M = self.G + 1
        self.device = runner.device
        self.page = runner.blocks.page_size
        self.trash_slot = runner.trash_slot
        self.use_graphs = bool(use_graphs) and self.device.type == "cuda"
        bad = [b for b in buckets if b % self.M]
        if bad or not buckets:
            raise ValueError(f"full-step buckets must be non-empty multiples of {self.M} tokens, got {list(buckets)}")
        self.buckets = tuple(buckets)
        S = max(max_num_seqs, max(self.buckets) // self.M)
        self.S = S
        dev = self.device
        self.seq_len = torch.zeros(S, dtype=torch.int64, device=dev)
        self.anchor = torch.zeros(S, dtype=torch.int64, device=dev)
        self.seed = torch.zeros(S, dtype=torch.int64, device=dev)
        self.active = torch.zeros(S, dtype=torch.bool, device=dev)
        self.tables = torch.zeros((S, max_pages), dtype=torch.int32, device=dev)
        self.temperature = torch.zeros(S, dtype=torch.float32, device=dev)
        self.top_k = torch.zeros(S, dtype=torch.int64, device=dev)
        self.top_p = torch.ones(S, dtype=torch.float32, device=dev)
        self.sampling = (True, False, False)  # (all greedy, needs top-k, needs top-p) of the loaded rows
        self.draft_probs: torch.Tensor | None = None  # [S, G, V], allocated when sampled rows first load
        self.out = torch.zeros((S, 2 + self.M), dtype=torch.int64, device=dev)
        G1 = max(self.G, 1)
        self.drafts = torch.zeros((S, G1), dtype=torch.int64, device=dev)
        self.survival = torch.zeros((S, G1), dtype=torch.float32, device=dev)
        self.confidence_logits = torch.zeros((S, G1), dtype=torch.float32, device=dev)  # raw, for step traces
        # The drafter's top-token probability per slot (max_prob), kept when something reads it: the
        # engine.acceptance_estimate=draft_max_prob table (block slot x probability bin) of acceptance estimates the
        # host calibrates online (set_estimate_table), a head calibration that weighs it (sts_max_prob), a step trace.
        self.estimate = acceptance_estimate
        # engine.online_calibration: a logit offset per block slot added to the head's calibrated confidence, refitted
        # on the host from observed acceptance (set_confidence_offsets); None: the drafter's calibration alone.
        self.confidence_offsets = torch.zeros(G1, dtype=torch.float32, device=dev) if confidence_offsets else None
        self.max_prob = torch.zeros((S, G1), dtype=torch.float32, device=dev)
        # The gap between the drafter's two largest logits per slot (top_gap), kept for a head calibration that
        # weighs it (sts_top_gap): on the Triton backend the greedy argmax's own pass writes it, and for sampled
        # rows the fused draw's first pass (kernels/draft_sampling.py).
        self.top_gap = torch.zeros((S, G1), dtype=torch.float32, device=dev)
        self.trace_max_prob = False  # Engine.start_step_trace: keep max_prob for the trace (eager steps only)
        # Whether the draft stage runs the drafter's confidence head and writes survival (runs_confidence_head):
        # an engine that plans reads it; a verify-all engine reads none of it and passes False (a step trace
        # records it all the same).
        self.confidence = confidence
        # Device-resident steps whose draft graph has fewer rows than this skip the head: the engine plans no step
        # of fewer requests (engine.plan_min_rows), so nothing would read their survival. Host-driven steps
        # (draft_rows) always run it; a step trace keeps it on every step.
        self.confidence_min_rows = int(confidence_min_rows)
        # Whether a launched step copies the head's survival back to the host (Launched.survival): the engine turns
        # it off where no host work reads it (a measured or forced share decided without the planner), and the
        # device's own allocation reads it in place.
        self.read_survival = True
        self.head_steps = 0  # launched and host-driven steps whose draft stage ran the head (counters)
        self.greedy_head_steps = 0  # of those, the steps whose survival came from greedy_drafter's calibration
        centres = (torch.arange(estimate_bins, dtype=torch.float32) + 0.5) / estimate_bins
        self.estimate_table = centres.repeat(G1, 1).to(dev)
        self.windows_in = torch.zeros(S, dtype=torch.int64, device=dev)  # explicit/cap_accept: the host's windows
        self.uncapped = torch.zeros(S, dtype=torch.int64, device=dev)  # cap_accept: acceptance over the whole block
        self.last_indptr: torch.Tensor | None = None  # the last host-driven verify step's packed rows (debug checks)
        self.tier = torch.zeros(1, dtype=torch.int64, device=dev)  # uniform: this step's verify length
        self.extra = torch.zeros(1, dtype=torch.int64, device=dev)  # ragged: cells past min_verify_len
        self.min_verify_len = int(min_verify_len)
        self.draft_free_steps = bool(draft_free_steps) and self.G > 0  # capture draft-free verify graphs too
        self.window_impl = window_impl
        # The verify stage's token packing / attention metadata and the state commit: the torch
        # reference ops, or one Triton kernel each (kernels/verify_packing.py).
        if metadata_impl not in ("torch", "triton"):
            raise ValueError(f"metadata_impl must be 'torch' or 'triton', got {metadata_impl!r}")
        if metadata_impl == "triton":
            from kernels.verify_packing import triton_runnable

            triton_runnable(self.device)
        self.metadata_impl = metadata_impl
        self.batch_buckets = tuple(b // self.M for b in self.buckets)
        # Token buckets of confidence-scheduled verify steps: fine enough that padding stays small.
        top = self.M * S
        ladder = set(token_buckets or ())
        if not ladder:
            t = 8
            while t < 128:
                ladder.add(t)
                t *= 2
            ladder.update(range(128, top + 128, 128))
            ladder.update(self.buckets)
        self.token_buckets = tuple(sorted(ladder))
        self.indptr_M = (torch.arange(S + 1, device=dev) * self.M).to(torch.int32)
        self.indptr_G = (torch.arange(S + 1, device=dev) * max(self.G, 1)).to(torch.int32)
        self.req_ids: tuple[int, ...] = ()
        self.rows: list = []  # the Request of each device row, in row order (rows [:len(rows)] are active)
        self._sampling_counts = [0, 0, 0]  # rows sampled (temperature > 0), of them with top-k, with top-p
        # Prefill chunks: one forward over packed chunks, keyed by (token bucket, segment bucket).
        self.prefill_buckets = _doubling_ladder(16, max(16, int(max_prefill_tokens)))
        self.max_prefill_segments = int(max_prefill_segments)
        self.prefill_segment_buckets = _doubling_ladder(1, self.max_prefill_segments)
        Tp, Pp = self.prefill_buckets[-1], self.max_prefill_segments
        self.pf_ids = torch.zeros(Tp, dtype=torch.int64, device=dev)
        self.pf_pos = torch.zeros(Tp, dtype=torch.int64, device=dev)
        self.pf_slots = torch.full((Tp,), -1, dtype=torch.int64, device=dev)
        self.pf_indptr = torch.zeros(Pp + 1, dtype=torch.int32, device=dev)
        self.pf_kv_lens = torch.zeros(Pp, dtype=torch.int32, device=dev)
        self.pf_tables = torch.zeros((Pp, max_pages), dtype=torch.int32, device=dev)
        self.graphs: dict[tuple, object] = {}  # ("step"|"draft"|"verify", size[, mode], sampling) -> graph
        self.timing: list | None = None  # (mode, [(key, start event, end event)], batch rows) per step when timing
        self._step_events: list = []
        self.pool = None
        # engine.prefill_stream: captured prefill forwards run on their own CUDA stream (and graph memory pool),
        # beside the decode step on the current stream. The decode step and a prefill are each a chain of
        # small kernels that leaves most of the GPU idle, so the two overlap. Ordering: a prefill waits for
        # the work queued before it (pages it reuses may still be written by the step in flight), and the
        # current stream waits for it (wait_prefill) before its requests join the rows.
        self.prefill_stream = torch.cuda.Stream(self.device) if self.use_graphs and prefill_stream else None
        # The prefill graphs are captured on a stream of their own because cuBLAS keys its workspace by stream
        # (the decode graphs use the workspace of torch's default capture stream): captured on the same stream,
        # a prefill and the decode step beside it would share one workspace. torch hands out streams round-robin
        # from a pool of 32 per priority, so a stream of the default priority can be the very one torch
        # captures the decode graphs on; the other priority's pool never is.
        self._prefill_capture_stream = (torch.cuda.Stream(self.device, priority=-1) if self.prefill_stream is not None
                                        else None)
        self.prefill_pool = None
        self._prefill_pending = False
        self.prefill_side_replays = 0  # prefill forwards replayed on the prefill stream
        self.captures = 0
        self.megakernel_replays = 0  # replays of graphs whose target step is the decode megakernel
        self.capture_megakernel_calls = 0  # megakernel forward calls made by captures (warm-up + capture)

    # ---- host -> device ---------------------------------------------------------------------
    def bucket_for(self, num_requests: int) -> int | None:
        """The full-step bucket of ``num_requests`` rows (None above the largest)."""
        return _first_at_least(self.buckets, num_requests * self.M)

    def token_bucket_for(self, num_tokens: int) -> int | None:
        return _first_at_least(self.token_buckets, num_tokens)

    def load(self, requests) -> None:
        """Upload every row's state from the host (exact: no step of theirs is in flight)."""
        self.wait_prefill()
        self.clear()
        self.join(requests)

    def wait_prefill(self) -> None:
        """Order every prefill issued so far before the current stream's next work (no host wait)."""
        if self._prefill_pending:
            torch.cuda.current_stream(self.device).wait_stream(self.prefill_stream)
            self._prefill_pending = False

    def clear(self) -> None:
        """No rows: every row inactive (the device keeps its buffers)."""
        self.active.zero_()
        self.rows = []
        self.req_ids = ()
        self._sampling_counts = [0, 0, 0]

    def join(self, requests) -> None:
        """Append ``requests`` as rows ``len(rows)..``: their state from the host, which is exact for a
        request that has not decoded on the device yet (just prefilled) or after a drain. The rows
        already there are untouched, so a step in flight is not disturbed: the uploads are queued
        behind it on the stream and take effect from the next launch."""
        if not requests:
            return
        start, n = len(self.rows), len(requests)
        if start + n > self.S:
            raise ValueError(f"{start + n} rows exceed the decoder's {self.S}")
        width = self.tables.shape[1]
        tables = torch.zeros((n, width), dtype=torch.int32)
        for i, r in enumerate(requests):
            t = self.runner.blocks.table(r.req_id)
            tables[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        # One contiguous row per field, so that each upload is one plain pinned copy.
        state = torch.tensor([[r.num_tokens for r in requests], [r.anchor for r in requests],
                              [r.seed for r in requests], [r.params.top_k for r in requests]], dtype=torch.int64)
        floats = torch.tensor([[r.params.temperature for r in requests], [r.params.top_p for r in requests]],
                              dtype=torch.float32)
        pin = self.device.type == "cuda"
        if pin:
            state, tables, floats = state.pin_memory(), tables.pin_memory(), floats.pin_memory()
        rows = slice(start, start + n)
        self.seq_len[rows].copy_(state[0], non_blocking=pin)
        self.anchor[rows].copy_(state[1], non_blocking=pin)
        self.seed[rows].copy_(state[2], non_blocking=pin)
        self.top_k[rows].copy_(state[3], non_blocking=pin)
        self.temperature[rows].copy_(floats[0], non_blocking=pin)
        self.top_p[rows].copy_(floats[1], non_blocking=pin)
        self.tables[rows].copy_(tables, non_blocking=pin)
        self.active[rows] = True
        self.rows.extend(requests)
        self._count_sampling(requests, +1)
        self._rows_changed()

    def retire(self, gone: set[int]) -> None:
        """Drop the rows of the requests in ``gone`` (request ids): the last live rows move into
        the holes on the device (queued behind any step in flight), so rows [:len(rows)] stay
        dense and a step's bucket follows the live count."""
        rows = list(self.rows)
        n = len(rows)
        if not any(r.req_id in gone for r in rows):
            return
        src, dst = [], []
        i = 0
        while i < n:
            if rows[i].req_id in gone:
                n -= 1
                while n > i and rows[n].req_id in gone:
                    n -= 1
                if n > i:
                    rows[i] = rows[n]
                    src.append(n)
                    dst.append(i)
            i += 1
        old = len(self.rows)
        self._count_sampling([r for r in self.rows if r.req_id in gone], -1)
        if src:
            idx = torch.tensor([src, dst], dtype=torch.int64)
            pin = self.device.type == "cuda"
            idx = idx.pin_memory().to(self.device, non_blocking=True) if pin else idx
            s_idx, d_idx = idx[0], idx[1]
            for buf in (self.seq_len, self.anchor, self.seed, self.active, self.tables, self.temperature,
                        self.top_k, self.top_p):
                buf.index_copy_(0, d_idx, buf.index_select(0, s_idx))
        self.active[n:old] = False
        self.rows = rows[:n]
        self._rows_changed()

    def _count_sampling(self, requests, sign: int) -> None:
        counts = self._sampling_counts
        for r in requests:
            p = r.params
            if p.temperature > 0:
                counts[0] += sign
                counts[1] += sign * (p.top_k > 0)
                counts[2] += sign * (p.top_p < 1.0)

    def _rows_changed(self) -> None:
        """The rows' ids and sampling signature (as dspark.sampling.RowSampling decides it), kept by counts."""
        self.req_ids = tuple(r.req_id for r in self.rows)
        if self.rows:
            sampled, top_k, top_p = self._sampling_counts
            self.set_sampling((sampled == 0, top_k > 0, top_p > 0))

    def set_sampling(self, signature: tuple[bool, bool, bool]) -> None:
        """The batch's sampling signature (all greedy, top-k in use, top-p in use): part of every graph key."""
        self.sampling = tuple(bool(x) for x in signature)
        if not self.sampling[0] and self.G and self.draft_probs is None:
            V = self.target.cfg.vocab_size
            self.draft_probs = torch.zeros((self.S, self.G, V), dtype=torch.float32, device=self.device)

    # ---- prefill chunks -------------------------------------------------------------------------
    def prefill_fits(self, num_tokens: int, num_segments: int) -> bool:
        return num_tokens <= self.prefill_buckets[-1] and num_segments <= self.max_prefill_segments

    def prefill(self, segments, overlap: bool = False) -> int:
        """Run prefill chunks (``dspark.model_runner.Segment``s: positions start.. of a request) as one
        target forward that writes their K/V and the drafter's context K/V, no token sampled; replayed
        from a graph keyed by (token bucket, segment bucket). Returns the token bucket. With ``overlap``
        and a prefill stream the forward runs on that stream: call :meth:`wait_prefill` before anything
        on the current stream reads what it writes."""
        n_tok = sum(len(s.tokens) for s in segments)
        n_seg = len(segments)
        if not self.prefill_fits(n_tok, n_seg):
            raise ValueError(f"prefill of {n_tok} tokens in {n_seg} chunks exceeds the largest prefill graph "
                             f"({self.prefill_buckets[-1]} tokens, {self.max_prefill_segments} chunks)")
        T = _first_at_least(self.prefill_buckets, n_tok)
        P = _first_at_least(self.prefill_segment_buckets, n_seg)
        import numpy as np

        page = self.page
        width = self.tables.shape[1]
        ids = np.zeros(T, dtype=np.int64)
        pos = np.zeros(T, dtype=np.int64)
        slots = np.full(T, -1, dtype=np.int64)
        small = np.zeros(2 * P + 1 + P * width, dtype=np.int32)  # indptr [P+1], kv_lens [P], tables [P, width]
        indptr, kv_lens, tables = small[: P + 1], small[P + 1: 2 * P + 1], small[2 * P + 1:].reshape(P, width)
        at = 0
        for i, s in enumerate(segments):
            n = len(s.tokens)
            table = np.asarray(self.runner.blocks.table(s.req.req_id), dtype=np.int64)
            p = np.arange(s.start, s.start + n, dtype=np.int64)
            ids[at: at + n] = s.tokens
            pos[at: at + n] = p
            slots[at: at + n] = table[p // page] * page + p % page
            tables[i, : len(table)] = table
            at += n
            indptr[i + 1] = at
            kv_lens[i] = s.start + n
        indptr[n_seg + 1:] = at  # empty segments past the real ones
        big = torch.from_numpy(np.concatenate([ids, pos, slots]))
        small_t = torch.from_numpy(small)
        pin = self.device.type == "cuda"
        if pin:
            big, small_t = big.pin_memory(), small_t.pin_memory()
        side = self.prefill_stream if overlap else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            self.pf_ids[:T].copy_(big[:T], non_blocking=pin)
            self.pf_pos[:T].copy_(big[T: 2 * T], non_blocking=pin)
            self.pf_slots[:T].copy_(big[2 * T:], non_blocking=pin)
            self.pf_indptr[: P + 1].copy_(small_t[: P + 1], non_blocking=pin)
            self.pf_kv_lens[:P].copy_(small_t[P + 1: 2 * P + 1], non_blocking=pin)
            self.pf_tables[:P].copy_(small_t[2 * P + 1:].view(P, width), non_blocking=pin)
            self._run(("prefill", T, P), lambda: self._prefill_stage(T, P))
            self._close_step_timing("prefill")
        if side is not None:
            self._prefill_pending = True
            self.prefill_side_replays += 1
        return T

    def _prefill_stage(self, T: int, P: int) -> None:
        # Its own split-K counters: with a prefill stream this forward runs beside a decode step whose
        # small-M GEMVs would otherwise share them (kernels.small_m_linear.split_k_lane).
        from kernels.small_m_linear import split_k_lane

        with split_k_lane("prefill"):
            self._prefill_forward(T, P)

    def _prefill_forward(self, T: int, P: int) -> None:
        meta = AttentionMetadata(qo_indptr=self.pf_indptr[: P + 1], kv_lens=self.pf_kv_lens[:P],
                                 block_tables=self.pf_tables[:P], slot_mapping=self.pf_slots[:T], causal=True,
                                 max_q_len=T, trash_slot=self.trash_slot, kernels=self.kernels)
        hidden, captured = self.target(self.pf_ids[:T], self.pf_pos[:T], self.runner.cache, meta,
                                       self.runner.capture_layers)
        if self.G:
            self.drafter.context_kv(captured, self.pf_pos[:T], self.runner.draft_cache, meta)

    # ---- the step (capturable: no host reads, no allocation from host data) -------------------
    def _rows(self, R: int):
        from dspark.sampling import RowSampling

        all_greedy, needs_k, needs_p = self.sampling
        return RowSampling.from_tensors(self.temperature[:R], self.top_k[:R], self.top_p[:R], all_greedy=all_greedy,
                                        needs_k=needs_k, needs_p=needs_p)

    def _uniforms(self, R: int) -> torch.Tensor:
        """[R, 2G+1] this step's uniforms (draft slots, acceptance tests, resample) per row."""
        from dspark.uniforms import step_uniforms

        anchor_pos = torch.where(self.active[:R], self.seq_len[:R] - 1, 0)
        return step_uniforms(self.seed[:R], anchor_pos, self.G)

    def runs_confidence_head(self, rows: int | None = None) -> bool:
        """Whether the draft stage runs the drafter's confidence head and writes self.survival (and the raw
        self.confidence_logits): with a head, on the head's estimate (not draft_max_prob), for an engine that
        reads survival (``confidence``) or a step trace; on a device-resident step of ``rows`` draft rows, only
        from ``confidence_min_rows`` rows up (None: a host-driven step, or whether any step runs it)."""
        return (self.drafter is not None and self.drafter.confidence_head is not None and self.estimate == "head"
                and (self.confidence or self.trace_max_prob)
                and (rows is None or self.trace_max_prob or rows >= self.confidence_min_rows))

    def _fused_confidence(self) -> bool:
        """Whether the head, its calibration and the survival run as kernels/confidence_survival.py's one kernel:
        ``engine.kernels.fused_confidence`` on the Triton backend on CUDA, for a head with a bias (any calibration:
        sts, sts_bias, sts_max_prob with the slots' top probabilities, sts_top_gap with their top-2 gaps)."""
        from kernels.switches import cuda_switch_on

        head = self.drafter.confidence_head
        return cuda_switch_on(self.kernels, "fused_confidence", self.device) and head.bias is not None

    def calibrated_drafter(self):
        """The drafter whose confidence calibration this step's survival reads: ``greedy_drafter`` where one is set
        and the loaded rows all decode greedily, else the drafter. Decided by Python state (the sampling mode), which
        keys the captured graphs, so each captured draft stage replays its own mode's calibration."""
        return self.greedy_drafter if self.greedy_drafter is not None and self.sampling[0] else self.drafter

    def _count_head_step(self, head: bool) -> None:
        """Count a draft stage for the counters: whether it ran the head, and whether that head's survival came from
        greedy_drafter's calibration."""
        self.head_steps += head
        self.greedy_head_steps += head and self.calibrated_drafter() is self.greedy_drafter

    def keeps_max_prob(self, rows: int | None = None) -> bool:
        """Whether the draft stage writes each slot's top-token probability into self.max_prob: for the
        draft_max_prob estimate, for a confidence calibration that weighs it (the drafter's
        ``confidence_uses_max_prob``: sts_max_prob) where the head runs (``rows`` as :meth:`runs_confidence_head`
        takes it), and for a step trace."""
        head_weighs_it = self.runs_confidence_head(rows) and self.calibrated_drafter().confidence_uses_max_prob
        return self.estimate == "draft_max_prob" or head_weighs_it or self.trace_max_prob

    def keeps_top_gap(self, rows: int | None = None) -> bool:
        """Whether the draft stage writes the gap between each slot's two largest logits into self.top_gap: for a
        confidence calibration that weighs it (the drafter's ``confidence_uses_top_gap``: sts_top_gap) where the
        head runs (``rows`` as :meth:`runs_confidence_head` takes it: a device-resident stage below
        confidence_min_rows rows skips the head, and the gaps with it)."""
        return self.runs_confidence_head(rows) and self.calibrated_drafter().confidence_uses_top_gap

    def _draft_stage(self, R: int, host_driven: bool = False) -> None:
        """Draft a block for rows [:R]; writes self.drafts, self.draft_probs (sampled rows), self.max_prob (when
        :meth:`keeps_max_prob`: :func:`dspark.sampling.top_probability` of each slot's logits, greedy and sampled
        rows alike, written slot by slot), self.top_gap (when :meth:`keeps_top_gap`: :func:`dspark.sampling.top_gap`
        of each slot's logits, on the Triton backend in the greedy argmax's pass or the fused draw's) and, where
        :meth:`runs_confidence_head`, self.survival and the raw self.confidence_logits (one kernel on CUDA:
        :meth:`_fused_confidence`). No host sync: what it computes is decided by Python state (the estimate, the
        drafter's calibration method, the row count), so a captured draft graph replays it. A device-resident stage
        (not ``host_driven``) runs the head only from confidence_min_rows rows up."""
        G = self.G
        n, act, tables, anchor = self.seq_len[:R], self.active[:R], self.tables[:R], self.anchor[:R]
        block = self._draft_rows(act, n, tables)
        meta_d = AttentionMetadata(qo_indptr=self.indptr_G[: R + 1], kv_lens=block.kv_lens, block_tables=tables,
                                   slot_mapping=block.slot_mapping, causal=False, max_q_len=G,
                                   trash_slot=self.trash_slot, kernels=self.kernels)
        hidden = self.drafter.forward_block(anchor, None, self.runner.draft_cache, meta_d, self.target.embed,
                                            positions=block.positions)
        by_max_prob = self.estimate == "draft_max_prob"
        head = self.runs_confidence_head(None if host_driven else R)
        fused_head = head and self._fused_confidence()  # the head after the draw, in one kernel (below)
        # the scores a calibration weighs are computed only where this stage runs the head
        keep_top = self.keeps_max_prob(None if host_driven else R)
        keep_gap = self.keeps_top_gap(None if host_driven else R)
        from dspark.sampling import top_gap, top_probability

        if self.sampling[0]:
            from dspark.sampling import greedy_argmax

            def sample_fn(logits: torch.Tensor, k: int) -> torch.Tensor:
                # with keep_top the drafter's top-token probability goes into slot k's column, with keep_gap the
                # gap between its two largest logits (on the Triton backend in the argmax's own pass over the logits)
                return greedy_argmax(logits, self.kernels, top_out=self.max_prob[:R, k] if keep_top else None,
                                     gap_out=self.top_gap[:R, k] if keep_gap else None)

            out = self.drafter.draft(hidden, anchor, self.target.lm_head_weight, sample_fn, keep_logits=False,
                                     confidence=head and not fused_head, kernels=self.kernels)
        else:
            from dspark.sampling import fused_draft_sampling_enabled, sample_rows

            rows, uni = self._rows(R), self._uniforms(R)
            # Rows with a temperature alone: softmax and draw in one kernel (kernels/draft_sampling.py).
            fused = fused_draft_sampling_enabled(self.kernels, self.device) and not any(self.sampling[1:])

            def sample_fn(logits: torch.Tensor, k: int) -> torch.Tensor:
                if keep_top:
                    top_probability(logits, self.kernels, out=self.max_prob[:R, k])
                if keep_gap and not fused:  # the fused draw keeps the gap in its own first pass
                    top_gap(logits, self.kernels, out=self.top_gap[:R, k])
                if fused:
                    from kernels.draft_sampling import sample_slot_triton

                    return sample_slot_triton(logits, self.temperature[:R], uni[:, k].contiguous(),
                                              probs_out=self.draft_probs[:R, k],
                                              gap_out=self.top_gap[:R, k] if keep_gap else None)[0]
                tokens, p = sample_rows(logits, rows, uni[:, k])
                self.draft_probs[:R, k].copy_(p)  # slot by slot: no stacked [R, G, V] copy of the block
                return tokens

            out = self.drafter.draft(hidden, anchor, self.target.lm_head_weight, sample_fn, keep_logits=False,
                                     confidence=head and not fused_head, kernels=self.kernels)
        self.drafts[:R].copy_(out.tokens)
        if by_max_prob:
            from dspark.acceptance_estimate import estimated_confidence
            from dspark.survival import prefix_survival

            surv = prefix_survival(estimated_confidence(self.max_prob[:R], self.estimate_table))
            self.survival[:R].copy_(torch.where(act[:, None], surv, 0.0))
        elif fused_head:
            from kernels.confidence_survival import BlockConfidence, confidence_survival_triton

            d = self.calibrated_drafter()  # the weights are shared: only the calibration may differ
            confidence_survival_triton(
                hidden=hidden, anchor=anchor, tokens=self.drafts[:R, :G],
                embedding=d.markov_head.w1.weight if d.markov_head is not None else None,
                head_weight=d.confidence_head.weight, head_bias=d.confidence_head.bias,
                temperatures=d.confidence_temperatures, biases=d.confidence_biases, offsets=self.confidence_offsets,
                active=act, out=BlockConfidence(self.confidence_logits[:R], self.survival[:R]),
                # sts_max_prob: the slots' top probabilities, kept above (keeps_max_prob)
                max_prob=self.max_prob[:R] if d.confidence_uses_max_prob else None,
                max_prob_weights=d.confidence_max_prob_weights if d.confidence_uses_max_prob else None,
                # sts_top_gap: the slots' top-2 gaps, kept above (keeps_top_gap)
                top_gap=self.top_gap[:R] if d.confidence_uses_top_gap else None,
                top_gap_weights=d.confidence_top_gap_weights if d.confidence_uses_top_gap else None)
        elif out.confidence_logits is not None:
            from dspark.survival import prefix_survival

            self.confidence_logits[:R].copy_(out.confidence_logits.float())
            # an sts_max_prob calibration weighs the top probabilities, an sts_top_gap one the top-2 gaps (kept
            # above); the drafter raises without them
            conf = self.calibrated_drafter().calibrated_confidence(out.confidence_logits.float(),
                                                      self.max_prob[:R] if keep_top else None, self.confidence_offsets,
                                                      self.top_gap[:R] if keep_gap else None)
            surv = prefix_survival(conf)
            self.survival[:R].copy_(torch.where(act[:, None], surv, 0.0))

    def _window_source(self, R: int, mode: str) -> tuple[int | torch.Tensor, int]:
        """This step's verify lengths for rows [:R] before padding rows are zeroed, as (one int for
        every row, 0) or (a tensor [R], an offset to add to it): the fused packing kernel reads
        them as they are, the torch path materialises them (:meth:`_windows`)."""
        G = self.G
        if mode == "draft_free":  # no drafts: every row verifies none and commits the target's token
            return 0, 0
        if mode in ("full", "cap_accept") or G == 0:  # cap_accept verifies the whole block
            return G, 0
        if mode == "explicit":
            return self.windows_in[:R], 0
        if mode == "uniform":
            return self.tier.expand(R), 0
        # ragged: min_len per row, then the top-`extra` cells past it by fresh survival
        from kernels.window_allocation import allocate_windows

        m = self.min_verify_len
        if m >= G:
            return G, 0
        return allocate_windows(survival=self.survival[:R, m:], budget=self.extra[0], min_verify_len=0,
                                block=G - m, active=self.active[:R], impl=self.window_impl), m

    def _windows(self, R: int, mode: str) -> torch.Tensor:
        """Verify length per row [:R] (int64, 0 for padding rows) for this step's decision."""
        src, offset = self._window_source(R, mode)
        if isinstance(src, int):
            w = torch.full((R,), src + offset, dtype=torch.int64, device=self.device)
        else:
            w = offset + src.long() if offset else src.long()
        return torch.where(self.active[:R], w, 0)

    def _verify_stage(self, T: int, R: int, mode: str) -> None:
        """Target forward over T packed tokens ([anchor, d_1..d_w] per row), acceptance, state update."""
        G, M = self.G, self.M
        n, act, tables, anchor = self.seq_len[:R], self.active[:R], self.tables[:R], self.anchor[:R]
        # Pack the rows on the token axis and build the attention metadata (kernels/verify_packing.py).
        # Memory safety: the packed rows never reach past the bucket's T token rows, whatever the
        # windows say. On replays the host sizes the bucket from the same budget, so nothing is
        # cut; a capture's warm-up run, though, sees whatever tier/extra the last step left.
        rows_in = dict(active=act, seq_len=n, anchor=anchor, drafts=self.drafts[:R, :G], tables=tables, num_tokens=T,
                       page_size=self.page)
        packed = self._pack_rows(R, mode, rows_in)
        w, ids, pos, rows_at = packed.windows, packed.ids, packed.pos, packed.rows_at  # rows_at [R, M]
        meta = AttentionMetadata(qo_indptr=packed.indptr, kv_lens=packed.kv_lens, block_tables=tables,
                                 slot_mapping=packed.slot_mapping, causal=True, max_q_len=M,
                                 trash_slot=self.trash_slot, kernels=self.kernels)
        hidden, captured = self.target(ids, pos, self.runner.cache, meta, self.runner.capture_layers)
        if G:
            self.drafter.context_kv(captured, pos, self.runner.draft_cache, meta)
        logits = self.target.compute_logits(hidden, kernels=self.kernels)  # [T, V]
        if mode == "cap_accept":  # acceptance capped at the host's windows; the whole block's kept for the oracle
            self.last_indptr = packed.indptr[: R + 1]
            w_full, w = w, torch.where(act, self.windows_in[:R], 0)
        elif mode == "explicit":
            self.last_indptr = packed.indptr[: R + 1]
        if not self.sampling[0]:
            rows_logits = logits[rows_at.reshape(-1)].view(R, M, -1)
            k, nxt = self._accept_sampled(rows_logits, w, R)
            if mode == "cap_accept":
                self.uncapped[:R].copy_(self._accept_sampled(rows_logits, w_full, R)[0])
            self._commit_state(R, k, nxt, anchor, act, w)
            return
        from dspark.sampling import greedy_argmax

        tokens = greedy_argmax(logits, self.kernels)
        if self.metadata_impl == "triton" and mode != "cap_accept":  # acceptance and commit in one launch
            from kernels.verify_packing import accept_commit_greedy_triton

            accept_commit_greedy_triton(tokens=tokens, rows_at=rows_at, windows=w, active=act,
                                        drafts=self.drafts[:R, :G], anchor=anchor, seq_len=self.seq_len[:R],
                                        out=self.out[:R])
            return
        target_tok = tokens[rows_at]  # [R, M]
        k, nxt = self._accept_greedy(self.drafts[:R, :G], target_tok, w)
        if mode == "cap_accept":
            self.uncapped[:R].copy_(self._accept_greedy(self.drafts[:R, :G], target_tok, w_full)[0])
        self._commit_state(R, k, nxt, anchor, act, w)

    def _draft_rows(self, act: torch.Tensor, n: torch.Tensor, tables: torch.Tensor):
        """The draft block's positions, KV lengths and cache slots per row (kernels/verify_packing.py)."""
        from kernels.verify_packing import draft_rows_reference, draft_rows_triton

        rows = draft_rows_triton if self.metadata_impl == "triton" else draft_rows_reference
        return rows(active=act, seq_len=n, tables=tables, block=self.G, page_size=self.page)

    def _pack_rows(self, R: int, mode: str, rows_in: dict):
        """The verify step's packed rows and metadata (kernels/verify_packing.py)."""
        if self.metadata_impl == "triton":
            from kernels.verify_packing import pack_verify_rows_triton

            src, offset = self._window_source(R, mode)
            return pack_verify_rows_triton(windows=src, window_offset=offset, **rows_in)
        from kernels.verify_packing import pack_verify_rows_reference

        return pack_verify_rows_reference(windows=self._windows(R, mode), **rows_in)

    def _accept_greedy(self, drafts: torch.Tensor, target_tok: torch.Tensor, windows: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy acceptance (dspark.verification.accept_greedy, the eager path's rule)."""
        return accept_greedy(drafts, target_tok, windows)

    def _accept_sampled(self, logits: torch.Tensor, w: torch.Tensor, R: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Lossless acceptance (dspark.verification.accept_sampled, the eager path's rule) over logits
        [R, M, V] -> (accepted int64 [R], next [R])."""
        G = self.G
        uni = self._uniforms(R)
        return accept_sampled(logits, self._rows(R), self.drafts[:R] if G else None,
                              self.draft_probs[:R] if G else None, w, uni[:, G:2 * G].contiguous(),
                              uni[:, 2 * G].contiguous(), impl="triton" if self.device.type == "cuda" else "torch")

    def _commit_state(self, R: int, k: torch.Tensor, nxt: torch.Tensor, anchor: torch.Tensor, act: torch.Tensor,
                      w: torch.Tensor) -> None:
        """Write this step's outputs (accepted, window, tokens) and advance the rows' state
        (``anchor`` is ``self.anchor[:R]``, updated in place)."""
        from kernels.verify_packing import commit_state_reference, commit_state_triton

        commit = commit_state_triton if self.metadata_impl == "triton" else commit_state_reference
        commit(accepted=k, next_token=nxt, windows=w, active=act, drafts=self.drafts[:R, :self.G], anchor=anchor,
               seq_len=self.seq_len[:R], out=self.out[:R])

    def _step(self, R: int) -> None:
        """verify=full (and target-only): draft and verify in one captured step of R*(G+1) tokens."""
        if self.G:
            self._draft_stage(R)
        self._verify_stage(R * self.M, R, "full")

    # ---- launch / collect -----------------------------------------------------------------------
    def launch(self, num_requests: int, mode: str = "full", tier: int | None = None, extra: int | None = None
               ) -> Launched:
        """Run one step for rows [:num_requests]: mode full, uniform (``tier``) / ragged (``extra`` cells past
        min_verify_len per the fresh survival ranking), or draft_free (the verify stage alone, no drafts)."""
        start = time.perf_counter()
        B = num_requests
        pin = self.device.type == "cuda"
        if mode == "full":
            bucket = self.bucket_for(B)
            if bucket is None:
                raise ValueError(f"{B} requests x {self.M} tokens exceed the largest bucket {self.buckets[-1]}")
            num_tokens = B * self.M
            r_draft = bucket // self.M
            self._run(("step", bucket, self.sampling), lambda: self._step(r_draft))
        else:
            if mode == "draft_free":
                num_tokens = B
            elif mode == "uniform":
                num_tokens = B * (int(tier) + 1)
                value, target_buf = int(tier), self.tier
            else:
                num_tokens = B * (self.min_verify_len + 1) + int(extra)
                value, target_buf = int(extra), self.extra
            bucket = self.token_bucket_for(num_tokens)
            if bucket is None:
                raise ValueError(f"{num_tokens} tokens exceed the largest token bucket {self.token_buckets[-1]}")
            r_verify = min(bucket, self.S)
            r_draft = _first_at_least(self.batch_buckets, B)
            if mode != "draft_free":
                target_buf.fill_(value)  # a fill kernel on the step's stream: no host tensor, pinned copy or sync
                self._run(("draft", r_draft, self.sampling), lambda: self._draft_stage(r_draft))
            self._run(("verify", bucket, mode, self.sampling), lambda: self._verify_stage(bucket, r_verify, mode))
        self._close_step_timing(mode, _first_at_least(self.batch_buckets, B) or B)
        host = torch.empty((B, 2 + self.M), dtype=torch.int64, pin_memory=pin)
        host.copy_(self.out[:B], non_blocking=pin)
        surv = top = None
        drafted = self.G and mode != "draft_free"  # a draft-free step leaves no survival of its own
        head = drafted and self.runs_confidence_head(r_draft)
        self._count_head_step(bool(head))
        if (head and self.read_survival) or (drafted and self.estimate == "draft_max_prob"):
            surv = torch.empty((B, self.G), dtype=torch.float32, pin_memory=pin)
            surv.copy_(self.survival[:B], non_blocking=pin)
        if drafted and self.estimate == "draft_max_prob":
            top = torch.empty((B, self.G), dtype=torch.float32, pin_memory=pin)
            top.copy_(self.max_prob[:B], non_blocking=pin)
        event = None
        if pin:
            event = torch.cuda.Event()
            event.record()
        return Launched(self.req_ids[:B], host, surv, event, bucket, num_tokens, (time.perf_counter() - start) * 1e3,
                        max_prob=top, draft_free=mode == "draft_free")

    def draft_rows(self, num_rows: int) -> None:
        """The draft stage over rows [:num_rows], uncaptured (a host-driven step: the host plans on this
        step's survival before it verifies)."""
        if self.G:
            self._draft_stage(num_rows, host_driven=True)
            self._count_head_step(self.runs_confidence_head())

    def verify_rows(self, windows: list[int], num_tokens: int, cap_accept: bool = False
                    ) -> list[tuple[int, int, list[int]]]:
        """The verify stage over rows [:len(windows)] with the host's windows, uncaptured: ``num_tokens``
        packed token rows (the step's tokens, or a bucket above them); with ``cap_accept`` the whole block
        is verified and acceptance capped at ``windows`` (``uncapped`` holds the whole block's). Returns
        (accepted count, window, committed tokens) per row, as :meth:`collect` does."""
        R = len(windows)
        if R > self.S:
            raise ValueError(f"{R} rows exceed the decoder's {self.S}")
        src = torch.tensor(windows, dtype=torch.int64)
        self.windows_in[:R].copy_(src.to(self.device))
        self._verify_stage(int(num_tokens), R, "cap_accept" if cap_accept else "explicit")
        return _committed_rows(self.out[:R].tolist())

    def ensure_captured(self, num_requests: int, mode: str, tiers: tuple[int, ...] | None = None) -> None:
        """Capture, up front, every graph a steady batch of ``num_requests`` rows can replay, so
        that steady steps never stop to capture (capture synchronises the device). The engine calls
        this once per full-step bucket, so it covers every row count of that bucket, not only this one."""
        if not self.use_graphs:
            return
        B = num_requests
        full = self.bucket_for(B)
        if full is not None and ("step", full, self.sampling) not in self.graphs:
            self.graphs[("step", full, self.sampling)] = self._capture(lambda: self._step(full // self.M))
        # The row counts that share B's full-step bucket (the engine's key for "captured already").
        hi_rows = full // self.M if full is not None else B
        lo_rows = min(B, 1 + max((b // self.M for b in self.buckets if full is not None and b < full), default=0))
        counts = range(lo_rows, hi_rows + 1)
        if self.draft_free_steps:
            for free in sorted({t for t in map(self.token_bucket_for, counts) if t is not None}):
                if ("verify", free, "draft_free", self.sampling) not in self.graphs:
                    R = min(free, self.S)
                    self.graphs[("verify", free, "draft_free", self.sampling)] = self._capture(
                        lambda free=free, R=R: self._verify_stage(free, R, "draft_free"))
        if mode == "full" or not self.G:
            return
        for r_draft in sorted({r for r in (_first_at_least(self.batch_buckets, n) for n in counts) if r is not None}):
            if ("draft", r_draft, self.sampling) not in self.graphs:
                self.graphs[("draft", r_draft, self.sampling)] = self._capture(lambda r=r_draft: self._draft_stage(r))
        if mode == "uniform":
            lens = tiers if tiers is not None else range(self.min_verify_len, self.G)
            buckets = {self.token_bucket_for(n * (v + 1)) for v in lens if v < self.G for n in counts}
        else:  # ragged: any token count from min_verify_len per row to the whole block
            lo = self.token_bucket_for(lo_rows * (self.min_verify_len + 1))
            hi = self.token_bucket_for(hi_rows * self.M)
            buckets = {t for t in self.token_buckets if lo is not None and lo <= t <= (hi or self.token_buckets[-1])}
        for T in sorted(b for b in buckets if b is not None):
            if ("verify", T, mode, self.sampling) not in self.graphs:
                R = min(T, self.S)
                self.graphs[("verify", T, mode, self.sampling)] = self._capture(lambda T=T, R=R: self._verify_stage(T, R, mode))

    def capture_all(self, mode: str, tiers: tuple[int, ...] | None, signatures) -> int:
        """Capture every graph a run can replay: the decode graphs of every batch bucket and every prefill
        graph, for each sampling signature in ``signatures``. Call with no rows loaded (after a reset);
        returns how many graphs were captured now."""
        if not self.use_graphs:
            return 0
        if self.rows:
            raise RuntimeError("capture_all needs no rows loaded (call it after Engine.reset())")
        before = self.captures
        saved = self.sampling
        for sig in signatures:
            self.set_sampling(sig)
            for b in self.batch_buckets:
                self.ensure_captured(b, mode, tiers)
        self.sampling = saved
        for T in self.prefill_buckets:
            for P in self.prefill_segment_buckets:
                if P <= T and ("prefill", T, P) not in self.graphs:
                    self.pf_slots.fill_(-1)  # the warm-up writes only the trash slot
                    self.pf_indptr.zero_()
                    self.pf_kv_lens.zero_()
                    self.graphs[("prefill", T, P)] = self._capture(lambda T=T, P=P: self._prefill_stage(T, P),
                                                                   prefill=True)
        return self.captures - before

    def _run(self, key, fn) -> None:
        if not self.use_graphs:
            fn()
            return
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(fn, prefill=key[0] == "prefill")
            self.graphs[key] = graph
        if graph.megakernel:
            self.megakernel_replays += 1
        if self.timing is not None:  # device time of each replay, read back only by timing_summary()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            self._step_events.append((key, start, end))
            return
        graph.replay()

    # ---- device timing (diagnostics: bench_decode's graph_timing) -------------------------------
    def start_timing(self) -> None:
        """Record CUDA events around every graph replay from now on (no host sync: the events are
        read by :meth:`timing_summary`). Each launched step keeps its own list, so a step's device
        span covers the gap between its draft and verify graphs too."""
        self.timing = []
        self._step_events = []

    def _close_step_timing(self, mode: str, rows: int = 0) -> None:
        if self.timing is not None and self._step_events:
            self.timing.append((mode, self._step_events, rows))
            self._step_events = []

    def timing_summary(self, skip_steps: int = 0) -> dict:
        """Per graph key and per step mode: median device ms (synchronises; call after the run)."""
        if not self.timing:
            return {}
        import statistics

        torch.cuda.synchronize(self.device)
        per_key: dict[str, list[float]] = {}
        per_mode: dict[str, list[float]] = {}
        steps = self.timing[skip_steps:]
        per_bucket: dict[str, list[float]] = {}
        for mode, events, rows in steps:
            for key, start, end in events:
                per_key.setdefault(_graph_name(key), []).append(start.elapsed_time(end))
            span = events[0][1].elapsed_time(events[-1][2])
            per_mode.setdefault(mode, []).append(span)
            if rows:
                per_bucket.setdefault(f"{mode}/b{rows}", []).append(span)
        # Gaps between consecutive steps on the decode stream: end of a step's last graph to the start of the
        # next step's first. Near zero when the host keeps ahead of the device; a host-bound step shows its
        # shortfall here. Prefills on their own stream (engine.prefill_stream) overlap these steps and are left
        # out of the gaps; on the decode stream they sit between two steps and read as a gap.
        decode = [(m, ev) for m, ev, _ in steps if not (m == "prefill" and self.prefill_stream is not None)]
        gaps = [a[-1][2].elapsed_time(b[0][1]) for (_, a), (_, b) in zip(decode, decode[1:])]
        med = lambda xs: round(statistics.median(xs), 4)  # noqa: E731
        # per graph, by name (_graph_name: step_<tokens>, draft_<rows>, verify_<mode>_<tokens>, prefill_<T>x<P>):
        # which of a step's graphs its time went to
        out = {"graph_device_ms_median": {k: med(v) for k, v in sorted(per_key.items())},
               "graph_replays_timed": {k: len(v) for k, v in sorted(per_key.items())},
               "step_device_ms_median": {m: med(v) for m, v in per_mode.items()},
               "steps_timed": {m: len(v) for m, v in per_mode.items()},
               # per step mode and batch bucket (rows): steps of one mode at one batch compare across modes and arms
               "step_device_ms_median_by_batch": {k: med(v) for k, v in sorted(per_bucket.items())},
               "steps_timed_by_batch": {k: len(v) for k, v in sorted(per_bucket.items())}}
        if gaps:
            import numpy as np

            # Device idle: the share of the timed span in which no timed graph ran on any stream (the union
            # of the replays' intervals, so overlapping prefill and decode graphs count once).
            origin = steps[0][1][0][1]
            spans = sorted((origin.elapsed_time(start), origin.elapsed_time(end)) for _, ev, _ in steps
                           for _, start, end in ev)
            busy, reach = 0.0, spans[0][0]
            for lo, hi in spans:
                if hi > reach:
                    busy += hi - max(lo, reach)
                    reach = hi
            total = reach - spans[0][0]
            out.update({"step_gap_ms_median": med(gaps), "step_gap_ms_p90": round(float(np.percentile(gaps, 90)), 4),
                        "device_idle_fraction": round(max(0.0, 1.0 - busy / total), 4) if total > 0 else None})
        return out

    @staticmethod
    def collect(launched: Launched) -> tuple[list[tuple[int, int, list[int]]], float]:
        """((accepted count, window, emitted tokens) per row, ms spent waiting for the device);
        waits for that step only."""
        waited = 0.0
        if launched.event is not None:
            t0 = time.perf_counter()
            launched.event.synchronize()
            waited = (time.perf_counter() - t0) * 1e3
        return _committed_rows(launched.host.tolist()), waited

    def _capture(self, fn, prefill: bool = False):
        """Warm up (JIT, cuBLAS) on a side stream with the state restored afterwards, then capture."""
        before = self.target.megakernel_launches
        bufs = (self.seq_len, self.anchor, self.out, self.tier, self.extra)
        saved = tuple(b.clone() for b in bufs)
        # The warm-up runs on real state; a verify graph's warm-up with the last step's tier/extra
        # could pack more rows than its bucket holds (cut by _verify_stage): start it from none.
        self.tier.fill_(self.min_verify_len)
        self.extra.zero_()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        for b, v in zip(bufs, saved):
            b.copy_(v)
        graph = torch.cuda.CUDAGraph()
        # A prefill graph that may run beside a decode graph has its own pool and capture stream (cuBLAS keys its
        # workspace by stream); every other graph shares the decode pool and torch's capture stream (None).
        beside = prefill and self.prefill_stream is not None
        pool_name = "prefill_pool" if beside else "pool"
        if getattr(self, pool_name) is None:
            setattr(self, pool_name, torch.cuda.graph_pool_handle())
        stream = self._prefill_capture_stream if beside else None
        with torch.cuda.graph(graph, pool=getattr(self, pool_name), stream=stream):
            fn()
        # Whether this graph's target step is the decode megakernel: its replays count as such steps.
        calls = self.target.megakernel_launches - before  # the warm-up's and the capture's
        graph.megakernel = calls > 0
        self.capture_megakernel_calls += calls
        self.captures += 1
        return graph

    def set_estimate_table(self, table) -> None:
        """The acceptance estimates (block slot x probability bin) the next steps read (draft_max_prob); queued
        behind any step in flight. On CUDA the copy leaves from a fresh pinned buffer without blocking: a copy
        from pageable memory would hold the host until the step in flight ends, which serialised the host's
        commit with the device at every step."""
        src = torch.as_tensor(table, dtype=torch.float32)
        copy_from_host(self.estimate_table[: src.shape[0]], src)

    def set_confidence_offsets(self, offsets) -> None:
        """The logit offsets per block slot the next steps add to the head's confidence (engine.online_calibration);
        queued behind any step in flight, from a fresh pinned buffer on CUDA (as set_estimate_table)."""
        if self.confidence_offsets is None:
            raise RuntimeError("this decoder was built without confidence offsets (confidence_offsets=False)")
        copy_from_host(self.confidence_offsets, torch.as_tensor(offsets, dtype=torch.float32))

    def set_table_entries(self, updates: list[tuple[int, int, int]]) -> None:
        """tables[row, col] = page for each (row, col, page): new pages of running requests."""
        upd = torch.tensor(updates, dtype=torch.int64)
        pin = self.device.type == "cuda"
        if pin:
            upd = upd.pin_memory()
        dev = upd.to(self.device, non_blocking=pin)
        self.tables.index_put_((dev[:, 0], dev[:, 1]), dev[:, 2].to(torch.int32))
