"""Make drafter training data: workload prompts answered by the target itself.

    python -m runners.make_training_data output=training_data/train.safetensors
    python -m runners.make_training_data engine=h200 num_prompts_per_source=2000 max_tokens=512
    python -m runners.make_training_data split=eval num_prompts_per_source=64 output=training_data/eval.safetensors

Prompts come from the workloads' ``split`` (``train`` by default; the benchmarks use
``eval``, so no benchmark prompt is trained on). Each prompt's chat messages are rendered
with the tokenizer's chat template and answered by the target in target-only mode
(``engine.spec`` is forced to ``off``) with temperature 0.7, top-p 0.8, top-k 20 and a
per-prompt seed, in batches of ``engine.max_num_seqs`` (``sampling.greedy_first=true``: each prompt's first
sample greedy, its further samples, ``samples_per_prompt``, sampled). The result is a
:class:`dspark.training.data.TokenDataset` (token ids only).

Beside the output, ``OUTPUT_STEM.prompts.json`` lists the ids of every prompt the run admitted
(a prompt record, :func:`write_prompt_record`). A Ctrl-C stops after the step in progress: the finished
responses are written (``"interrupted"`` in the data's info), the record lists every admitted prompt, and the run
exits as interrupted. Calibration data that must not overlap a
drafter's training prompts is made from the same train split with ``exclude_prompts=`` those
records (or ``builtin:NAME``, the record shipped with a drafter in ``dspark/assets/NAME``):

    python -m runners.make_training_data exclude_prompts=[builtin:dspark-smollm2] seed=1 \
        num_prompts_per_source=120 max_tokens=256 output=training_data/calib.safetensors

Such data is disjoint from (a) the drafter's training prompts, by the explicit exclusion, and
(b) every workload's evaluation prompts, because it is drawn from ``split=train`` and the
train/eval split is a hash of the prompt id (:func:`workloads.base.split_of`).

A drafter trained on the WHOLE train split (the shipped one since its fourth run) leaves no
train-split prompt over. Its held-out calibration data comes from the eval split of the
training-only sources (``CALIBRATION_EVAL_SOURCES``: no benchmark workload and no
``eval_drafter`` run draws from them), which the train/eval hash keeps out of its training:

    python -m runners.make_training_data split=eval sources=[hard_questions,stdlib_prose,tool_calls,chat_followups] seed=4 \
        num_prompts_per_source=200 max_tokens=256 output=training_data/calib.safetensors
"""

from __future__ import annotations

import hashlib
import json
import lzma
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from dspark.config import ConfigError, SamplingParams
from dspark.packed_files import plain_or_packed, read_text
from dspark.training.data import generate_dataset
from runners.hydra_main import runner_main
from runners.schema import EngineSchema, ModelSchema, to_engine_config
from workloads.registry import build_workload, make_spec

DEFAULT_SOURCES = ["agentic", "poetry", "arena_hard", "stdlib_prose", "hard_questions", "tool_calls",
                   "chat_followups"]
# Sources that are drafter-training material only: no benchmark workload (conf/workload/) and no
# eval_drafter run uses them, so their EVAL split is held-out calibration material for a drafter
# trained on the whole train split. tool_calls and chat_followups put no prompt that shares a user
# turn with an agentic prompt, or text with a stdlib_prose prompt, in their eval split (see their modules).
CALIBRATION_EVAL_SOURCES = ["hard_questions", "stdlib_prose", "tool_calls", "chat_followups"]


@dataclass
class DataSamplingSchema:
    """sampling: how the target samples the responses (each prompt with its own seed)."""
    temperature: float = 0.7  # 0: greedy
    top_p: float = 0.8  # nucleus sampling; 1: off
    top_k: int = 20  # 0: off
    # each prompt's first sample (id without '#j') answered greedily, its other samples as above: the target's
    # own greedy answers are what a drafter meets when it is benchmarked at T=0
    greedy_first: bool = False


