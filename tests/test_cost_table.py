"""CostTable: lookups, validation messages, JSON round trip, fingerprint refusal, tiers, fitting."""

import json
import math

import pytest

from dspark.cost_table import (CostTable, CostTableError, CostTableFileError, CostTableMismatchError, FitQuality,
                               derive_tier_ladder, fingerprint_digest, fit_cost_table)

FP = {"device_name": "NVIDIA H200", "driver": "550.54", "torch": "2.13.0", "triton": "3.9.0",
      "model": "smollm2-135m", "drafter": "dspark-b7-abc123", "dtype": "bfloat16", "hostname": "node1"}


def staircase():
    # Shelves: M 8..16 cost 1.0, 24..32 cost 2.0, 40..48 cost 3.0.
    return CostTable(token_counts=(8, 16, 24, 32, 40, 48), theta_ms=(1.0, 1.0, 2.0, 2.0, 3.0, 3.0),
                     fixed_overhead_ms=5.0, batch_sizes=(1, 4, 8), batch_overhead_ms=(0.0, 0.5, 1.5), fingerprint=FP)


def test_step_ms_steps_up_to_next_measured_count_and_staircase():
    t = staircase()
    assert t.step_ms(8, 1) == 5.0 + 0.0 + 1.0
    assert t.step_ms(17, 4) == 5.0 + 0.5 + 2.0  # 17 pads up to the 24 bucket
    assert t.step_ms(1, 3) == 5.0 + 0.5 + 1.0  # batch 3 -> smallest listed >= 3 is 4
    assert t.step_ms(48, 100) == 5.0 + 1.5 + 3.0  # beyond the staircase: last entry
    with pytest.raises(CostTableError, match="M=49.*largest measured count 48"):
        t.step_ms(49, 1)
    assert t.step_ms(56, 1, extrapolate=True) == pytest.approx(5.0 + 3.0)  # last slope is 0
    with pytest.raises(CostTableError, match="integer >= 1"):
        t.step_ms(0, 1)


def test_is_flat():
    assert not staircase().is_flat(0.02)
    flat = CostTable(token_counts=(1, 64, 128), theta_ms=(2.0, 2.02, 2.01), fixed_overhead_ms=1.0)
    assert flat.is_flat(0.02)
    assert not flat.is_flat(0.001)
    assert CostTable(token_counts=(4,), theta_ms=(1.0,)).is_flat()  # one point cannot show a cost slope


@pytest.mark.parametrize("kwargs,match", [
    (dict(token_counts=(8, 8), theta_ms=(1.0, 1.0)), r"strictly ascending.*\(8, 8\)"),
    (dict(token_counts=(16, 8), theta_ms=(1.0, 1.0)), r"strictly ascending"),
    (dict(token_counts=(0, 8), theta_ms=(1.0, 1.0)), r"positive integers, got \[0, 8\]"),
    (dict(token_counts=(8, 16), theta_ms=(1.0,)), r"1 values but token_counts has 2"),
    (dict(token_counts=(8, 16), theta_ms=(1.0, float("nan"))), r"no NaN.*nan"),
    (dict(token_counts=(8, 16), theta_ms=(1.0, -1.0)), r">= 0.*-1.0"),
    (dict(token_counts=(8,), theta_ms=(0.0,), fixed_overhead_ms=0.0), r"cannot be free"),
    (dict(token_counts=(8,), theta_ms=(1.0,), batch_sizes=(1, 2)), r"come together"),
    (dict(token_counts=(8,), theta_ms=(1.0,), batch_sizes=(4, 2), batch_overhead_ms=(0.0, 0.0)), r"batch_sizes.*ascending"),
    (dict(token_counts=(8,), theta_ms=(1.0,), fixed_overhead_ms=float("inf")), r"fixed_overhead_ms.*inf"),
])
def test_validation_messages_quote_bad_values(kwargs, match):
    with pytest.raises(CostTableError, match=match):
        CostTable(**kwargs)


def test_json_round_trip_and_file(tmp_path):
    t = staircase()
    again = CostTable.from_json(t.to_json())
    assert again == t
    assert dict(again.fingerprint) == FP
    path = tmp_path / "table.json"
    t.save(path)
    assert CostTable.load(path) == t
    with pytest.raises(CostTableError, match="does not exist"):
        CostTable.load(tmp_path / "missing.json")


def test_json_validation():
    d = staircase().to_dict()
    with pytest.raises(CostTableError, match="unknown keys \\['thetas'\\]"):
        CostTable.from_dict({**d, "thetas": [1]})
    with pytest.raises(CostTableError, match="format_version 0"):
        CostTable.from_dict({**d, "format_version": 0})
    with pytest.raises(CostTableError, match="token_counts_include_bonus"):
        CostTable.from_dict({**d, "token_counts_include_bonus": False})
    bad = {**d, "theta_ms": [1.0, 1.0, 2.0, 2.0, 3.0, float("nan")]}
    with pytest.raises(CostTableError, match="NaN"):
        CostTable.from_json(json.dumps(bad))
    with pytest.raises(CostTableError, match="not valid JSON"):
        CostTable.from_json("{")


