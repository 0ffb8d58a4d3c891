"""Paired A/B statistics over per-block headline values.

Each block yields one value per arm (e.g. output tokens/s). The analysis works on the
paired log-ratios r_i = log(B_i / A_i): a ratio is what "B is x% faster" means, and
the log makes it symmetric and additive, so block-level drift common to both arms
cancels. From r we report:

- the point estimate exp(mean r) - 1, as a % change of B relative to A;
- a bias-corrected and accelerated (BCa) bootstrap CI of mean r (seeded);
- the exact Wilcoxon signed-rank p-value of r (no normality assumption);
- the minimum detectable effect at this noise: (z_{1-alpha/2} + z_power) * sd(r) / sqrt(n);
- an order-effect check: log-ratios of A-first blocks against B-first blocks;
- a verdict in words.

The verdict says "faster" or "slower" only when the BCa CI excludes 0 AND the
Wilcoxon p-value is below alpha. The bootstrap is too narrow with few blocks (on
synthetic null data with 8-12 blocks a 95% BCa CI alone excludes 0 in 10-12% of runs)
and the exact rank test brings the false-positive rate back under alpha. With fewer than 6 nonzero blocks the two-sided exact
Wilcoxon test cannot go below 2 / 2**n >= 0.0625, so no verdict can be reached at
alpha 0.05 and the result says so instead of pretending.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
from scipy import stats as sps

if TYPE_CHECKING:
    import pandas as pd

VERDICTS = ("faster", "slower", "no detectable difference")
DIRECTIONS = ("higher", "lower")


@dataclass
class ABStatistics:
    """Result of comparing arm B against arm A on one metric. Percentages are B vs A."""

    metric: str
    direction: str  # "higher" (throughput) or "lower" (latency) is better
    n_blocks: int
    log_ratios: list[float]
    change_pct: float
    ci_low_pct: float | None
    ci_high_pct: float | None
    ci_level: float
    ci_method: str  # "bca", "degenerate", "undefined"
    n_boot: int
    wilcoxon_p: float | None
    wilcoxon_min_attainable_p: float | None
    alpha: float
    power: float
    mde_pct: float | None
    order_effect_pct: float | None  # exp(mean r | A first - mean r | B first) - 1
    order_effect_p: float | None
    order_effect_test: str
    order_effect_flagged: bool
    verdict: str
    verdict_reason: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: NaN and inf become None so that the file stays valid JSON."""
        return {k: _json_safe(v) for k, v in asdict(self).items()}

    def describe(self) -> str:
        """One sentence for reports and logs."""
        ci = ("no CI" if self.ci_low_pct is None
              else f"{self.ci_level:.0%} {self.ci_method} CI {self.ci_low_pct:+.2f}..{self.ci_high_pct:+.2f}%")
        p = "n/a" if self.wilcoxon_p is None else f"{self.wilcoxon_p:.3g}"
        return (f"{self.metric}: B vs A {self.change_pct:+.2f}% ({ci}, Wilcoxon p={p}, n={self.n_blocks} blocks) "
                f"-> {self.verdict}: {self.verdict_reason}")


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (np.floating, np.integer)):
        return _json_safe(v.item())
    if isinstance(v, list):
        return [_json_safe(x) for x in v]
    return v


