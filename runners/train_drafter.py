"""Train a DSpark (or DFlash-style ablation) drafter for the target on regenerated data.

    python -m runners.train_drafter data=training_data/train.safetensors train.output_dir=runs/dspark
    python -m runners.train_drafter ... train.device=cuda train.batch_size=32        # on the H200
    python -m runners.train_drafter ... resume=true                                   # continue the run
    python -m runners.train_drafter ... style=dflash                                  # ablation

``style=dflash`` trains the same backbone the same way without the Markov head
(markov_rank 0) and without the confidence head. Checkpoints go to
``train.output_dir/checkpoint-NNNNNNN/`` (loadable as drafters); the final drafter alone
is also written to ``train.output_dir/final/``. ``data_holdout_fraction`` > 0 keeps a
seeded part of the data out of training for ``runners.calibrate`` (same fraction and seed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from dspark.config import ConfigError, DrafterConfig
from dspark.models.drafter import DSparkDrafter
from dspark.models.llama import TargetModel
from dspark.training.data import TokenDataset
from dspark.training.trainer import DrafterTrainer, TrainConfig, complete_checkpoints, shard_data_budget
from runners.schema import ModelSchema

STYLES = ("dspark", "dflash")


@dataclass
class DrafterArchSchema:
    block_size: int = 7
    num_layers: int = 2
    target_layer_ids: List[int] = field(default_factory=lambda: [2, 15, 27])
    markov_rank: int = 64
    markov_variant: str = "vanilla"
    use_confidence_head: bool = True
    intermediate_size: Optional[int] = None
    mask_token_id: Optional[int] = None


@dataclass
class TrainSchema:
    output_dir: str = "runs/drafter"
    max_steps: int = 2000
    batch_size: int = 16
    max_len: int = 1024
    anchors_per_seq: int = 32
    require_full_block: bool = True
    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.01
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0
    ce_weight: float = 0.1
    tv_weight: float = 0.9
    conf_weight: float = 1.0
    position_decay: Optional[float] = 4.0
    seed: int = 0
    device: str = "cpu"
    bf16_autocast: bool = True
    pad_id: int = 0
    save_every: int = 500
    log_every: int = 10
    keep_last: int = 2
    max_shard_bytes: int = 16 * 1024 * 1024
    progress: bool = True
    time_budget_s: Optional[float] = None  # stop with a checkpoint after this many seconds (leased GPUs)


@dataclass
class TrainDrafterSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    drafter_arch: DrafterArchSchema = field(default_factory=DrafterArchSchema)
    train: TrainSchema = field(default_factory=TrainSchema)
    data: Any = None  # a .safetensors file, or a list of them (shards), joined in order
    data_holdout_fraction: float = 0.0
    data_holdout_seed: int = 0
    style: str = "dspark"
    resume: bool = False
    init_from: Optional[str] = None  # start from these drafter weights (fresh optimizer and schedule)
    stop_at_step: Optional[int] = None


ConfigStore.instance().store(name="train_drafter_schema", node=TrainDrafterSchema)


def drafter_config_from(cfg: Any) -> DrafterConfig:
    """DrafterConfig from ``cfg.drafter_arch`` with the ``style`` switch applied."""
    style = cfg.style
    if style not in STYLES:
        raise ConfigError(f"style: {style!r} not in {list(STYLES)}")
    arch = OmegaConf.to_container(cfg.drafter_arch, resolve=True) if isinstance(cfg.drafter_arch, DictConfig) \
        else dict(cfg.drafter_arch)
    if style == "dflash":
        arch["markov_rank"] = 0
        arch["use_confidence_head"] = False
    return DrafterConfig.from_dict(arch)


def train_config_from(cfg: Any) -> TrainConfig:
    d = OmegaConf.to_container(cfg.train, resolve=True) if isinstance(cfg.train, DictConfig) else dict(cfg.train)
    d["betas"] = tuple(d["betas"])
    return TrainConfig.from_dict(d)


def load_training_data(cfg: Any) -> TokenDataset:
    if not cfg.data:
        raise ConfigError("data: give the training data file, e.g. data=training_data/train.safetensors "
                          "(make it with `python -m runners.make_training_data`)")
    dataset = TokenDataset.load_many(cfg.data)
    if cfg.data_holdout_fraction:
        dataset, _ = dataset.split_holdout(float(cfg.data_holdout_fraction), int(cfg.data_holdout_seed))
    return dataset


def load_target_and_tokenizer(cfg: Any):
    """(TargetModel, Tokenizer) named by cfg.model (the packaged SmolLM2 or a local HF folder)."""
    from dspark.models.loading import load_target_weights

    mcfg, state, tokenizer = load_target_weights(cfg.model.source, cache_dir=cfg.model.cache_dir)
    target = TargetModel(mcfg)
    target.load_hf_state_dict(state)
    return target, tokenizer


def init_weights(drafter: DSparkDrafter, path: str, target: TargetModel) -> None:
    """Copy a saved drafter's weights into ``drafter``; the architectures must be identical."""
    from runners.common import resolve_drafter_path

    source = DSparkDrafter.load(resolve_drafter_path(path), target.cfg, device="cpu", dtype=torch.float32)
    want, got = drafter.cfg.to_dict(), source.cfg.to_dict()
    diff = {k: (got.get(k), want.get(k)) for k in set(want) | set(got) if want.get(k) != got.get(k)}
    if diff:
        raise ConfigError(f"init_from={path!r}: its architecture differs from drafter_arch/style "
                          f"(key: (checkpoint, configured)): {diff}")
    drafter.load_state_dict(source.state_dict())


