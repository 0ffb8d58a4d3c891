"""The load generator of an HTTP arm: streamed OpenAI-compatible requests, closed loop or Poisson arrivals.

``closed``: at most ``concurrency`` requests in flight; every request is due at the block's start and the next
one is sent as one finishes, in order (``vllm bench serve --max-concurrency``). ``poisson``: request i is sent at
the block's start plus the sum of i+1 exponential gaps at ``rate`` per second, drawn from ``random.Random(seed)``
exactly as ``runners.ab.drive`` draws them for an in-process arm, with no cap on requests in flight.

Every request is streamed (server-sent events, ``stream_options.include_usage``). Per request the generator
records, on one ``time.perf_counter`` clock: when it was due (``scheduled_s``), when it was sent (``sent_s``),
the arrival of every chunk that carried output text or token ids (``chunk_times_s``; the first is the first
token) and, when the server returns token ids, how many each chunk carried (``chunk_tokens``), and the end of
the stream (``finish_s``); the output text, the token ids when the server returns them
(``return_token_ids``: a chunk's ``choices[0].token_ids``), the usage, the finish reason, the per-request
acceptance of a server that reports it (this project's ``acceptance``) and llama.cpp's ``timings``. A request
that fails (an HTTP error status, an error event in the stream, a stream that ends before its finish reason, a
timeout, a broken connection) is a result with ``error`` set; it never stops the block.

The client is aiohttp: one session per block, its connections kept alive and reused (each stream is read to its
end, past ``[DONE]``, so that its connection goes back to the pool). A load generator must not be the bottleneck
it measures: at concurrency 256 against a server streaming tens of thousands of tokens per second, an httpx
client spent about three times aiohttp's CPU per chunk and opened a new connection for every request
(``bench/http_stack_ceiling.py`` measures both).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import aiohttp
import numpy as np

from dspark.bench.http.endpoint import HttpEndpoint

LOAD_MODES = ("closed", "poisson")


@dataclass(frozen=True)
class HttpRequest:
    """One request of a workload as the API takes it: chat ``messages`` or a text ``prompt``, and its sampling."""

    request_id: str
    messages: list[dict] | None
    prompt: str | None
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    seed: int | None = None

    @classmethod
    def of(cls, request_id: str, messages: list[dict] | None, prompt: str | None, params: Any) -> "HttpRequest":
        """From a workload prompt's messages or text and its ``dspark.config.SamplingParams``."""
        return cls(request_id, messages, prompt, int(params.max_tokens), float(params.temperature),
                   float(params.top_p), int(params.top_k), bool(params.ignore_eos), tuple(params.stop), params.seed)


@dataclass
class HttpResult:
    """What one streamed request returned, with its times (seconds on ``time.perf_counter``'s clock)."""

    request_id: str
    scheduled_s: float
    sent_s: float
    first_token_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)  # token ids per chunk (empty without token ids)
    finish_s: float | None = None
    text: str = ""
    token_ids: list[int] | None = None  # None: the server returned none
    prompt_token_ids: list[int] | None = None
    prompt_tokens: int | None = None  # usage
    completion_tokens: int | None = None
    finish_reason: str | None = None
    acceptance: dict | None = None
    timings: dict | None = None
    error: str | None = None


@dataclass
class LoadResult:
    results: list[HttpResult]  # in request order
    wall_s: float  # the block's start to its last response's end (runners.ab.drive's wall time)
    scheduled_s: list[float]


def arrival_offsets(n: int, mode: str, rate: float, seed: int) -> np.ndarray:
    """Each request's due time after the block's start (closed loop: all 0)."""
    if mode not in LOAD_MODES:
        raise ValueError(f"load mode {mode!r} not in {list(LOAD_MODES)}")
    if mode == "closed":
        return np.zeros(n)
    if not rate > 0:
        raise ValueError(f"Poisson arrivals need a rate > 0 requests/s, got {rate!r}")
    rng = random.Random(seed)
    return np.cumsum([rng.expovariate(rate) for _ in range(n)])


def request_body(endpoint: HttpEndpoint, model: str, req: HttpRequest) -> dict[str, Any]:
    """The JSON body of ``req`` for ``endpoint``'s API (streamed, usage in the last chunk)."""
    body: dict[str, Any] = {"model": model, "max_tokens": req.max_tokens, "temperature": req.temperature,
                            "top_p": req.top_p, "stream": True, "stream_options": {"include_usage": True}}
    if endpoint.api == "chat":
        if req.messages is None:
            raise ValueError(f"request {req.request_id!r}: a text prompt for a chat endpoint (api=chat); use "
                             "api=completions for text prompts")
        body["messages"] = req.messages
    else:
        if req.prompt is None:
            raise ValueError(f"request {req.request_id!r}: chat messages for a completions endpoint "
                             "(api=completions); use api=chat for chat prompts")
        body["prompt"] = req.prompt
    if req.top_k:
        body["top_k"] = req.top_k
    if req.ignore_eos:
        body["ignore_eos"] = True
    if req.stop:
        body["stop"] = list(req.stop)
    if req.seed is not None:
        body["seed"] = req.seed
    if endpoint.return_token_ids:
        body["return_token_ids"] = True
    body.update(endpoint.extra_body)
    return body


def _error_message(status: int, raw: bytes) -> str:
    try:
        err = json.loads(raw).get("error")
        message = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        message = None
    return f"HTTP {status}: {message or raw[:300].decode(errors='replace')}"


