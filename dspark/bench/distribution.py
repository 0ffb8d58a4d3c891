"""Whether an arm's SAMPLED tokens follow the target model's distribution.

At temperature 0 the lossless guard compares tokens; with sampling the two arms emit
different tokens by design, and a speculative engine is lossless only if every token is
still a draw from the target's processed distribution (temperature, top-k, top-p). This
module checks that statistically, one arm at a time, against a reference model run
teacher-forced on the arm's own outputs:

- :func:`randomized_pit` maps each token to u = CDF(before token) + V * p(token),
  V ~ U(0, 1), over a token order fixed by the reference row (most probable first). If
  the token is an exact draw from p, u is exactly U(0, 1), whatever the vocabulary size.
  Along a sequence, with p at each position the distribution given that position's
  prefix, the u's are i.i.d. U(0, 1) (the Rosenblatt transform), so the PITs of all
  positions of all requests pool into one sample.
- :func:`request_pits` applies the engine's own processing (:func:`dspark.sampling.processed_probs`)
  to the reference logits of one request first.
- :func:`distribution_check` runs a one-sample Kolmogorov-Smirnov test of the pooled u's
  against U(0, 1) and gives a three-state verdict: passed, failed, or not enough tokens.

Randomization is what makes this exact: the plain PIT CDF(token) takes only V values, so
with a small vocabulary (or a peaked distribution, where a few tokens carry most of the
mass) it is far from uniform even for perfect draws. Jittering inside the token's CDF
step removes that without adding any bias.

A token the reference gives probability exactly 0 (outside its top-k / top-p set) cannot
be a draw from it: its u is NaN, never a value in [0, 1], and the caller counts it and
passes the count as ``impossible``; one such token fails the check on its own.

Caveats. The i.i.d. claim holds for a number of positions per request that does not
depend on the tokens (``ignore_eos`` and a fixed ``max_tokens``, as in the benchmark);
stopping at EOS or a stop string keeps each u's expected share below x at x (Wald) but
changes the spread a little, so KS p-values are then approximate. The reference must
compute the logits as the engine's target does: in reduced precision a token at the
top-k / top-p boundary can be kept by one and cut by the other (a false "impossible"),
and with very many tokens KS can resolve the small shift that logit noise causes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike
from scipy import stats as sps

from dspark.config import SamplingParams
from dspark.sampling import RowSampling, processed_probs

_CHUNK_ELEMENTS = 1 << 24  # randomized_pit converts at most this many probabilities to float64 at a time


def randomized_pit(probs: torch.Tensor, tokens: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Randomized probability integral transform of ``tokens`` [N] under ``probs`` [N, V].

    u_i = (CDF_i(before t_i) + V_i * p_i(t_i)) / sum_j p_i(j), with V_i ~ U(0, 1) from
    ``generator`` (drawn on the generator's device) and the CDF over a fixed token order:
    most probable first, ties by vocabulary index. The order depends on row i only, never
    on t_i, so if t_i is an exact draw from row i, u_i is exactly U(0, 1); if row i is the
    distribution given the prefix t_1..t_{i-1} of one sequence, u_1..u_N are i.i.d.
    U(0, 1) (Rosenblatt transform). Any fixed order is exact; this one gives power: too
    hot a sampler pushes u towards 1, too greedy a one towards 0, where in vocabulary
    index order the same shift scatters over [0, 1] and KS barely sees it. Float64, in
    row chunks so that a large vocabulary stays within memory.

    Returns u [N] (float64, on ``probs``' device), NaN where p_i(t_i) == 0: such a token is
    impossible under the reference and is evidence of an error, not a value to test.
    """
    if probs.dim() != 2 or tokens.dim() != 1 or tokens.shape[0] != probs.shape[0]:
        raise ValueError(f"randomized_pit needs probs [N, V] and tokens [N], got {tuple(probs.shape)} "
                         f"and {tuple(tokens.shape)}")
    if tokens.dtype != torch.int64:
        raise ValueError(f"tokens must be int64, got {tokens.dtype}")
    n, vocab = probs.shape
    if n and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(f"tokens must lie in [0, {vocab}), got min {int(tokens.min())} max {int(tokens.max())}")
    jitter = torch.rand(n, generator=generator, dtype=torch.float64, device=generator.device).to(probs.device)
    tokens = tokens.to(probs.device)
    index = torch.arange(vocab, device=probs.device)[None, :]
    out = []
    rows = max(1, _CHUNK_ELEMENTS // max(vocab, 1))
    for lo in range(0, n, rows):
        p = probs[lo:lo + rows].to(torch.float64)
        total = p.sum(dim=-1)
        if not bool(torch.isfinite(p).all() and (p >= 0).all() and (total > 0).all()):
            raise ValueError("probs must be finite, >= 0, with a positive sum in every row")
        t = tokens[lo:lo + rows, None]
        p_tok = p.gather(1, t)
        # Mass of the tokens ordered before t: more probable ones, then equally probable ones of lower index.
        before = (p > p_tok) | ((p == p_tok) & (index < t))
        cdf_before = torch.where(before, p, torch.zeros_like(p)).sum(dim=-1)
        p_tok = p_tok.squeeze(1)
        u = ((cdf_before + jitter[lo:lo + rows] * p_tok) / total).clamp_(0.0, 1.0)
        out.append(torch.where(p_tok > 0, u, torch.full_like(u, math.nan)))
    return torch.cat(out) if out else torch.empty(0, dtype=torch.float64, device=probs.device)


def request_pits(reference_logits: torch.Tensor, tokens: torch.Tensor, params: SamplingParams,
                 generator: torch.Generator) -> torch.Tensor:
    """PITs of one request's sampled output tokens.

    ``reference_logits`` [n_out, V] are the reference model's logits at each output
    position, teacher-forced on the arm's own prefix; ``tokens`` [n_out] what the arm
    emitted there. The logits go through the processing the engine samples from
    (:func:`dspark.sampling.processed_probs`: temperature, then top-k, then top-p) before
    :func:`randomized_pit`. Returns u [n_out], NaN for tokens impossible under the reference.
    Greedy requests have no distribution to test: the lossless guard compares their tokens.
    """
    if params.greedy:
        raise ValueError("request_pits: greedy sampling params (temperature 0) have no distribution to test; "
                         "check greedy requests with the token-for-token lossless guard")
    if reference_logits.dim() != 2 or reference_logits.shape[0] != tokens.shape[0]:
        raise ValueError(f"request_pits needs logits [n_out, V] and tokens [n_out], got "
                         f"{tuple(reference_logits.shape)} and {tuple(tokens.shape)}")
    rows = RowSampling([params] * reference_logits.shape[0], reference_logits.device)
    probs = processed_probs(reference_logits, rows)
    return randomized_pit(probs, tokens.to(torch.int64), generator)


def split_impossible(pits: ArrayLike | torch.Tensor) -> tuple[np.ndarray, int]:
    """(the finite u values, the number of NaN markers of impossible tokens) of pooled PITs."""
    if isinstance(pits, torch.Tensor):
        pits = pits.detach().cpu().numpy()
    u = np.asarray(pits, dtype=float).ravel()
    bad = np.isnan(u)
    return u[~bad], int(bad.sum())


@dataclass
class DistributionResult:
    """One arm's sampled tokens against the target distribution.

    ``passed`` is three-state: True (KS consistent with U(0, 1), no impossible token),
    False (KS p < alpha, or any impossible token), None (fewer than ``min_tokens`` values
    and no impossible token: no verdict either way, which is not a pass).
    """

    arm: str
    passed: bool | None
    n: int
    statistic: float | None
    p_value: float | None
    impossible: int
    alpha: float
    min_tokens: int
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return {True: "passed", False: "failed", None: "insufficient"}[self.passed]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "state": self.state}


