"""The plan gate (engine.plan_gate): per batch bucket, plan a device-resident step only where the planner's trims
saved more than its host time cost; its rule, its settings, and the engine skipping planning where it cannot pay."""

import pytest

from dspark.bench.guards import did_nothing_guard
from dspark.bench.report import verdict_note
from dspark.config import ConfigError, EngineConfig, SamplingParams
from dspark.engine import Engine
from dspark.plan_gate import SKIPPED_REASON, BucketEstimate, PlanGate
from dspark.planner import REASONS, SMALL_BATCH_REASON
from test_engine_lossless import prompts_for
from test_engine_scheduling import device_step_models_and_table
from tiny import tiny_engine_config

HOST_BOUND = 0.0  # the step() call that planned did not wait for the device
DEVICE_BOUND = 1.0  # it waited a millisecond: the planning ran while the device computed


def planned(gate: PlanGate, bucket: int, *, cost_ms: float, waited_ms: float, gain: float = 0.0,
            period_ms: float = 2.0) -> bool:
    """One step at ``bucket``: the gate's choice and, when it planned, the planner's cost and outcome."""
    plan = gate.should_plan(bucket)
    if plan:
        gate.record_cost(bucket, cost_ms, waited_ms)
        gate.record_benefit(bucket, trimmed=gain > 0, predicted_gain=gain, period_ms=period_ms)
    return plan


def test_warmup_steps_plan_whatever_the_estimates_say():
    gate = PlanGate(warmup=5, probe_every=100)
    assert all(planned(gate, 16, cost_ms=0.3, waited_ms=HOST_BOUND) for _ in range(5))
    assert not gate.should_plan(16)  # warm: benefit 0 < cost 0.3
    assert gate.summary()["plan_gate/planned_steps"] == 5 and gate.summary()["plan_gate/skipped_steps"] == 1


def test_a_bucket_whose_benefit_is_below_its_cost_plans_only_on_probes():
    gate = PlanGate(warmup=2, probe_every=4)
    choices = [planned(gate, 16, cost_ms=0.3, waited_ms=HOST_BOUND) for _ in range(2 + 12)]
    assert choices[:2] == [True, True]
    # then every 4th step is a probe: three skipped, one planned
    assert choices[2:] == [False, False, False, True] * 3
    s = gate.summary()
    assert (s["plan_gate/planned_steps"], s["plan_gate/skipped_steps"], s["plan_gate/probe_steps"]) == (5, 9, 3)
    assert s["plan_gate/benefit_ms_per_step"] == 0.0 and s["plan_gate/cost_ms_per_step"] > 0.25


def test_a_skipping_bucket_backs_off_its_probes_and_returns_to_the_short_interval_when_planning_pays():
    gate = PlanGate(warmup=2, probe_every=4, probe_every_max=16)
    choices = [planned(gate, 16, cost_ms=0.3, waited_ms=HOST_BOUND) for _ in range(2 + 4 + 8 + 16 + 16)]
    assert choices[:2] == [True, True]
    # each probe that leaves the rule at skip doubles the interval: 4, 8, then 16 (the cap), and 16 again
    assert choices[2:] == [False] * 3 + [True] + [False] * 7 + [True] + ([False] * 15 + [True]) * 2
    assert gate.summary()["plan_gate/probe_steps"] == 4 and gate.estimate(16).probe_interval == 16
    # trims that pay turn the rule to plan, which resets the interval; once they stop, probes start at 4 again
    while not planned(gate, 16, cost_ms=0.01, waited_ms=HOST_BOUND, gain=0.5):
        pass
    for _ in range(200):
        planned(gate, 16, cost_ms=0.01, waited_ms=HOST_BOUND, gain=0.5)
    assert gate.estimate(16).probe_interval == 4
    gate.estimate(16).cost_ms, gate.estimate(16).benefit_ms = 0.3, 0.0  # the workload turns: planning stops paying
    assert [planned(gate, 16, cost_ms=0.3, waited_ms=HOST_BOUND) for _ in range(4 + 8)] == \
        [False] * 3 + [True] + [False] * 7 + [True]
    # another bucket keeps its own interval
    assert gate.estimate(32).probe_interval == 0


