"""Weights & Biases logging of A/B runs, built so that W&B can never lose local results.

One W&B group per A/B job and one run per arm in it, named by :mod:`dspark.bench.wandb_names`
(group ``<experiment>/<run folder>`` or ``<experiment>/<sweep folder>/job<N>``; run names saying the
arm, what it runs and the job). Both runs stay open while the ABBA schedule alternates between them.
Each run gets:

- config: the composed configuration of the job, plus the arm, its label, the job and the sweep;
- history: one row per timed block of the arm (step = block index); nested values go to W&B as
  they are (W&B shows them as dotted keys, and stores NaN and infinities itself);
- the table ``requests`` (one row per request of the arm), logged into the last block's history row;
- the B-vs-A statistics (:meth:`WandbLogger.log_statistics`): the summary's ``statistics`` (per
  metric: change, CI, Wilcoxon p, MDE, verdict, ...), ``verdict`` and ``headline_metric``, and the
  table ``statistics_table`` (in the last block's row too: the history has one row per block, no other);
- the job's result files (summary.json, report.md, blocks.csv, the plots) as an artifact of type
  ``ab-results`` (:meth:`WandbLogger.log_results`).

Mode: the ``mode`` argument, or when it is None the ``WANDB_MODE`` environment variable, else
"offline". The A/B config's default is ``wandb.mode: ${oc.env:WANDB_MODE,offline}``, so for
``runners.ab`` the precedence is: ``wandb.mode`` set on the command line (or in a config file) >
``WANDB_MODE`` > offline. Offline runs land in ``<dir>/wandb/offline-run-*`` (``dir`` is handed to
``wandb.init`` as is) and ``wandb sync`` uploads them later (:meth:`WandbLogger.status` gives the
command). An artifact's files are staged in wandb's data folder (``WANDB_DATA_DIR``, by default
``~/.local/share/wandb``) until the upload, so an offline run is synced from the machine it ran on.

W&B report (``report=True``): when the runs were online, :meth:`WandbLogger.close` builds a W&B
report of the group (:mod:`dspark.bench.wandb_report`). Offline or disabled runs cannot have one yet:
the logger warns, and :meth:`WandbLogger.status` says why under "report" and gives the command that
makes it after ``wandb sync`` (``python -m runners.wandb_report ...``). A report that cannot be made
online (no package, the server out of reach) is reported the same way; it never stops the benchmark.

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
import os
import shlex
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

from dspark.bench.metrics import RequestRecord, requests_dataframe
from dspark.bench.wandb_names import RESULTS_ARTIFACT_TYPE, ABRunNames

log = logging.getLogger(__name__)

WANDB_MODES = ("offline", "online", "disabled")
# The files of a job's output folder logged as its results artifact (patterns, relative to the folder).
RESULT_FILE_PATTERNS = ("summary.json", "report*.md", "blocks.csv", "*.png")
STATISTICS_COLUMNS = ("metric", "direction", "n_blocks", "change_pct", "ci_low_pct", "ci_high_pct", "ci_level",
                      "ci_method", "wilcoxon_p", "mde_pct", "order_effect_pct", "order_effect_flagged", "verdict",
                      "verdict_reason")


def resolve_mode(mode: str | None) -> str:
    """The explicit ``mode``, else the ``WANDB_MODE`` environment variable, else "offline"."""
    resolved = mode if mode is not None else os.environ.get("WANDB_MODE", "offline")
    if resolved not in WANDB_MODES:
        source = "mode argument" if mode is not None else "WANDB_MODE environment variable"
        raise ValueError(f"W&B mode {resolved!r} (from the {source}) is not supported; use one of {list(WANDB_MODES)}")
    return resolved


def _has_api_key() -> bool:
    """Whether wandb finds credentials for its server without asking: WANDB_API_KEY, the netrc file that
    `wandb login` writes, or wandb's settings files (wandb's own lookup; nothing is changed or sent)."""
    from wandb.sdk import wandb_setup
    from wandb.sdk.lib import wbauth

    host = wandb_setup.singleton().settings.base_url
    return wbauth.authenticate_session(host=host, source="dspark-bench", prompt=False, update_session=False) is not None


def _report_command(entity: str | None, project: str, group: str | None) -> str:
    target = f"{entity}/{project}" if entity else project
    return f"python -m runners.wandb_report {shlex.quote(target)} {shlex.quote(group or '<group>')}"


class WandbLogger:
    """Per-arm W&B runs of one A/B job; see the module docstring for what is logged and the failure policy.

    ``names``: the group and run names (:func:`dspark.bench.wandb_names.ab_run_names`); None: no group,
    each run named after its arm. ``dir``: the folder handed to ``wandb.init`` (its runs go to
    ``dir/wandb``); None: wandb's default (``WANDB_DIR``, else the working folder).
    """

    def __init__(self, mode: str | None = None, project: str = "dspark-bench", entity: str | None = None,
                 tags: Iterable[str] = (), notes: str | None = None, report: bool = False,
                 names: ABRunNames | None = None, dir: str | Path | None = None) -> None:
        self.mode = resolve_mode(mode)
        if self.mode == "online" and not _has_api_key():
            raise RuntimeError("W&B mode is 'online' but no API key is configured: set WANDB_API_KEY "
                               "(or run `wandb login`), or use wandb mode 'offline' and `wandb sync` later")
        self.project = project
        self.entity = entity
        self.notes = notes
        self.report = bool(report)
        self.names = names
        self.tags = names.tags(tags) if names is not None else list(dict.fromkeys(tags))
        self.dir = Path(dir) if dir is not None else None
        self.failures: list[dict[str, str]] = []
        self.run_dirs: dict[str, str] = {}
        self.run_urls: dict[str, str] = {}
        self.stopped: dict[str, str] | None = None  # set once by a storage failure; see the module docstring
        self.report_status: dict[str, Any] | None = None  # set by close() when report=True
        self._runs: dict[str, Any] = {}
        self._last_step: dict[str, int] = {}  # per arm: the last block's history step
        self._server_entity: str | None = None  # the entity an online run was logged to
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
    def group(self) -> str | None:
        return self.names.group if self.names is not None else None

    @property
    def folder(self) -> str:
        """The W&B folder: where wandb.init writes its run folders (``<dir>/wandb``)."""
        root = self.dir if self.dir is not None else Path(os.path.abspath(os.environ.get("WANDB_DIR") or "."))
        return str(root / "wandb")

    def _probe_folder(self, call: str, arm: str = "all") -> bool:
        """Create the W&B folder and write one byte there; a failure stops W&B (False)."""
        if self.dir is None:
            return True
        try:
            Path(self.folder).mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.folder) as fh:
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

    def start_arm(self, arm: str, config: Mapping[str, Any]) -> None:
        """Open the run of ``arm``; ``config`` is the composed configuration of the job."""
        if not self.enabled or self.stopped is not None or not self._probe_folder("the folder check", arm):
            return
        names = self.names
        identity = names.run_config(arm) if names else {"arm": arm}

        def start() -> None:
            run = self._wandb.init(
                project=self.project, entity=self.entity, group=self.group,
                job_type=names.job_type(arm) if names else arm, name=names.run_name(arm) if names else arm,
                tags=self.tags, notes=self.notes, config={**config, **identity},
                dir=str(self.dir) if self.dir is not None else None, mode=self.mode, reinit="create_new")
            self._runs[arm] = run
            self.run_dirs[arm] = str(Path(run.dir).parent)
            if self.mode == "online":
                self.run_urls[arm] = run.url
                self._server_entity = run.entity
            self._watch_log_files()

        self._guarded("start_arm", arm, start)

    def log_block(self, arm: str, block_index: int, metrics: Mapping[str, Any]) -> None:
        """Log one block's aggregate metrics of ``arm`` as a history row (step = block index)."""
        if self.enabled:
            self._last_step[arm] = max(int(block_index), self._last_step.get(arm, 0))
            self._guarded("log_block", arm, lambda: self._run(arm).log(
                {"block": block_index, **metrics}, step=int(block_index)))

    def _log_at_last_block(self, arm: str, data: Mapping[str, Any]) -> None:
        """Log ``data`` (tables) into the arm's last block row: the history keeps one row per block, none
        after them holding only the tables."""
        self._run(arm).log(dict(data), step=self._last_step.get(arm, 0))

    def log_requests(self, arm: str, records: Iterable[RequestRecord] | pd.DataFrame) -> None:
        """Log the per-request table of ``arm`` (a list of records or a requests DataFrame)."""
        if not self.enabled:
            return

        def log_table() -> None:
            frame = records if isinstance(records, pd.DataFrame) else requests_dataframe(records)
            frame = frame.astype(object).where(frame.notna(), None)
            self._log_at_last_block(arm, {"requests": self._wandb.Table(dataframe=frame)})

        self._guarded("log_requests", arm, log_table)

    def log_statistics(self, statistics: Mapping[str, Mapping[str, Any]], verdict: str,
                       headline_metric: str) -> None:
        """Log the B-vs-A comparison to every open run: the summary's ``statistics`` (metric -> the fields of
        :class:`dspark.bench.statistics.ABStatistics`), ``verdict`` and ``headline_metric``, and the table
        ``statistics_table`` (one row per metric, :data:`STATISTICS_COLUMNS`)."""
        if not self.enabled:
            return
        rows = [[s.get(c) if c != "metric" else metric for c in STATISTICS_COLUMNS] for metric, s in statistics.items()]
        for arm in list(self._runs):
            def log_arm(arm: str = arm) -> None:
                run = self._run(arm)
                self._log_at_last_block(arm, {"statistics_table": self._wandb.Table(columns=list(STATISTICS_COLUMNS),
                                                                                    data=rows)})
                run.summary.update({"statistics": {m: dict(s) for m, s in statistics.items()}, "verdict": verdict,
                                    "headline_metric": headline_metric})

            self._guarded("log_statistics", arm, log_arm)

    def log_results(self, folder: str | Path) -> None:
        """Log the result files of the job's output ``folder`` (:data:`RESULT_FILE_PATTERNS`: summary.json,
        the report's markdown files, blocks.csv, the plots) as one artifact, an output of every open run."""
        if not self.enabled:
            return
        folder = Path(folder)
        files = sorted({p for pattern in RESULT_FILE_PATTERNS for p in folder.glob(pattern) if p.is_file()})
        name = self.names.results_artifact if self.names is not None else f"ab-results-{folder.name}"
        for arm in list(self._runs):
            def log_arm(arm: str = arm) -> None:
                artifact = self._wandb.Artifact(name, type=RESULTS_ARTIFACT_TYPE,
                                                description=f"Result files of the A/B job {self.group or folder.name}",
                                                metadata={"group": self.group, "folder": str(folder)})
                for path in files:
                    artifact.add_file(str(path), name=path.name)
                self._run(arm).log_artifact(artifact)

            self._guarded("log_results", arm, log_arm)

    def finish_arm(self, arm: str, summary: Mapping[str, Any]) -> None:
        """Write ``summary`` (plus the number of W&B failures so far) to the arm's run and close it."""
        if not self.enabled:
            return

        def finish() -> None:
            run = self._run(arm)
            run.summary.update({**summary, "wandb_failures": len(self.failures)})
            run.finish()
            del self._runs[arm]

        self._guarded("finish_arm", arm, finish)

    def close(self) -> None:
        """Finish runs still open (marked unfinished), flush W&B to disk and, with report=True, make the
        W&B report (or record why it cannot be made yet); call once at the end.

        W&B writes the offline run log asynchronously; only after this call is every
        logged value guaranteed to be in the run folder.
        """
        if not self.enabled:
            if self.report:
                self._report_unavailable("W&B is disabled (wandb.mode=disabled): there are no runs to report on")
            return
        if self.stopped is None:
            for arm in list(self._runs):
                self._guarded("close", arm, lambda arm=arm: self._runs.pop(arm).finish(exit_code=1))
                self.failures.append({"call": "close", "arm": arm,
                                      "error": "finish_arm was never called; the run was closed as unfinished"})
            if self.stopped is None:
                self._guarded("close", "all", self._wandb.teardown)
                if self.report and self.report_status is None:
                    self._make_report()
                return
        self._close_runs_quietly()  # stopped: shut W&B down without a word on the console
        raise_exceptions, logging.raiseExceptions = logging.raiseExceptions, False
        try:
            self._wandb.teardown()
        except Exception:
            pass
        finally:
            logging.raiseExceptions = raise_exceptions
        if self.report and self.report_status is None:
            self._report_unavailable(f"W&B logging stopped ({self.stopped['error']}): the runs are incomplete")

    @property
    def report_command(self) -> str:
        """The command that makes the W&B report of this job once its runs are on the server."""
        return _report_command(self.entity or self._server_entity, self.project, self.group)

    def _report_unavailable(self, reason: str) -> None:
        self.report_status = {"url": None, "reason": reason, "command": self.report_command}
        log.warning("W&B report not made: %s. Once the runs are on the W&B server, make it with: %s", reason,
                    self.report_command)

    def _make_report(self) -> None:
        """The W&B report of the group (online runs), or a warning saying why there is none yet."""
        if self.mode != "online":
            self._report_unavailable(f"the runs are {self.mode}; a W&B report is made from runs on the W&B server "
                                     f"(upload them first: {self.status().get('sync_command', 'wandb sync')})")
            return
        if not self.run_dirs or self.group is None:
            self._report_unavailable("no W&B run of this job was started")
            return
        from dspark.bench.wandb_report import ReportUnavailable, publish_report

        try:
            url = publish_report(self.project, self.group, entity=self.entity or self._server_entity)
        except ReportUnavailable as exc:
            self._report_unavailable(str(exc))
            return
        self.report_status = {"url": url, "reason": None, "command": self.report_command}
        log.info("W&B report of %s: %s", self.group, url)

    def __enter__(self) -> "WandbLogger":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def status(self) -> dict[str, Any]:
        """What to put in the experiment summary: mode, project, entity, group, run names, tags, run folders
        (and URLs, online), every failure, "stopped" (None, or where and why W&B logging stopped for the rest
        of the run: call, arm, folder, error, message), "report" (None without report=True; else its URL, or
        why there is none and the command that makes it), and for offline runs the commands that upload them
        and then make their report."""
        status = {"mode": self.mode, "project": self.project, "entity": self.entity, "group": self.group,
                  "run_names": {arm: self.names.run_name(arm) for arm in self.run_dirs} if self.names else {},
                  "tags": list(self.tags), "run_dirs": dict(self.run_dirs), "run_urls": dict(self.run_urls),
                  "failures": list(self.failures), "stopped": None if self.stopped is None else dict(self.stopped),
                  "report": None if self.report_status is None else dict(self.report_status)}
        if self.mode == "offline" and self.run_dirs:
            status["sync_command"] = "wandb sync " + " ".join(shlex.quote(d) for d in sorted(self.run_dirs.values()))
            status["report_command"] = self.report_command
        return status
