"""Paired same-node A/B benchmark of two engine configurations.

    python -m runners.ab +workload=poetry
    python -m runners.ab +workload=agentic ab.n_blocks=6 load.concurrency=16
    python -m runners.ab -m +workload=agentic,arena_hard load.concurrency=4,16

Both arms run in this process over the same requests and seeds, in an order schedule
(ABBA by default), each block preceded by an engine reset. Results land in the Hydra run
folder: requests.parquet, blocks.csv (appended after every block, so a crash keeps the
finished blocks), summary.json, report.md with plots, and offline W&B runs.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import hydra
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from dspark.bench.fingerprint import device_telemetry, node_fingerprint
from dspark.bench.guards import (ABGuardError, GuardResult, did_nothing_guard, errors_guard, lossless_guard,
                                 trim_expected)
from dspark.bench.metrics import RequestRecord, aggregate_block, requests_dataframe
from dspark.bench.report import render_console_table, write_report
from dspark.bench.schedule import build_schedule, first_arm_by_block
from dspark.bench.statistics import compare_blocks
from dspark.bench.wandb_log import WandbLogger
from dspark.config import ConfigError, EngineConfig
from dspark.engine import Engine
from runners.schema import to_engine_config
from workloads.registry import build_workload, make_spec

ROOT = Path(__file__).resolve().parents[1]
HEADLINE = "output_tokens_per_s"


class ArmFailed(RuntimeError):
    """An arm raised mid-run; finished blocks are already on disk."""


# ---- configuration -------------------------------------------------------------------------
def arm_engine_configs(cfg: DictConfig) -> dict[str, EngineConfig]:
    """Engine config of each arm: the engine group plus the arm's overrides, validated now."""
    base = OmegaConf.to_container(cfg.engine, resolve=True)
    out = {}
    for arm in ("A", "B"):
        spec = cfg.ab.arms[arm]
        overrides = OmegaConf.to_container(spec.engine, resolve=True) or {}
        unknown = set(overrides) - set(base)
        if unknown:
            raise ConfigError(f"ab.arms.{arm}.engine: unknown keys {sorted(unknown)}; allowed: {sorted(base)}")
        try:
            out[arm] = to_engine_config({**base, **overrides})
        except ConfigError as e:
            raise ConfigError(f"ab.arms.{arm}: {e}") from e
    if cfg.load.concurrency < 1:
        raise ConfigError(f"load.concurrency: must be >= 1, got {cfg.load.concurrency}")
    for arm in out:
        out[arm].max_num_seqs = int(cfg.load.concurrency)
    return out


def workload_from(cfg: DictConfig):
    if cfg.get("workload") is None:
        raise ConfigError("no workload chosen: add one, e.g. `python -m runners.ab +workload=poetry` "
                          "(agentic, poetry, arena_hard, custom)")
    w = OmegaConf.to_container(cfg.workload, resolve=True)
    name = w.pop("name")
    return build_workload(make_spec(name, **w))


# ---- running one arm over one block ----------------------------------------------------------
def drive(engine: Engine, inputs: list, params: list, ids: list[str], load: DictConfig, seed: int):
    """Closed loop (all requests queued, at most load.concurrency running) or Poisson arrivals."""
    if load.mode == "closed":
        t0 = time.perf_counter()
        outs = engine.generate(inputs, params, ids=ids)
        return outs, time.perf_counter() - t0
    if load.mode != "poisson":
        raise ConfigError(f"load.mode: {load.mode!r} not in ['closed', 'poisson']")
    import random

    rng = random.Random(seed)
    gaps = [rng.expovariate(load.request_rate) for _ in inputs]
    arrivals = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    t0 = time.perf_counter()
    outs: dict[int, Any] = {}
    pending = list(range(len(inputs)))
    order: dict[int, int] = {}
    while pending or engine.has_unfinished():
        now = time.perf_counter() - t0
        while pending and arrivals[pending[0]] <= now:
            i = pending.pop(0)
            order[engine.add_request(inputs[i], params[i], user_id=ids[i])] = i
        if engine.has_unfinished():
            for o in engine.step():
                outs[order[o.req_id]] = o
        elif pending:
            time.sleep(min(0.01, max(0.0, arrivals[pending[0]] - now)))
    return [outs[i] for i in range(len(inputs))], time.perf_counter() - t0


def to_records(outs, arm: str, block: int) -> list[RequestRecord]:
    recs = []
    for o in outs:
        recs.append(RequestRecord(
            request_id=str(o.user_id), arm=arm, block=block, prompt_tokens=len(o.prompt_token_ids),
            output_token_ids=list(o.token_ids), arrival_s=o.arrival_time, first_token_s=o.first_token_time,
            finish_s=o.finish_time, chunk_times_s=list(o.chunk_times), accept_lengths=list(o.accept_lengths),
            verify_lengths=list(o.verify_lens), per_position_accepts=list(o.pos_accepted),
            per_position_reached=list(o.pos_reached), error=o.error))
    return recs


