"""Verify-budget planner: global argmax on a staircase, declines, lag vs fresh, overrides, refusals, oracle."""

import pytest
import torch

from dspark.cost_table import CostTable
from dspark.planner import (REASONS, SMALL_BATCH_REASON, UNPLANNED_REASONS, Planner, PlannerConfig, PlannerConfigError,
                            oracle_bound, plan_budget)
from dspark.stats import EngineStats

# One request, G = 4, prefix survival 0.9 0.8 0.7 0.6 (each admitted cell adds its survival to tau).
# The table's staircase makes tau/T rise (n=1), dip (n=2), peak (n=3) and fall (n=4):
#   tau(n) = 1, 1.9, 2.7, 3.4, 4.0 ; T(M=n+1) = 1.0, 1.5, 2.5, 2.5, 3.5
#   tau/T  = 1.0, 1.267, 1.08, 1.36, 1.143
SURV = [[0.9, 0.8, 0.7, 0.6]]
STAIRS = CostTable(token_counts=(1, 2, 3, 4, 5), theta_ms=(1.0, 1.5, 2.5, 2.5, 3.5))


def cfg(**kw):
    base = dict(block=4, mode="ragged", algorithm="global", budget_lag=0, min_verify_len=0, min_predicted_gain=0.0,
                temperature_positive=False)
    base.update(kw)
    return PlannerConfig(**base)


def plan(config, surv=SURV, sizing=None, table=STAIRS, temp=False, **kw):
    return plan_budget(ranking_survival=surv, sizing_survival=surv if sizing is None else sizing, table=table,
                       config=config, temperature_positive=temp, **kw)


def test_global_argmax_beats_first_descent_on_a_staircase():
    d = plan(cfg())
    assert d.reason == "trimmed" and d.trimmed
    assert d.windows == (3,) and d.budget == 3
    assert d.predicted_gain == pytest.approx(1.36 / (4.0 / 3.5) - 1.0)
    assert d.predicted_tokens == pytest.approx(3.4) and d.predicted_ms == pytest.approx(2.5)
    # Algorithm 1 stops at the first drop (n=2) and keeps n=1.
    g = plan(cfg(algorithm="greedy_stop"))
    assert g.windows == (1,) and g.reason == "trimmed"


def test_uniform_mode_respects_the_ladder():
    assert plan(cfg(mode="uniform")).windows == (3,)
    d = plan(cfg(mode="uniform", allowed_verify_lens=(1, 4)))
    assert d.windows == (1,) and d.reason == "trimmed"
    d = plan(cfg(mode="uniform", allowed_verify_lens=(2, 4)))  # 1.08 < 1.143: the full block is best
    assert d.windows == (4,) and d.reason == "declined_below_min_gain" and not d.trimmed


def test_min_predicted_gain():
    assert plan(cfg(min_predicted_gain=0.10)).reason == "trimmed"  # gain is 19%
    d = plan(cfg(min_predicted_gain=0.25))
    assert d.reason == "declined_below_min_gain" and d.windows == (4,) and d.budget == 4
    assert d.predicted_gain == pytest.approx(0.19, abs=0.001)  # the best candidate's gain is still reported


def test_declines_without_a_usable_table_and_counts_reasons():
    flat = CostTable(token_counts=(1, 5), theta_ms=(2.0, 2.01), fixed_overhead_ms=1.0)
    stats = EngineStats()
    p_none = Planner(cfg(), None, stats=stats)
    p_flat = Planner(cfg(), flat, stats=stats)
    for _ in range(3):
        d = p_none.plan(SURV, [0])
        assert d.reason == "declined_no_table" and d.windows == (4,) and not d.trimmed and d.predicted_ms is None
    d = p_flat.plan(SURV, [0])
    assert d.reason == "declined_flat_cost" and d.windows == (4,)
    assert stats.plan_reasons == {"declined_no_table": 3, "declined_flat_cost": 1}


def test_mixed_step_and_snapshot_declines():
    assert plan(cfg(), is_mixed_step=True).reason == "declined_mixed_step"
    assert plan(cfg(skip_mixed_trim=False), is_mixed_step=True).reason == "trimmed"
    assert plan(cfg(), snapshot_ready=False).reason == "declined_snapshot_not_ready"


