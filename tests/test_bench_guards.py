"""Guards: lossless outputs, features that did nothing, errored requests."""

import pytest

from dspark.bench.guards import (ABGuardError, did_nothing_guard, errors_guard, lossless_guard, raise_on_failure,
                                 trim_expected)
from dspark.bench.metrics import RequestRecord

OUTPUTS = {"r0": [5, 6, 7, 8], "r1": [1, 2, 3], "r2": [9, 9, 9]}


def test_identical_outputs_pass_in_fp32():
    result = lossless_guard(OUTPUTS, {k: list(v) for k, v in OUTPUTS.items()}, dtype="float32")
    assert result.passed
    assert result.details["identical"] == 3


def test_one_changed_token_fails_in_fp32_with_location():
    changed = {**OUTPUTS, "r0": [5, 6, 4, 8]}
    result = lossless_guard(OUTPUTS, changed, dtype="float32")
    assert not result.passed
    (diff,) = result.details["differences"]
    assert (diff["request_id"], diff["first_diff_index"], diff["token_a"], diff["token_b"]) == ("r0", 2, 7, 4)
    assert "r0@2" in result.message


def test_length_mismatch_and_missing_requests_fail():
    shorter = {**OUTPUTS, "r1": [1, 2]}
    result = lossless_guard(OUTPUTS, shorter, dtype="float32")
    assert not result.passed
    assert result.details["differences"][0]["token_b"] is None
    missing = {k: v for k, v in OUTPUTS.items() if k != "r2"}
    result = lossless_guard(OUTPUTS, missing, dtype="float32")
    assert not result.passed
    assert result.details["missing_in_b"] == ["r2"]


def test_bad_dtype_or_reduced_precision_is_an_error():
    """The exact check is for float32; bf16 differences are judged on evidence (dspark/bench/lossless.py)."""
    with pytest.raises(ValueError, match="int8"):
        lossless_guard(OUTPUTS, OUTPUTS, dtype="int8")
    with pytest.raises(ValueError, match="evidence_lossless_guard"):
        lossless_guard(OUTPUTS, OUTPUTS, dtype="bf16")


