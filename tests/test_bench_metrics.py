"""Per-request and per-block metrics on hand-computed examples."""

import math

import pytest

from dspark.bench.metrics import (RequestRecord, aggregate_block, finish_reason_counts, request_metrics,
                                  requests_dataframe, truncation_counts)


def long_request():
    # 9 output tokens in 4 chunks (engine steps) of 3, 2, 3, 1 tokens; accept lengths include the bonus token.
    return RequestRecord(
        request_id="long", arm="B", block=0, prompt_tokens=20, output_token_ids=list(range(9)),
        arrival_s=10.0, first_token_s=10.5, finish_s=12.1,
        chunk_times_s=[10.5, 10.9, 11.5, 12.1], accept_lengths=[3, 2, 3, 1], verify_lengths=[3, 3, 3, 3],
        per_position_accepts=[4, 2, 1], per_position_reached=[4, 3, 2],
    )


def short_request():
    # 2 output tokens from two steps whose first draft was rejected (one corrected token each).
    return RequestRecord(
        request_id="short", arm="B", block=0, prompt_tokens=5, output_token_ids=[7, 8],
        arrival_s=10.0, first_token_s=10.2, finish_s=10.4,
        chunk_times_s=[10.2, 10.4], accept_lengths=[1, 1], verify_lengths=[3, 3],
        per_position_accepts=[0, 0, 0], per_position_reached=[2, 0, 0],
    )


def test_request_metrics_by_hand():
    m = request_metrics(long_request())
    assert m["ttft_s"] == pytest.approx(0.5)
    assert m["e2e_s"] == pytest.approx(2.1)
    assert m["tpot_s"] == pytest.approx((2.1 - 0.5) / 8)
    assert m["mean_itl_s"] == pytest.approx((0.4 + 0.6 + 0.6) / 3)
    assert m["accept_length"] == pytest.approx(9 / 4)
    assert m["accept_rate"] == pytest.approx((2 + 1 + 2 + 0) / 12)


def test_ttft_counts_from_submission_and_queue_wait_is_its_own_metric():
    # Scheduled to arrive at 10.0 (a closed loop's block start), sent to the engine at 10.0 + 265 s when a
    # concurrency slot freed, first token 0.5 s later.
    waited = RequestRecord("late", "A", 0, 20, list(range(9)), arrival_s=275.0, first_token_s=275.5, finish_s=277.1,
                           chunk_times_s=[275.5, 275.9, 276.5, 277.1], scheduled_arrival_s=10.0)
    m = request_metrics(waited)
    assert m["ttft_s"] == pytest.approx(0.5) and m["e2e_s"] == pytest.approx(2.1)
    assert m["queue_wait_s"] == pytest.approx(265.0)
    assert math.isnan(request_metrics(long_request())["queue_wait_s"])  # no scheduled arrival recorded
    agg = aggregate_block([waited, RequestRecord(**{**long_request().to_dict(), "scheduled_arrival_s": 10.0})],
                          wall_time_s=267.1)
    assert agg["ttft_s_p99"] == pytest.approx(0.5)
    assert agg["queue_wait_s_p50"] == pytest.approx(132.5) and agg["queue_wait_s_mean"] == pytest.approx(132.5)
    assert math.isnan(aggregate_block([long_request()], wall_time_s=2.2)["queue_wait_s_p50"])


def test_requests_dataframe_keeps_list_columns_as_lists(tmp_path):
    import pandas as pd

    from dspark.bench.metrics import REQUEST_LIST_COLUMNS, pooled_itls

    failed = RequestRecord("x", "B", 0, 5, [], 10.0, None, None, error="timeout")
    frame = requests_dataframe([long_request(), failed])
    assert frame.loc[0, "output_token_ids"] == list(range(9)) and frame.loc[1, "chunk_times_s"] == []
    frame.to_parquet(tmp_path / "requests.parquet", index=False)
    back = pd.read_parquet(tmp_path / "requests.parquet")
    for column in REQUEST_LIST_COLUMNS:
        assert [list(v) for v in back[column]] == [list(v) for v in frame[column]], column
    assert pooled_itls(back["chunk_times_s"]) == pytest.approx([0.4, 0.6, 0.6])
    assert pooled_itls([]).size == 0


