"""A server started from a command, health-checked, and always stopped: :class:`ServerProcess`.

The command runs in a process group of its own (a new session), so that Ctrl-C in the runner's terminal
reaches the runner alone and the runner stops the server itself, children included: SIGINT to the whole
group (a graceful shutdown), SIGTERM when it has not ended after the grace period, SIGKILL after as long
again. Its stdout and stderr go to a log file; when it exits before its health URL answers 200, or does
not answer in time, :class:`LaunchError` says so with the last lines of that log. Every server still
running when the interpreter exits is stopped then too (``atexit``); only a runner killed with SIGKILL
leaves its server behind.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Mapping, Sequence

import httpx

log = logging.getLogger(__name__)

POLL_S = 0.2  # between two health checks
LOG_TAIL_LINES = 40

_running: "weakref.WeakSet[ServerProcess]" = weakref.WeakSet()


class LaunchError(RuntimeError):
    """A launched server did not become healthy, or ended while it was needed."""


def _stop_all_at_exit() -> None:
    for server in list(_running):
        server.stop()


atexit.register(_stop_all_at_exit)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of the file at ``path`` ('' when there is none)."""
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError:
        return ""


class ServerProcess:
    """``argv`` run as a server: :meth:`start`, :meth:`wait_healthy`, :meth:`stop` (or ``with``: all three).

    ``name`` labels the messages (e.g. "arm B"). The output goes to ``log_path`` (appended to).
    """

    def __init__(self, argv: Sequence[str], log_path: str | Path, health_url: str, *, name: str = "server",
                 cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
                 health_timeout_s: float = 600.0, stop_timeout_s: float = 30.0):
        if not argv:
            raise ValueError("ServerProcess: empty command")
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.health_url = health_url
        self.name = name
        self.cwd = cwd
        self.env = dict(env or {})
        self.health_timeout_s = float(health_timeout_s)
        self.stop_timeout_s = float(stop_timeout_s)
        self.process: subprocess.Popen | None = None
        self.returncode: int | None = None

    # ---- life cycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the command in a new process group; refuse when something already answers at the health URL
        (another server on the port would be measured instead of this one)."""
        if self.process is not None:
            raise RuntimeError(f"{self.name}: already started")
        if self._answers() is not None:
            raise LaunchError(f"{self.name}: {self.health_url} already answers before the launch: another server "
                              f"holds that address; stop it or give this arm another port")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"$ {' '.join(self.argv)}\n".encode())
            out.flush()
            try:
                self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, cwd=self.cwd,
                                                env={**os.environ, **self.env}, start_new_session=True)
            except OSError as exc:
                raise LaunchError(f"{self.name}: cannot start {self.argv[0]!r} ({exc.strerror or exc}); "
                                  f"command: {' '.join(self.argv)}") from None
        _running.add(self)
        log.info("%s: started %s (pid %d, log %s)", self.name, " ".join(self.argv), self.process.pid, self.log_path)

    def wait_healthy(self) -> float:
        """Wait until the health URL answers 200; return the seconds waited. Stops the server and raises
        LaunchError when it exits first or does not answer within ``health_timeout_s``."""
        if self.process is None:
            raise RuntimeError(f"{self.name}: not started")
        start = time.monotonic()
        status = None
        while True:
            code = self.process.poll()
            if code is not None:
                self.returncode = code
                _running.discard(self)
                raise LaunchError(f"{self.name}: the server exited with status {code} before {self.health_url} "
                                  f"answered 200; the last lines of its log ({self.log_path}):\n{self.tail()}")
            status = self._answers()
            if status == 200:
                waited = time.monotonic() - start
                log.info("%s: healthy after %.1f s", self.name, waited)
                return waited
            if time.monotonic() - start > self.health_timeout_s:
                self.stop()
                seen = f"it answered {status}" if status is not None else "nothing answered"
                raise LaunchError(f"{self.name}: {self.health_url} did not answer 200 within {self.health_timeout_s:g} s "
                                  f"({seen}); the server was stopped. The last lines of its log ({self.log_path}):\n"
                                  f"{self.tail()}")
            time.sleep(POLL_S)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        """Raise LaunchError (with its log's tail) when the server has ended."""
        if self.process is not None and self.process.poll() is not None:
            self.returncode = self.process.returncode
            _running.discard(self)
            raise LaunchError(f"{self.name}: the server ended (status {self.returncode}) while the arm needed it; "
                              f"the last lines of its log ({self.log_path}):\n{self.tail()}")

    def stop(self) -> int | None:
        """SIGINT to the process group, then SIGTERM after ``stop_timeout_s``, then SIGKILL after as long again;
        waits until the server has ended and no process of its group is left. Returns its exit status (None:
        never started). Safe to call again."""
        process = self.process
        if process is None:
            return None
        try:
            pgid = os.getpgid(process.pid)
        except ProcessLookupError:  # already reaped
            pgid = process.pid
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if process.poll() is not None and not _group_alive(pgid):
                break
            _signal_group(pgid, sig)
            try:
                process.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("%s: still running %g s after %s", self.name, self.stop_timeout_s, sig.name)
                continue
            if _wait_group_gone(pgid, self.stop_timeout_s):
                break
        self.returncode = process.returncode
        _running.discard(self)
        return self.returncode

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.log_path, lines)

    def __enter__(self) -> "ServerProcess":
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- helpers -----------------------------------------------------------------------------
    def _answers(self) -> int | None:
        """The health URL's status code now, None when nothing answers."""
        try:
            return httpx.get(self.health_url, timeout=2.0).status_code
        except httpx.HTTPError:
            return None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal still exists
        return True
    return True


def _wait_group_gone(pgid: int, timeout_s: float) -> bool:
    """Whether every process of the group ended within ``timeout_s`` (children may outlive the leader briefly)."""
    deadline = time.monotonic() + timeout_s
    while _group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
