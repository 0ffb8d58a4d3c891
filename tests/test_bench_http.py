"""dspark.bench.http: the pieces of an A/B arm served over HTTP.

The launcher on a stand-in server (tests/fake_openai_server.py: starts in a fraction of a second): healthy
start, stop of the whole process group, a crash and a timeout reported with the log's tail, a port already
taken refused. The Prometheus reader on this project's server's real /metrics text and on fixture text with
vLLM's, SGLang's, TensorRT-LLM's and llama.cpp's names. The load generator against a live tiny runners.serve
app (in-process, as tests/test_serve.py runs it): closed loop and Poisson arrivals, TTFT and every chunk's
time, token ids equal to Engine.generate's, errors recorded per request.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the HTTP tests need the test extra: pip install -e '.[test]'")

from dspark.bench.http.endpoint import HttpEndpoint
from dspark.bench.http.launcher import LaunchError, ServerProcess
from dspark.bench.http.load import HttpRequest, arrival_offsets, run_load
from dspark.bench.http.prometheus import (FLAVOURS, MetricsError, dspark_engine_counters, parse_samples,
                                          spec_decode_delta, timings_acceptance)
from dspark.bench.http.records import to_request_record
from dspark.bench.metrics import aggregate_block
from dspark.config import ConfigError, SamplingParams
from dspark.engine import Engine
from test_serve import MODEL, TOKENIZER, engine_for, serving
from tiny import tiny_drafter, tiny_engine_config, tiny_target

FAKE = Path(__file__).with_name("fake_openai_server.py")


@pytest.fixture(scope="module")
def models():
    target = tiny_target(0, scale=4.0)  # the models tests/test_serve.py serves
    return target, tiny_drafter(target, 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_server(tmp_path, *args: str, port: int | None = None, **kw) -> ServerProcess:
    port = port or free_port()
    kw.setdefault("health_timeout_s", 10.0)
    kw.setdefault("stop_timeout_s", 2.0)
    return ServerProcess([sys.executable, str(FAKE), str(port), *args], tmp_path / f"fake-{port}.log",
                         f"http://127.0.0.1:{port}/health", name="fake", **kw)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---- the endpoint's settings ----------------------------------------------------------------------
@pytest.mark.parametrize("values,key", [
    ({"base_url": "127.0.0.1:8000"}, "base_url"),
    ({"base_url": "http://h/v1", "api": "responses"}, "api"),
    ({"base_url": "http://h/v1", "launch": ()}, "launch"),
    ({"base_url": "http://h/v1", "keep_running": True}, "keep_running"),
    ({"base_url": "http://h/v1", "metrics": "tgi"}, "metrics"),
    ({"base_url": "http://h/v1", "metrics_url": "h:9/metrics"}, "metrics_url"),
    ({"base_url": "http://h/v1", "health_timeout_s": 0}, "health_timeout_s"),
    ({"base_url": "http://h/v1", "extra_body": {"stream": False}}, "extra_body"),
])
def test_a_bad_endpoint_setting_is_refused_by_its_key(values, key):
    with pytest.raises(ConfigError, match=f"^{key}: "):
        HttpEndpoint(**values)


def test_the_endpoint_derives_its_urls():
    e = HttpEndpoint(base_url="http://127.0.0.1:8021/v1/", api="completions")
    assert e.root_url == "http://127.0.0.1:8021" and e.resolved_health_url == "http://127.0.0.1:8021/health"
    assert e.request_url == "http://127.0.0.1:8021/v1/completions"


# ---- the launcher ---------------------------------------------------------------------------------
def test_a_launched_server_is_healthy_and_stopping_it_ends_its_whole_process_group(tmp_path):
    server = fake_server(tmp_path, "--child")
    with server:
        assert server.running and httpx.get(server.health_url).status_code == 200
        child = int(next(line for line in server.tail().splitlines() if line.startswith("child pid")).split()[-1])
        assert alive(child)
    assert not server.running and server.returncode is not None
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child), "the server's child outlived the stop"
    assert server.stop() == server.returncode  # stopping again is harmless


def test_a_server_that_ignores_sigint_is_stopped_with_sigterm(tmp_path):
    server = fake_server(tmp_path, "--ignore-sigint", stop_timeout_s=0.5)
    with server:
        pid = server.process.pid
    assert not alive(pid) and server.returncode == 0  # its SIGTERM handler exits 0


def test_a_server_that_crashes_is_reported_with_its_log_tail(tmp_path):
    server = fake_server(tmp_path, "--crash")
    with pytest.raises(LaunchError, match=r"exited with status 3 before .*/health answered 200") as info:
        with server:
            pass
    assert "cannot load the model (a planted crash)" in str(info.value)  # the log's tail


def test_a_server_that_never_gets_healthy_is_stopped_and_reported(tmp_path):
    server = fake_server(tmp_path, "--delay", "60", health_timeout_s=1.0)
    with pytest.raises(LaunchError, match=r"did not answer 200 within 1 s \(it answered 503\); the server was stopped"):
        with server:
            pass
    assert not server.running


def test_a_port_already_served_is_refused_before_launching(tmp_path):
    port = free_port()
    with fake_server(tmp_path, port=port):
        second = fake_server(tmp_path, port=port)
        with pytest.raises(LaunchError, match="already answers before the launch"):
            second.start()
        assert second.process is None


# ---- Prometheus counters --------------------------------------------------------------------------
VLLM_BEFORE = """\
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 45
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 12
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 8
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 0
"""
VLLM_AFTER = VLLM_BEFORE.replace("} 10\n", "} 30\n").replace("} 45\n", "} 105\n").replace("} 20\n", "} 50\n") \
    .replace('position="0"} 12', 'position="0"} 30').replace('position="1"} 8', 'position="1"} 20')

TRTLLM = """\
# TYPE trtllm_spec_decode_num_draft_tokens counter
trtllm_spec_decode_num_draft_tokens_total{model_name="m",engine_type="trtllm"} %d
# TYPE trtllm_spec_decode_num_accepted_tokens counter
trtllm_spec_decode_num_accepted_tokens_total{model_name="m",engine_type="trtllm"} %d
# TYPE trtllm_spec_decode_drafted_tokens counter
trtllm_spec_decode_drafted_tokens_total{model_name="m",token_position="0"} %d
trtllm_spec_decode_drafted_tokens_total{model_name="m",token_position="1"} %d
# TYPE trtllm_spec_decode_accepted_tokens counter
trtllm_spec_decode_accepted_tokens_total{model_name="m",token_position="0"} %d
trtllm_spec_decode_accepted_tokens_total{model_name="m",token_position="1"} %d
# TYPE trtllm_spec_decode_acceptance_length gauge
trtllm_spec_decode_acceptance_length{model_name="m"} 2.5
"""

SGLANG = """\
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="m"} %s
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{model_name="m"} 0.4
# TYPE sglang:generation_tokens counter
sglang:generation_tokens_total{model_name="m"} 100
"""

LLAMACPP = """\
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 3469
"""


def test_vllm_counters_give_the_blocks_acceptance_by_delta():
    d = spec_decode_delta(parse_samples(VLLM_BEFORE), parse_samples(VLLM_AFTER), FLAVOURS["vllm"])
    # Engines 0 and 1 summed: drafts 15 -> 35 (engine 1 did not move).
    assert (d.drafts, d.draft_tokens, d.accepted_tokens) == (20, 60, 30)
    assert d.accepted_per_position == [18, 12, 0]
    acc = d.acceptance()
    assert acc["accept_length"] == pytest.approx(1 + 30 / 20) and acc["accept_rate"] == pytest.approx(30 / 60)
    assert acc["per_position_acceptance"] == pytest.approx([18 / 20, 12 / 20, 0.0])  # accepted over drafts
    assert d.counters()["spec_decode/num_drafts"] == 20 and d.counters()["spec_decode/accepted_pos.1"] == 12


def test_trtllm_counters_give_acceptance_without_a_draft_count():
    before = parse_samples(TRTLLM % (100, 40, 50, 50, 30, 10))
    after = parse_samples(TRTLLM % (160, 70, 80, 80, 50, 20))
    d = spec_decode_delta(before, after, FLAVOURS["trtllm"])
    assert (d.drafts, d.draft_tokens, d.accepted_tokens) == (None, 60, 30)
    assert d.drafted_per_position == [30, 30] and d.accepted_per_position == [20, 10]
    acc = d.acceptance()
    assert "accept_length" not in acc  # no count of drafts exported: no accept length is made up
    assert acc["accept_rate"] == pytest.approx(0.5)
    assert acc["per_position_acceptance"] == pytest.approx([20 / 30, 10 / 30])  # accepted over drafted there


def test_sglang_exports_gauges_only_read_at_the_blocks_end():
    d = spec_decode_delta(parse_samples(SGLANG % "1.9"), parse_samples(SGLANG % "3.1"), FLAVOURS["sglang"])
    assert d.acceptance() == {}  # a gauge of the last logging interval is not the block's acceptance
    assert d.counters() == {"spec_decode/sglang_spec_accept_length_gauge": 3.1,
                            "spec_decode/sglang_spec_accept_rate_gauge": 0.4}


def test_llamacpp_acceptance_comes_from_its_response_timings():
    d = spec_decode_delta(parse_samples(LLAMACPP), parse_samples(LLAMACPP), FLAVOURS["llamacpp"])
    assert d.counters() == {} and d.acceptance() == {}  # /metrics has no speculative-decoding counters
    summed = timings_acceptance([{"draft_n": 16, "draft_n_accepted": 14}, None, {"predicted_n": 3},
                                 {"draft_n": 4, "draft_n_accepted": 1}])
    assert summed == {"spec_decode/num_draft_tokens": 20, "spec_decode/num_accepted_tokens": 15}
    assert timings_acceptance([{"predicted_n": 3}, None]) is None


def test_a_counter_that_went_back_is_an_error_not_a_negative_count():
    with pytest.raises(MetricsError, match="vllm:spec_decode_num_drafts_total went down by 20 .*restarted"):
        spec_decode_delta(parse_samples(VLLM_AFTER), parse_samples(VLLM_BEFORE), FLAVOURS["vllm"])
    with pytest.raises(MetricsError, match="not Prometheus exposition text"):
        parse_samples("this is { not metrics")


def test_this_servers_metrics_give_the_engines_counters_by_delta(models):
    engine = engine_for(models, verify="ragged", force_verify_len=2, force_trimmed_path=True)
    with serving(engine) as served:
        client = served.client()
        client.completions.create(model=MODEL, prompt="warm", max_tokens=4, temperature=0)
        before = parse_samples(httpx.get(f"{served.url}/metrics").text)
        counts = engine.counters()
        responses = [client.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0,
                                               extra_body={"ignore_eos": True}) for p in ("Roses", "Dear diary")]
        after = parse_samples(httpx.get(f"{served.url}/metrics").text)
        now = engine.counters()
    c = dspark_engine_counters(before, after)
    for key in ("decode_steps", "drafted_tokens", "verified_tokens", "window_tokens", "trimmed_steps",
                "accepted_tokens", "request_steps"):
        assert c[key] == now[key] - counts[key], key
    assert c["trim_ratio"] == pytest.approx(1 - c["window_tokens"] / c["ceiling_tokens"]) and c["trim_ratio"] > 0
    reasons = {k: v for k, v in c.items() if k.startswith("sched/plan_reason.")}
    assert sum(reasons.values()) == now["decode_steps"] - counts["decode_steps"] > 0
    assert c["sched/verify_len_hist.2"] > 0
    calibrated = [k for k in now if k.startswith("confidence_calibration/")]  # the drafter's own calibration's steps
    assert calibrated and all(c[k] == now[k] - counts[k] for k in calibrated), (calibrated, c)
    d = spec_decode_delta(before, after, FLAVOURS["dspark"])
    accepted = sum(r.model_extra["acceptance"]["num_accepted_tokens"] for r in responses)
    assert d.accepted_tokens == accepted == c["accepted_tokens"] and sum(d.accepted_per_position) == accepted
    assert d.drafts == sum(r.model_extra["acceptance"]["num_drafts"] for r in responses)


def test_the_calibration_step_counters_round_trip_through_metrics():
    """confidence_calibration/<method>_steps and greedy_<method>_steps (engine.greedy_confidence_calibration) come
    back from a server's /metrics under the engine's keys, by delta; a served arm's did_nothing guard reads them."""
    from dspark.serving.engine_loop import EngineSnapshot
    from dspark.serving.metrics import ServerMetrics

    metrics = ServerMetrics("m")

    def samples(counters):
        snap = EngineSnapshot(counters=counters, accepted_per_position=(), block_size=4, num_running=0, num_waiting=0,
                              kv_pages_total=1, kv_pages_free=1, num_live_requests=0)
        return parse_samples(metrics.render(snap).decode())

    before = samples({"confidence_calibration/sts_bias_steps": 5, "confidence_calibration/greedy_sts_top_gap_steps": 2})
    after = samples({"confidence_calibration/sts_bias_steps": 9, "confidence_calibration/greedy_sts_top_gap_steps": 7})
    c = dspark_engine_counters(before, after)
    assert c["confidence_calibration/sts_bias_steps"] == 4 and c["confidence_calibration/greedy_sts_top_gap_steps"] == 5