def test_single_token_request_has_nan_tpot():
    one = RequestRecord("one", "A", 0, 3, [42], 0.0, 0.3, 0.3, chunk_times_s=[0.3])
    assert math.isnan(request_metrics(one)["tpot_s"])


def test_block_aggregate_averages_acceptance_over_requests_not_tokens():
    agg = aggregate_block([long_request(), short_request()], wall_time_s=2.2, counters={"trimmed_steps": 3})
    # per request: 9/4 = 2.25 and 1.0 -> mean 1.625; pooling tokens would give 11/6 = 1.83
    assert agg["accept_length"] == pytest.approx(1.625)
    assert agg["accept_rate"] == pytest.approx((5 / 12 + 0 / 6) / 2)
    assert agg["per_position_acceptance"] == pytest.approx([(1.0 + 0.0) / 2, 2 / 3, 1 / 2])
    assert agg["output_tokens"] == 11
    assert agg["output_tokens_per_s"] == pytest.approx(11 / 2.2)
    assert agg["requests_per_s"] == pytest.approx(2 / 2.2)
    assert agg["ttft_s_p50"] == pytest.approx(0.35)
    assert agg["tpot_s_p50"] == pytest.approx((0.2 + 0.2) / 2)  # short: (0.4 - 0.2) / 1; long: 1.6 / 8
    assert agg["itl_s_p99"] == pytest.approx(0.6)  # pooled gaps 0.4, 0.6, 0.6, 0.2
    assert agg["counter/trimmed_steps"] == 3


def test_errored_requests_are_counted_but_not_measured():
    failed = RequestRecord("x", "B", 0, 5, [], 10.0, None, None, error="timeout")
    agg = aggregate_block([long_request(), failed], wall_time_s=2.0)
    assert agg["n_errors"] == 1 and agg["n_requests"] == 2
    assert agg["ttft_s_p50"] == pytest.approx(0.5)
    frame = requests_dataframe([long_request(), failed])
    assert frame["error"].isna().tolist() == [True, False]


def test_finish_reasons_and_truncation_per_arm():
    def rec(rid, arm, prompt, n_out, reason):
        return RequestRecord(rid, arm, 0, prompt, list(range(n_out)), 0.0, 0.1, 0.2, finish_reason=reason)

    records = [rec("a0", "A", 10, 8, "length"), rec("a1", "A", 10, 3, "stop"), rec("a2", "A", 90, 10, "length"),
               rec("b0", "B", 10, 8, "length"), rec("b1", "B", 10, 8, "length"),
               RequestRecord("b2", "B", 0, 5, [], 0.0, None, None, error="boom", finish_reason="error"),
               rec("b3", "B", 10, 2, None)]
    frame = requests_dataframe(records)
    assert frame["finish_reason"].fillna("-").tolist() == ["length", "stop", "length", "length", "length", "error", "-"]
    assert finish_reason_counts(frame) == {"A": {"length": 2, "stop": 1}, "B": {"length": 2, "error": 1, "unknown": 1}}
    # The engine says "length" for both limits: prompt + output at max_model_len (100) is the context's cut.
    assert truncation_counts(frame, {"A": 100, "B": 100}) == {"A": {"max_tokens": 1, "max_model_len": 1},
                                                               "B": {"max_tokens": 2, "max_model_len": 0}}
    assert truncation_counts(frame) == {"A": {"max_tokens": 2, "max_model_len": 0},
                                        "B": {"max_tokens": 2, "max_model_len": 0}}
    older = frame.drop(columns="finish_reason")  # a run from before the column
    assert finish_reason_counts(older) == {} and truncation_counts(older) == {}


def test_inconsistent_records_are_rejected():
    with pytest.raises(ValueError, match="arrival_s <= first_token_s"):
        RequestRecord("bad", "A", 0, 1, [1], 5.0, 4.0, 6.0)
    with pytest.raises(ValueError, match="per_position_reached"):
        RequestRecord("bad", "A", 0, 1, [1], 0.0, 1.0, 2.0, per_position_accepts=[1], per_position_reached=[])
    with pytest.raises(ValueError, match="wall_time_s"):
        aggregate_block([long_request()], wall_time_s=0.0)


