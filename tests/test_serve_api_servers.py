"""dspark.serving.api_servers: ``runners.serve api_servers=N``, N HTTP processes over one engine process.

On the tiny models: the engine process's loop serves several clients over their own pipes (each its own requests,
ids, credits and snapshot replies; a client that stops or goes away detaches, its requests aborted, the others
served on); ``python -m runners.serve api_servers=2`` serves the token ids a single server serves, streamed or
not, to concurrent clients spread over both API servers; one scrape of /metrics counts every API server's finished
requests; a Ctrl-C drains and ends every process; an API server that dies ends the server with an error.
"""

from __future__ import annotations

import contextlib
import glob
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

import pytest

for _module in ("httpx", "fastapi", "uvicorn", "prometheus_client"):
    pytest.importorskip(_module, reason="the HTTP server tests need the test extra: pip install -e '.[test]'")
openai = pytest.importorskip("openai", reason="the HTTP server tests need the test extra: pip install -e '.[test]'")

import httpx  # noqa: E402
from hydra.errors import ConfigCompositionException  # noqa: E402
from prometheus_client.multiprocess import MultiProcessCollector  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from dspark.config import ConfigError, SamplingParams  # noqa: E402
from dspark.serving import engine_process  # noqa: E402
from dspark.serving.config import ServerConfig  # noqa: E402
from dspark.serving.engine_loop import Admitted, Finished, NewTokens, Refused  # noqa: E402
from runners import serve  # noqa: E402
from runners.common import TINY_MODELS_ENV  # noqa: E402
from runners.schema import to_server_config  # noqa: E402
from test_serve import MODEL, compose_serve, serving, wait_until  # noqa: E402
from test_serve_process import PROMPTS, TinyEngine, process_is_gone, requests_of, thread_engine  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def cfg():
    return compose_serve(["spec=dspark"])


# ---- settings -------------------------------------------------------------------------------------

def test_api_servers_is_a_checked_serve_setting():
    assert to_server_config(compose_serve([])).api_servers == 1
    assert to_server_config(compose_serve(["api_servers=3"])).api_servers == 3
    with pytest.raises(ConfigCompositionException):
        compose_serve(["api_servers=many"])
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="api_servers: must be an integer >= 1"):
            ServerConfig(api_servers=bad)
    with pytest.raises(ConfigError, match="api_servers=2 needs engine_process=true"):
        to_server_config(compose_serve(["api_servers=2", "engine_process=false"]))
    with pytest.raises(ConfigError, match="an engine given in this process"):
        serve.run(compose_serve(["api_servers=2", "port=0"]), engine=object())


# ---- the engine process's loop, serving two clients ----------------------------------------------------

class Client:
    """One server process's side of the child's protocol, played here over real pipes."""

    def __init__(self):
        self.child_commands, self.commands = multiprocessing.Pipe(duplex=False)
        self.events, self.child_events = multiprocessing.Pipe(duplex=False)
        self.received: list = []  # every (id, event) of the messages received

    def send(self, *batch):
        self.commands.send_bytes(pickle.dumps(list(batch)))

    def receive(self, timeout_s: float = 5.0):
        assert self.events.poll(timeout_s), "no message from the child"
        message = pickle.loads(self.events.recv_bytes())
        self.received += message[1]
        return message

    def until_finished(self, rid: int) -> tuple[list, Finished]:
        """Every event of request ``rid`` (received so far, and until its Finished), returning each message's
        credit."""
        while True:
            events = [event for r, event in self.received if r == rid]
            if events and isinstance(events[-1], Finished):
                return events[:-1], events[-1]
            if self.receive()[0] == "step":
                self.send(("credit",))


@contextlib.contextmanager
def child_for(cfg, clients: list[Client], messages_in_flight: int = 1):
    """The child's loop (engine_process._serve) over a tiny engine in a thread of this process: (engine,
    the thread, its exit code once it ends). Leaving closes every client's pipes (the loop then ends)."""
    engine = TinyEngine(cfg, step_delay_s=0.005)()
    exit_code = []
    pipes = [(client.child_commands, client.child_events) for client in clients]

    def run():
        with contextlib.suppress(engine_process._ServerGone):
            exit_code.append(engine_process._serve(engine, pipes, os.getppid(), messages_in_flight))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield engine, thread, exit_code
    finally:
        for client in clients:
            client.commands.close()
        thread.join(10)


