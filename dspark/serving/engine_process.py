"""The engine in a process of its own: the engine loop of :mod:`dspark.serving.engine_loop` across a process
boundary, so that the engine never shares a GIL with the HTTP side (the split vLLM makes between AsyncLLM and
EngineCore).

    engine = EngineProcess(factory)   # starts the child, which builds the engine; returns once it is ready
    app = create_app(engine, config)  # the app's lifespan starts and stops it as it does an EngineLoop

    process, pipes, ready = start_engine_process(factory, clients=2)   # one child serving two server processes
    engine = EngineClient(*pipes[0], ready, process.pid)               # in the first (dspark.serving.api_servers)

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

Several server processes (runners.serve ``api_servers`` > 1): the child holds a pair of pipes per server process
(its client), waits on every command pipe, and keeps per client an outbox, its credits, and its requests, which
each client numbers itself (the child keys them by client and id). Each client gets the events of its own
requests and the replies to its own snapshots; every snapshot is the whole engine's. :class:`EngineClient` is a
server process's half of all this, over its pair of pipes; :class:`EngineProcess` is the one that also starts the
child, for a server that is its only client.

How it ends: a stop command aborts what is left in the engine and the child sends its last snapshot and exits.
With several clients, a client that sends stop, or whose command pipe reaches end of file, detaches (its requests
are aborted, it gets its last snapshot when it asked with stop) and the others are served on; the child exits
when the last one detached.
A step that raises fails every request in the engine (``the engine failed: ...``) and ends the child; a child
that dies fails every live request with a message naming its exit status. Either way the server answers 503
from then on. The child ignores SIGINT and SIGTERM (a Ctrl-C, or a signal to the process group, reaches the
server, whose drain decides when the engine stops) and ends itself when the server's process goes away: its
command pipe reaches end of file (every client's), or its parent process changes.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import itertools
import logging
import multiprocessing
import multiprocessing.connection
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
# the steps that ended with their events held for want of a credit (with several clients: every client's messages,
# and the steps that held some client's events).
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


def start_engine_process(factory: Callable[[], Any], clients: int = 1, log_level: int | None = None,
                         messages_in_flight: int = MESSAGES_IN_FLIGHT) -> tuple[Any, list[tuple[Any, Any]], dict]:
    """Start the engine process with ``clients`` pairs of pipes (one per server process that will serve it) and
    wait until its engine is ready: (the process, each client's (commands, events) ends, the ready message:
    ``tokenizer``, ``cfg``, ``block_size``). Raises the child's ConfigError, or EngineStartError, when it could
    not build its engine (the child has ended then)."""
    if isinstance(messages_in_flight, bool) or not isinstance(messages_in_flight, int) or messages_in_flight < 1:
        raise ConfigError(f"messages_in_flight: must be an integer >= 1, got {messages_in_flight!r}")
    context = multiprocessing.get_context("spawn")
    ours, theirs = [], []
    for _ in range(clients):
        child_commands, commands = context.Pipe(duplex=False)
        events, child_events = context.Pipe(duplex=False)
        ours.append((commands, events))
        theirs.append((child_commands, child_events))
    level = log_level if log_level is not None else logging.getLogger().getEffectiveLevel()
    process = context.Process(target=_child_main, name="dspark-engine",
                              args=(factory, theirs, os.getpid(), level, messages_in_flight))
    process.start()
    for child_commands, child_events in theirs:  # the child's ends: its exit is then this side's end of file
        child_commands.close()
        child_events.close()
    try:
        ready = _wait_until_ready(process, ours[0][1])
        for _, events in ours[1:]:  # the child sends every client its ready message at once
            if not events.poll(EXIT_WAIT_S):
                raise EngineStartError("the engine process did not report ready on every client's pipe")
            kind, _ = pickle.loads(events.recv_bytes())
            if kind != _READY:
                raise EngineStartError(f"the engine process sent {kind!r} instead of its ready message")
    except BaseException:  # a child that failed exits at once; one still loading (Ctrl-C) is killed
        process.join(2.0)
        if process.is_alive():
            process.kill()
            process.join(EXIT_WAIT_S)
        for commands, events in ours:
            commands.close()
            events.close()
        raise
    return process, ours, ready


def _wait_until_ready(process, events) -> dict:
    def ended_early() -> EngineStartError:
        process.join(EXIT_WAIT_S)
        return EngineStartError(f"the engine process {describe_exit(process.exitcode)} before its engine "
                                f"was ready (its log above says why)")

    while not events.poll(PARENT_CHECK_S):
        if not process.is_alive() and not events.poll(0):
            raise ended_early()
    try:
        kind, body = pickle.loads(events.recv_bytes())
    except EOFError:
        raise ended_early() from None
    if kind == _START_FAILED:
        error, text = body
        if error is not None:
            raise error
        raise EngineStartError(f"the engine process could not build its engine:\n{text}")
    return body


class EngineClient(BaseEngineLoop):
    """A server process's half of the engine process: an engine loop over one (commands, events) pair of pipes
    to it, given the child's ready message (``ready``) and pid. :class:`EngineProcess` is the one that starts the
    child itself; each API server of runners.serve (``api_servers`` > 1, :mod:`dspark.serving.api_servers`) holds
    one over the pipes its supervisor handed it. ``start``/``stop`` (the app's lifespan) serve as
    :class:`EngineLoop`'s do; ``on_finish`` is called in this process, on the thread that reads the child's
    messages."""

    def __init__(self, commands, events, ready: dict, pid: int,
                 on_finish: Callable[[RequestOutput], None] | None = None):
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
        self._commands, self._events = commands, events
        self.pid: int = pid
        self.tokenizer, self.cfg, self.block_size = ready["tokenizer"], ready["cfg"], ready["block_size"]
        self.models = ready["models"]
        self.where = f"in its own process, pid {pid}"
        atexit.register(self._at_exit)

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
        handle = self._track(RequestHandle(prompt_ids, params, stream, req_id=next(self._ids)))
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
        """Abort what this process still has in the engine, take the last snapshot and detach from the child (an
        EngineProcess: end it), blocking until it answered, or until ``timeout_s`` passed (an EngineProcess's
        child is then killed). Safe to call again, and from any thread."""
        self.accepting = False
        if self._closed:
            return
        wait_s = EXIT_WAIT_S
        if self._reader is None:  # never served: nobody reads its messages
            self._write_now([(_STOP,)])
        else:
            self._outgoing.put([(_STOP,)])
            if not self._ended.wait(timeout_s):
                log.error("the engine process did not stop within %.1f s (a step still running)", timeout_s or 0.0)
                wait_s = 0.0
        self._end(wait_s)

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
        except (EOFError, OSError):  # the child closed its pipe: it ended, or let this process go
            pass
        except Exception:
            log.exception("unreadable message from the engine process; treating it as ended")
            self._abandon()
        if not self._stopped_cleanly and self.failure is None:
            self.failure = self._end_failure()
            log.error("%s; every request in it fails and the server answers 503 from now on", self.failure)
        self._post(self._fail_all, self.failure or "the server stopped before the request finished")
        self._outgoing.put(None)
        self._ended.set()

    def _end_failure(self) -> str:
        """Why requests fail once the child's pipe closed without a stop or a failure."""
        return f"the engine process (pid {self.pid}) ended"

    def _abandon(self) -> None:
        """The child sent what cannot be read: stop talking to it (it lets this process go on end of file)."""
        self._commands.close()

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

    # ---- ending --------------------------------------------------------------------------------
    def _end(self, wait_s: float = EXIT_WAIT_S) -> None:
        """Wait for the child (``_wait_for_child``), then for both threads, then close both pipes."""
        self._wait_for_child(wait_s)
        if self._reader is not None:
            self._reader.join(EXIT_WAIT_S)
        if self._writer is not None:
            self._outgoing.put(None)
            self._writer.join(EXIT_WAIT_S)
        self._commands.close()
        self._events.close()
        self._closed = True
        atexit.unregister(self._at_exit)

    def _wait_for_child(self, wait_s: float) -> None:
        """The child is not this process's to wait for: it ends when its last client detached."""

    def _at_exit(self) -> None:
        """This interpreter is exiting without having stopped: the command pipe closes (the child then lets this
        process go, or ends itself when it was its last client)."""
        if not self._closed:
            self._commands.close()
            self._end()


class EngineProcess(EngineClient):
    """An engine built and run by a child process, served to this process alone. Constructing one starts the
    child and returns when its engine is ready (model loaded, graphs captured), raising the child's ConfigError,
    or EngineStartError, when it could not build it. ``messages_in_flight``: how many of the child's messages may
    await delivery on the event loop (flow control, MESSAGES_IN_FLIGHT)."""

    def __init__(self, factory: Callable[[], Any], on_finish: Callable[[RequestOutput], None] | None = None,
                 log_level: int | None = None, messages_in_flight: int = MESSAGES_IN_FLIGHT):
        process, [(commands, events)], ready = start_engine_process(factory, 1, log_level, messages_in_flight)
        self._process = process
        super().__init__(commands, events, ready, process.pid, on_finish)
        log.info("engine in its own process, pid %d", self.pid)

    def _end_failure(self) -> str:
        self._process.join(EXIT_WAIT_S)
        return f"the engine process {describe_exit(self._process.exitcode)}"

    def _abandon(self) -> None:
        self._process.kill()

    def _wait_for_child(self, wait_s: float) -> None:
        """Wait for the child to exit, killing it past ``wait_s``."""
        self._process.join(wait_s)
        if self._process.is_alive():
            log.error("the engine process (pid %d) did not exit; killing it", self.pid)
            self._process.kill()
            self._process.join(EXIT_WAIT_S)


# ---- in the child ------------------------------------------------------------------------------

class _ServerGone(Exception):
    """The server's process went away (every client has: the child has nobody left to serve)."""


def _child_main(factory: Callable[[], Any], pipes: list[tuple[Any, Any]], parent_pid: int, log_level: int,
                messages_in_flight: int = MESSAGES_IN_FLIGHT) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's drain decides when the engine stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    try:
        engine = factory()
    except Exception as e:
        if not isinstance(e, ConfigError):
            log.exception("the engine process could not build its engine")
        _report_start_failure(pipes[0][1], e)
        raise SystemExit(1)
    # The loop runs on a thread of its own, as in EngineLoop (the main thread only waits for it): on a CPU,
    # PyTorch's OpenMP-parallel ops called from the main thread ran the tiny engine's steps up to 15x slower than
    # from another thread when other processes kept the cores busy.
    exit_code = [1]
    thread = threading.Thread(target=_serve_until_stopped, name="engine-loop",
                              args=(engine, pipes, parent_pid, exit_code, messages_in_flight))
    thread.start()
    thread.join()
    raise SystemExit(exit_code[0])


def _serve_until_stopped(engine, pipes: list[tuple[Any, Any]], parent_pid: int, exit_code: list[int],
                         messages_in_flight: int) -> None:
    try:
        ready = {"tokenizer": engine.tokenizer, "cfg": engine.cfg, "block_size": engine.block_size,
                 "models": engine.models()}
        for _, events in pipes:
            _send(events, (_READY, ready))
        exit_code[0] = _serve(engine, pipes, parent_pid, messages_in_flight)
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


@dataclasses.dataclass(eq=False)
class _Client:
    """One server process the child serves: its pipes, the events held for it, its messages in flight."""

    index: int
    commands: Any
    events: Any
    held: _Outbox = dataclasses.field(default_factory=_Outbox)
    in_flight: int = 0  # _STEP messages sent and not acknowledged
    attached: bool = True  # neither stopped nor gone
    lost: bool = False  # a message to it could not be sent: it is gone


def _serve(engine, pipes: list[tuple[Any, Any]], parent_pid: int,
           messages_in_flight: int = MESSAGES_IN_FLIGHT) -> int:
    """The engine loop for the server processes whose (commands, events) pipes are ``pipes``; returns the exit
    status (0: stopped, 1: the engine failed). Each client numbers its requests itself (the driver keys them by
    (client, id)) and gets the events of its own requests and the replies to its own snapshots. After a step, a
    client is sent a message when it has events held and a credit (fewer than ``messages_in_flight``
    unacknowledged), snapshot replies, or admissions. A client that sends stop, or whose pipe closes, detaches:
    its requests are aborted and the others are served on; the loop ends when the last one detached (a step that
    raises fails every client's requests and ends it)."""
    driver = EngineDriver(engine)  # no on_finish here: the server's processes count finished requests
    clients = [_Client(i, commands, events) for i, (commands, events) in enumerate(pipes)]
    counters = {MESSAGES: 0, MERGED_STEPS: 0, HELD_STEPS: 0}
    while True:
        for client in clients:
            if client.attached and client.lost:
                _detach(driver, clients, client, "its pipe closed")
        attached = [client for client in clients if client.attached]
        # Events held here (no credit) with no work: sleep on the commands, where the next credit comes.
        batches = _receive(attached, parent_pid, wait=not driver.has_work())
        outbox: list = []  # ((client, id), event) pairs
        replies: dict[int, list] = {client.index: [] for client in attached}
        admitted: set[int] = set()  # clients whose requests were added (or refused): their answer goes at once
        stopping: list[_Client] = []
        try:
            for client in attached:
                batch = batches[client.index]
                if batch is None:  # end of file: its server process is gone
                    _detach(driver, clients, client, "its pipe closed")
                    continue
                for command in batch:
                    kind = command[0]
                    if kind == _CREDIT:
                        client.in_flight -= 1
                    elif kind == _ADD:
                        _, rid, prompt_ids, params, stream = command
                        driver.add((client.index, rid), prompt_ids, params, stream, outbox)
                        admitted.add(client.index)
                    elif kind == _ABORT:
                        driver.abort((client.index, command[1]), outbox)
                    elif kind == _SNAPSHOT:
                        replies[client.index].append((command[1], _snapshot(driver.snapshot(), counters)))
                    elif kind == _STOP:
                        stopping.append(client)
            if stopping:
                last_ones = all(not client.attached or client in stopping for client in clients)
                if last_ones:
                    last = driver.stop(outbox)
                else:
                    for client in stopping:
                        _abort_requests_of(driver, client, outbox)
                    last = driver.snapshot()
                _route(clients, outbox)
                for client in stopping:
                    sent = client.held.take(counters)
                    _send_last(client, (_STOPPED, sent, replies[client.index], _snapshot(last, counters)))
                    _close(client)
                    if len(clients) > 1:
                        log.info("API server %d stopped; %d still served", client.index,
                                 sum(c.attached for c in clients))
                if last_ones:
                    return 0
                outbox = []
            driver.step(outbox)
        except _ServerGone:
            raise
        except Exception as e:  # the engine's state is unknown now: fail every request, touch nothing more
            log.exception("the engine failed; every request in it fails")
            message = engine_failure(e)
            _route(clients, outbox)
            _route(clients, driver.fail_all(message))
            for client in clients:
                if client.attached:
                    _send_last(client, (_FAILED, client.held.take(counters), replies.get(client.index, []), message))
            return 1
        fresh = _route(clients, outbox)
        held = False
        for client in clients:
            if not client.attached:
                continue
            answers = replies.get(client.index, [])
            # Snapshot replies and admissions never wait for a credit: a request's handler awaits its Admitted
            # before it answers, so holding one would add a whole message cycle to its time to first token.
            if answers or client.index in admitted or (client.held and client.in_flight < messages_in_flight):
                _send_step(clients, client, (_STEP, client.held.take(counters), answers, None))
                client.in_flight += 1
            elif client.index in fresh:
                held = True
        if held:
            counters[HELD_STEPS] += 1


def _route(clients: list[_Client], outbox: list) -> set[int]:
    """One iteration's ``((client, id), event)`` pairs into each attached client's outbox (a detached client's
    are dropped); the clients that got some."""
    per_client: dict[int, list] = {}
    for (index, rid), event in outbox:
        per_client.setdefault(index, []).append((rid, event))
    for index, events in per_client.items():
        if clients[index].attached:
            clients[index].held.merge(events)
    return set(per_client)


def _abort_requests_of(driver: EngineDriver, client: _Client, outbox: list) -> None:
    for key in [key for key in driver.req_ids if key[0] == client.index]:
        driver.abort(key, outbox)


def _detach(driver: EngineDriver, clients: list[_Client], client: _Client, why: str) -> None:
    """A client whose process is gone: the child ends when it was the last one; otherwise its requests are
    aborted (their events go nowhere) and the others are served on."""
    if sum(c.attached for c in clients) == 1:
        raise _ServerGone
    _abort_requests_of(driver, client, [])
    _close(client)
    log.warning("API server %d went away (%s); its requests were aborted, %d still served", client.index, why,
                sum(c.attached for c in clients))


def _close(client: _Client) -> None:
    client.attached = False
    client.held = _Outbox()
    for pipe in (client.commands, client.events):
        try:
            pipe.close()
        except OSError:
            pass


def _send_step(clients: list[_Client], client: _Client, message: tuple) -> None:
    """A message to a client; one that cannot take it is gone (the child ends when it was the last one)."""
    try:
        client.events.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
    except OSError:
        if sum(c.attached and not c.lost for c in clients) == 1:
            raise _ServerGone from None
        client.lost = True


def _send_last(client: _Client, message: tuple) -> None:
    """The last message to a client (stopped, failed): a client already gone does not need it."""
    try:
        client.events.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
    except OSError:
        pass


def _snapshot(snapshot: EngineSnapshot, counters: dict) -> EngineSnapshot:
    """The engine's snapshot with the child's message counters among its counters."""
    return dataclasses.replace(snapshot, counters={**snapshot.counters, **counters})


def _log_messages(snapshot: EngineSnapshot | None) -> None:
    if snapshot is None or not snapshot.counters.get(MESSAGES):
        return
    c = snapshot.counters
    log.info("the engine process sent %d messages for %d steps' events (%.2f steps per message; %d steps held "
             "for want of a credit)", c[MESSAGES], c[MERGED_STEPS], c[MERGED_STEPS] / c[MESSAGES], c[HELD_STEPS])


def _receive(clients: list[_Client], parent_pid: int, wait: bool) -> dict[int, list[tuple] | None]:
    """Every command queued now, per client (None: its pipe reached end of file); with ``wait``, sleeps until one
    comes."""
    if os.getppid() != parent_pid:
        raise _ServerGone
    if wait:
        pipes = [client.commands for client in clients]
        while not multiprocessing.connection.wait(pipes, PARENT_CHECK_S):
            if os.getppid() != parent_pid:
                raise _ServerGone
    batches: dict[int, list[tuple] | None] = {}
    for client in clients:
        batch: list[tuple] | None = []
        try:
            while client.commands.poll(0):
                batch.extend(pickle.loads(client.commands.recv_bytes()))
        except (EOFError, OSError):  # the server closed its end: it is gone, or it exits
            batch = None
        batches[client.index] = batch
    return batches


def _send(events, message: tuple) -> None:
    try:
        events.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
    except OSError:
        raise _ServerGone from None