def test_prediction_health_flags_a_cost_table_that_mispredicts_the_planned_steps():
    from dspark.bench.metrics import prediction_health

    counters = {"A": {"decode_steps": 10},
                "B": {"sched/predicted_tokens_total": 400.0, "sched/realised_tokens_on_predicted": 392,
                      "sched/predicted_ms_total": 100.0, "sched/measured_ms_on_predicted": 131.0}}
    h = prediction_health(counters, 0.15)
    assert set(h) == {"B"}  # A priced no step
    assert h["B"]["tokens_realised_over_predicted"] == pytest.approx(0.98)
    assert h["B"]["step_ms_measured_over_predicted"] == pytest.approx(1.31)
    assert h["B"]["flags"] == ["arm B: step time 1.31x the cost table's prediction (beyond +/-15%)"]
    assert h["B"]["step_ms_measured_over_service_price"] is None  # no service price recorded
    assert prediction_health(counters, 0.5)["B"]["flags"] == []
    # the planner valued its steps at a service price: the check of that price, flagged on its own
    counters["B"].update({"sched/priced_ms_on_measured": 125.0, "sched/predicted_ms_on_measured": 100.0})
    h = prediction_health(counters, 0.15)["B"]
    assert h["step_ms_measured_over_service_price"] == pytest.approx(1.048)
    assert h["flags"] == ["arm B: step time 1.31x the cost table's prediction (beyond +/-15%)"]
    counters["B"]["sched/priced_ms_on_measured"] = 100.5
    assert prediction_health(counters, 0.15)["B"]["flags"][1] == \
        "arm B: step time 1.30x the service price it planned with (beyond +/-15%)"
    counters["B"]["sched/priced_ms_on_measured"] = 100.0  # the table's price: the same check, not repeated
    assert prediction_health(counters, 0.15)["B"]["step_ms_measured_over_service_price"] is None
    assert h["trimmed_step_ms_measured_over_price"] is None and h["trimmed_steps"] is None  # not counted: none
    # the trimmed steps apart from the other priced steps: 40 ms of 32 priced on 3 trimmed steps, 91 of 93 on 7 others
    counters["B"].update({"sched/priced_ms_on_measured": 125.0, "sched/measured_steps_on_predicted": 10,
                          "sched/measured_steps_on_trimmed": 3, "sched/measured_ms_on_trimmed": 40.0,
                          "sched/priced_ms_on_trimmed": 32.0})
    h = prediction_health(counters, 0.15)["B"]
    assert h["trimmed_steps"] == 3 and h["trimmed_step_ms_measured_over_price"] == pytest.approx(1.25)
    assert h["untrimmed_steps"] == 7 and h["untrimmed_step_ms_measured_over_price"] == pytest.approx(91.0 / 93.0)
    from dspark.bench.report import trimmed_price_text
    assert trimmed_price_text(h) == ("; at the price it valued them at, its 3 trimmed steps took 1.25x, its 7 other "
                                     "priced steps 0.98x")
    counters["B"].update({"sched/measured_steps_on_trimmed": 10, "sched/measured_ms_on_trimmed": 131.0,
                          "sched/priced_ms_on_trimmed": 125.0})  # every priced step trimmed
    h = prediction_health(counters, 0.15)["B"]
    assert h["untrimmed_steps"] == 0 and h["untrimmed_step_ms_measured_over_price"] is None
    assert trimmed_price_text(h).endswith("took 1.05x, it priced no other step")
    counters["B"]["sched/measured_steps_on_trimmed"] = 0  # none trimmed: nothing said of trims
    assert trimmed_price_text(prediction_health(counters, 0.15)["B"]) == ""


def _req(rid: str, arrival: float, chunks: list[tuple[float, int]], error: str | None = None) -> RequestRecord:
    """A request sent at ``arrival`` whose chunks (time, tokens) arrive as given."""
    times = [t for t, _ in chunks]
    tokens = [n for _, n in chunks]
    return RequestRecord(request_id=rid, arm="B", block=0, prompt_tokens=4, output_token_ids=list(range(sum(tokens))),
                         arrival_s=arrival, first_token_s=times[0], finish_s=times[-1], chunk_times_s=times,
                         chunk_tokens=tokens, error=error)