def test_fingerprint_refusal_names_fields():
    t = staircase()
    assert t.check_fingerprint(dict(FP)) == []
    assert t.check_fingerprint({**FP, "hostname": "other"}) == []  # same hardware on another host is fine
    other = {**FP, "device_name": "NVIDIA A100", "dtype": "float16"}
    with pytest.raises(CostTableMismatchError, match="device_name: table='NVIDIA H200' current='NVIDIA A100'.*dtype"):
        t.check_fingerprint(other)
    with pytest.raises(CostTableMismatchError, match="drafter"):
        t.check_fingerprint({k: v for k, v in FP.items() if k != "drafter"})
    mism = t.check_fingerprint(other, override=True)
    assert len(mism) == 2 and mism[0].startswith("device_name")


def test_derive_tier_ladder_from_staircase():
    t = staircase()
    # Shelf right edges at M = 16, 32, 48. Batch 4: v = M // 4 - 1 -> 3, 7, 11; block 7 -> [3, 7].
    assert derive_tier_ladder(t, 7, batch_size=4) == [3, 7]
    # Batch 8: v = 1, 3, 5 and block 5 is included.
    assert derive_tier_ladder(t, 5, batch_size=8) == [1, 3, 5]
    # Batch 16: v = 0 (dropped), 1, 2; block 4 appended.
    assert derive_tier_ladder(t, 4, batch_size=16) == [1, 2, 4]
    # Within tolerance: a 1% wobble does not open a new shelf.
    wobble = CostTable(token_counts=(4, 8, 12), theta_ms=(1.0, 1.05, 3.0), fixed_overhead_ms=9.0)
    assert derive_tier_ladder(wobble, 5, batch_size=2, rel_tol=0.02) == [3, 5]
    assert derive_tier_ladder(wobble, 5, batch_size=2, rel_tol=0.0) == [1, 3, 5]


def test_fit_recovers_an_additive_table():
    alpha = {1: 0.0, 4: 0.7, 8: 2.0}
    theta = {2: 0.0, 8: 0.5, 16: 1.0, 32: 3.0, 48: 3.5}
    fixed = 4.0
    meas = []
    for bs in alpha:
        for m in theta:
            if m < bs:
                continue
            base = fixed + alpha[bs] + theta[m]
            meas += [(bs, m, base), (bs, m, base + 0.1), (bs, m, base - 0.1), (bs, m, base + 50.0)]  # one outlier per key
    t = fit_cost_table(meas, fingerprint=FP)
    assert t.token_counts == (2, 8, 16, 32, 48)
    assert t.batch_sizes == (1, 4, 8)
    # Median of (b, b+0.1, b-0.1, b+50) = b + 0.05 everywhere: absorbed into the fixed overhead.
    assert t.fixed_overhead_ms == pytest.approx(fixed + 0.05)
    assert list(t.theta_ms) == pytest.approx([theta[m] for m in t.token_counts])
    assert list(t.batch_overhead_ms) == pytest.approx([alpha[b] for b in t.batch_sizes])
    assert dict(t.fingerprint) == FP
    for bs in alpha:
        for m in theta:
            if m >= bs:
                assert t.step_ms(m, bs) == pytest.approx(fixed + 0.05 + alpha[bs] + theta[m])


def test_fit_refuses_unseparable_and_bad_measurements():
    with pytest.raises(CostTableError, match="do not separate"):
        fit_cost_table([(1, 2, 1.0), (1, 4, 2.0), (8, 16, 5.0), (8, 32, 6.0)])
    with pytest.raises(CostTableError, match="finite and > 0"):
        fit_cost_table([(1, 2, math.nan)])
    with pytest.raises(CostTableError, match="no measurements"):
        fit_cost_table([])


@pytest.mark.parametrize("counts, thetas", [((8, 16, 32), (1.0, 2.0, 3.5)), ((8,), (1.5,)), ((8, 16), (2.0, 1.0))])
def test_step_ms_many_prices_every_count_as_step_ms_does_above_the_table_too(counts, thetas):
    """The vector path extends the last slope (never below flat) past the largest measured count, as theta_at."""
    t = CostTable(token_counts=counts, theta_ms=thetas, fixed_overhead_ms=0.5, batch_sizes=(1, 4),
                  batch_overhead_ms=(0.0, 0.5))
    m = [1, 7, 8, 9, 16, 17, 32, 33, 100, 2304]
    many = t.step_ms_many(m, 4, extrapolate=True)
    assert many == pytest.approx([t.step_ms(x, 4, extrapolate=True) for x in m])
    with pytest.raises(CostTableError, match="above the table's largest measured count"):
        t.step_ms_many(m, 4)


