"""Paired A/B statistics over per-block headline values.

Each block yields one value per arm (e.g. output tokens/s). The analysis works on the
paired log-ratios r_i = log(B_i / A_i): a ratio is what "B is x% faster" means, and
the log makes it symmetric and additive, so block-level drift common to both arms
cancels. From r we report:

- the point estimate exp(mean r) - 1, as a % change of B relative to A;
- a bias-corrected and accelerated (BCa) bootstrap CI of mean r (``scipy.stats.bootstrap``, seeded);
- the exact Wilcoxon signed-rank p-value of r (no normality assumption);
- the minimum detectable effect (MDE) at this noise, from the t distribution with n - 1 degrees
  of freedom: (t_{1-alpha/2} + t_{power}) * sd(r) / sqrt(n). With few blocks the t quantiles are
  far above the normal ones (2 blocks: 14.1 against 2.8 at alpha 0.05 and power 0.8);
- an order-effect check: log-ratios of A-first blocks against B-first blocks;
- a verdict, one of :data:`VERDICTS`, and a sentence for readers (:func:`verdict_sentence`).

Verdicts:

- "faster" / "slower": the BCa CI excludes 0 AND the Wilcoxon p-value is below alpha. The
  bootstrap is too narrow with few blocks (on synthetic null data with 8-12 blocks a 95% BCa CI
  alone excludes 0 in 10-12% of runs) and the exact rank test brings the false-positive rate
  back under alpha.
- "inconclusive": the test cannot decide. Either there are too few blocks for it to ever reach
  significance (with fewer than 6 blocks that differ, the two-sided exact Wilcoxon test cannot go
  below 2 / 2**n >= 0.0625, whatever the data, so the verdict names the blocks it needs), or the
  two tests disagree, or the estimate is as large as the MDE without being significant.
- "no difference": not significant, and the estimate is smaller than the MDE, so a change of the
  MDE's size would have been detected with the stated power (or every block gave identical values).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
from scipy import stats as sps

if TYPE_CHECKING:
    import pandas as pd

VERDICTS = ("faster", "slower", "no difference", "inconclusive")
DIRECTIONS = ("higher", "lower")
CI_METHOD_NAMES = {"bca": "BCa", "degenerate": "zero-width", "percentile": "percentile"}


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
    mde_pct: float | None  # t-based, see the module docstring
    order_effect_pct: float | None  # exp(mean r | A first - mean r | B first) - 1
    order_effect_p: float | None
    order_effect_test: str
    order_effect_flagged: bool
    verdict: str
    verdict_reason: str
    notes: list[str] = field(default_factory=list)
    n_nonzero_blocks: int = 0  # blocks whose log-ratio is not exactly 0 (the ones the rank test uses)
    blocks_required: int = 0  # blocks with a difference the exact Wilcoxon test needs to reach alpha

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: NaN and inf become None so that the file stays valid JSON."""
        return {k: _json_safe(v) for k, v in asdict(self).items()}

    def describe(self) -> str:
        """One line for logs: the metric and the verdict sentence."""
        return f"{self.metric}: {verdict_sentence(self.to_dict())}"


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


def _check_sample(x: np.ndarray, ci_level: float, n_boot: int) -> None:
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"a bootstrap CI needs a 1-D sample of at least 2 values, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"a bootstrap CI got non-finite values: {x.tolist()}")
    if not 0 < ci_level < 1:
        raise ValueError(f"ci_level must lie in (0, 1), got {ci_level}")
    if n_boot < 100:
        raise ValueError(f"n_boot={n_boot} is too few resamples for a CI; use >= 1000")


def _bootstrap(x: np.ndarray, method: str, n_boot: int, ci_level: float, seed: int,
               statistic: Callable[..., np.ndarray]):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a degenerate resample distribution gives NaN bounds; callers handle them
        return sps.bootstrap((x,), statistic, n_resamples=n_boot, method=method, confidence_level=ci_level,
                             rng=np.random.default_rng(seed), vectorized=True, axis=-1)


