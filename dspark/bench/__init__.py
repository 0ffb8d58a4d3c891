"""A/B benchmarking library: schedules, metrics, statistics, guards, fingerprints, W&B, reports.

The A/B runner (``runners/ab.py``) runs both arms in one process over the same requests
in a block schedule (:mod:`.schedule`), turns each arm's request records into per-block
metrics (:mod:`.metrics`), compares the arms on paired per-block log-ratios
(:mod:`.statistics`), refuses to report a speed-up that changed outputs or never
exercised the feature (:mod:`.guards`), records where it ran (:mod:`.fingerprint`),
logs to W&B without risking local results (:mod:`.wandb_log`) and writes reports
(:mod:`.report`). Nothing here imports torch at module level or Hydra at all.
"""

from dspark.bench.guards import (ABGuardError, GuardResult, did_nothing_guard, errors_guard, lossless_guard,
                                 raise_on_failure, trim_expected)
from dspark.bench.metrics import RequestRecord, aggregate_block, request_metrics, requests_dataframe
from dspark.bench.schedule import build_schedule, first_arm_by_block, position_in_block
from dspark.bench.statistics import ABStatistics, bca_interval, blocks_needed, compare_arms, compare_blocks

__all__ = [
    "ABGuardError", "ABStatistics", "GuardResult", "RequestRecord", "aggregate_block", "bca_interval",
    "blocks_needed", "build_schedule", "compare_arms", "compare_blocks", "did_nothing_guard", "errors_guard",
    "first_arm_by_block", "lossless_guard", "position_in_block", "raise_on_failure", "request_metrics",
    "requests_dataframe", "trim_expected",
]
