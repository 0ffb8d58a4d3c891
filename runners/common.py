"""What every runner does the same way: turn a composed config into an engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dspark.config import ConfigError, DrafterConfig, EngineConfig
from runners.schema import to_engine_config

ASSETS = Path(__file__).resolve().parents[1] / "dspark" / "assets"


def resolve_drafter_path(path: str | None) -> str | None:
    """'builtin:NAME' -> the checkpoint shipped in dspark/assets/NAME; other values are paths."""
    if path is None or path == "random":
        return path
    if path.startswith("builtin:"):
        name = path.split(":", 1)[1]
        folder = ASSETS / name
        if not (folder / "config.json").exists():
            raise ConfigError(f"drafter.path: the shipped drafter {name!r} is not in {ASSETS}; train one with "
                              f"`python -m runners.train_drafter`, point drafter.path at a checkpoint folder, "
                              f"use drafter.path=random (lossless checks only), or run spec=off")
        return str(folder)
    if not Path(path).is_dir():
        raise ConfigError(f"drafter.path: {path!r} is not a folder holding a drafter checkpoint (config.json + safetensors)")
    return path


def build_engine(cfg: Any, engine_cfg: EngineConfig | None = None, seed: int = 0):
    """Engine from a composed config with model/drafter/engine groups (and optional top-level spec)."""
    from dspark.engine import Engine
    from dspark.model_runner import DTYPES
    from dspark.models.drafter import DSparkDrafter
    from dspark.models.llama import TargetModel
    from dspark.models.loading import load_target_weights

    if engine_cfg is None:
        engine_cfg = to_engine_config(cfg.engine, spec=cfg.get("spec"))
    drafter_path = resolve_drafter_path(cfg.drafter.path) if engine_cfg.spec == "dspark" else None
    if engine_cfg.spec == "dspark" and drafter_path is None:
        raise ConfigError("spec=dspark needs a drafter: choose drafter=dspark_smollm2 or set drafter.path, "
                          "or run spec=off")
    mcfg, state, tokenizer = load_target_weights(cfg.model.source, cache_dir=cfg.model.cache_dir)
    target = TargetModel(mcfg)
    target.load_hf_state_dict(state)
    drafter = None
    if drafter_path == "random":
        torch.manual_seed(seed)
        n = mcfg.num_layers
        drafter = DSparkDrafter(mcfg, DrafterConfig(target_layer_ids=(1, n // 2, n - 2)))
    elif drafter_path is not None:
        drafter = DSparkDrafter.load(drafter_path, mcfg, device=engine_cfg.device, dtype=DTYPES[engine_cfg.dtype])
    return Engine(target, tokenizer, engine_cfg, drafter)
