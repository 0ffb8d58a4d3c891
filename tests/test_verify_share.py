"""engine.verify_share: per batch bucket, the whole drafted block or a fixed share of its cells, whichever measured
faster; the rule, its settings, and the engine running it on the device path without a planner."""

import pytest

from dspark.bench.guards import did_nothing_guard
from dspark.config import ConfigError, EngineConfig, SamplingParams
from dspark.engine import Engine
from dspark.planner import REASONS
from dspark.verify_share import SHARE_FULL_REASON, SHARE_REASON, VerifyShareChoice, share_budget
from test_engine_lossless import prompts_for
from test_engine_scheduling import device_step_models_and_table
from tiny import tiny_engine_config


def test_the_choice_measures_both_kinds_in_turn_then_keeps_the_faster_and_explores():
    choice = VerifyShareChoice(share=0.75, min_steps=2, explore_every=5)
    kinds = []
    for step in range(12):
        share = choice.alternative(256)
        kinds.append(share)
        # the share commits 10 tokens in 1 ms, the whole block 10 tokens in 2 ms
        choice.record(256, alternative=share, tokens=10, step_ms=1.0 if share else 2.0)
    assert kinds[:4] == [False, True, False, True]  # the whole block first, then one of each in turn
    assert kinds[5:9] == [True, True, True, True] and kinds[4] is False and kinds[9] is False  # explores every 5th
    s = choice.summary()
    assert s["verify_share/b256/share_tok_per_ms"] == 10.0 and s["verify_share/b256/full_tok_per_ms"] == 5.0
    assert s["verify_share/b256/share_steps"] + s["verify_share/b256/full_steps"] == 12
    assert s["verify_share/b256/share_vs_full_pct"] == 100.0 and s["verify_share/b256/pairs"] == 7
    assert share_budget(choice.share, 256, 7) == round(0.75 * 256 * 7)
    assert SHARE_REASON in REASONS and SHARE_FULL_REASON in REASONS


def test_reset_counts_restarts_the_reported_counts_and_keeps_the_choice():
    choice = VerifyShareChoice(share=0.75, min_steps=1, explore_every=50)
    for _ in range(6):
        share = choice.alternative(64)
        choice.record(64, alternative=share, tokens=10, step_ms=1.0 if share else 2.0)
    assert choice.summary()["verify_share/b64/pairs"] == 1  # the warm-up's whole block, then its share
    choice.reset_counts()
    s = choice.summary()
    assert s["verify_share/b64/share_steps"] == s["verify_share/b64/full_steps"] == s["verify_share/b64/pairs"] == 0
    assert s["verify_share/b64/share_vs_full_pct"] == 100.0 and choice.alternative(64)  # the choice persists
    choice.record(64, alternative=True, tokens=10, step_ms=1.0)
    assert choice.summary()["verify_share/b64/pairs"] == 0  # the step before the reset is not its neighbour


@pytest.mark.parametrize("share", [0.0, 1.0, 1.5, -0.2, True, "half"])
def test_a_share_outside_the_open_unit_interval_is_refused(share):
    with pytest.raises(ConfigError, match="engine.verify_share: must be a number in"):
        EngineConfig(verify="ragged", cuda_graphs=True, verify_share=share)
    if not isinstance(share, (bool, str)):
        with pytest.raises(ValueError, match="share must be a number in"):
            VerifyShareChoice(share=share)


def test_the_share_needs_a_ragged_engine_and_no_forced_decision():
    with pytest.raises(ConfigError, match="engine.verify_share: picks each step's cells from fresh survival"):
        EngineConfig(verify="full", cuda_graphs=True, verify_share=0.75)
    with pytest.raises(ConfigError, match="force_budget_frac do: set one"):
        EngineConfig(verify="ragged", cuda_graphs=True, verify_share=0.75, force_budget_frac=0.5)
    assert EngineConfig(verify="ragged", cuda_graphs=True, verify_share=0.75).verify_share == 0.75


@pytest.mark.parametrize("overlap", [False, True])
def test_the_engine_runs_the_share_on_the_device_path_without_a_planner_and_stays_lossless(tmp_path, overlap):
    """Both kinds run at each batch bucket, the share's steps verify fewer cells, outputs are verify-all's,
    no planner call is made (no plan gate, no planner host time), and the did_nothing guard reads the share's
    trims."""
    target, drafter, lag, table = device_step_models_and_table(tmp_path, overlap)
    prompts = prompts_for(12, 4)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    base = Engine(target, None, tiny_engine_config(max_num_seqs=4), drafter)
    expected = [o.token_ids for o in base.generate(prompts, params)]
    eng = Engine(target, None, tiny_engine_config(max_num_seqs=4, verify="ragged", cost_table=table, cuda_graphs=True,
                                                  overlap=overlap, budget_lag=lag, min_verify_len=0,
                                                  verify_share=0.5), drafter)
    eng.share_choice.min_steps = 2
    assert [o.token_ids for o in eng.generate(prompts, params)] == expected
    c = eng.counters()
    assert eng.plan_gate is None and c["sched/plan_ms_total"] == 0.0
    share_steps = c[f"sched/plan_reason.{SHARE_REASON}"]
    assert c["trimmed_steps"] == share_steps > 0 and c[f"sched/plan_reason.{SHARE_FULL_REASON}"] > 0
    assert c["window_tokens"] < c["ceiling_tokens"]
    assert sum(v for k, v in c.items() if k.startswith("verify_share/b") and k.endswith("/share_steps")) > 0
    # the two kinds compared on adjacent committed steps (in commit order, with or without overlap)
    assert sum(v for k, v in c.items() if k.startswith("verify_share/b") and k.endswith("/pairs")) > 0
    assert any(k.endswith("/share_vs_full_pct") for k in c)
    guard = did_nothing_guard("B", {}, c, expects_trim=True, expects_graphs=False, expects_speculation=True)
    assert guard.passed and not guard.details.get("declined_all"), guard.message
    # a second run after reset() (an A/B's next block): the counts are that run's, the choice carries over
    eng.reset()
    assert [o.token_ids for o in eng.generate(prompts, params)] == expected
    c = eng.counters()
    counted = sum(v for k, v in c.items()
                  if k.startswith("verify_share/b") and k.endswith(("share_steps", "full_steps")))
    decided = c.get(f"sched/plan_reason.{SHARE_REASON}", 0) + c.get(f"sched/plan_reason.{SHARE_FULL_REASON}", 0)
    assert 0 < counted <= decided