# ---- the load generator ---------------------------------------------------------------------------
PROMPTS = ["The rain in Spain", "Once upon a time", "def fib(n):", "Roses are red,"]


def chat_requests(max_tokens: int = 12) -> list[HttpRequest]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [HttpRequest.of(f"r{i}", [{"role": "user", "content": p}], None, params) for i, p in enumerate(PROMPTS)]


def test_closed_loop_streams_every_step_with_token_ids_equal_to_engine_generate(models):
    engine = engine_for(models, step_delay_s=0.005)
    with serving(engine) as served:
        endpoint = HttpEndpoint(base_url=f"{served.url}/v1")
        finished = []
        load = run_load(endpoint, MODEL, chat_requests(), mode="closed", concurrency=2, rate=0.0, seed=0,
                        on_finished=finished.append)
    target, drafter = models
    reference = Engine(target, TOKENIZER, tiny_engine_config(spec="off"), None).generate(
        [[{"role": "user", "content": p}] for p in PROMPTS], SamplingParams(temperature=0.0, max_tokens=12,
                                                                            ignore_eos=True))
    assert sum(finished) == len(PROMPTS) and [r.request_id for r in load.results] == ["r0", "r1", "r2", "r3"]
    for result, ref in zip(load.results, reference):
        assert result.error is None and result.finish_reason == "length"
        assert result.token_ids == list(ref.token_ids) and result.text == ref.text  # lossless through the API
        assert result.prompt_tokens == len(ref.prompt_token_ids) and result.completion_tokens == 12
        acc = result.acceptance
        assert len(acc["accept_lengths"]) == len(acc["verify_lengths"]) and sum(acc["accept_lengths"]) == 12
        # A chunk per engine step that committed tokens, as many as the request's decode steps, but where the HTTP
        # side lagged behind the engine and sent several steps' tokens in one (on a loaded CPU it may).
        assert 1 <= len(result.chunk_times_s) <= acc["num_steps"]
        assert result.sent_s <= result.first_token_s == result.chunk_times_s[0] <= result.chunk_times_s[-1]
        assert result.chunk_times_s[-1] <= result.finish_s
        assert len(result.chunk_tokens) == len(result.chunk_times_s) and sum(result.chunk_tokens) == 12
    # Closed loop at 2: all due at the start; the third waited for a slot (sent after the first finished).
    first_done = min(r.finish_s for r in load.results[:2])
    assert len(set(r.scheduled_s for r in load.results)) == 1 and load.results[2].sent_s >= first_done - 1e-3
    records = [to_request_record(r, "B", 0) for r in load.results]
    row = aggregate_block(records, load.wall_s, load_mode="closed", concurrency=2)
    assert row["steady_output_tokens_per_s"] > 0 and 0 < row["steady_share"] <= 1
    assert row["output_tokens"] == 48 and row["ttft_s_p50"] > 0 and row["itl_s_p50"] > 0 and row["n_errors"] == 0
    assert records[0].per_position_accepts and len(records[0].per_position_accepts) == 4  # the drafter's block