def test_did_nothing_guard_fires_on_each_idle_feature():
    config = {"verify": "ragged"}
    assert trim_expected("ragged", force_override=False)
    assert not trim_expected("all", force_override=False)
    healthy = {"trimmed_steps": 40, "trim_ratio": 0.2, "graph_replays": 100, "drafted_tokens": 900, "decode_steps": 100}
    ok = did_nothing_guard("B", config, healthy, expects_trim=True, expects_graphs=True, expects_speculation=True)
    assert ok.passed, ok.message

    never_trimmed = did_nothing_guard("B", config, {**healthy, "trimmed_steps": 0, "trim_ratio": 0.0},
                                      expects_trim=True, expects_graphs=True, expects_speculation=True)
    assert not never_trimmed.passed and "never did" in never_trimmed.message
    assert "no planner decisions" in never_trimmed.message  # no sched/plan_reason.* counters at all
    # A planner that priced every step and declined it as "no predicted gain" ran: that is an answer
    # (trimming does not pay here), and the guard passes saying so in words, with the counts.
    declined = did_nothing_guard("B", config, {**healthy, "trimmed_steps": 0, "trim_ratio": 0.0,
                                               "sched/plan_reason.declined_below_min_gain": 690,
                                               "sched/plan_reason.declined_mixed_step": 12,
                                               "sched/plan_reason.declined_no_table": 0},
                                 expects_trim=True, expects_graphs=True, expects_speculation=True)
    assert declined.passed, declined.message
    assert declined.message.startswith("B declined all 702 steps: predicted gain below engine.min_predicted_gain "
                                       "at this batch depth on this node (declined_below_min_gain, 690 steps)")
    assert "same work as a verify-all arm" in declined.message and "engaged: graphs, speculation" in declined.message
    assert declined.details["declined_all"] is True
    assert declined.details["plan_reasons"] == {"declined_below_min_gain": 690, "declined_mixed_step": 12}
    assert ok.details["declined_all"] is False  # it trimmed
    flat = did_nothing_guard("B", config, {**healthy, "trimmed_steps": 0, "trim_ratio": 0.0,
                                           "sched/plan_reason.declined_flat_cost": 50},
                             expects_trim=True, expects_graphs=False, expects_speculation=False)
    assert flat.passed and flat.details["declined_all"] and "flat cost" in flat.message
    # No cost table: the planner could not decide, so the feature could not run; it fails, naming why.
    no_table = did_nothing_guard("B", config, {**healthy, "trimmed_steps": 0, "trim_ratio": 0.0,
                                               "sched/plan_reason.declined_no_table": 702},
                                 expects_trim=True, expects_graphs=True, expects_speculation=True)
    assert not no_table.passed and not no_table.details["declined_all"]
    assert "could not decide (declined_no_table in 702 of 702 steps)" in no_table.message
    assert "profile one (runners.profile)" in no_table.message
    # Mixed: some steps could not be decided and none trimmed: it fails, naming the could-not-run reason and
    # listing every decision most frequent first.
    mixed = did_nothing_guard("B", config, {**healthy, "trimmed_steps": 0, "trim_ratio": 0.0,
                                            "sched/plan_reason.declined_below_min_gain": 690,
                                            "sched/plan_reason.declined_snapshot_not_ready": 12},
                              expects_trim=True, expects_graphs=True, expects_speculation=True)
    assert not mixed.passed
    assert "could not decide (declined_snapshot_not_ready in 12 of 702 steps)" in mixed.message
    assert ("declined_below_min_gain in 690 of 702 steps (the planner predicted less than engine.min_predicted_gain"
            in mixed.message)
    decisions = mixed.message[mixed.message.index("the planner's decisions"):]
    assert decisions.index("declined_below_min_gain in") < decisions.index("declined_snapshot_not_ready in 12")
    # A forced trim (engine.force_verify_len / force_budget_frac) replaces the planner: trim_expected says the
    # planner is not expected to decide, and the forced windows must have trimmed.
    assert not trim_expected("ragged", force_override=True)
    forced_ok = did_nothing_guard("B", config, {**healthy, "sched/plan_reason.forced": 100},
                                  expects_trim=trim_expected("ragged", True), forces_trim=True, expects_graphs=True,
                                  expects_speculation=True)
    assert forced_ok.passed and "forced trim" in forced_ok.message
    forced_idle = did_nothing_guard("B", config, {**healthy, "trimmed_steps": 0, "trim_ratio": 0.0,
                                                  "sched/plan_reason.forced": 100},
                                    expects_trim=trim_expected("ragged", True), forces_trim=True, expects_graphs=True,
                                    expects_speculation=True)
    assert not forced_idle.passed and "a forced trim" in forced_idle.message and "never trimmed" in forced_idle.message
    assert "forced in 100 of 100 steps" in forced_idle.message
    # A forced arm the caller still treats as planner-driven fails too: "forced" is no "predicted no gain".
    forced_as_planner = did_nothing_guard("B", config, {**healthy, "trimmed_steps": 0, "trim_ratio": 0.0,
                                                        "sched/plan_reason.forced": 100},
                                          expects_trim=True, expects_graphs=True, expects_speculation=True)
    assert not forced_as_planner.passed and "could not decide (forced in 100 of 100 steps)" in forced_as_planner.message
    eager = did_nothing_guard("B", config, {**healthy, "graph_replays": 0}, expects_trim=True, expects_graphs=True,
                              expects_speculation=True)
    assert not eager.passed and "graph_replays" in eager.message
    no_drafts = did_nothing_guard("B", config, {**healthy, "drafted_tokens": 0}, expects_trim=False,
                                  expects_graphs=False, expects_speculation=True)
    assert not no_drafts.passed and "drafted_tokens" in no_drafts.message
    unreported = did_nothing_guard("B", config, {"drafted_tokens": 5}, expects_trim=True, expects_graphs=False,
                                   expects_speculation=True)
    assert not unreported.passed and "'trimmed_steps' missing" in unreported.message
    baseline = did_nothing_guard("A", {"verify": "all"}, {"trimmed_steps": 0}, expects_trim=False,
                                 expects_graphs=False, expects_speculation=False)
    assert baseline.passed