def percentile_interval(data: Sequence[float], *, n_boot: int = 10_000, ci_level: float = 0.95, seed: int = 0,
                        statistic: Callable[..., np.ndarray] = _mean_axis) -> tuple[float, float]:
    """Plain percentile bootstrap CI (the reference BCa is checked against)."""
    x = np.asarray(data, dtype=float)
    _check_sample(x, ci_level, n_boot)
    ci = _bootstrap(x, "percentile", n_boot, ci_level, seed, statistic).confidence_interval
    return float(ci.low), float(ci.high)


def bca_interval(data: Sequence[float], *, n_boot: int = 10_000, ci_level: float = 0.95, seed: int = 0,
                 statistic: Callable[..., np.ndarray] = _mean_axis) -> tuple[float, float, dict[str, str]]:
    """BCa bootstrap CI of ``statistic`` (``scipy.stats.bootstrap``); returns ``(low, high, info)``.

    The resamples come from ``numpy.random.default_rng(seed)``, so a seed gives one interval.
    Constant data have no spread, so the CI is the zero-width interval at the value and
    ``info["method"]`` says "degenerate"; a bootstrap distribution that leaves the BCa bounds
    undefined gives NaN bounds and "undefined".
    """
    x = np.asarray(data, dtype=float)
    _check_sample(x, ci_level, n_boot)
    if np.ptp(x) == 0:
        theta = float(statistic(x, axis=-1))
        return theta, theta, {"method": "degenerate"}
    ci = _bootstrap(x, "BCa", n_boot, ci_level, seed, statistic).confidence_interval
    low, high = float(ci.low), float(ci.high)
    return low, high, {"method": "bca" if math.isfinite(low) and math.isfinite(high) else "undefined"}


def wilcoxon_min_attainable_p(n_nonzero: int) -> float:
    """Smallest two-sided p-value the exact signed-rank test can give with n nonzero pairs."""
    return min(1.0, 2.0 / 2 ** n_nonzero) if n_nonzero > 0 else 1.0


def blocks_for_exact_test(alpha: float) -> int:
    """Fewest nonzero pairs with which the two-sided exact signed-rank test can reach p < ``alpha``
    (6 at alpha 0.05)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    return max(1, math.floor(math.log2(2.0 / alpha)) + 1)


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


def _t_multiplier(n_blocks: int, alpha: float, power: float) -> float:
    """t_{1-alpha/2} + t_{power}, both with n_blocks - 1 degrees of freedom."""
    df = n_blocks - 1
    return float(sps.t.ppf(1 - alpha / 2, df) + sps.t.ppf(power, df))


def minimum_detectable_effect(sd_log_ratio: float, n_blocks: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest true % change this many blocks detect with ``power`` at this noise (two-sided ``alpha``),
    from the t distribution with ``n_blocks - 1`` degrees of freedom."""
    if n_blocks < 2:
        raise ValueError(f"the MDE needs a noise estimate from at least 2 blocks, got n_blocks={n_blocks}")
    mde_log = _t_multiplier(n_blocks, alpha, power) * sd_log_ratio / math.sqrt(n_blocks)
    return 100.0 * math.expm1(mde_log)