def test_steps_below_min_rows_verify_the_whole_block():
    """PlannerConfig.min_rows (engine.plan_min_rows): a step of fewer requests declines with its own reason and
    the full block's prices; at or above it the decision is the one the planner makes without the setting."""
    small = plan(cfg(min_rows=2))
    assert small.reason == SMALL_BATCH_REASON and not small.trimmed and small.windows == (4,)
    assert small.predicted_ms == STAIRS.step_ms(5, 1) and small.predicted_tokens == pytest.approx(4.0)
    assert SMALL_BATCH_REASON in REASONS and SMALL_BATCH_REASON in UNPLANNED_REASONS
    free = plan(cfg())
    assert free.trimmed and plan(cfg(min_rows=1)) == free
    assert plan(cfg(min_rows=2), table=None).reason == "declined_no_table"  # a missing table shows first
    with pytest.raises(PlannerConfigError, match="planner.min_rows: must be an integer >= 0"):
        cfg(min_rows=-1)


# Two requests, G = 2. Sizing (lagged) and fresh survival favour different requests.
LAGGED = [[0.9, 0.1], [0.2, 0.1]]
FRESH = [[0.2, 0.1], [0.9, 0.1]]
# R = 2: M = 2 + n. tau(n) on LAGGED = 2, 2.9, 3.1, 3.2, 3.3 ; T = 1, 1, 2, 2, 2 -> best n = 1.
TWO = CostTable(token_counts=(2, 3, 4, 5, 6), theta_ms=(1.0, 1.0, 2.0, 2.0, 2.0))


def test_budget_sized_on_lagged_survival_cells_ranked_on_fresh():
    c = PlannerConfig(block=2, budget_lag=1, min_verify_len=0, min_predicted_gain=0.0)
    d = plan_budget(ranking_survival=FRESH, sizing_survival=LAGGED, table=TWO, config=c, temperature_positive=True)
    assert d.reason == "trimmed" and d.budget == 1
    assert d.windows == (0, 1)  # ranked fresh: request 1's first draft
    ranked_on_lagged = plan_budget(ranking_survival=LAGGED, sizing_survival=LAGGED, table=TWO, config=c,
                                   temperature_positive=True)
    assert ranked_on_lagged.windows == (1, 0)
    deferred = plan_budget(ranking_survival=None, sizing_survival=LAGGED, table=TWO, config=c, temperature_positive=True)
    assert deferred.windows is None and deferred.budget == 1  # allocation left to the device kernel


def test_planner_lag_buffer_is_per_slot_and_reset_is_neutral():
    c = PlannerConfig(block=2, budget_lag=1, min_verify_len=0, min_predicted_gain=0.0)
    p = Planner(c, TWO)
    first = p.plan(LAGGED, [5, 9])  # nothing observed yet: neutral survival 1.0 sizes the budget
    assert first.predicted_tokens == pytest.approx(2 + 4 * 1.0)
    second = p.plan(FRESH, [5, 9])  # sized on the previous step's LAGGED rows, ranked on FRESH
    assert second.windows == (0, 1) and second.budget == 1
    # Batch order changes between steps: sizing follows the slot, so swapped rows give the same decision.
    p2 = Planner(c, TWO)
    p2.plan(LAGGED, [5, 9])
    swapped = p2.plan(FRESH[::-1], [9, 5])
    assert swapped.windows == (1, 0) and swapped.budget == 1
    # Batch order changes: rows follow slots, not positions.
    assert p.sizing_row(9, [0, 0]) == FRESH[1] and p.sizing_row(5, [0, 0]) == FRESH[0]
    p.reset_slot(9)
    assert p.sizing_row(9, [0.0, 0.0]) == [1.0, 1.0]  # the newcomer never inherits the predecessor's scores
    lag2 = Planner(PlannerConfig(block=2, budget_lag=2, min_verify_len=0), TWO)
    lag2.plan(LAGGED[:1], [0])
    lag2.plan(FRESH[:1], [0])
    assert lag2.sizing_row(0, [0, 0]) == LAGGED[0]  # two steps old


def test_planner_uses_injected_clock():
    ticks = iter([10.0, 10.5])
    stats = EngineStats()
    Planner(cfg(), STAIRS, stats=stats, clock=lambda: next(ticks)).plan(SURV, [0])
    assert stats.plan_ms_total == pytest.approx(500.0)