def test_the_child_serves_each_client_its_own_requests_and_snapshots_and_a_client_that_goes_away_is_aborted(cfg):
    """Two clients, each naming its request 1: each gets its own request's events (client 1 also its refusal),
    snapshots go to the client that asked; client 0, holding no credit, gets nothing more; when its pipe closes
    its request is aborted and client 1's runs to its end; client 1's stop then ends the child."""
    a, b = Client(), Client()
    with child_for(cfg, [a, b]) as (engine, thread, exit_code):
        params = SamplingParams(max_tokens=60, ignore_eos=True)
        prompt = engine.tokenizer.encode("Once upon a time")
        a.send(("add", 1, prompt, SamplingParams(max_tokens=1000, ignore_eos=True), True))
        b.send(("add", 1, prompt, params, False), ("add", 2, [5, 6, 500], params, False))
        assert a.receive()[1][0] == (1, Admitted())
        first_b = []
        while len(first_b) < 2:  # the two clients' commands may come in one loop iteration or two
            kind, outbox, _, _ = b.receive()
            first_b += outbox
            b.send(("credit",))
        assert first_b[0] == (1, Admitted()) and first_b[1][0] == 2 and isinstance(first_b[1][1], Refused)
        b.send(("snapshot", 7))
        reply = None
        while reply is None:
            kind, _, replies, _ = b.receive()
            b.send(("credit",))
            reply = replies[0][1] if replies else None
        assert reply.num_live_requests == 2  # the whole engine's: both clients' requests
        assert not a.events.poll(0.3)  # no credit, no question: nothing for client 0

        a.commands.close()  # client 0's process went away: its request is aborted, client 1's runs on
        tokens, finished = b.until_finished(1)
        assert tokens == [Admitted()] and finished.output.finish_reason == "length"
        assert len(finished.output.token_ids) == 60
        with pytest.raises(EOFError):  # the child let client 0 go
            while True:
                a.events.recv_bytes()
        b.send(("snapshot", 8))
        while not (replies := b.receive()[2]):
            pass
        assert replies[0][1].num_live_requests == 0 and not engine.scheduler.has_work()  # client 0's: aborted
        b.send(("stop",))
        while b.receive()[0] != "stopped":
            pass
        thread.join(10)
        assert exit_code == [0]


def test_a_client_that_stops_detaches_with_its_requests_aborted_and_the_child_ends_with_the_last(cfg):
    """Client 0 stops while both clients' requests decode: it gets its request's aborted output and a snapshot,
    client 1's request still runs to its end with every token; the child ends once client 1 stopped too."""
    a, b = Client(), Client()
    with child_for(cfg, [a, b], messages_in_flight=2) as (engine, thread, exit_code):
        params = SamplingParams(max_tokens=80, ignore_eos=True)
        prompt = engine.tokenizer.encode("Dear diary")
        a.send(("add", 1, prompt, params, True))
        b.send(("add", 1, prompt, params, True))
        assert a.receive()[1][0] == (1, Admitted())
        a.send(("credit",), ("stop",))
        while (message := a.receive())[0] != "stopped":  # (a message sent before the stop arrived)
            pass
        _, outbox, _, last = message
        [aborted] = [event for _, event in outbox if isinstance(event, Finished)]
        assert aborted.output.finish_reason == "abort" and last.num_live_requests == 1
        assert thread.is_alive()
        tokens, finished = b.until_finished(1)
        ids = [t for event in tokens if isinstance(event, NewTokens) for t in event.token_ids]
        assert finished.output.finish_reason == "length" and ids == finished.output.token_ids[:len(ids)]
        assert len(finished.output.token_ids) == 80
        b.send(("stop",))
        while b.receive()[0] != "stopped":
            pass
        thread.join(10)
        assert exit_code == [0] and not engine.scheduler.has_work()


# ---- python -m runners.serve api_servers=2 -------------------------------------------------------------

