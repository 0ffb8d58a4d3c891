"""dspark.serving.engine_process: runners.serve's default, the engine built and run in a process of its own.

On the tiny models (runners.serve's DSPARK_TEST_TINY_MODELS engine, fp32, greedy): the process serves the same
token ids as the engine in a thread, streamed or not, to concurrent clients; /metrics reads the child's counters
through snapshots and counts finished requests in the server's process; a client that disconnects aborts its
request in the child; a handler that lags behind the engine sends several steps' tokens in one chunk; stopping the
server drains and stops the child; a child that dies or whose engine fails turns live requests into 5xx errors
that say why; the child ends when the server's process dies. Flow control: a child whose server lags merges
several steps' events into one message (outputs unchanged, no event lost or reordered), sends nothing without a
credit, answers snapshots at once, and flushes what it holds as soon as a credit comes back, idle or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

for _module in ("httpx", "fastapi", "uvicorn", "prometheus_client"):
    pytest.importorskip(_module, reason="the HTTP server tests need the test extra: pip install -e '.[test]'")
pytest.importorskip("openai", reason="the HTTP server tests need the test extra: pip install -e '.[test]'")

import httpx  # noqa: E402
from hydra.errors import ConfigCompositionException  # noqa: E402

from dspark.config import ConfigError, SamplingParams  # noqa: E402
from dspark.serving import engine_process  # noqa: E402
from dspark.serving.config import ServerConfig  # noqa: E402
from dspark.serving.engine_loop import Admitted, Finished, NewTokens, Refused  # noqa: E402
from dspark.serving.engine_process import HELD_STEPS, MERGED_STEPS, MESSAGES, EngineProcess  # noqa: E402
from runners import serve  # noqa: E402
from runners.common import TINY_MODELS_ENV  # noqa: E402
from runners.schema import to_server_config  # noqa: E402
from test_serve import MODEL, compose_serve, engine_is_idle, serving, sigterm_during_a_stream, wait_until  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = ["The rain in Spain", "Once upon a time", "def fib(n):", "Roses are red,"]


@dataclass(frozen=True)
class TinyEngine:
    """The child's factory: runners.serve's engine on the tiny models (as ``python -m runners.serve`` builds it with
    DSPARK_TEST_TINY_MODELS=1), each step slowed by ``step_delay_s``, step number ``fail_at_step`` raising."""

    cfg: Any
    step_delay_s: float = 0.0
    fail_at_step: int | None = None

    def __call__(self):
        engine = serve.ServedEngine(self.cfg, tiny=True)()
        step, calls = engine.step, []

        def hooked_step():
            calls.append(1)
            if len(calls) == self.fail_at_step:
                raise RuntimeError("the device fell off the bus")
            time.sleep(self.step_delay_s)
            return step()

        engine.step = hooked_step
        return engine


@pytest.fixture(scope="module")
def cfg():
    return compose_serve(["spec=dspark"])


def thread_engine(cfg):
    """The same engine in this process (served by a thread)."""
    return serve.prepared(serve.tiny_engine(cfg), cfg)


@pytest.fixture(scope="module")
def served_process(cfg):
    with serving(EngineProcess(TinyEngine(cfg, step_delay_s=0.003))) as served:
        yield served


def counters(served) -> dict:
    return served.metrics()


def engine_counters(served) -> dict:
    """The counters of a snapshot taken now (the child's message counters among them)."""
    engine_loop = served.app.state.engine_loop
    return asyncio.run_coroutine_threadsafe(engine_loop.snapshot(), engine_loop._loop).result(10).counters


@contextlib.contextmanager
def slow_event_loop(served, stall_s: float = 0.05, every_s: float = 0.1):
    """The server's event loop stalled for ``stall_s`` every ``every_s`` (the engine process keeps stepping)."""
    done = threading.Event()

    def stall():
        while not done.wait(every_s):
            served.app.state.engine_loop._loop.call_soon_threadsafe(time.sleep, stall_s)

    thread = threading.Thread(target=stall, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def delta(after: dict, before: dict, name: str, labels: tuple = ()) -> float:
    return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)


def requests_of(served) -> list:
    """Every kind of request, concurrently: completions and chat, plain and streamed, with the token ids."""
    client = served.client()
    ids = {"return_token_ids": True}

    def complete(i):
        r = client.completions.create(model=MODEL, prompt=PROMPTS[i], max_tokens=24, temperature=0, extra_body=ids)
        return r.choices[0].model_extra["token_ids"], r.choices[0].text, r.usage.completion_tokens

    def complete_streamed(i):
        chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[i], max_tokens=24, temperature=0,
                                                stream=True, stream_options={"include_usage": True}, extra_body=ids))
        assert chunks[-1].choices == [] and chunks[-2].choices[0].finish_reason is not None
        tokens = [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]]
        return tokens, "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage.completion_tokens

    def chat(i):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[i]}],
                                           max_tokens=24, temperature=0, extra_body=ids)
        return r.choices[0].model_extra["token_ids"], r.choices[0].message.content, r.usage.completion_tokens

    def chat_streamed(i):
        chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[i]}],
                                                     max_tokens=24, temperature=0, stream=True, extra_body=ids))
        tokens = [t for c in chunks for t in (c.choices[0].model_extra.get("token_ids") or [])]
        return tokens, "".join(c.choices[0].delta.content or "" for c in chunks), len(tokens)

    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(f, i) for f in (complete, complete_streamed, chat, chat_streamed)
                   for i in range(len(PROMPTS))]
        return [f.result() for f in futures]