def test_host_driven_steps_run_the_share_too(tmp_path):
    """Without CUDA graphs each step is host-driven: the choice decides the same way and the host allocates the
    share's cells from the step's fresh survival; outputs stay verify-all's."""
    target, drafter, _, table = device_step_models_and_table(tmp_path, False)
    prompts = prompts_for(12, 4)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    expected = [o.token_ids for o in Engine(target, None, tiny_engine_config(max_num_seqs=4), drafter).generate(
        prompts, params)]
    eng = Engine(target, None, tiny_engine_config(max_num_seqs=4, verify="ragged", cost_table=table, min_verify_len=0,
                                                  verify_share=0.5, allow_foreign_cost_table=True), drafter)
    eng.share_choice.min_steps = 2
    assert [o.token_ids for o in eng.generate(prompts, params)] == expected
    c = eng.counters()
    assert c["trimmed_steps"] == c[f"sched/plan_reason.{SHARE_REASON}"] > 0 and c["window_tokens"] < c["ceiling_tokens"]


def test_a_forced_share_without_a_minimum_window_decides_as_the_planner_would_without_its_host_work(tmp_path):
    """engine.force_budget_frac with min_verify_len=0 on the device path (ab=full_vs_forced_trim's B): the engine's
    decision is plan_budget's forced decision for any survival (its extra cells are its budget), it is recorded
    with no planner time, and outputs stay verify-all's."""
    import numpy as np

    from dspark.planner import PlannerConfig, plan_budget

    rng = np.random.default_rng(0)
    for rows, frac in ((3, 0.5), (8, 0.75), (5, 0.1)):
        surv = np.sort(rng.random((rows, 4)), axis=1)[:, ::-1]
        want = plan_budget(ranking_survival=None, sizing_survival=surv, table=None, temperature_positive=False,
                           config=PlannerConfig(block=4, budget_lag=2, min_verify_len=0, force_budget_frac=frac))
        assert want.extra_cells == want.budget == round(frac * rows * 4) and want.trimmed and want.windows is None
    target, drafter, lag, table = device_step_models_and_table(tmp_path, True)
    prompts = prompts_for(12, 4)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    expected = [o.token_ids for o in Engine(target, None, tiny_engine_config(max_num_seqs=4), drafter).generate(
        prompts, params)]
    eng = Engine(target, None, tiny_engine_config(max_num_seqs=4, verify="ragged", cost_table=table, cuda_graphs=True,
                                                  overlap=True, budget_lag=lag, min_verify_len=0,
                                                  force_budget_frac=0.5), drafter)
    assert [o.token_ids for o in eng.generate(prompts, params)] == expected
    c = eng.counters()
    assert c["sched/plan_reason.forced"] == c["trimmed_steps"] == c["decode_steps"] > 0
    assert c["sched/plan_ms_total"] == 0.0 and c["window_tokens"] < c["ceiling_tokens"]


@pytest.mark.parametrize("decider", ["share", "forced", "planner", "share_online_calibration"])
def test_the_launch_copies_survival_back_only_where_the_host_reads_it(tmp_path, decider):
    """A measured share and a forced share without a minimum window decide without the planner: their launched
    steps copy no survival back (the device's allocation reads it in place) and the planner queues no snapshot,
    while they still trim and stay lossless. The planner's arm, and a share whose head is calibrated online, read
    it."""
    target, drafter, lag, table = device_step_models_and_table(tmp_path, True)
    prompts = prompts_for(12, 4)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    expected = [o.token_ids for o in Engine(target, None, tiny_engine_config(max_num_seqs=4), drafter).generate(
        prompts, params)]
    extra = {"share": dict(verify_share=0.5, min_verify_len=0), "forced": dict(force_budget_frac=0.5, min_verify_len=0),
             "planner": {}, "share_online_calibration": dict(verify_share=0.5, min_verify_len=0,
                                                             online_calibration=True)}[decider]
    eng = Engine(target, None, tiny_engine_config(max_num_seqs=4, verify="ragged", cost_table=table, cuda_graphs=True,
                                                  overlap=True, budget_lag=lag, **extra), drafter)
    if eng.share_choice is not None:
        eng.share_choice.min_steps = 2
    launched = []
    launch = eng.graph.launch
    eng.graph.launch = lambda *a, **kw: launched.append(launch(*a, **kw)) or launched[-1]
    pushed = []
    push = eng.planner.push_checked_snapshot
    eng.planner.push_checked_snapshot = lambda slots, rows: pushed.append(len(slots)) or push(slots, rows)
    assert [o.token_ids for o in eng.generate(prompts, params)] == expected
    reads = decider in ("planner", "share_online_calibration")
    assert eng.graph.read_survival is reads
    assert any(s.survival is not None for s in launched) is reads and bool(pushed) is reads
    if decider != "planner":
        assert eng.counters()["trimmed_steps"] > 0
