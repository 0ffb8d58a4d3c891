"""Hydra callbacks of the runners (registered under ``hydra.callbacks`` in conf/ab.yaml).

:class:`SweepSummaryCallback` writes the sweep summary when a multirun ends: every job's
``summary.json`` under ``hydra.sweep.dir`` is collected into ``sweep_summary.md``,
``sweep_summary.csv`` and ``sweep_gain.png`` (:func:`dspark.bench.report.write_sweep_report`),
whose table names each job by the name its folder has after the job number (what the sweep varies in
it, :mod:`runners.sweep_dirs`), keeps each job's full overrides in the csv's ``overrides`` column and
marks each job whose guards failed. Then, when a job recorded a non-zero exit code
(its guards failed and ``ab.fail_on_guard`` is set: :mod:`runners.job_status`), it logs those jobs
and ends the multirun with exit status 1.

A job whose guards fail, or whose settings or inputs it cannot run with, does not stop the sweep (it records
why in its job status); a job that raises anything else (an arm crashed) does, as in any Hydra sweep, and Hydra
calls no ``on_multirun_end``: then ``python -m runners.report SWEEP_DIR`` summarizes the jobs that finished.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class SweepSummaryCallback(Callback):
    """After a multirun, summarize its jobs in the sweep folder; exit 1 when one of them failed."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from dspark.bench.report import write_sweep_report
        from runners.job_status import JOB_STATUS_FILE, failed_jobs

        sweep_dir = Path(str(config.hydra.sweep.dir))
        failed = failed_jobs(sweep_dir)
        try:  # (raises naming the folder when no job wrote a summary.json)
            paths = write_sweep_report(sweep_dir, failed_jobs=failed)
            log.info("sweep summary: %s (all metrics: %s, plot: %s)", paths["markdown"], paths["csv"], paths["plot"])
        except Exception as exc:  # noqa: BLE001  (the jobs' own results stand; their status is still reported)
            log.warning("no sweep summary written: %s: %s", type(exc).__name__, exc)
        if failed:
            log.error("%d job(s) of the sweep failed (their %s; results and summary.json are in each folder): %s",
                      len(failed), JOB_STATUS_FILE, "; ".join(f"{job}: {why}" for job, why in failed.items()))
            # SystemExit passes Hydra's handling of callback errors (which only warns), so the process ends with it.
            raise SystemExit(1)
