"""Post-hoc calibration of the confidence head: sequential temperature scaling (STS), optionally with a bias,
or a logistic fit on the head and the drafter's top-token probability together.

The confidence head gives one logit z_k per block position; c_k = sigmoid(z_k / T_k) is
the probability that draft position k is accepted GIVEN that positions 1..k-1 were
(paper section 3.2.1). The scheduler needs the prefix survival S_k = prod_{i<=k} c_i
("the first k drafts are all accepted") in absolute terms, so STS calibrates S_k:
temperatures are fitted LEFT TO RIGHT, and T_k is the point of a log-spaced grid that
minimises the expected calibration error of S_k against the realised indicator
"positions 1..k all accepted", over all validation rows, with T_1..T_{k-1} frozen.
Temperature scaling keeps the order of the scores, so discrimination (AUC) is unchanged.

A temperature is a pure scale on the logit: it cannot fix a head whose confidence is BIASED
(e.g. too high on every block at position 1). ``sts_bias`` (:func:`fit_sequential_temperatures_biases`)
adds one bias per position, c_k = sigmoid(z_k / T_k + b_k), fitted the same way (left to right,
earlier positions frozen) by a 2-D grid search over (T_k, b_k) followed by a finer grid around the
coarse optimum, with a sharpness guard (near-ties in ECE go to the lower Brier score, so the fit
cannot flatten c_k to a constant). It also keeps the order of the scores within a position.

The drafter's own top-token probability p_k (the max of its softmax at slot k) may carry information the
head lacks. ``sts_max_prob`` (:func:`fit_max_prob_calibration`) combines both per position,
c_k = sigmoid(a_k z_k + w_k logit(p_k) + b_k), p_k clamped to [MAX_PROB_EPS, 1 - MAX_PROB_EPS] first
(``dspark.survival.max_prob_logit``). Unlike the two methods above it is a maximum-likelihood logistic
regression of the acceptance of position k on (z_k, logit(p_k)) over the REACHED cells (rows whose positions
1..k-1 were all accepted): c_k is a conditional probability, and the cumulative product of conditionals fitted
on reached cells is the prefix survival. It changes the order of the blocks within a position (a second
feature), so the AUC of its c_k is reported beside the head's alone. It is stored as T_k = 1 / a_k (a_k must
come out > 0: a head that ranks acceptance backwards next to p_k is refused), b_k and the weights w_k: the
head's part keeps the sts_bias form, and the file names its own method, which a reader that does not know it
refuses (it cannot drop the weights unnoticed). ``sts_top_gap`` (:func:`fit_top_gap_calibration`) is the same fit
with the gap g_k between the drafter's two largest logits in place of logit(p_k),
c_k = sigmoid(a_k z_k + v_k g_k + b_k): a score the greedy argmax's own pass gives with one more comparison per
logit and no softmax. Its weights are the list "top_gap_weights".

Inputs are plain tensors: ``conf_logits`` [M, G] raw confidence logits of M validation
blocks and ``accepted`` [M, G] with 0/1 realised acceptance per position, each row
verified over the whole block. Values after a row's first rejection are ignored (the
survival indicator is the cumulative product), so rows may hold anything 0/1 there.

Temperatures (and biases, zero for STS and for files written before biases existed; and, for
``sts_max_prob``, the list "max_prob_weights"; for ``sts_top_gap``, "top_gap_weights") live in
``temperatures.json`` beside the drafter checkpoint.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from scipy.stats import rankdata
from torch import Tensor

from dspark.survival import MAX_PROB_EPS, max_prob_logit

TEMPERATURES_FILE = "temperatures.json"
STS_METHOD = "sequential_temperature_scaling"
STS_BIAS_METHOD = "sequential_temperature_bias_scaling"
STS_MAX_PROB_METHOD = "head_and_max_prob_logistic_regression"
STS_TOP_GAP_METHOD = "head_and_top_gap_logistic_regression"
# config name -> name written in the files
METHODS = {"sts": STS_METHOD, "sts_bias": STS_BIAS_METHOD, "sts_max_prob": STS_MAX_PROB_METHOD,
           "sts_top_gap": STS_TOP_GAP_METHOD}
CONFIG_NAMES = {written: name for name, written in METHODS.items()}  # name written in the files -> config name


class Calibration(NamedTuple):
    """A drafter's confidence calibration as :func:`load_calibration` reads it: float32 temperatures [G] and
    biases [G], the max-probability weights [G] of sts_max_prob and the top-gap weights [G] of sts_top_gap (each
    None where the calibration does not weigh that score)."""

    temperatures: Tensor
    biases: Tensor
    max_prob_weights: Tensor | None
    top_gap_weights: Tensor | None = None

    @property
    def method(self) -> str:
        """What this calibration does, by its config name: ``sts_max_prob`` (max-probability weights),
        ``sts_top_gap`` (top-gap weights), ``sts_bias`` (a bias not 0), ``sts`` (a temperature not 1) or
        ``none`` (the raw head)."""
        return calibration_method(self.temperatures.tolist(), self.biases.tolist(), self.max_prob_weights is not None,
                                  self.top_gap_weights is not None)

    def as_lists(self) -> tuple[list[float], list[float], list[float] | None, list[float] | None]:
        """(temperatures, biases, max_prob_weights, top_gap_weights) as host lists (None where not weighed), as
        ``DSparkDrafter.set_confidence_temperatures`` takes them."""
        return (self.temperatures.tolist(), self.biases.tolist(),
                None if self.max_prob_weights is None else self.max_prob_weights.tolist(),
                None if self.top_gap_weights is None else self.top_gap_weights.tolist())


def calibration_dir(path: str | Path) -> Path:
    """The folder of a calibration given as its temperatures.json or as the folder holding it
    (engine.confidence_calibration takes either)."""
    where = Path(path)
    if where.name == TEMPERATURES_FILE:
        return where.parent
    if where.is_file():
        raise FileNotFoundError(f"{where} is a file, not a calibration: give the {TEMPERATURES_FILE} that "
                                f"runners.calibrate writes (or the folder holding it)")
    return where


def calibration_method_of(path: str | Path) -> str:
    """The config name of what the calibration at ``path`` (a temperatures.json or its folder) does, as
    :func:`load_calibration` reads it (checked against its own length: a drafter loading it checks the block)."""
    return load_calibration(calibration_dir(path), None).method


def calibration_method(temperatures: list[float], biases: list[float], weighs_max_prob: bool,
                       weighs_top_gap: bool = False) -> str:
    """The config name of what a calibration with these values does (the name the engine's counters use)."""
    if weighs_max_prob:
        return "sts_max_prob"
    if weighs_top_gap:
        return "sts_top_gap"
    if any(b != 0.0 for b in biases):
        return "sts_bias"
    if any(t != 1.0 for t in temperatures):
        return "sts"
    return "none"


def _as_float64(x: Any, name: str) -> Tensor:
    t = x.detach().to("cpu", torch.float64) if isinstance(x, Tensor) else torch.as_tensor(x, dtype=torch.float64)
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} holds non-finite values (NaN or inf); clean the validation data first")
    return t