def test_poisson_arrivals_follow_the_seeded_schedule(models):
    with serving(engine_for(models)) as served:
        endpoint = HttpEndpoint(base_url=f"{served.url}/v1")
        load = run_load(endpoint, MODEL, chat_requests(4), mode="poisson", concurrency=1, rate=20.0, seed=3)
    offsets = arrival_offsets(4, "poisson", 20.0, 3)
    start = load.scheduled_s[0] - offsets[0]
    assert [s - start for s in load.scheduled_s] == pytest.approx(list(offsets))
    assert all(r.sent_s >= r.scheduled_s - 1e-4 for r in load.results)  # never sent before it was due
    assert all(r.sent_s - r.scheduled_s < 0.5 for r in load.results)  # nor held back by a concurrency cap
    assert all(r.error is None for r in load.results)
    assert load.wall_s >= offsets[-1]


def test_a_request_past_its_time_limit_is_an_error_and_the_block_goes_on(models):
    """request_timeout_s bounds the whole request, its stream included: a server whose steps take 0.2 s cannot
    stream 12 tokens within 0.5 s."""
    with serving(engine_for(models, step_delay_s=0.2)) as served:
        endpoint = HttpEndpoint(base_url=f"{served.url}/v1", request_timeout_s=0.5)
        started = time.monotonic()
        load = run_load(endpoint, MODEL, chat_requests()[:2], mode="closed", concurrency=2, rate=0.0, seed=0)
    assert all(r.error == "no complete response within 0.5 s (request_timeout_s)" for r in load.results)
    assert time.monotonic() - started < 10