def closed_loop_block():
    """A closed loop at concurrency 2 over 4 requests: r0, r1 sent at 0; r2 sent when r0 finishes (4), r3 when r1
    finishes (5). The load runs out at r2's finish (8): from then on only r3 runs (the drain, to 12)."""
    return [_req("r0", 0.0, [(1.0, 2), (4.0, 2)]),
            _req("r1", 0.0, [(2.0, 3), (5.0, 1)]),
            _req("r2", 4.0, [(6.0, 4), (8.0, 1)]),
            _req("r3", 5.0, [(7.0, 2), (10.0, 5), (12.0, 3)])]


def test_full_load_window_of_a_closed_loop_ends_when_the_load_runs_out():
    from dspark.bench.metrics import full_load_throughput, full_load_window

    block = closed_loop_block()
    # From the 2nd submission (0.0) to the (4 - 2 + 1) = 3rd finish (r2's, 8.0).
    assert full_load_window(block, "closed", 2) == (0.0, 8.0)
    # Chunks inside [0, 8]: 2 + 2 + 3 + 1 + 4 + 1 + 2 = 15 tokens; r3's chunks at 10 and 12 are the drain.
    assert full_load_throughput(block, (0.0, 8.0)) == pytest.approx(15 / 8)
    # At concurrency 1 nothing drains (one request at a time); more in flight than requests: never at full load.
    assert full_load_window(block, "closed", 1) == (0.0, 12.0)
    assert full_load_window(block, "closed", 5) is None
    # Poisson: the load is offered from the first arrival to the last.
    assert full_load_window(block, "poisson") == (0.0, 5.0)
    with pytest.raises(ValueError, match="load_mode"):
        full_load_window(block, "open", 2)


def test_block_aggregate_reports_full_load_throughput_apart_from_the_drain():
    block = closed_loop_block()
    m = aggregate_block(block, wall_time_s=12.0, load_mode="closed", concurrency=2)
    assert m["output_tokens_per_s"] == pytest.approx(23 / 12)  # the whole block, drain included
    assert m["steady_output_tokens_per_s"] == pytest.approx(15 / 8)
    assert m["steady_window_s"] == pytest.approx(8.0) and m["steady_share"] == pytest.approx(8 / 12)
    # A longer drain (r3's last chunk later) lowers the block's throughput, not the full-load one.
    slow_tail = closed_loop_block()[:3] + [_req("r3", 5.0, [(7.0, 2), (10.0, 5), (20.0, 3)])]
    m2 = aggregate_block(slow_tail, wall_time_s=20.0, load_mode="closed", concurrency=2)
    assert m2["output_tokens_per_s"] < m["output_tokens_per_s"]
    assert m2["steady_output_tokens_per_s"] == pytest.approx(m["steady_output_tokens_per_s"])
    # Without the load's mode nothing is computed (callers that do not know the load).
    assert "steady_output_tokens_per_s" not in aggregate_block(block, wall_time_s=12.0)


def test_full_load_throughput_is_nan_when_chunk_token_counts_are_unknown():
    block = closed_loop_block()
    block[1] = RequestRecord(request_id="r1", arm="B", block=0, prompt_tokens=4, output_token_ids=[],
                             output_token_count=4, arrival_s=0.0, first_token_s=2.0, finish_s=5.0,
                             chunk_times_s=[2.0, 5.0])  # a server that streamed text only
    m = aggregate_block(block, wall_time_s=12.0, load_mode="closed", concurrency=2)
    assert math.isnan(m["steady_output_tokens_per_s"]) and m["steady_window_s"] == pytest.approx(8.0)
    with pytest.raises(ValueError, match="one token count per chunk"):
        RequestRecord(request_id="bad", arm="B", block=0, prompt_tokens=1, output_token_ids=[1, 2], arrival_s=0.0,
                      first_token_s=1.0, finish_s=2.0, chunk_times_s=[1.0, 2.0], chunk_tokens=[2])
