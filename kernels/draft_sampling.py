"""One draft slot's draw for rows that sample with a temperature alone (no top-k, no top-p), in two passes.

The specification is :func:`dspark.sampling.sample_rows` for such rows (:func:`sample_slot_reference`): the
processed distribution ``q = softmax(logits / t)`` (t = 1 for greedy rows), the token ``argmax(logits)`` for a
greedy row and the inverse-CDF draw ``first v with cumsum(q)[v] > u * sum(q)`` for a sampled one, one uniform
``u`` per row. In PyTorch that is a division, a softmax, an argmax, a cumulative sum over the whole vocabulary
and a search: at 256 rows and SmolLM2's 49,152-token vocabulary about 0.35 ms per slot, seven slots per draft,
most of a sampled draft's device time on the H200 (`bench/profile_draft_stage.py`).

:func:`sample_slot_triton` does the same with one program per row and two passes over its logits:

1. an online softmax over the vocabulary's tiles: the running maximum m of ``x = logits / t`` and the sum
   ``S = sum exp(x - m)`` rescaled as m grows, and the first index of the largest logit (the greedy token);
2. ``q_v = exp(x_v - m) / S`` written to ``probs_out`` (the caller's buffer: the decoder's draft
   probabilities), while a running sum of ``exp(x_v - m)`` over the tiles finds the first v whose prefix exceeds
   ``u * S``: the inverse-CDF draw on the unnormalised weights, which is the same distribution.

With ``gap_out`` the first pass also keeps each row's two largest logits (a repeat of the largest is the second)
and writes their difference, :func:`kernels.argmax.top_gap_reference` bitwise (NaN for a row holding a NaN): the
score an ``sts_top_gap`` calibration weighs, at no extra pass over the logits.

The draw follows q, the probabilities it writes, as the acceptance rule requires. It is not the reference's
index bit for bit: the two sum in different orders, so where ``u * S`` falls within rounding of a boundary
between two tokens the two may pick neighbours (tests/test_draft_sampling.py bounds how close). A draw that
finds no prefix above ``u * S`` (rounding at the very end) takes the last token of nonzero weight.

The caller decides where it runs (``engine.kernels.fused_draft_sampling``, CUDA, rows without top-k/top-p);
everything else goes through :func:`dspark.sampling.sample_rows`.
"""

from __future__ import annotations

import torch

try:  # Triton is optional at import time: the torch reference is the specification.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only on machines without triton
    triton = None
    tl = None

BLOCK_V = 2048  # vocabulary entries per tile


def sample_slot_reference(logits: torch.Tensor, temperature: torch.Tensor, u: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens int64 [M], probs float32 [M, V]) as :func:`dspark.sampling.sample_rows` gives them for rows with
    ``temperature`` [M] (0: greedy) and neither top-k nor top-p."""
    from dspark.sampling import RowSampling, sample_rows

    M = logits.shape[0]
    rows = RowSampling.from_tensors(temperature.float(), torch.zeros(M, dtype=torch.int64, device=logits.device),
                                    torch.ones(M, dtype=torch.float32, device=logits.device),
                                    all_greedy=False, needs_k=False, needs_p=False)
    return sample_rows(logits, rows, u)


def sample_slot_triton(logits: torch.Tensor, temperature: torch.Tensor, u: torch.Tensor,
                       probs_out: torch.Tensor | None = None, gap_out: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens int64 [M], probs float32 [M, V]): the module's two-pass draw; ``probs_out`` (float32 [M, V], last
    dim contiguous, e.g. one slot of the decoder's [R, G, V] buffer) receives the probabilities when given;
    ``gap_out`` (float32 [M], any stride, e.g. one slot's column of the decoder's [R, G] gaps; needs V >= 2) each
    row's largest logit minus its second largest. Capture-safe: reads no device value on the host."""
    if triton is None:
        raise RuntimeError("sample_slot_triton needs the triton package (engine.kernels.fused_draft_sampling=false "
                           "runs dspark.sampling.sample_rows)")
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise ValueError(f"logits must be float32 [M, V] with a contiguous last dim, got {logits.dtype} "
                         f"{tuple(logits.shape)} strides {logits.stride()}")
    M, V = logits.shape
    rows = [("temperature", temperature), ("u", u)] + ([("gap_out", gap_out)] if gap_out is not None else [])
    for name, t in rows:
        if t.shape != (M,) or t.dtype != torch.float32 or t.device != logits.device:
            raise ValueError(f"{name} must be float32 [{M}] on {logits.device}, got {t.dtype} {tuple(t.shape)} "
                             f"on {t.device}")
    if probs_out is None:
        probs_out = torch.empty((M, V), dtype=torch.float32, device=logits.device)
    elif (probs_out.shape != (M, V) or probs_out.dtype != torch.float32 or probs_out.stride(1) != 1
          or probs_out.device != logits.device):
        raise ValueError(f"probs_out must be float32 [{M}, {V}] with a contiguous last dim on {logits.device}, got "
                         f"{probs_out.dtype} {tuple(probs_out.shape)} strides {probs_out.stride()}")
    if gap_out is not None and V < 2:
        raise ValueError(f"gap_out needs at least 2 columns (a largest and a second largest logit), got V={V}")
    tokens = torch.empty(M, dtype=torch.int64, device=logits.device)
    if M == 0 or V == 0:
        return tokens, probs_out
    with_gap = gap_out is not None
    _sample_slot_kernel[(M,)](logits, temperature, u, probs_out, tokens, gap_out if with_gap else tokens, V,
                              logits.stride(0), probs_out.stride(0), gap_out.stride(0) if with_gap else 0,
                              WITH_GAP=with_gap, BLOCK=BLOCK_V, num_warps=8)
    return tokens, probs_out


