"""The engine loop: every client's requests batched continuously on one engine.

The engine is not thread-safe, so exactly one thread touches it. The HTTP handlers (on the asyncio
event loop) send that thread commands: add a request, abort one, take a snapshot of the counters,
stop. Between two engine steps it applies every queued command, then runs one step and sends each
request's events back to the event loop in one batch: ``Admitted`` or ``Refused`` first, then
(streamed requests) ``NewTokens`` after each step that committed some, and ``Finished`` with the
engine's RequestOutput, or ``Failed`` when the engine itself failed. With no work it sleeps on its
commands.

Two engine loops serve the app through one interface (:class:`BaseEngineLoop`): :class:`EngineLoop`
runs the engine in a thread of the server's process (the engine is built in this process);
``engine_process.EngineProcess`` runs the same loop in a process of its own, which never shares a GIL
with the HTTP side.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import logging
import queue
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from dspark.config import ConfigError, SamplingParams
from dspark.request import RequestOutput

log = logging.getLogger(__name__)

# How often a handler waiting on the engine loop checks that the loop still runs.
LIVENESS_CHECK_S = 1.0


# ---- events, engine loop -> handler --------------------------------------------------------------

@dataclass(frozen=True)
class Admitted:
    pass


@dataclass(frozen=True)
class Refused:
    message: str  # why the engine refused the request (RequestError): a 400


@dataclass(frozen=True)
class NewTokens:
    token_ids: list[int]


@dataclass(frozen=True)
class Finished:
    output: RequestOutput


@dataclass(frozen=True)
class Failed:
    message: str  # the engine failed or stopped, or the server ended the request: a 5xx
    status: int = 500  # the HTTP status a request that is not streamed answers with


Event = Admitted | Refused | NewTokens | Finished | Failed
# A request's last event: the first of these ends it. What the engine sends after one (its Finished for the abort
# of a request the server already ended with Failed) is never read.
LAST_EVENTS = (Refused, Finished, Failed)


@dataclass(eq=False)
class RequestHandle:
    """One request between a handler and the engine loop. ``events`` belongs to the event loop; ``req_id``
    is the engine's id of the request (set by the engine thread, ``EngineLoop``) or the id the server's
    process gave it (``EngineProcess``)."""

    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    req_id: int | None = None


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's counters and occupancy, read between two steps."""

    counters: Mapping[str, Any]  # Engine.counters()
    accepted_per_position: tuple[int, ...]  # drafts accepted at each block position (0-based)
    block_size: int  # drafted tokens per step (0: target only)
    num_running: int
    num_waiting: int
    kv_pages_total: int
    kv_pages_free: int
    num_live_requests: int  # requests the server has in the engine


# ---- commands, handler -> engine thread (EngineLoop) -----------------------------------------------

@dataclass(frozen=True)
class _Add:
    handle: RequestHandle


@dataclass(frozen=True)
class _Abort:
    handle: RequestHandle


@dataclass(frozen=True)
class _Snapshot:
    reply: concurrent.futures.Future


@dataclass(frozen=True)
class _Stop:
    pass


class EngineUnavailable(RuntimeError):
    """The engine takes no new requests: the server is shutting down, or the engine failed."""