def test_a_failing_request_is_recorded_as_an_error_and_the_block_goes_on(models):
    with serving(engine_for(models)) as served:
        endpoint = HttpEndpoint(base_url=f"{served.url}/v1")
        bad = HttpRequest.of("too_long", [{"role": "user", "content": "x"}], None, SamplingParams(max_tokens=10_000))
        load = run_load(endpoint, MODEL, [bad, *chat_requests(3)[:1]], mode="closed", concurrency=2, rate=0.0, seed=0)
        wrong_model = run_load(endpoint, "gpt-5", chat_requests(3)[:1], mode="closed", concurrency=1, rate=0.0, seed=0)
    assert load.results[0].error.startswith("HTTP 400: ") and "maximum context length" in load.results[0].error
    assert load.results[1].error is None
    record = to_request_record(load.results[0], "A", 0)
    assert record.error and record.finish_reason == "error" and record.first_token_s is None
    assert wrong_model.results[0].error.startswith("HTTP 404: ")
    with pytest.raises(ValueError, match="text prompt for a chat endpoint"):
        run_load(HttpEndpoint(base_url="http://127.0.0.1:9/v1"), "m",
                 [HttpRequest.of("t", None, "text", SamplingParams())], mode="closed", concurrency=1, rate=0, seed=0)