def test_trim_overhead_staircase_round_trip_and_validation():
    t = CostTable(token_counts=(8, 16), theta_ms=(1.0, 2.0), fixed_overhead_ms=1.0, batch_sizes=(1, 4),
                  batch_overhead_ms=(0.0, 0.5), trim_overhead_ms=(0.0, 0.25))
    assert t.trim_overhead(1) == 0.0 and t.trim_overhead(3) == 0.25 and t.trim_overhead(99) == 0.25
    assert t.step_ms(16, 4, trimmed=True) == pytest.approx(t.step_ms(16, 4) + 0.25)
    assert list(t.step_ms_many([8, 16], 4, trimmed=True)) == [t.step_ms(8, 4, trimmed=True),
                                                              t.step_ms(16, 4, trimmed=True)]
    assert CostTable.from_json(t.to_json()) == t
    assert staircase().trim_overhead(4) == 0.0  # none measured: no extra cost
    with pytest.raises(CostTableError, match="one value per batch_sizes"):
        CostTable(token_counts=(8,), theta_ms=(1.0,), trim_overhead_ms=(0.1,))
    with pytest.raises(CostTableError, match="finite and >= 0"):
        CostTable(token_counts=(8,), theta_ms=(1.0,), batch_sizes=(1,), batch_overhead_ms=(0.0,),
                  trim_overhead_ms=(-0.1,))


def test_foreign_cost_table_message_names_the_setting(tmp_path):
    path = tmp_path / "h200.json"
    staircase().save(path)
    table = CostTable.load(path)
    with pytest.raises(CostTableMismatchError, match=rf"cost table {path} was measured on a different setup "
                                                     r"\(device_name: .*set engine\.allow_foreign_cost_table=true"):
        table.check_fingerprint({**FP, "device_name": "NVIDIA A100"})
    assert table == staircase()  # where it came from is not part of the table


def test_foreign_cost_table_setting_exists():
    """The setting the message names is the engine config key runners.* accept (schema and EngineConfig)."""
    from dspark.config import EngineConfig
    from runners.schema import EngineSchema

    assert EngineSchema().allow_foreign_cost_table is False and EngineConfig().allow_foreign_cost_table is False


@pytest.mark.parametrize("text, problem", [
    ('{"format_version": 1, "token_co', r"not valid JSON \(Unterminated string"),
    (json.dumps({"format_version": 1, "token_counts_include_bonus": True, "token_counts": [1, 2]}),
     "missing required key 'theta_ms'"),
    (json.dumps({**staircase().to_dict(), "theta_ms": None}), "a value has the wrong type"),
    ("\udcff", "not text"),
])
def test_corrupt_cost_table_says_delete(tmp_path, text, problem):
    path = tmp_path / "cached.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(CostTableFileError, match=rf"cost table {path}: {problem}.*Delete it and re-profile: a table "
                                                 r"cached under paths\.cost_tables is re-profiled by the next A/B run"):
        CostTable.load(path)


def test_fit_records_its_quality_and_round_trips(tmp_path):
    meas = [(b, m, 4.0 + 0.5 * b + 0.1 * m) for b in (1, 2, 4) for m in (b, 2 * b, 4 * b)]
    t = fit_cost_table(meas, fingerprint=FP)
    fit = t.fit
    assert isinstance(fit, FitQuality) and fit.cells == 9 and fit.parameters == 1 + 2 + 4  # fixed, alpha(2), alpha(4), theta at 4 of the 5 counts
    assert fit.r2 == pytest.approx(1.0) and fit.max_rel_residual == pytest.approx(0.0, abs=1e-9)
    assert fit.bounded is False and fit.unbounded_fixed_overhead_ms == pytest.approx(t.fixed_overhead_ms)
    assert fit.passed is None  # nothing checked it yet
    checked = fit.checked(min_r2=0.95, max_rel_residual=0.35)
    assert checked.passed is True and checked.min_r2 == 0.95 and checked.max_rel_residual_allowed == 0.35
    import dataclasses

    t = dataclasses.replace(t, fit=checked, profile_settings={"batch_sizes": (1, 2, 4), "measure_steps": 6})
    path = tmp_path / "t.json"
    t.save(path)
    loaded = CostTable.load(path)
    assert loaded == t and loaded.fit == checked and dict(loaded.profile_settings)["batch_sizes"] == [1, 2, 4]
    assert json.loads(path.read_text())["fit"]["passed"] is True
    # A table without a fit record (written by hand) still loads; its fit is None.
    assert CostTable.from_json(staircase().to_json()).fit is None
    with pytest.raises(CostTableError, match="fit: unknown keys"):
        CostTable.from_dict({**t.to_dict(), "fit": {**checked.to_dict(), "p_value": 0.1}})