if triton is not None:

    @triton.jit
    def _sample_slot_kernel(logits_ptr, temp_ptr, u_ptr, probs_ptr, tokens_ptr, gap_ptr, V, stride_l, stride_p,
                            stride_g, WITH_GAP: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        t = tl.load(temp_ptr + row)
        greedy = t == 0.0
        scale = tl.where(greedy, 1.0, t)
        src = logits_ptr + row * stride_l
        offs = tl.arange(0, BLOCK)
        # Pass 1: online softmax statistics of x = logits / t, and the first index of the largest logit.
        m = tl.full([], -float("inf"), tl.float32)
        s = tl.full([], 0.0, tl.float32)
        best = tl.full([], -float("inf"), tl.float32)
        best_at = tl.full([], 0, tl.int32)
        second = tl.full([], -float("inf"), tl.float32)  # WITH_GAP: the runner-up to best over the tiles so far
        nan_seen = tl.full([], 0, tl.int32)
        for start in range(0, V, BLOCK):
            cols = start + offs
            ok = cols < V
            raw = tl.load(src + cols, mask=ok, other=-float("inf"))
            x = raw / scale
            tile_max = tl.max(x, 0)
            m_new = tl.maximum(m, tile_max)
            m_shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            s = s * tl.exp(m - m_shift) + tl.sum(tl.where(ok, tl.exp(x - m_shift), 0.0), 0)
            m = m_new
            raw_max = tl.max(raw, 0)
            at = tl.min(tl.where(raw == raw_max, cols, V), 0)
            if WITH_GAP:  # the top two of {best, second} and of this tile (its first maximum left out)
                tile_second = tl.max(tl.where(cols == at, -float("inf"), raw), 0)
                second = tl.maximum(tl.maximum(second, tile_second), tl.minimum(best, raw_max))
                nan_seen = tl.maximum(nan_seen, tl.max((raw != raw).to(tl.int32), 0))
            better = raw_max > best
            best_at = tl.where(better, at, best_at)
            best = tl.where(better, raw_max, best)
        if WITH_GAP:
            tl.store(gap_ptr + row * stride_g, tl.where(nan_seen > 0, float("nan"), best - second))
        # Pass 2: the probabilities, and the inverse-CDF draw on the unnormalised weights exp(x - m).
        target = tl.load(u_ptr + row) * s
        inv = 1.0 / s
        run = tl.full([], 0.0, tl.float32)
        drawn = tl.full([], 0, tl.int32) + V
        last_nonzero = tl.full([], 0, tl.int32)
        dst = probs_ptr + row * stride_p
        for start in range(0, V, BLOCK):
            cols = start + offs
            ok = cols < V
            raw = tl.load(src + cols, mask=ok, other=-float("inf"))
            e = tl.where(ok, tl.exp(raw / scale - m), 0.0)
            tl.store(dst + cols, e * inv, mask=ok)
            prefix = run + tl.cumsum(e, 0)
            hit = tl.min(tl.where((prefix > target) & ok, cols, V), 0)
            drawn = tl.minimum(drawn, hit)
            last_nonzero = tl.maximum(last_nonzero, tl.max(tl.where(e > 0.0, cols, 0), 0))
            run += tl.sum(e, 0)
        drawn = tl.where(drawn == V, last_nonzero, drawn)
        tl.store(tokens_ptr + row, tl.where(greedy, best_at, drawn).to(tl.int64))