def test_errors_guard_and_raise_on_failure():
    ok = RequestRecord("r0", "A", 0, 4, [1, 2], 0.0, 0.1, 0.2)
    bad = RequestRecord("r1", "B", 3, 4, [], 0.0, None, None, error="CUDA out of memory")
    assert errors_guard([ok]).passed
    failed = errors_guard([ok, bad])
    assert not failed.passed
    assert failed.details["errors"] == [{"request_id": "r1", "arm": "B", "block": 3, "error": "CUDA out of memory"}]
    raise_on_failure([errors_guard([ok])])
    with pytest.raises(ABGuardError) as err:
        raise_on_failure([failed, lossless_guard(OUTPUTS, {}, dtype="float32"), errors_guard([ok])])
    assert "2 guard(s) failed" in str(err.value)
    assert "CUDA out of memory" in str(err.value) and "lossless" in str(err.value)


def test_did_nothing_guard_on_draft_free_steps_and_service_cost():
    """Draft-free steps pass when the engine made the choice (drafting every step is an answer) and fail when it
    never chose; the service price passes when some step was measured for it."""
    base = {"graph_replays": 10, "drafted_tokens": 90, "decode_steps": 10}
    kw = dict(expects_trim=False, expects_graphs=False, expects_speculation=True)
    chose = {**base, "draft_free_steps": 0, "draft_free/b8/draft_steps": 10, "service_cost/extra_steps": 10,
             "service_cost/floor_steps": 10}
    ok = did_nothing_guard("B", {}, chose, expects_draft_free=True, expects_service_cost=True, **kw)
    assert ok.passed and "draft_free" in ok.message and "service_cost" in ok.message
    never = did_nothing_guard("B", {}, {**base, "draft_free_steps": 0}, expects_draft_free=True, **kw)
    assert not never.passed and "never chose" in never.message
    unmeasured = did_nothing_guard("B", {}, {**base, "service_cost/extra_steps": 0, "service_cost/floor_steps": 0},
                                   expects_service_cost=True, **kw)
    assert not unmeasured.passed and "no committed step was measured" in unmeasured.message
    missing = did_nothing_guard("B", {}, base, expects_service_cost=True, **kw)
    assert not missing.passed and "service_cost/extra_steps" in missing.message


def test_did_nothing_guard_on_a_configured_calibration(tmp_path):
    """An arm whose engine.confidence_calibration should steer its planner passes only when drafted steps read
    survival from a calibration of that file's method; runners.ab derives the method from the file."""
    import json

    from dspark.config import EngineConfig
    from runners.ab import _configured_calibration

    base = {"graph_replays": 10, "drafted_tokens": 90, "decode_steps": 10}
    kw = dict(expects_trim=False, expects_graphs=False, expects_speculation=True)
    ok = did_nothing_guard("B", {}, {**base, "confidence_calibration/sts_max_prob_steps": 10},
                           expects_calibration="sts_max_prob", **kw)
    assert ok.passed and "calibration sts_max_prob" in ok.message
    other = did_nothing_guard("B", {}, {**base, "confidence_calibration/sts_bias_steps": 10},
                              expects_calibration="sts_max_prob", **kw)
    assert not other.passed and "confidence_calibration/sts_max_prob_steps" in other.message
    unread = did_nothing_guard("B", {}, {**base, "confidence_calibration/sts_max_prob_steps": 0},
                               expects_calibration="sts_max_prob", **kw)
    assert not unread.passed and "no drafted step" in unread.message and "plan_min_rows" not in unread.message
    small = did_nothing_guard("B", {}, {**base, "confidence_calibration/sts_max_prob_steps": 0,
                                        "sched/plan_reason.declined_small_batch": 10},
                              expects_calibration="sts_max_prob", **kw)
    assert not small.passed and "engine.plan_min_rows, which run no confidence head" in small.message
    path = tmp_path / "temperatures.json"
    path.write_text(json.dumps({"method": "head_and_max_prob_logistic_regression", "temperatures": [1.2, 1.0],
                                "biases": [0.1, 0.0], "max_prob_weights": [0.5, 0.6]}))
    planning = dict(spec="dspark", verify="ragged", confidence_calibration=str(path))
    assert _configured_calibration(EngineConfig(**planning)) == "sts_max_prob"
    assert _configured_calibration(EngineConfig(**{**planning, "confidence_calibration": str(tmp_path)})) \
        == "sts_max_prob"
    path.write_text(json.dumps({"method": "sequential_temperature_bias_scaling", "temperatures": [1.2, 1.0],
                                "biases": [0.1, 0.0]}))
    assert _configured_calibration(EngineConfig(**planning)) == "sts_bias"
    # a verify-all arm, or one planning on the max probability, reads no head survival: nothing to expect
    assert _configured_calibration(EngineConfig(**{**planning, "verify": "full"})) is None
    assert _configured_calibration(EngineConfig(**{**planning, "acceptance_estimate": "draft_max_prob"})) is None
    assert _configured_calibration(EngineConfig(spec="dspark", verify="ragged")) is None


