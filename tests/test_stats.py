"""EngineStats on hand-computed steps; assert_active; the layout consistency check."""

import json

import pytest
import torch

from dspark.planner import PlanDecision
from dspark.stats import EngineStats, FeatureInactiveError, LayoutMismatchError, check_step_consistency


def three_steps():
    s = EngineStats()
    s.record_step(request_ids=["a", "b"], windows=[4, 2], accepted=[1, 2], block=4, mode="ragged")
    s.record_step(request_ids=["a", "b"], windows=[3, 4], accepted=[1, 0], block=4, mode="ragged")
    s.record_step(request_ids=["a"], windows=[4], accepted=[4], block=4, mode="full")
    return s


def test_token_counters_and_trim_ratio():
    s = three_steps()
    assert s.ceiling_tokens == 25 and s.delivered_tokens == 22 and s.window_tokens == 17
    assert s.committed_tokens == (2 + 3) + (2 + 1) + 5
    assert s.trim_ratio == pytest.approx(1 - 22 / 25)
    assert s.steps_by_mode == {"ragged": 2, "full": 1}
    assert s.verify_len_hist == {4: 3, 2: 1, 3: 1}


def test_trim_regret_counts_only_trimmed_requests_that_took_their_whole_window():
    s = three_steps()
    # trimmed: b at step 1 (window 2, accepted 2: regret) and a at step 2 (window 3, accepted 1: no regret)
    assert s.trimmed_requests == 2
    assert s.trim_regret_rate == pytest.approx(0.5)
    assert EngineStats().trim_regret_rate is None


def test_per_position_acceptance():
    # pos1 reached 5x, accepted 4x; pos2 reached by (a1, b1, a2, a3), accepted by (b1, a3);
    # pos3 reached only by a3 (b1's window ends at 2), pos4 likewise.
    assert three_steps().per_position_acceptance() == [pytest.approx(0.8), pytest.approx(0.5), 1.0, 1.0]


def test_acceptance_is_averaged_over_requests_not_tokens():
    s = three_steps()
    # a: committed 2, 2, 5 over 3 steps = 3.0 ; b: 3, 1 over 2 steps = 2.0 -> 2.5 (token-weighted would be 2.6)
    assert s.accept_length == pytest.approx(2.5)
    assert s.accept_rate == pytest.approx((6 / 11 + 2 / 6) / 2)
    assert s.block_accept_exact is False  # b hit its trimmed window: its uncapped acceptance is unknown
    summary = s.summary()
    json.dumps(summary)
    assert summary["position_accept.2"] == pytest.approx(0.5) and summary["steps_mode.ragged"] == 2


def test_block_accept_length_exact_in_cap_accept_mode():
    s = EngineStats()
    s.record_step(request_ids=[1, 2], windows=[2, 3], accepted=[2, 1], uncapped_accepted=[4, 1], block=4, mode="cap")
    assert s.block_accept_exact
    assert s.block_accept_length == pytest.approx((5 + 2) / 2)
    assert s.accept_length == pytest.approx((3 + 2) / 2)
    assert s.summary()["accept_length_over_block"] == pytest.approx(2.5 / 3.5)
    with pytest.raises(ValueError, match="uncapped_accepted"):
        s.record_step(request_ids=[1], windows=[3], accepted=[1], uncapped_accepted=[2], block=4, mode="cap")


def test_record_step_refuses_inconsistent_inputs():
    s = EngineStats()
    with pytest.raises(ValueError, match="accepted 3 outside \\[0, window=2\\]"):
        s.record_step(request_ids=[0], windows=[2], accepted=[3], block=4, mode="ragged")
    with pytest.raises(ValueError, match="eager_reason"):
        s.record_step(request_ids=[0], windows=[2], accepted=[1], block=4, mode="ragged", graph_replay=False)
    assert s.verify_steps == 0