def _check_block_inputs(conf_logits: Any, accepted: Any) -> tuple[Tensor, Tensor]:
    z = _as_float64(conf_logits, "conf_logits")
    a = _as_float64(accepted, "accepted")
    if z.dim() != 2:
        raise ValueError(f"conf_logits must be [M, G] (rows x block positions), got shape {tuple(z.shape)}")
    if a.shape != z.shape:
        raise ValueError(f"accepted shape {tuple(a.shape)} must equal conf_logits shape {tuple(z.shape)}")
    if z.shape[0] == 0 or z.shape[1] == 0:
        raise ValueError(f"need at least one row and one position, got shape {tuple(z.shape)}")
    if not bool(((a == 0) | (a == 1)).all()):
        raise ValueError("accepted must hold 0/1 realised acceptance outcomes; found other values")
    return z, a


def _check_temperatures(temperatures: Any, block_size: int) -> Tensor:
    t = _as_float64(temperatures, "temperatures").reshape(-1)
    if t.numel() != block_size:
        raise ValueError(f"got {t.numel()} temperatures for a block of {block_size} positions; "
                         f"fit one temperature per position")
    if not bool((t > 0).all()):
        raise ValueError(f"temperatures must be > 0, got {t.tolist()}")
    return t


def _check_per_position(values: Any, block_size: int, name: str, one: str, remedy: str = "") -> Tensor:
    """float64 [block_size] of a list of finite numbers, one per position, or ValueError naming ``name`` (``one``:
    what a single value is called, ``remedy``: said after the count is wrong)."""
    if isinstance(values, (str, bytes, dict)) or (not isinstance(values, Tensor) and not hasattr(values, "__len__")):
        raise ValueError(f"{name} must be a list of {block_size} finite numbers (one per position), got {values!r}")
    try:
        v = _as_float64(values, name).reshape(-1)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a list of {block_size} finite numbers (one per position): {e}") from None
    if v.numel() != block_size:
        raise ValueError(f"got {v.numel()} {name} for a block of {block_size} positions; fit one {one} per "
                         f"position{remedy}")
    return v


def _check_biases(biases: Any, block_size: int) -> Tensor:
    if biases is None:
        return torch.zeros(block_size, dtype=torch.float64)
    return _check_per_position(biases, block_size, "biases", "bias", " (or leave biases out: zeros)")


def _check_max_prob(max_prob: Any, shape: torch.Size) -> Tensor:
    p = _as_float64(max_prob, "max_prob")
    if p.shape != shape:
        raise ValueError(f"max_prob shape {tuple(p.shape)} must equal conf_logits shape {tuple(shape)} (the "
                         f"drafter's top-token probability of every block position)")
    if bool(((p < 0) | (p > 1)).any()):
        raise ValueError("max_prob must hold probabilities in [0, 1] (the max of the drafter's softmax per slot)")
    return p


def _check_top_gap(top_gap: Any, shape: torch.Size) -> Tensor:
    g = _as_float64(top_gap, "top_gap")
    if g.shape != shape:
        raise ValueError(f"top_gap shape {tuple(g.shape)} must equal conf_logits shape {tuple(shape)} (the gap "
                         f"between the drafter's two largest logits at every block position)")
    if bool((g < 0).any()):
        raise ValueError("top_gap must be >= 0 (the largest logit minus the second largest, per slot)")
    return g


def _check_fused(shape: torch.Size, max_prob: Any = None, max_prob_weights: Any = None, top_gap: Any = None,
                 top_gap_weights: Any = None) -> dict[str, Tensor]:
    """The drafter score a calibration weighs, checked, as keyword arguments of :func:`calibrated_confidence`:
    ``{max_prob, max_prob_weights}`` (sts_max_prob), ``{top_gap, top_gap_weights}`` (sts_top_gap) or ``{}``
    without weights (a score alone is not used). A calibration weighs one score at most."""
    if max_prob_weights is not None and top_gap_weights is not None:
        raise ValueError("a calibration weighs one drafter score at most: give max_prob_weights (sts_max_prob) or "
                         "top_gap_weights (sts_top_gap), not both")
    for name, score, weights, method, check, meaning in (
            ("max_prob", max_prob, max_prob_weights, "sts_max_prob", _check_max_prob,
             "the drafter's top-token probability"),
            ("top_gap", top_gap, top_gap_weights, "sts_top_gap", _check_top_gap,
             "the gap between the drafter's two largest logits")):
        if weights is None:
            continue
        w = _check_per_position(weights, shape[-1], f"{name}_weights", "weight")
        if score is None:
            raise ValueError(f"{name}_weights ({method}) need {name}: {meaning} of every block [M, G] (the replay's "
                             f"draft_{name})")
        return {name: check(score, shape), f"{name}_weights": w}
    return {}


def survival_indicator(accepted: Tensor) -> Tensor:
    """Realised prefix survival [M, G]: 1 where positions 1..k of the row were all accepted."""
    return torch.cumprod(torch.as_tensor(accepted), dim=-1)


def calibrated_confidence(conf_logits: Tensor, temperatures: Tensor, biases: Tensor | None = None,
                          max_prob: Tensor | None = None, max_prob_weights: Tensor | None = None,
                          top_gap: Tensor | None = None, top_gap_weights: Tensor | None = None) -> Tensor:
    """Per-position conditional confidence sigmoid(z_k / T_k + b_k + w_k * logit(p_k) + v_k * g_k); temperatures /
    biases / max_prob_weights / top_gap_weights [G] broadcast over rows, max_prob [..., G] the drafter's
    top-token probabilities, top_gap [..., G] the gaps between its two largest logits.

    ``biases`` None: zeros (plain STS). ``max_prob_weights`` None: no max-probability term (``max_prob`` is not
    used); with weights, ``max_prob`` is required (p clamped as :func:`dspark.survival.max_prob_logit` does). The
    same holds for ``top_gap_weights`` and ``top_gap``.
    """
    t = torch.as_tensor(temperatures, dtype=conf_logits.dtype, device=conf_logits.device)
    x = conf_logits / t
    if biases is not None:
        x = x + torch.as_tensor(biases, dtype=conf_logits.dtype, device=conf_logits.device)
    if max_prob_weights is not None:
        if max_prob is None:
            raise ValueError("max_prob_weights (sts_max_prob) need max_prob, the drafter's top-token probabilities")
        w = torch.as_tensor(max_prob_weights, dtype=conf_logits.dtype, device=conf_logits.device)
        x = x + w * max_prob_logit(torch.as_tensor(max_prob, dtype=conf_logits.dtype, device=conf_logits.device))
    if top_gap_weights is not None:
        if top_gap is None:
            raise ValueError("top_gap_weights (sts_top_gap) need top_gap, the gaps between the drafter's two largest "
                             "logits")
        v = torch.as_tensor(top_gap_weights, dtype=conf_logits.dtype, device=conf_logits.device)
        x = x + v * torch.as_tensor(top_gap, dtype=conf_logits.dtype, device=conf_logits.device)
    return torch.sigmoid(x)


