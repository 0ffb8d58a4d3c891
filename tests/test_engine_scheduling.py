"""Confidence-scheduled verification inside the engine: every mode stays lossless, the
planner really trims when the cost table says it pays, and it visibly declines when not."""

import pytest
import torch

from dspark.config import ConfigError, SamplingParams
from dspark.cost_table import CostTable
from dspark.engine import Engine, RequestError
from dspark.stats import FeatureInactiveError
from test_engine_lossless import emitted, exact_marginals, prompts_for, run, tv_and_bound
from tiny import tiny_drafter, tiny_engine_config, tiny_target, trained_tiny_pair


def steep_table(engine: Engine, path) -> str:
    """A cost table where every verified token is expensive, so trimming pays."""
    counts = list(range(1, 257)) + list(range(264, 8193, 8))
    table = CostTable(token_counts=tuple(counts), theta_ms=tuple(1.0 + 0.5 * m for m in counts),
                      fixed_overhead_ms=0.5, fingerprint=engine.fingerprint())
    table.save(path)
    return str(path)


def scheduled_and_target_only(target, drafter, tmp_path, graphs: bool, seed: int, max_tokens: int, **engine_kw):
    """(a ragged engine on a steep table with ``engine_kw``, its greedy outputs on 6 prompts, target-only's outputs
    on them): eager, or device-resident with overlap (budget lag 2) when ``graphs``."""
    kw = dict(cuda_graphs=True, overlap=True, budget_lag=2) if graphs else {}
    probe = Engine(target, None, tiny_engine_config(**kw), drafter)  # the table's step path is the engine's
    table = steep_table(probe, tmp_path / "table.json")
    prompts = prompts_for(seed, 6)
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    base = run(target, None, prompts, sp)
    eng = Engine(target, None, tiny_engine_config(verify="ragged", cost_table=table, **engine_kw, **kw), drafter)
    return eng, eng.generate(prompts, sp), base


def device_step_models_and_table(tmp_path, overlap: bool):
    """(target, drafter, budget_lag, steep table path) for device-resident scheduling tests: tiny models with a
    block of 4 trained on the target's varied text (so a wrong trim or commit changes the tokens), the smallest
    budget lag the captured path accepts, and a table profiled on their fingerprint."""
    target, drafter = trained_tiny_pair(6, block_size=4)
    lag = 2 if overlap else 1
    probe = Engine(target, None, tiny_engine_config(cuda_graphs=True, overlap=overlap, budget_lag=lag), drafter)
    return target, drafter, lag, steep_table(probe, tmp_path / "table.json")


def make_engine(target, drafter, table_path=None, **cfg):
    return Engine(target, None, tiny_engine_config(cost_table=table_path, **cfg), drafter)


@pytest.fixture(scope="module")
def models():
    # a drafter trained on the target's varied greedy text: steps accept 0 to 4 drafts, so a trim can cost tokens
    # and the equality checks below can fail
    return trained_tiny_pair(21, block_size=4)


@pytest.fixture(scope="module")
def table_path(models, tmp_path_factory):
    target, drafter = models
    eng = make_engine(target, drafter)
    return steep_table(eng, tmp_path_factory.mktemp("cost") / "table.json")


@pytest.mark.parametrize("verify,extra", [
    ("uniform", {}), ("uniform", {"tiers": (1, 2, 4)}), ("ragged", {}), ("ragged", {"token_buckets": (16, 32, 64)}),
    ("cap_accept", {}), ("ragged", {"budget_lag": 0}), ("ragged", {"min_verify_len": 0}), ("ragged", {"planner_algorithm": "greedy_stop",
                                                                   "budget_lag": 0, "min_predicted_gain": 0.0}),
])
def test_every_mode_is_greedy_lossless_and_really_trims(models, table_path, verify, extra):
    target, drafter = models
    prompts = prompts_for(21, 6)
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    base = run(target, None, prompts, sp)
    eng = make_engine(target, drafter, table_path, verify=verify, debug_checks=True, **extra)
    out = eng.generate(prompts, sp)
    for b, o in zip(base, out):
        assert o.token_ids == b.token_ids
    assert len({t for b in base for t in b.token_ids}) > 10  # varied text
    assert max(a for o in out for a in o.accept_lengths) >= 3  # steps accepted several drafts (or trims cost some)
    counters = eng.counters()
    assert counters["trimmed_steps"] > 0, counters
    eng.stats.assert_active(min_steps=3)  # raises unless windows differed and trimmed
    if verify == "cap_accept":
        assert counters["sched/block_accept_length_exact"] is True
    if "tiers" in extra:
        used = {int(k.split(".")[1]) for k in counters if k.startswith("sched/verify_len_hist.")}
        assert used <= {1, 2, 4}, used


def test_no_table_declines_every_step_and_assert_active_fails(models):
    target, drafter = models
    eng = make_engine(target, drafter, None, verify="ragged")
    eng.generate(prompts_for(3, 4), SamplingParams(max_tokens=16, ignore_eos=True))
    c = eng.counters()
    assert c["trimmed_steps"] == 0
    assert c.get("sched/plan_reason.declined_no_table", 0) > 0
    with pytest.raises(FeatureInactiveError):
        eng.stats.assert_active(min_steps=3)


