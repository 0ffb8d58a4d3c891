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
    result = lossless_guard(OUTPUTS, changed, dtype="float32", margin_fn=lambda rid, prefix: 0.0,
                            near_tie_margin=1.0)
    assert not result.passed
    (diff,) = result.details["differences"]
    assert (diff["request_id"], diff["first_diff_index"], diff["token_a"], diff["token_b"]) == ("r0", 2, 7, 4)
    assert diff["margin"] is None  # fp32 never excuses a flip, so the margin is not even asked for
    assert "r0@2" in result.message


def test_bf16_near_tie_flip_counted_apart_from_real_divergence():
    b = {**OUTPUTS, "r0": [5, 6, 4, 1], "r1": [1, 7, 7]}
    asked = []

    def margin_fn(request_id, prefix):
        asked.append((request_id, list(prefix)))
        return {"r0": 0.01, "r1": 3.5}[request_id]

    result = lossless_guard(OUTPUTS, b, dtype="bf16", margin_fn=margin_fn, near_tie_margin=0.05)
    assert sorted(asked) == [("r0", [5, 6]), ("r1", [1])]  # the agreed prefix, up to the first difference
    assert result.details["near_tie_flips"] == 1
    assert result.details["divergences"] == 1
    assert not result.passed  # r1 diverged with a 3.5-logit margin
    kinds = {d["request_id"]: d["kind"] for d in result.details["differences"]}
    assert kinds == {"r0": "near_tie", "r1": "divergence"}

    only_tie = lossless_guard(OUTPUTS, {**OUTPUTS, "r0": [5, 6, 4, 1]}, dtype="bfloat16", margin_fn=margin_fn,
                              near_tie_margin=0.05)
    assert only_tie.passed
    assert only_tie.details["near_tie_flips"] == 1
    assert "near-tie" in only_tie.message


def test_length_mismatch_and_missing_requests_fail():
    shorter = {**OUTPUTS, "r1": [1, 2]}
    result = lossless_guard(OUTPUTS, shorter, dtype="float32")
    assert not result.passed
    assert result.details["differences"][0]["token_b"] is None
    missing = {k: v for k, v in OUTPUTS.items() if k != "r2"}
    result = lossless_guard(OUTPUTS, missing, dtype="float32")
    assert not result.passed
    assert result.details["missing_in_b"] == ["r2"]


def test_bad_dtype_or_margin_is_an_error():
    with pytest.raises(ValueError, match="int8"):
        lossless_guard(OUTPUTS, OUTPUTS, dtype="int8")
    with pytest.raises(ValueError, match="margin_fn returned"):
        lossless_guard(OUTPUTS, {**OUTPUTS, "r0": [0]}, dtype="fp16", margin_fn=lambda r, p: float("nan"),
                       near_tie_margin=0.1)


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
    # The planner's own decline reasons say why, most frequent first, each with what it means.
    declined = did_nothing_guard("B", config, {**healthy, "trimmed_steps": 0, "trim_ratio": 0.0,
                                               "sched/plan_reason.declined_below_min_gain": 690,
                                               "sched/plan_reason.declined_mixed_step": 12,
                                               "sched/plan_reason.declined_no_table": 0},
                                 expects_trim=True, expects_graphs=True, expects_speculation=True)
    assert not declined.passed
    assert ("declined_below_min_gain in 690 of 702 steps (the planner predicted less than engine.min_predicted_gain"
            in declined.message)
    assert declined.message.index("declined_below_min_gain") < declined.message.index("declined_mixed_step")
    assert "declined_no_table" not in declined.message
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
