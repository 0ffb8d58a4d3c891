"""From logits to the distribution a request samples from, and sampling with per-request RNG.

The target and the drafter go through the same processing (temperature, then top-k, then
top-p), so rejection sampling compares like with like. Greedy rows keep their logits'
argmax: their "distribution" is only ever used through argmax.

:func:`greedy_argmax` is the greedy token choice of the device-resident decode steps: the
multi-program Triton kernel (kernels/argmax.py, index-identical to ``torch.argmax``) for CUDA
tensors of an engine on the Triton attention backend, ``torch.argmax`` otherwise.
``engine.kernels.triton_argmax=false`` switches the kernel off.

:func:`top_probability` is the drafter's top-token probability per row, ``exp(max - logsumexp)`` of its
logits, wherever it is computed (the decode steps' draft stage, the calibration replay), so that they agree:
one pass of kernels/top_probability.py for CUDA tensors of an engine on the Triton backend, the PyTorch
reference otherwise. ``engine.kernels.triton_top_probability=false`` switches the kernel off.

:func:`top_gap` is the largest logit minus the second largest per row (a confidence with no softmax over the
vocabulary), :func:`kernels.argmax.top_gap_reference`. kernels/argmax.py gives the same values bitwise (up to
the sign of a zero gap) in one pass for CUDA tensors of an engine on the Triton backend with
``engine.kernels.triton_argmax``: inside the greedy choice's own pass through :func:`greedy_argmax`'s
``gap_out``, or on its own (sampled rows) through :func:`top_gap`; the reference (torch.topk) runs otherwise.
"""

from __future__ import annotations

import torch

from dspark.config import KernelConfig, SamplingParams


class RowSampling:
    """Per-row sampling parameters of a batch, as tensors."""

    def __init__(self, params: list[SamplingParams], device: torch.device | str = "cpu"):
        self.params = params
        self.temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
        self.top_k = torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device)
        self.top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
        self.greedy = self.temperature == 0
        # Decided from the host-side parameters, so processing never reads a device value.
        self.all_greedy = all(p.temperature == 0 for p in params)
        self.needs_k = any(p.temperature > 0 and p.top_k > 0 for p in params)
        self.needs_p = any(p.temperature > 0 and p.top_p < 1.0 for p in params)

    @classmethod
    def from_tensors(cls, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, *, all_greedy: bool,
                     needs_k: bool, needs_p: bool) -> "RowSampling":
        """Rows whose parameters already live in (persistent) device tensors."""
        out = cls.__new__(cls)
        out.params = []
        out.temperature, out.top_k, out.top_p = temperature, top_k, top_p
        out.greedy = temperature == 0
        out.all_greedy, out.needs_k, out.needs_p = all_greedy, needs_k, needs_p
        return out

    def repeat(self, n: int) -> "RowSampling":
        """Each row repeated n times (rows of the same request stay adjacent)."""
        out = RowSampling.__new__(RowSampling)
        out.params = [p for p in self.params for _ in range(n)]
        out.temperature = self.temperature.repeat_interleave(n)
        out.top_k = self.top_k.repeat_interleave(n)
        out.top_p = self.top_p.repeat_interleave(n)
        out.greedy = self.greedy.repeat_interleave(n)
        out.all_greedy, out.needs_k, out.needs_p = self.all_greedy, self.needs_k, self.needs_p
        return out