def test_did_nothing_guard_on_a_greedy_calibration(tmp_path):
    """engine.greedy_confidence_calibration: the arm passes only when some all-greedy drafted step read survival from
    that file's method; on a sampled workload no step does, and the guard says so."""
    from dspark.config import EngineConfig
    from dspark.training.calibration import save_temperatures
    from runners.ab import _configured_calibration

    base = {"graph_replays": 10, "drafted_tokens": 90, "decode_steps": 10, "confidence_calibration/sts_bias_steps": 4}
    kw = dict(expects_trim=False, expects_graphs=False, expects_speculation=True)
    ok = did_nothing_guard("B", {}, {**base, "confidence_calibration/greedy_sts_top_gap_steps": 6},
                           expects_greedy_calibration="sts_top_gap", **kw)
    assert ok.passed and "greedy calibration sts_top_gap" in ok.message, ok.message
    unread = did_nothing_guard("B", {}, {**base, "confidence_calibration/greedy_sts_top_gap_steps": 0},
                               expects_greedy_calibration="sts_top_gap", **kw)
    assert not unread.passed and "a sampled workload runs none" in unread.message
    missing = did_nothing_guard("B", {}, base, expects_greedy_calibration="sts_top_gap", **kw)
    assert not missing.passed and "confidence_calibration/greedy_sts_top_gap_steps" in missing.message
    save_temperatures(tmp_path, [1.0, 1.0], biases=[0.1, 0.2], top_gap_weights=[0.5, 0.6])
    planning = dict(spec="dspark", verify="ragged", greedy_confidence_calibration=str(tmp_path))
    assert _configured_calibration(EngineConfig(**planning), greedy=True) == "sts_top_gap"
    assert _configured_calibration(EngineConfig(**planning)) is None
    assert _configured_calibration(EngineConfig(**{**planning, "verify": "full"}), greedy=True) is None


def test_did_nothing_guard_accepts_an_arm_that_ran_every_step_draft_free():
    """Every step draft-free after the choice measured drafting: an answer (the work of target-only decoding),
    like a planner that declined every step; without a measured drafting step it is a failure."""
    counters = {"graph_replays": 10, "drafted_tokens": 0, "decode_steps": 10, "draft_free_steps": 10,
                "trimmed_steps": 0, "trim_ratio": 0.0}
    kw = dict(expects_trim=True, expects_graphs=True, expects_speculation=True, expects_draft_free=True)
    ok = did_nothing_guard("B", {}, {**counters, "draft_free/b8/draft_steps": 8}, **kw)
    assert ok.passed and "draft-free" in ok.message and ok.details["draft_free_all"]
    unmeasured = did_nothing_guard("B", {}, {**counters, "draft_free/b8/draft_steps": 0}, **kw)
    assert not unmeasured.passed and "never measured a drafting step" in unmeasured.message
    # a timed block counts its steps anew, but the choice's comparison of the kinds (from the warm-up) persists
    compared = {**counters, "draft_free/b8/draft_steps": 0, "draft_free/b8/pairs": 0,
                "draft_free/b8/free_vs_draft_pct": 12.5}
    assert did_nothing_guard("B", {}, compared, **kw).passed