class BaseEngineLoop(abc.ABC):
    """What the app needs of an engine loop, thread or process. Called on the event loop unless said
    otherwise: ``start`` (at the app's startup), ``submit``, ``abort``, ``next_event``, ``next_events``, ``snapshot``,
    ``begin_drain`` (also from a signal handler), ``stop`` (blocking: from a worker thread). ``tokenizer``,
    ``cfg`` (the engine's EngineConfig), ``block_size`` and ``models`` (its ``Engine.models()``: the
    checkpoints it runs) describe the engine; ``on_finish(output)`` is
    called in the server's process for every request that finishes (aborted ones included)."""

    def __init__(self, on_finish: Callable[[RequestOutput], None] | None = None):
        self.on_finish = on_finish
        self.accepting = False  # read and set on the event loop thread
        self.failure: str | None = None  # why the engine loop stopped on an error
        self.last_snapshot: EngineSnapshot | None = None
        # The requests submitted and not yet ended (event loop only; a handle whose handler is gone drops out).
        self._in_flight: weakref.WeakSet[RequestHandle] = weakref.WeakSet()

    tokenizer: Any
    cfg: Any
    block_size: int
    models: dict
    where: str  # where the engine runs, for the log ("in a thread of this process", "in its own process, pid N")

    @property
    @abc.abstractmethod
    def running(self) -> bool:
        """The loop (thread or process) is alive."""

    @property
    def serving(self) -> bool:
        """Taking new requests (not draining, not stopped, not failed)."""
        return self.accepting and self.running and self.failure is None

    @abc.abstractmethod
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the loop; events go to ``loop``."""

    @abc.abstractmethod
    def submit(self, prompt_ids: list[int], params: SamplingParams, stream: bool) -> RequestHandle:
        """Queue a request (call on the event loop); its first event says whether the engine took it."""

    @abc.abstractmethod
    def abort(self, handle: RequestHandle) -> None:
        """Stop a request (its client went away); a finished one is left alone."""

    @abc.abstractmethod
    async def snapshot(self) -> EngineSnapshot | None:
        """The counters now (between two steps); after the loop stopped, the last ones it took."""

    @abc.abstractmethod
    def stop(self, timeout_s: float | None = None) -> None:
        """Abort what is still in the engine, take a last snapshot and end the loop (blocks until it ends)."""

    def _refuse_if_not_serving(self) -> None:
        if not self.serving:
            raise EngineUnavailable(self.failure or "the server is shutting down and takes no new requests")

    async def next_event(self, handle: RequestHandle) -> Event:
        """The request's next event; ``Failed`` when the engine loop ended without sending one."""
        while True:
            try:
                event = await asyncio.wait_for(handle.events.get(), LIVENESS_CHECK_S)
            except asyncio.TimeoutError:
                if not self.running and handle.events.empty():
                    event = Failed(self.failure or "the server stopped before the request finished")
                else:
                    continue
            if isinstance(event, LAST_EVENTS):
                self._in_flight.discard(handle)
            return event

    async def next_events(self, handle: RequestHandle) -> list[Event]:
        """The request's next event and the events already waiting behind it (a handler that lags behind the
        engine takes several steps' tokens at once), up to the request's last event (``LAST_EVENTS``): what is
        queued after that one is left unread."""
        events = [await self.next_event(handle)]
        while not isinstance(events[-1], LAST_EVENTS) and not handle.events.empty():
            events.append(handle.events.get_nowait())
        if isinstance(events[-1], LAST_EVENTS):
            self._in_flight.discard(handle)
        return events

    def _track(self, handle: RequestHandle) -> RequestHandle:
        """Count a submitted request in flight until its last event (call on the event loop, from ``submit``)."""
        self._in_flight.add(handle)
        return handle

    def end_in_flight(self, message: str) -> int:
        """End every request still in flight (call on the event loop): each handler gets ``Failed(message)``, a
        503, at once, and the engine aborts the request. A shutdown whose grace period runs out uses it, so that
        clients get an answer instead of a cancelled handler. Returns how many requests it ended."""
        handles = list(self._in_flight)
        for handle in handles:
            handle.events.put_nowait(Failed(message, status=503))
            self.abort(handle)
        self._in_flight.clear()
        return len(handles)

    async def _snapshot_reply(self, answer: asyncio.Future, forget: Callable[[], Any]) -> EngineSnapshot | None:
        """``answer`` (a snapshot asked of the loop) once it comes; the last snapshot taken when the loop ends
        without answering (``forget()`` then drops the question)."""
        while True:
            done, _ = await asyncio.wait({answer}, timeout=LIVENESS_CHECK_S)
            if done:
                return answer.result()
            if not self.running:
                forget()
                return self.last_snapshot

    def begin_drain(self) -> None:
        """Refuse new requests from now on; the ones in the engine keep running."""
        self.accepting = False

    def _finish_callback(self, output: RequestOutput) -> None:
        if self.on_finish is not None:
            try:
                self.on_finish(output)
            except Exception:  # metrics must never take the engine down
                log.exception("on_finish failed for request %s", output.req_id)