def processed_probs(logits: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """logits [N, V] -> probabilities [N, V] after temperature, top-k and top-p.

    Greedy rows come back as softmax(logits), which keeps their argmax.
    """
    logits = logits.float()
    temp = torch.where(rows.greedy, torch.ones_like(rows.temperature), rows.temperature)
    scaled = logits / temp[:, None]
    V = logits.shape[-1]
    needs_k, needs_p = rows.needs_k, rows.needs_p
    if needs_k or needs_p:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        keep = torch.ones_like(sorted_logits, dtype=torch.bool)
        rank = torch.arange(V, device=logits.device)[None, :]
        if needs_k:
            k = torch.where((rows.top_k > 0) & ~rows.greedy, rows.top_k.clamp(max=V), torch.full_like(rows.top_k, V))
            keep &= rank < k[:, None]
        if needs_p:
            probs_sorted = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
            # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is < top_p.
            mass_before = torch.cumsum(probs_sorted, dim=-1) - probs_sorted
            p = torch.where(rows.greedy, torch.ones_like(rows.top_p), rows.top_p)
            keep &= mass_before < p[:, None]
        keep[:, 0] = True
        mask = torch.zeros_like(keep).scatter(-1, order, keep)
        scaled = scaled.masked_fill(~mask, float("-inf"))
    return torch.softmax(scaled, dim=-1)


def sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row from probs [N, V] with uniforms u [N] in [0, 1)."""
    cdf = torch.cumsum(probs.float(), dim=-1)
    total = cdf[:, -1:]
    idx = torch.searchsorted(cdf, (u[:, None].float() * total).contiguous(), right=True).squeeze(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)


def triton_argmax_enabled(kernels: KernelConfig | None, device: torch.device | str) -> bool:
    """Whether :func:`greedy_argmax` runs the Triton kernel for an engine with ``kernels`` and tensors
    on ``device``: the Triton backend, ``engine.kernels.triton_argmax`` on, and CUDA only."""
    from kernels.switches import cuda_switch_on

    return cuda_switch_on(kernels, "triton_argmax", device)


def fused_draft_sampling_enabled(kernels: KernelConfig | None, device: torch.device | str) -> bool:
    """Whether a draft slot of rows without top-k/top-p is drawn by kernels/draft_sampling.py for an engine with
    ``kernels``: the Triton backend, ``engine.kernels.fused_draft_sampling`` on, and CUDA only."""
    from kernels.switches import cuda_switch_on

    return cuda_switch_on(kernels, "fused_draft_sampling", device)


def _row_kernel_input(logits: torch.Tensor) -> bool:
    """Whether the row-reduction kernels over the vocabulary (kernels/argmax.py, kernels/top_probability.py) take
    ``logits``: 2-D float [T, V] with a non-empty vocabulary and a unit stride on V."""
    return (logits.dim() == 2 and logits.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and logits.shape[1] > 0 and (logits.shape[1] == 1 or logits.stride(1) == 1))


def _kernel_row_out(out: torch.Tensor | None) -> bool:
    """Whether argmax_triton can write ``out`` as its top_out or gap_out: a 1-D float32 tensor."""
    return out is not None and out.dim() == 1 and out.dtype == torch.float32


def greedy_argmax(logits: torch.Tensor, kernels: KernelConfig | None = None, top_out: torch.Tensor | None = None,
                  gap_out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.argmax(logits, dim=-1)``, through kernels/argmax.py for 2-D float logits on CUDA
    where ``kernels`` (the engine's settings) say so (same index, ties and NaN included; capture-safe).
    Without ``kernels``: ``torch.argmax``. ``top_out`` (float32 [T], any stride): also write each row's
    :func:`top_probability` there; the argmax kernel computes it in the same pass over the logits where
    both ``triton_argmax`` and ``triton_top_probability`` are on, :func:`top_probability` does otherwise.
    ``gap_out`` (float32 [T], any stride; logits need at least 2 columns): also write each row's :func:`top_gap`
    there (the same values either way); the argmax kernel computes it in the same pass where
    ``triton_argmax`` is on, :func:`top_gap` (a separate pass) does otherwise. Either output, or both, may be
    given; the kernel fills those it can in its one pass and the functions named fill the others."""
    fused = {}  # the outputs the kernel writes in its pass
    if _row_kernel_input(logits) and triton_argmax_enabled(kernels, logits.device):
        from kernels.argmax import argmax_triton

        if _kernel_row_out(top_out) and triton_top_probability_enabled(kernels, logits.device):
            fused["top_out"] = top_out
        if _kernel_row_out(gap_out):
            fused["gap_out"] = gap_out
        index = argmax_triton(logits, **fused)
    else:
        index = torch.argmax(logits, dim=-1)
    if top_out is not None and "top_out" not in fused:
        top_probability(logits, kernels, out=top_out)
    if gap_out is not None and "gap_out" not in fused:
        top_gap(logits, kernels, out=gap_out)
    return index


def triton_top_probability_enabled(kernels: KernelConfig | None, device: torch.device | str) -> bool:
    """Whether :func:`top_probability` runs the Triton kernel for an engine with ``kernels`` and tensors on
    ``device``: the Triton backend, ``engine.kernels.triton_top_probability`` on, and CUDA only."""
    from kernels.switches import cuda_switch_on

    return cuda_switch_on(kernels, "triton_top_probability", device)


def top_probability(logits: torch.Tensor, kernels: KernelConfig | None = None,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """The largest softmax probability over the last axis of ``logits`` [..., V], ``exp(max - logsumexp)`` in
    float32 (:func:`kernels.top_probability.top_probability_reference`, NaN for rows with +inf, NaN or only
    -inf). 2-D float logits on CUDA go through kernels/top_probability.py where ``kernels`` (the engine's
    settings) say so: one pass, the same values up to rounding, capture-safe. Without ``kernels``: the
    reference. ``out`` (float32, the result's shape, any stride) receives the result when given."""
    if (_row_kernel_input(logits) and (out is None or (out.dim() == 1 and out.dtype == torch.float32))
            and triton_top_probability_enabled(kernels, logits.device)):
        from kernels.top_probability import top_probability_triton

        return top_probability_triton(logits, out=out)
    from kernels.top_probability import top_probability_reference

    top = top_probability_reference(logits)
    return top if out is None else out.copy_(top)


def top_gap(logits: torch.Tensor, kernels: KernelConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The largest value minus the second largest over the last axis of ``logits`` [..., V] (V >= 2, ValueError
    otherwise), float32 [...]: :func:`kernels.argmax.top_gap_reference` (0 for a repeated maximum; NaN for a row
    with a NaN, a row of only -inf and a row with +inf twice; +inf for a finite maximum over only -inf and for a
    single +inf). 2-D float logits on CUDA go through kernels/argmax.py's one pass (its index is not kept) where
    ``kernels`` (the engine's settings) switch ``triton_argmax`` on: the same values, capture-safe. Otherwise,
    and without ``kernels``, the reference (torch.topk). ``out`` (float32, the result's shape, any stride)
    receives the result when given and is returned."""
    if (_row_kernel_input(logits) and logits.shape[1] >= 2 and (out is None or _kernel_row_out(out))
            and triton_argmax_enabled(kernels, logits.device)):
        from kernels.argmax import argmax_triton

        gap = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device) if out is None else out
        argmax_triton(logits, gap_out=gap)
        return gap
    from kernels.argmax import top_gap_reference

    gap = top_gap_reference(logits)
    return gap if out is None else out.copy_(gap)


def sample_rows(logits: torch.Tensor, rows: RowSampling, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row: argmax for greedy rows, inverse CDF of the processed
    distribution otherwise. Returns (tokens [N], processed probs [N, V])."""
    probs = processed_probs(logits, rows)
    tokens = torch.argmax(logits, dim=-1)
    if not rows.all_greedy:
        drawn = sample_inverse_cdf(probs, uniforms)
        tokens = torch.where(rows.greedy, tokens, drawn)
    return tokens, probs