def test_plan_reasons_and_predictions():
    s = EngineStats()
    trim = PlanDecision((2,), True, "trimmed", 0.1, 2.5, 3.0, 2)
    s.record_plan(trim, plan_ms=0.2)
    s.record_step(request_ids=[0], windows=[2], accepted=[2], block=4, mode="ragged", step_ms=3.5, decision=trim)
    untabled = PlanDecision((4,), False, "declined_no_table", 0.0, None, None, 4)
    s.record_plan(untabled)
    s.record_step(request_ids=[0], windows=[4], accepted=[0], block=4, mode="full", decision=untabled)
    s.record_step(request_ids=[0], windows=[4], accepted=[0], block=4, mode="full", step_ms=9.0)  # no decision
    out = s.summary()
    assert out["plan_reason.trimmed"] == 1 and out["plan_reason.declined_no_table"] == 1
    assert out["predicted_tokens_total"] == 2.5 and out["realised_tokens_on_predicted"] == 3
    assert out["measured_ms_on_predicted"] == 3.5 and out["predicted_gain_mean"] == pytest.approx(0.1)
    assert out["priced_ms_on_measured"] == out["predicted_ms_on_measured"] == 3.0  # no service price: the table's


def test_a_decision_valued_at_the_service_price_is_checked_against_it():
    s = EngineStats()
    trim = PlanDecision((2,), True, "trimmed", 0.1, 2.5, 3.0, 2, priced_ms=6.5)
    cheap = PlanDecision((4,), False, "declined_below_min_gain", 0.0, 4.0, 0.2, 4, priced_ms=1.0)
    dear = PlanDecision((4,), False, "declined_below_min_gain", 0.0, 4.0, 5.0, 4, priced_ms=10.5)
    for d in (trim, cheap, dear):
        s.record_plan(d)
    s.record_step(request_ids=[0], windows=[2], accepted=[2], block=4, mode="ragged", step_ms=6.0, decision=trim)
    s.record_step(request_ids=[0], windows=[4], accepted=[1], block=4, mode="ragged", step_ms=1.5, decision=cheap)
    s.record_step(request_ids=[0], windows=[4], accepted=[1], block=4, mode="ragged", decision=dear)  # not measured
    out = s.summary()
    assert out["priced_ms_on_measured"] == pytest.approx(7.5)
    assert out["predicted_ms_on_measured"] == pytest.approx(3.2) and out["predicted_ms_total"] == pytest.approx(8.2)
    assert out["measured_ms_on_predicted"] == pytest.approx(7.5)
    # the measured steps that ran a trim, apart: the trim alone (the declined ones kept the whole block)
    assert out["measured_steps_on_predicted"] == 2 and out["measured_steps_on_trimmed"] == 1
    assert out["measured_ms_on_trimmed"] == pytest.approx(6.0) and out["priced_ms_on_trimmed"] == pytest.approx(6.5)


def test_each_step_is_checked_against_its_own_decision_when_the_next_is_planned_first():
    """With the overlap scheduler step N+1 is planned (record_plan) before step N commits (record_step): each
    step's prediction check reads the decision it ran, not the last one planned."""
    s = EngineStats()
    first = PlanDecision((2,), True, "trimmed", 0.2, 3.0, 2.0, 2, priced_ms=2.5)
    second = PlanDecision((4,), False, "declined_below_min_gain", 0.0, 4.0, 4.0, 4, priced_ms=5.0)
    s.record_plan(first)
    s.record_plan(second)  # planned while the first is in flight
    s.record_step(request_ids=[0], windows=[2], accepted=[2], block=4, mode="ragged", step_ms=2.5, decision=first)
    out = s.summary()
    assert out["predicted_tokens_total"] == 3.0 and out["predicted_ms_total"] == 2.0
    assert out["priced_ms_on_measured"] == 2.5 and out["measured_ms_on_predicted"] == 2.5
    s.record_step(request_ids=[0], windows=[4], accepted=[3], block=4, mode="ragged", step_ms=5.0, decision=second)
    out = s.summary()
    assert out["predicted_tokens_total"] == 7.0 and out["realised_tokens_on_predicted"] == 3 + 4
    assert out["priced_ms_on_measured"] == 7.5 and out["predicted_ms_on_measured"] == 6.0