@dataclass
class MakeTrainingDataSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    # the engine that answers the prompts, target only (engine.spec is set to off here)
    engine: EngineSchema = field(default_factory=EngineSchema)
    # the workloads whose prompts are answered, by name (workloads.registry: agentic, poetry, arena_hard,
    # stdlib_prose, hard_questions, tool_calls, chat_followups, ...)
    sources: List[str] = field(default_factory=lambda: list(DEFAULT_SOURCES))
    # the first this many prompts of each source, in its seeded order, after exclude_prompts; null: all of them
    num_prompts_per_source: Optional[int] = 200
    # train | eval: the split of the workloads the prompts come from (a hash of the prompt id); eval: e.g.
    # held-out calibration data from the training-only sources (CALIBRATION_EVAL_SOURCES)
    split: str = "train"
    max_tokens: int = 512  # response tokens per prompt at most
    sampling: DataSamplingSchema = field(default_factory=DataSamplingSchema)
    seed: int = 0  # seeds which prompts each source gives, the order of the requests and each one's sampling seed
    # the TokenDataset (.safetensors); the prompt record OUTPUT_STEM.prompts.json is written beside it
    output: str = "training_data/train.safetensors"
    progress: bool = True  # a progress bar over the requests
    # Responses per prompt, by source (default 1): small sources (agentic, stdlib_prose,
    # arena_hard) can be sampled several times with different seeds.
    samples_per_prompt: Dict[str, int] = field(default_factory=dict)
    # Stop admitting prompts after this many seconds (admitted ones finish and are kept);
    # prompts are shuffled first so a cut keeps the sources' mix. null: no limit
    time_budget_s: Optional[float] = None
    # Answer only the first this many requests of this process's shuffled list (its shard's, with shard=): the
    # prefix a time-budgeted run admitted (its log's prompts minus not_admitted), so that run's data can be made
    # again on another machine, e.g. for an ablation trained on the same data. null: every request
    max_requests: Optional[int] = None
    # "i/n": answer only every n-th prompt of the shuffled list, starting at i (0-based), so n
    # processes (one per GPU) split the work; train on all shards with data=[shard0,shard1,...].
    shard: Optional[str] = None
    # "j/m": after shard and max_requests, answer only every m-th request of that list, starting at j, so m processes
    # on one GPU split one shard's requests (each process's host work on its own core); the shard's data is the
    # parts' files together. A time budget then cuts each part's list apart. null: the whole list
    part: Optional[str] = None
    # Requests enter the engine in waves of in_flight (null: engine.max_num_seqs), the next wave
    # when at most refill_at are unfinished, so most steps are pure decode and replay captured
    # graphs (see dspark.training.data.generate_dataset).
    in_flight: Optional[int] = None
    # the next wave enters once at most this many requests are unfinished (0 <= refill_at < in_flight);
    # null: in_flight / 2
    refill_at: Optional[int] = None
    # Prompt records (OUTPUT_STEM.prompts.json files, data files beside which they lie, or
    # builtin:NAME for a shipped drafter's training_prompts.json) whose prompt ids are left out.
    exclude_prompts: Optional[List[str]] = None
    # A source's file setting (its workload's ``path``), by source: chat_followups takes the answers.jsonl of a
    # runners.generate run, each answer's follow-up turn then a prompt, e.g. '++source_paths={chat_followups: A}'
    source_paths: Dict[str, str] = field(default_factory=dict)


PROMPT_RECORD_FORMAT = "dspark-prompt-ids/1"
PROMPT_RECORD_SUFFIX = ".prompts.json"
SHIPPED_RECORD = "training_prompts.json"
ASSETS = Path(__file__).resolve().parents[1] / "dspark" / "assets"


def ids_digest(ids: list[str]) -> str:
    """sha256 of the sorted, newline-joined ids (what a prompt record stores to check itself)."""
    return hashlib.sha256("\n".join(sorted(set(ids))).encode("utf-8")).hexdigest()


