"""Calibrate a trained drafter's confidence head by sequential temperature scaling (STS).

    python -m runners.calibrate checkpoint=runs/dspark/final data=training_data/eval.safetensors
    python -m runners.calibrate checkpoint=DIR data=training_data/train.safetensors holdout_fraction=0.05

On held-out sequences (an eval-split data file, or the part of a training file that
``runners.train_drafter data_holdout_fraction=F`` kept out: same fraction and seed), the
drafter drafts greedily at sampled anchors and the target verifies every full block
greedily (:func:`dspark.training.trainer.greedy_block_acceptance`). STS is fitted on the
raw confidence logits against the realised acceptance, ``temperatures.json`` is written
into the checkpoint folder, and AUC / ECE before and after go to ``calibration.json``
plus a reliability diagram ``reliability.png`` (both beside the checkpoint by default).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from dspark.config import ConfigError
from dspark.model_runner import DTYPES
from dspark.models.drafter import DSparkDrafter
from dspark.models.llama import TargetModel
from dspark.training.calibration import (calibration_report, fit_sequential_temperatures, reliability_plot,
                                         save_temperatures)
from dspark.training.data import TokenDataset
from dspark.training.trainer import greedy_block_acceptance
from runners.schema import ModelSchema


@dataclass
class CalibrateSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    checkpoint: Optional[str] = None
    data: Any = None  # a .safetensors file or a list of them (shards), as given to train_drafter
    holdout_fraction: Optional[float] = None  # take the held-out part of a training file instead of all of it
    holdout_seed: int = 0
    max_sequences: Optional[int] = None
    anchors_per_seq: int = 16
    batch_size: int = 8
    max_len: int = 1024
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    n_grid: int = 100
    t_min: float = 0.2
    t_max: float = 10.0
    n_bins: int = 15
    output_json: Optional[str] = None  # default: CHECKPOINT/calibration.json
    plot: Optional[str] = None  # default: CHECKPOINT/reliability.png
    progress: bool = True


ConfigStore.instance().store(name="calibrate_schema", node=CalibrateSchema)


def held_out_data(cfg: Any) -> TokenDataset:
    if not cfg.data:
        raise ConfigError("data: give held-out sequences, e.g. data=training_data/eval.safetensors (made by "
                          "`python -m runners.make_training_data split=eval`)")
    dataset = TokenDataset.load_many(cfg.data)  # one file, or the list of shards the training run used
    if cfg.holdout_fraction:
        _, dataset = dataset.split_holdout(float(cfg.holdout_fraction), int(cfg.holdout_seed))
    elif dataset.info.get("split") == "train":
        print(f"warning: {cfg.data} holds TRAIN-split prompts and no holdout_fraction is set; calibrate on "
              f"data the drafter did not train on (split=eval data, or the training run's holdout)")
    if cfg.max_sequences is not None:
        dataset = dataset.subset(range(min(int(cfg.max_sequences), len(dataset))))
    return dataset


def write_temperatures(checkpoint: Path, temperatures: torch.Tensor, drafter: DSparkDrafter, *,
                       ece_before: float | None = None, ece_after: float | None = None) -> Path:
    """Write temperatures.json (calibration.save_temperatures' format, which DSparkDrafter.load reads)."""
    values = [float(t) for t in temperatures]
    drafter.set_confidence_temperatures(values)  # validates count and range
    return save_temperatures(checkpoint, values, ece_before=ece_before, ece_after=ece_after)


def calibrate(target: TargetModel, drafter: DSparkDrafter, dataset: TokenDataset, checkpoint: Path, cfg: Any
              ) -> dict[str, Any]:
    """Fit STS on ``dataset``, write temperatures.json into ``checkpoint``, return the report."""
    if drafter.confidence_head is None:
        raise ConfigError(f"checkpoint {checkpoint}: this drafter has no confidence head (DFlash-style ablation); "
                          f"there is nothing to calibrate")
    replay = greedy_block_acceptance(target, drafter, dataset, max_len=int(cfg.max_len),
                                     anchors_per_seq=int(cfg.anchors_per_seq), batch_size=int(cfg.batch_size),
                                     seed=int(cfg.seed), progress=bool(cfg.progress))
    z, accepted = replay["conf_logits"].double(), replay["accepted"].double()
    temperatures = fit_sequential_temperatures(z, accepted, n_grid=int(cfg.n_grid), t_min=float(cfg.t_min),
                                               t_max=float(cfg.t_max), n_bins=int(cfg.n_bins))
    report = calibration_report(z, accepted, temperatures, n_bins=int(cfg.n_bins))
    write_temperatures(checkpoint, temperatures, drafter, ece_before=report.get("ece_before"),
                       ece_after=report.get("ece_after"))
    plot_path = Path(cfg.plot) if cfg.plot else checkpoint / "reliability.png"
    reliability_plot(z, accepted, temperatures, plot_path, n_bins=int(cfg.n_bins))
    report.update({
        "checkpoint": str(checkpoint.resolve()),
        "sequences": len(dataset),
        "blocks": int(z.shape[0]),
        "greedy_mean_accept_length": float(replay["accept_length"].mean()),
        "reliability_plot": str(plot_path.resolve()),
    })
    out_json = Path(cfg.output_json) if cfg.output_json else checkpoint / "calibration.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(report, indent=2) + "\n")
    report["output_json"] = str(out_json.resolve())
    return report


def run(cfg: Any, target: TargetModel | None = None) -> dict[str, Any]:
    """Calibrate cfg.checkpoint; ``target`` overrides loading cfg.model (tests pass a tiny one)."""
    if not cfg.checkpoint:
        raise ConfigError("checkpoint: give the drafter folder to calibrate, e.g. checkpoint=runs/dspark/final")
    checkpoint = Path(cfg.checkpoint)
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"dtype: {cfg.dtype!r} not in {list(DTYPES)}")
    dataset = held_out_data(cfg)
    if target is None:
        from runners.train_drafter import load_target_and_tokenizer

        target, _ = load_target_and_tokenizer(cfg)
    dtype = DTYPES[cfg.dtype]
    target = target.to(device=cfg.device, dtype=dtype).eval()
    drafter = DSparkDrafter.load(checkpoint, target.cfg, device=cfg.device, dtype=dtype).eval()
    drafter.set_confidence_temperatures([1.0] * drafter.block_size)  # fit from the raw head
    with torch.no_grad():
        report = calibrate(target, drafter, dataset, checkpoint, cfg)
    return report


@hydra.main(version_base="1.3", config_path="../conf", config_name="calibrate")
def main(cfg: DictConfig) -> None:
    report = run(cfg)
    keys = ("blocks", "auc_overall", "ece_before", "ece_after", "temperatures", "greedy_mean_accept_length",
            "output_json", "reliability_plot")
    print(json.dumps({k: report[k] for k in keys}, indent=2))


if __name__ == "__main__":
    main()