def test_global_over_fresh_confidence_refused_when_sampling():
    with pytest.raises(PlannerConfigError, match="budget_lag>=1 or algorithm=greedy_stop"):
        PlannerConfig(block=4, algorithm="global", budget_lag=0, temperature_positive=True)
    PlannerConfig(block=4, algorithm="global", budget_lag=1, temperature_positive=True)
    PlannerConfig(block=4, algorithm="greedy_stop", budget_lag=0, min_predicted_gain=0.0, temperature_positive=True)
    # A config that claimed greedy decoding is still refused on a step that samples.
    with pytest.raises(PlannerConfigError, match="temperature > 0"):
        plan(cfg(), temp=True)


def test_greedy_stop_refuses_settings_that_reintroduce_anticipation():
    with pytest.raises(PlannerConfigError, match="budget_lag"):
        PlannerConfig(block=4, algorithm="greedy_stop", budget_lag=2, min_predicted_gain=0.0)
    with pytest.raises(PlannerConfigError, match="min_predicted_gain"):
        PlannerConfig(block=4, algorithm="greedy_stop", budget_lag=0, min_predicted_gain=0.02)
    with pytest.raises(PlannerConfigError, match="gaps"):
        PlannerConfig(block=5, mode="uniform", algorithm="greedy_stop", budget_lag=0, min_predicted_gain=0.0,
                      allowed_verify_lens=(1, 3, 5))


def test_overrides_replace_only_the_decision():
    with pytest.raises(PlannerConfigError, match="force_verify_len: 2 is not on the tier ladder"):
        cfg(mode="uniform", allowed_verify_lens=(1, 3, 4), force_verify_len=2)
    with pytest.raises(PlannerConfigError, match="exclusive"):
        cfg(force_verify_len=2, force_budget_frac=0.5)
    with pytest.raises(PlannerConfigError, match="mode=ragged"):
        cfg(mode="uniform", force_budget_frac=0.5)
    d = plan(cfg(force_verify_len=2), table=None)  # works without a table: it exists to test packing
    assert d.reason == "forced" and d.windows == (2,) and d.trimmed and d.predicted_ms is None
    d = plan_budget(ranking_survival=FRESH, sizing_survival=LAGGED, table=TWO, temperature_positive=True,
                    config=PlannerConfig(block=2, budget_lag=1, min_verify_len=0, force_budget_frac=0.25))
    assert d.reason == "forced" and d.budget == 1 and d.windows == (0, 1)


def test_config_validation_names_the_key():
    for kw, key in [(dict(budget_lag=3), "budget_lag"), (dict(mode="tree"), "mode"), (dict(algorithm="x"), "algorithm"),
                    (dict(min_verify_len=5), "min_verify_len"), (dict(min_predicted_gain=-0.1), "min_predicted_gain"),
                    (dict(mode="uniform", allowed_verify_lens=(1, 3)), "allowed_verify_lens"),
                    (dict(mode="uniform", allowed_verify_lens=(3, 1, 4)), "allowed_verify_lens"),
                    (dict(allowed_verify_lens=(1, 4)), "allowed_verify_lens")]:
        with pytest.raises(PlannerConfigError, match=f"planner.{key}"):
            cfg(**kw)
    with pytest.raises(PlannerConfigError, match="unknown keys"):
        PlannerConfig.from_dict({"block": 4, "lag": 1})


def test_bad_survival_is_refused():
    with pytest.raises(ValueError, match="rises at position 1"):
        plan(cfg(), surv=[[0.5, 0.9, 0.1, 0.0]])
    with pytest.raises(ValueError, match="block=4"):
        plan(cfg(), surv=[[0.5, 0.4]])


def test_min_verify_len_clamp_is_priced():
    d = plan(cfg(min_verify_len=2))  # candidates start at window 2: 1.08, 1.36, 1.143
    assert d.windows == (3,) and d.budget == 3