def test_assert_active_fails_when_every_step_declined():
    s = EngineStats()
    for _ in range(10):
        s.record_plan(PlanDecision((4, 4), False, "declined_no_table", 0.0, None, None, 8))
        s.record_step(request_ids=[0, 1], windows=[4, 4], accepted=[1, 3], block=4, mode="full")
    with pytest.raises(FeatureInactiveError, match="windows never differed.*no request was ever trimmed.*declined_no_table"):
        s.assert_active(min_steps=5)
    status = s.assert_active(min_steps=50)
    assert status.startswith("skipped: only 10 verify steps < min_steps 50")


def test_assert_active_passes_on_real_trims_and_checks_graphs():
    s = three_steps()
    assert s.assert_active(min_steps=3).startswith("active")
    with pytest.raises(FeatureInactiveError, match="no step replayed a graph"):
        s.assert_active(min_steps=3, expect_graphs=True)
    s.record_step(request_ids=[0], windows=[1], accepted=[0], block=4, mode="ragged", graph_replay=True)
    s.assert_active(min_steps=3, expect_graphs=True)
    s.record_step(request_ids=[0], windows=[1], accepted=[0], block=4, mode="ragged", graph_replay=False,
                  eager_reason="bucket_not_captured")
    with pytest.raises(FeatureInactiveError, match="1 steps ran eager.*bucket_not_captured"):
        s.assert_active(min_steps=3, expect_graphs=True)


def test_step_consistency_check():
    windows = [3, 1]
    good = torch.tensor([0, 4, 6], dtype=torch.int32)
    check_step_consistency(windows, good, num_tokens=6, bucket=8, block=4)
    # A uniform stride over ragged windows totals the same 6 tokens but misattributes rows.
    with pytest.raises(LayoutMismatchError, match="rows disagree"):
        check_step_consistency(windows, torch.tensor([0, 3, 6], dtype=torch.int32), num_tokens=6, bucket=8, block=4)
    with pytest.raises(LayoutMismatchError, match="int32"):
        check_step_consistency(windows, good.long(), num_tokens=6, bucket=8, block=4)
    with pytest.raises(LayoutMismatchError, match="num_tokens=7"):
        check_step_consistency(windows, good, num_tokens=7, bucket=8, block=4)
    with pytest.raises(LayoutMismatchError, match="bucket 4"):
        check_step_consistency(windows, good, num_tokens=6, bucket=4, block=4)
    with pytest.raises(LayoutMismatchError, match="outside"):
        check_step_consistency([5, 1], torch.tensor([0, 6, 8], dtype=torch.int32), num_tokens=8, bucket=8, block=4)
    with pytest.raises(LayoutMismatchError, match="entries"):
        check_step_consistency(windows, torch.tensor([0, 4], dtype=torch.int32), num_tokens=6, bucket=8, block=4)


@pytest.mark.parametrize("seed", range(4))
def test_vector_counts_match_a_row_by_row_count(seed):
    """record_step counts with numpy; a plain per-row walk over random steps gives the same numbers."""
    import random

    rnd = random.Random(seed)
    s = EngineStats()
    want = {"reached": [0] * 9, "accepted": [0] * 9, "trimmed": 0, "whole": 0, "exact": True, "committed": 0}
    for _ in range(20):
        n = rnd.randint(1, 12)
        G = [rnd.choice([5, 7, 9]) for _ in range(n)]
        w = [rnd.randint(0, g) for g in G]
        k = [rnd.randint(0, x) for x in w]
        s.record_step(request_ids=[rnd.randint(0, 30) for _ in range(n)], windows=w, accepted=k, block=G,
                      mode="ragged")
        for gi, wi, ki in zip(G, w, k):
            for pos in range(1, wi + 1):
                if ki >= pos - 1:
                    want["reached"][pos - 1] += 1
                    if ki >= pos:
                        want["accepted"][pos - 1] += 1
            want["trimmed"] += wi < gi
            want["whole"] += wi < gi and ki == wi
            want["exact"] &= not (wi < gi and ki == wi)
            want["committed"] += ki + 1
    assert s.reached_at == want["reached"] and s.accepted_at == want["accepted"]
    assert (s.trimmed_requests, s.trimmed_whole_window) == (want["trimmed"], want["whole"])
    assert s.block_accept_exact == want["exact"] and s.committed_tokens == want["committed"]


