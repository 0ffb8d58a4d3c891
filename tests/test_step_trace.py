"""Step traces (dspark.step_trace) and the offline planner replay on them (dspark.bench.planner_replay)."""

import dataclasses

import numpy as np
import pytest
import torch

from dspark.bench import planner_replay as pr
from dspark.config import ConfigError, SamplingParams
from dspark.cost_table import CostTable
from dspark.engine import Engine
from dspark.planner import PlannerConfig
from dspark.step_trace import StepTrace
from tiny import tiny_drafter, tiny_engine_config, tiny_target


def test_trace_round_trips_and_refuses_bad_rows(tmp_path):
    t = StepTrace(3)
    t.record([4, 7], [[0.9, 0.5, 0.1], [0.8, 0.8, 0.2]], [3, 3], [2, 0])
    t.record([7], [[0.7, 0.3, 0.3]], [2], [2])
    back = StepTrace.load(t.save(tmp_path / "t.npz"))
    assert back.block == 3 and back.num_steps == 2 and back.rows() == 3
    for a, b in zip(t.survival + t.accepted + t.windows + t.request_ids,
                    back.survival + back.accepted + back.windows + back.request_ids):
        np.testing.assert_array_equal(a, b)
    seq = back.per_request()
    assert sorted(seq) == [4, 7] and seq[7]["accepted"].tolist() == [0, 2] and seq[7]["windows"].tolist() == [3, 2]
    assert "confidence_logits" not in seq[7] and not back.confidence_logits
    with pytest.raises(ValueError, match="survival"):
        t.record([1], [[0.5, 0.5]], [3], [1])
    with pytest.raises(ValueError, match="accepted"):
        t.record([1], [[0.5, 0.5, 0.5]], [2], [3])  # more accepted than verified
    with pytest.raises(ValueError, match="every step or in none"):
        t.record([1], [[0.5, 0.5, 0.5]], [3], [1], confidence_logits=[[0.0, 1.0, 2.0]])
    with_logits = StepTrace(2)
    with_logits.record([3], [[0.6, 0.2]], [2], [1], confidence_logits=[[0.4, -1.0]])
    again = StepTrace.load(with_logits.save(tmp_path / "l.npz"))
    np.testing.assert_array_equal(again.per_request()[3]["confidence_logits"], np.float32([[0.4, -1.0]]))
    with pytest.raises(ValueError, match="no step"):
        StepTrace(3).save(tmp_path / "empty.npz")
    np.savez(tmp_path / "other.npz", x=np.zeros(2))
    with pytest.raises(ValueError, match="not a step trace"):
        StepTrace.load(tmp_path / "other.npz")


@pytest.fixture(scope="module")
def models():
    target = tiny_target(31)
    return target, tiny_drafter(target, 32, block_size=4)


