"""Several HTTP front-ends over one engine process (``python -m runners.serve api_servers=N``, N > 1), as vLLM's
``--api-server-count``: under a deep closed loop one event loop cannot parse, template, tokenize and stream for
every client as fast as the engine steps, so N processes share that work.

    serve_api_servers(factory, config, bind_socket(config))   # blocks until SIGINT/SIGTERM

The calling process (the supervisor) holds the listening socket, bound before the model loads. It starts the engine
process with one pair of pipes per API server (``engine_process.start_engine_process``: it returns once the engine
is ready, raising what the child raised when it could not build it), then spawns N API server processes, each
given its pipes, the socket, the ServerConfig and the path of the engine's ready message (a file: passed as an
argument, its tokenizer would make the pickled arguments too large for a pipe's buffer, and a Ctrl-C that killed
a child while it read them would leave the supervisor blocked writing them). Each builds the app over an
``EngineClient`` of its pipes and runs uvicorn on the socket (``server.serve``): the kernel hands each new
connection to one of them. The supervisor announces the server ("serving <model> at <url>") once every API server
accepts connections (each sets its event when uvicorn has started): until then a connection could wait in the
socket's backlog for a process still importing its modules. The engine process keys every request by its API
server, routes its events back there, and ends when the last API server detached (engine_process's docstring says
how).

Metrics: the supervisor creates a fresh PROMETHEUS_MULTIPROC_DIR before spawning the API servers (removed when it
exits); their per-request metrics are prometheus_client's multiprocess values, so a scrape of any one reports every
API server's finished requests, and the engine's counters come from a snapshot of the one engine (never summed).

Shutting down: on SIGINT/SIGTERM the supervisor sends SIGTERM to every API server, which drains as a single server
does (new requests 503, requests in flight finish, then it stops its half of the engine), waits for them, then
for the engine process, and ends as a single server would (SIGINT: quietly, status 0; SIGTERM: by that signal).
SIGTERM rather than the signal received: a Ctrl-C reaches every process of the group, and a second SIGINT makes
uvicorn skip the drain. The API servers ignore SIGINT for the same reason: the supervisor's SIGTERM can reach one
before the group's SIGINT does, which would then be that second signal. An API server that exits while the
server is not shutting down is an error: the others are told to shut down and the supervisor raises
:class:`ApiServerExited` (a non-zero exit). An API server whose supervisor goes away shuts itself down; the engine
process then ends as well.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
from typing import Any, Callable

from dspark.serving.config import ServerConfig
from dspark.serving.engine_process import EXIT_WAIT_S, PARENT_CHECK_S, describe_exit, start_engine_process

log = logging.getLogger(__name__)

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


class ApiServerExited(RuntimeError):
    """An API server process ended while the server was serving."""


def serve_api_servers(factory: Callable[[], Any], config: ServerConfig, sock, gc_freeze: bool = True) -> None:
    """Serve ``config.api_servers`` API server processes on ``sock`` over one engine process built by ``factory``
    (as EngineProcess's) until SIGINT/SIGTERM. ``gc_freeze``: each API server freezes what is alive before serving
    (runners.serve's gc_freeze)."""
    n = config.api_servers
    level = logging.getLogger().getEffectiveLevel()
    process, pipes, ready = start_engine_process(factory, clients=n, log_level=level)
    log.info("engine in its own process, pid %d, serving %d API servers", process.pid, n)
    context = multiprocessing.get_context("spawn")
    servers: list = []
    received: list[int] = []  # the signals that asked for the shutdown
    exited = None  # the API server that ended on its own

    def on_signal(sig: int, frame) -> None:
        if not received:
            log.info("%s: shutting the %d API servers down", signal.Signals(sig).name, len(servers))
        received.append(sig)
        for server in servers:
            _terminate(server)

    metrics_dir = tempfile.mkdtemp(prefix="dspark-metrics-")
    ready_dir = tempfile.mkdtemp(prefix="dspark-engine-ready-")
    ready_path = os.path.join(ready_dir, "ready.pickle")
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with open(ready_path, "wb") as f:
            pickle.dump(ready, f)
        with _environment(MULTIPROC_DIR_ENV, metrics_dir):  # read as the API servers import prometheus_client
            started = [context.Event() for _ in pipes]
            for index, (commands, events) in enumerate(pipes):
                if received:  # a signal came while the others started: start no more
                    break
                server = context.Process(target=_api_server_main, name=f"dspark-api-server-{index}",
                                         args=(index, commands, events, ready_path, process.pid, sock, config, level,
                                               gc_freeze, os.getpid(), started[index]))
                server.start()
                commands.close()  # the API server's now: its exit is the engine process's end of file
                events.close()
                servers.append(server)
                if received:  # a signal came while the others started
                    _terminate(server)
        if _wait_started(servers, started, received):
            host, port = sock.getsockname()[:2]
            log.info("serving %s at http://%s:%d/v1 (%d API servers, pids %s)", config.served_model_name, host, port,
                     n, ", ".join(str(server.pid) for server in servers))
        exited = _wait(servers, received)
        if exited is not None:
            log.error("API server %s (pid %d) %s while serving; shutting the server down", exited.name, exited.pid,
                      describe_exit(exited.exitcode))
            for server in servers:
                _terminate(server)
            _wait(servers, [signal.SIGTERM])
    finally:
        for server in servers:  # (none is left but when this ends on an error)
            _terminate(server)
        for server in servers:
            _end(server, config.graceful_shutdown_s + 30.0)
        for commands, events in pipes[len(servers):]:  # never handed over
            commands.close()
            events.close()
        _end(process, EXIT_WAIT_S)  # it ends once every API server stopped (or went away)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(metrics_dir, ignore_errors=True)
        shutil.rmtree(ready_dir, ignore_errors=True)
    if exited is not None:
        raise ApiServerExited(f"API server {exited.name} (pid {exited.pid}) {describe_exit(exited.exitcode)} while "
                              f"serving")
    if received:  # end as a single server does: SIGTERM by its default action, SIGINT quietly
        if received[0] == signal.SIGTERM:
            signal.raise_signal(signal.SIGTERM)
        log.info("stopped (%s)", signal.Signals(received[0]).name)


def _wait_started(servers: list, started: list, received: list[int]) -> bool:
    """Wait until every API server accepts connections (True), or one has exited or a signal asked for the shutdown
    (False; :func:`_wait` then reports it)."""
    while not all(event.is_set() for event in started):
        if received or any(server.exitcode is not None for server in servers):
            return False
        multiprocessing.connection.wait([server.sentinel for server in servers], timeout=0.05)
    return True


def _wait(servers: list, received: list[int]):
    """Wait until every API server has exited; the first that exited before any signal was received (None: none)."""
    while True:
        live = {server.sentinel: server for server in servers if server.exitcode is None}
        if not live:
            return None
        for sentinel in multiprocessing.connection.wait(list(live), timeout=PARENT_CHECK_S):
            server = live[sentinel]
            server.join()
            if not received:
                return server


def _terminate(server) -> None:
    if server.exitcode is None and server.pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.pid, signal.SIGTERM)


def _end(process, wait_s: float) -> None:
    """Wait for ``process`` to exit, killing it past ``wait_s``."""
    process.join(wait_s)
    if process.is_alive():
        log.error("%s (pid %d) did not exit; killing it", process.name, process.pid)
        process.kill()
        process.join(EXIT_WAIT_S)


@contextlib.contextmanager
def _environment(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


# ---- in an API server process ----------------------------------------------------------------------

def _api_server_main(index: int, commands, events, ready_path: str, engine_pid: int, sock, config: ServerConfig,
                     log_level: int, gc_freeze: bool, supervisor_pid: int, started) -> None:
    logging.basicConfig(level=log_level, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    from dspark.serving.app import create_app
    from dspark.serving.engine_process import EngineClient
    from dspark.serving.server import serve

    with open(ready_path, "rb") as f:  # the engine process's ready message, written by the supervisor
        ready = pickle.load(f)
    app = create_app(EngineClient(commands, events, ready, engine_pid), config)
    if gc_freeze:  # as runners.serve does before serving
        gc.collect()
        gc.freeze()
    threading.Thread(target=_watch_supervisor, args=(supervisor_pid,), name="supervisor-watch", daemon=True).start()
    # SIGINT is the supervisor's to answer: it stops this server with SIGTERM (see the module docstring)
    serve(app, config, sock, on_started=lambda: _started(index, started), ignore_sigint=True)


def _started(index: int, started) -> None:
    log.info("API server %d serving (pid %d)", index, os.getpid())
    started.set()


def _watch_supervisor(supervisor_pid: int) -> None:
    """The supervisor went away (killed): shut this API server down as a SIGTERM would."""
    while os.getppid() == supervisor_pid:
        time.sleep(PARENT_CHECK_S)
    log.error("the server's supervising process went away; this API server shuts down")
    os.kill(os.getpid(), signal.SIGTERM)
