"""Profile the step-cost table of this node, model, drafter and dtype.

    python -m runners.profile
    python -m runners.profile engine=h200 batch_sizes=[1,2,4,8,16,32,64,128,256] measure_steps=20 warmup_steps=5
    python -m runners.profile out=cost_tables/mine.json plot=cost_curve.png verify_lens=[0,1,3,5,7]

The settings are runners.schema.CostProfileSchema's, the schema runners.ab reads as ``ab.profile``.
Writes the cost-table JSON (default: the path under ``paths.cost_tables`` named after the
engine's fingerprint and these settings, the file :func:`dspark.profiler.find_or_profile`
looks for, so runners.ab reuses it when its ``ab.profile`` settings resolve to the same
values), a PNG of step ms against M per batch size (default: beside the table), and
``profile.json`` (medians, samples, summary) in the run folder; prints the recommended tier
ladder for every profiled batch size, the fit's quality and a summary. A refused profile
(ProfileFlatError; ProfileFitError, e.g. a fit below min_r2 / max_rel_residual) writes
``refused_cost_curve.png`` and ``profile.json`` to the run folder and no table. See
:mod:`dspark.profiler` for the method.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from dspark.config import ConfigError
from dspark.cost_table import fingerprint_digest
from dspark.engine import Engine
from dspark.profiler import (ProfileRefusedError, cost_table_path_for, plot_cost_curve, profile_engine,
                             recommend_tier_ladder)
from runners.hydra_main import runner_main
from runners.schema import (CostProfileSchema, DrafterSchema, EngineSchema, ModelSchema, PathsSchema,
                            to_engine_config, to_profile_settings)

log = logging.getLogger(__name__)


@dataclass
class ProfileSchema(CostProfileSchema):
    """The profile settings (CostProfileSchema, at the top level) and what this runner profiles and writes."""
    model: ModelSchema = field(default_factory=ModelSchema)
    drafter: DrafterSchema = field(default_factory=DrafterSchema)
    engine: EngineSchema = field(default_factory=EngineSchema)
    paths: PathsSchema = field(default_factory=PathsSchema)
    out: Optional[str] = None  # table path; null: the fingerprint-and-settings path under paths.cost_tables
    plot: Optional[str] = None  # PNG path; null: the table path with .png
    progress: bool = True  # a progress bar over the sweep's (verify length, batch size) configurations


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
    from runners.common import writable_folder

    settings = to_profile_settings(cfg)  # refuses a bad value before any model loads
    # (created only with the table: a refused profile leaves no cost-table folder behind)
    writable_folder(Path(cfg.out).parent if cfg.out else cfg.paths.cost_tables,
                    "out" if cfg.out else "paths.cost_tables", create=False)
    if cfg.plot:
        writable_folder(Path(cfg.plot).parent, "plot", create=False)
    engine = engine if engine is not None else _engine_from_cfg(cfg)
    settings = settings.resolved(engine)
    fingerprint = engine.fingerprint()
    out = Path(cfg.out) if cfg.out else cost_table_path_for(fingerprint, cfg.paths.cost_tables, settings)
    plot = Path(cfg.plot) if cfg.plot else out.with_suffix(".png")
    run_dir = Path(cfg.paths.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = profile_engine(engine, **settings.profile_kwargs(), progress=bool(cfg.progress))
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
    ladders = {int(b): recommend_tier_ladder(result.table, result.block, int(b), settings.flat_rel_tol)
               for b in result.batch_sizes}
    summary = {
        "cost_table": str(out.resolve()),
        "plot": str(plot.resolve()),
        **result.summary(),
        "fit_summary": result.table.fit.describe(),
        "recommended_tiers": {str(b): t for b, t in ladders.items()},
        "fingerprint_digest": fingerprint_digest(fingerprint),
        "settings_digest": settings.digest(),
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
    print(f"fit: {summary['fit_summary']}")
    print(f"recommended tier ladders (engine.verify=uniform, block {summary['block']}):")
    for b, tiers in summary["recommended_tiers"].items():
        print(f"  batch {b:>4}: engine.tiers=[{','.join(str(t) for t in tiers)}]")
    print(f"use with: {summary['use_with']}")


@runner_main("profile")
def main(cfg: DictConfig) -> None:
    summary = run(cfg)
    _print_summary(summary)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("fingerprint",)}, indent=2))


if __name__ == "__main__":
    main()