def _mean_axis(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def bootstrap_distribution(data: Sequence[float], *, n_boot: int, seed: int,
                           statistic: Callable[..., np.ndarray] = _mean_axis) -> np.ndarray:
    """Statistic over ``n_boot`` resamples with replacement (``statistic(x, axis=-1)``)."""
    x = np.asarray(data, dtype=float)
    idx = np.random.default_rng(seed).integers(0, x.size, size=(n_boot, x.size))
    return np.asarray(statistic(x[idx], axis=-1), dtype=float)


def percentile_interval(data: Sequence[float], *, n_boot: int = 10_000, ci_level: float = 0.95, seed: int = 0,
                        statistic: Callable[..., np.ndarray] = _mean_axis) -> tuple[float, float]:
    """Plain percentile bootstrap CI; kept as the reference BCa is checked against."""
    boot = bootstrap_distribution(data, n_boot=n_boot, seed=seed, statistic=statistic)
    tail = (1 - ci_level) / 2
    lo, hi = np.quantile(boot, [tail, 1 - tail])
    return float(lo), float(hi)


def bca_interval(data: Sequence[float], *, n_boot: int = 10_000, ci_level: float = 0.95, seed: int = 0,
                 statistic: Callable[..., np.ndarray] = _mean_axis) -> tuple[float, float, dict[str, float | str]]:
    """BCa bootstrap CI of ``statistic``; returns ``(low, high, info)``.

    The bias correction z0 is the normal quantile of the share of bootstrap
    statistics below the full-sample one; the acceleration comes from the skewness of
    the jackknife (leave-one-out) statistics. Constant data have no spread, so the CI
    is the zero-width interval at the value and ``info["method"]`` says "degenerate".
    """
    x = np.asarray(data, dtype=float)
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"bca_interval needs a 1-D sample of at least 2 values, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"bca_interval got non-finite values: {x.tolist()}")
    if not 0 < ci_level < 1:
        raise ValueError(f"ci_level must lie in (0, 1), got {ci_level}")
    if n_boot < 100:
        raise ValueError(f"n_boot={n_boot} is too few resamples for a CI; use >= 1000")
    theta = float(statistic(x, axis=-1))
    if np.ptp(x) == 0:
        return theta, theta, {"method": "degenerate", "z0": 0.0, "acceleration": 0.0}

    boot = bootstrap_distribution(x, n_boot=n_boot, seed=seed, statistic=statistic)
    share_below = (np.sum(boot < theta) + 0.5 * np.sum(boot == theta)) / n_boot
    share_below = float(np.clip(share_below, 1 / (n_boot + 1), n_boot / (n_boot + 1)))  # keep z0 finite
    z0 = float(sps.norm.ppf(share_below))

    leave_one_out = np.array([statistic(np.delete(x, i), axis=-1) for i in range(x.size)], dtype=float)
    dev = leave_one_out.mean() - leave_one_out
    denom = 6.0 * float(np.sum(dev ** 2)) ** 1.5
    accel = float(np.sum(dev ** 3)) / denom if denom > 0 else 0.0

    tail = (1 - ci_level) / 2
    quantiles = []
    for z_alpha in (sps.norm.ppf(tail), sps.norm.ppf(1 - tail)):
        shifted = z0 + z_alpha
        quantiles.append(float(sps.norm.cdf(z0 + shifted / (1 - accel * shifted))))
    lo, hi = np.quantile(boot, quantiles)
    return float(lo), float(hi), {"method": "bca", "z0": z0, "acceleration": accel}


def wilcoxon_min_attainable_p(n_nonzero: int) -> float:
    """Smallest two-sided p-value the exact signed-rank test can give with n nonzero pairs."""
    return min(1.0, 2.0 / 2 ** n_nonzero) if n_nonzero > 0 else 1.0


def wilcoxon_p_value(log_ratios: Sequence[float]) -> tuple[float, str]:
    """Two-sided Wilcoxon signed-rank p-value of ``log_ratios`` against 0, with a note."""
    r = np.asarray(log_ratios, dtype=float)
    nonzero = int(np.sum(r != 0))
    if nonzero == 0:
        return 1.0, "all paired differences are exactly zero: no evidence of any difference"
    has_ties = np.unique(np.abs(r[r != 0])).size < nonzero
    # scipy's "auto": exact without ties/zeros up to n=50, an exact permutation with
    # ties/zeros up to n=13, the normal approximation beyond.
    if r.size > 50 or ((has_ties or nonzero < r.size) and r.size > 13):
        note = "normal approximation"
    elif has_ties or nonzero < r.size:
        note = "exact permutation distribution (ties or zeros present)"
    else:
        note = "exact"
    if nonzero < r.size:
        note += f"; {r.size - nonzero} zero difference(s) dropped"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns about small n; the minimum attainable p is reported instead
        p = float(sps.wilcoxon(r, zero_method="wilcox", alternative="two-sided").pvalue)
    return p, note


def minimum_detectable_effect(sd_log_ratio: float, n_blocks: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest true % change this many blocks detect with ``power`` at this noise (two-sided ``alpha``)."""
    if n_blocks < 2:
        raise ValueError(f"the MDE needs a noise estimate from at least 2 blocks, got n_blocks={n_blocks}")
    mde_log = (sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)) * sd_log_ratio / math.sqrt(n_blocks)
    return 100.0 * math.expm1(mde_log)


def blocks_needed(sd_log_ratio: float, target_change_pct: float, *, alpha: float = 0.05, power: float = 0.8) -> int:
    """Blocks needed to detect ``target_change_pct`` at the pilot noise ``sd_log_ratio``."""
    if target_change_pct == 0:
        raise ValueError("target_change_pct must be nonzero: a zero effect is never detectable")
    effect = abs(math.log1p(target_change_pct / 100.0))
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    return max(6, math.ceil((z * sd_log_ratio / effect) ** 2))


def order_effect(log_ratios: Sequence[float], a_first: Sequence[bool], *, alpha: float = 0.05
                 ) -> tuple[float | None, float | None, str, bool]:
    """Compare log-ratios of blocks where A ran first with blocks where B ran first.

    Returns ``(difference %, p-value, test description, flagged)``. A significant
    difference means running second (or first) helps an arm: warm caches, clock boost,
    allocator state. ABBA balances it out of the mean, but it inflates the noise and
    should be understood before trusting the result.
    """
    r = np.asarray(log_ratios, dtype=float)
    mask = np.asarray(a_first, dtype=bool)
    if mask.shape != r.shape:
        raise ValueError(f"a_first has {mask.size} entries but there are {r.size} log-ratios; give one flag per block")
    r_a, r_b = r[mask], r[~mask]
    if r_a.size < 2 or r_b.size < 2:
        return None, None, (f"not testable: {r_a.size} A-first and {r_b.size} B-first block(s); "
                            "need >= 2 of each (use an ABBA schedule)"), False
    diff_pct = 100.0 * math.expm1(float(r_a.mean() - r_b.mean()))
    if np.ptp(r_a) == 0 and np.ptp(r_b) == 0:
        p = 1.0 if r_a[0] == r_b[0] else 0.0
        test = "both groups constant: compared exactly"
    else:
        p = float(sps.ttest_ind(r_a, r_b, equal_var=False).pvalue)
        test = f"Welch t-test, {r_a.size} A-first vs {r_b.size} B-first blocks"
    return diff_pct, p, test, bool(p < alpha)


def compare_arms(a_values: Sequence[float], b_values: Sequence[float], *, a_first: Sequence[bool] | None = None,
                 metric: str = "output_tokens_per_s", direction: str = "higher", alpha: float = 0.05,
                 power: float = 0.8, ci_level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> ABStatistics:
    """Compare B against A over paired per-block values (same order, one pair per block).

    ``a_first[i]`` says whether A ran first in block i (for the order-effect check);
    ``direction`` is "higher" when larger values are better (throughput) and "lower"
    when smaller values are (latency).
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {list(DIRECTIONS)}, got {direction!r}")
    a = np.asarray(a_values, dtype=float)
    b = np.asarray(b_values, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"{metric}: A has {a.shape} values and B has {b.shape}; give one value per block for each arm")
    if a.size == 0:
        raise ValueError(f"{metric}: no blocks to compare")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and np.all(a > 0) and np.all(b > 0)):
        raise ValueError(f"{metric}: log-ratios need finite positive values; A={a.tolist()} B={b.tolist()}")
    r = np.log(b / a)
    n = r.size
    notes: list[str] = []
    change_pct = 100.0 * math.expm1(float(r.mean()))

    if n < 2:
        ci_lo = ci_hi = None
        ci_method = "undefined"
        notes.append("one block: no spread, so no CI, MDE or test; run >= 6 blocks")
    else:
        lo, hi, info = bca_interval(r, n_boot=n_boot, ci_level=ci_level, seed=seed)
        ci_method = str(info["method"])
        ci_lo, ci_hi = 100.0 * math.expm1(lo), 100.0 * math.expm1(hi)
        if ci_method == "degenerate":
            notes.append("all blocks gave the same log-ratio: zero-width CI (no measurable noise)")

    p, wnote = wilcoxon_p_value(r)
    notes.append(f"Wilcoxon: {wnote}")
    n_nonzero = int(np.sum(r != 0))
    min_p = wilcoxon_min_attainable_p(n_nonzero)

    sd = float(np.std(r, ddof=1)) if n >= 2 else float("nan")
    mde = minimum_detectable_effect(sd, n, alpha=alpha, power=power) if n >= 2 else None

    if a_first is None:
        o_pct, o_p, o_test, o_flag = None, None, "not run: block order not given", False
    else:
        o_pct, o_p, o_test, o_flag = order_effect(r, a_first, alpha=alpha)
    if o_flag:
        notes.append(f"order effect: B/A is {o_pct:+.2f}% different in A-first vs B-first blocks (p={o_p:.3g}); "
                     "the arm that runs second (or first) has an advantage")

    verdict, reason = _verdict(change_pct, ci_lo, ci_hi, p, min_p, n_nonzero, direction, alpha, mde)
    return ABStatistics(
        metric=metric, direction=direction, n_blocks=n, log_ratios=[float(v) for v in r],
        change_pct=change_pct, ci_low_pct=ci_lo, ci_high_pct=ci_hi, ci_level=ci_level, ci_method=ci_method,
        n_boot=n_boot, wilcoxon_p=p, wilcoxon_min_attainable_p=min_p, alpha=alpha, power=power, mde_pct=mde,
        order_effect_pct=o_pct, order_effect_p=o_p, order_effect_test=o_test, order_effect_flagged=o_flag,
        verdict=verdict, verdict_reason=reason, notes=notes,
    )


def _verdict(change_pct: float, ci_lo: float | None, ci_hi: float | None, p: float, min_p: float, n_nonzero: int,
             direction: str, alpha: float, mde: float | None) -> tuple[str, str]:
    no_diff = "no detectable difference"
    if n_nonzero == 0:
        return no_diff, "both arms gave identical values in every block"
    if min_p >= alpha:
        return no_diff, (f"only {n_nonzero} nonzero block(s): the exact Wilcoxon test cannot go below p={min_p:.3g}, "
                         f"so no difference can reach alpha={alpha}; run >= 6 blocks")
    if ci_lo is None:
        return no_diff, "no confidence interval could be computed"
    ci_excludes_zero = ci_lo > 0 or ci_hi < 0
    if ci_excludes_zero and p < alpha:
        increased = ci_lo > 0
        better = increased if direction == "higher" else not increased
        return ("faster" if better else "slower"), (
            f"CI excludes 0 and Wilcoxon p={p:.3g} < {alpha}")
    mde_text = f"; at this noise only changes beyond about {mde:.2f}% are reliably detected" if mde is not None else ""
    if ci_excludes_zero:
        return no_diff, f"CI excludes 0 but Wilcoxon p={p:.3g} >= {alpha}: the two tests disagree{mde_text}"
    return no_diff, f"CI includes 0 (Wilcoxon p={p:.3g}){mde_text}"


def compare_blocks(blocks: "pd.DataFrame", metrics: dict[str, str], *, alpha: float = 0.05, power: float = 0.8,
                   ci_level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> dict[str, ABStatistics]:
    """Run :func:`compare_arms` for several metrics of a per-block table.

    ``blocks`` is a pandas DataFrame with one row per (block, arm) and columns
    ``block``, ``arm`` ("A"/"B"), ``first_arm`` ("A"/"B") and the metric columns;
    ``metrics`` maps a column to its direction ("higher" or "lower").
    """
    required = {"block", "arm", "first_arm"} | set(metrics)
    missing = sorted(required - set(blocks.columns))
    if missing:
        raise ValueError(f"blocks table lacks column(s) {missing}; it has {sorted(blocks.columns)}")
    results = {}
    for metric, direction in metrics.items():
        wide = blocks.pivot(index="block", columns="arm", values=metric).sort_index()
        if list(wide.columns) != ["A", "B"] or wide.isna().any().any():
            raise ValueError(f"{metric}: every block needs exactly one A and one B value; got\n{wide}")
        first = blocks.drop_duplicates("block").set_index("block")["first_arm"].reindex(wide.index)
        results[metric] = compare_arms(wide["A"].to_numpy(), wide["B"].to_numpy(), a_first=(first == "A").to_numpy(),
                                       metric=metric, direction=direction, alpha=alpha, power=power,
                                       ci_level=ci_level, n_boot=n_boot, seed=seed)
    return results