def test_force_verify_len_replaces_only_the_decision(models):
    target, drafter = models
    prompts = prompts_for(5, 3)
    sp = SamplingParams(max_tokens=16, ignore_eos=True)
    base = run(target, None, prompts, sp)
    eng = make_engine(target, drafter, None, verify="uniform", tiers=(1, 2, 4), force_verify_len=2)
    out = eng.generate(prompts, sp)
    assert all(set(o.verify_lens) == {2} for o in out)
    assert [o.token_ids for o in out] == [b.token_ids for b in base]
    with pytest.raises(ConfigError, match="force_verify_len"):
        make_engine(target, drafter, None, verify="uniform", tiers=(1, 2, 4), force_verify_len=3)


def test_fresh_global_search_refuses_sampled_requests(models, table_path):
    target, drafter = models
    eng = make_engine(target, drafter, table_path, verify="ragged", budget_lag=0)
    with pytest.raises(RequestError, match="non-anticipation"):
        eng.add_request([5, 6, 7], SamplingParams(temperature=0.7))


def test_foreign_cost_table_is_refused(models, tmp_path):
    target, drafter = models
    counts = tuple(range(1, 65))
    CostTable(token_counts=counts, theta_ms=tuple(float(m) for m in counts),
              fingerprint={"device_name": "NVIDIA H200", "driver": "13.0", "torch": "2.11", "triton": "3.6",
                           "model": "other", "drafter": "other", "dtype": "bfloat16"}).save(tmp_path / "t.json")
    with pytest.raises(ValueError, match="device_name"):
        make_engine(target, drafter, str(tmp_path / "t.json"), verify="ragged")


def sizing_rows_of_new_request(models, table_path, reset_works: bool, monkeypatch):
    target, drafter = models
    eng = make_engine(target, drafter, table_path, verify="ragged", max_num_seqs=1, budget_lag=1)
    eng.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=12, ignore_eos=True))  # fills slot 0's history
    if not reset_works:
        monkeypatch.setattr(eng.planner, "reset_slot", lambda slot: None)
    seen = []
    real = eng.planner.sizing_row
    monkeypatch.setattr(eng.planner, "sizing_row", lambda slot, row: seen.append(real(slot, row)) or seen[-1])
    eng.generate([[9, 10, 11]], SamplingParams(max_tokens=2, ignore_eos=True))  # reuses slot 0
    return seen[0]


def test_recycled_slot_starts_from_neutral_confidence(models, table_path, monkeypatch):
    first = sizing_rows_of_new_request(models, table_path, True, monkeypatch)
    assert first == [1.0] * 4, first
    # Without the reset the new request would be sized on its predecessor's survivals.
    inherited = sizing_rows_of_new_request(models, table_path, False, monkeypatch)
    assert inherited != [1.0] * 4, inherited


@pytest.mark.parametrize("verify,extra", [("ragged", {"budget_lag": 1}),
                                          ("ragged", {"planner_algorithm": "greedy_stop", "budget_lag": 0,
                                                      "min_predicted_gain": 0.0})])
def test_sampled_outputs_follow_target_with_planner_active(table_path, verify, extra, monkeypatch):
    target = tiny_target(11, scale=2.0)
    drafter = tiny_drafter(target, 12, block_size=3)
    p1, p2 = exact_marginals(target, 1.0)
    # The same steep table, re-fingerprinted for this drafter.
    eng = make_engine(target, drafter)
    import tempfile, os
    path = os.path.join(tempfile.mkdtemp(), "t.json")
    steep_table(eng, path)

    import test_engine_lossless as tel
    monkeypatch.setattr(tel, "tiny_engine_config",
                        lambda **kw: tiny_engine_config(verify=verify, cost_table=path, **extra, **kw))
    n = 4000
    toks, outs = emitted(target, drafter, n, 1.0, return_outputs=True)
    assert any(v < 3 for o in outs for v in o.verify_lens), "the planner never trimmed: the test would prove nothing"
    for pos, p in ((0, p1), (1, p2)):
        tv, bound = tv_and_bound(toks[:, pos], p)
        assert tv < bound, (pos, tv, bound)