def test_noisy_medians_fail_the_quality_thresholds():
    """A synthetic sweep whose batch-2 cell at M=4 ran 3x slow (another job on the machine): the
    additive form cannot fit the four cells two batch sizes share, and the fit's quality says so."""
    clean = {(b, m): 5.0 + 0.5 * b + 0.25 * m for b in (1, 2) for m in (b, 2 * b, 3 * b, 4 * b, 5 * b)}
    t = fit_cost_table([(b, m, ms) for (b, m), ms in clean.items()])
    assert t.fit.max_rel_residual == pytest.approx(0.0, abs=1e-9) and not t.fit.problems(0.95, 0.35)
    noisy = {**clean, (2, 4): 3 * clean[(2, 4)]}
    t = fit_cost_table([(b, m, ms) for (b, m), ms in noisy.items()])
    assert t.fit.max_rel_residual > 0.35 and t.fit.worst_cell in {(1, 2), (1, 4), (2, 2), (2, 4)}
    problems = t.fit.problems(min_r2=0.95, max_rel_residual=0.35)
    assert any("max_rel_residual = 35%" in p for p in problems), problems
    assert t.fit.checked(0.95, 0.35).passed is False
    assert "quality check FAILED" in t.fit.checked(0.95, 0.35).describe()


def test_bounded_fit_replaces_a_negative_fixed_overhead():
    """Batch 8 measured cheaper than batch 1 at the same M: the unconstrained fit prices batch 8 at M=1 (a
    pair no step reaches) below zero, which left a negative fixed overhead and no table. The bounded
    least-squares fit (every component >= 0) is the table now, and the fit records that and its residuals."""
    meas = [(1, 1, 10.0), (1, 2, 10.5), (1, 8, 14.0), (8, 8, 3.0), (8, 16, 6.0), (8, 64, 20.0)]
    t = fit_cost_table(meas, fingerprint=FP)
    assert t.fit.bounded and t.fit.unbounded_fixed_overhead_ms == pytest.approx(-1.0)
    assert t.fixed_overhead_ms >= 0 and min(t.theta_ms) == 0.0 and min(t.batch_overhead_ms) == 0.0
    assert t.cheapest_step_ms > 0
    residuals = [ms - t.step_ms(m, b) for b, m, ms in meas]
    assert t.fit.max_abs_residual_ms == pytest.approx(max(abs(r) for r in residuals))
    assert t.fit.rms_residual_ms == pytest.approx(math.sqrt(sum(r * r for r in residuals) / len(meas)))
    # It is the least-squares fit under the bound: no other additive table with components >= 0 fits closer.
    import numpy as np
    from scipy.optimize import lsq_linear

    bss, ms_ = [1, 8], [1, 2, 8, 16, 64]
    design = np.zeros((len(meas), 1 + len(bss) + len(ms_)))
    for row, (b, m, _) in enumerate(meas):
        design[row, [0, 1 + bss.index(b), 1 + len(bss) + ms_.index(m)]] = 1.0
    best = lsq_linear(design, np.array([ms for *_, ms in meas]), bounds=(0, np.inf), method="trf", tol=1e-12)
    assert sum(r * r for r in residuals) == pytest.approx(2 * best.cost, rel=1e-6)


def test_cheapest_step_counts_only_pairs_a_step_can_reach():
    # Batch 8 is the cheapest batch overhead, theta(1) the cheapest theta, but a batch of 8 sends >= 8 tokens.
    t = CostTable(token_counts=(1, 8, 16), theta_ms=(0.0, 2.0, 3.0), fixed_overhead_ms=0.0, batch_sizes=(1, 8),
                  batch_overhead_ms=(1.0, 0.0))
    assert t.cheapest_step_ms == pytest.approx(1.0)  # batch 1 at M=1 (batch 2..8 at M >= 2 costs >= 2.0)
    with pytest.raises(CostTableError, match="cannot be free"):
        CostTable(token_counts=(1, 8), theta_ms=(0.0, 2.0), fixed_overhead_ms=0.0, batch_sizes=(1, 8),
                  batch_overhead_ms=(0.0, 1.0))


def test_fingerprint_digest_covers_the_checked_fields_only():
    assert fingerprint_digest(FP) == fingerprint_digest({**FP, "hostname": "node2"})
    assert fingerprint_digest(FP) != fingerprint_digest({**FP, "dtype": "float32"})
    assert len(fingerprint_digest(FP)) == 12