class Launched:
    """``python -m runners.serve api_servers=2`` on the tiny models, its log read until it serves."""

    def __init__(self, tmp_path, *overrides: str):
        env = {**os.environ, TINY_MODELS_ENV: "1", "PYTHONPATH": ROOT, "TMPDIR": str(tmp_path)}
        self.tmp_path = tmp_path
        self.process = subprocess.Popen(
            [sys.executable, "-m", "runners.serve", "port=0", "api_servers=2", f"served_model_name={MODEL}",
             f"hydra.run.dir={tmp_path}", *overrides], cwd=ROOT, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.log: list[str] = []
        self.url = self.engine_pid = None
        self.api_server_pids: list[int] = []
        deadline = time.monotonic() + 90
        while self.url is None:
            assert time.monotonic() < deadline and self.process.poll() is None, "".join(self.log)
            line = self.process.stdout.readline()
            self.log.append(line)
            if m := re.search(r"engine in its own process, pid (\d+)", line):
                self.engine_pid = int(m.group(1))
            if m := re.search(r"serving \S+ at (http://\S+)/v1 \(2 API servers, pids (\d+), (\d+)\)", line):
                self.url, self.api_server_pids = m.group(1), [int(m.group(2)), int(m.group(3))]
        self.reader = threading.Thread(target=lambda: self.log.extend(self.process.stdout), daemon=True)
        self.reader.start()
        wait_until(lambda: httpx.get(f"{self.url}/health").status_code == 200, timeout_s=60)

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, **kw)

    def metrics(self) -> dict:
        text = httpx.get(f"{self.url}/metrics").text
        return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def metrics_dirs(self) -> list[str]:
        return glob.glob(str(self.tmp_path / "dspark-metrics-*"))

    def finished_per_api_server(self) -> dict[int, float]:
        """Finished requests each API server counted (the multiprocess files it wrote, read one by one)."""
        [directory] = self.metrics_dirs()
        out = {}
        for pid in self.api_server_pids:
            files = glob.glob(os.path.join(directory, f"counter_{pid}.db"))
            out[pid] = sum(s.value for metric in MultiProcessCollector.merge(files) for s in metric.samples
                           if s.name == "vllm:request_success_total")
        return out

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.reader.join(5)
        self.process.stdout.close()


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    server = Launched(tmp_path_factory.mktemp("api_servers"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def single_server_outputs(cfg):
    """requests_of the same engine served by one server process (the engine in a thread of it)."""
    with serving(thread_engine(cfg)) as single:
        return requests_of(single)


def test_two_api_servers_serve_a_single_servers_token_ids_to_concurrent_clients(launched, single_server_outputs):
    assert launched.engine_pid not in launched.api_server_pids
    # the server is announced once both API servers accept connections, not when their processes start
    announced = next(i for i, line in enumerate(launched.log) if re.search(r"serving \S+ at http", line))
    assert {f"API server {i} serving" for i in (0, 1)} <= {m.group(0) for line in launched.log[:announced]
                                                           if (m := re.search(r"API server \d serving", line))}
    got = requests_of(launched)  # completions and chat, plain and streamed, 16 at once
    assert got == single_server_outputs  # token ids, texts and usage: exact (fp32, greedy)
    assert all(len(ids) == 24 for ids, _, _ in got)


def test_one_scrape_counts_every_api_servers_requests(launched):
    """Requests spread over both API servers (a round of 4 at a time until each has finished some): one scrape
    of /metrics reports the sum of both processes' counts, and the engine's speculative-decoding counters agree
    with the responses' acceptance."""
    before = launched.metrics()
    client = launched.client()
    responses = []

    def complete(i):
        return client.completions.create(model=MODEL, prompt=PROMPTS[i % len(PROMPTS)], max_tokens=8 + i,
                                         temperature=0, extra_body={"ignore_eos": True})

    with ThreadPoolExecutor(4) as pool:
        for _ in range(15):
            responses += list(pool.map(complete, range(4)))
            per_server = launched.finished_per_api_server()
            if all(per_server.values()):
                break
    assert all(per_server.values()), per_server  # both API servers finished requests
    after = launched.metrics()

    def delta(name: str, labels: tuple = ()) -> float:
        return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    finished = sum(v for (name, _), v in after.items() if name == "vllm:request_success_total")
    assert finished == sum(per_server.values())  # the scrape reached one of them, and counted both
    assert delta("vllm:request_success_total", (("finished_reason", "length"),)) == len(responses)
    assert delta("vllm:generation_tokens_total") == sum(r.usage.completion_tokens for r in responses)
    assert delta("vllm:prompt_tokens_total") == sum(r.usage.prompt_tokens for r in responses)
    assert delta("vllm:e2e_request_latency_seconds_count") == len(responses)
    acceptance = [r.model_extra["acceptance"] for r in responses]
    assert delta("vllm:spec_decode_num_drafts_total") == sum(a["num_drafts"] for a in acceptance) > 0
    assert delta("vllm:spec_decode_num_draft_tokens_total") == sum(a["num_draft_tokens"] for a in acceptance)
    assert delta("vllm:spec_decode_num_accepted_tokens_total") == sum(a["num_accepted_tokens"] for a in acceptance)
    assert after[("dspark:server_live_requests", ())] == 0


def test_ctrl_c_drains_every_api_server_then_ends_every_process(launched):
    """SIGINT to the whole process group (a Ctrl-C) while a stream decodes: the stream still ends normally, the
    server exits 0 as a single server does, and the API servers, the engine process and the metrics files are
    gone."""
    client = launched.client(timeout=30)
    with ThreadPoolExecutor(1) as pool:
        streamed = pool.submit(lambda: list(client.completions.create(
            model=MODEL, prompt="Dear diary", max_tokens=120, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})))
        wait_until(lambda: launched.metrics()[("vllm:num_requests_running", ())] == 1)
        os.killpg(launched.process.pid, signal.SIGINT)
        chunks = streamed.result(timeout=30)
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 120
    assert launched.process.wait(30) == 0
    for pid in [launched.engine_pid, *launched.api_server_pids]:
        wait_until(lambda: process_is_gone(pid), timeout_s=10)
    assert launched.metrics_dirs() == []
    log = "".join(launched.log)
    assert "stopped (SIGINT)" in log and "Traceback" not in log


def test_an_api_server_that_dies_ends_the_server_with_an_error(tmp_path):
    server = Launched(tmp_path)
    try:
        os.kill(server.api_server_pids[0], signal.SIGKILL)
        assert server.process.wait(60) != 0
        for pid in [server.engine_pid, *server.api_server_pids]:
            wait_until(lambda: process_is_gone(pid), timeout_s=10)
        server.reader.join(5)
        log = "".join(server.log)
        assert "exited with code -9 (killed by SIGKILL) while serving" in log
        assert server.metrics_dirs() == []
    finally:
        server.close()


@pytest.mark.smollm2
def test_ctrl_c_while_the_api_servers_start_ends_every_process(tmp_path, tmp_path_factory):
    """SIGINT to the whole process group (a Ctrl-C) just after the engine is ready, while the API servers are being
    spawned, on the real model: SmolLM2's tokenizer is in the engine's ready message, over a megabyte, which an API
    server used to take as a spawn argument; a child the Ctrl-C killed while it read that left the supervisor blocked
    writing it, for good. The server now ends, and every process with it."""
    from dspark.models.loading import prepare_smollm2
    from test_gguf_convert import SMOLLM2_CACHE

    cache = tmp_path_factory.getbasetemp() / SMOLLM2_CACHE
    prepare_smollm2(cache)  # converts unless another test module already did
    env = {**os.environ, "DSPARK_CACHE": str(cache), "PYTHONPATH": ROOT, "TMPDIR": str(tmp_path)}
    env.pop(TINY_MODELS_ENV, None)
    process = subprocess.Popen([sys.executable, "-m", "runners.serve", "port=0", "api_servers=2",
                                f"hydra.run.dir={tmp_path}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log: list[str] = []
    try:
        engine_pid = None
        while engine_pid is None:
            line = process.stdout.readline()
            assert line, "".join(log)
            log.append(line)
            if m := re.search(r"engine in its own process, pid (\d+), serving 2 API servers", line):
                engine_pid = int(m.group(1))
        time.sleep(0.05)  # the first API server is being spawned
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(60) == 0, "".join(log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        log.extend(process.stdout)
        process.stdout.close()
    wait_until(lambda: process_is_gone(engine_pid), timeout_s=10)
    assert "stopped (SIGINT)" in "".join(log)
    assert glob.glob(str(tmp_path / "dspark-engine-ready-*")) == glob.glob(str(tmp_path / "dspark-metrics-*")) == []