def prompt_record_path(output: str | Path) -> Path:
    """Where make_training_data writes the prompt record of ``output`` (train_0.safetensors -> train_0.prompts.json)."""
    out = Path(output)
    return out.with_name(out.stem + PROMPT_RECORD_SUFFIX)


def write_prompt_record(path: str | Path, prompt_ids: list[str], recipe: dict[str, Any],
                        admitted_per_source: dict[str, int] | None = None) -> Path:
    """Write a prompt record: the sorted base ids (no ``#j`` sample suffix) of the prompts a data run used."""
    ids = sorted(set(prompt_ids))
    payload = {
        "format": PROMPT_RECORD_FORMAT,
        "what": "base prompt ids (without '#j' sample suffixes) of every request runners.make_training_data "
                "admitted for this data; give it to exclude_prompts= to make data disjoint from it",
        "recipe": recipe,
        "admitted_requests_per_source": dict(sorted((admitted_per_source or {}).items())),
        "count": len(ids),
        "sha256": ids_digest(ids),
        "prompt_ids": ids,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=0) + "\n")
    return path


def resolve_prompt_record(entry: str) -> Path:
    """``builtin:NAME`` -> dspark/assets/NAME/training_prompts.json; a data file -> its prompt record; else the path
    (each also found as ``<path>.xz``, xz-compressed, as the shipped drafter's record is kept)."""
    entry = str(entry)
    if entry.startswith("builtin:"):
        path = ASSETS / entry.split(":", 1)[1] / SHIPPED_RECORD
    elif entry.endswith(".safetensors"):
        path = prompt_record_path(entry)
    elif Path(entry).is_dir():
        path = Path(entry) / SHIPPED_RECORD
    else:
        path = Path(entry)
    path = plain_or_packed(path) or path  # a record kept xz-compressed (the shipped drafter's is)
    if not path.is_file():
        raise ConfigError(f"exclude_prompts: {entry!r} -> {path} does not exist; give a prompt record "
                          f"(OUTPUT{PROMPT_RECORD_SUFFIX} written beside the data by make_training_data), a data "
                          f"file beside which one lies, a drafter folder holding {SHIPPED_RECORD}, or builtin:NAME")
    return path


