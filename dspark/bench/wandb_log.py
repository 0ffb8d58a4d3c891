"""Weights & Biases logging for A/B runs, built so that W&B can never lose local results.

One W&B run per arm per experiment: ``group`` = the experiment, ``job_type`` = the arm,
so the W&B UI compares arms side by side. Both runs stay open while the ABBA schedule
alternates between them.

Every call into W&B after construction is wrapped: a failure is logged as a warning,
appended to :attr:`WandbLogger.failures` (which the runner puts in its summary) and the
benchmark continues. Configuration mistakes (an unknown mode, "online" without an API
key) raise at construction, before any measurement is at stake.

A storage failure of the W&B folder (an ``OSError``: disk full, folder unwritable or
read-only, quota), whether a W&B call raises it or W&B's own log file handler hits it,
stops W&B for the rest of the run: ONE warning names the folder and the error, the open
W&B runs are closed quietly, W&B's log-file handlers under the folder are detached (each
failing write of theirs would otherwise print a "--- Logging error ---" traceback, which
W&B's console capture feeds back into the same handler: hundreds of them per run), no
further W&B call is made, and :meth:`WandbLogger.status` reports it under "stopped". A
folder that cannot be created or written at all is found by a one-byte probe before each
run starts. The run's own result files are written elsewhere and are unaffected.
"""

from __future__ import annotations

import logging
import math
import netrc
import os
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

from dspark.bench.metrics import RequestRecord, requests_dataframe

log = logging.getLogger(__name__)

WANDB_MODES = ("offline", "online", "disabled")