# ---- the experiment --------------------------------------------------------------------------
def run(cfg: DictConfig) -> dict:
    arm_cfgs = arm_engine_configs(cfg)  # every config error surfaces before any model loads
    workload = workload_from(cfg)
    schedule = build_schedule(cfg.ab.schedule, int(cfg.ab.n_blocks), seed=int(cfg.ab.seed))
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prompts = workload.prompts()
    replicas = workload.greedy_replicas()

    from runners.common import build_engine

    engines: dict[str, Engine] = {"A": build_engine(cfg, arm_cfgs["A"])}
    engines["B"] = Engine(engines["A"].target, engines["A"].tokenizer, arm_cfgs["B"],
                          _drafter_for(cfg, engines["A"], arm_cfgs["B"]))
    tok = engines["A"].tokenizer
    inputs = [p.messages if p.messages is not None else p.prompt for p in prompts]
    params = [workload.sampling_for(p) for p in prompts]
    ids = [p.id for p in prompts]
    length_stats = workload.length_stats(lambda p: len(tok.encode_chat(p.messages) if p.messages else tok.encode(p.prompt)))

    logger = WandbLogger(mode=cfg.wandb.mode, project=cfg.wandb.project, group=cfg.experiment,
                         dir=out_dir / "wandb")
    config_dict = OmegaConf.to_container(cfg, resolve=True)
    for arm in ("A", "B"):
        logger.start_arm(arm, job_type=cfg.ab.arms[arm].label, config={**config_dict, "arm": arm})

    # Warm-up per arm (first requests of the workload, short), then measured blocks.
    warm = max(0, int(cfg.ab.warmup_requests))
    for arm in ("A", "B"):
        if warm:
            e = engines[arm]
            e.generate(inputs[:warm], [p for p in params[:warm]], ids=ids[:warm])
            e.reset()

    records: list[RequestRecord] = []
    block_rows: list[dict] = []
    outputs: dict[str, dict[int, dict[str, list[int]]]] = {"A": {}, "B": {}}
    first_arm = first_arm_by_block(schedule)
    blocks_csv = out_dir / "blocks.csv"
    from tqdm.auto import tqdm

    bar = tqdm(schedule, desc=f"A/B {cfg.experiment}", unit="arm-block", disable=not cfg.progress)
    for block, arm in bar:
        e = engines[arm]
        e.reset()
        try:
            outs, wall = drive(e, inputs, params, ids, cfg.load, seed=int(cfg.ab.seed) + block)
        except Exception as exc:  # keep what finished, then fail loudly
            logger.close()
            raise ArmFailed(f"arm {arm} failed in block {block}: {type(exc).__name__}: {exc}; the "
                            f"{len(block_rows)} finished arm-blocks are in {blocks_csv}") from exc
        recs = to_records(outs, arm, block)
        records += recs
        outputs[arm][block] = {str(o.user_id): list(o.token_ids) for o in outs}
        counters = e.counters()
        row = {"block": block, "arm": arm, "first_arm": first_arm[block],
               **aggregate_block(recs, wall, counters), "wall_s": wall}
        tel = device_telemetry()
        row.update({f"telemetry/{k}": v for k, v in tel.items() if isinstance(v, (int, float, str, bool))})
        block_rows.append(row)
        pd.DataFrame(block_rows).to_csv(blocks_csv, index=False)
        logger.log_block(arm, block, {k: v for k, v in row.items() if isinstance(v, (int, float))})
        bar.set_postfix({"arm": arm, "tok/s": f"{row.get(HEADLINE, float('nan')):.1f}"})
        if cfg.ab.cooldown_s:
            time.sleep(float(cfg.ab.cooldown_s))

    # Greedy replicas: sampled workloads cannot be compared token by token, their greedy copies can.
    replica_outputs: dict[str, dict[str, list[int]]] = {}
    if replicas:
        r_inputs = [p.messages if p.messages is not None else p.prompt for p in replicas]
        r_params = [workload.sampling_for(p, greedy=True) for p in replicas]
        r_ids = [p.id for p in replicas]
        for arm in ("A", "B"):
            engines[arm].reset()
            outs = engines[arm].generate(r_inputs, r_params, ids=r_ids)
            replica_outputs[arm] = {str(o.user_id): list(o.token_ids) for o in outs}

    blocks_df = pd.DataFrame(block_rows)
    requests_df = requests_dataframe(records)
    requests_df.to_parquet(out_dir / "requests.parquet", index=False)
    stats = compare_blocks(blocks_df, {HEADLINE: "higher", "requests_per_s": "higher"},
                           n_boot=int(cfg.ab.n_boot), seed=int(cfg.ab.seed))
    guards = run_guards(cfg, arm_cfgs, engines, workload, outputs, replica_outputs, block_rows, records, prompts)
    counters = {arm: _sum_counters([r for r in block_rows if r["arm"] == arm]) for arm in ("A", "B")}
    summary = {
        "experiment": cfg.experiment,
        "headline_metric": HEADLINE,
        "statistics": {k: v.to_dict() for k, v in stats.items()},
        "verdict": stats[HEADLINE].verdict,
        "guards": [g.to_dict() for g in guards],
        "guards_passed": all(g.passed for g in guards),
        "arms": {arm: {"label": cfg.ab.arms[arm].label, "engine": vars_of(arm_cfgs[arm])} for arm in ("A", "B")},
        "counters": counters,
        "workload": {**workload.describe(), "length_stats": length_stats},
        "schedule": [list(x) for x in schedule],
        "fingerprint": node_fingerprint(config_dict, ROOT),
        "sweep_params": _sweep_params(),
    }
    for arm in ("A", "B"):
        logger.log_requests(arm, [r for r in records if r.arm == arm])
        logger.finish_arm(arm, {"verdict": summary["verdict"], **{f"counter/{k}": v for k, v in counters[arm].items()}})
    logger.close()
    summary["wandb"] = logger.status()
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    write_report(out_dir, summary, blocks_df, requests_df)
    render_console_table(summary)
    if cfg.ab.fail_on_guard:
        failed = [g for g in guards if not g.passed]
        if failed:
            raise ABGuardError("; ".join(f"{g.name}: {g.message}" for g in failed))
    return summary


