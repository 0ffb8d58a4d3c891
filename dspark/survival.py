"""Calibrated confidence and prefix survival: the inputs of confidence-scheduled verification.

The drafter's confidence head gives, for every drafted position k, a logit z_k whose
sigmoid estimates c_k = P(position k accepted | positions 1..k-1 accepted). Sequential
temperature scaling (STS) divides each position's logit by its own temperature (and the
``sts_bias`` calibration then adds a per-position bias: sigmoid(z_k / T_k + b_k)). The
``sts_max_prob`` calibration adds a third term, the drafter's own top-token probability p_k at
that slot: c_k = sigmoid(z_k / T_k + b_k + w_k * logit(p_k)), p_k clamped to
[MAX_PROB_EPS, 1 - MAX_PROB_EPS] first (:func:`max_prob_logit`). The ``sts_top_gap``
calibration weighs instead the gap g_k between the drafter's two largest logits at that slot, a score that
needs no softmax: c_k = sigmoid(z_k / T_k + b_k + v_k * g_k). The
probability that the whole prefix 1..j survives verification is the cumulative product
a_j = prod_{i<=j} c_i, which is non-increasing in j (every factor lies in [0, 1] and
IEEE rounding is monotone, so no float coincidence can make it increase).

Slots of the lagged confidence buffer are reused by new requests. A reused slot is
reset to NEUTRAL_CONFIDENCE = 1.0 ("no evidence: assume the whole block survives"):
 - it is never the predecessor's scores, which would schedule a new request against a
   dead draft;
 - 1.0 makes the newcomer look like the no-trim baseline, so the budget sized from it
   can only err toward verifying more (costing time), never toward cutting acceptance
   on someone else's evidence;
 - a per-position prior (e.g. the mean calibrated survival on held-out data) is a better
   estimate when one is known; ``neutral_survival_row`` and ``reset_slot_`` take it.
"""

from __future__ import annotations

from typing import Sequence

import torch

NEUTRAL_CONFIDENCE = 1.0
# The drafter's top-token probability is clamped to [MAX_PROB_EPS, 1 - MAX_PROB_EPS] before its logit
# (sts_max_prob), where it is fitted (dspark.training.calibration) and where the engine applies it.
MAX_PROB_EPS = 1e-6


def max_prob_logit(max_prob: torch.Tensor, eps: float = MAX_PROB_EPS) -> torch.Tensor:
    """logit(p) of the drafter's top-token probabilities, p clamped to [eps, 1 - eps] (finite at 0 and 1)."""
    return torch.logit(max_prob.clamp(eps, 1.0 - eps))


def calibrated_confidence(conf_logits: torch.Tensor, temperatures: torch.Tensor,
                          biases: torch.Tensor | None = None, max_prob: torch.Tensor | None = None,
                          max_prob_weights: torch.Tensor | None = None,
                          offsets: torch.Tensor | None = None, top_gap: torch.Tensor | None = None,
                          top_gap_weights: torch.Tensor | None = None) -> torch.Tensor:
    """sigmoid(z_k / T_k + b_k + w_k * logit(p_k) + v_k * g_k + o_k): conf_logits [B, G], temperatures [G]
    (positive), biases [G] or None (zeros), max_prob [B, G] (the drafter's top-token probability per slot) and
    max_prob_weights [G], or None (no max-probability term), top_gap [B, G] (the gap between the drafter's two
    largest logits per slot) and top_gap_weights [G], or None (no gap term), offsets [G] or None (zeros: an
    engine's online correction, dspark/online_calibration.py) -> [B, G] float32.

    With ``max_prob_weights`` the max probabilities are required (ValueError without them), with
    ``top_gap_weights`` the gaps; without weights a given score is not used. Sync-free (no value checks on device
    tensors): the calibration is validated where it is fitted or loaded (``dspark.training.calibration``,
    ``DSparkDrafter.set_confidence_temperatures``).
    """
    if conf_logits.dim() != 2:
        raise ValueError(f"conf_logits must be [B, G], got shape {tuple(conf_logits.shape)}")
    if temperatures.dim() != 1 or temperatures.shape[0] != conf_logits.shape[1]:
        raise ValueError(f"temperatures must be [G={conf_logits.shape[1]}], got shape {tuple(temperatures.shape)}; "
                         "fit one STS temperature per drafted position")
    z = conf_logits.float() / temperatures.to(device=conf_logits.device, dtype=torch.float32)
    if biases is not None:
        if biases.dim() != 1 or biases.shape[0] != conf_logits.shape[1]:
            raise ValueError(f"biases must be [G={conf_logits.shape[1]}], got shape {tuple(biases.shape)}; "
                             "fit one bias per drafted position (sts_bias)")
        z = z + biases.to(device=conf_logits.device, dtype=torch.float32)
    for name, score, weights, method, meaning, feature in (
            ("max_prob", max_prob, max_prob_weights, "sts_max_prob",
             "the drafter's top-token probability (the max of its softmax at each slot)", max_prob_logit),
            ("top_gap", top_gap, top_gap_weights, "sts_top_gap",
             "the gap between the drafter's two largest logits at each slot", None)):
        if weights is not None:
            z = z + _score_term(conf_logits, name, score, weights, method, meaning, feature)
    if offsets is not None:
        if offsets.dim() != 1 or offsets.shape[0] != conf_logits.shape[1]:
            raise ValueError(f"offsets must be [G={conf_logits.shape[1]}], got shape {tuple(offsets.shape)}")
        z = z + offsets.to(device=conf_logits.device, dtype=torch.float32)
    return torch.sigmoid(z)