def test_oracle_bound_hand_computed():
    table = CostTable(token_counts=(2, 4, 6, 8, 10), theta_ms=(1.0, 2.0, 3.0, 4.0, 5.0), fixed_overhead_ms=1.0)
    # block 4, two steps of batch 2. Step 1 accepts (0, 4), step 2 accepts (1, 2).
    out = oracle_bound([[0, 4], [1, 2]], [2, 2], table, block=4, measured_ms=[6.5, 6.0])
    # tokens: (1 + 5) + (2 + 3) = 11. Full block: M = 10 each -> 6 ms x 2 = 12 ms.
    # Oracle windows = accepted: M = 1 + 5 = 6 -> 4 ms; M = 2 + 3 = 5 -> steps up to 6 -> 4 ms: 8 ms.
    assert out["tokens"] == 11
    assert out["full_block_ms"] == pytest.approx(12.0)
    assert out["oracle_ms"] == pytest.approx(8.0)
    assert out["headroom_vs_full_block"] == pytest.approx(0.5)
    assert out["headroom_vs_measured"] == pytest.approx(12.5 / 8.0 - 1.0)
    # in service the steps took 12.5 ms; the oracle would save the table's 4 ms of them: 12.5 / 8.5
    assert out["headroom_in_service"] == pytest.approx(12.5 / 8.5 - 1.0)
    slow = oracle_bound([[0, 4], [1, 2]], [2, 2], table, block=4, measured_ms=[30.0, 30.0])
    assert slow["headroom_in_service"] == pytest.approx(60.0 / 56.0 - 1.0)
    assert slow["headroom_in_service"] < out["headroom_in_service"]
    assert "headroom_in_service" not in oracle_bound([[0, 4], [1, 2]], [2, 2], table, block=4)
    incl = oracle_bound([[0, 4], [1, 2]], [2, 2], table, block=4, include_rejected_draft=True)
    # windows (1, 4) -> M 7 -> 8 -> 5 ms ; (2, 3) -> M 7 -> 5 ms
    assert incl["oracle_ms"] == pytest.approx(10.0)
    with pytest.raises(ValueError, match="batch size 3"):
        oracle_bound([[0, 1]], [3], table, block=4)
    with pytest.raises(ValueError, match=r"\[0, block=4\]"):
        oracle_bound([[5, 1]], [2], table, block=4)


def test_survival_helpers_feed_the_planner():
    import torch

    from dspark.survival import calibrated_confidence, neutral_survival_row, prefix_survival, reset_slot_

    logits = torch.tensor([[2.0, 0.0, -1.0, 4.0]])
    temps = torch.tensor([1.0, 2.0, 0.5, 4.0])
    conf = calibrated_confidence(logits, temps)
    assert conf[0].tolist() == pytest.approx([torch.sigmoid(torch.tensor(v)).item() for v in (2.0, 0.0, -2.0, 1.0)])
    surv = prefix_survival(conf)
    assert surv[0, 2].item() == pytest.approx(conf[0, :3].prod().item())
    assert all(surv[0, j + 1] <= surv[0, j] for j in range(3))
    with pytest.raises(ValueError, match="one STS temperature per drafted position"):
        calibrated_confidence(logits, temps[:3])
    # A torch tensor goes straight into the planner, which reads its values as it reads a list's.
    from_tensor, from_list = plan(cfg(), surv=surv), plan(cfg(), surv=surv.tolist())
    assert from_tensor.windows == from_list.windows == (1,) and from_tensor.budget == from_list.budget
    assert from_tensor.predicted_gain == pytest.approx(from_list.predicted_gain)
    buf = torch.full((3, 4), 0.1)
    reset_slot_(buf, 1)
    assert buf[1].tolist() == [1.0] * 4 and buf[0].tolist() == pytest.approx([0.1] * 4)
    reset_slot_(buf, 2, prior=[0.9, 0.8, 0.5, 0.5])
    assert buf[2].tolist() == pytest.approx([0.9, 0.8, 0.5, 0.5])
    with pytest.raises(ValueError, match="non-increasing"):
        neutral_survival_row(3, prior=[0.5, 0.9, 0.1])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("min_len", [0, 1, 3])
def test_vectorised_global_ragged_walk_is_the_cell_by_cell_walk(seed, min_len):
    """The numpy walk returns the reference walk's value, budget and windows exactly, ties and
    zero-survival cells included."""
    import random

    from dspark.cost_table import CostTable
    from dspark.planner import PlannerConfig, _global_ragged_walk
    from dspark.survival import prefix_survival

    rng = random.Random(seed)
    R, G = rng.choice([(1, 4), (5, 7), (33, 7), (64, 3)])
    conf = torch.rand(R, G, generator=torch.Generator().manual_seed(seed))
    conf = torch.where(conf < 0.15, torch.zeros_like(conf), conf)  # zero cells
    conf[::3] = 0.5  # tied rows
    rows = prefix_survival(conf).tolist()
    counts = tuple(range(1, R * (G + 1) + 8))
    theta = tuple(0.2 + 0.004 * m + (0.3 if m > R * 2 else 0.0) for m in counts)  # a step in the middle
    table = CostTable(token_counts=counts, theta_ms=theta, fixed_overhead_ms=1.0,
                      batch_sizes=(1, 64), batch_overhead_ms=(0.0, 0.2), trim_overhead_ms=(0.05, 0.1 * (seed % 3)))
    cfg = PlannerConfig(block=G, mode="ragged", min_verify_len=min(min_len, G))
    assert _global_ragged_walk(rows, table, R, cfg) == walk_cell_by_cell(rows, table, R, cfg)