def test_a_device_bound_bucket_keeps_planning_with_a_small_benefit():
    """The host waited for the device: its planning ran while the device computed and cost nothing."""
    gate = PlanGate(warmup=2, probe_every=1000)
    assert all(planned(gate, 256, cost_ms=0.6, waited_ms=DEVICE_BOUND, gain=0.001, period_ms=1.5)
               for _ in range(50))
    assert gate.estimate(256).cost_ms == 0.0 and gate.estimate(256).benefit_ms > 0.0
    assert gate.summary()["plan_gate/skipped_steps"] == 0


def test_a_bucket_whose_benefit_exceeds_its_cost_keeps_planning():
    gate = PlanGate(warmup=2, probe_every=1000)
    # a trim every other step, predicted +10% on a 2 ms period: 0.1 ms saved per planned step > 0.05 ms
    assert all(planned(gate, 16, cost_ms=0.05, waited_ms=HOST_BOUND, gain=0.1 if i % 2 else 0.0)
               for i in range(60))
    est = gate.estimate(16)
    assert est.benefit_ms == pytest.approx(0.1, rel=0.2) and est.benefit_ms > est.cost_ms


def test_saved_ms_of_a_trim_is_its_period_times_its_predicted_gain():
    gate = PlanGate(warmup=0)
    gate.record_benefit(8, trimmed=True, predicted_gain=0.25, period_ms=4.0)
    assert gate.estimate(8).benefit_ms == pytest.approx(1.0)  # the full block: 5 ms for the same tokens
    gate.record_benefit(8, trimmed=False, predicted_gain=0.4, period_ms=4.0)  # declined: saved nothing
    assert gate.estimate(8).benefit_ms == pytest.approx(0.5)


def test_estimates_per_bucket_are_independent():
    gate = PlanGate(warmup=2, probe_every=1000)
    for _ in range(10):
        planned(gate, 16, cost_ms=0.3, waited_ms=HOST_BOUND)
        planned(gate, 256, cost_ms=0.6, waited_ms=DEVICE_BOUND)
    assert not gate.should_plan(16) and gate.should_plan(256)
    assert gate.should_plan(4)  # a new bucket starts in warm-up
    assert gate.estimate(16).cost_ms == pytest.approx(0.3) and gate.estimate(256).cost_ms == 0.0


def test_counts_reset_and_estimates_persist():
    gate = PlanGate(warmup=1, probe_every=1000)
    for _ in range(4):
        planned(gate, 16, cost_ms=0.3, waited_ms=HOST_BOUND)
    gate.reset_counts()
    assert gate.summary() == {"plan_gate/planned_steps": 0, "plan_gate/skipped_steps": 0, "plan_gate/probe_steps": 0,
                              "plan_gate/benefit_ms_per_step": 0.0, "plan_gate/cost_ms_per_step": 0.0}
    assert not gate.should_plan(16)  # what the warm-up learnt holds


def test_gate_settings_are_validated():
    with pytest.raises(ValueError, match="probe_every must be an integer >= 1"):
        PlanGate(probe_every=0)
    with pytest.raises(ValueError, match="warmup must be an integer >= 0"):
        PlanGate(warmup=-1)
    with pytest.raises(ConfigError, match="engine.plan_gate_probe_every: must be an integer >= 1"):
        EngineConfig(plan_gate_probe_every=0)
    with pytest.raises(ConfigError, match="engine.plan_gate_warmup: must be an integer >= 0"):
        EngineConfig(plan_gate_warmup=-1)
    with pytest.raises(ValueError, match=r"probe_every_max must be >= probe_every \(16\), got 8"):
        PlanGate(probe_every=16, probe_every_max=8)
    with pytest.raises(ConfigError, match=r"engine.plan_gate_probe_every_max: must be >= probe_every \(128\)"):
        EngineConfig(plan_gate_probe_every=128)  # the default cap (64) is below the interval asked for
    with pytest.raises(ConfigError, match="engine.plan_gate_probe_every_max: must be an integer >= 1"):
        EngineConfig(plan_gate_probe_every_max=0)
    assert PlanGate(probe_every=8).probe_every_max == 8  # no cap given: a fixed interval
    cfg = EngineConfig()
    assert cfg.plan_gate is True and cfg.plan_gate_warmup == 8 and cfg.plan_gate_probe_every == 16
    assert cfg.plan_gate_probe_every_max == 64
    assert SKIPPED_REASON in REASONS
    from runners.schema import EngineSchema

    assert cfg.plan_min_rows == EngineSchema().plan_min_rows == 32
    with pytest.raises(ConfigError, match=r"engine.plan_min_rows: must be an integer >= 0"):
        EngineConfig(plan_min_rows=-1)


