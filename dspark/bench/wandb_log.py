"""Weights & Biases logging for A/B runs, built so that W&B can never lose local results.

One W&B run per arm per experiment: ``group`` = the experiment, ``job_type`` = the arm,
so the W&B UI compares arms side by side. Both runs stay open while the ABBA schedule
alternates between them.

Every call into W&B after construction is wrapped: a failure is logged as a warning,
appended to :attr:`WandbLogger.failures` (which the runner puts in its summary) and the
benchmark continues. Configuration mistakes (an unknown mode, "online" without an API
key) raise at construction, before any measurement is at stake.
"""

from __future__ import annotations

import logging
import math
import netrc
import os
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
        self._runs: dict[str, Any] = {}
        self._wandb = None
        if self.mode != "disabled":
            try:
                import wandb
            except ImportError as exc:
                raise ImportError("wandb is not installed: `pip install wandb`, or set the W&B mode to "
                                  "'disabled'") from exc
            self._wandb = wandb
            if self.dir is not None:
                self.dir.mkdir(parents=True, exist_ok=True)

    @property
    def enabled(self) -> bool:
        return self.mode != "disabled"

    def _guarded(self, call: str, arm: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
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
        if not self.enabled:
            return

        def start() -> None:
            run = self._wandb.init(project=self.project, group=self.group, job_type=job_type,
                                   name=f"{self.group}-{arm}" if self.group else arm, config=dict(config),
                                   dir=str(self.dir) if self.dir is not None else None, mode=self.mode,
                                   reinit="create_new")
            self._runs[arm] = run
            self.run_dirs[arm] = str(Path(run.dir).parent)

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
        for arm in list(self._runs):
            self._guarded("close", arm, lambda arm=arm: self._runs.pop(arm).finish(exit_code=1))
            self.failures.append({"call": "close", "arm": arm,
                                  "error": "finish_arm was never called; the run was closed as unfinished"})
        self._guarded("close", "all", self._wandb.teardown)

    def __enter__(self) -> "WandbLogger":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def status(self) -> dict[str, Any]:
        """What to put in the experiment summary: mode, run folders, and every failure."""
        status = {"mode": self.mode, "project": self.project, "group": self.group, "run_dirs": dict(self.run_dirs),
                  "failures": list(self.failures)}
        if self.mode == "offline" and self.run_dirs:
            status["sync_command"] = "wandb sync " + " ".join(sorted(self.run_dirs.values()))
        return status
