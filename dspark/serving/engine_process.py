"""The engine in a process of its own: the engine loop of :mod:`dspark.serving.engine_loop` across a process
boundary, so that the engine never shares a GIL with the HTTP side (the split vLLM makes between AsyncLLM and
EngineCore).

    engine = EngineProcess(factory)   # starts the child, which builds the engine; returns once it is ready
    app = create_app(engine, config)  # the app's lifespan starts and stops it as it does an EngineLoop

The child is started with multiprocessing's ``spawn`` (the server's process never initialises CUDA, and a
spawned child may), builds the engine by calling ``factory`` (a picklable zero-argument callable; it also
captures the engine's CUDA graphs there), reports the engine's tokenizer, configuration and block size, and
then runs the loop ``EngineLoop`` runs in a thread (:class:`~dspark.serving.engine_loop.EngineDriver`): apply
every queued command (add, abort, snapshot, stop), run one step, and queue the step's events in its outbox,
which it sends when the server can take it (below). With no work it sleeps on its command pipe.

Two pipes join the processes. Server to engine: batches of commands, one per event-loop iteration that queued
any, written by a writer thread so that the event loop never waits on a full pipe. Engine to server: messages
with every request's events (``Admitted``/``Refused`` first, ``NewTokens``, ``Finished`` with the
RequestOutput, ``Failed``; a request is named by the integer id the server's process gave it) and the snapshots
asked for. A reader thread, blocked on the pipe with the GIL released while it waits, runs ``on_finish`` for
each ``Finished`` (the metrics live in the server's process) and hands each message's batch to the event loop in
one ``call_soon_threadsafe``.

Flow control, engine to server: credits. The child sends a message only while fewer than ``messages_in_flight``
(MESSAGES_IN_FLIGHT) of its messages are unacknowledged; the server acknowledges each once its event loop has
delivered the batch and run the handlers it woke (a ``credit`` command, travelling with the handlers' commands).
Meanwhile the child keeps stepping and merges each step's events into its outbox, per request (one request's
``NewTokens`` concatenated; its other events kept in order, ``Finished`` after its tokens): a server whose event
loop falls behind gets fewer, larger messages instead of one per step, and the loop's time goes to admitting new
requests rather than to waking every handler once per step. Two kinds of message go without a credit (and count
as in flight until acknowledged): snapshot replies, and the message of an iteration that added requests (their
``Admitted`` or ``Refused``, which each request's handler awaits before it answers, with everything held). An idle
child whose outbox waits for a credit sleeps on its command pipe, where the credit arrives. The counters
``engine_process/messages`` (messages with events), ``engine_process/merged_steps`` (steps whose events they
carried) and ``engine_process/held_steps`` (steps that ended with their events held for want of a credit) join
the engine's counters in every snapshot (and the shutdown log).

How it ends: a stop command aborts what is left in the engine and the child sends its last snapshot and exits.
A step that raises fails every request in the engine (``the engine failed: ...``) and ends the child; a child
that dies fails every live request with a message naming its exit status. Either way the server answers 503
from then on. The child ignores SIGINT and SIGTERM (a Ctrl-C, or a signal to the process group, reaches the
server, whose drain decides when the engine stops) and ends itself when the server's process goes away: its
command pipe reaches end of file, or its parent process changes.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import itertools
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import threading
from typing import Any, Callable

from dspark.config import ConfigError, SamplingParams
from dspark.request import RequestOutput
from dspark.serving.engine_loop import (Admitted, BaseEngineLoop, EngineDriver, EngineSnapshot,
                                        Finished, Failed, NewTokens, RequestHandle, engine_failure)

log = logging.getLogger(__name__)

# How often an idle engine process checks that the server's process is still its parent.
PARENT_CHECK_S = 1.0
# How long the server waits for a child that has closed its pipe (or was told to stop) to exit before killing it.
EXIT_WAIT_S = 10.0
# Messages the child may have sent that the server's event loop has not delivered yet. The child sends nothing
# more until the server acknowledges one: it keeps stepping and merges the steps' events, so it sends no faster
# than the event loop consumes. 1 would make the child wait a full round trip (pipe, reader thread, event loop,
# writer thread) between two messages; 2 lets one message travel while the event loop delivers the other.
MESSAGES_IN_FLIGHT = 2
# The child's counters (in every snapshot's counters): messages with events, the steps whose events they carried,
# the steps that ended with their events held for want of a credit.
MESSAGES, MERGED_STEPS, HELD_STEPS = "engine_process/messages", "engine_process/merged_steps", \
    "engine_process/held_steps"

# Commands, server -> engine: tuples whose first item is one of these (_CREDIT: a _STEP message was delivered).
_ADD, _ABORT, _SNAPSHOT, _STOP, _CREDIT = "add", "abort", "snapshot", "stop", "credit"
# Messages, engine -> server: (_READY, info), (_START_FAILED, (error or None, text)),
# (_STEP | _STOPPED | _FAILED, outbox, snapshot replies, last snapshot | failure message | None); the server
# returns a _CREDIT for each _STEP.
_READY, _START_FAILED, _STEP, _STOPPED, _FAILED = "ready", "start_failed", "step", "stopped", "failed"


class EngineStartError(RuntimeError):
    """The engine process ended, or failed to build its engine, before it was ready to serve."""


def describe_exit(code: int | None) -> str:
    """'exited with code -9 (killed by SIGKILL)' and the like."""
    if code is None:
        return "ended (its exit status is unknown)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"exited with code {code} (killed by {name})"
    return f"exited with code {code}"


class EngineProcess(BaseEngineLoop):
    """An engine built and run by a child process. Constructing one starts the child and returns when its engine
    is ready (model loaded, graphs captured), raising the child's ConfigError, or EngineStartError, when it could
    not build it. ``start``/``stop`` (the app's lifespan) serve as :class:`EngineLoop`'s do; ``on_finish`` is
    called in this process, on the thread that reads the child's messages. ``messages_in_flight``: how many of the
    child's messages may await delivery on the event loop (flow control, MESSAGES_IN_FLIGHT)."""

    def __init__(self, factory: Callable[[], Any], on_finish: Callable[[RequestOutput], None] | None = None,
                 log_level: int | None = None, messages_in_flight: int = MESSAGES_IN_FLIGHT):
        if isinstance(messages_in_flight, bool) or not isinstance(messages_in_flight, int) or messages_in_flight < 1:
            raise ConfigError(f"messages_in_flight: must be an integer >= 1, got {messages_in_flight!r}")
        super().__init__(on_finish)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: threading.Thread | None = None
        self._writer: threading.Thread | None = None
        self._outgoing: queue.SimpleQueue = queue.SimpleQueue()  # command batches for the writer; None ends it
        self._pending: list[tuple] = []  # commands of this event-loop iteration, not yet handed to the writer
        self._handles: dict[int, RequestHandle] = {}  # id -> live request (event loop only)
        self._snapshots: dict[int, asyncio.Future] = {}  # token -> a snapshot asked for (event loop only)
        self._ids = itertools.count(1)
        self._stopped_cleanly = False  # the child answered a stop command
        self._ended = threading.Event()  # the child's last message was read
        self._closed = False
        context = multiprocessing.get_context("spawn")
        child_commands, self._commands = context.Pipe(duplex=False)
        self._events, child_events = context.Pipe(duplex=False)
        level = log_level if log_level is not None else logging.getLogger().getEffectiveLevel()
        self._process = context.Process(target=_child_main, name="dspark-engine",
                                        args=(factory, child_commands, child_events, os.getpid(), level,
                                              messages_in_flight))
        self._process.start()
        child_commands.close()  # the child's ends: its exit is then this side's end of file
        child_events.close()
        self.pid: int = self._process.pid
        atexit.register(self._at_exit)
        try:
            ready = self._wait_until_ready()
        except BaseException:  # a child that failed exits at once; one still loading (Ctrl-C) is killed
            self._end_process(wait_s=2.0)
            raise
        self.tokenizer, self.cfg, self.block_size = ready["tokenizer"], ready["cfg"], ready["block_size"]
        self.where = f"in its own process, pid {self.pid}"
        log.info("engine in its own process, pid %d", self.pid)

    # ---- event loop side ---------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._reader is not None or self._closed:
            raise RuntimeError("EngineProcess.start: already started; start a new engine process for a new server")
        self._loop = loop
        self._writer = threading.Thread(target=self._write, name="engine-process-writer", daemon=True)
        self._reader = threading.Thread(target=self._read, name="engine-process-reader", daemon=True)
        self.accepting = True
        self._writer.start()
        self._reader.start()

    @property
    def running(self) -> bool:
        return self._reader is not None and not self._ended.is_set()

    def submit(self, prompt_ids: list[int], params: SamplingParams, stream: bool) -> RequestHandle:
        self._refuse_if_not_serving()
        handle = RequestHandle(prompt_ids, params, stream, req_id=next(self._ids))
        self._handles[handle.req_id] = handle
        self._send((_ADD, handle.req_id, prompt_ids, params, stream))
        return handle

    def abort(self, handle: RequestHandle) -> None:
        if self.running and handle.req_id in self._handles:
            self._send((_ABORT, handle.req_id))

    async def snapshot(self) -> EngineSnapshot | None:
        if not self.running:
            return self.last_snapshot
        token = next(self._ids)
        answer = self._loop.create_future()
        self._snapshots[token] = answer
        self._send((_SNAPSHOT, token))
        return await self._snapshot_reply(answer, lambda: self._snapshots.pop(token, None))

    def stop(self, timeout_s: float | None = None) -> None:
        """Abort what is still in the engine, take the last snapshot and end the child (blocks until it ended, or
        until ``timeout_s`` passed: then it is killed). Safe to call again, and from any thread."""
        self.accepting = False
        if self._closed:
            return
        wait_s = EXIT_WAIT_S
        if self._reader is None:  # never served: nobody reads its messages
            self._write_now([(_STOP,)])
        else:
            self._outgoing.put([(_STOP,)])
            if not self._ended.wait(timeout_s):
                log.error("the engine process did not stop within %.1f s (a step still running); killing it",
                          timeout_s or 0.0)
                wait_s = 0.0
        self._end_process(wait_s)

    # ---- commands ----------------------------------------------------------------------------
    def _send(self, command: tuple) -> None:
        """Queue a command (on the event loop); the commands of one event-loop iteration travel together."""
        self._pending.append(command)
        if len(self._pending) == 1:
            try:
                self._loop.call_soon(self._flush)
            except RuntimeError:  # the event loop is closed: the server is gone, so is the request
                self._pending.clear()

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if batch:
            self._outgoing.put(batch)

    def _write(self) -> None:
        """The writer thread: sends each batch of commands (blocking on a full pipe here, never on the event loop)."""
        while True:
            batch = self._outgoing.get()
            if batch is None or not self._write_now(batch):
                return

    def _write_now(self, batch: list[tuple]) -> bool:
        try:
            self._commands.send_bytes(pickle.dumps(batch, pickle.HIGHEST_PROTOCOL))
            return True
        except (OSError, ValueError):  # the child is gone (the reader reports it), or the pipe is closed
            return False

    # ---- the child's messages ----------------------------------------------------------------
    def _read(self) -> None:
        """The reader thread: each message (one or more engine steps' events), handed to the event loop in one
        call."""
        try:
            while True:
                kind, outbox, replies, extra = pickle.loads(self._events.recv_bytes())
                if kind == _FAILED:
                    self.failure = extra
                    log.error("the engine process failed; every request in it fails (%s)", extra)
                for _, event in outbox:
                    if isinstance(event, Finished):
                        self._finish_callback(event.output)
                if kind == _STOPPED:
                    self.last_snapshot = extra
                    self._stopped_cleanly = True
                    _log_messages(extra)
                self._post(self._deliver, kind, outbox, replies)
        except (EOFError, OSError):  # the child closed its pipe: it ended
            pass
        except Exception:
            log.exception("unreadable message from the engine process; treating it as ended")
            self._process.kill()
        if not self._stopped_cleanly and self.failure is None:
            self._process.join(EXIT_WAIT_S)
            self.failure = f"the engine process {describe_exit(self._process.exitcode)}"
            log.error("%s; every request in it fails and the server answers 503 from now on", self.failure)
        self._post(self._fail_all, self.failure or "the server stopped before the request finished")
        self._outgoing.put(None)
        self._ended.set()

    def _post(self, callback, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the event loop is closed: nobody is waiting any more
            pass

    def _deliver(self, kind: str, outbox: list, replies: list) -> None:
        """One message's events to their requests' queues (on the event loop), then its credit back to the child:
        it leaves with the commands of the next event-loop iteration, after the handlers these events woke ran."""
        for rid, event in outbox:
            handle = self._handles.get(rid)
            if handle is None:
                continue
            if not isinstance(event, (Admitted, NewTokens)):  # the request's last event
                del self._handles[rid]
            handle.events.put_nowait(event)
        for token, snapshot in replies:
            answer = self._snapshots.pop(token, None)
            if answer is not None and not answer.done():
                answer.set_result(snapshot)
        if kind == _STEP:
            self._send((_CREDIT,))

    def _fail_all(self, message: str) -> None:
        """The child ended: every request still waiting fails, every snapshot asked for gets the last one."""
        for handle in self._handles.values():
            handle.events.put_nowait(Failed(message))
        self._handles.clear()
        for answer in self._snapshots.values():
            if not answer.done():
                answer.set_result(self.last_snapshot)
        self._snapshots.clear()

    # ---- the child process -------------------------------------------------------------------
    def _wait_until_ready(self) -> dict:
        def ended_early() -> EngineStartError:
            self._process.join(EXIT_WAIT_S)
            return EngineStartError(f"the engine process {describe_exit(self._process.exitcode)} before its engine "
                                    f"was ready (its log above says why)")

        while not self._events.poll(PARENT_CHECK_S):
            if not self._process.is_alive() and not self._events.poll(0):
                raise ended_early()
        try:
            kind, body = pickle.loads(self._events.recv_bytes())
        except EOFError:
            raise ended_early() from None
        if kind == _START_FAILED:
            error, text = body
            if error is not None:
                raise error
            raise EngineStartError(f"the engine process could not build its engine:\n{text}")
        return body

    def _end_process(self, wait_s: float = EXIT_WAIT_S) -> None:
        """Wait for the child to exit (killing it past ``wait_s``), then close both pipes."""
        self._process.join(wait_s)
        if self._process.is_alive():
            log.error("the engine process (pid %d) did not exit; killing it", self.pid)
            self._process.kill()
            self._process.join(EXIT_WAIT_S)
        if self._reader is not None:
            self._reader.join(EXIT_WAIT_S)
        if self._writer is not None:
            self._outgoing.put(None)
            self._writer.join(EXIT_WAIT_S)
        self._commands.close()
        self._events.close()
        self._closed = True
        atexit.unregister(self._at_exit)

    def _at_exit(self) -> None:
        """This interpreter is exiting without having stopped the child: its command pipe closes (the child then
        ends itself), and a child still there after EXIT_WAIT_S is killed."""
        if not self._closed:
            self._commands.close()
            self._end_process()


# ---- in the child ------------------------------------------------------------------------------

class _ServerGone(Exception):
    """The server's process went away."""


def _child_main(factory: Callable[[], Any], commands, events, parent_pid: int, log_level: int,
                messages_in_flight: int = MESSAGES_IN_FLIGHT) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's drain decides when the engine stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    try:
        engine = factory()
    except Exception as e:
        if not isinstance(e, ConfigError):
            log.exception("the engine process could not build its engine")
        _report_start_failure(events, e)
        raise SystemExit(1)
    # The loop runs on a thread of its own, as in EngineLoop (the main thread only waits for it): on a CPU,
    # PyTorch's OpenMP-parallel ops called from the main thread ran the tiny engine's steps up to 15x slower than
    # from another thread when other processes kept the cores busy.
    exit_code = [1]
    thread = threading.Thread(target=_serve_until_stopped, name="engine-loop",
                              args=(engine, commands, events, parent_pid, exit_code, messages_in_flight))
    thread.start()
    thread.join()
    raise SystemExit(exit_code[0])


def _serve_until_stopped(engine, commands, events, parent_pid: int, exit_code: list[int],
                         messages_in_flight: int) -> None:
    try:
        _send(events, (_READY, {"tokenizer": engine.tokenizer, "cfg": engine.cfg, "block_size": engine.block_size}))
        exit_code[0] = _serve(engine, commands, events, parent_pid, messages_in_flight)
    except _ServerGone:
        log.warning("the server's process went away; the engine process ends")
        exit_code[0] = 0


def _report_start_failure(events, error: Exception) -> None:
    import traceback

    text = "".join(traceback.format_exception(error))
    try:
        payload = pickle.dumps((_START_FAILED, (error, text)), pickle.HIGHEST_PROTOCOL)
        pickle.loads(payload)  # an exception that does not survive the trip goes as its text
    except Exception:
        payload = pickle.dumps((_START_FAILED, (None, text)), pickle.HIGHEST_PROTOCOL)
    try:
        events.send_bytes(payload)
    except OSError:
        pass


class _Outbox:
    """The events the child has not sent yet, merged per request across steps: a request's ``NewTokens`` of
    consecutive steps concatenated into one, its other events kept in order (``Admitted`` first, ``Finished`` or
    ``Failed`` after every token before it). Requests keep the order of their first event."""

    def __init__(self):
        self.events: dict[int, list] = {}  # request id -> its events, in order
        self.steps = 0  # steps (loop iterations) whose events it holds

    def __bool__(self) -> bool:
        return bool(self.events)

    def merge(self, outbox: list) -> None:
        """One step's ``(id, event)`` pairs."""
        for rid, event in outbox:
            queued = self.events.setdefault(rid, [])
            if not isinstance(event, NewTokens):
                queued.append(event)
            elif queued and isinstance(queued[-1], NewTokens):
                queued[-1].token_ids.extend(event.token_ids)  # the outbox's own list (below)
            else:
                queued.append(NewTokens(list(event.token_ids)))
        if outbox:
            self.steps += 1

    def take(self, counters: dict) -> list:
        """Every ``(id, event)`` pair held (the outbox is then empty), counting a message of its steps (one that
        carries events: snapshot replies may go without)."""
        taken = [(rid, event) for rid, events in self.events.items() for event in events]
        if taken:
            counters[MESSAGES] += 1
            counters[MERGED_STEPS] += self.steps
        self.events, self.steps = {}, 0
        return taken


def _serve(engine, commands, events, parent_pid: int, messages_in_flight: int = MESSAGES_IN_FLIGHT) -> int:
    """The engine loop; returns the exit status (0: stopped, 1: the engine failed). Sends a message after a step
    when it holds events and a credit (fewer than ``messages_in_flight`` unacknowledged), or snapshot replies."""
    driver = EngineDriver(engine)  # no on_finish here: the server's process counts finished requests
    held = _Outbox()
    counters = {MESSAGES: 0, MERGED_STEPS: 0, HELD_STEPS: 0}
    in_flight = 0  # _STEP messages sent and not acknowledged
    while True:
        # Events held here (no credit) with no work: sleep on the commands, where the next credit comes.
        batch = _receive(commands, parent_pid, wait=not driver.has_work())
        outbox: list = []
        replies: list = []
        admitted = False  # requests added (or refused) in this iteration: their answer goes without a credit
        try:
            stop = False
            for command in batch:
                kind = command[0]
                if kind == _CREDIT:
                    in_flight -= 1
                elif kind == _ADD:
                    _, rid, prompt_ids, params, stream = command
                    driver.add(rid, prompt_ids, params, stream, outbox)
                    admitted = True
                elif kind == _ABORT:
                    driver.abort(command[1], outbox)
                elif kind == _SNAPSHOT:
                    replies.append((command[1], _snapshot(driver.snapshot(), counters)))
                elif kind == _STOP:
                    stop = True
            if stop:
                last = driver.stop(outbox)
                held.merge(outbox)
                sent = held.take(counters)
                _send(events, (_STOPPED, sent, replies, _snapshot(last, counters)))
                return 0
            driver.step(outbox)
        except _ServerGone:
            raise
        except Exception as e:  # the engine's state is unknown now: fail every request, touch nothing more
            log.exception("the engine failed; every request in it fails")
            message = engine_failure(e)
            held.merge(outbox)
            held.merge(driver.fail_all(message))
            _send(events, (_FAILED, held.take(counters), replies, message))
            return 1
        held.merge(outbox)
        # Snapshot replies and admissions never wait for a credit: a request's handler awaits its Admitted before
        # it answers, so holding one would add a whole message cycle to its time to first token.
        if replies or admitted or (held and in_flight < messages_in_flight):
            _send(events, (_STEP, held.take(counters), replies, None))
            in_flight += 1
        elif outbox:
            counters[HELD_STEPS] += 1


def _snapshot(snapshot: EngineSnapshot, counters: dict) -> EngineSnapshot:
    """The engine's snapshot with the child's message counters among its counters."""
    return dataclasses.replace(snapshot, counters={**snapshot.counters, **counters})


def _log_messages(snapshot: EngineSnapshot | None) -> None:
    if snapshot is None or not snapshot.counters.get(MESSAGES):
        return
    c = snapshot.counters
    log.info("the engine process sent %d messages for %d steps' events (%.2f steps per message; %d steps held "
             "for want of a credit)", c[MESSAGES], c[MERGED_STEPS], c[MERGED_STEPS] / c[MESSAGES], c[HELD_STEPS])


def _receive(commands, parent_pid: int, wait: bool) -> list[tuple]:
    """Every command queued now; with ``wait``, sleeps until one comes."""
    if os.getppid() != parent_pid:
        raise _ServerGone
    if wait:
        while not commands.poll(PARENT_CHECK_S):
            if os.getppid() != parent_pid:
                raise _ServerGone
    batch: list[tuple] = []
    try:
        while commands.poll(0):
            batch.extend(pickle.loads(commands.recv_bytes()))
    except (EOFError, OSError):  # the server closed its end: it is gone, or it exits
        raise _ServerGone from None
    return batch


def _send(events, message: tuple) -> None:
    try:
        events.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
    except OSError:
        raise _ServerGone from None