@pytest.fixture(scope="module")
def thread_outputs(cfg):
    """requests_of the same engine served by a thread."""
    with serving(thread_engine(cfg)) as in_thread:
        return requests_of(in_thread)


# ---- the same outputs as a thread, batched ------------------------------------------------------

def test_the_engine_process_serves_the_thread_modes_token_ids_to_concurrent_clients(served_process, thread_outputs):
    before = counters(served_process)
    got = requests_of(served_process)
    after = counters(served_process)
    want = thread_outputs
    assert got == want  # token ids, texts and usage: exact (fp32, greedy)
    n = len(PROMPTS)
    assert [g[0] for g in got[:n]] == [g[0] for g in got[n:2 * n]]  # streamed = plain
    assert all(len(ids) == 24 for ids, _, _ in got)
    # The clients' requests shared the child's steps (more than one request per decode step, on average).
    steps = delta(after, before, "dspark:decode_steps_total")
    assert delta(after, before, "dspark:request_steps_total") > steps > 0
    # Finished requests are counted in the server's process (on_finish), the engine's counters come from the child.
    assert delta(after, before, "vllm:generation_tokens_total") == sum(usage for _, _, usage in got)
    assert delta(after, before, "vllm:request_success_total", (("finished_reason", "length"),)) == len(got)
    assert delta(after, before, "dspark:emitted_tokens_total") >= sum(usage for _, _, usage in got)
    drafted = delta(after, before, "dspark:drafted_tokens_total")
    assert delta(after, before, "vllm:spec_decode_num_draft_tokens_total") == drafted > 0
    assert after[("vllm:num_requests_running", ())] == 0 and after[("dspark:server_live_requests", ())] == 0
    assert httpx.get(f"{served_process.url}/health").status_code == 200
    described = httpx.get(f"{served_process.url}/dspark/engine").json()
    assert described["block_size"] == 4 and described["models"]["drafter"]["arch"] == "block4-L1-r8-vanilla"


