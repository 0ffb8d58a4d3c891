"""Post-hoc calibration of the confidence head: sequential temperature scaling (STS).

The confidence head gives one logit z_k per block position; c_k = sigmoid(z_k / T_k) is
the probability that draft position k is accepted GIVEN that positions 1..k-1 were
(paper section 3.2.1). The scheduler needs the prefix survival S_k = prod_{i<=k} c_i
("the first k drafts are all accepted") in absolute terms, so STS calibrates S_k:
temperatures are fitted LEFT TO RIGHT, and T_k is the point of a log-spaced grid that
minimises the expected calibration error of S_k against the realised indicator
"positions 1..k all accepted", over all validation rows, with T_1..T_{k-1} frozen.
Temperature scaling keeps the order of the scores, so discrimination (AUC) is unchanged.

Inputs are plain tensors: ``conf_logits`` [M, G] raw confidence logits of M validation
blocks and ``accepted`` [M, G] with 0/1 realised acceptance per position, each row
verified over the whole block. Values after a row's first rejection are ignored (the
survival indicator is the cumulative product), so rows may hold anything 0/1 there.

Temperatures live in ``temperatures.json`` beside the drafter checkpoint.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import rankdata
from torch import Tensor

TEMPERATURES_FILE = "temperatures.json"
STS_METHOD = "sequential_temperature_scaling"


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


def survival_indicator(accepted: Tensor) -> Tensor:
    """Realised prefix survival [M, G]: 1 where positions 1..k of the row were all accepted."""
    return torch.cumprod(torch.as_tensor(accepted), dim=-1)


def calibrated_confidence(conf_logits: Tensor, temperatures: Tensor) -> Tensor:
    """Per-position conditional confidence sigmoid(z_k / T_k); temperatures [G] broadcast over rows."""
    t = torch.as_tensor(temperatures, dtype=conf_logits.dtype, device=conf_logits.device)
    return torch.sigmoid(conf_logits / t)


def cumulative_survival(conf_logits: Tensor, temperatures: Tensor) -> Tensor:
    """Predicted prefix survival S_k = prod_{i<=k} sigmoid(z_i / T_i) along the last axis."""
    return torch.cumprod(calibrated_confidence(conf_logits, temperatures), dim=-1)


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


def calibration_report(conf_logits: Any, accepted: Any, temperatures: Any, *, n_bins: int = 15) -> dict[str, Any]:
    """Discrimination and calibration of the confidence head, as JSON-ready plain values.

    AUC: per position, sigmoid(z_k) against acceptance of k among the rows that reached k
    (positions < k all accepted); ``auc_overall`` pools all reached cells. A position whose
    reached rows are all accepted or all rejected has AUC None (undefined).
    ECE: of the cumulative product against prefix survival over all rows, per position,
    before (T = 1) and after STS; ``ece_before`` / ``ece_after`` are the means over positions.
    """
    z, a = _check_block_inputs(conf_logits, accepted)
    g = z.shape[1]
    t = _check_temperatures(temperatures, g)
    survived = survival_indicator(a)
    reached = torch.cat([torch.ones(z.shape[0], 1, dtype=torch.bool), survived[:, :-1].bool()], dim=1)
    raw_conf = torch.sigmoid(z)

    def auc_or_none(scores: Tensor, labels: Tensor) -> float | None:
        if labels.numel() == 0 or bool((labels == labels[0]).all()):
            return None
        return roc_auc(scores, labels)

    auc_per_position = [auc_or_none(raw_conf[reached[:, k], k], a[reached[:, k], k]) for k in range(g)]
    before = cumulative_survival(z, torch.ones(g, dtype=torch.float64))
    after = cumulative_survival(z, t)
    ece_before = [float(_ece_rows(before[:, k][None], survived[:, k], n_bins)[0]) for k in range(g)]
    ece_after = [float(_ece_rows(after[:, k][None], survived[:, k], n_bins)[0]) for k in range(g)]
    reached_count = reached.sum(0)
    accepted_at = (a * reached).sum(0)
    return {
        "method": STS_METHOD,
        "num_rows": int(z.shape[0]),
        "block_size": g,
        "n_bins": n_bins,
        "temperatures": [float(v) for v in t],
        "reached_per_position": [int(v) for v in reached_count],
        "acceptance_per_position": [float(accepted_at[k] / reached_count[k]) if reached_count[k] > 0 else None
                                    for k in range(g)],
        "auc_per_position": auc_per_position,
        "auc_overall": auc_or_none(raw_conf[reached], a[reached]),
        "ece_before_per_position": ece_before,
        "ece_after_per_position": ece_after,
        "ece_before": float(np.mean(ece_before)),
        "ece_after": float(np.mean(ece_after)),
    }


def _reliability_curve(prob: Tensor, outcome: Tensor, n_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bins = (prob * n_bins).floor().clamp(0, n_bins - 1).long()
    count = torch.bincount(bins, minlength=n_bins).double()
    sum_prob = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bins, prob)
    sum_out = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bins, outcome)
    filled = count > 0
    return ((sum_prob[filled] / count[filled]).numpy(), (sum_out[filled] / count[filled]).numpy(),
            count.numpy())


def reliability_plot(conf_logits: Any, accepted: Any, temperatures: Any, path: str | Path, *, n_bins: int = 15) -> Path:
    """Write a PNG reliability diagram, one panel per block position.

    Each panel plots the observed frequency of "positions 1..k all accepted" against the
    predicted cumulative survival, per equal-width bin, before (T = 1) and after STS, over
    the diagonal of perfect calibration and a histogram of the calibrated predictions.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    z, a = _check_block_inputs(conf_logits, accepted)
    g = z.shape[1]
    t = _check_temperatures(temperatures, g)
    survived = survival_indicator(a)
    before = cumulative_survival(z, torch.ones(g, dtype=torch.float64))
    after = cumulative_survival(z, t)
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
        ax.plot(x_a, y_a, "s-", color="tab:blue", ms=3, label="after STS")
        ece_b = float(_ece_rows(before[:, k][None], survived[:, k], n_bins)[0])
        ece_a = float(_ece_rows(after[:, k][None], survived[:, k], n_bins)[0])
        ax.set_title(f"position {k + 1}: ECE {100 * ece_b:.1f}% -> {100 * ece_a:.1f}%", fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("predicted prefix survival", fontsize=8)
        ax.set_ylabel("observed frequency", fontsize=8)
        if k == 0:
            ax.legend(fontsize=7, loc="upper left")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path


def save_temperatures(directory: str | Path, temperatures: Any, *, ece_before: float | None = None,
                      ece_after: float | None = None) -> Path:
    """Write ``temperatures.json`` into the drafter checkpoint directory; returns its path.

    ece_before / ece_after (from :func:`calibration_report`) are stored as null when not given.
    """
    t = _as_float64(temperatures, "temperatures").reshape(-1)
    t = _check_temperatures(t, t.numel())
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "temperatures": [float(v) for v in t],
        "method": STS_METHOD,
        "ece_before": None if ece_before is None else float(ece_before),
        "ece_after": None if ece_after is None else float(ece_after),
    }
    path = directory / TEMPERATURES_FILE
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def load_temperatures(directory: str | Path, block_size: int) -> Tensor:
    """Read ``temperatures.json`` from a drafter checkpoint directory as float32 [block_size]."""
    path = Path(directory) / TEMPERATURES_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: calibrate the drafter first (fit_sequential_temperatures "
                                f"+ save_temperatures) or run without calibrated confidence")
    try:
        payload = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); re-run calibration to rewrite it") from e
    if not isinstance(payload, dict) or "temperatures" not in payload:
        raise ValueError(f"{path} has no 'temperatures' list; re-run calibration to rewrite it")
    if payload.get("method") != STS_METHOD:
        raise ValueError(f"{path} was written by method {payload.get('method')!r}, expected {STS_METHOD!r}")
    values = payload["temperatures"]
    if not isinstance(values, list) or len(values) != block_size:
        n = len(values) if isinstance(values, list) else type(values).__name__
        raise ValueError(f"{path} holds {n} temperatures but the drafter block size is {block_size}; "
                         f"re-calibrate this drafter checkpoint")
    return _check_temperatures(values, block_size).float()


__all__ = [
    "STS_METHOD", "TEMPERATURES_FILE", "calibrated_confidence", "calibration_report", "cumulative_survival",
    "expected_calibration_error", "fit_sequential_temperatures", "load_temperatures", "reliability_plot",
    "roc_auc", "save_temperatures", "survival_indicator", "temperature_grid",
]