def test_an_arm_whose_gate_skipped_every_step_reads_as_declined_not_as_a_trim():
    counters = {"trimmed_steps": 0, "trim_ratio": 0.0, "drafted_tokens": 900, "decode_steps": 100,
                f"sched/plan_reason.{SKIPPED_REASON}": 92, "sched/plan_reason.declined_below_min_gain": 8}
    guard = did_nothing_guard("B", {}, counters, expects_trim=True, expects_graphs=False, expects_speculation=True)
    assert guard.passed and guard.details["declined_all"], guard.message
    assert "engine.plan_gate" in guard.message
    summary = {"guards": [guard.to_dict()],
               "arms": {"A": {"engine": {"spec": "dspark", "verify": "full"}},
                        "B": {"engine": {"spec": "dspark", "verify": "ragged"}}}}
    assert verdict_note(summary).startswith("B declined every step (planner predicted no gain): A and B ran the same "
                                            "work")


def gate_engine(target, drafter, table, **cfg):
    settings = dict(max_num_seqs=4, verify="ragged", cost_table=table, cuda_graphs=True, min_verify_len=0,
                    service_cost=True)
    return Engine(target, None, tiny_engine_config(**{**settings, **cfg}), drafter)


@pytest.mark.parametrize("overlap", [False, True])
def test_steps_below_plan_min_rows_run_the_full_block_without_planning(tmp_path, overlap):
    """engine.plan_min_rows above the batch: every device-resident step runs the verify-all engine's block
    without a planner call (the gate neither plans, skips nor learns) nor the confidence head, and is counted as
    the planner's decline, which the did_nothing guard reads as "trimming does not pay here"; at a lower setting
    the same engine trims, and runs the head on the draft graphs of that many rows or more. Host-driven steps
    run the head whatever the batch."""
    target, drafter, lag, table = device_step_models_and_table(tmp_path, overlap)
    prompts = prompts_for(12, 4)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    base = Engine(target, None, tiny_engine_config(max_num_seqs=4), drafter)
    expected = [o.token_ids for o in base.generate(prompts, params)]
    kw = dict(overlap=overlap, budget_lag=lag, min_predicted_gain=0.0, plan_gate_warmup=10**6)

    small = gate_engine(target, drafter, table, plan_min_rows=5, **kw)
    assert [o.token_ids for o in small.generate(prompts, params)] == expected
    c = small.counters()
    assert c[f"sched/plan_reason.{SMALL_BATCH_REASON}"] == c["decode_steps"] > 0
    assert c["plan_gate/planned_steps"] == c["plan_gate/skipped_steps"] == 0
    assert c["trimmed_steps"] == 0 and c["window_tokens"] == c["ceiling_tokens"]
    assert c["service_cost/floor_steps"] == c["decode_steps"]  # the service price still learns from every step
    assert c["confidence_head_steps"] == 0 and not small.steps.survival.any()
    guard = did_nothing_guard("B", {}, c, expects_trim=True, expects_graphs=False, expects_speculation=True)
    assert guard.passed and guard.details["declined_all"], guard.message
    assert "engine.plan_min_rows" in guard.message

    planning = gate_engine(target, drafter, table, plan_min_rows=4, **kw)
    assert [o.token_ids for o in planning.generate(prompts, params)] == expected
    c = planning.counters()
    assert c["trimmed_steps"] > 0 and c["plan_gate/planned_steps"] > 0
    # the steps of fewer than four rows (the last requests, once the queue is empty) were not planned
    assert 0 < c.get(f"sched/plan_reason.{SMALL_BATCH_REASON}", 0) < c["decode_steps"]
    assert c["trimmed_steps"] <= c["confidence_head_steps"] < c["decode_steps"]  # 1-2 rows: graphs of 1 and 2

    host = Engine(target, None, tiny_engine_config(max_num_seqs=4, verify="ragged", cost_table=table, min_verify_len=0,
                                                   plan_min_rows=5, allow_foreign_cost_table=True), drafter)
    assert [o.token_ids for o in host.generate(prompts, params)] == expected
    c = host.counters()
    assert c["confidence_head_steps"] == c["decode_steps"] == c[f"sched/plan_reason.{SMALL_BATCH_REASON}"]