def run(cfg: Any, target: TargetModel | None = None) -> dict[str, Any]:
    """Train as configured; ``target`` overrides loading cfg.model (tests pass a tiny one)."""
    train_cfg = train_config_from(cfg)
    drafter_cfg = drafter_config_from(cfg)
    dataset = load_training_data(cfg)
    if target is None:
        target, _ = load_target_and_tokenizer(cfg)
    out = Path(train_cfg.output_dir)
    existing = complete_checkpoints(out)
    if existing and not cfg.resume:
        raise ConfigError(f"train.output_dir {str(out)!r} already holds checkpoints ({existing[-1].name}); set "
                          f"resume=true to continue that run or choose another train.output_dir")
    torch.manual_seed(train_cfg.seed)
    drafter = DSparkDrafter(target.cfg, drafter_cfg)
    init_from = cfg.get("init_from")
    if init_from and not cfg.resume:
        init_weights(drafter, init_from, target)
    extra = {"init_from": init_from, "style": cfg.style, "data": str(cfg.data), "data_holdout_fraction": float(cfg.data_holdout_fraction),
             "data_holdout_seed": int(cfg.data_holdout_seed)}
    trainer = DrafterTrainer(target, drafter, dataset, train_cfg, extra_state=extra)
    resumed_from = None
    if cfg.resume:
        resumed_from = str(trainer.resume_latest())
        if trainer.extra_state.get("style") != cfg.style:
            raise ConfigError(f"cannot resume: the checkpoint was trained with style={trainer.extra_state.get('style')}, "
                              f"now style={cfg.style}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "run_config.json").write_text(json.dumps(
        {"train": train_cfg.to_dict(), "drafter": drafter_cfg.to_dict(), **extra}, indent=2) + "\n")
    metrics = trainer.train(until_step=cfg.stop_at_step)
    summary: dict[str, Any] = {
        "output_dir": str(out.resolve()),
        "style": cfg.style,
        "step": trainer.step,
        "max_steps": train_cfg.max_steps,
        "resumed_from": resumed_from,
        "drafter_parameters": drafter.num_parameters(),
        "data": dataset.summary(),
        "last_metrics": metrics,
    }
    stopped_by_budget = "stopped_by_time_budget" in trainer.extra_state
    summary["stopped_by_time_budget"] = stopped_by_budget
    if trainer.step >= train_cfg.max_steps or stopped_by_budget:
        # A budget-stopped run is still a usable drafter (its step count is in the summary and model card).
        final = trainer.drafter.save(out / "final", max_shard_bytes=shard_data_budget(train_cfg.max_shard_bytes))
        summary["final_drafter"] = str(final.resolve())
    summary["checkpoint"] = str(complete_checkpoints(out)[-1].resolve()) if complete_checkpoints(out) else None
    return summary


@hydra.main(version_base="1.3", config_path="../conf", config_name="train_drafter")
def main(cfg: DictConfig) -> None:
    print(json.dumps(run(cfg), indent=2))


if __name__ == "__main__":
    main()