def _as_uniforms(pits: ArrayLike | torch.Tensor, what: str) -> np.ndarray:
    if isinstance(pits, torch.Tensor):
        pits = pits.detach().cpu().numpy()
    u = np.asarray(pits, dtype=float).ravel()
    if np.isnan(u).any():
        raise ValueError(f"{what} contains NaN, the marker of impossible tokens: drop them with split_impossible "
                         "and pass their count as impossible=")
    if u.size and (u.min() < 0 or u.max() > 1):
        raise ValueError(f"{what} must lie in [0, 1], got min {u.min()} max {u.max()}")
    return u


def distribution_check(pits: ArrayLike | torch.Tensor, *, alpha: float, min_tokens: int, impossible: int,
                       arm: str = "B", other: ArrayLike | torch.Tensor | None = None,
                       other_arm: str = "A") -> DistributionResult:
    """One-sample KS test of an arm's pooled PITs against U(0, 1) (``scipy.stats.kstest``).

    ``pits`` are the finite u values of all sampled tokens of the arm; ``impossible`` the
    number of its tokens with probability 0 under the reference (see :func:`split_impossible`).
    Fails when p < ``alpha`` or ``impossible`` > 0; with fewer than ``min_tokens`` values
    and no impossible token there is no verdict (``passed`` None). When ``other`` (the
    other arm's PITs) is given, a two-sample KS test (``scipy.stats.ks_2samp``) of the two
    arms goes into ``details["two_sample"]``; it is reported, not part of the verdict: the
    one-sample test against the exact null is the check.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if min_tokens < 1 or impossible < 0:
        raise ValueError(f"min_tokens must be >= 1 and impossible >= 0, got {min_tokens} and {impossible}")
    u = _as_uniforms(pits, f"arm {arm} pits")
    n = int(u.size)
    details: dict[str, Any] = {"test": "one-sample Kolmogorov-Smirnov against U(0, 1)", "two_sample": None}

    if other is not None:
        v = _as_uniforms(other, f"arm {other_arm} pits")
        if min(n, v.size) >= min_tokens:
            two = sps.ks_2samp(u, v)
            details["two_sample"] = {"against": other_arm, "n": n, "n_other": int(v.size),
                                     "statistic": float(two.statistic), "p_value": float(two.pvalue)}
        else:
            details["two_sample"] = {"against": other_arm, "n": n, "n_other": int(v.size),
                                     "note": f"not enough tokens (< {min_tokens:,}) for a two-sample comparison"}

    statistic = p_value = None
    if n >= min_tokens:
        ks = sps.kstest(u, "uniform")
        statistic, p_value = float(ks.statistic), float(ks.pvalue)
    ks_text = "" if p_value is None else f"KS D={statistic:.3g} p={p_value:.3g} against U(0,1)"

    if impossible:
        passed = False
        message = (f"arm {arm}: {impossible:,} of {n + impossible:,} sampled tokens have probability 0 under the "
                   f"reference (outside its top-k/top-p set)" + (f"; {ks_text}" if ks_text else "")
                   + ": NOT the target distribution")
    elif p_value is None:
        passed = None
        message = f"arm {arm}: not enough tokens ({n:,} < {min_tokens:,}): no distribution verdict"
    elif p_value < alpha:
        passed = False
        message = (f"arm {arm}: {n:,} sampled tokens, {ks_text} (alpha {alpha:g}): NOT the target distribution, "
                   "the sampled tokens do not follow the reference model's processed probabilities")
    else:
        passed = True
        message = f"arm {arm}: {n:,} sampled tokens, {ks_text}: consistent with the target distribution"
    return DistributionResult(arm=arm, passed=passed, n=n, statistic=statistic, p_value=p_value,
                              impossible=int(impossible), alpha=alpha, min_tokens=min_tokens, message=message,
                              details=details)