def _serve(engine, n=3, tokens=12):
    for i in range(n):
        engine.add_request([5 + i, 9, 11 + i, 3], SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()


@pytest.mark.parametrize("verify", ["full", "cap_accept"])
def test_engine_trace_holds_each_decode_row_and_the_uncapped_acceptance(models, verify):
    target, drafter = models
    engine = Engine(target, None, tiny_engine_config(verify=verify, force_verify_len=2 if verify == "cap_accept"
                                                     else None), drafter)
    trace = engine.start_step_trace()
    _serve(engine)
    assert trace.num_steps == len(engine._oracle_steps) > 0
    assert [a.tolist() for a in trace.accepted] == engine._oracle_steps  # what the oracle is priced on
    assert all((w == 4).all() for w in trace.windows)  # cap_accept verifies the whole block too
    surv = np.concatenate(trace.survival)
    assert ((surv >= 0) & (surv <= 1)).all() and (np.diff(surv, axis=1) <= 1e-7).all()
    # the same survival the planner reads: the raw head calibrated, then cumulative
    raw = torch.from_numpy(np.concatenate(trace.confidence_logits))
    np.testing.assert_allclose(surv, torch.cumprod(drafter.calibrated_confidence(raw), 1).numpy(), rtol=1e-6)
    assert not np.allclose(surv, surv[0])
    engine.reset()
    assert engine.step_trace is None


def test_trace_is_refused_where_it_would_record_nothing_right(models):
    target, drafter = models
    with pytest.raises(ConfigError, match="spec=off"):
        Engine(target, None, tiny_engine_config(spec="off"), None).start_step_trace()
    eng = Engine(target, None, tiny_engine_config(), drafter)
    eng.graph = object()  # stands for a device-resident step path
    with pytest.raises(ConfigError, match="cuda_graphs=false"):
        eng.start_step_trace()


def _table() -> CostTable:
    """A fixed cost per step plus a cost per token: trimming a cell saves 1% of a full 128-row step."""
    counts = tuple(range(1, 4097))
    return CostTable(token_counts=counts, theta_ms=tuple(0.01 * m for m in counts), fixed_overhead_ms=2.0)


def _sequences(rng, n=60, steps=30, block=4):
    return [(None, rng.integers(0, block + 1, size=steps)) for _ in range(n)]


def _perfect(seqs, block):
    """Survival that knows the outcome: 1 up to the accepted count, 0 after."""
    k = np.arange(1, block + 1)[None, :]
    return [(k <= acc[:, None]).astype(np.float64) for _, acc in seqs]


def test_a_head_that_knows_the_outcome_reaches_the_oracle_and_an_uninformed_one_does_not():
    rng = np.random.default_rng(0)
    block, table = 4, _table()
    seqs = _sequences(rng)
    config = PlannerConfig(block=block, min_verify_len=0, min_predicted_gain=0.0, temperature_positive=False)
    perfect = pr.replay(seqs, _perfect(seqs, block), block, table, 128, 40, 0, config, seed=1)
    assert perfect["oracle_gain"] > 0.2
    assert perfect["ragged_emitted_ratio"] == 1.0  # never cuts an accepted draft
    assert perfect["ragged_share"] == pytest.approx(1.0, abs=1e-9)
    flat = [np.full((len(a), block), 0.5) ** np.arange(1, block + 1) for _, a in seqs]  # the same row for all
    blind = pr.replay(seqs, flat, block, table, 128, 40, 0, config, seed=1)
    assert blind["oracle_gain"] == perfect["oracle_gain"]  # same lanes, same acceptances
    assert blind["ragged_share"] < 0.6
    # a lagged budget on the perfect head costs share but keeps the fresh ranking's windows honest
    lagged = pr.replay(seqs, _perfect(seqs, block), block, table, 128, 40, 2, config, seed=1)
    assert lagged["ragged_share"] < perfect["ragged_share"]


def test_auc_and_synthetic_heads_have_the_sharpness_asked_for():
    rng = np.random.default_rng(3)
    labels = rng.random(400) < 0.6
    scores = rng.standard_normal(400) + labels
    brute = np.mean([(p > q) + 0.5 * (p == q) for p in scores[labels] for q in scores[~labels]])
    assert pr.auc(scores, labels) == pytest.approx(brute)
    assert pr.auc(np.ones(4), np.array([True, False, True, False])) == 0.5  # ties count half
    block = 5
    seqs = [(None, a) for a in rng.integers(0, block + 1, size=(300, 40))]
    base = pr.head_quality([(np.ones((40, block)), a) for _, a in seqs], block)["base_rate_per_position"]
    for target in (0.75, 0.9):
        synth = pr.synthetic_survival(seqs, block, pr.separation_for_auc(target), base, rng)
        q = pr.head_quality(list(zip(synth, [a for _, a in seqs])), block)
        # per position as asked; pooled over positions higher, as the base rate differs by position
        assert np.mean(q["auc_conditional_per_position"][:4]) == pytest.approx(target, abs=0.02)
        assert q["auc_conditional_all"] > target


def test_bench_decode_refuses_a_trace_of_graph_arms():
    from hydra import compose, initialize_config_dir

    from runners import bench_decode
    from test_configs import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="bench_decode"):
        cfg = compose(config_name="bench_decode", overrides=["engine=h200_graphs", "engine.device=cpu",
                                                             "step_trace=true", "output_dir=unused"])
    with pytest.raises(ConfigError, match="cuda_graphs=false"):
        bench_decode.run(cfg)