def test_a_client_that_disconnects_aborts_its_request_in_the_engine_process(served_process):
    before = counters(served_process)
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{served_process.url}/v1/completions", json=body) as r:
        lines = r.iter_lines()
        first = [next(lines) for _ in range(4)]  # two events and their blank lines: it is decoding
    assert first[0].startswith("data: ")
    aborted = ("vllm:request_success_total", (("finished_reason", "abort"),))
    wait_until(lambda: counters(served_process).get(aborted, 0) == before.get(aborted, 0) + 1)
    after = counters(served_process)
    assert engine_is_idle(served_process)  # the child freed its pages and row
    assert delta(after, before, "vllm:generation_tokens_total") < 200


def stalled_stream(served, **kw) -> list:
    """A streamed completion's chunks, the server's event loop stalled for 0.3 s after the second chunk (the engine
    process keeps stepping meanwhile)."""
    chunks = []
    for chunk in served.client().completions.create(stream=True, **kw):
        chunks.append(chunk)
        if len(chunks) == 2:
            served.app.state.engine_loop._loop.call_soon_threadsafe(time.sleep, 0.3)
    return chunks


def test_a_handler_behind_the_engine_sends_several_steps_in_one_chunk(served_process):
    """After a stall the stream's next chunk carries every step's tokens queued meanwhile; the tokens and text are
    the plain request's, the usage chunk comes last, and a stop string is still never sent."""
    kw = dict(model=MODEL, prompt="Dear diary", max_tokens=64, temperature=0, extra_body={"return_token_ids": True,
                                                                                         "ignore_eos": True})
    plain = served_process.client().completions.create(**kw)
    chunks = stalled_stream(served_process, stream_options={"include_usage": True}, **kw)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 64
    chunks = chunks[:-1]
    with_ids = [c.choices[0].model_extra["token_ids"] for c in chunks if c.choices[0].model_extra["token_ids"]]
    steps = plain.model_extra["acceptance"]["num_steps"]
    assert [t for ids in with_ids for t in ids] == plain.choices[0].model_extra["token_ids"]
    assert "".join(c.choices[0].text for c in chunks) == plain.choices[0].text
    assert len(with_ids) < steps and max(len(ids) for ids in with_ids) > 2 * 2  # several steps in one chunk

    text = plain.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 3]  # a stop string that completes after the stall
    chunks = stalled_stream(served_process, stop=[stop[0] + "\x7f", stop], **kw)
    assert "".join(c.choices[0].text for c in chunks) == text[: text.find(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


# ---- flow control: the child sends no faster than the event loop delivers ---------------------------

def test_a_child_whose_server_lags_merges_steps_and_serves_the_thread_modes_outputs(served_process, thread_outputs):
    """The event loop stalled 50 ms every 100 ms: the child, short of credits, merges several steps' events into a
    message; every request's token ids, text and usage (streamed or not) are still the thread mode's."""
    before = engine_counters(served_process)
    with slow_event_loop(served_process):
        got = requests_of(served_process)
    after = engine_counters(served_process)
    assert got == thread_outputs
    messages, steps = after[MESSAGES] - before[MESSAGES], after[MERGED_STEPS] - before[MERGED_STEPS]
    assert after[HELD_STEPS] > before[HELD_STEPS] and steps > messages > 0  # more than one step per message


def test_a_lagging_server_loses_no_event_and_an_idle_child_flushes_at_once(served_process):
    """The event loop stalled 0.5 s while a stream decodes: the child holds its events (the request finishes in
    the meantime, the engine goes idle) and sends them as soon as a credit comes back; the stream then ends at
    once with every token in order and its finish; a request the engine refuses comes back at once; /metrics of
    the idle engine answers at once."""
    kw = dict(model=MODEL, prompt="Dear diary", max_tokens=48, temperature=0, extra_body={"return_token_ids": True,
                                                                                         "ignore_eos": True})
    client = served_process.client(timeout=15)
    plain = client.completions.create(**kw)
    before = engine_counters(served_process)
    chunks, stalled_at = [], None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        chunks.append(chunk)
        if len(chunks) == 1:
            stalled_at = time.monotonic()
            served_process.app.state.engine_loop._loop.call_soon_threadsafe(time.sleep, 0.5)
    assert time.monotonic() - stalled_at < 0.5 + 1.5  # not stuck in the idle child
    after = engine_counters(served_process)
    assert after[HELD_STEPS] > before[HELD_STEPS]  # it did hold events
    assert chunks[-1].usage.completion_tokens == 48 and chunks[-2].choices[0].finish_reason == "length"
    ids = [t for c in chunks[:-1] for t in c.choices[0].model_extra["token_ids"] or []]
    assert ids == plain.choices[0].model_extra["token_ids"]
    assert "".join(c.choices[0].text for c in chunks[:-1]) == plain.choices[0].text

    with ThreadPoolExecutor(1) as pool:  # refused while another request decodes
        streamed = pool.submit(lambda: list(client.completions.create(stream=True, **kw)))
        wait_until(lambda: counters(served_process)[("vllm:num_requests_running", ())] == 1)
        started = time.monotonic()
        refused = httpx.post(f"{served_process.url}/v1/completions", json={"prompt": [5, 6, 500], "max_tokens": 4})
        refused_s = time.monotonic() - started
        assert streamed.result(timeout=15)[-1].choices[0].finish_reason == "length"
    assert refused.status_code == 400 and "unknown token ids" in refused.json()["error"]["message"]
    assert refused_s < 1.0
    started = time.monotonic()
    assert engine_is_idle(served_process) and time.monotonic() - started < 1.0


def child_on_pipes(cfg):
    """The child's loop (engine_process._serve) over a tiny engine in a thread of this process, on pipes, one message
    in flight: (engine, send(*commands), the events pipe, the thread, its exit code once it ends)."""
    engine = TinyEngine(cfg, step_delay_s=0.005)()
    child_commands, commands = multiprocessing.Pipe(duplex=False)
    events, child_events = multiprocessing.Pipe(duplex=False)
    exit_code = []
    child = threading.Thread(target=lambda: exit_code.append(engine_process._serve(
        engine, [(child_commands, child_events)], os.getppid(), messages_in_flight=1)), daemon=True)
    child.start()

    def send(*batch):
        commands.send_bytes(pickle.dumps(list(batch)))

    return engine, send, events, child, exit_code


def test_the_child_sends_nothing_without_a_credit_merges_per_request_and_answers_snapshots(cfg):
    """The child's loop (engine_process._serve) in a thread of this process, on pipes, one message in flight, the
    server's side played here: after its first message the child keeps stepping but sends nothing more until a
    credit comes back, except a snapshot's reply (at once, carrying what it held); idle, it sends what it held
    as soon as the credit comes: one request's tokens of many steps as one NewTokens, its Finished after them."""
    engine, send, events, child, exit_code = child_on_pipes(cfg)

    def receive(timeout_s: float = 5.0):
        assert events.poll(timeout_s), "no message from the child"
        return pickle.loads(events.recv_bytes())

    params = SamplingParams(max_tokens=120, ignore_eos=True)
    prompt = engine.tokenizer.encode("Once upon a time")
    send(("add", 1, prompt, params, True), ("add", 2, [5, 6, 500], params, False))
    kind, first, replies, _ = receive()
    assert kind == "step" and replies == [] and first[0] == (1, Admitted())
    [refused] = [event for rid, event in first if rid == 2]
    assert isinstance(refused, Refused) and "unknown token ids" in refused.message
    send(("snapshot", 7))  # no credit: the reply still comes, with the events held meanwhile
    kind, middle, replies, _ = receive()
    assert kind == "step" and [token for token, _ in replies] == [7] and replies[0][1].num_live_requests == 1
    wait_until(lambda: not engine.scheduler.has_work())  # it stepped to the end without a credit
    assert not events.poll(0.3)  # idle, holding the request's last events
    send(("credit",), ("credit",))
    kind, last, replies, _ = receive(timeout_s=1.0)  # at once: the credit woke the idle child
    assert kind == "step" and replies == []
    assert [rid for rid, _ in last] == [1, 1] and isinstance(last[0][1], NewTokens)  # many steps: one NewTokens
    output = last[1][1].output
    assert isinstance(last[1][1], Finished) and output.finish_reason == "length"
    assert [e for rid, e in first + middle if rid == 1 and not isinstance(e, (Admitted, NewTokens))] == []
    tokens = [t for rid, e in first + middle + last if isinstance(e, NewTokens) for t in e.token_ids]
    assert tokens == output.token_ids[:len(tokens)] and len(output.token_ids) == 120  # the last step's: in Finished
    send(("credit",), ("snapshot", 8))
    _, _, [(_, snapshot)], _ = receive()
    c = snapshot.counters
    assert c[MESSAGES] == 2 + bool(middle) and c[MERGED_STEPS] > c[MESSAGES] and c[HELD_STEPS] > 0
    assert c[MERGED_STEPS] >= output.num_steps  # every step's events went, merged, in 2 or 3 messages
    send(("credit",), ("stop",))
    kind, rest, _, final = receive()
    child.join(10)
    assert kind == "stopped" and rest == [] and exit_code == [0]
    assert all(final.counters[k] == c[k] for k in (MESSAGES, MERGED_STEPS, HELD_STEPS))


def test_an_admission_goes_without_a_credit(cfg):
    """A request added while the child waits for a credit is answered at once (its handler awaits the Admitted
    before answering its client), with the events held so far; that message counts as in flight like any other."""
    engine, send, events, child, exit_code = child_on_pipes(cfg)

    params = SamplingParams(max_tokens=200, ignore_eos=True)
    prompt = engine.tokenizer.encode("Once upon a time")
    send(("add", 1, prompt, params, True))
    assert events.poll(5.0)
    kind, first, _, _ = pickle.loads(events.recv_bytes())
    assert kind == "step" and first[0] == (1, Admitted())
    time.sleep(0.05)  # steps held for want of a credit
    assert not events.poll(0)
    send(("add", 2, prompt, params, True))  # still no credit
    assert events.poll(1.0), "the admission waited for a credit"
    kind, second, _, _ = pickle.loads(events.recv_bytes())
    assert (2, Admitted()) in second and any(rid == 1 and isinstance(e, NewTokens) for rid, e in second)
    assert not events.poll(0.1)  # two messages in flight now, at most one allowed: nothing more without credits
    send(("credit",), ("credit",), ("stop",))
    while True:
        assert events.poll(5.0)
        if pickle.loads(events.recv_bytes())[0] == "stopped":
            break
    child.join(10)
    assert exit_code == [0]


def test_messages_in_flight_must_be_a_positive_integer(cfg):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="messages_in_flight"):
            EngineProcess(TinyEngine(cfg), messages_in_flight=bad)


# ---- stopping, dying, failing -------------------------------------------------------------------

def process_is_gone(pid: int) -> bool:
    """No such process, or only its zombie (exited; its new parent has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_stopping_the_server_drains_then_stops_the_engine_process(cfg, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="dspark.serving"):
        process = EngineProcess(TinyEngine(cfg, step_delay_s=0.01))
    assert f"engine in its own process, pid {process.pid}" in caplog.text
    with serving(process) as served:
        chunks = sigterm_during_a_stream(served)
        assert served.app.state.engine_loop is process
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 40
    final = process.last_snapshot  # the child's last, sent as it stopped
    assert final.num_live_requests == 0 and final.kv_pages_free == final.kv_pages_total
    assert final.counters["emitted_tokens"] >= 40
    assert process._process.exitcode == 0 and process_is_gone(process.pid)


def test_an_engine_process_that_dies_fails_live_requests_with_its_exit_status(cfg):
    process = EngineProcess(TinyEngine(cfg, step_delay_s=0.01))
    with serving(process) as served:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "ignore_eos": True}
        with ThreadPoolExecutor(2) as pool:
            plain = pool.submit(httpx.post, f"{served.url}/v1/completions", json=body, timeout=30)
            with httpx.stream("POST", f"{served.url}/v1/completions", json={**body, "stream": True}) as r:
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")
                # Both requests in the engine before the kill: a plain request still on its way would meet a dead
                # engine (503) instead of failing as a live request (500).
                wait_until(lambda: served.metrics()[("dspark:server_live_requests", ())] == 2)
                os.kill(process.pid, signal.SIGKILL)
                rest = [line for line in lines if line.startswith("data: ")]
            plain = plain.result()
        after = httpx.post(f"{served.url}/v1/completions", json=body)
        health = httpx.get(f"{served.url}/health")
    error = [line for line in rest if '"error"' in line]
    assert len(error) == 1 and "exited with code -9 (killed by SIGKILL)" in error[0] and rest[-1] == "data: [DONE]"
    assert plain.status_code == 500 and "exited with code -9" in plain.json()["error"]["message"]
    assert after.status_code == 503 and "exited with code -9" in after.json()["error"]["message"]
    assert health.status_code == 503


def test_an_engine_that_fails_in_its_process_fails_its_requests(cfg):
    process = EngineProcess(TinyEngine(cfg, fail_at_step=3))
    with serving(process) as served:
        body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 30, "ignore_eos": True}
        failed = httpx.post(served.url + "/v1/chat/completions", json=body)
        after = httpx.post(served.url + "/v1/chat/completions", json=body)
    assert failed.status_code == 500 and "fell off the bus" in failed.json()["error"]["message"]
    assert after.status_code == 503 and "fell off the bus" in after.json()["error"]["message"]
    assert process._process.exitcode == 1 and process_is_gone(process.pid)


def test_a_factory_that_fails_raises_in_the_server_before_it_serves(monkeypatch):
    monkeypatch.delenv(TINY_MODELS_ENV, raising=False)
    with pytest.raises(ConfigError, match="the shipped drafter"):
        EngineProcess(serve.ServedEngine(compose_serve(["drafter.path=builtin:nonexistent"]), tiny=False))


# ---- runners.serve ------------------------------------------------------------------------------

def test_runners_serve_runs_the_engine_in_its_own_process_which_ends_with_the_server(tmp_path):
    """``python -m runners.serve`` (engine_process=true by default) logs the child's pid; SIGKILL of the server's
    process (no shutdown at all) ends the child too: its command pipe reaches end of file."""
    env = {**os.environ, TINY_MODELS_ENV: "1", "PYTHONPATH": ROOT}
    server = subprocess.Popen([sys.executable, "-m", "runners.serve", "port=0", f"hydra.run.dir={tmp_path}"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        log, url, pid = [], None, None
        deadline = time.monotonic() + 60
        while url is None:
            assert time.monotonic() < deadline and server.poll() is None, "".join(log)
            line = server.stdout.readline()
            log.append(line)
            if m := re.search(r"engine in its own process, pid (\d+)", line):
                pid = int(m.group(1))
            if m := re.search(r"serving \S+ at (http://\S+)/v1", line):
                url = m.group(1)
        wait_until(lambda: httpx.get(f"{url}/health").status_code == 200)
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "Roses", "max_tokens": 5, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
        assert pid is not None and not process_is_gone(pid)
        server.kill()
        server.wait(10)
        wait_until(lambda: process_is_gone(pid), timeout_s=15)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.stdout.close()


def test_engine_process_is_a_typed_serve_setting():
    assert to_server_config(compose_serve([])).engine_process is True
    assert to_server_config(compose_serve(["engine_process=false"])).engine_process is False
    with pytest.raises(ConfigCompositionException):
        compose_serve(["engine_process=sometimes"])
    with pytest.raises(ConfigError, match="engine_process: must be true"):
        ServerConfig(engine_process="yes")
