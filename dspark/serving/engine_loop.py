"""The thread that owns the engine: every client's requests batched continuously on one engine.

The engine is not thread-safe, so exactly one thread touches it. The HTTP handlers (on the asyncio
event loop) send it commands through a queue: add a request, abort one, take a snapshot of the
counters, stop. Between two engine steps the thread applies every queued command, then runs one step
and sends each request's events back to the event loop in one batch: ``Admitted`` or ``Refused``
first, then (streamed requests) ``NewTokens`` after each step that committed some, and ``Finished``
with the engine's RequestOutput, or ``Failed`` when the engine itself failed. With no work it sleeps
on the queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from dspark.config import ConfigError, SamplingParams
from dspark.request import RequestOutput

log = logging.getLogger(__name__)

# How often a handler waiting on the engine thread checks that the thread is still alive.
LIVENESS_CHECK_S = 1.0


# ---- events, engine thread -> handler ------------------------------------------------------------

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
    message: str  # the engine failed or stopped: a 5xx


Event = Admitted | Refused | NewTokens | Finished | Failed


@dataclass(eq=False)
class RequestHandle:
    """One request between a handler and the engine thread. ``events`` belongs to the event loop;
    ``req_id`` and ``tokens_sent`` to the engine thread."""

    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    req_id: int | None = None
    tokens_sent: int = 0


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


# ---- commands, handler -> engine thread ----------------------------------------------------------

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


class EngineLoop:
    """Runs ``engine`` in a thread of its own from ``start`` to ``stop``. ``on_finish(output)`` is called
    in that thread for every request that finishes (aborted ones included)."""

    def __init__(self, engine, on_finish: Callable[[RequestOutput], None] | None = None):
        self.engine = engine
        self._on_finish = on_finish
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[int, RequestHandle] = {}  # engine req_id -> handle (engine thread only)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.accepting = False  # read and set on the event loop thread
        self.failure: str | None = None  # why the engine thread stopped on an error
        self.last_snapshot: EngineSnapshot | None = None

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

    @property
    def serving(self) -> bool:
        """Taking new requests (not draining, not stopped, not failed)."""
        return self.accepting and self.running and self.failure is None

    def submit(self, prompt_ids: list[int], params: SamplingParams, stream: bool) -> RequestHandle:
        """Queue a request (call on the event loop); its first event says whether the engine took it."""
        if not self.serving:
            raise EngineUnavailable(self.failure or "the server is shutting down and takes no new requests")
        handle = RequestHandle(prompt_ids, params, stream)
        self._commands.put(_Add(handle))
        return handle

    def abort(self, handle: RequestHandle) -> None:
        """Stop a request (its client went away); a finished one is left alone."""
        if self.running:
            self._commands.put(_Abort(handle))

    async def next_event(self, handle: RequestHandle) -> Event:
        """The request's next event; ``Failed`` when the engine thread ended without sending one."""
        while True:
            try:
                return await asyncio.wait_for(handle.events.get(), LIVENESS_CHECK_S)
            except asyncio.TimeoutError:
                if not self.running and handle.events.empty():
                    return Failed(self.failure or "the server stopped before the request finished")

    async def snapshot(self) -> EngineSnapshot | None:
        """The counters now (between two steps); after the thread stopped, the last ones it took."""
        if not self.running:
            return self.last_snapshot
        reply: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(_Snapshot(reply))
        answer = asyncio.wrap_future(reply)
        while True:
            done, _ = await asyncio.wait({answer}, timeout=LIVENESS_CHECK_S)
            if done:
                return answer.result()
            if not self.running:  # it ended before reading the command
                answer.cancel()
                return self.last_snapshot

    def begin_drain(self) -> None:
        """Refuse new requests from now on; the ones in the engine keep running."""
        self.accepting = False

    def stop(self, timeout_s: float | None = None) -> None:
        """Abort what is still in the engine, take a last snapshot and end the thread (blocks until it ends)."""
        self.accepting = False
        if self._thread is None:
            return
        self._commands.put(_Stop())
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("the engine thread did not stop within %.1f s (a step still running)", timeout_s or 0.0)

    # ---- engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                outbox: list[tuple[RequestHandle, Event]] = []
                commands = self._take_commands(wait=not engine.has_unfinished())
                stop = any(isinstance(c, _Stop) for c in commands)
                for command in commands:
                    self._apply(command, outbox)
                if stop:
                    self._abort_all(outbox)
                    engine.has_unfinished()  # a device step in flight is drained (its tokens dropped)
                    self.last_snapshot = self._take_snapshot()
                    self._send(outbox)
                    self._refuse_leftover_commands("the server stopped")
                    return
                if engine.has_unfinished():
                    self._collect(engine.step(), outbox)
                self._send(outbox)
        except Exception as e:  # the engine's state is unknown now: fail every request, touch nothing more
            log.exception("the engine thread failed; every request in it fails")
            self.failure = f"the engine failed: {type(e).__name__}: {e}"
            self._send([(h, Failed(self.failure)) for h in self._live.values()])
            self._live.clear()
            self._refuse_leftover_commands(self.failure)

    def _take_commands(self, wait: bool) -> list:
        commands = [self._commands.get()] if wait else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _apply(self, command, outbox: list) -> None:
        engine = self.engine
        if isinstance(command, _Add):
            handle = command.handle
            try:
                handle.req_id = engine.add_request(handle.prompt_ids, handle.params)
            except (ValueError, ConfigError) as e:  # RequestError is a ValueError
                outbox.append((handle, Refused(str(e))))
                return
            self._live[handle.req_id] = handle
            outbox.append((handle, Admitted()))
        elif isinstance(command, _Abort):
            handle = command.handle
            if handle.req_id is None or self._live.pop(handle.req_id, None) is None:
                return  # refused, or already finished
            output = engine.abort(handle.req_id)
            if output is not None:
                self._finished(handle, output, outbox)
        elif isinstance(command, _Snapshot):
            command.reply.set_result(self._take_snapshot())

    def _collect(self, finished: list[RequestOutput], outbox: list) -> None:
        """Events of one step: each finished request's output, and the new tokens of streamed ones."""
        for output in finished:
            handle = self._live.pop(output.req_id, None)
            if handle is not None:
                self._finished(handle, output, outbox)
        for req_id, handle in self._live.items():
            if not handle.stream:
                continue
            ids = self.engine.output_ids(req_id)
            if ids is not None and len(ids) > handle.tokens_sent:
                outbox.append((handle, NewTokens(ids[handle.tokens_sent:])))
                handle.tokens_sent = len(ids)

    def _finished(self, handle: RequestHandle, output: RequestOutput, outbox: list) -> None:
        if self._on_finish is not None:
            try:
                self._on_finish(output)
            except Exception:  # metrics must never take the engine down
                log.exception("on_finish failed for request %s", output.req_id)
        outbox.append((handle, Finished(output)))

    def _abort_all(self, outbox: list) -> None:
        for req_id, handle in list(self._live.items()):
            output = self.engine.abort(req_id)
            if output is not None:
                self._finished(handle, output, outbox)
        self._live.clear()

    def _take_snapshot(self) -> EngineSnapshot:
        engine = self.engine
        blocks, sched = engine.blocks, engine.scheduler
        return EngineSnapshot(counters=engine.counters(), accepted_per_position=tuple(engine.stats.accepted_at),
                              block_size=engine.block_size, num_running=len(sched.running),
                              num_waiting=len(sched.waiting), kv_pages_total=blocks.num_pages,
                              kv_pages_free=blocks.num_free, num_live_requests=len(self._live))

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


def _deliver(outbox: list[tuple[RequestHandle, Event]]) -> None:
    for handle, event in outbox:
        handle.events.put_nowait(event)