def test_the_replay_plans_as_the_engine_did_and_scores_traces_as_they_ran(models, tmp_path):
    """On a trace of the engine's own ragged run the replay's planner reproduces every recorded window;
    replayed as traced, a head that knows the outcome reaches the oracle; a full trace scores itself."""
    from test_engine_scheduling import steep_table

    target, drafter = models
    table_path = steep_table(Engine(target, None, tiny_engine_config(), drafter), tmp_path / "table.json")
    table = CostTable.load(table_path)
    prompts = [[5 + i, 9, 11 + i, 3] for i in range(6)]
    sp = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    runs = {}
    for verify in ("full", "ragged"):
        eng = Engine(target, None, tiny_engine_config(verify=verify, cost_table=table_path, budget_lag=2), drafter)
        trace = eng.start_step_trace()
        eng.generate(prompts, sp)
        runs[verify] = trace
    config = PlannerConfig(block=4, budget_lag=2, temperature_positive=False)
    same, steps = pr.replan_agreement(runs["ragged"], table, config, lag=2)
    assert steps > 5 and same == steps
    assert any((w < 4).any() for w in runs["ragged"].windows)  # it did trim
    full = runs["full"]
    own = pr.score_trace(full, table, warmup=1)
    assert own["verified_per_step"] == own["batch"] * 4
    k = np.arange(1, 5)[None, :]
    perfect = [(k <= a[:, None]).astype(np.float64) for a in full.accepted]
    zero_lag = dataclasses.replace(config, budget_lag=0, min_verify_len=0, min_predicted_gain=0.0)
    r = pr.replay_as_traced(full, perfect, table, 0, zero_lag, warmup=1)
    assert r["ragged_emitted_ratio"] == 1.0 and r["ragged_share"] == pytest.approx(1.0)
    assert r["full_tokens_per_step"] == pytest.approx(own["tokens_per_step"])


def test_a_shifted_head_costs_the_planner_and_the_online_calibration_wins_it_back():
    """A calibrated synthetic head made over-confident by 1.5 logits loses replayed gain; the engine's online
    calibration, learning offsets from the ragged arm's tested drafts, recovers most of it."""
    rng = np.random.default_rng(5)
    block = 4
    seqs = [(None, a) for a in rng.integers(0, block + 1, size=(200, 40))]
    base = pr.head_quality([(np.ones((40, block)), a) for _, a in seqs], block)["base_rate_per_position"]
    head = pr.synthetic_survival(seqs, block, pr.separation_for_auc(0.9), base, rng)
    assert np.allclose(pr.shifted_survival(head[0], 0.0), head[0])
    config = PlannerConfig(block=block, min_verify_len=0, min_predicted_gain=0.0, temperature_positive=False)
    table = _table()

    def gain(**kw):
        return pr.replay(seqs, head, block, table, 128, 150, 0, config, seed=2, **kw)["ragged_gain"]

    calibrated, shifted, corrected = gain(), gain(shift=1.5), gain(shift=1.5, online=True)
    assert shifted < calibrated - 0.01
    assert corrected > shifted + 0.5 * (calibrated - shifted)
    # a lagged budget: lanes that start inside a request size on its rows as traced (shifted), then on history
    assert pr.replay(seqs, head, block, table, 128, 20, 2, config, seed=2, shift=1.5, online=True)["steps"] == 20
