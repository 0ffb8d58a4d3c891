"""Hydra callbacks of the runners (registered under ``hydra.callbacks`` in conf/ab.yaml).

:class:`SweepSummaryCallback` writes the sweep summary when a multirun ends: every job's
``summary.json`` under ``hydra.sweep.dir`` is collected into ``sweep_summary.md``,
``sweep_summary.csv`` and ``sweep_gain.png`` (:func:`dspark.bench.report.write_sweep_report`).

Hydra calls ``on_multirun_end`` only when every job returned; when a job raised (an arm
crashed, a guard failed) the multirun stops with that error and no summary is written
here: ``python -m runners.report SWEEP_DIR`` summarizes the jobs that finished.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class SweepSummaryCallback(Callback):
    """After a multirun, summarize its jobs in the sweep folder."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from dspark.bench.report import write_sweep_report

        sweep_dir = Path(str(config.hydra.sweep.dir))
        paths = write_sweep_report(sweep_dir)  # raises naming the folder when no job wrote a summary.json
        log.info("sweep summary: %s (all metrics: %s, plot: %s)", paths["markdown"], paths["csv"], paths["plot"])