def cumulative_survival(conf_logits: Tensor, temperatures: Tensor, biases: Tensor | None = None,
                        max_prob: Tensor | None = None, max_prob_weights: Tensor | None = None,
                        top_gap: Tensor | None = None, top_gap_weights: Tensor | None = None) -> Tensor:
    """Predicted prefix survival S_k = prod_{i<=k} c_i along the last axis (c as :func:`calibrated_confidence`)."""
    return torch.cumprod(calibrated_confidence(conf_logits, temperatures, biases, max_prob, max_prob_weights,
                                               top_gap, top_gap_weights), dim=-1)


def temperature_grid(n_grid: int = 100, t_min: float = 0.2, t_max: float = 10.0) -> Tensor:
    """Log-spaced candidate temperatures, float64 [n_grid], from t_min to t_max inclusive."""
    if n_grid < 2:
        raise ValueError(f"n_grid must be >= 2, got {n_grid}")
    if not (0 < t_min < t_max and math.isfinite(t_max)):
        raise ValueError(f"need 0 < t_min < t_max < inf, got t_min={t_min}, t_max={t_max}")
    return torch.logspace(math.log10(t_min), math.log10(t_max), n_grid, dtype=torch.float64)


def _ece_rows(prob: Tensor, outcome: Tensor, n_bins: int) -> Tensor:
    """ECE of every row of prob [K, M] against outcome [M] (or [K, M]); returns [K].

    Equal-width bins over [0, 1] (1.0 falls in the last bin); sum over bins of
    (n_b / M) * |mean prob_b - mean outcome_b| = sum_b |sum prob_b - sum outcome_b| / M.
    """
    k, m = prob.shape
    bins = (prob * n_bins).floor().clamp_(0, n_bins - 1).long()
    outcome = outcome.expand(k, m).to(prob.dtype)
    sum_prob = torch.zeros(k, n_bins, dtype=prob.dtype).scatter_add_(1, bins, prob)
    sum_out = torch.zeros(k, n_bins, dtype=prob.dtype).scatter_add_(1, bins, outcome)
    return (sum_prob - sum_out).abs().sum(1) / m


def expected_calibration_error(prob: Any, outcome: Any, n_bins: int = 15) -> float:
    """Expected calibration error of predicted probabilities prob [M] against 0/1 outcomes [M].

    Equal-width bins on [0, 1], each weighted by its share of samples.
    """
    p = _as_float64(prob, "prob").reshape(-1)
    o = _as_float64(outcome, "outcome").reshape(-1)
    if p.shape != o.shape:
        raise ValueError(f"prob has {p.numel()} values but outcome has {o.numel()}; they must pair up")
    if p.numel() == 0:
        raise ValueError("expected_calibration_error needs at least one sample")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    if bool(((p < 0) | (p > 1)).any()):
        raise ValueError("prob must lie in [0, 1]; apply a sigmoid to logits first")
    if not bool(((o == 0) | (o == 1)).all()):
        raise ValueError("outcome must hold 0/1 values")
    return float(_ece_rows(p[None, :], o, n_bins)[0])


def roc_auc(scores: Any, labels: Any) -> float:
    """ROC-AUC by the Mann-Whitney rank statistic; tied scores get their average rank.

    Equals P(score of a random positive > score of a random negative) + 0.5 P(tie).
    """
    s = _as_float64(scores, "scores").reshape(-1).numpy()
    y = _as_float64(labels, "labels").reshape(-1).numpy()
    if s.shape != y.shape:
        raise ValueError(f"scores has {s.size} values but labels has {y.size}; they must pair up")
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("labels must hold 0/1 values")
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"ROC-AUC needs both classes; got {n_pos} positives and {n_neg} negatives")
    ranks = rankdata(s, method="average")
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def fit_sequential_temperatures(
    conf_logits: Any,
    accepted: Any,
    *,
    n_grid: int = 100,
    t_min: float = 0.2,
    t_max: float = 10.0,
    n_bins: int = 15,
) -> Tensor:
    """Fit one temperature per block position by STS; returns float32 [G].

    Position k takes the grid temperature minimising the ECE of the cumulative product
    prod_{i<=k} sigmoid(z_i / T_i) against "positions 1..k all accepted" over all M
    rows, with T_1..T_{k-1} already fixed. Ties (e.g. a position whose logits are all 0)
    go to the candidate closest to 1 in log scale, i.e. the smallest change.
    """
    z, a = _check_block_inputs(conf_logits, accepted)
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    grid = temperature_grid(n_grid, t_min, t_max)
    survived = survival_indicator(a)
    distance_from_one = grid.log().abs()
    prefix = torch.ones(z.shape[0], dtype=torch.float64)  # calibrated S_{k-1} per row
    temperatures = []
    for k in range(z.shape[1]):
        candidates = prefix[None, :] * torch.sigmoid(z[None, :, k] / grid[:, None])  # [n_grid, M]
        ece = _ece_rows(candidates, survived[:, k], n_bins)
        best = torch.nonzero(ece <= ece.min() + 1e-12).reshape(-1)
        choice = best[distance_from_one[best].argmin()]
        temperatures.append(float(grid[choice]))
        prefix = candidates[choice]
    return torch.tensor(temperatures, dtype=torch.float32)


def bias_grid(n_bias: int = 81, b_max: float = 4.0) -> Tensor:
    """Evenly spaced candidate biases, float64 [n_bias], from -b_max to b_max; n_bias odd so that 0 is on it."""
    if isinstance(n_bias, bool) or int(n_bias) < 3 or int(n_bias) % 2 == 0:
        raise ValueError(f"n_bias must be an odd integer >= 3 (so that bias 0 is a candidate), got {n_bias}")
    if not (0 < b_max < math.inf):
        raise ValueError(f"b_max must be finite and > 0, got {b_max}")
    return torch.linspace(-float(b_max), float(b_max), int(n_bias), dtype=torch.float64)