def walk_cell_by_cell(rows, table, bs, cfg):
    """The global ragged search as specified: admit cells one at a time in (survival desc,
    position, request) order, value each prefix as tau / T, keep the last best."""
    cells = sorted((-v, g, r) for r, row in enumerate(rows) for g, v in enumerate(row))
    windows = [cfg.min_verify_len] * len(rows)
    tau = len(rows) + sum(sum(row[: cfg.min_verify_len]) for row in rows)
    m = len(rows) * (cfg.min_verify_len + 1)
    full = len(rows) * (cfg.block + 1)  # every smaller prefix is a trimmed step: it pays the trim overhead
    best = (tau / table.step_ms(m, bs, trimmed=m < full), 0, tuple(windows))
    for n, (neg_v, g, r) in enumerate(cells, start=1):
        if g < cfg.min_verify_len:
            continue
        windows[r], tau, m = g + 1, tau - neg_v, m + 1
        value = tau / table.step_ms(m, bs, trimmed=m < full)
        if value >= best[0]:
            best = (value, n, tuple(windows))
    return best


def test_check_survival_names_the_first_bad_value():
    from dspark.survival import check_survival

    check_survival([[1.0, 0.5, 0.5], [0.2, 0.0, 0.0]])
    check_survival([[0.5, 0.50001]], atol=1e-4)
    with pytest.raises(ValueError, match=r"survival\[1\]\[2\] = nan"):
        check_survival([[1.0, 0.5, 0.5], [0.2, 0.1, float("nan")]])
    with pytest.raises(ValueError, match=r"s\[0\]\[0\] = 1.5 is outside"):
        check_survival([[1.5, 0.5]], name="s")
    with pytest.raises(ValueError, match="rises at position 2"):
        check_survival([[0.9, 0.5, 0.6], [0.2, 0.1, 0.0]])
    with pytest.raises(ValueError, match="rises at position 1"):
        check_survival([[0.9, 0.5], [0.2]] + [[0.1, 0.3]])  # ragged rows take the row-by-row path


@pytest.mark.parametrize("seed", range(4))
def test_cells_past_min_len_counts_the_admission_walk(seed):
    from dspark.planner import _walk_order, cells_past_min_len
    from dspark.survival import prefix_survival

    conf = torch.rand(9, 5, generator=torch.Generator().manual_seed(seed))
    conf[::2] = 0.5  # ties across rows and positions
    rows = prefix_survival(conf).tolist()
    for budget in (0, 1, 7, 23, 45, 60):
        for m in (0, 1, 3):
            want = sum(1 for _, g in _walk_order(rows)[:budget] if g >= m)
            assert cells_past_min_len(rows, budget, m) == want


@pytest.mark.parametrize("R,G", [(1, 4), (7, 7), (256, 7)])
def test_uniform_taus_are_the_python_sums_bit_for_bit(R, G):
    from dspark.planner import _uniform_taus
    from dspark.survival import prefix_survival

    rows = prefix_survival(torch.rand(R, G, generator=torch.Generator().manual_seed(R))).tolist()
    taus = _uniform_taus(rows)
    for v in range(G + 1):
        assert float(taus[v]) == R + sum(sum(row[:v]) for row in rows)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("min_len", [0, 1, 2])
def test_ragged_decisions_carry_the_device_allocations_extra_cells(seed, min_len):
    """extra_cells is the count of walked cells at or past min_verify_len (what the engine hands
    the device), for the global search and for forced budgets."""
    from dspark.planner import cells_past_min_len
    from dspark.survival import prefix_survival

    R, G = 24, 7
    rows = prefix_survival(torch.rand(R, G, generator=torch.Generator().manual_seed(seed))).tolist()
    counts = tuple(range(1, R * (G + 1) + 1))
    table = CostTable(token_counts=counts, theta_ms=tuple(0.1 + 0.02 * m for m in counts), fixed_overhead_ms=0.5)
    for extra_cfg in ({}, {"force_budget_frac": 0.4}):
        cfg = PlannerConfig(block=G, mode="ragged", min_verify_len=min_len, budget_lag=1, **extra_cfg)
        d = plan_budget(ranking_survival=None, sizing_survival=rows, table=table, config=cfg,
                        temperature_positive=False)
        assert d.trimmed and d.windows is None
        assert d.extra_cells == cells_past_min_len(rows, d.budget, min_len)
    uniform = plan_budget(ranking_survival=None, sizing_survival=rows, table=table, temperature_positive=False,
                          config=PlannerConfig(block=G, mode="uniform", min_verify_len=min_len, budget_lag=1))
    assert uniform.extra_cells is None