def blocks_needed(sd_log_ratio: float, target_change_pct: float, *, alpha: float = 0.05, power: float = 0.8) -> int:
    """Blocks needed to detect ``target_change_pct`` at the pilot noise ``sd_log_ratio`` (t-based, and never
    fewer than the exact rank test needs to reach ``alpha``)."""
    if target_change_pct == 0:
        raise ValueError("target_change_pct must be nonzero: a zero effect is never detectable")
    effect = abs(math.log1p(target_change_pct / 100.0))
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    n = max(blocks_for_exact_test(alpha), math.ceil((z * sd_log_ratio / effect) ** 2))  # the t answer is never less
    while _t_multiplier(n, alpha, power) * sd_log_ratio / math.sqrt(n) > effect:
        n += 1
    return n


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
        notes.append(f"one block: no spread, so no CI, MDE or test; run at least {blocks_for_exact_test(alpha)} blocks")
    else:
        lo, hi, info = bca_interval(r, n_boot=n_boot, ci_level=ci_level, seed=seed)
        ci_method = str(info["method"])
        ci_lo, ci_hi = (100.0 * math.expm1(lo), 100.0 * math.expm1(hi)) if ci_method != "undefined" else (None, None)
        if ci_method == "degenerate":
            notes.append("all blocks gave the same log-ratio: zero-width CI (no measurable noise)")
        elif ci_method == "undefined":
            notes.append("the bootstrap distribution leaves the BCa bounds undefined: no CI")

    p, wnote = wilcoxon_p_value(r)
    notes.append(f"Wilcoxon: {wnote}")

    if a_first is None:
        o_pct, o_p, o_test, o_flag = None, None, "not run: block order not given", False
    else:
        o_pct, o_p, o_test, o_flag = order_effect(r, a_first, alpha=alpha)
    if o_flag:
        notes.append(f"order effect: B/A is {o_pct:+.2f}% different in A-first vs B-first blocks (p={o_p:.3g}); "
                     "the arm that runs second (or first) has an advantage")

    result = ABStatistics(
        metric=metric, direction=direction, n_blocks=n, log_ratios=[float(v) for v in r],
        change_pct=change_pct, ci_low_pct=ci_lo, ci_high_pct=ci_hi, ci_level=ci_level, ci_method=ci_method,
        n_boot=n_boot, wilcoxon_p=p, wilcoxon_min_attainable_p=None, alpha=alpha, power=power, mde_pct=None,
        order_effect_pct=o_pct, order_effect_p=o_p, order_effect_test=o_test, order_effect_flagged=o_flag,
        verdict="", verdict_reason="", notes=notes,
    )
    assessed = reassess(result.to_dict())
    for key in ("n_nonzero_blocks", "blocks_required", "wilcoxon_min_attainable_p", "mde_pct", "verdict",
                "verdict_reason"):
        setattr(result, key, assessed[key])
    return result


def reassess(stat: Mapping[str, Any]) -> dict[str, Any]:
    """The verdict of an :meth:`ABStatistics.to_dict` by the rules of this module, from its stored log-ratios,
    CI and p-value (no new resampling): the MDE, the blocks the test needs, the verdict and its reason are
    derived again. A summary written under other rules (an older run) is worded by these ones when its
    report is rendered again; one written by :func:`compare_arms` comes back unchanged. A dict without
    log-ratios is returned as it is."""
    out = dict(stat)
    if not out.get("log_ratios"):
        return out
    r = np.asarray(out["log_ratios"], dtype=float)
    alpha, power = float(out.get("alpha", 0.05)), float(out.get("power", 0.8))
    n, n_nonzero = r.size, int(np.sum(r != 0))
    mde = minimum_detectable_effect(float(np.std(r, ddof=1)), n, alpha=alpha, power=power) if n >= 2 else None
    min_p = wilcoxon_min_attainable_p(n_nonzero)
    p = out.get("wilcoxon_p")
    verdict, reason = _verdict(
        mean_log_ratio=float(r.mean()), ci_lo=out.get("ci_low_pct"), ci_hi=out.get("ci_high_pct"),
        p=1.0 if p is None else float(p), min_p=min_p, n_nonzero=n_nonzero, needed=blocks_for_exact_test(alpha),
        direction=out.get("direction", "higher"), alpha=alpha, power=power, mde=mde)
    out.update(n_nonzero_blocks=n_nonzero, blocks_required=blocks_for_exact_test(alpha),
               wilcoxon_min_attainable_p=min_p, mde_pct=mde, verdict=verdict, verdict_reason=reason)
    return out