class EngineLoop(BaseEngineLoop):
    """Runs ``engine`` in a thread of its own from ``start`` to ``stop``. ``on_finish(output)`` is called
    in that thread for every request that finishes (aborted ones included)."""

    where = "in a thread of this process"

    def __init__(self, engine, on_finish: Callable[[RequestOutput], None] | None = None):
        super().__init__(on_finish)
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.cfg = engine.cfg
        self.block_size = engine.block_size
        self.models = engine.models()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ---- event loop side ---------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._thread is not None:
            raise RuntimeError("EngineLoop.start: already started; build a new loop for a new server")
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.accepting = True
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, prompt_ids: list[int], params: SamplingParams, stream: bool) -> RequestHandle:
        self._refuse_if_not_serving()
        handle = self._track(RequestHandle(prompt_ids, params, stream))
        self._commands.put(_Add(handle))
        return handle

    def abort(self, handle: RequestHandle) -> None:
        if self.running:
            self._commands.put(_Abort(handle))

    async def snapshot(self) -> EngineSnapshot | None:
        if not self.running:
            return self.last_snapshot
        reply: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(_Snapshot(reply))
        answer = asyncio.wrap_future(reply)
        return await self._snapshot_reply(answer, answer.cancel)  # (ended before reading the command: cancelled)

    def stop(self, timeout_s: float | None = None) -> None:
        self.accepting = False
        if self._thread is None:
            return
        self._commands.put(_Stop())
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("the engine thread did not stop within %.1f s (a step still running)", timeout_s or 0.0)

    # ---- engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        driver = EngineDriver(self.engine, self._finish_callback)
        try:
            while True:
                outbox: list[tuple[RequestHandle, Event]] = []
                commands = self._take_commands(wait=not driver.has_work())
                stop = any(isinstance(c, _Stop) for c in commands)
                for command in commands:
                    if isinstance(command, _Add):
                        h = command.handle
                        h.req_id = driver.add(h, h.prompt_ids, h.params, h.stream, outbox)
                    elif isinstance(command, _Abort):
                        driver.abort(command.handle, outbox)
                    elif isinstance(command, _Snapshot):
                        command.reply.set_result(driver.snapshot())
                if stop:
                    self.last_snapshot = driver.stop(outbox)
                    self._send(outbox)
                    self._refuse_leftover_commands("the server stopped")
                    return
                driver.step(outbox)
                self._send(outbox)
        except Exception as e:  # the engine's state is unknown now: fail every request, touch nothing more
            log.exception("the engine thread failed; every request in it fails")
            self.failure = engine_failure(e)
            self._send(driver.fail_all(self.failure))
            self._refuse_leftover_commands(self.failure)

    def _take_commands(self, wait: bool) -> list:
        commands = [self._commands.get()] if wait else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _refuse_leftover_commands(self, why: str) -> None:
        """Commands that raced the stop: no handler waits forever."""
        outbox = []
        for command in self._take_commands(wait=False):
            if isinstance(command, _Add):
                outbox.append((command.handle, Failed(why)))
            elif isinstance(command, _Snapshot):
                command.reply.set_result(self.last_snapshot)
        self._send(outbox)

    def _send(self, outbox: list[tuple[RequestHandle, Event]]) -> None:
        if not outbox:
            return
        try:
            self._loop.call_soon_threadsafe(_deliver, outbox)
        except RuntimeError:  # the event loop is closed: nobody is waiting any more
            pass


def engine_failure(e: BaseException) -> str:
    """The message every request in a failed engine gets."""
    return f"the engine failed: {type(e).__name__}: {e}"


@dataclass(eq=False)
class _Live:
    key: Any  # how the engine loop names the request: its RequestHandle, or the id the parent process gave it
    stream: bool
    tokens_sent: int = 0


