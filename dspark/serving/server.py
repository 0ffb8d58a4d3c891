"""Running an app under uvicorn, with a shutdown that loses no request.

On SIGINT/SIGTERM uvicorn stops listening and waits for the requests in flight (up to
``graceful_shutdown_s``); ``DrainingServer`` also tells the engine loop at once, so a request arriving
meanwhile on an open connection gets a 503 instead of starting, and shortly before the grace period ends it
ends the requests still running with a 503 (a stream: an error event and ``[DONE]``), which aborts them in the
engine. The app's lifespan then stops the engine loop (its thread, or its process) and logs the
final counters.
The listening socket is bound before the model loads (``bind_socket``), so a port in use is refused
at start.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType
from typing import Callable

import uvicorn

from dspark.config import ConfigError
from dspark.serving.config import ServerConfig

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """uvicorn's server; its exit signal also makes the app's engine loop refuse new requests. ``on_started`` is
    called once it accepts connections (the app's startup done, the socket served). ``ignore_sigint``: SIGINT is
    left to a supervising process, which stops this server with SIGTERM (an API server of
    dspark.serving.api_servers: a Ctrl-C reaches every process of the group, and uvicorn takes a SIGINT after a
    SIGTERM as a second exit signal, which skips the drain and cuts the streams in flight)."""

    def __init__(self, config: uvicorn.Config, engine_loop, on_started: Callable[[], None] | None = None,
                 ignore_sigint: bool = False):
        super().__init__(config)
        self.engine_loop = engine_loop
        self.on_started = on_started
        self.ignore_sigint = ignore_sigint

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.on_started is not None:
            self.on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.ignore_sigint and sig == signal.SIGINT:
            return
        self.engine_loop.begin_drain()
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown. Shortly before its grace period runs out (``graceful_shutdown_s``, less a quarter
        of it up to one second) the requests still in flight are ended with a 503, a streamed one with an error
        event and ``[DONE]``: uvicorn would cancel their handlers, which answers a bare 500 or cuts a stream off."""
        grace = self.config.timeout_graceful_shutdown
        timer = None
        if grace is not None:
            after = max(0.0, grace - min(1.0, grace / 4))
            timer = asyncio.get_running_loop().call_later(after, self._end_in_flight, grace, after)
        try:
            await super().shutdown(sockets=sockets)
        finally:
            if timer is not None:
                timer.cancel()

    def _end_in_flight(self, grace: float, after: float) -> None:
        ended = self.engine_loop.end_in_flight(f"the server shut down before this request finished (its grace "
                                               f"period for requests in flight, graceful_shutdown_s, is {grace:g} s)")
        if ended:
            log.warning("graceful shutdown: %d request(s) still in flight after %.1f s were ended with a 503", ended,
                        after)


def bind_socket(config: ServerConfig) -> socket.socket:
    """The listening socket of ``config.host``:``config.port`` (port 0: a free one), or a ConfigError."""
    try:
        infos = socket.getaddrinfo(config.host, config.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"host: cannot resolve {config.host!r} ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise ConfigError(f"port: cannot listen on {config.host}:{config.port} ({e.strerror}); choose another "
                          f"port, e.g. port=0 for any free one") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def build_server(app, config: ServerConfig, on_started: Callable[[], None] | None = None,
                 ignore_sigint: bool = False) -> DrainingServer:
    uv = uvicorn.Config(app, log_level=config.log_level, timeout_graceful_shutdown=config.graceful_shutdown_s,
                        lifespan="on")
    return DrainingServer(uv, app.state.engine_loop, on_started, ignore_sigint)


def serve(app, config: ServerConfig, sock: socket.socket, on_started: Callable[[], None] | None = None,
          ignore_sigint: bool = False) -> None:
    """Serve ``app`` on ``sock`` until SIGINT/SIGTERM (``on_started``: called once it accepts connections;
    ``ignore_sigint``: until SIGTERM only, see :class:`DrainingServer`). uvicorn shuts down gracefully, then raises
    the signal again: SIGTERM ends the process with its status, SIGINT's KeyboardInterrupt (Ctrl-C, the usual way to
    stop a server in a terminal) ends it quietly here, the shutdown already logged."""
    try:
        build_server(app, config, on_started, ignore_sigint).run(sockets=[sock])
    except KeyboardInterrupt:
        log.info("stopped (SIGINT)")