class _TieScorer:
    """Scores without a model: the reference's argmax is token 0 at every position, any other token sits
    0.01 logits below it (a near tie), and the measured forward noise is 0.05 everywhere."""

    def score_many(self, items, progress=None):
        import numpy as np

        from dspark.bench.reference import ScoredOutput

        out = []
        for _, toks in items:
            t = np.asarray(toks, dtype=np.int64)
            n = len(t)
            top_tokens = np.zeros((n, 2), dtype=np.int64)
            top_tokens[:, 1] = 1
            top_logits = np.tile(np.array([1.0, 0.99], dtype=np.float32), (n, 1))
            out.append(ScoredOutput(tokens=t, top_tokens=top_tokens, top_logits=top_logits,
                                    token_logits=np.where(t == 0, 1.0, 0.99).astype(np.float32),
                                    noise=np.full(n, 0.05, dtype=np.float32)))
        return out


@pytest.mark.parametrize("b_flips_per_block,passes", [(1, True), (3, False)])
def test_rate_test_weighs_each_request_once_however_many_outputs_an_arm_gave_it(b_flips_per_block, passes):
    """A (every block alike) and the control leave the reference at one near tie in 100 of 1,000 requests. B's
    batch composition varies by block, so on those 100 requests each of its 4 blocks gives another output.
    With one near-tie flip per output, B leaves the reference as often as rounding does and passes (counting
    its 400 distinct outputs once each would triple its rate and fail it); with three, it fails."""
    from dspark.bench.lossless import RunOutputs, evidence_lossless_guard

    L, n_req, tied = 20, 1000, 100

    def output(rid: int, flips: int, variant: int) -> list[int]:
        toks = [0] * L
        if rid < tied:
            for j in range(flips):
                toks[(variant + 5 * j) % L] = 1  # a different place per block: a different output
        return toks

    prompts = {rid: [5, 6] for rid in range(n_req)}
    runs = [RunOutputs(f"A/block{b}", "A", {r: output(r, 1, 0) for r in range(n_req)}) for b in range(4)]
    runs += [RunOutputs(f"B/block{b}", "B", {r: output(r, b_flips_per_block, b + 1) for r in range(n_req)})
             for b in range(4)]
    runs.append(RunOutputs("control", "control", {r: output(r, 1, 0) for r in range(n_req)}))
    g = evidence_lossless_guard(runs, [(f"A/block{b}", f"B/block{b}") for b in range(4)], prompts, _TieScorer(),
                                control_pair=("A/block0", "control"), alpha=0.001, dtype="bfloat16")
    assert g.passed == passes, g.message
    assert "rounding flip" in g.message and "real divergence" not in g.message


def test_a_control_on_other_requests_than_its_pair_is_refused():
    """A control run shares its requests with the run it is paired with: one on other requests (say, a greedy
    workload's requests against its greedy replicas) would find no flips and leave the noise bound at the
    forward noise, a weaker guard than asked for."""
    from dspark.bench.lossless import RunOutputs, evidence_lossless_guard

    prompts = {"p0": [5, 6], "p0#greedy": [5, 6]}
    runs = [RunOutputs("A/greedy_replicas", "A", {"p0#greedy": [0, 0]}),
            RunOutputs("B/greedy_replicas", "B", {"p0#greedy": [0, 0]}),
            RunOutputs("control", "control", {"p0": [0, 1]})]
    pairs = [("A/greedy_replicas", "B/greedy_replicas")]
    with pytest.raises(ValueError, match="shares no request"):
        evidence_lossless_guard(runs, pairs, prompts, _TieScorer(), control_pair=("A/greedy_replicas", "control"),
                                alpha=0.001, dtype="bfloat16")
    runs[-1] = RunOutputs("control", "control", {"p0#greedy": [0, 1]})
    g = evidence_lossless_guard(runs, pairs, prompts, _TieScorer(), control_pair=("A/greedy_replicas", "control"),
                                alpha=0.001, dtype="bfloat16")
    assert g.details["control_flip_count"] == 1, g.message