def load_prompt_record(entry: str) -> dict[str, Any]:
    """Read and check one prompt record (format and sha256 of its ids)."""
    path = resolve_prompt_record(entry)
    try:
        payload = json.loads(read_text(path))
    except lzma.LZMAError as e:
        raise ConfigError(f"exclude_prompts: {path} is not a readable xz file ({e}); it is truncated or corrupt") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"exclude_prompts: {path} is not valid JSON ({e})") from None
    if not isinstance(payload, dict) or payload.get("format") != PROMPT_RECORD_FORMAT:
        raise ConfigError(f"exclude_prompts: {path} is not a prompt record (format {PROMPT_RECORD_FORMAT!r})")
    ids = payload.get("prompt_ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ConfigError(f"exclude_prompts: {path} has no 'prompt_ids' list of strings")
    if ids_digest(ids) != payload.get("sha256") or len(set(ids)) != payload.get("count"):
        raise ConfigError(f"exclude_prompts: {path}: its ids do not match its sha256/count; the file was edited "
                          f"or truncated, regenerate it")
    payload["path"] = str(path)
    return payload


def excluded_prompt_ids(entries: Any) -> tuple[set[str], list[dict[str, Any]]]:
    """The union of the ids of the prompt records ``entries`` (a string or a list), and what each held."""
    if entries is None:
        return set(), []
    if isinstance(entries, str):
        entries = [entries]
    ids: set[str] = set()
    used = []
    for entry in entries:
        record = load_prompt_record(entry)
        ids.update(record["prompt_ids"])
        used.append({"entry": str(entry), "path": record["path"], "count": record["count"],
                     "sha256": record["sha256"]})
    return ids, used


def admitted_prompts(sources: list[str], split: str, num_prompts: int | None, seed: int,
                     samples_per_prompt: dict[str, int], admitted_per_shard: list[int],
                     exclude: set[str] | None = None) -> tuple[list[tuple[str, str]], list[int]]:
    """Replay a past data run's prompt order: the (source, base id) of every request it admitted.

    ``admitted_per_shard[i]`` is how many requests shard i/n admitted (requests minus
    ``not_admitted`` in its log; with a time budget, admission follows the shuffled order, so
    the admitted requests are a prefix of each shard). Returns those pairs and each shard's
    request count (which must equal the log's ``prompts`` for the replay to be the same).
    """
    items = collect_prompts(sources, split, num_prompts, seed, exclude=exclude)
    tagged = expand_samples([(src, pid, pid) for src, pid, _ in items], samples_per_prompt, seed)
    n = len(admitted_per_shard)
    chosen, requests = [], []
    for i, count in enumerate(admitted_per_shard):
        shard = tagged[i::n]
        requests.append(len(shard))
        chosen.extend((src, base) for src, _, base in shard[:count])
    return chosen, requests


def parse_shard(shard: Optional[str], key: str = "shard") -> tuple[int, int]:
    """(index, count) of ``shard`` = "i/n"; (0, 1) for None. ``key``: the setting named in errors (shard, part)."""
    if shard is None:
        return 0, 1
    parts = str(shard).split("/")
    try:
        index, count = int(parts[0]), int(parts[1])
        if len(parts) != 2:
            raise ValueError
    except (ValueError, IndexError):
        example = ("shard=0/2 and shard=1/2 for two GPUs" if key == "shard"
                   else f"{key}=0/2 and {key}=1/2 for two processes")
        raise ConfigError(f"{key}: {shard!r}; write it as 'i/n' (0 <= i < n), e.g. {example}") from None
    if not 0 <= index < count:
        raise ConfigError(f"{key}: {shard!r}; the index must satisfy 0 <= i < n")
    return index, count


ConfigStore.instance().store(name="make_training_data_schema", node=MakeTrainingDataSchema)


def prompt_seed(seed: int, prompt_id: str) -> int:
    """Sampling seed of one prompt: stable across runs, batch composition and machines."""
    return zlib.crc32(f"{seed}:{prompt_id}".encode()) & 0x7FFF_FFFF


def collect_prompts(sources: list[str], split: str, num_prompts: int | None, seed: int,
                    exclude: set[str] | None = None, paths: dict[str, str] | None = None
                    ) -> list[tuple[str, str, list[dict]]]:
    """(source workload, prompt id, chat messages) for every selected prompt, source by source; ``paths``: a
    source's ``path`` setting (its file), by source.

    Prompts whose id is in ``exclude`` are dropped BEFORE the first ``num_prompts`` of each
    source are taken, so a source still gives ``num_prompts`` (or all it has left).
    """
    if split not in ("train", "eval"):
        raise ConfigError(f"split: {split!r}; use 'train' (training data) or 'eval' (held-out calibration data)")
    if not sources:
        raise ConfigError(f"sources: give at least one workload, e.g. {DEFAULT_SOURCES}")
    paths = dict(paths or {})
    unused = sorted(set(paths) - set(sources))
    if unused:
        raise ConfigError(f"source_paths: {unused} are not among sources {list(sources)}")
    items = []
    for name in sources:
        extra = {"path": paths[name]} if name in paths else {}
        workload = build_workload(make_spec(name, split=split, num_prompts=None, seed=seed, **extra))
        prompts = workload.prompts()
        if exclude:
            prompts = [p for p in prompts if p.id not in exclude]
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


def response_sampling(sampling: Any, pid: str, max_tokens: int, seed: int) -> SamplingParams:
    """How the target answers the sample ``pid`` (``ID`` or ``ID#j``, :func:`expand_samples`): the configured
    sampling, or greedy for a prompt's first sample with ``sampling.greedy_first``."""
    if sampling.greedy_first and "#" not in pid:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=prompt_seed(seed, pid))
    return SamplingParams(temperature=float(sampling.temperature), top_p=float(sampling.top_p),
                          top_k=int(sampling.top_k), max_tokens=max_tokens, seed=prompt_seed(seed, pid))


