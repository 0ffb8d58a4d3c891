"""Drafter training: the DSpark loss and the post-hoc calibration (STS) of its confidence head.

Both modules take plain tensors and know nothing of the drafter or target modules.
"""

from dspark.training.calibration import (
    calibration_report,
    cumulative_survival,
    expected_calibration_error,
    fit_sequential_temperatures,
    load_temperatures,
    reliability_plot,
    roc_auc,
    save_temperatures,
)
from dspark.training.loss import LossOutput, analytical_acceptance, dspark_loss, position_weights

__all__ = [
    "LossOutput", "analytical_acceptance", "calibration_report", "cumulative_survival", "dspark_loss",
    "expected_calibration_error", "fit_sequential_temperatures", "load_temperatures", "position_weights",
    "reliability_plot", "roc_auc", "save_temperatures",
]