def resolve_mode(mode: str | None) -> str:
    """The explicit ``mode``, else the ``WANDB_MODE`` environment variable, else "offline"."""
    resolved = mode if mode is not None else os.environ.get("WANDB_MODE", "offline")
    if resolved not in WANDB_MODES:
        source = "mode argument" if mode is not None else "WANDB_MODE environment variable"
        raise ValueError(f"W&B mode {resolved!r} (from the {source}) is not supported; use one of {list(WANDB_MODES)}")
    return resolved


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def flatten_for_logging(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to "a/b" keys and numeric lists to "name/i"; drop nothing silently.

    Values W&B cannot chart (strings, None) are kept as they are; non-finite floats
    become None so the summary file stays valid JSON.
    """
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat |= flatten_for_logging(value, prefix=f"{name}/")
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
            for i, v in enumerate(value):
                flat[f"{name}/{i}"] = None if isinstance(v, float) and not math.isfinite(v) else v
        elif isinstance(value, float) and not math.isfinite(value):
            flat[name] = None
        else:
            flat[name] = value
    return flat


class WandbLogger:
    """Per-arm W&B runs for one experiment; see the module docstring for the failure policy."""

    def __init__(self, mode: str | None = None, project: str = "dspark-bench", group: str | None = None,
                 dir: str | Path | None = None) -> None:
        self.mode = resolve_mode(mode)
        if self.mode == "online" and not _has_api_key():
            raise RuntimeError("W&B mode is 'online' but no API key is configured: set WANDB_API_KEY "
                               "(or run `wandb login`), or use wandb mode 'offline' and `wandb sync` later")
        self.project = project
        self.group = group
        self.dir = Path(dir) if dir is not None else None
        self.failures: list[dict[str, str]] = []
        self.run_dirs: dict[str, str] = {}
        self.stopped: dict[str, str] | None = None  # set once by a storage failure; see the module docstring
        self._runs: dict[str, Any] = {}
        self._wandb = None
        self._stop_lock = threading.Lock()
        if self.mode != "disabled":
            try:
                import wandb
            except ImportError as exc:
                raise ImportError("wandb is not installed: `pip install wandb`, or set the W&B mode to "
                                  "'disabled'") from exc
            self._wandb = wandb
            self._probe_folder("the folder check")

    @property
    def enabled(self) -> bool:
        return self.mode != "disabled"

    @property
    def folder(self) -> str:
        """The W&B folder (where wandb.init writes its run folders)."""
        return str(self.dir) if self.dir is not None else os.path.abspath(os.environ.get("WANDB_DIR") or ".")

    def _probe_folder(self, call: str, arm: str = "all") -> bool:
        """Create the W&B folder and write one byte there; a failure stops W&B (False)."""
        if self.dir is None:
            return True
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.dir) as fh:
                fh.write(b"\0")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            self._stop(call, arm, exc)
            return False
        return True

    def _stop(self, call: str, arm: str, exc: BaseException) -> None:
        """Stop W&B for the rest of the run after a storage failure: one warning, recorded in status()."""
        with self._stop_lock:
            if self.stopped is not None:
                return
            error = f"{type(exc).__name__}: {exc}"
            what = call if arm == "all" else f"{call} for arm {arm}"
            self.stopped = {"call": call, "arm": arm, "folder": self.folder, "error": error,
                            "message": f"W&B logging stopped at {what}: the W&B folder {self.folder} failed "
                                       f"({error}); nothing after that point was logged to W&B"}
            self.failures.append({"call": call, "arm": arm, "error": error})
            self._detach_log_files()
        log.warning("W&B logging stopped for the rest of this run: %s failed on the W&B folder %s (%s). The run's own "
                    "files (blocks.csv, summary.json, requests.parquet) are unaffected; free space in (or fix the "
                    "permissions of) that folder, or set wandb.mode=disabled", what, self.folder, error)

    def _detach_log_files(self) -> None:
        """Remove W&B's log-file handlers that write under the W&B folder (a NullHandler keeps the rest quiet)."""
        wandb_logger = logging.getLogger("wandb")
        root = os.path.abspath(self.folder)
        for handler in list(wandb_logger.handlers):
            name = getattr(handler, "baseFilename", None)
            if name is not None and os.path.abspath(name).startswith(root + os.sep):
                wandb_logger.removeHandler(handler)
                try:
                    handler.close()
                except Exception:
                    pass
        if not wandb_logger.handlers:
            wandb_logger.addHandler(logging.NullHandler())

    def _watch_log_files(self) -> None:
        """Make a storage failure of W&B's own log-file handlers (under the W&B folder) stop W&B at once."""
        root = os.path.abspath(self.folder)
        for handler in logging.getLogger("wandb").handlers:
            name = getattr(handler, "baseFilename", None)
            if name is None or getattr(handler, "_dspark_watched", False) or \
                    not os.path.abspath(name).startswith(root + os.sep):
                continue
            original = handler.handleError

            def handle_error(record: logging.LogRecord, original=original, name=name) -> None:
                exc = sys.exc_info()[1]
                if isinstance(exc, OSError):
                    self._stop(f"W&B's log file {os.path.basename(name)}", "all", exc)
                else:
                    original(record)

            handler.handleError = handle_error
            handler._dspark_watched = True

    def _close_runs_quietly(self) -> None:
        """After a stop: finish the open runs without letting W&B's errors reach the console."""
        raise_exceptions, logging.raiseExceptions = logging.raiseExceptions, False
        try:
            for arm in list(self._runs):
                run = self._runs.pop(arm)
                try:
                    run.finish(exit_code=1, quiet=True)
                except Exception:
                    pass
        finally:
            logging.raiseExceptions = raise_exceptions

    def _guarded(self, call: str, arm: str, fn: Callable[[], Any]) -> Any:
        if self.stopped is not None:
            if self._runs:
                self._close_runs_quietly()
            return None
        try:
            return fn()
        except OSError as exc:  # the W&B folder is full or unwritable: stop W&B, keep the benchmark going
            self._stop(call, arm, exc)
            self._close_runs_quietly()
            return None
        except Exception as exc:  # W&B trouble must never cost the local results
            failure = {"call": call, "arm": arm, "error": f"{type(exc).__name__}: {exc}"}
            self.failures.append(failure)
            message = f"W&B {call} for arm {arm} failed and was skipped (local results are unaffected): {exc}"
            warnings.warn(message, RuntimeWarning, stacklevel=3)
            log.warning(message)
            return None

    def _run(self, arm: str) -> Any:
        run = self._runs.get(arm)
        if run is None:
            raise RuntimeError(f"no open W&B run for arm {arm!r} (start_arm was not called or failed)")
        return run

    def start_arm(self, arm: str, job_type: str, config: Mapping[str, Any]) -> None:
        """Open the run of ``arm``; ``config`` is the composed configuration of that arm."""
        if not self.enabled or self.stopped is not None or not self._probe_folder("the folder check", arm):
            return

        def start() -> None:
            run = self._wandb.init(project=self.project, group=self.group, job_type=job_type,
                                   name=f"{self.group}-{arm}" if self.group else arm, config=dict(config),
                                   dir=str(self.dir) if self.dir is not None else None, mode=self.mode,
                                   reinit="create_new")
            self._runs[arm] = run
            self.run_dirs[arm] = str(Path(run.dir).parent)
            self._watch_log_files()

        self._guarded("start_arm", arm, start)

    def log_block(self, arm: str, block_index: int, metrics: Mapping[str, Any]) -> None:
        """Log one block's aggregate metrics of ``arm`` as a history row (step = block index)."""
        if self.enabled:
            self._guarded("log_block", arm, lambda: self._run(arm).log(
                {"block": block_index, **flatten_for_logging(metrics)}, step=int(block_index)))

    def log_requests(self, arm: str, records: Iterable[RequestRecord] | pd.DataFrame) -> None:
        """Log the per-request table of ``arm`` (a list of records or a requests DataFrame)."""
        if not self.enabled:
            return

        def log_table() -> None:
            frame = records if isinstance(records, pd.DataFrame) else requests_dataframe(records)
            frame = frame.astype(object).where(frame.notna(), None)
            self._run(arm).log({"requests": self._wandb.Table(dataframe=frame)})

        self._guarded("log_requests", arm, log_table)

    def finish_arm(self, arm: str, summary: Mapping[str, Any]) -> None:
        """Write ``summary`` (plus any W&B failures so far) to the arm's run and close it."""
        if not self.enabled:
            return

        def finish() -> None:
            run = self._run(arm)
            run.summary.update(flatten_for_logging({**summary, "wandb_failures": len(self.failures)}))
            run.finish()
            del self._runs[arm]

        self._guarded("finish_arm", arm, finish)

    def close(self) -> None:
        """Finish runs still open (marked unfinished) and flush W&B to disk; call once at the end.

        W&B writes the offline run log asynchronously; only after this call is every
        logged value guaranteed to be in the run folder.
        """
        if not self.enabled:
            return
        if self.stopped is None:
            for arm in list(self._runs):
                self._guarded("close", arm, lambda arm=arm: self._runs.pop(arm).finish(exit_code=1))
                self.failures.append({"call": "close", "arm": arm,
                                      "error": "finish_arm was never called; the run was closed as unfinished"})
            if self.stopped is None:
                self._guarded("close", "all", self._wandb.teardown)
                return
        self._close_runs_quietly()  # stopped: shut W&B down without a word on the console
        raise_exceptions, logging.raiseExceptions = logging.raiseExceptions, False
        try:
            self._wandb.teardown()
        except Exception:
            pass
        finally:
            logging.raiseExceptions = raise_exceptions

    def __enter__(self) -> "WandbLogger":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def status(self) -> dict[str, Any]:
        """What to put in the experiment summary: mode, run folders, every failure, and "stopped" (None, or
        where and why W&B logging stopped for the rest of the run: call, arm, folder, error, message)."""
        status = {"mode": self.mode, "project": self.project, "group": self.group, "run_dirs": dict(self.run_dirs),
                  "failures": list(self.failures), "stopped": None if self.stopped is None else dict(self.stopped)}
        if self.mode == "offline" and self.run_dirs:
            status["sync_command"] = "wandb sync " + " ".join(sorted(self.run_dirs.values()))
        return status