def test_a_server_without_token_ids_gives_text_and_usage_counts(tmp_path):
    port = free_port()
    with fake_server(tmp_path, port=port):
        endpoint = HttpEndpoint(base_url=f"http://127.0.0.1:{port}/v1")
        load = run_load(endpoint, "fake", chat_requests(5), mode="closed", concurrency=2, rate=0.0, seed=0)
    result = load.results[0]
    assert result.error is None and result.token_ids is None and result.text == PROMPTS[0][::-1][:5]
    assert len(result.chunk_times_s) == 5 and result.finish_reason == "length"
    record = to_request_record(result, "A", 0)
    assert record.output_token_ids == [] and record.output_token_count == 5 and record.n_output_tokens == 5
    assert aggregate_block([record], 1.0)["output_tokens"] == 5
    assert record.chunk_tokens == []  # text without ids: each chunk's token count is unknown, not guessed
    assert math.isnan(aggregate_block([record], 1.0, load_mode="closed", concurrency=1)["steady_output_tokens_per_s"])


def test_an_interrupt_stops_the_load_and_leaves_no_request_behind(models):
    """Ctrl-C while a block runs (KeyboardInterrupt in the load generator's loop) propagates, and the server
    aborts what its client left."""
    engine = engine_for(models, step_delay_s=0.02)
    with serving(engine) as served:
        endpoint = HttpEndpoint(base_url=f"{served.url}/v1")
        calls = []

        def interrupt(n):
            calls.append(n)
            os.kill(os.getpid(), signal.SIGINT)

        with pytest.raises(KeyboardInterrupt):
            run_load(endpoint, MODEL, chat_requests(40), mode="closed", concurrency=2, rate=0.0, seed=0,
                     on_finished=interrupt)
        def in_engine() -> float:
            m = served.metrics()
            return m[("vllm:num_requests_running", ())] + m[("vllm:num_requests_waiting", ())]

        deadline = time.monotonic() + 10
        while in_engine() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert in_engine() == 0 and calls == [1]
