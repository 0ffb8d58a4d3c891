"""The top-token probability of each row of logits: max(softmax(logits)), one pass over the vocabulary.

:func:`top_probability_reference` is the specification: ``exp(max(x) - logsumexp(x))`` per row of
``x = logits.float()``, float32 [T]. For rows of finite values that is the largest softmax probability, in
(0, 1]. Rows the expression cannot give a probability for come out NaN, as torch computes it: a row holding
+inf (inf - inf), a row of nothing but -inf (-inf - -inf) and a row holding a NaN. -inf entries beside a
finite maximum weigh nothing. (``torch.softmax(x, -1).amax(-1)`` agrees on all of these.)

:func:`top_probability_triton` computes the same with one program per row and one pass over its logits, in
float32 whatever the input dtype. Each lane of a tile keeps an online softmax state: the largest value m it
has seen and ``s = sum exp(x - m)`` over its values, rescaled when m grows. One exponential per element
does both cases, ``e = exp(min(x, m) - max(x, m))``: a new maximum makes ``s = s * e + 1``, any other value
``s = s + e`` (lanes that have seen only -inf add nothing). At the end of the row the lanes combine into the
row's maximum M and sum ``S = sum_lanes s * exp(m - M)``, which is at least 1 (the lane holding M adds its
own s >= 1), and the probability is ``1 / S``. A row with a NaN (tracked per lane, as min/max drop NaN on
the GPU), an infinite M or an all -inf row stores NaN. The order of the additions is fixed by the tile size
and the lane, so a row's result does not depend on the other rows or on scheduling (bitwise repeatable);
against the reference it differs by rounding (tests use rtol 1e-5 in float32).

In PyTorch the same quantity is a max, a logsumexp (itself a max, a subtraction, an exponential and a sum)
and an exponential, several passes over [rows, vocabulary]: on the H200 about 1.35 ms of a 256-row greedy
draft graph over SmolLM2's 49,152-token vocabulary, seven slots. At most a few hundred rows of that
vocabulary keep the device busy with one program per row, so rows are not split across programs.

The kernel reads nothing on the host and allocates nothing but its output (none with ``out=``), so it can
be captured in a CUDA graph. The engine reaches it through :func:`dspark.sampling.top_probability` (the
draft stage's ``max_prob`` for ``engine.acceptance_estimate=draft_max_prob``, the ``sts_max_prob``
calibration and step traces) on CUDA tensors of an engine on the Triton backend;
``engine.kernels.triton_top_probability=false`` switches it off there (the reference runs instead).
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from kernels.row_checks import check_row_logits, power_of_two
BLOCK = 4096  # vocabulary entries per tile (lanes of the per-lane softmax state)
NUM_WARPS = 8


def top_probability_reference(logits: torch.Tensor) -> torch.Tensor:
    """``exp(max - logsumexp)`` over the last axis of ``logits.float()``: float32 [...] (NaN for rows with +inf,
    rows of only -inf and rows with a NaN)."""
    x = logits.float()
    return torch.exp(x.max(dim=-1).values - torch.logsumexp(x, dim=-1))


# --------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------

@triton.jit
def _top_probability_kernel(x_ptr, out_ptr, V, stride_t, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    src = x_ptr + row * stride_t
    offs = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], -float("inf"), dtype=tl.float32)  # per lane: the largest value so far
    s = tl.zeros([BLOCK], dtype=tl.float32)  # per lane: sum of exp(value - m) so far
    nan = tl.zeros([BLOCK], dtype=tl.int32)  # per lane: a NaN was seen
    for start in range(0, V, BLOCK):
        cols = start + offs
        x = tl.load(src + cols, mask=cols < V, other=-float("inf")).to(tl.float32)
        nan = nan | (x != x).to(tl.int32)
        hi = tl.maximum(x, m)
        lo = tl.minimum(x, m)
        # exp(lo - hi) <= 1; both -inf (padding, or -inf logits before any finite one) weigh nothing
        e = tl.where(hi == -float("inf"), 0.0, tl.exp(lo - hi))
        grows = x > m
        s = tl.where(grows, s * e + 1.0, s + e)
        m = hi
    top = tl.max(m, 0)
    scale = tl.where(m == -float("inf"), 0.0, tl.exp(m - top))  # lanes of only -inf hold s = 0
    total = tl.sum(s * scale, 0)
    bad = (tl.max(nan, 0) > 0) | (top == -float("inf")) | (top == float("inf"))
    tl.store(out_ptr + row * stride_out, tl.where(bad, float("nan"), 1.0 / total))


# --------------------------------------------------------------------------------------
# Wrapper
# --------------------------------------------------------------------------------------

def _check(logits: torch.Tensor, out: torch.Tensor | None) -> tuple[int, int]:
    return check_row_logits(logits, out, kernel="top_probability_triton", result="top probability",
                            columns="column offsets", out_dtype=torch.float32, contiguous_out=False)


def top_probability_triton(logits: torch.Tensor, out: torch.Tensor | None = None, *,
                           block: int = BLOCK) -> torch.Tensor:
    """The largest softmax probability of each row of ``logits`` [T, V] (float32/bfloat16/float16, unit stride
    on V, any row stride) as float32 [T], :func:`top_probability_reference` up to rounding (NaN where it is).

    Writes into ``out`` (float32 [T], any stride: e.g. one slot's column of a [rows, slots] buffer) when
    given and returns it. Reads nothing on the host and allocates nothing but ``out``, so it can be captured
    in a CUDA graph. block: elements per tile (a power of two >= 16; tests use small ones for short rows).
    """
    T, V = _check(logits, out)
    block = power_of_two("block", block, 16)
    if out is None:
        out = torch.empty(T, dtype=torch.float32, device=logits.device)
    if T == 0:
        return out
    _top_probability_kernel[(T,)](logits, out, V, logits.stride(0), out.stride(0), BLOCK=block,
                                  num_warps=NUM_WARPS)
    return out