def test_trim_overhead_is_paid_by_every_trimmed_plan_and_by_the_oracle():
    """A trimmed step runs another path (draft and verify graphs apart) than the fused full step:
    the table's trim overhead is added to every plan that trims. A trim the bare table favours by
    19% is declined once the overhead eats the gain, in both modes; the oracle keeps the full
    block on a step where trimming would cost more."""
    import dataclasses

    taxed = dataclasses.replace(STAIRS, batch_sizes=(1,), batch_overhead_ms=(0.0,), trim_overhead_ms=(0.6,))
    assert taxed.step_ms(3, 1, trimmed=True) == pytest.approx(taxed.step_ms(3, 1) + 0.6)
    assert plan(cfg()).reason == "trimmed"
    for mode in ("ragged", "uniform"):
        d = plan(cfg(mode=mode), table=taxed)
        assert d.reason == "declined_below_min_gain" and d.windows == (4,) and not d.trimmed
        assert d.predicted_ms == pytest.approx(3.5)  # the untrimmed plan pays no overhead
    small = dataclasses.replace(taxed, trim_overhead_ms=(0.1,))
    d = plan(cfg(), table=small)  # 3.4 / 2.6 still beats 4.0 / 3.5: trims, priced with the overhead
    assert d.reason == "trimmed" and d.predicted_ms == pytest.approx(2.6)
    g = plan(cfg(algorithm="greedy_stop"), table=taxed)
    assert g.windows == (1,) and g.predicted_ms == pytest.approx(1.5 + 0.6)  # Algorithm 1's price carries it too
    table = CostTable(token_counts=(2, 4, 6, 8, 10), theta_ms=(1.0, 2.0, 3.0, 4.0, 5.0), fixed_overhead_ms=1.0,
                      batch_sizes=(2,), batch_overhead_ms=(0.0,), trim_overhead_ms=(1.5,))
    out = oracle_bound([[0, 4], [1, 2]], [2, 2], table, block=4)
    # trimmed costs 4 + 1.5 = 5.5 < 6 on both steps; with an overhead of 2.5 the oracle keeps the full block
    assert out["oracle_ms"] == pytest.approx(11.0)
    costly = dataclasses.replace(table, trim_overhead_ms=(2.5,))
    assert oracle_bound([[0, 4], [1, 2]], [2, 2], costly, block=4)["oracle_ms"] == pytest.approx(12.0)


def test_lag_rings_follow_slots_grow_and_refuse_bad_slots():
    """The per-slot lag rings: rows come back budget_lag steps later by slot (any order, any slot
    number: the rings grow), a reset slot reads neutral, and duplicate or negative slots are refused."""
    import numpy as np

    from dspark.planner import Planner, PlannerConfig

    p = Planner(PlannerConfig(block=2, budget_lag=2, min_verify_len=0), None)
    a, b, c = [0.9, 0.5], [0.8, 0.1], [0.7, 0.6]
    p.push_snapshot([3, 40], [a, b])
    p.push_snapshot([40, 3], [c, c])  # the batch order changed; rows still follow their slot
    assert p.lagged_rows([3, 40, 7], newest_age=1).tolist() == [a, b, [1.0, 1.0]]  # 7: never pushed
    assert p.lagged_rows([40], newest_age=2).tolist() == [c]  # the overlap scheduler's newest-is-2-old
    assert p.lagged_row(3, newest_age=1) == a
    p.reset_slot(40)
    assert p.lagged_rows([40, 3], newest_age=1).tolist() == [[1.0, 1.0], a]
    p.push_snapshot([1000], [[0.3, 0.2]])  # grows the rings
    p.push_snapshot([1000], [[0.2, 0.1]])
    assert p.lagged_rows(np.array([1000]), newest_age=1).tolist() == [[0.3, 0.2]]
    with pytest.raises(ValueError, match="duplicate"):
        p.push_snapshot([5, 5], [a, b])
    with pytest.raises(ValueError, match=">= 0"):
        p.push_snapshot([-1], [a])
    with pytest.raises(ValueError, match="rises"):
        p.push_snapshot([5], [[0.2, 0.4]])  # per-position confidence, not survival
    with pytest.raises(ValueError, match="2 survival rows for 1 slots"):
        p.push_snapshot([5], [a, b])