def _drafter_for(cfg: DictConfig, engine_a: Engine, ecfg_b: EngineConfig):
    """Arm B shares arm A's drafter when both speculate; else loads one if B needs it."""
    if ecfg_b.spec == "off":
        return None
    if engine_a.drafter is not None:
        return engine_a.drafter
    from runners.common import build_engine

    return build_engine(cfg, ecfg_b).drafter


def vars_of(ecfg: EngineConfig) -> dict:
    from dataclasses import asdict

    return asdict(ecfg)


def _sum_counters(rows: list[dict]) -> dict:
    out: dict[str, float] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("counter/") and isinstance(v, (int, float)) and not isinstance(v, bool):
                name = k.split("/", 1)[1]
                out[name] = out.get(name, 0) + v
    if out.get("ceiling_tokens"):
        out["trim_ratio"] = 1.0 - out.get("window_tokens", 0) / out["ceiling_tokens"]
    if out.get("verified_tokens"):
        out["accept_rate"] = out.get("accepted_tokens", 0) / out["verified_tokens"]
    return out


def _sweep_params() -> dict:
    try:
        from hydra.core.hydra_config import HydraConfig

        return {o.split("=", 1)[0]: o.split("=", 1)[1] for o in HydraConfig.get().overrides.task if "=" in o}
    except Exception:  # not running under Hydra (tests call run() directly)
        return {}


def run_guards(cfg, arm_cfgs, engines, workload, outputs, replica_outputs, block_rows, records, prompts
               ) -> list[GuardResult]:
    guards: list[GuardResult] = [errors_guard(records)]
    dtype = arm_cfgs["A"].dtype
    prompt_ids = {p.id: p for p in prompts}
    tok = engines["A"].tokenizer

    def margin_fn(req_id, prefix):
        from dspark.model_runner import last_position_logits

        p = prompt_ids.get(str(req_id).removesuffix("#greedy"))
        ids = (tok.encode_chat(p.messages) if p.messages else tok.encode(p.prompt)) if p is not None else []
        top2 = last_position_logits(engines["A"].target, ids + list(prefix)).topk(2).values
        return float(top2[0] - top2[1])

    greedy_workload = workload.sampling().greedy
    if greedy_workload:
        for block in sorted(set(outputs["A"]) & set(outputs["B"])):
            g = lossless_guard(outputs["A"][block], outputs["B"][block], dtype=dtype, margin_fn=margin_fn,
                               near_tie_margin=float(cfg.ab.near_tie_margin))
            g.name = f"lossless/block{block}"
            guards.append(g)
    if replica_outputs:
        g = lossless_guard(replica_outputs["A"], replica_outputs["B"], dtype=dtype, margin_fn=margin_fn,
                           near_tie_margin=float(cfg.ab.near_tie_margin))
        g.name = "lossless/greedy_replicas"
        guards.append(g)
    if not greedy_workload and not replica_outputs:
        guards.append(GuardResult("lossless", False, "sampled workload without greedy replicas: nothing compared; "
                                  "set workload.greedy_replica_count > 0", {}))
    for arm in ("A", "B"):
        ecfg = arm_cfgs[arm]
        counters = _sum_counters([r for r in block_rows if r["arm"] == arm])
        guards.append(did_nothing_guard(arm, vars_of(ecfg), counters,
                                        expects_trim=trim_expected(ecfg.verify, False),
                                        expects_graphs=False, expects_speculation=ecfg.spec != "off"))
    return guards


@hydra.main(version_base="1.3", config_path="../conf", config_name="ab")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