@pytest.mark.parametrize("overlap", [False, True])
def test_device_steps_skip_planning_where_it_cannot_pay_and_stay_lossless(tmp_path, overlap):
    """A planner that can never trim (min_predicted_gain out of reach) saves nothing, and on the CPU its host time
    always sets the step's period: after the warm-up the gate skips it but for probes; every skipped step runs
    the full block (the verify-all engine's tokens) and is counted as a decline. With engine.plan_gate=false
    every device-resident step is planned."""
    target, drafter, lag, table = device_step_models_and_table(tmp_path, overlap)
    prompts = prompts_for(12, 4)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    base = Engine(target, None, tiny_engine_config(max_num_seqs=4), drafter)
    expected = [o.token_ids for o in base.generate(prompts, params)]
    kw = dict(overlap=overlap, budget_lag=lag, min_predicted_gain=1e6, plan_gate_warmup=2, plan_gate_probe_every=4)

    gated = gate_engine(target, drafter, table, **kw)
    assert [o.token_ids for o in gated.generate(prompts, params)] == expected
    c = gated.counters()
    skipped, planned_steps = c["plan_gate/skipped_steps"], c["plan_gate/planned_steps"]
    assert skipped > 0 and c["plan_gate/probe_steps"] > 0 and skipped > planned_steps
    assert planned_steps + skipped == c["decode_steps"]
    assert c[f"sched/plan_reason.{SKIPPED_REASON}"] == skipped
    assert c["sched/plan_reason.declined_below_min_gain"] == planned_steps
    assert c["trimmed_steps"] == 0 and c["window_tokens"] == c["ceiling_tokens"]
    assert c["plan_gate/benefit_ms_per_step"] == 0.0 and c["plan_gate/cost_ms_per_step"] > 0.0
    assert c["service_cost/floor_steps"] == c["decode_steps"]  # skipped steps still price the service step
    guard = did_nothing_guard("B", {}, c, expects_trim=True, expects_graphs=False, expects_speculation=True)
    assert guard.passed and guard.details["declined_all"], guard.message

    ungated = gate_engine(target, drafter, table, **{**kw, "plan_gate": False})
    assert [o.token_ids for o in ungated.generate(prompts, params)] == expected
    c = ungated.counters()
    assert ungated.plan_gate is None and not any(k.startswith("plan_gate/") for k in c)
    assert c["sched/plan_reason.declined_below_min_gain"] == c["decode_steps"]
    assert f"sched/plan_reason.{SKIPPED_REASON}" not in c


def skipping_gate(engine: Engine, probe_every: int) -> PlanGate:
    """A gate warm at every bucket with a benefit below its cost, held there (what probes measure is dropped, so
    that no timing moves its choices): it skips but for a probe every ``probe_every`` steps."""
    gate = PlanGate(warmup=0, probe_every=probe_every)
    for bucket in engine.graph.buckets:
        gate.buckets[bucket] = BucketEstimate(benefit_ms=0.0, benefit_samples=1, cost_ms=1.0, cost_samples=1)
    gate.record_cost = gate.record_benefit = lambda *args, **kw: None
    return gate