class EngineDriver:
    """The engine's side of an engine loop, on the thread that owns the engine: adds and aborts requests,
    steps, and appends each request's events to an outbox as ``(key, event)``, ``key`` being whatever names
    the request to the loop (a RequestHandle in a thread, an integer id across processes). ``on_finish`` is
    called for each request that finishes here (aborted ones included)."""

    def __init__(self, engine, on_finish: Callable[[RequestOutput], None] | None = None):
        self.engine = engine
        self.on_finish = on_finish
        self.live: dict[int, _Live] = {}  # engine req_id -> the request
        self.req_ids: dict[Any, int] = {}  # key -> engine req_id, while the request is in the engine

    def has_work(self) -> bool:
        return self.engine.has_unfinished()

    def add(self, key, prompt_ids: list[int], params: SamplingParams, stream: bool, outbox: list) -> int | None:
        """The engine's id of the request, or None when the engine refused it (a ``Refused`` event says why)."""
        try:
            req_id = self.engine.add_request(prompt_ids, params)
        except (ValueError, ConfigError) as e:  # RequestError is a ValueError
            outbox.append((key, Refused(str(e))))
            return None
        self.live[req_id] = _Live(key, stream)
        self.req_ids[key] = req_id
        outbox.append((key, Admitted()))
        return req_id

    def abort(self, key, outbox: list) -> None:
        req_id = self.req_ids.pop(key, None)
        if req_id is None or self.live.pop(req_id, None) is None:
            return  # refused, or already finished
        output = self.engine.abort(req_id)
        if output is not None:
            self._finished(key, output, outbox)

    def step(self, outbox: list) -> None:
        """One engine step (when there is work) and its events: each finished request's output, and the new
        tokens of streamed ones."""
        if not self.engine.has_unfinished():
            return
        for output in self.engine.step():
            request = self.live.pop(output.req_id, None)
            if request is not None:
                self.req_ids.pop(request.key, None)
                self._finished(request.key, output, outbox)
        for req_id, request in self.live.items():
            if not request.stream:
                continue
            ids = self.engine.output_ids(req_id)
            if ids is not None and len(ids) > request.tokens_sent:
                outbox.append((request.key, NewTokens(ids[request.tokens_sent:])))
                request.tokens_sent = len(ids)

    def snapshot(self) -> EngineSnapshot:
        return take_snapshot(self.engine, len(self.live))

    def stop(self, outbox: list) -> EngineSnapshot:
        """Abort every request still in the engine; the last snapshot."""
        for req_id, request in list(self.live.items()):
            output = self.engine.abort(req_id)
            if output is not None:
                self._finished(request.key, output, outbox)
        self.live.clear()
        self.req_ids.clear()
        self.engine.has_unfinished()  # a device step in flight is drained (its tokens dropped)
        return self.snapshot()

    def fail_all(self, message: str) -> list:
        """``Failed`` for every request in the engine (which is not touched again)."""
        outbox = [(request.key, Failed(message)) for request in self.live.values()]
        self.live.clear()
        self.req_ids.clear()
        return outbox

    def _finished(self, key, output: RequestOutput, outbox: list) -> None:
        if self.on_finish is not None:
            self.on_finish(output)
        outbox.append((key, Finished(output)))


def take_snapshot(engine, num_live_requests: int) -> EngineSnapshot:
    """``engine``'s counters and occupancy now (call between two steps, on the engine's thread)."""
    blocks, sched = engine.blocks, engine.scheduler
    return EngineSnapshot(counters=engine.counters(), accepted_per_position=tuple(engine.stats.accepted_at),
                          block_size=engine.block_size, num_running=len(sched.running),
                          num_waiting=len(sched.waiting), kv_pages_total=blocks.num_pages,
                          kv_pages_free=blocks.num_free, num_live_requests=num_live_requests)


def _deliver(outbox: list[tuple[RequestHandle, Event]]) -> None:
    for handle, event in outbox:
        handle.events.put_nowait(event)