def run(cfg: Any, target=None, tokenizer=None) -> dict[str, Any]:
    """Generate and save the data; ``target``/``tokenizer`` override loading cfg.model (tests)."""
    from dspark.engine import Engine

    from runners.common import writable_folder

    if not str(cfg.output).endswith(".safetensors"):
        raise ConfigError(f"output: {cfg.output} must be a .safetensors file, e.g. "
                          "output=training_data/train.safetensors")
    writable_folder(Path(cfg.output).parent, "output")  # before any model loads
    engine_cfg = to_engine_config(cfg.engine, spec="off")
    exclude, exclude_info = excluded_prompt_ids(cfg.get("exclude_prompts"))
    source_paths = dict(cfg.get("source_paths") or {})
    items = collect_prompts(list(cfg.sources), cfg.split, cfg.num_prompts_per_source, int(cfg.seed), exclude=exclude,
                            paths=source_paths)
    if not items:
        hint = (f"; a drafter trained on the whole train split is calibrated on the eval split of the "
                f"training-only sources: split=eval sources={CALIBRATION_EVAL_SOURCES}"
                if exclude and cfg.split == "train" else "")
        raise ConfigError(f"no prompt left: sources {list(cfg.sources)} of split {cfg.split!r} minus the "
                          f"{len(exclude)} excluded ids{hint}")
    # expand with the base id carried along, so the prompt record can name base ids
    tagged = expand_samples([(src, pid, (pid, msgs)) for src, pid, msgs in items],
                            dict(cfg.get("samples_per_prompt") or {}), int(cfg.seed))
    shard_index, shard_count = parse_shard(cfg.get("shard"))
    tagged = tagged[shard_index::shard_count]
    max_requests = cfg.get("max_requests")
    if max_requests is not None:
        if isinstance(max_requests, bool) or not isinstance(max_requests, int) or max_requests < 1:
            raise ConfigError(f"max_requests: a whole number of requests >= 1 (or null: every request), "
                              f"got {max_requests!r}")
        if max_requests > len(tagged):
            raise ConfigError(f"max_requests={max_requests}: this run has only {len(tagged)} requests (sources, "
                              f"samples_per_prompt, num_prompts_per_source and shard decide them); a run that "
                              f"admitted {max_requests} had other settings")
        tagged = tagged[:max_requests]
    part_index, part_count = parse_shard(cfg.get("part"), "part")
    tagged = tagged[part_index::part_count]
    if not tagged:
        raise ConfigError(f"part={cfg.get('part')}: this part of the {part_count} holds no request (the list has "
                          f"fewer requests than parts)")
    items = [(src, pid, msgs) for src, pid, (_, msgs) in tagged]
    base_ids = [base for _, _, (base, _) in tagged]
    if target is None:
        from runners.train_drafter import load_target_and_tokenizer

        target, tokenizer = load_target_and_tokenizer(cfg)
    if tokenizer is None:
        raise ConfigError("make_training_data needs a tokenizer with a chat template to render the prompts")
    engine = Engine(target, tokenizer, engine_cfg)
    s = cfg.sampling
    params = [response_sampling(s, pid, int(cfg.max_tokens), int(cfg.seed)) for _, pid, _ in items]
    info = {"model": str(cfg.model.source), "split": cfg.split, "seed": int(cfg.seed), "max_tokens": int(cfg.max_tokens),
            "sampling": {"temperature": float(s.temperature), "top_p": float(s.top_p), "top_k": int(s.top_k),
                         "greedy_first": bool(s.greedy_first)},
            "sources": list(cfg.sources), "num_prompts_per_source": cfg.num_prompts_per_source,
            "shard": f"{shard_index}/{shard_count}", "max_requests": max_requests,
            "part": f"{part_index}/{part_count}",
            "samples_per_prompt": dict(cfg.get("samples_per_prompt") or {}),
            "exclude_prompts": exclude_info or None, "source_paths": source_paths or None,
            "engine": {"device": engine_cfg.device, "dtype": engine_cfg.dtype, "max_num_seqs": engine_cfg.max_num_seqs}}
    t0 = time.perf_counter()
    dataset, failed = generate_dataset(engine, [(src, msgs) for src, _, msgs in items], params, info=info,
                                       progress=bool(cfg.progress), time_budget_s=cfg.get("time_budget_s"),
                                       in_flight=cfg.get("in_flight"), refill_at=cfg.get("refill_at"))
    wall = time.perf_counter() - t0
    interrupted = dataset.info.get("interrupted")
    if interrupted is not None and len(dataset) == 0:
        print("make_training_data: interrupted before any response finished; nothing written")
        raise KeyboardInterrupt
    if len(dataset) == 0:
        raise RuntimeError(f"no prompt produced a response ({len(failed)} failed; first error: "
                           f"{failed[0]['error'] if failed else 'none'})")
    out = dataset.save(cfg.output)
    admitted = len(items) - int(dataset.info.get("not_admitted", 0))
    per_source: dict[str, int] = {}
    for src, _, _ in items[:admitted]:
        per_source[src] = per_source.get(src, 0) + 1
    recipe = {k: info[k] for k in ("split", "seed", "sources", "num_prompts_per_source", "samples_per_prompt",
                                   "exclude_prompts")}
    recipe["shards"] = [{"shard": f"{shard_index}/{shard_count}", "requests": len(items), "admitted": admitted,
                         **({"part": f"{part_index}/{part_count}"} if part_count > 1 else {})}]
    record = write_prompt_record(prompt_record_path(cfg.output), base_ids[:admitted], recipe, per_source)
    counters = engine.counters()
    steps = int(counters["steps"])
    # How the steps ran (graph replays, eager steps and why, prefill-mixed steps): what to read
    # first when generation is slower than the decode benchmarks.
    engine_summary = {k: counters[k] for k in sorted(counters) if k.startswith("eager_reason/") or k in (
        "steps", "decode_steps", "mixed_steps", "prefill_tokens", "emitted_tokens", "graph_replays",
        "eager_steps", "graphs_captured")}
    engine_summary.update(ms_per_step=round(1000 * wall / steps, 3) if steps else None,
                          mean_tokens_per_step=round(counters["emitted_tokens"] / steps, 2) if steps else None)
    summary = {"output": str(Path(out).resolve()), "prompt_record": str(record.resolve()),
               "excluded_prompt_ids": len(exclude), "prompts": len(items), "failed": len(failed),
               "engine_steps": engine_summary,
               "not_admitted": dataset.info.get("not_admitted", 0),
               "failures": [{**f, "id": items[f["index"]][1]} for f in failed[:20]],
               "wall_s": round(wall, 2), **dataset.summary()}
    if failed:
        print(f"warning: {len(failed)} of {len(items)} prompts failed and are not in the data; first: "
              f"{summary['failures'][0]}")
    if interrupted is not None:  # what finished is kept; the run still ends as interrupted
        print(json.dumps(summary, indent=2))
        print(f"make_training_data: interrupted; {len(dataset)} finished responses written to {out} "
              f"({interrupted['unfinished']} unfinished and {summary['not_admitted']} never admitted left out; "
              f"the prompt record lists every admitted prompt)")
        raise KeyboardInterrupt
    return summary


@runner_main("make_training_data")
def main(cfg: DictConfig) -> None:
    print(json.dumps(run(cfg), indent=2))


if __name__ == "__main__":
    main()