def _scores(prefix: Tensor, z: Tensor, outcome: Tensor, temps: Tensor, biases: Tensor, n_bins: int,
            max_elements: int = 1 << 23) -> tuple[Tensor, Tensor]:
    """ECE and Brier score [len(temps), len(biases)] of prefix * sigmoid(z / T + b) against outcome, per (T, b).

    Evaluated in slices of temperatures so that at most ``max_elements`` candidate values exist at once.
    """
    m = z.shape[0]
    n_t, n_b = temps.numel(), biases.numel()
    step = max(1, max_elements // max(1, n_b * m))
    ece = torch.empty(n_t, n_b, dtype=torch.float64)
    brier = torch.empty(n_t, n_b, dtype=torch.float64)
    for i in range(0, n_t, step):
        t = temps[i: i + step]
        cand = (prefix[None, None, :] * torch.sigmoid(z[None, None, :] / t[:, None, None]
                                                      + biases[None, :, None])).reshape(-1, m)
        ece[i: i + step] = _ece_rows(cand, outcome, n_bins).view(t.numel(), n_b)
        brier[i: i + step] = ((cand - outcome[None, :]) ** 2).mean(1).view(t.numel(), n_b)
    return ece, brier


def _pick(ece: Tensor, brier: Tensor, change: Tensor, tolerance: float) -> int:
    """Index of the chosen candidate (flat tensors): among those within ``tolerance`` of the smallest ECE, the
    lowest Brier score, then the smallest change |ln T| + |b|, then the first."""
    near = torch.nonzero(ece <= ece.min() + max(float(tolerance), 1e-12)).reshape(-1)
    near = near[brier[near] <= brier[near].min() + 1e-15]
    return int(near[change[near].argmin()])


def fit_sequential_temperatures_biases(
    conf_logits: Any,
    accepted: Any,
    *,
    n_grid: int = 100,
    t_min: float = 0.2,
    t_max: float = 10.0,
    n_bias: int = 81,
    b_max: float = 4.0,
    refine: int = 21,
    ece_tolerance: float = 0.002,
    n_bins: int = 15,
) -> tuple[Tensor, Tensor]:
    """Fit one temperature AND one bias per position, left to right; returns float32 (temperatures [G], biases [G]).

    c_k = sigmoid(z_k / T_k + b_k). Position k takes the (T, b) pair minimising the ECE of the
    cumulative product prod_{i<=k} c_i against "positions 1..k all accepted" over all M rows, with
    positions 1..k-1 already fixed (as :func:`fit_sequential_temperatures`): over the product of the
    log-spaced temperature grid (n_grid in [t_min, t_max]) and the bias grid (n_bias evenly spaced in
    [-b_max, b_max]), plus (``refine`` > 1) a ``refine`` x ``refine`` grid spanning one coarse step
    either side of the coarse optimum.

    Sharpness guard: with a free bias, a large T and b = logit(base rate) make c_k nearly CONSTANT,
    and a constant at the base rate is perfectly calibrated, so a pure ECE argmin drifts toward
    flattening c_k (dropping the head's information) whenever that wins by sampling noise. Among the
    candidates within ``ece_tolerance`` (absolute, default 0.2 points, below the sampling noise of
    ECE on a few thousand blocks) of the smallest ECE, the one with the lowest Brier score of the
    cumulative product (a proper score: it rewards sharpness) is taken; ``ece_tolerance=0`` is the
    pure ECE argmin. Remaining ties go to the smallest change |ln T| + |b|.
    """
    z, a = _check_block_inputs(conf_logits, accepted)
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    if isinstance(refine, bool) or int(refine) < 0:
        raise ValueError(f"refine must be an integer >= 0 (0 or 1: no refinement), got {refine}")
    if isinstance(ece_tolerance, bool) or not 0.0 <= float(ece_tolerance) < 1.0:
        raise ValueError(f"ece_tolerance must be in [0, 1) (0: pure ECE argmin), got {ece_tolerance}")
    temps = temperature_grid(n_grid, t_min, t_max)
    bias_values = bias_grid(n_bias, b_max)
    log_step = (math.log(t_max) - math.log(t_min)) / (n_grid - 1)
    b_step = 2.0 * float(b_max) / (int(n_bias) - 1)
    survived = survival_indicator(a)
    prefix = torch.ones(z.shape[0], dtype=torch.float64)
    fitted_t, fitted_b = [], []
    for k in range(z.shape[1]):
        zk, outcome = z[:, k], survived[:, k]
        ece, brier = _scores(prefix, zk, outcome, temps, bias_values, n_bins)
        cand_t = temps[:, None].expand_as(ece).reshape(-1)
        cand_b = bias_values[None, :].expand_as(ece).reshape(-1)
        ece, brier = ece.reshape(-1), brier.reshape(-1)
        if int(refine) > 1:
            i = _pick(ece, brier, cand_t.log().abs() + cand_b.abs(), ece_tolerance)
            lt, b0 = math.log(float(cand_t[i])), float(cand_b[i])
            fine_t = torch.linspace(max(math.log(t_min), lt - log_step), min(math.log(t_max), lt + log_step),
                                    int(refine), dtype=torch.float64).exp()
            fine_b = torch.linspace(max(-b_max, b0 - b_step), min(b_max, b0 + b_step), int(refine),
                                    dtype=torch.float64)
            fine_ece, fine_brier = _scores(prefix, zk, outcome, fine_t, fine_b, n_bins)
            cand_t = torch.cat([cand_t, fine_t[:, None].expand_as(fine_ece).reshape(-1)])
            cand_b = torch.cat([cand_b, fine_b[None, :].expand_as(fine_ece).reshape(-1)])
            ece, brier = torch.cat([ece, fine_ece.reshape(-1)]), torch.cat([brier, fine_brier.reshape(-1)])
        i = _pick(ece, brier, cand_t.log().abs() + cand_b.abs(), ece_tolerance)
        t_best, b_best = float(cand_t[i]), float(cand_b[i])
        fitted_t.append(t_best)
        fitted_b.append(b_best)
        prefix = prefix * torch.sigmoid(zk / t_best + b_best)
    return torch.tensor(fitted_t, dtype=torch.float32), torch.tensor(fitted_b, dtype=torch.float32)


def _logistic_mle(x: np.ndarray, y: np.ndarray, gtol: float = 1e-7) -> tuple[np.ndarray, bool]:
    """Maximum-likelihood coefficients of P(y = 1) = sigmoid(x @ theta) (x [n, d], y [n] 0/1) by a trust-region
    Newton method (the mean negative log-likelihood is convex: any start converges where a finite maximum
    exists); (theta, converged). Converged: finite, the gradient of the mean below ``gtol``, and the mean
    negative log-likelihood not ~0 (which is what perfectly separable outcomes approach as theta grows)."""
    from scipy.optimize import minimize
    from scipy.special import expit

    n = x.shape[0]

    def nll(theta: np.ndarray) -> tuple[float, np.ndarray]:
        s = x @ theta
        return float((np.logaddexp(0.0, s) - y * s).sum() / n), x.T @ (expit(s) - y) / n

    def hess(theta: np.ndarray) -> np.ndarray:
        q = expit(x @ theta)
        return (x * (q * (1.0 - q))[:, None]).T @ x / n

    res = minimize(nll, np.zeros(x.shape[1]), jac=True, hess=hess, method="trust-exact",
                   options={"gtol": gtol, "maxiter": 500})
    theta = res.x
    if not np.all(np.isfinite(theta)):
        return theta, False
    value, grad = nll(theta)
    return theta, bool(np.abs(grad).max() <= gtol and value > 1e-6)


def fit_max_prob_calibration(conf_logits: Any, max_prob: Any, accepted: Any, *, eps: float = MAX_PROB_EPS
                             ) -> Calibration:
    """Fit c_k = sigmoid(a_k z_k + w_k logit(p_k) + b_k) per position by maximum likelihood (sts_max_prob).

    ``max_prob`` [M, G]: the drafter's top-token probability at every slot (the replay's ``draft_max_prob``),
    clamped to [eps, 1 - eps] before the logit. Position k is fitted on the cells that reached it (positions
    1..k-1 all accepted, :func:`reached_cells`) against the acceptance of k, so c_k is the conditional
    acceptance and the cumulative product the prefix survival. Returns a :class:`Calibration` of float32
    tensors: temperatures 1 / a_k, biases b_k, max_prob_weights w_k.

    ValueError where a position has no finite fit: its reached cells are all accepted or all rejected (or
    there are none), or separate perfectly; or where a_k <= 0 (the head ranks acceptance backwards once p_k is
    known: no positive temperature represents it), naming the position.
    """
    z, a = _check_block_inputs(conf_logits, accepted)
    p = _check_max_prob(max_prob, z.shape)
    if isinstance(eps, bool) or not 0.0 < float(eps) < 0.5:
        raise ValueError(f"eps must be in (0, 0.5) (max_prob is clamped to [eps, 1 - eps]), got {eps!r}")
    t, b, w = _fit_head_and_score(z, max_prob_logit(p, float(eps)), a, "the max probability",
                                  "engine.acceptance_estimate=draft_max_prob")
    return Calibration(t, b, w)


def fit_top_gap_calibration(conf_logits: Any, top_gap: Any, accepted: Any) -> Calibration:
    """Fit c_k = sigmoid(a_k z_k + v_k g_k + b_k) per position by maximum likelihood (sts_top_gap).

    ``top_gap`` [M, G]: the gap between the drafter's two largest logits at every slot (the replay's
    ``draft_top_gap``). Fitted as :func:`fit_max_prob_calibration`, with the same errors; returns a
    :class:`Calibration` of float32 tensors: temperatures 1 / a_k, biases b_k, top_gap_weights v_k.
    """
    z, a = _check_block_inputs(conf_logits, accepted)
    t, b, v = _fit_head_and_score(z, _check_top_gap(top_gap, z.shape), a, "the top-2 gap", "sts_max_prob")
    return Calibration(t, b, None, v)


def _fit_head_and_score(z: Tensor, x_all: Tensor, a: Tensor, score: str, other: str
                        ) -> tuple[Tensor, Tensor, Tensor]:
    """Per position, the logistic fit of acceptance on (z_k, x_k, 1) over the reached cells: float32
    (temperatures 1 / a_k, biases, weights of x). ``score`` names x in errors, ``other`` is the remedy offered
    beside sts_bias."""
    reached = reached_cells(a)
    temperatures, biases, weights = [], [], []
    for k in range(z.shape[1]):
        rows = reached[:, k]
        y = a[rows, k].numpy()
        n, n_pos = int(y.size), int(y.sum())
        if n_pos == 0 or n_pos == n:
            raise ValueError(f"position {k + 1}: {n} blocks reached it and {n_pos} were accepted there; the logistic "
                             f"fit needs both outcomes at every position: calibrate on more blocks, or use sts_bias")
        x = np.stack([z[rows, k].numpy(), x_all[rows, k].numpy(), np.ones(n)], axis=1)
        theta, ok = _logistic_mle(x, y)
        if not ok:
            raise ValueError(f"position {k + 1}: the logistic fit on its {n} reached blocks did not converge to "
                             f"finite coefficients (the outcomes may be separable by the head and {score}); "
                             f"calibrate on more blocks, or use sts_bias")
        a_k, w_k, b_k = (float(v) for v in theta)
        if not a_k > 0.0:
            raise ValueError(f"position {k + 1}: the fitted head coefficient a = {a_k:.4g} is not > 0 (with "
                             f"{score}'s weight w = {w_k:.4g}), so no positive temperature T = 1 / a "
                             f"represents it: next to {score} the head ranks acceptance backwards "
                             f"or not at all there; use sts_bias, or {other}")
        temperatures.append(1.0 / a_k)
        biases.append(b_k)
        weights.append(w_k)
    return (torch.tensor(temperatures, dtype=torch.float32), torch.tensor(biases, dtype=torch.float32),
            torch.tensor(weights, dtype=torch.float32))


def _auc_or_none(scores: Tensor, labels: Tensor) -> float | None:
    """:func:`roc_auc`, or None where it is undefined (no rows, or every label the same)."""
    if labels.numel() == 0 or bool((labels == labels[0]).all()):
        return None
    return roc_auc(scores, labels)


def reached_cells(accepted: Tensor) -> Tensor:
    """bool [M, G]: the cells each block reached (every earlier position accepted)."""
    survived = survival_indicator(accepted)
    return torch.cat([torch.ones(accepted.shape[0], 1, dtype=torch.bool), survived[:, :-1].bool()], dim=1)


def acceptance_per_position(accepted: Tensor) -> list[float | None]:
    """Per position, the acceptance among the blocks that reached it (:func:`reached_cells`); None where none did."""
    reached = reached_cells(accepted)
    count, accepted_at = reached.sum(0), (accepted * reached).sum(0)
    return [float(accepted_at[k] / count[k]) if count[k] > 0 else None for k in range(accepted.shape[1])]


def conditional_auc(scores: Any, accepted: Any) -> dict[str, Any]:
    """How well ``scores`` [M, G] (any per-slot confidence; only their order matters) rank acceptance: per
    position k, the AUC of scores[:, k] against acceptance of k among the rows that reached k
    (:func:`reached_cells`); ``auc_overall`` pools every reached cell; None where undefined."""
    s, a = _check_block_inputs(scores, accepted)
    reached = reached_cells(a)
    return {"auc_per_position": [_auc_or_none(s[reached[:, k], k], a[reached[:, k], k]) for k in range(s.shape[1])],
            "auc_overall": _auc_or_none(s[reached], a[reached])}


def calibration_report(conf_logits: Any, accepted: Any, temperatures: Any, biases: Any = None, *,
                       n_bins: int = 15, max_prob: Any = None, max_prob_weights: Any = None, top_gap: Any = None,
                       top_gap_weights: Any = None) -> dict[str, Any]:
    """Discrimination and calibration of the confidence head, as JSON-ready plain values.

    AUC: per position, sigmoid(z_k) against acceptance of k among the rows that reached k
    (positions < k all accepted); ``auc_overall`` pools all reached cells. A position whose
    reached rows are all accepted or all rejected has AUC None (undefined).
    ECE: of the cumulative product against prefix survival over all rows, per position,
    before (T = 1) and after STS; ``ece_before`` / ``ece_after`` are the means over positions.
    With ``biases`` (sts_bias) "after" is sigmoid(z / T + b), the report's method is sts_bias and it
    carries the biases; without, it is exactly the STS report. ``survival_auc_*`` / ``brier_*``: per
    position, AUC and Brier score of the cumulative product against prefix survival over all rows,
    before and after (calibration must not buy its ECE by flattening the survival it predicts).
    With ``max_prob_weights`` (sts_max_prob; ``max_prob`` [M, G] then required) "after" is the fused
    confidence sigmoid(z / T + b + w logit(p)), the method is sts_max_prob, the report carries the biases
    and the weights, ``auc_per_position`` / ``auc_overall`` are the fused confidence's (a second feature
    changes the order within a position) and ``head_auc`` holds the head's alone (sigmoid(z)), as
    :func:`conditional_auc` gives it. "before" stays the raw head (T = 1, no max probability). With
    ``top_gap_weights`` (sts_top_gap; ``top_gap`` [M, G] then required) the same for the fused confidence
    sigmoid(z / T + b + v g), and the report carries "top_gap_weights".
    """
    z, a = _check_block_inputs(conf_logits, accepted)
    g = z.shape[1]
    t = _check_temperatures(temperatures, g)
    fused = _check_fused(z.shape, max_prob, max_prob_weights, top_gap, top_gap_weights)
    b = _check_biases(biases, g) if biases is not None or fused else None
    survived = survival_indicator(a)
    head_discrimination = conditional_auc(torch.sigmoid(z), a)
    discrimination = conditional_auc(calibrated_confidence(z, t, b, **fused), a) if fused else head_discrimination
    before = cumulative_survival(z, torch.ones(g, dtype=torch.float64))
    after = cumulative_survival(z, t, b, **fused)
    ece_before = [float(_ece_rows(before[:, k][None], survived[:, k], n_bins)[0]) for k in range(g)]
    ece_after = [float(_ece_rows(after[:, k][None], survived[:, k], n_bins)[0]) for k in range(g)]
    reached_count = reached_cells(a).sum(0)
    extra: dict[str, Any] = {}
    if b is not None:
        extra["biases"] = [float(v) for v in b]
    for key in ("max_prob_weights", "top_gap_weights"):
        if key in fused:
            extra[key] = [float(v) for v in fused[key]]
    if fused:
        extra["head_auc"] = head_discrimination
    extra.update({
        "survival_auc_before_per_position": [_auc_or_none(before[:, k], survived[:, k]) for k in range(g)],
        "survival_auc_after_per_position": [_auc_or_none(after[:, k], survived[:, k]) for k in range(g)],
        "brier_before_per_position": [float(((before[:, k] - survived[:, k]) ** 2).mean()) for k in range(g)],
        "brier_after_per_position": [float(((after[:, k] - survived[:, k]) ** 2).mean()) for k in range(g)],
    })
    return {
        "method": _method_written(b is not None, fused),
        "num_rows": int(z.shape[0]),
        "block_size": g,
        "n_bins": n_bins,
        "temperatures": [float(v) for v in t],
        **extra,
        "reached_per_position": [int(v) for v in reached_count],
        "acceptance_per_position": acceptance_per_position(a),
        **discrimination,
        "ece_before_per_position": ece_before,
        "ece_after_per_position": ece_after,
        "ece_before": float(np.mean(ece_before)),
        "ece_after": float(np.mean(ece_after)),
    }


def split_sequences(seq_index: Any, fit_fraction: float, seed: int, *, min_sequences: int = 2
                    ) -> tuple[Tensor, Tensor]:
    """Split the sequences present in ``seq_index`` [M] into a fit part and a report part.

    The split is BY SEQUENCE (every block of a sequence lands on the same side, so the
    report part is out of sample: blocks of one sequence are strongly correlated) and seeded:
    a permutation of the distinct sequence ids drawn from ``seed``, the first
    round(fit_fraction * n) of it (at least ``min_sequences``, and at least ``min_sequences``
    left) fit. Returns boolean masks over the M blocks ``(fit, report)``, disjoint and covering.
    """
    idx = torch.as_tensor(seq_index).reshape(-1).long().cpu()
    if isinstance(fit_fraction, bool) or not isinstance(fit_fraction, (int, float)) or not math.isfinite(fit_fraction) \
            or not 0.0 < float(fit_fraction) < 1.0:
        raise ValueError(f"fit_fraction must be a number strictly between 0 and 1 (e.g. 0.5), got {fit_fraction!r}")
    seqs = torch.unique(idx)
    n = int(seqs.numel())
    n_fit = int(round(float(fit_fraction) * n))
    if n_fit < min_sequences or n - n_fit < min_sequences:
        raise ValueError(f"fit_fraction={fit_fraction} splits {n} sequences into {n_fit} to fit and {n - n_fit} to "
                         f"report; each part needs at least {min_sequences}: give more held-out sequences "
                         f"(at least {2 * min_sequences}) or a fit_fraction nearer 0.5")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    fit_seqs = seqs[order[:n_fit]]
    fit = torch.isin(idx, fit_seqs)
    return fit, ~fit


def bootstrap_ece(conf_logits: Any, accepted: Any, temperatures: Any, seq_index: Any, *, n_resamples: int = 200,
                  seed: int = 0, n_bins: int = 15, confidence: float = 0.95, biases: Any = None,
                  max_prob: Any = None, max_prob_weights: Any = None, top_gap: Any = None,
                  top_gap_weights: Any = None) -> dict[str, Any]:
    """Bootstrap interval of the mean-over-positions ECE of the cumulative survival (fixed temperatures,
    and biases when given: sigmoid(z / T + b); with ``max_prob_weights`` and ``max_prob`` the fused
    sts_max_prob confidence sigmoid(z / T + b + w logit(p)), with ``top_gap_weights`` and ``top_gap`` the
    sts_top_gap one).

    Resamples SEQUENCES with replacement (``seq_index`` [M] names each block's sequence), so
    the interval reflects the correlation of blocks within a sequence; each resample's ECE is
    exactly :func:`calibration_report`'s ``ece_after`` on the blocks of the drawn sequences
    (duplicates counted as often as drawn). The temperatures are held fixed: the interval is
    the evaluation noise of these temperatures, not of refitting them. Percentile interval;
    because ECE is a sum of absolute values, resamples are biased upward, so the upper end is
    conservative for a claim "ECE <= x" (for a nearly calibrated predictor the whole interval can
    sit above the point estimate). ``noise_floor`` is the mean ECE, over ``n_resamples`` draws
    (at most 50), of outcomes simulated from the predictions themselves: what a PERFECTLY
    calibrated predictor would score on this many blocks, i.e. the smallest ECE this data can
    resolve. Deterministic given ``seed``.
    """
    z, a = _check_block_inputs(conf_logits, accepted)
    g = z.shape[1]
    t = _check_temperatures(temperatures, g)
    b = None if biases is None else _check_biases(biases, g)
    fused = _check_fused(z.shape, max_prob, max_prob_weights, top_gap, top_gap_weights)
    idx = torch.as_tensor(seq_index).reshape(-1).long().cpu()
    if idx.numel() != z.shape[0]:
        raise ValueError(f"seq_index has {idx.numel()} entries for {z.shape[0]} blocks; give one per block")
    if isinstance(n_resamples, bool) or int(n_resamples) < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if not 0.0 < float(confidence) < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    seqs, inverse = torch.unique(idx, return_inverse=True)
    n_seq = int(seqs.numel())
    if n_seq < 2:
        raise ValueError(f"a bootstrap by sequence needs at least 2 sequences, got {n_seq}")
    prob = cumulative_survival(z, t, b, **fused)
    diff = prob - survival_indicator(a)
    bins = (prob * n_bins).floor().clamp_(0, n_bins - 1).long()
    # per-sequence, per-position, per-bin sums of (predicted - observed): ECE is linear in them
    flat = (inverse[:, None] * g + torch.arange(g)[None, :]) * n_bins + bins
    per_seq = torch.zeros(n_seq * g * n_bins, dtype=torch.float64).index_add_(0, flat.reshape(-1), diff.reshape(-1))
    per_seq = per_seq.view(n_seq, g * n_bins)
    blocks = torch.bincount(inverse, minlength=n_seq).double()

    def ece_of(weights: Tensor) -> Tensor:  # weights [R, n_seq] -> mean-over-positions ECE [R]
        sums = (weights @ per_seq).view(-1, g, n_bins).abs().sum(-1)
        return (sums / (weights @ blocks)[:, None]).mean(-1)

    point = float(ece_of(torch.ones(1, n_seq, dtype=torch.float64))[0])
    gen = torch.Generator().manual_seed(int(seed))
    draws = torch.randint(n_seq, (int(n_resamples), n_seq), generator=gen)
    weights = torch.zeros(int(n_resamples), n_seq, dtype=torch.float64).scatter_add_(
        1, draws, torch.ones_like(draws, dtype=torch.float64))
    values = ece_of(weights)
    conditional = calibrated_confidence(z, t, b, **fused)
    floors = []
    for _ in range(min(int(n_resamples), 50)):
        hits = (torch.rand(z.shape, generator=gen, dtype=torch.float64) < conditional).double()
        sim = torch.cumprod(hits, dim=-1)
        floors.append(float(np.mean([float(_ece_rows(prob[:, k][None], sim[:, k], n_bins)[0]) for k in range(g)])))
    alpha = (1.0 - float(confidence)) / 2.0
    low, high = torch.quantile(values, torch.tensor([alpha, 1.0 - alpha], dtype=torch.float64)).tolist()
    return {
        "point": point,
        "low": float(low),
        "high": float(high),
        "confidence": float(confidence),
        "bootstrap_mean": float(values.mean()),
        "bootstrap_std": float(values.std()) if values.numel() > 1 else 0.0,
        "noise_floor": float(np.mean(floors)),
        "resamples": int(n_resamples),
        "seed": int(seed),
        "sequences": n_seq,
        "blocks": int(z.shape[0]),
        "by": "sequence",
        "method": "percentile",
    }


def _reliability_curve(prob: Tensor, outcome: Tensor, n_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bins = (prob * n_bins).floor().clamp(0, n_bins - 1).long()
    count = torch.bincount(bins, minlength=n_bins).double()
    sum_prob = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bins, prob)
    sum_out = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bins, outcome)
    filled = count > 0
    return ((sum_prob[filled] / count[filled]).numpy(), (sum_out[filled] / count[filled]).numpy(),
            count.numpy())