@pytest.mark.parametrize("ids", ["int", "str", "mixed"])
def test_per_request_sums_are_folded_as_a_row_by_row_count(ids, monkeypatch):
    """The per-request sums (steps, committed, accepted, verified, block-accepted) are folded from pending steps in
    one group-by every few steps and before they are read; they equal a row-by-row count, across several folds,
    with cap-accept's uncapped counts, and for ids that are strings or of mixed kinds (summed row by row)."""
    import random

    import dspark.stats as stats_mod

    monkeypatch.setattr(stats_mod, "_FOLD_STEPS", 3)
    rnd = random.Random(7)
    s = EngineStats()
    want: dict = {}
    for step in range(12):
        n = rnd.randint(1, 9)
        rids = rnd.sample(range(15), n)
        if ids == "str":
            rids = [f"r{r}" for r in rids]
        elif ids == "mixed":
            rids = [r if r % 2 else f"r{r}" for r in rids]
        w = [rnd.randint(0, 6) for _ in range(n)]
        k = [rnd.randint(0, x) for x in w]
        u = [ki if ki < wi else rnd.randint(wi, 6) for ki, wi in zip(k, w)] if step % 2 else None
        s.record_step(request_ids=rids, windows=w, accepted=k, block=6, mode="ragged", uncapped_accepted=u)
        for i, rid in enumerate(rids):
            per = want.setdefault(rid, [0, 0, 0, 0, 0])
            per[0] += 1
            per[1] += k[i] + 1
            per[2] += k[i]
            per[3] += w[i]
            per[4] += (u[i] if u is not None else k[i]) + 1
        if step == 4:  # a read in between folds what is pending
            s.summary()
            assert not s._pending
    assert len(s._pending) == 1  # seven steps after the read, folded every 3: one still pending
    mean = sum(p[1] / p[0] for p in want.values()) / len(want)
    assert s.summary()["accept_length"] == pytest.approx(mean)
    assert s._per_request == want and all(type(r) in (int, str) for r in s._per_request)


def test_prediction_totals_count_the_steps_the_planner_priced_and_no_unplanned_one():
    """A step too small to plan (or one the plan gate skipped) carries the table's price of the whole block but the
    planner never read its survival: counting it flagged arms that never planned (0.62x 'tokens per step')."""
    from dspark.planner import SMALL_BATCH_REASON

    s = EngineStats()
    priced = PlanDecision((4, 4), False, "declined_below_min_gain", 0.0, 5.0, 2.0, 8)
    small = PlanDecision((4, 4), False, SMALL_BATCH_REASON, 0.0, 9.0, 2.0, 8)
    s.record_step(request_ids=["a", "b"], windows=[4, 4], accepted=[1, 2], block=4, mode="ragged", decision=priced,
                  step_ms=2.5)
    s.record_step(request_ids=["a", "b"], windows=[4, 4], accepted=[0, 0], block=4, mode="ragged", decision=small,
                  step_ms=2.5)
    assert s.predicted_tokens_total == 5.0 and s.realised_tokens_on_predicted == 1 + 2 + 2
    assert s.predicted_ms_total == 2.0 and s.measured_ms_on_predicted == 2.5
