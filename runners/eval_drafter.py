"""Evaluate a drafter checkpoint with the engine on the workloads' EVAL prompts.

    python -m runners.eval_drafter checkpoint=runs/dspark/final
    python -m runners.eval_drafter checkpoint=DIR engine=h200 num_prompts=64

For every workload and temperature (0 and 0.7 by default) the prompts run through the
engine with ``spec=dspark`` (full-block verification): mean acceptance length (tokens
committed per decode step, bonus included, averaged over requests) and per-position
acceptance (accepted at i / drafts that reached i, per request, averaged over requests).
At temperature 0 the same prompts also run target-only and the token ids must be
identical; mismatches are listed. Writes ``eval.json`` and ``eval.md`` (a model-card
table) into ``output_dir`` (default: CHECKPOINT/eval).
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from dspark.config import ConfigError, SamplingParams
from dspark.models.drafter import DSparkDrafter
from runners.hydra_main import runner_main
from runners.schema import EngineSchema, ModelSchema, to_engine_config
from workloads.registry import build_workload, make_spec

DEFAULT_WORKLOADS = ["agentic", "poetry", "arena_hard"]


@dataclass
class EvalDrafterSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    # the engine's settings; engine.spec is set here: dspark for the drafter's runs, off for the target-only ones
    engine: EngineSchema = field(default_factory=EngineSchema)
    checkpoint: Optional[str] = None  # the drafter folder (config.json + safetensors) to evaluate
    # the workloads whose EVAL-split prompts run, by name (workloads.registry: agentic, poetry, arena_hard, ...)
    workloads: List[str] = field(default_factory=lambda: list(DEFAULT_WORKLOADS))
    num_prompts: int = 16  # prompts per workload (a seeded choice)
    max_tokens: int = 256  # output tokens per request at most
    # the sampling temperatures (>= 0) each workload runs at; at 0 the prompts also run target-only and the
    # speculative tokens must equal the target-only ones
    temperatures: List[float] = field(default_factory=lambda: [0.0, 0.7])
    top_p: float = 1.0  # nucleus sampling at temperatures > 0; 1: off
    top_k: int = 0  # top-k sampling at temperatures > 0; 0: off
    seed: int = 0  # seeds which prompts are chosen and each request's sampling seed
    output_dir: Optional[str] = None  # where eval.json and eval.md are written; null: CHECKPOINT/eval
    progress: bool = True  # progress bars over each run's requests
    # bf16/fp16 only: a greedy mismatch whose first differing token had a top-2 logit margin
    # below this (in the target-only forward) is a near-tie flip, reported but not a failure.
    near_tie_margin: float = 0.05


ConfigStore.instance().store(name="eval_drafter_schema", node=EvalDrafterSchema)


def _mean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def acceptance_metrics(outputs: Sequence[Any], block_size: int) -> dict[str, Any]:
    """Request-averaged acceptance length and per-position acceptance of engine outputs."""
    ok = [o for o in outputs if o.error is None and o.accept_lengths]
    per_position = []
    for i in range(block_size):
        rates = [o.pos_accepted[i] / o.pos_reached[i] for o in ok if o.pos_reached[i] > 0]
        per_position.append(_mean(rates))
    return {
        "requests": len(outputs),
        "errors": sum(o.error is not None for o in outputs),
        "mean_accept_length": _mean([o.mean_accept_length for o in ok]),
        "per_position_acceptance": per_position,
        "output_tokens": sum(len(o.token_ids) for o in ok),
        "decode_steps": sum(o.num_steps for o in ok),
    }


def greedy_mismatches(spec_outputs: Sequence[Any], plain_outputs: Sequence[Any], ids: Sequence[str],
                      margin_fn=None, near_tie_margin: float = 0.0) -> list[dict]:
    """Requests whose speculative greedy tokens differ from target-only greedy tokens.

    With ``margin_fn(token_ids) -> top-2 logit margin after them``, each mismatch records the
    target's margin at the first differing token and is a ``near_tie`` when it is below
    ``near_tie_margin`` (pass 0 in fp32, where every mismatch is a divergence)."""
    found = []
    for pid, a, b in zip(ids, spec_outputs, plain_outputs):
        if a.error is not None or b.error is not None:
            found.append({"id": pid, "error": a.error or b.error})
            continue
        if list(a.token_ids) != list(b.token_ids):
            first = next((k for k, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
                         min(len(a.token_ids), len(b.token_ids)))
            entry = {"id": pid, "first_difference": first, "spec_len": len(a.token_ids),
                     "target_len": len(b.token_ids)}
            if margin_fn is not None:
                margin = float(margin_fn(list(b.prompt_token_ids) + list(b.token_ids[:first])))
                entry.update(margin=margin, kind="near_tie" if margin < near_tie_margin else "divergence")
            found.append(entry)
    return found


def top2_margin_fn(target):
    """token ids -> top-1 minus top-2 logit of the target after them (its own dtype and device)."""
    from dspark.model_runner import last_position_logits

    def margin(token_ids: list[int]) -> float:
        top2 = last_position_logits(target, token_ids).topk(2).values
        return float(top2[0] - top2[1])

    return margin


def evaluate(spec_engine, plain_engine, prompt_sets: dict[str, list[tuple[str, Any]]], temperatures: Sequence[float],
             *, max_tokens: int, top_p: float = 1.0, top_k: int = 0, seed: int = 0, progress: bool = False,
             near_tie_margin: float = 0.0) -> dict[str, Any]:
    """Run every (workload, temperature); ``prompt_sets`` maps workload -> [(id, prompt)] (messages or ids)."""
    block = spec_engine.block_size
    results = []
    for name, items in prompt_sets.items():
        ids = [pid for pid, _ in items]
        prompts = [p for _, p in items]
        for temp in temperatures:
            base = SamplingParams(temperature=float(temp), top_p=float(top_p) if temp > 0 else 1.0,
                                  top_k=int(top_k) if temp > 0 else 0, max_tokens=int(max_tokens))
            params = [replace(base, seed=zlib.crc32(f"{seed}:{pid}".encode()) & 0x7FFF_FFFF) for pid in ids]
            spec_engine.reset()
            t0 = time.perf_counter()
            spec_out = spec_engine.generate(prompts, params, progress=progress)
            wall = time.perf_counter() - t0
            row = {"workload": name, "temperature": float(temp), "wall_s": round(wall, 3),
                   **acceptance_metrics(spec_out, block)}
            if temp == 0:
                plain_engine.reset()
                plain_out = plain_engine.generate(prompts, params, progress=progress)
                mism = greedy_mismatches(spec_out, plain_out, ids, margin_fn=top2_margin_fn(plain_engine.target),
                                         near_tie_margin=near_tie_margin)
                row["greedy_mismatches"] = mism
                row["greedy_near_ties"] = sum(m.get("kind") == "near_tie" for m in mism)
                row["greedy_lossless"] = all(m.get("kind") == "near_tie" for m in mism)
            results.append(row)
    lossless = all(r.get("greedy_lossless", True) for r in results)
    return {"block_size": block, "results": results, "greedy_lossless": lossless}


def markdown_table(report: dict[str, Any]) -> str:
    block = report["block_size"]
    head = ["workload", "T", "requests", "accept length"] + [f"p{i + 1}" for i in range(block)] + ["greedy = target"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def fmt(v: Any, digits: int = 3) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    for r in report["results"]:
        if "greedy_lossless" in r:
            n, ties = len(r["greedy_mismatches"]), r.get("greedy_near_ties", 0)
            if not n:
                greedy = "yes"
            elif r["greedy_lossless"]:
                greedy = f"yes ({ties} near-tie flip{'s' if ties > 1 else ''})"
            else:
                greedy = f"NO ({n - ties} divergence{'s' if n - ties > 1 else ''}, {ties} near-ties)"
        else:
            greedy = "n/a"
        cells = [r["workload"], f"{r['temperature']:g}", str(r["requests"]), fmt(r["mean_accept_length"])]
        cells += [fmt(v, 2) for v in r["per_position_acceptance"]] + [greedy]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def eval_prompts(names: Sequence[str], num_prompts: int, seed: int) -> dict[str, list[tuple[str, Any]]]:
    sets = {}
    for name in names:
        workload = build_workload(make_spec(name, split="eval", num_prompts=int(num_prompts), seed=int(seed),
                                                  greedy_replica_count=0))
        sets[name] = [(p.id, p.messages if p.messages is not None else p.prompt) for p in workload.prompts()]
    return sets


def run(cfg: Any, target=None, tokenizer=None, prompt_sets: dict[str, list[tuple[str, Any]]] | None = None
        ) -> dict[str, Any]:
    """Evaluate cfg.checkpoint; ``target``/``tokenizer``/``prompt_sets`` override loading (tests)."""
    from dspark.engine import Engine
    from dspark.model_runner import DTYPES

    if not cfg.checkpoint:
        raise ConfigError("checkpoint: give the drafter folder to evaluate, e.g. checkpoint=runs/dspark/final")
    checkpoint = Path(cfg.checkpoint)
    if any(t < 0 for t in cfg.temperatures) or not cfg.temperatures:
        raise ConfigError(f"temperatures: need at least one value >= 0, got {list(cfg.temperatures)}")
    spec_cfg = to_engine_config(cfg.engine, spec="dspark")
    plain_cfg = to_engine_config(cfg.engine, spec="off")
    if target is None:
        from runners.train_drafter import load_target_and_tokenizer

        target, tokenizer = load_target_and_tokenizer(cfg)
    drafter = DSparkDrafter.load(checkpoint, target.cfg, device=spec_cfg.device, dtype=DTYPES[spec_cfg.dtype])
    if prompt_sets is None:
        prompt_sets = eval_prompts(list(cfg.workloads), int(cfg.num_prompts), int(cfg.seed))
    spec_engine = Engine(target, tokenizer, spec_cfg, drafter)
    plain_engine = Engine(target, tokenizer, plain_cfg)
    report = evaluate(spec_engine, plain_engine, prompt_sets, list(cfg.temperatures), max_tokens=int(cfg.max_tokens),
                      top_p=float(cfg.top_p), top_k=int(cfg.top_k), seed=int(cfg.seed), progress=bool(cfg.progress),
                      near_tie_margin=0.0 if spec_cfg.dtype == "float32" else float(cfg.near_tie_margin))
    report.update({"checkpoint": str(checkpoint.resolve()), "drafter": drafter.cfg.to_dict(),
                   "engine": {"device": spec_cfg.device, "dtype": spec_cfg.dtype, "verify": spec_cfg.verify},
                   "max_tokens": int(cfg.max_tokens)})
    out_dir = Path(cfg.output_dir) if cfg.output_dir else checkpoint / "eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "eval.md").write_text(markdown_table(report))
    report["output_dir"] = str(out_dir.resolve())
    return report


@runner_main("eval_drafter")
def main(cfg: DictConfig) -> None:
    report = run(cfg)
    print(markdown_table(report))
    if not report["greedy_lossless"]:
        raise SystemExit("greedy speculative outputs differ from target-only outputs; see eval.json")


if __name__ == "__main__":
    main()