def reliability_plot(conf_logits: Any, accepted: Any, temperatures: Any, path: str | Path, *, n_bins: int = 15,
                     title: str | None = None, biases: Any = None, max_prob: Any = None,
                     max_prob_weights: Any = None, top_gap: Any = None, top_gap_weights: Any = None) -> Path:
    """Write a PNG reliability diagram, one panel per block position.

    Each panel plots the observed frequency of "positions 1..k all accepted" against the
    predicted cumulative survival, per equal-width bin, before (T = 1) and after STS (or STS with
    biases, when given; or the fused sts_max_prob confidence, with ``max_prob_weights`` and ``max_prob``, or the
    sts_top_gap one, with ``top_gap_weights`` and ``top_gap``),
    over the diagonal of perfect calibration and a histogram of the calibrated predictions.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    z, a = _check_block_inputs(conf_logits, accepted)
    g = z.shape[1]
    t = _check_temperatures(temperatures, g)
    b = None if biases is None else _check_biases(biases, g)
    fused = _check_fused(z.shape, max_prob, max_prob_weights, top_gap, top_gap_weights)
    after_label = ("after head+max prob" if "max_prob" in fused else "after head+top gap" if fused
                   else "after STS" if b is None else "after STS+bias")
    survived = survival_indicator(a)
    before = cumulative_survival(z, torch.ones(g, dtype=torch.float64))
    after = cumulative_survival(z, t, b, **fused)
    ncols = min(g, 4)
    nrows = math.ceil(g / ncols)
    fig = Figure(figsize=(3.2 * ncols, 3.0 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    for k in range(nrows * ncols):
        ax = axes[k // ncols][k % ncols]
        if k >= g:
            ax.set_visible(False)
            continue
        x_b, y_b, _ = _reliability_curve(before[:, k], survived[:, k], n_bins)
        x_a, y_a, count_a = _reliability_curve(after[:, k], survived[:, k], n_bins)
        hist = ax.twinx()
        hist.bar(edges[:-1], count_a / count_a.sum(), width=1.0 / n_bins, align="edge", color="0.85")
        hist.set_yticks([])
        hist.set_ylim(0, 1)
        ax.set_zorder(hist.get_zorder() + 1)
        ax.patch.set_visible(False)
        ax.plot([0, 1], [0, 1], ls="--", color="0.4", lw=1, label="perfect")
        ax.plot(x_b, y_b, "o-", color="tab:red", ms=3, label="before STS")
        ax.plot(x_a, y_a, "s-", color="tab:blue", ms=3, label=after_label)
        ece_b = float(_ece_rows(before[:, k][None], survived[:, k], n_bins)[0])
        ece_a = float(_ece_rows(after[:, k][None], survived[:, k], n_bins)[0])
        ax.set_title(f"position {k + 1}: ECE {100 * ece_b:.1f}% -> {100 * ece_a:.1f}%", fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("predicted prefix survival", fontsize=8)
        ax.set_ylabel("observed frequency", fontsize=8)
        if k == 0:
            ax.legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path


def save_temperatures(directory: str | Path, temperatures: Any, *, ece_before: float | None = None,
                      ece_after: float | None = None, biases: Any = None, max_prob_weights: Any = None,
                      top_gap_weights: Any = None) -> Path:
    """Write ``temperatures.json`` into the drafter checkpoint directory; returns its path.

    ece_before / ece_after (from :func:`calibration_report`) are stored as null when not given.
    ``biases`` (sts_bias, one finite value per position) adds a "biases" list and names the method
    sts_bias; without it the file is exactly the STS file (no "biases" key: zeros when read).
    ``max_prob_weights`` (sts_max_prob, one finite value per position) adds a "max_prob_weights" list
    (and "biases", zeros when not given) and names the method sts_max_prob; ``top_gap_weights`` likewise adds a
    "top_gap_weights" list and names the method sts_top_gap (one of the two at most).
    """
    t = _as_float64(temperatures, "temperatures").reshape(-1)
    t = _check_temperatures(t, t.numel())
    if max_prob_weights is not None and top_gap_weights is not None:
        raise ValueError("a calibration weighs one drafter score at most: max_prob_weights or top_gap_weights")
    weights = {key: _check_per_position(values, t.numel(), key, "weight")
               for key, values in (("max_prob_weights", max_prob_weights), ("top_gap_weights", top_gap_weights))
               if values is not None}
    b = _check_biases(biases, t.numel()) if biases is not None or weights else None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {"temperatures": [float(v) for v in t]}
    if b is not None:
        payload["biases"] = [float(v) for v in b]
    for key, values in weights.items():
        payload[key] = [float(v) for v in values]
    payload.update({
        "method": _method_written(b is not None, weights),
        "ece_before": None if ece_before is None else float(ece_before),
        "ece_after": None if ece_after is None else float(ece_after),
    })
    path = directory / TEMPERATURES_FILE
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def load_temperatures(directory: str | Path, block_size: int) -> Tensor:
    """Read the temperatures of ``temperatures.json`` in a drafter checkpoint directory as float32 [block_size].

    The biases and weights (if any) are validated too but not returned: use :func:`load_calibration` for all.
    """
    return load_calibration(directory, block_size).temperatures


def _number_list(path: Path, payload: dict, key: str, block_size: int, what: str) -> Tensor:
    """payload[key] as float32 [block_size]: a list of ``block_size`` finite numbers, or ValueError naming the file."""
    raw = payload[key]
    bad_type = not isinstance(raw, list) or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in raw)
    if bad_type:
        raise ValueError(f"{path}: '{key}' must be a list of {block_size} finite numbers (one per block position), "
                         f"got {raw!r}; re-run calibration ({what}) to rewrite it, or remove the key")
    if len(raw) != block_size:
        raise ValueError(f"{path} holds {len(raw)} {key.replace('_', ' ')} but the drafter block size is "
                         f"{block_size}; re-calibrate this drafter checkpoint")
    if not all(math.isfinite(float(v)) for v in raw):
        raise ValueError(f"{path}: {key} must be finite, got {raw}; re-run calibration to rewrite it")
    return torch.tensor([float(v) for v in raw], dtype=torch.float32)


def load_calibration(directory: str | Path, block_size: int | None) -> Calibration:
    """Read ``temperatures.json``: a :class:`Calibration` (float32 temperatures [block_size], biases
    [block_size], max_prob_weights and top_gap_weights [block_size] or None). ``block_size`` None: the file's own
    number of
    temperatures (for reading what a file holds; a drafter passes its block size).

    Files without a "biases" list (STS, and every file written before biases existed) read as
    zero biases; files without "max_prob_weights" (sts, sts_bias) read as None: no max-probability
    term. Each list must hold ``block_size`` finite numbers; "max_prob_weights" goes with the method
    sts_max_prob and no other (either without the other is refused), "top_gap_weights" with sts_top_gap.
    """
    path = Path(directory) / TEMPERATURES_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: calibrate the drafter first (python -m runners.calibrate "
                                f"checkpoint=...) or run without calibrated confidence")
    try:
        payload = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); re-run calibration to rewrite it") from e
    if not isinstance(payload, dict) or "temperatures" not in payload:
        raise ValueError(f"{path} has no 'temperatures' list; re-run calibration to rewrite it")
    method = payload.get("method")
    if method not in CONFIG_NAMES:
        raise ValueError(f"{path} was written by method {method!r}, expected one of {sorted(CONFIG_NAMES)}")
    values = payload["temperatures"]
    if block_size is None and isinstance(values, list):
        block_size = len(values)
    if not isinstance(values, list) or len(values) != block_size:
        n = len(values) if isinstance(values, list) else type(values).__name__
        raise ValueError(f"{path} holds {n} temperatures but the drafter block size is {block_size}; "
                         f"re-calibrate this drafter checkpoint")
    temperatures = _check_temperatures(values, block_size).float()
    if payload.get("biases") is None:
        biases = torch.zeros(block_size, dtype=torch.float32)
    else:
        biases = _number_list(path, payload, "biases", block_size, "method=sts_bias")
    weights = {}
    for key, owner in (("max_prob_weights", STS_MAX_PROB_METHOD), ("top_gap_weights", STS_TOP_GAP_METHOD)):
        has_weights = payload.get(key) is not None
        if has_weights != (method == owner):
            raise ValueError(f"{path}: method {method!r} "
                             + (f"has no '{key}' list" if not has_weights else f"takes no '{key}'")
                             + f"; '{key}' goes with method {owner!r} only: re-run calibration to rewrite the file")
        if has_weights:
            weights[key] = _number_list(path, payload, key, block_size, f"method={CONFIG_NAMES[owner]}")
    return Calibration(temperatures, biases, weights.get("max_prob_weights"), weights.get("top_gap_weights"))


def _method_written(has_biases: bool, weights: dict) -> str:
    """The method name a file or report carries: by the score weights present, else by whether biases are."""
    if "max_prob_weights" in weights:
        return STS_MAX_PROB_METHOD
    if "top_gap_weights" in weights:
        return STS_TOP_GAP_METHOD
    return STS_BIAS_METHOD if has_biases else STS_METHOD


__all__ = [
    "CONFIG_NAMES", "Calibration", "METHODS", "STS_BIAS_METHOD", "STS_MAX_PROB_METHOD", "STS_METHOD",
    "STS_TOP_GAP_METHOD",
    "TEMPERATURES_FILE", "bias_grid", "bootstrap_ece", "calibration_dir", "calibration_method",
    "calibration_method_of", "calibrated_confidence", "calibration_report", "conditional_auc", "cumulative_survival",
    "reached_cells", "acceptance_per_position",
    "expected_calibration_error", "fit_max_prob_calibration", "fit_top_gap_calibration",
    "fit_sequential_temperatures", "fit_sequential_temperatures_biases", "load_calibration", "load_temperatures",
    "reliability_plot", "roc_auc", "save_temperatures", "split_sequences", "survival_indicator", "temperature_grid",
]
