"""Paired A/B statistics on synthetic per-block data with known truth."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from dspark.bench.schedule import build_schedule, first_arm_by_block
from dspark.bench.statistics import (bca_interval, blocks_needed, compare_arms, compare_blocks,
                                     minimum_detectable_effect, percentile_interval, wilcoxon_min_attainable_p)


def synthetic_blocks(seed, n_blocks=12, effect=0.10, noise=0.03, drift=0.02, order_bonus=0.0):
    """Lognormal per-block throughput, linear machine drift shared by both arms, ABBA order.

    ``order_bonus`` speeds up whichever arm runs second in its block.
    """
    rng = np.random.default_rng(seed)
    first = first_arm_by_block(build_schedule("ABBA", n_blocks, seed=0))
    a, b, a_first = [], [], []
    for block in range(n_blocks):
        base = 1000.0 * (1 + drift * block)
        va = base * math.exp(rng.normal(0, noise))
        vb = base * (1 + effect) * math.exp(rng.normal(0, noise))
        if first[block] == "A":
            vb *= 1 + order_bonus
        else:
            va *= 1 + order_bonus
        a.append(va)
        b.append(vb)
        a_first.append(first[block] == "A")
    return a, b, a_first


def test_planted_ten_percent_gain_is_detected():
    a, b, a_first = synthetic_blocks(seed=1)
    result = compare_arms(a, b, a_first=a_first, n_boot=4000, seed=0)
    assert result.verdict == "faster"
    assert result.ci_low_pct > 0
    assert result.ci_low_pct < 10 < result.ci_high_pct + 1.5  # the truth is near the interval
    assert 7 < result.change_pct < 13
    assert result.wilcoxon_p < 0.01
    assert not result.order_effect_flagged


def test_lower_is_better_direction_flips_the_verdict():
    a, b, a_first = synthetic_blocks(seed=2)  # B's values are 10% higher
    as_latency = compare_arms(a, b, a_first=a_first, direction="lower", n_boot=2000)
    assert as_latency.verdict == "slower"
    reversed_arms = compare_arms(b, a, a_first=a_first, direction="higher", n_boot=2000)
    assert reversed_arms.verdict == "slower"


def test_identical_arms_rarely_give_a_verdict():
    n_seeds = 100
    false_positives = sum(
        compare_arms(*synthetic_blocks(seed, effect=0.0)[:2], n_boot=1000, seed=seed).verdict
        != "no detectable difference"
        for seed in range(n_seeds)
    )
    assert false_positives <= 0.10 * n_seeds  # alpha is 0.05; seeds 0..99 give about 4


def test_minimum_detectable_effect_shrinks_with_blocks():
    mdes = [minimum_detectable_effect(0.05, n) for n in (4, 8, 16, 32)]
    assert all(x > y for x, y in zip(mdes, mdes[1:]))
    # (1.96 + 0.84) * 0.05 / 4 in log space
    assert mdes[2] == pytest.approx(100 * math.expm1(2.8016 * 0.05 / 4), rel=1e-3)
    a, b, a_first = synthetic_blocks(seed=4, effect=0.0)
    result = compare_arms(a, b, a_first=a_first, n_boot=1000)
    sd = np.std(np.log(np.asarray(b) / np.asarray(a)), ddof=1)
    assert result.mde_pct == pytest.approx(minimum_detectable_effect(sd, 12))
    assert blocks_needed(sd, result.mde_pct) in (12, 13)


def test_order_effect_is_flagged_when_planted():
    a, b, a_first = synthetic_blocks(seed=3, effect=0.0, order_bonus=0.08)
    result = compare_arms(a, b, a_first=a_first, n_boot=1000)
    assert result.order_effect_flagged
    assert result.order_effect_pct == pytest.approx(100 * (1.08 ** 2 - 1), abs=6)
    assert any("order effect" in note for note in result.notes)
    clean = compare_arms(*synthetic_blocks(seed=3, effect=0.0)[:2], a_first=a_first, n_boot=1000)
    assert not clean.order_effect_flagged


def test_too_few_blocks_never_claims_a_difference():
    assert wilcoxon_min_attainable_p(5) == pytest.approx(0.0625)
    assert wilcoxon_min_attainable_p(6) == pytest.approx(0.03125)
    result = compare_arms([1.0, 1.1, 1.0, 1.05], [1.3, 1.4, 1.3, 1.35], n_boot=1000)
    assert result.ci_low_pct > 0  # the bootstrap alone would claim a gain
    assert result.verdict == "no detectable difference"
    assert "run >= 6 blocks" in result.verdict_reason


def test_zero_variance_data_gives_zero_width_ci_without_nans():
    result = compare_arms([100.0] * 8, [110.0] * 8, a_first=[True, False] * 4, n_boot=1000)
    assert result.ci_method == "degenerate"
    assert result.ci_low_pct == pytest.approx(10.0) and result.ci_high_pct == pytest.approx(10.0)
    assert result.verdict == "faster"
    identical = compare_arms([100.0] * 8, [100.0] * 8, a_first=[True, False] * 4, n_boot=1000)
    assert identical.wilcoxon_p == 1.0
    assert identical.verdict == "no detectable difference"
    text = json.dumps(identical.to_dict(), allow_nan=False)  # raises on NaN/inf
    assert "identical" in text


def test_bca_matches_percentile_on_symmetric_data_and_shifts_on_skewed_data():
    rng = np.random.default_rng(0)
    symmetric = rng.normal(0.0, 1.0, 40)
    lo_b, hi_b, _ = bca_interval(symmetric, n_boot=5000, seed=1)
    lo_p, hi_p = percentile_interval(symmetric, n_boot=5000, seed=1)
    width = hi_p - lo_p
    assert abs(lo_b - lo_p) < 0.05 * width and abs(hi_b - hi_p) < 0.05 * width

    skewed = rng.lognormal(0.0, 1.2, 40)
    lo_b, hi_b, info = bca_interval(skewed, n_boot=5000, seed=1)
    lo_p, hi_p = percentile_interval(skewed, n_boot=5000, seed=1)
    assert info["acceleration"] > 0.02  # right skew
    assert lo_b > lo_p and hi_b > hi_p  # BCa moves the interval towards the long tail
    assert (hi_b - hi_p) > 0.03 * (hi_p - lo_p)


def test_bca_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 2"):
        bca_interval([1.0], n_boot=1000)
    with pytest.raises(ValueError, match="n_boot=10"):
        bca_interval([1.0, 2.0], n_boot=10)


def test_compare_arms_input_validation():
    with pytest.raises(ValueError, match="direction"):
        compare_arms([1.0, 2.0], [1.0, 2.0], direction="up")
    with pytest.raises(ValueError, match="positive"):
        compare_arms([1.0, 0.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="one value per block"):
        compare_arms([1.0, 2.0], [1.0])


def test_compare_blocks_pivots_a_block_table():
    a, b, a_first = synthetic_blocks(seed=1)
    rows = []
    for block, (va, vb, af) in enumerate(zip(a, b, a_first)):
        first = "A" if af else "B"
        rows += [{"block": block, "arm": "A", "first_arm": first, "tps": va, "e2e": 1 / va},
                 {"block": block, "arm": "B", "first_arm": first, "tps": vb, "e2e": 1 / vb}]
    results = compare_blocks(pd.DataFrame(rows), {"tps": "higher", "e2e": "lower"}, n_boot=1000)
    assert results["tps"].verdict == "faster"
    assert results["e2e"].verdict == "faster"  # lower latency
    assert results["e2e"].change_pct < 0
    with pytest.raises(ValueError, match="lacks column"):
        compare_blocks(pd.DataFrame(rows).drop(columns="first_arm"), {"tps": "higher"})