def test_an_engine_calibration_replaces_the_drafters_own_for_that_engine_only(models, table_path, tmp_path):
    """engine.confidence_calibration: the planner reads the given calibration, the shared drafter keeps
    its own, weights are shared, and outputs stay lossless."""
    import json

    target, drafter = models
    before = (drafter.confidence_temperatures.clone(), drafter.confidence_biases.clone())
    (tmp_path / "temperatures.json").write_text(json.dumps({"method": "sequential_temperature_bias_scaling",
                                                            "temperatures": [0.5, 2.0, 1.5, 0.7],
                                                            "biases": [1.0, -1.0, 0.5, 0.0]}))
    prompts = prompts_for(23, 5)
    sp = SamplingParams(max_tokens=20, ignore_eos=True)
    base = run(target, None, prompts, sp)
    shipped = make_engine(target, drafter, table_path, verify="ragged")
    out_shipped = shipped.generate(prompts, sp)
    for where in (tmp_path, tmp_path / "temperatures.json"):  # the folder or the file
        eng = make_engine(target, drafter, table_path, verify="ragged", confidence_calibration=str(where))
        assert eng.drafter is not drafter
        assert eng.drafter.fc.weight.data_ptr() == drafter.fc.weight.data_ptr()  # nothing copied
        assert eng.drafter.confidence_temperatures.tolist() == pytest.approx([0.5, 2.0, 1.5, 0.7])
        assert eng.drafter.confidence_biases.tolist() == [1.0, -1.0, 0.5, 0.0]
        assert torch.equal(drafter.confidence_temperatures, before[0])
        assert torch.equal(drafter.confidence_biases, before[1])
        trace = eng.start_step_trace()  # the trace's survival is the engine's calibration
        out = eng.generate(prompts, sp)
        z = torch.from_numpy(trace.confidence_logits[0])
        c = torch.sigmoid(z / torch.tensor([0.5, 2.0, 1.5, 0.7]) + torch.tensor([1.0, -1.0, 0.5, 0.0]))
        assert torch.allclose(torch.from_numpy(trace.survival[0]), torch.cumprod(c, 1), atol=1e-6)
        assert [o.token_ids for o in out] == [b.token_ids for b in base]
    # it is what the planner reads: a calibration sure of every draft keeps every block whole
    sure = tmp_path / "sure"
    sure.mkdir()
    (sure / "temperatures.json").write_text(json.dumps({"method": "sequential_temperature_bias_scaling",
                                                        "temperatures": [1.0] * 4, "biases": [30.0] * 4}))
    confident = make_engine(target, drafter, table_path, verify="ragged", confidence_calibration=str(sure))
    assert [o.token_ids for o in confident.generate(prompts, sp)] == [b.token_ids for b in base]
    assert shipped.counters()["trimmed_steps"] > 0 and confident.counters()["trimmed_steps"] == 0
    assert [o.token_ids for o in out_shipped] == [b.token_ids for b in base]
    with pytest.raises(ConfigError, match="confidence_calibration.*not found.*python -m runners.calibrate"):
        make_engine(target, drafter, table_path, verify="ragged", confidence_calibration=str(tmp_path / "none"))
    renamed = tmp_path / "cal.json"  # a calibration file under another name: said so, not read as a folder
    renamed.write_text((sure / "temperatures.json").read_text())
    with pytest.raises(ConfigError, match="cal.json is a file, not a calibration: give the temperatures.json"):
        make_engine(target, drafter, table_path, verify="ragged", confidence_calibration=str(renamed))
    with pytest.raises(ConfigError, match="spec=off"):
        tiny_engine_config(spec="off", confidence_calibration=str(tmp_path))


@pytest.mark.parametrize("graphs", [False, True])
def test_the_oracle_over_a_benchmarks_timed_steps_is_priced_on_those_steps_alone(models, table_path, graphs):
    from runners.bench_decode import add_oracle_shares, bench_one

    target, drafter = models
    extra = dict(cuda_graphs=True, overlap=True, budget_lag=2, allow_foreign_cost_table=True) if graphs else {}
    eng = make_engine(target, drafter, table_path, **extra)
    row = bench_one(eng, prompts_for(25, 4), 4, 18, 2)
    timed = row["oracle_timed"]
    assert timed is not None and timed["steps"] == row["timed_steps"]  # one committed step per timed call
    everything = eng.oracle_bound_over(range(eng.oracle_steps_recorded))
    c = eng.counters()
    assert everything["oracle_ms"] == pytest.approx(c["oracle/oracle_ms"])
    # the counters' bound also holds the steps' measured time, and the headroom in it where the saving fits
    saved = c["oracle/full_block_ms"] - c["oracle/oracle_ms"]
    assert c["oracle/measured_ms"] > 0 and ("oracle/headroom_in_service" in c) == (c["oracle/measured_ms"] > saved)
    assert everything["steps"] > timed["steps"] and timed["tokens"] < everything["tokens"]
    assert eng.oracle_bound_over([]) is None
    ragged = make_engine(target, drafter, table_path, verify="ragged", **extra)
    assert ragged.oracle_bound_over([0]) is None  # a trimming arm holds no full-block acceptances
    # the share compares each trimming arm with the full arm of its round and batch
    rows = [{**row, "arm": "full", "round": 0, "verify": "full", "output_tokens_per_s": 100.0},
            {"arm": "ragged", "round": 0, "batch_size": 4, "verify": "ragged", "output_tokens_per_s": 104.0},
            {"arm": "ragged", "round": 1, "batch_size": 4, "verify": "ragged", "output_tokens_per_s": 104.0}]
    add_oracle_shares(rows)
    headroom = timed["headroom_vs_full_block"]
    assert rows[1]["oracle_share_timed"] == pytest.approx(0.04 / headroom)
    assert rows[0]["oracle_share_timed"] is None and rows[2]["oracle_share_timed"] is None  # no full arm in round 1