async def send(session: aiohttp.ClientSession, endpoint: HttpEndpoint, model: str, req: HttpRequest,
               scheduled_s: float) -> HttpResult:
    """Send ``req`` now, streamed, and read its whole response."""
    body = request_body(endpoint, model, req)
    result = HttpResult(req.request_id, scheduled_s, time.perf_counter())
    try:  # (the request's time limit is aiohttp's, in _stream: asyncio.wait_for may swallow a Ctrl-C's cancel)
        await _stream(session, endpoint, body, result)
    except asyncio.TimeoutError:
        result.error = f"no complete response within {endpoint.request_timeout_s:g} s (request_timeout_s)"
    except aiohttp.ClientError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    if result.error is None and result.finish_reason is None:
        result.error = "the stream ended before the response finished (no finish_reason)"
    if result.finish_s is None:
        result.finish_s = time.perf_counter()
    if result.error is None and result.first_token_s is None:  # no chunk carried text or ids: the end is the first
        result.first_token_s = result.finish_s
        result.chunk_times_s = [result.finish_s]
        result.chunk_tokens = [int(result.completion_tokens)] if result.completion_tokens is not None else []
    return result


async def _stream(session: aiohttp.ClientSession, endpoint: HttpEndpoint, body: dict, result: HttpResult) -> None:
    chat = endpoint.api == "chat"
    limit = aiohttp.ClientTimeout(total=endpoint.request_timeout_s)  # the whole request, its stream read included
    async with session.post(endpoint.request_url, json=body, timeout=limit) as response:
        if response.status != 200:
            result.error = _error_message(response.status, await response.read())
            return
        text: list[str] = []
        ids: list[int] = []
        ids_seen = done = False
        async for raw in response.content:  # one line per iteration
            if done or not raw.startswith(b"data:"):
                continue  # (after [DONE]: read on to the end, so that the connection is reused)
            now = time.perf_counter()
            data = raw[len(b"data:"):].strip()
            if data == b"[DONE]":
                result.finish_s = now
                done = True
                continue
            try:
                event = json.loads(data)
            except ValueError:
                result.error = f"the stream sent a line that is not JSON: {data[:200]!r}"
                return
            if event.get("error") is not None:
                err = event["error"]
                result.error = f"error in the stream: {err.get('message') if isinstance(err, dict) else err}"
                return
            if event.get("usage"):
                usage = event["usage"]
                result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
                result.completion_tokens = usage.get("completion_tokens", result.completion_tokens)
            for key in ("acceptance", "timings"):
                if event.get(key) is not None:
                    setattr(result, key, event[key])
            if event.get("prompt_token_ids") is not None:
                result.prompt_token_ids = list(event["prompt_token_ids"])
            for choice in event.get("choices") or []:
                piece = ((choice.get("delta") or {}).get("content") if chat else choice.get("text")) or ""
                new_ids = choice.get("token_ids")
                if new_ids is not None:
                    ids_seen = True
                    ids.extend(int(t) for t in new_ids)
                if choice.get("prompt_token_ids") is not None:
                    result.prompt_token_ids = list(choice["prompt_token_ids"])
                if piece or new_ids:
                    text.append(piece)
                    result.chunk_times_s.append(now)
                    result.chunk_tokens.append(len(new_ids or ()))
                    if result.first_token_s is None:
                        result.first_token_s = now
                if choice.get("finish_reason") is not None:
                    result.finish_reason = choice["finish_reason"]
            result.finish_s = now
        result.text = "".join(text)
        result.token_ids = ids if ids_seen else None
        if not ids_seen:  # text without ids: how many tokens each chunk carried is unknown
            result.chunk_tokens = []
        if result.prompt_tokens is None and result.prompt_token_ids is not None:
            result.prompt_tokens = len(result.prompt_token_ids)


async def run_load_async(endpoint: HttpEndpoint, model: str, requests: Sequence[HttpRequest], *, mode: str,
                         concurrency: int, rate: float, seed: int,
                         on_finished: Callable[[int], Any] | None = None) -> LoadResult:
    """Send ``requests`` as ``mode`` says (module docstring); the results in request order."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    offsets = arrival_offsets(len(requests), mode, rate, seed)
    gate = asyncio.Semaphore(int(concurrency) if mode == "closed" else max(1, len(requests)))
    connector = aiohttp.TCPConnector(limit=0)  # no cap of the client's own: the gate (or the arrivals) decide
    # The time limit is per request (_stream's); a session-wide one would also cut a block's total.
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        t0 = time.perf_counter()
        scheduled = [t0 + float(o) for o in offsets]

        async def one(i: int) -> HttpResult:
            delay = scheduled[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with gate:
                result = await send(session, endpoint, model, requests[i], scheduled[i])
            if on_finished is not None:
                on_finished(1)
            return result

        results = await asyncio.gather(*(one(i) for i in range(len(requests))))
        wall = time.perf_counter() - t0
    return LoadResult(list(results), wall, scheduled)


def run_load(endpoint: HttpEndpoint, model: str, requests: Sequence[HttpRequest], *, mode: str, concurrency: int,
             rate: float, seed: int, on_finished: Callable[[int], Any] | None = None) -> LoadResult:
    """:func:`run_load_async` from synchronous code (its own event loop)."""
    return asyncio.run(run_load_async(endpoint, model, requests, mode=mode, concurrency=concurrency, rate=rate,
                                      seed=seed, on_finished=on_finished))
