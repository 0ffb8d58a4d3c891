"""Profile the step-cost table of this node, model, drafter and dtype.

    python -m runners.profile
    python -m runners.profile engine=h200 batch_sizes=[1,2,4,8,16,32,64,128,256] measure_steps=20 warmup_steps=5
    python -m runners.profile out=cost_tables/mine.json plot=cost_curve.png verify_lens=[0,1,3,5,7]

Writes the cost-table JSON (default: the fingerprint path under ``paths.cost_tables``, the
file :func:`dspark.profiler.find_or_profile` looks for), a PNG of step ms against M per
batch size, and ``profile.json`` (medians, samples, summary) in the run folder; prints the
recommended tier ladder for every profiled batch size and a summary. A flat table
(ProfileFlatError) or medians the additive model cannot fit (ProfileFitError) are refused
after ``refused_cost_curve.png`` and ``profile.json`` are written to the run folder.
See :mod:`dspark.profiler` for the method.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import List, Optional

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from dspark.config import ConfigError
from dspark.engine import Engine
from dspark.profiler import (ProfileRefusedError, cost_table_path_for, plot_cost_curve, profile_engine,
                             recommend_tier_ladder)
from runners.schema import DrafterSchema, EngineSchema, ModelSchema, PathsSchema, to_engine_config

log = logging.getLogger(__name__)


@dataclass
class ProfileSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    drafter: DrafterSchema = field(default_factory=DrafterSchema)
    engine: EngineSchema = field(default_factory=EngineSchema)
    paths: PathsSchema = field(default_factory=PathsSchema)
    batch_sizes: List[int] = field(default_factory=lambda: [1, 4, 16])
    verify_lens: Optional[List[int]] = None
    warmup_steps: int = 2
    measure_steps: int = 6
    prompt_len: int = 32
    seed: int = 0
    flat_rel_tol: float = 0.02
    max_drop_rel: float = 0.25
    monotone: str = "refuse"  # refuse | envelope (theta(M) -> cheapest cost at any M' >= M, logged)
    out: Optional[str] = None
    plot: Optional[str] = None
    progress: bool = True


ConfigStore.instance().store(name="profile_schema", node=ProfileSchema)


def _engine_from_cfg(cfg: DictConfig) -> Engine:
    from runners.common import build_engine

    engine_cfg = to_engine_config(cfg.engine)
    if engine_cfg.spec != "dspark":
        raise ConfigError(f"engine.spec={engine_cfg.spec!r}: profiling forces verify lengths of drafted tokens, so it "
                          "needs engine.spec=dspark and a drafter (drafter=dspark_smollm2 or drafter.path=...)")
    # This engine only holds the models and the configuration: the profile steps engines of its
    # own, each with a KV pool sized for the sweep, so this one gets the smallest pool there is
    # instead of the configured one (gigabytes at engine.kv_cache_tokens). No step cost depends on it.
    return build_engine(cfg, replace(engine_cfg, num_kv_blocks=2), seed=int(cfg.seed))


def run(cfg: DictConfig, engine: Engine | None = None) -> dict:
    """Profile, write the table + plot + profile.json, return the summary. ``engine``: test hook."""
    engine = engine if engine is not None else _engine_from_cfg(cfg)
    fingerprint = engine.fingerprint()
    out = Path(cfg.out) if cfg.out else cost_table_path_for(fingerprint, cfg.paths.cost_tables)
    plot = Path(cfg.plot) if cfg.plot else out.with_suffix(".png")
    run_dir = Path(cfg.paths.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    verify_lens = None if cfg.verify_lens is None else [int(v) for v in cfg.verify_lens]
    try:
        result = profile_engine(engine, batch_sizes=[int(b) for b in cfg.batch_sizes], verify_lens=verify_lens,
                                warmup_steps=int(cfg.warmup_steps), measure_steps=int(cfg.measure_steps),
                                prompt_len=int(cfg.prompt_len), seed=int(cfg.seed), progress=bool(cfg.progress),
                                flat_rel_tol=float(cfg.flat_rel_tol), max_drop_rel=float(cfg.max_drop_rel),
                                monotone=str(cfg.monotone))
    except ProfileRefusedError as e:
        refused = run_dir / "refused_cost_curve.png"
        plot_cost_curve(e, e.table, refused)
        (run_dir / "profile.json").write_text(json.dumps(
            {"refused": str(e), "measurements": [list(m) for m in e.measurements],
             "samples": [list(s) for s in e.samples], "fingerprint": fingerprint}, indent=2) + "\n")
        log.error("profile refused; the measured curve is in %s", refused)
        raise
    if out.exists():
        log.info("replacing the existing cost table %s", out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result.table.save(out)
    plot_cost_curve(result, result.table, plot)
    ladders = {int(b): recommend_tier_ladder(result.table, result.block, int(b), float(cfg.flat_rel_tol))
               for b in result.batch_sizes}
    summary = {
        "cost_table": str(out.resolve()),
        "plot": str(plot.resolve()),
        **result.summary(),
        "recommended_tiers": {str(b): t for b, t in ladders.items()},
        "fingerprint": dict(fingerprint),
        "use_with": f"engine.cost_table={out.resolve()}",
    }
    (run_dir / "profile.json").write_text(json.dumps({**summary, **result.to_dict()}, indent=2) + "\n")
    return summary


def _print_summary(summary: dict) -> None:
    print(f"cost table: {summary['cost_table']}")
    print(f"plot:       {summary['plot']}")
    print(f"token counts M: {summary['token_counts']}  fixed overhead {summary['fixed_overhead_ms']} ms, "
          f"theta {summary['theta_ms_min']}..{summary['theta_ms_max']} ms")
    print(f"recommended tier ladders (engine.verify=uniform, block {summary['block']}):")
    for b, tiers in summary["recommended_tiers"].items():
        print(f"  batch {b:>4}: engine.tiers=[{','.join(str(t) for t in tiers)}]")
    print(f"use with: {summary['use_with']}")


@hydra.main(version_base="1.3", config_path="../conf", config_name="profile")
def main(cfg: DictConfig) -> None:
    summary = run(cfg)
    _print_summary(summary)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("fingerprint",)}, indent=2))


if __name__ == "__main__":
    main()