@pytest.mark.parametrize("lag", [1, 2])
@pytest.mark.parametrize("seed", range(3))
def test_pending_checked_snapshots_read_as_pushes_applied_one_by_one(lag, seed):
    """push_checked_snapshot only queues its push (the engine's commit on a step the plan gate skips); resets and
    pushes queued in any order, across new slots and past the pending limit, read back exactly as push_snapshot
    and reset_slot applied one at a time do."""
    import numpy as np

    from dspark.planner import PENDING_SNAPSHOTS, Planner, PlannerConfig

    rng = np.random.default_rng(seed)
    cfg = PlannerConfig(block=3, budget_lag=lag, min_verify_len=0)
    eager, queued = Planner(cfg, None), Planner(cfg, None)
    written = []
    queued_write = queued._write_pending
    queued._write_pending = lambda: written.append(len(queued._pending)) or queued_write()
    for step in range(3 * PENDING_SNAPSHOTS):
        for slot in rng.choice(24, size=int(rng.integers(0, 3)), replace=False).tolist():
            eager.reset_slot(slot)
            queued.reset_slot(slot)
        slots = rng.choice(24, size=int(rng.integers(1, 9)), replace=False)
        rows = np.sort(rng.random((slots.size, 3)), axis=1)[:, ::-1].astype(np.float32)
        eager.push_snapshot(slots.tolist(), rows)
        queued.push_checked_snapshot(slots.tolist(), rows)
        if rng.random() < 0.1 or step == 3 * PENDING_SNAPSHOTS - 1:
            every = list(range(30))
            for age in range(1, lag + 1):
                assert queued.lagged_rows(every, age).tolist() == eager.lagged_rows(every, age).tolist()
            assert queued._pushed[:24].tolist() == eager._pushed[:24].tolist()
    assert written and max(written) <= PENDING_SNAPSHOTS  # the queue stays bounded


def test_the_queue_of_checked_snapshots_is_written_once_per_read():
    """Pushes queued since the last read cost one write of the rings at the next read, none before."""
    import numpy as np

    from dspark.planner import Planner, PlannerConfig

    p = Planner(PlannerConfig(block=2, budget_lag=2, min_verify_len=0), None)
    for i in range(5):
        p.push_checked_snapshot([0, 1], np.array([[0.9, 0.1 * i], [0.5, 0.4]]))
    p.reset_slot(1)
    p.push_checked_snapshot([1], np.array([[0.3, 0.2]]))
    assert p._pushed.size == 0 and len(p._pending) == 7  # nothing written yet
    assert p.lagged_rows([0, 1], newest_age=1).tolist() == [[0.9, 0.30000000000000004], [1.0, 1.0]]
    assert p.lagged_rows([0, 1], newest_age=2).tolist() == [[0.9, 0.4], [0.3, 0.2]]
    assert not p._pending and p._pushed[:2].tolist() == [5, 1]


@pytest.mark.parametrize("seed", range(4))
def test_forced_host_allocation_is_the_admission_walk(seed):
    """_allocate_host (the forced-budget windows) counts each request's cells among the first
    ``budget`` of the Python admission walk, clamped to [min_len, block]; ties included."""
    import random

    from dspark.planner import _allocate_host, _walk_order

    rnd = random.Random(seed)
    rows = []
    for _ in range(rnd.randint(1, 9)):
        s, row = 1.0, []
        for _ in range(5):
            s = s * rnd.choice([1.0, 0.5, 0.9, rnd.random()])  # repeats make ties
            row.append(s)
        rows.append(row)
    for budget in range(0, 5 * len(rows) + 2, 3):
        for min_len in (0, 1, 2):
            counts = [0] * len(rows)
            for r, _ in _walk_order(rows)[:budget]:
                counts[r] += 1
            assert _allocate_host(rows, budget, min_len, 5) == [min(max(c, min_len), 5) for c in counts]