@pytest.mark.parametrize("overlap", [False, True])
def test_a_skipped_step_costs_no_planner_work_and_counts_as_before(tmp_path, overlap, monkeypatch):
    """On a step the gate skips the engine neither plans (no planner call, no lagged survival, no service price)
    nor writes the planner's survival rings (the snapshot push is queued); the run is the verify-all run's, and
    every skipped step is counted: as a decline, in the gate's and the service price's counts."""
    import dspark.planner
    from dspark.planner import PENDING_SNAPSHOTS

    target, drafter, lag, table = device_step_models_and_table(tmp_path, overlap)
    prompts = prompts_for(12, 4)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    base = Engine(target, None, tiny_engine_config(max_num_seqs=4), drafter)
    expected = [o.token_ids for o in base.generate(prompts, params)]
    eng = gate_engine(target, drafter, table, overlap=overlap, budget_lag=lag)
    eng.plan_gate = skipping_gate(eng, probe_every=10**9)
    calls = {"plan_budget": 0, "lagged_rows": 0, "service_price": 0, "ring_writes": 0}

    def counted(name, fn):
        def call(*args, **kw):
            calls[name] += 1
            return fn(*args, **kw)
        return call

    monkeypatch.setattr(dspark.planner, "plan_budget", counted("plan_budget", dspark.planner.plan_budget))
    eng.planner.lagged_rows = counted("lagged_rows", eng.planner.lagged_rows)
    eng.service_cost.current = counted("service_price", eng.service_cost.current)
    eng.planner._write_pending = counted("ring_writes", eng.planner._write_pending)
    assert [o.token_ids for o in eng.generate(prompts, params)] == expected
    c = eng.counters()
    steps = c["decode_steps"]
    # the queue of snapshot pushes and slot resets is written only when full
    assert calls.pop("ring_writes") <= (steps + len(prompts)) // PENDING_SNAPSHOTS
    assert calls == {"plan_budget": 0, "lagged_rows": 0, "service_price": 0}
    assert eng.planner._pending  # the snapshots wait for the next plan
    assert c["plan_gate/skipped_steps"] == steps and c["plan_gate/planned_steps"] == 0
    assert c[f"sched/plan_reason.{SKIPPED_REASON}"] == steps
    assert c["service_cost/floor_steps"] == steps and c["trimmed_steps"] == 0
    assert c["window_tokens"] == c["ceiling_tokens"]


@pytest.mark.parametrize("overlap", [False, True])
def test_a_probe_after_skipped_steps_plans_on_the_survival_eager_pushes_give(tmp_path, overlap):
    """The snapshots queued on skipped steps are written before the next probe plans: it sizes its budget on the
    same lagged survival, and so decides the same, as when every step's snapshot is pushed at its commit."""
    target, drafter, lag, table = device_step_models_and_table(tmp_path, overlap)
    prompts = prompts_for(12, 4)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    runs = []
    for eager in (False, True):
        # (no service price: it learns from measured times, and the decisions compared must not depend on them)
        eng = gate_engine(target, drafter, table, overlap=overlap, budget_lag=lag, min_predicted_gain=0.0,
                          service_cost=False)
        eng.plan_gate = skipping_gate(eng, probe_every=3)
        if eager:
            eng.planner.push_checked_snapshot = eng.planner.push_snapshot
        seen = []
        lagged = eng.planner.lagged_rows
        eng.planner.lagged_rows = lambda slots, age, lagged=lagged, seen=seen: seen.append(
            lagged(slots, age).tolist()) or lagged(slots, age)
        out = [o.token_ids for o in eng.generate(prompts, params)]
        runs.append((out, seen, eng.counters()))
    (out_q, seen_q, c_q), (out_e, seen_e, c_e) = runs
    assert out_q == out_e and seen_q == seen_e
    assert c_q["plan_gate/probe_steps"] > 0 and any(v != 1.0 for rows in seen_q for row in rows for v in row)
    counts = [{k: v for k, v in c.items() if isinstance(v, int)} for c in (c_q, c_e)]  # (times differ run to run)
    assert counts[0] == counts[1] and counts[0]["trimmed_steps"] > 0