def _score_term(conf_logits: torch.Tensor, name: str, score: torch.Tensor | None, weights: torch.Tensor,
                method: str, meaning: str, feature) -> torch.Tensor:
    """weights_k * feature(score) [B, G] for a calibration that weighs a drafter score (``feature`` None: the score
    itself), or ValueError naming the missing or misshapen input."""
    G = conf_logits.shape[1]
    if weights.dim() != 1 or weights.shape[0] != G:
        raise ValueError(f"{name}_weights must be [G={G}], got shape {tuple(weights.shape)}; fit one weight per "
                         f"drafted position ({method})")
    if score is None:
        raise ValueError(f"this confidence calibration ({method}) weighs {meaning}: pass {name} [B, G]")
    if score.shape != conf_logits.shape:
        raise ValueError(f"{name} must be [B, G] like conf_logits {tuple(conf_logits.shape)}, got shape "
                         f"{tuple(score.shape)}")
    x = score.to(device=conf_logits.device, dtype=torch.float32)
    return weights.to(device=conf_logits.device, dtype=torch.float32) * (x if feature is None else feature(x))


def prefix_survival(conf: torch.Tensor) -> torch.Tensor:
    """a_{r,j} = prod_{i<=j} c_{r,i}: conf [B, G] in [0, 1] -> survival [B, G], non-increasing along G."""
    if conf.dim() != 2:
        raise ValueError(f"conf must be [B, G], got shape {tuple(conf.shape)}")
    return torch.cumprod(conf, dim=1)


def neutral_survival_row(block: int, prior: Sequence[float] | None = None) -> list[float]:
    """The survival a recycled slot starts from: all NEUTRAL_CONFIDENCE, or a per-position prior.

    ``prior`` is a per-position *survival* (already cumulative), checked to lie in [0, 1]
    and be non-increasing, because the allocation relies on that order.
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if prior is None:
        return [NEUTRAL_CONFIDENCE] * block
    row = [float(p) for p in prior]
    if len(row) != block:
        raise ValueError(f"prior survival must have {block} values (one per position), got {len(row)}: {row}")
    if any(not (0.0 <= p <= 1.0) for p in row):
        raise ValueError(f"prior survival values must lie in [0, 1], got {row}")
    if any(row[j + 1] > row[j] for j in range(block - 1)):
        raise ValueError(f"prior survival must be non-increasing along positions (it is a cumulative product), got {row}")
    return row


def reset_slot_(buffer: torch.Tensor, slot: int, prior: Sequence[float] | None = None) -> None:
    """In place: make ``buffer[slot]`` ([S, G] slot-indexed survival) neutral for a newly admitted request.

    Written in place (``copy_``/``fill_``) so a CUDA graph that captured ``buffer`` sees it.
    """
    if buffer.dim() != 2:
        raise ValueError(f"survival buffer must be [num_slots, G], got shape {tuple(buffer.shape)}")
    if not 0 <= slot < buffer.shape[0]:
        raise IndexError(f"slot {slot} out of range for a buffer of {buffer.shape[0]} slots")
    if prior is None:
        buffer[slot].fill_(NEUTRAL_CONFIDENCE)
    else:
        row = neutral_survival_row(buffer.shape[1], prior)
        buffer[slot].copy_(torch.tensor(row, dtype=buffer.dtype))


def check_survival(survival: Sequence[Sequence[float]], *, name: str = "survival", atol: float = 0.0) -> None:
    """Host-side check that every row lies in [0, 1], has no NaN, and is non-increasing.

    The allocation's "each request's cells form a prefix" property depends on it; a row
    that rises means the caller passed per-position confidence instead of its cumulative product.
    """
    import numpy as np

    try:
        arr = np.asarray(survival, dtype=np.float64)
    except ValueError:  # ragged rows: checked one by one below
        arr = None
    if arr is not None and arr.ndim == 2:
        in_range = bool(((arr >= 0.0) & (arr <= 1.0)).all())  # False on NaN too
        falling = arr.shape[1] < 2 or bool((arr[:, 1:] <= arr[:, :-1] + atol).all())
        if in_range and falling:
            return  # the common case, vectorised: this runs on the host every planner step
    for r, row in enumerate(survival):  # locate and name the first offending value
        vals = [float(v) for v in row]
        for j, v in enumerate(vals):
            if not (0.0 <= v <= 1.0):  # also catches NaN
                raise ValueError(f"{name}[{r}][{j}] = {v!r} is outside [0, 1] (or NaN); survival is a probability")
        for j in range(len(vals) - 1):
            if vals[j + 1] > vals[j] + atol:
                raise ValueError(f"{name}[{r}] rises at position {j + 1} ({vals[j]!r} -> {vals[j + 1]!r}); pass the "
                                 "cumulative product of confidence (prefix_survival), not per-position confidence")


__all__ = ["MAX_PROB_EPS", "NEUTRAL_CONFIDENCE", "calibrated_confidence", "max_prob_logit", "prefix_survival",
           "neutral_survival_row", "reset_slot_", "check_survival"]
