"""Make drafter training data: workload prompts answered by the target itself.

    python -m runners.make_training_data output=training_data/train.safetensors
    python -m runners.make_training_data engine=h200 num_prompts_per_source=2000 max_tokens=512
    python -m runners.make_training_data split=eval num_prompts_per_source=64 output=training_data/eval.safetensors

Prompts come from the workloads' ``split`` (``train`` by default; the benchmarks use
``eval``, so no benchmark prompt is trained on). Each prompt's chat messages are rendered
with the tokenizer's chat template and answered by the target in target-only mode
(``engine.spec`` is forced to ``off``) with temperature 0.7, top-p 0.8, top-k 20 and a
per-prompt seed, in batches of ``engine.max_num_seqs``. The result is a
:class:`dspark.training.data.TokenDataset` (token ids only).
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from dspark.config import ConfigError, SamplingParams
from dspark.training.data import generate_dataset
from runners.schema import EngineSchema, ModelSchema, to_engine_config
from workloads.registry import build_workload, make_spec

DEFAULT_SOURCES = ["agentic", "poetry", "arena_hard", "stdlib_prose", "hard_questions"]


@dataclass
class DataSamplingSchema:
    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20


@dataclass
class MakeTrainingDataSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    engine: EngineSchema = field(default_factory=EngineSchema)
    sources: List[str] = field(default_factory=lambda: list(DEFAULT_SOURCES))
    num_prompts_per_source: Optional[int] = 200
    split: str = "train"
    max_tokens: int = 512
    sampling: DataSamplingSchema = field(default_factory=DataSamplingSchema)
    seed: int = 0
    output: str = "training_data/train.safetensors"
    progress: bool = True
    # Responses per prompt, by source (default 1): small sources (agentic, stdlib_prose,
    # arena_hard) can be sampled several times with different seeds.
    samples_per_prompt: Dict[str, int] = field(default_factory=dict)
    # Stop admitting prompts after this many seconds (admitted ones finish and are kept);
    # prompts are shuffled first so a cut keeps the sources' mix.
    time_budget_s: Optional[float] = None
    # "i/n": answer only every n-th prompt of the shuffled list, starting at i (0-based), so n
    # processes (one per GPU) split the work; train on all shards with data=[shard0,shard1,...].
    shard: Optional[str] = None
    # Requests enter the engine in waves of in_flight (null: engine.max_num_seqs), the next wave
    # when at most refill_at (null: half of in_flight) are unfinished, so most steps are pure
    # decode and replay captured graphs (see dspark.training.data.generate_dataset).
    in_flight: Optional[int] = None
    refill_at: Optional[int] = None


def parse_shard(shard: Optional[str]) -> tuple[int, int]:
    """(index, count) of ``shard`` = "i/n"; (0, 1) for None."""
    if shard is None:
        return 0, 1
    parts = str(shard).split("/")
    try:
        index, count = int(parts[0]), int(parts[1])
        if len(parts) != 2:
            raise ValueError
    except (ValueError, IndexError):
        raise ConfigError(f"shard: {shard!r}; write it as 'i/n' (0 <= i < n), e.g. shard=0/2 and shard=1/2 "
                          f"for two GPUs") from None
    if not 0 <= index < count:
        raise ConfigError(f"shard: {shard!r}; the index must satisfy 0 <= i < n")
    return index, count


ConfigStore.instance().store(name="make_training_data_schema", node=MakeTrainingDataSchema)


def prompt_seed(seed: int, prompt_id: str) -> int:
    """Sampling seed of one prompt: stable across runs, batch composition and machines."""
    return zlib.crc32(f"{seed}:{prompt_id}".encode()) & 0x7FFF_FFFF


def collect_prompts(sources: list[str], split: str, num_prompts: int | None, seed: int) -> list[tuple[str, str, list[dict]]]:
    """(source workload, prompt id, chat messages) for every selected prompt, source by source."""
    if split not in ("train", "eval"):
        raise ConfigError(f"split: {split!r}; use 'train' (training data) or 'eval' (held-out calibration data)")
    if not sources:
        raise ConfigError(f"sources: give at least one workload, e.g. {DEFAULT_SOURCES}")
    items = []
    for name in sources:
        workload = build_workload(make_spec(name, split=split, num_prompts=None, seed=seed))
        prompts = workload.prompts()
        if num_prompts is not None:
            prompts = prompts[:num_prompts]
        for p in prompts:
            messages = p.messages if p.messages is not None else [{"role": "user", "content": p.prompt}]
            items.append((name, p.id, messages))
    return items


def expand_samples(items: list[tuple[str, str, list[dict]]], samples_per_prompt: dict[str, int], seed: int
                   ) -> list[tuple[str, str, list[dict]]]:
    """Repeat each prompt ``samples_per_prompt[source]`` times (ids ``ID``, ``ID#1``, ...), then
    shuffle deterministically so that a time budget cuts every source alike."""
    import random

    unknown = sorted(set(samples_per_prompt) - {src for src, _, _ in items})
    if unknown:
        raise ConfigError(f"samples_per_prompt: {unknown} are not among the selected sources "
                          f"{sorted({src for src, _, _ in items})}")
    out = []
    for src, pid, msgs in items:
        n = int(samples_per_prompt.get(src, 1))
        if n < 1:
            raise ConfigError(f"samples_per_prompt.{src}: must be >= 1, got {n}")
        out.extend((src, pid if j == 0 else f"{pid}#{j}", msgs) for j in range(n))
    random.Random(seed).shuffle(out)
    return out


def run(cfg: Any, target=None, tokenizer=None) -> dict[str, Any]:
    """Generate and save the data; ``target``/``tokenizer`` override loading cfg.model (tests)."""
    from dspark.engine import Engine

    engine_cfg = to_engine_config(cfg.engine, spec="off")
    items = collect_prompts(list(cfg.sources), cfg.split, cfg.num_prompts_per_source, int(cfg.seed))
    items = expand_samples(items, dict(cfg.get("samples_per_prompt") or {}), int(cfg.seed))
    shard_index, shard_count = parse_shard(cfg.get("shard"))
    items = items[shard_index::shard_count]
    if target is None:
        from runners.train_drafter import load_target_and_tokenizer

        target, tokenizer = load_target_and_tokenizer(cfg)
    if tokenizer is None:
        raise ConfigError("make_training_data needs a tokenizer with a chat template to render the prompts")
    engine = Engine(target, tokenizer, engine_cfg)
    s = cfg.sampling
    params = [SamplingParams(temperature=float(s.temperature), top_p=float(s.top_p), top_k=int(s.top_k),
                             max_tokens=int(cfg.max_tokens), seed=prompt_seed(int(cfg.seed), pid))
              for _, pid, _ in items]
    info = {"model": str(cfg.model.source), "split": cfg.split, "seed": int(cfg.seed), "max_tokens": int(cfg.max_tokens),
            "sampling": {"temperature": float(s.temperature), "top_p": float(s.top_p), "top_k": int(s.top_k)},
            "sources": list(cfg.sources), "num_prompts_per_source": cfg.num_prompts_per_source,
            "shard": f"{shard_index}/{shard_count}",
            "engine": {"device": engine_cfg.device, "dtype": engine_cfg.dtype, "max_num_seqs": engine_cfg.max_num_seqs}}
    t0 = time.perf_counter()
    dataset, failed = generate_dataset(engine, [(src, msgs) for src, _, msgs in items], params, info=info,
                                       progress=bool(cfg.progress), time_budget_s=cfg.get("time_budget_s"),
                                       in_flight=cfg.get("in_flight"), refill_at=cfg.get("refill_at"))
    wall = time.perf_counter() - t0
    if len(dataset) == 0:
        raise RuntimeError(f"no prompt produced a response ({len(failed)} failed; first error: "
                           f"{failed[0]['error'] if failed else 'none'})")
    out = dataset.save(cfg.output)
    counters = engine.counters()
    steps = int(counters["steps"])
    # How the steps ran (graph replays, eager steps and why, prefill-mixed steps): what to read
    # first when generation is slower than the decode benchmarks.
    engine_summary = {k: counters[k] for k in sorted(counters) if k.startswith("eager_reason/") or k in (
        "steps", "decode_steps", "mixed_steps", "prefill_tokens", "emitted_tokens", "graph_replays",
        "eager_steps", "graphs_captured")}
    engine_summary.update(ms_per_step=round(1000 * wall / steps, 3) if steps else None,
                          mean_tokens_per_step=round(counters["emitted_tokens"] / steps, 2) if steps else None)
    summary = {"output": str(Path(out).resolve()), "prompts": len(items), "failed": len(failed),
               "engine_steps": engine_summary,
               "not_admitted": dataset.info.get("not_admitted", 0),
               "failures": [{**f, "id": items[f["index"]][1]} for f in failed[:20]],
               "wall_s": round(wall, 2), **dataset.summary()}
    if failed:
        print(f"warning: {len(failed)} of {len(items)} prompts failed and are not in the data; first: "
              f"{summary['failures'][0]}")
    return summary


@hydra.main(version_base="1.3", config_path="../conf", config_name="make_training_data")
def main(cfg: DictConfig) -> None:
    print(json.dumps(run(cfg), indent=2))


if __name__ == "__main__":
    main()