def _verdict(*, mean_log_ratio: float, ci_lo: float | None, ci_hi: float | None, p: float, min_p: float,
             n_nonzero: int, needed: int, direction: str, alpha: float, power: float,
             mde: float | None) -> tuple[str, str]:
    if n_nonzero == 0:
        return "no difference", "both arms gave identical values in every block"
    if min_p >= alpha:
        return "inconclusive", (f"only {n_nonzero} block(s) differ: the exact Wilcoxon test cannot go below "
                                f"p={min_p:.3g}, so no difference can reach alpha={alpha}; "
                                f"run at least {needed} blocks")
    if ci_lo is None or ci_hi is None:
        return "inconclusive", "no confidence interval could be computed"
    ci_excludes_zero = ci_lo > 0 or ci_hi < 0
    if ci_excludes_zero and p < alpha:
        increased = ci_lo > 0
        better = increased if direction == "higher" else not increased
        return ("faster" if better else "slower"), f"CI excludes 0 and Wilcoxon p={p:.3g} < {alpha}"
    if ci_excludes_zero:
        return "inconclusive", (f"the CI excludes 0 but Wilcoxon p={p:.3g} >= {alpha}: the two tests disagree; "
                                "more blocks decide")
    if mde is not None and abs(mean_log_ratio) < math.log1p(mde / 100.0):
        return "no difference", (f"CI includes 0 (Wilcoxon p={p:.3g}); a change of {mde:.2f}% would be detected "
                                 f"with {power:.0%} power at this noise")
    mde_text = "no MDE" if mde is None else f"the smallest change it reliably detects is {mde:.2f}%"
    return "inconclusive", (f"CI includes 0 (Wilcoxon p={p:.3g}) but the estimate is not below the test's "
                            f"resolution ({mde_text}); more blocks decide")


def _ci_phrase(stat: Mapping[str, Any]) -> str:
    low, high = stat.get("ci_low_pct"), stat.get("ci_high_pct")
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return "no CI"
    method = CI_METHOD_NAMES.get(str(stat.get("ci_method")), str(stat.get("ci_method")))
    return f"{float(stat.get('ci_level', 0.95)):.0%} {method} CI {low:+.2f} .. {high:+.2f}%"


def verdict_sentence(stat: Mapping[str, Any], a: str = "A", b: str = "B") -> str:
    """The verdict of an :meth:`ABStatistics.to_dict` (after :func:`reassess`) as a sentence for readers, the
    arms named ``a`` and ``b``:

    - "B faster than A by 12.30% (95% BCa CI +8.01 .. +16.20%, Wilcoxon p=0.0078, 8 blocks)"
    - "no difference larger than 4.10% detected between B and A (B vs A -0.80%, ...)"
    - "inconclusive (2 blocks; the test needs at least 6): B vs A +113.15% (95% BCa CI ...) cannot be tested
      with so few blocks"
    """
    verdict, change, n = stat["verdict"], float(stat["change_pct"]), int(stat["n_blocks"])
    p = stat.get("wilcoxon_p")
    tested = f"{_ci_phrase(stat)}, Wilcoxon p={'n/a' if p is None else format(p, '.3g')}, {n} block{'s' * (n != 1)}"
    if verdict in ("faster", "slower"):
        return f"{b} {verdict} than {a} by {abs(change):.2f}% ({tested})"
    if verdict == "no difference":
        if stat.get("n_nonzero_blocks") == 0:
            return f"no difference: {a} and {b} gave identical values in all {n} block{'s' * (n != 1)}"
        return (f"no difference larger than {stat['mde_pct']:.2f}% detected between {b} and {a} "
                f"({b} vs {a} {change:+.2f}%, {tested})")
    alpha = float(stat.get("alpha", 0.05))
    needed = int(stat.get("blocks_required") or blocks_for_exact_test(alpha))
    min_p = stat.get("wilcoxon_min_attainable_p")
    if min_p is not None and min_p >= alpha:
        nonzero = stat.get("n_nonzero_blocks", n)
        counted = f"{n} block{'s' * (n != 1)}" + (f", {nonzero} with a difference" if nonzero != n else "")
        return (f"inconclusive ({counted}; the test needs at least {needed}): {b} vs {a} {change:+.2f}% "
                f"({_ci_phrase(stat)}) cannot be tested with so few blocks")
    return f"inconclusive: {b} vs {a} {change:+.2f}% ({tested}); {stat['verdict_reason']}"


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