def test_the_backlog_is_all_but_one_steps_share_of_the_catch_up_and_of_a_refit():
    from dspark.plan_gate import backlog_ms

    assert backlog_ms(2.0, 1) == 0.0  # a planning engine's own step: one snapshot, no backlog
    assert backlog_ms(2.0, 4) == pytest.approx(1.5)
    assert backlog_ms(2.0, 4, refit_ms=0.8, refit_every=16) == pytest.approx(1.5 + 0.75)
    assert backlog_ms(0.0, 8, refit_ms=0.8, refit_every=1) == 0.0  # refitting every step is no backlog
    with pytest.raises(ValueError, match="queued_steps and refit_every"):
        backlog_ms(1.0, 0)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_probe_is_charged_a_planning_steps_cost_not_the_skipped_steps_backlog(tmp_path, overlap):
    """A probe writes the snapshots its bucket's skipped steps queued before it plans. The gate is charged the
    call's host time less that backlog (all but one step's share), and with overlap the backlog counts as time
    the call would have waited for the device: charged in full, a skipping bucket's probes would look dearer than
    planning is, and the bucket would keep skipping."""
    import time

    target, drafter, lag, table = device_step_models_and_table(tmp_path, overlap)
    prompts = prompts_for(12, 4)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    eng = gate_engine(target, drafter, table, overlap=overlap, budget_lag=lag, service_cost=False)
    gate = eng.plan_gate = skipping_gate(eng, probe_every=6)
    per_step_ms = 4.0
    catch_up, queued, charged = eng.planner.catch_up, [], []

    def slow_catch_up():
        queued.append(len(eng.planner._pending))
        time.sleep(per_step_ms * queued[-1] / 1e3)  # a backlog that grows with the skipped steps
        return catch_up()

    eng.planner.catch_up = slow_catch_up
    gate.record_cost = lambda bucket, plan_ms, waited_ms: charged.append((plan_ms, waited_ms))
    eng.generate(prompts, params)
    probes = [(q, ms, waited) for q, (ms, waited) in zip(queued, charged) if q >= 4]
    assert len(queued) == len(charged) and probes
    for q, ms, waited in probes:
        # the catch-up alone took per_step_ms * q; the charge keeps one step's share of it
        assert per_step_ms <= ms < per_step_ms * (q - 1), (q, ms)
        if overlap:
            assert waited >= per_step_ms * (q - 1)
        else:
            assert waited == 0.0


@pytest.mark.parametrize("overlap", [False, True])
def test_each_committed_step_is_recorded_with_the_decision_it_ran(tmp_path, overlap):
    """With the overlap scheduler the next step is planned before this one commits; the prediction check must
    still read this step's decision: a trimmed step's windows add up to its budget (less the windows of rows
    that finished while it was in flight, which it does not record), a declined or skipped one verifies the
    whole block."""
    target, drafter, lag, table = device_step_models_and_table(tmp_path, overlap)
    prompts = prompts_for(12, 4)
    eng = gate_engine(target, drafter, table, overlap=overlap, budget_lag=lag, min_predicted_gain=0.0,
                      service_cost=False, plan_gate_warmup=2, plan_gate_probe_every=3)
    G, seen = eng.block_size, []
    record = eng.stats.record_step
    eng.stats.record_step = lambda **kw: seen.append((kw["windows"], kw["decision"])) or record(**kw)
    eng.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True))
    trimmed = [(list(w), d) for w, d in seen if d is not None and d.trimmed]
    assert trimmed and any(d is not None and not d.trimmed for _, d in seen)
    assert sum(sum(w) == d.budget for w, d in trimmed) > len(trimmed) // 2
    for windows, decision in seen:
        if decision is not None and decision.trimmed:
            assert sum(windows) <= decision.budget, (windows, decision)
        else:
            assert list(windows) == [G] * len(windows), (windows, decision)


def test_the_summary_breaks_the_decisions_down_per_bucket():
    gate = PlanGate(warmup=1, probe_every=3)
    planned(gate, 16, cost_ms=0.5, waited_ms=HOST_BOUND)  # warm-up: charged, no gain
    for _ in range(5):
        gate.should_plan(16)  # skips twice, probes, skips twice
    planned(gate, 256, cost_ms=0.5, waited_ms=1.0, gain=0.1)  # hidden under the device step
    out = gate.summary()
    assert (out["plan_gate/b16/planned_steps"], out["plan_gate/b16/skipped_steps"],
            out["plan_gate/b16/probe_steps"], out["plan_gate/b16/charged_costs"]) == (2, 4, 1, 1)
    assert out["plan_gate/b16/cost_ms_estimate"] == pytest.approx(0.5)
    assert out["plan_gate/b16/benefit_ms_estimate"] == 0.0
    assert out["plan_gate/b256/charged_costs"] == 0 and out["plan_gate/b256/benefit_ms_estimate"] > 0.0
    assert out["plan_gate/planned_steps"] == 3 and out["plan_gate/skipped_steps"] == 4
    gate.reset_counts()
    assert not any(k.startswith(("plan_gate/b16/", "plan_gate/b256/")) for k in gate.summary())
