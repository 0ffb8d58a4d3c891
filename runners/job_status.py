"""How each job of a Hydra multirun ended, for the end of the sweep.

A multirun job whose guards fail returns instead of raising (Hydra's sweepers stop the whole sweep at
a job that raises): its ``job_status.json`` says ``{"exit_code": 1, "error": ...}`` (a job that
passed: ``{"exit_code": 0}``), the remaining jobs run, and at the end
:class:`runners.callbacks.SweepSummaryCallback` writes the sweep summary, then exits 1 naming the
failed jobs. The file is rewritten by every run of the job, so a rerun's status replaces the last.
"""

from __future__ import annotations

import json
from pathlib import Path

from dspark.atomic import atomic_write_text

JOB_STATUS_FILE = "job_status.json"


def in_multirun() -> bool:
    """Whether this process runs a job of a Hydra multirun (``-m``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def write_job_status(out_dir: str | Path, exit_code: int, error: str | None = None) -> Path:
    """Record in ``out_dir`` how its job ended: the exit code a single run would have had, and why."""
    status: dict = {"exit_code": int(exit_code)}
    if error is not None:
        status["error"] = error
    path = Path(out_dir) / JOB_STATUS_FILE
    atomic_write_text(path, json.dumps(status, indent=2) + "\n")
    return path


def failed_jobs(sweep_dir: str | Path) -> dict[str, str]:
    """``{job folder: error}`` of the jobs of ``sweep_dir`` whose recorded exit code is not 0."""
    failed = {}
    for path in sorted(Path(sweep_dir).glob(f"*/{JOB_STATUS_FILE}")):
        try:
            status = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            failed[path.parent.name] = f"unreadable {JOB_STATUS_FILE}: {exc}"
            continue
        if status.get("exit_code", 0) != 0:
            failed[path.parent.name] = str(status.get("error", f"exit code {status['exit_code']}"))
    return failed
