"""Decode throughput of the engine: target-only and speculative arms at several batch sizes.

    python -m runners.bench_decode                       # CPU defaults (batch 1, 16, 64), poetry eval prompts
    python -m runners.bench_decode engine=h200 batch_sizes=[1,4,16,64,128,256]
    python -m runners.bench_decode +workload=mixed_chat                          # an A/B's workload group
    python -m runners.bench_decode +workload=custom workload.path=F.jsonl        # any JSONL of prompts

The prompts come from the same ``workload`` config group as ``runners.ab`` (conf/workload/*.yaml, added
with ``+workload=NAME``): the group's name, seed, split, path and num_prompts select exactly the
prompts an A/B run with that group gets, in the same order (see :func:`bench_prompts`). Without a
group, the old default: ``num_prompts`` poetry prompts of ``workload_split`` (eval), seed 0, as many
as the largest batch needs. ``workload_split`` also overrides a group's split. Whatever the workload's
sampling settings, every request here is greedy with ``new_tokens`` tokens and ignore_eos.

Each (arm, batch size) runs `batch_size` requests of workload prompts with ignore_eos and
a fixed output length, in as many consecutive sets of distinct prompts as it takes to serve
at least `min_requests` requests (so batch 1 is not one prompt's acceptance); only
decode-only steps at full batch (no prefill in the step) are timed, after `warmup_steps`
of them in each set. Reports output tokens/s over those steps and the median ms per
step, plus acceptance length for speculative arms. Writes bench_decode.json and
bench_decode.md into the output folder.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omegaconf import DictConfig, OmegaConf

from dspark.bench.fingerprint import node_fingerprint
from dspark.bench.gc_pauses import GC_MODES, GcPauses  # noqa: F401  (GC_MODES: the allowed gc_mode values)
from dspark.config import ConfigError, SamplingParams
from dspark.engine import Engine
from runners.hydra_main import runner_main
from runners.schema import RunOrder, to_engine_config
from workloads.registry import build_workload, make_spec

ROOT = Path(__file__).resolve().parents[1]


RUN_ORDERS = tuple(o.value for o in RunOrder)


def run_order(arms: list[str], batches: list[int], order: str = "arm_major", rounds: int = 1
              ) -> list[tuple[int, str, int]]:
    """The (round, arm, batch) jobs in the order they run.

    ``arm_major`` runs every batch of an arm before the next arm, so the last arm always runs
    last (after every other engine of the process): a host or device that drifts over the run
    is then read as that arm's cost. ``batch_major`` runs every arm at a batch before the next
    batch. ``alternating`` is batch-major with the arms in the given order at even positions
    (round * len(batches) + batch index) and reversed at odd ones, so each arm runs early as
    often as late, and a drift shows as a difference between the rounds or batches.
    """
    if order not in RUN_ORDERS:
        raise ConfigError(f"order: {order!r}; use one of {list(RUN_ORDERS)}")
    if int(rounds) < 1:
        raise ConfigError(f"rounds: {rounds}; run the schedule at least once (rounds=1)")
    if not arms:
        raise ConfigError("arms: give at least one arm")
    jobs = []
    for r in range(int(rounds)):
        if order == "arm_major":
            jobs.extend((r, a, b) for a in arms for b in batches)
            continue
        for j, b in enumerate(batches):
            names = arms if order == "batch_major" or (r * len(batches) + j) % 2 == 0 else arms[::-1]
            jobs.extend((r, a, b) for a in names)
    return jobs


def median_over_rounds(results: list[dict]) -> list[dict]:
    """Per (arm, batch): median ms/step and output tokens/s over the rounds, and each round's tokens/s."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in sorted(results, key=lambda x: x["round"]):
        groups.setdefault((r["arm"], r["batch_size"]), []).append(r)
    return [{"arm": arm, "batch_size": b, "rounds": len(rows),
             "ms_per_step_median": statistics.median(x["ms_per_step_median"] for x in rows),
             "output_tokens_per_s": statistics.median(x["output_tokens_per_s"] for x in rows),
             "output_tokens_per_s_by_round": [x["output_tokens_per_s"] for x in rows],
             "run_positions": [x["run_position"] for x in rows]}
            for (arm, b), rows in groups.items()]


DEFAULT_WORKLOAD = "poetry"


def bench_prompts(cfg: DictConfig, needed: int) -> tuple[Any, list, dict[str, Any]]:
    """The workload, its prompts (chat messages or raw text, in order) and a JSON-ready description.

    With a ``workload`` group (``+workload=NAME``): the group's spec as ``runners.ab`` builds it
    (``workload_split``, when set, replaces its split), so the prompts are exactly an A/B run's. The
    runs take them in order, ``needed`` of them (``prompts[i % len]``); a selection of fewer than
    ``needed`` prompts is refused, naming the fixes, unless ``repeat_prompts=true`` (the A/B's exact
    prompts, repeated within a batch). Without a group: ``needed`` poetry prompts of ``workload_split``
    (default eval), seed 0 (the old default). Raises ConfigError / WorkloadError before any model loads.
    """
    split = cfg.get("workload_split")
    group = cfg.get("workload")
    if group is None:
        spec = make_spec(DEFAULT_WORKLOAD, num_prompts=needed, seed=0, greedy_replica_count=0,
                         split=str(split or "eval"))
    else:
        w = OmegaConf.to_container(group, resolve=True)
        name = w.pop("name")
        if split is not None:
            w["split"] = str(split)
        w["greedy_replica_count"] = 0  # bench_decode runs no greedy replicas (every request is greedy)
        spec = make_spec(name, **w)
    wl = build_workload(spec)
    chosen = wl.prompts()  # a bad custom file or a too-small split fails here, before any model loads
    repeat = bool(cfg.get("repeat_prompts", False))
    if len(chosen) < needed and not repeat:
        raise ConfigError(
            f"workload {spec.name!r} selects {len(chosen)} prompt(s) (workload.num_prompts={spec.num_prompts}, split "
            f"{spec.split!r}) but the largest run needs {needed} distinct prompts (batch x prompt sets for "
            f"min_requests); set workload.num_prompts={needed} or workload.num_prompts=null (every prompt of the "
            f"split), or repeat_prompts=true to cycle through these {len(chosen)} prompts")
    info = {"name": spec.name, "spec": spec.to_dict(), "group": group is not None, "selected": len(chosen),
            "used": min(len(chosen), needed), "repeated": len(chosen) < needed,
            "available": len(wl.available()), "first_ids": [p.id for p in chosen[:5]]}
    return wl, [p.messages if p.messages is not None else p.prompt for p in chosen], info


def prompt_sets(batch: int, min_requests: int) -> int:
    """Consecutive sets of `batch` distinct prompts that serve at least `min_requests` requests."""
    if batch < 1 or min_requests < 1:
        raise ConfigError(f"batch ({batch}) and min_requests ({min_requests}) must be >= 1")
    return -(-min_requests // batch)


def bench_one(engine: Engine, prompts: list, batch: int, new_tokens: int, warmup_steps: int,
              sets: int = 1, gc_mode: str = "default", step_trace: bool = False) -> dict[str, Any]:
    engine.reset()
    if step_trace:
        engine.start_step_trace()  # kept in engine.step_trace for the caller
    sp = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    decode_steps: list[float] = []
    step_waits: list[float] = []
    step_tokens: list[int] = []
    outputs: dict[int, list[int]] = {}
    prompt_lens: dict[int, int] = {}
    timed_oracle: list[int] = []
    tokens_in_timed = 0
    with GcPauses(gc_mode) as pauses:
        t_all = time.perf_counter()
        for s in range(sets):  # the engine's counters run on across sets: the row sums all of them
            for i in range(batch):
                engine.add_request(prompts[(s * batch + i) % len(prompts)], sp)
            tokens_in_timed += _run_set(engine, batch, warmup_steps, decode_steps, outputs, step_tokens, prompt_lens,
                                        step_waits, timed_oracle)
        wall = time.perf_counter() - t_all
    row = _row(engine, batch, sets, decode_steps, outputs, tokens_in_timed, wall, warmup_steps)
    # The oracle over the timed steps alone: the window an arm's tokens/s is measured on (the
    # "oracle" entry covers every step, ramp-up and tail included, whose headroom differs).
    row["oracle_timed"] = engine.oracle_bound_over(timed_oracle)
    # Where the timed steps' wall time went: the host's own work, and its wait for the device (0 on
    # the eager path). A step far above its device time with a short host time points elsewhere
    # (the collector's pauses below, or device idle: graph_timing's step gaps).
    row["ms_per_step_p90"] = float(np.percentile(decode_steps, 90))
    row["ms_per_step_max"] = max(decode_steps)
    row["host_ms_timed_median"] = statistics.median(w - d for w, d in zip(decode_steps, step_waits))
    row["wait_ms_timed_median"] = statistics.median(step_waits)
    row.update(pauses.summary())
    # The context a decode step attends over, averaged over the run: prompt plus half the output.
    row["mean_context_tokens"] = statistics.fmean(prompt_lens[k] + len(outputs[k]) / 2 for k in outputs)
    row["cost_table_context_tokens"] = cost_table_context(engine)
    row.update(throughput_interval(decode_steps, step_tokens))
    return row


def throughput_interval(step_ms: list[float], step_tokens: list[int], resamples: int = 1000,
                        seed: int = 0) -> dict[str, Any]:
    """How precisely the timed steps pin the throughput: the mean step time's standard error and a
    95% bootstrap interval (steps resampled, seeded) of output tokens/s = sum(tokens) / sum(ms).
    Two arms whose intervals overlap are not told apart by this run."""
    import random

    n = len(step_ms)
    out: dict[str, Any] = {"ms_per_step_mean": statistics.fmean(step_ms) if n else None,
                           "ms_per_step_se": statistics.stdev(step_ms) / n ** 0.5 if n > 1 else None,
                           "output_tokens_per_s_ci95": None}
    if n > 1 and len(step_tokens) == n:
        rng = random.Random(seed)
        rates = []
        for _ in range(resamples):
            idx = [rng.randrange(n) for _ in range(n)]
            rates.append(sum(step_tokens[i] for i in idx) / (sum(step_ms[i] for i in idx) / 1e3))
        rates.sort()
        out["output_tokens_per_s_ci95"] = [rates[int(0.025 * resamples)], rates[int(0.975 * resamples) - 1]]
    return out


def add_oracle_shares(results: list[dict]) -> None:
    """Each trimming arm's share of the oracle's gain, like for like: its tokens/s over the full-block
    arm's of the same round and batch, minus 1, over the oracle headroom of that full arm's timed
    steps. Needs a verify=full arm with a cost table in the same round and batch; else None."""
    fulls = {(r["round"], r["batch_size"]): r for r in results if r.get("oracle_timed") and r.get("verify") == "full"}
    for r in results:
        full = fulls.get((r["round"], r["batch_size"]))
        r["oracle_share_timed"] = None
        if full is None or r is full or r.get("verify") not in ("uniform", "ragged"):
            continue
        headroom = full["oracle_timed"]["headroom_vs_full_block"]
        gain = r["output_tokens_per_s"] / full["output_tokens_per_s"] - 1.0
        r["gain_over_full"] = gain
        r["oracle_headroom_timed"] = headroom
        r["oracle_share_timed"] = gain / headroom if headroom > 0 else None


def cost_table_context(engine: Engine) -> int | None:
    """The context length the engine's cost table was profiled at (``runners.profile prompt_len``,
    recorded in its fingerprint), or None (no table, or one from before it was recorded)."""
    table = engine.cost_table
    value = None if table is None else table.fingerprint.get("profile_context_tokens")
    return None if value is None else int(value)


def context_note(results: list[dict], ratio: float = 1.5) -> str | None:
    """A warning when the planner's cost table was profiled at much shorter contexts than the run's
    decode steps attend over: attention over the longer KV is paid per request whatever the verified
    length, so such a table can overstate what trimming saves (and the oracle's headroom)."""
    worst = None
    for r in results:
        table_ctx, ctx = r.get("cost_table_context_tokens"), r.get("mean_context_tokens")
        if table_ctx and ctx and ctx > ratio * table_ctx and (worst is None or ctx > worst[1]):
            worst = (table_ctx, ctx)
    if worst is None:
        return None
    return (f"Note: the cost table was profiled at {worst[0]}-token contexts and this run's decode steps attended "
            f"over up to {worst[1]:.0f} tokens on average. Attention reads every request's KV whatever its verified "
            f"length, a cost the table does not model, so its predicted gains and the oracle bound may overstate "
            f"what trimming saves here. Profile at the workload's context (runners.profile prompt_len=...).")


def _run_set(engine: Engine, batch: int, warmup_steps: int, decode_steps: list[float],
             outputs: dict[int, list[int]], step_tokens: list[int] | None = None,
             prompt_lens: dict[int, int] | None = None, step_waits: list[float] | None = None,
             oracle_steps: list[int] | None = None) -> int:
    """Step until the set's requests finish; append the timed steps' ms (and, into step_waits, the ms
    each of them waited for the device; into oracle_steps, the engine's oracle records of the steps
    committed in the timed calls); return their tokens."""
    tokens_in_timed = 0
    seen = 0
    while engine.has_unfinished():
        recorded = engine.oracle_steps_recorded
        # The step is timed by the wall clock around engine.step() and nothing else runs in this
        # loop (no engine.counters(): its summaries cost host time that, with the overlap
        # scheduler, would hide the device's work and flatter the step time).
        before = engine.emitted_tokens
        t0 = time.perf_counter()
        for out in engine.step():
            outputs[out.req_id] = list(out.token_ids)
            if prompt_lens is not None and out.finish_reason is not None:  # once per request
                prompt_lens[out.req_id] = len(out.prompt_token_ids)
        step_ms = (time.perf_counter() - t0) * 1e3
        emitted = engine.emitted_tokens - before
        info = engine.last_step
        if info is None or info.num_prefill_tokens or info.num_decodes != batch:
            continue  # a step with prefill, or a ragged tail of finishing requests: not steady-state decode
        seen += 1
        if seen <= warmup_steps:
            continue
        decode_steps.append(step_ms)
        if oracle_steps is not None:  # the step this call committed (with overlap: the one launched before)
            oracle_steps.extend(range(recorded, engine.oracle_steps_recorded))
        if step_waits is not None:
            step_waits.append(info.wait_ms)
        if step_tokens is not None:
            step_tokens.append(emitted)
        tokens_in_timed += emitted
    return tokens_in_timed


def _row(engine: Engine, batch: int, sets: int, decode_steps: list[float], outputs: dict[int, list[int]],
         tokens_in_timed: int, wall: float, warmup_steps: int) -> dict[str, Any]:
    if not decode_steps:
        raise ConfigError(f"batch {batch}: no steady decode step was timed; raise new_tokens above warmup_steps "
                          f"({warmup_steps}) times the acceptance length, or, with long prompts, make room for all "
                          f"{batch} requests at once (engine.kv_cache_tokens / engine.num_kv_blocks): only steps "
                          f"that decode the full batch are timed")
    c = engine.counters()
    total_ms = sum(decode_steps)
    return {
        "batch_size": batch,
        "prompt_sets": sets,
        "requests": sets * batch,
        "timed_steps": len(decode_steps),
        "ms_per_step_median": statistics.median(decode_steps),
        "output_tokens_per_s": tokens_in_timed / (total_ms / 1e3),
        "tokens_per_step": tokens_in_timed / len(decode_steps),
        "accept_length": (c["emitted_tokens"] / c["request_steps"]) if c["request_steps"] else None,
        "wall_s": wall,
        # Scheduling: what the planner predicted and what the trim delivered (verify != full).
        "trim_ratio": c.get("trim_ratio"),
        "trimmed_steps": c.get("trimmed_steps"),
        "predicted_gain_mean": c.get("sched/predicted_gain_mean"),
        "predicted_tokens_total": c.get("sched/predicted_tokens_total"),
        "realised_tokens_on_predicted": c.get("sched/realised_tokens_on_predicted"),
        "block_accept_length": c.get("sched/block_accept_length"),
        "oracle": {k.split("/", 1)[1]: v for k, v in c.items() if k.startswith("oracle/")} or None,
        # What actually ran: a graph arm that never replayed a graph must not be reported as one.
        "graph_replays": c.get("graph_replays", 0),
        "graphs_captured": c.get("graphs_captured"),
        # One-token target steps that ran the one-launch decode kernel (kernels/decode_megakernel.py).
        "megakernel_steps": c.get("megakernel_steps", 0),
        # Host scheduling work per device-resident step (wall time minus waiting for the device);
        # with overlap it runs while the device computes, so it is hidden when below the step time.
        "host_ms_per_step_median": c.get("host_ms_per_graph_step_median"),
        "eager_steps": c.get("eager_steps", 0),
        "pipelined_steps": c.get("pipelined_steps", 0),
        "outputs": [outputs[k] for k in sorted(outputs)],
    }


def run(cfg: DictConfig) -> dict:
    from runners.common import build_engine, check_sampling, writable_folder

    writable_folder(cfg.output_dir, "output_dir")  # before any model loads
    check_sampling({"max_tokens": "new_tokens"}, temperature=0.0, max_tokens=int(cfg.new_tokens))
    base = to_engine_config(cfg.engine)
    engine_base = OmegaConf.to_container(cfg.engine, resolve=True)

    def _arm(over):
        o = OmegaConf.to_container(over, resolve=True)
        merged = {**engine_base, **o}
        if isinstance(o.get("kernels"), dict):  # engine.kernels.* overrides: on top of the group's
            merged["kernels"] = {**(engine_base.get("kernels") or {}), **o["kernels"]}
        return to_engine_config(merged)

    arms = {name: _arm(over) for name, over in cfg.arms.items()}
    batches = [int(b) for b in cfg.batch_sizes]
    if not batches or min(batches) < 1:
        raise ConfigError(f"batch_sizes: positive integers required, got {batches}")
    # refused before any model is loaded
    gc_mode = GcPauses(str(cfg.get("gc_mode", "default"))).mode
    rounds = int(cfg.get("rounds", 1))
    jobs = run_order(list(arms), batches, str(cfg.get("order", "arm_major")), rounds)
    sets = {b: prompt_sets(b, int(cfg.min_requests)) for b in batches}
    _, prompts, workload_info = bench_prompts(cfg, max(b * n for b, n in sets.items()))
    need_drafter = any(a.spec == "dspark" for a in arms.values())
    trace = bool(cfg.get("step_trace", False))
    if trace:
        graph_arms = [n for n, a in arms.items() if a.spec == "dspark" and a.cuda_graphs]
        if graph_arms:
            raise ConfigError(f"step_trace=true: the trace is recorded by eager steps, and arms {graph_arms} run "
                              f"CUDA graphs; set engine.cuda_graphs=false (or step_trace=false)")
        if not need_drafter:
            raise ConfigError("step_trace=true: no arm is speculative (spec=dspark), so there is nothing to trace")
    # This engine only loads the models (the arms reuse them): no cost table, no graphs.
    first = build_engine(cfg, dataclasses.replace(base, spec="dspark" if need_drafter else "off", verify="full",
                                                  cost_table=None, cuda_graphs=False, overlap=False, tiers=None,
                                                  max_num_seqs=max(batches)))
    results = []
    from tqdm.auto import tqdm

    for position, (rnd, name, b) in enumerate(tqdm(jobs, desc="bench_decode", disable=not cfg.progress)):
        ecfg = dataclasses.replace(arms[name], max_num_seqs=max(b, 1))
        engine = Engine(first.target, first.tokenizer, ecfg, first.drafter if ecfg.spec == "dspark" else None)
        timing = bool(cfg.get("graph_timing", False)) and ecfg.cuda_graphs and torch.cuda.is_available()
        if timing:
            engine.graph.start_timing()
        row = {"arm": name, "round": rnd, "run_position": position, "verify": ecfg.verify,
               **bench_one(engine, prompts, b, int(cfg.new_tokens), int(cfg.warmup_steps), sets[b],
                           gc_mode=gc_mode, step_trace=trace and ecfg.spec == "dspark")}
        if engine.step_trace is not None:
            name_ = f"step_trace_{name}_b{b}_r{rnd}.npz"
            engine.step_trace.save(Path(cfg.output_dir) / name_)
            row["step_trace"] = name_
        if timing:  # device ms per graph and per step (draft + verify span), warm-up steps left out
            row["device_timing"] = engine.graph.timing_summary(skip_steps=int(cfg.warmup_steps))
        if ecfg.cuda_graphs and engine.graph.use_graphs and row["graph_replays"] == 0:
            raise RuntimeError(f"arm {name} batch {b}: engine.cuda_graphs is on but no step replayed a graph "
                               f"(eager reasons: {engine.eager_reasons}); refusing to report it as a graph arm")
        results.append(row)
        del engine
        gc.collect()  # engines hold reference cycles (planner stats, graph decoder): free their GPU memory now
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    # Greedy outputs of every arm against the first arm at the same batch size.
    first_arm = next(iter(arms))
    reference = {(r["round"], r["batch_size"]): r["outputs"] for r in results if r["arm"] == first_arm}
    for r in results:
        ref = reference[(r["round"], r["batch_size"])]
        r["requests_differing_from_" + first_arm] = sum(a != b for a, b in zip(r["outputs"], ref))
        r["output_tokens_total"] = sum(len(o) for o in r.pop("outputs"))
    add_oracle_shares(results)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = median_over_rounds(results) if rounds > 1 else None
    doc = {"results": results, "config": OmegaConf.to_container(cfg, resolve=True), "workload": workload_info,
           "fingerprint": node_fingerprint(None, ROOT)}
    if summary is not None:
        doc["median_over_rounds"] = summary
    (out_dir / "bench_decode.json").write_text(json.dumps(doc, indent=2, default=str))
    wi = workload_info
    lines = [f"Prompts: workload {wi['name']} ({wi['spec']['split']} split, seed {wi['spec']['seed']}"
             + ("" if wi["group"] else ", the default") + f"), {wi['used']} distinct prompt(s) of {wi['selected']} "
             f"selected" + (" (repeated: repeat_prompts=true)" if wi["repeated"] else "")
             + f"; every request greedy, {int(cfg.new_tokens)} new tokens with ignore_eos.",
             f"Run order: {cfg.get('order', 'arm_major')}, {rounds} round(s); 'run' is each row's position in it.",
             "", "| arm | batch | run | ms/step (median) | output tok/s | 95% interval | timed steps | tokens/step | "
             f"accept length | trim ratio | predicted gain | graph replays / eager steps | requests differing from "
             f"{first_arm} |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    for r in results:
        ci = r.get("output_tokens_per_s_ci95")
        ci_text = "-" if not ci else f"{ci[0]:,.0f} to {ci[1]:,.0f}"
        lines.append(f"| {r['arm']} | {r['batch_size']} | {r['run_position']} | {r['ms_per_step_median']:.2f} | "
                     f"{r['output_tokens_per_s']:.1f} | {ci_text} | {r['timed_steps']} | {r['tokens_per_step']:.2f} | "
                     f"{fmt(r['accept_length'], '.2f')} | "
                     f"{fmt(r['trim_ratio'], '.3f')} | {fmt(r['predicted_gain_mean'], '+.3f')} | "
                     f"{r['graph_replays']} / {r['eager_steps']} | {r['requests_differing_from_' + first_arm]} |")
    shares = [r for r in results if r.get("oracle_share_timed") is not None]
    if shares:
        lines += ["", "Share of the oracle's gain over the timed steps (the arm's tokens/s against the full-block "
                  "arm's of the same round and batch, over the oracle headroom of that arm's timed steps):", "",
                  "| arm | batch | round | gain over full | oracle headroom (timed steps) | share |",
                  "|---|---|---|---|---|---|"]
        for r in shares:
            lines.append(f"| {r['arm']} | {r['batch_size']} | {r['round']} | {r['gain_over_full']:+.2%} | "
                         f"{r['oracle_headroom_timed']:+.2%} | {r['oracle_share_timed']:.0%} |")
    if summary is not None:
        lines += ["", f"Median over the {rounds} rounds (each round's tokens/s in run order of the rounds):", "",
                  "| arm | batch | ms/step (median of rounds) | output tok/s (median of rounds) | tok/s by round | "
                  "run positions |", "|---|---|---|---|---|---|"]
        for s_ in summary:
            lines.append(f"| {s_['arm']} | {s_['batch_size']} | {s_['ms_per_step_median']:.2f} | "
                         f"{s_['output_tokens_per_s']:.1f} | "
                         f"{', '.join(f'{v:,.0f}' for v in s_['output_tokens_per_s_by_round'])} | "
                         f"{', '.join(map(str, s_['run_positions']))} |")
    lines += ["", "Where the timed steps' time went (ms; host = a step's wall time minus its wait for the device; "
              f"gc = the garbage collector's pauses during the run, gc_mode={gc_mode}; "
              "device idle = graph_timing's share of the run with no graph on the device):", "",
              "| arm | batch | run | step median | step p90 | step max | host median | wait median | "
              "gc pauses (gen0/1/2) | gc ms total / max | device idle |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        idle = (r.get("device_timing") or {}).get("device_idle_fraction")
        lines.append(f"| {r['arm']} | {r['batch_size']} | {r['run_position']} | {r['ms_per_step_median']:.2f} | "
                     f"{r['ms_per_step_p90']:.2f} | {r['ms_per_step_max']:.2f} | {r['host_ms_timed_median']:.2f} | "
                     f"{r['wait_ms_timed_median']:.2f} | {'/'.join(map(str, r['gc_collections']))} | "
                     f"{r['gc_pause_ms_total']:.1f} / {r['gc_pause_ms_max']:.1f} | "
                     f"{'-' if idle is None else format(idle, '.1%')} |")
    note = context_note(results)
    if note:
        lines += ["", note]
    (out_dir / "bench_decode.md").write_text("\n".join(lines) + "\n")
    plot_results(summary if summary is not None else results, out_dir / "bench_decode.png")
    print("\n".join(lines))
    return doc


def plot_results(results: list[dict], path: Path) -> Path:
    """Output tokens/s and ms per step against batch size, one line per arm (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for arm in dict.fromkeys(r["arm"] for r in results):
        rows = sorted((r for r in results if r["arm"] == arm), key=lambda r: r["batch_size"])
        bs = [r["batch_size"] for r in rows]
        ax1.plot(bs, [r["output_tokens_per_s"] for r in rows], marker="o", label=arm)
        ax2.plot(bs, [r["ms_per_step_median"] for r in rows], marker="o", label=arm)
    for ax, title in ((ax1, "output tokens/s"), (ax2, "ms per decode step (median)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


@runner_main("bench_decode")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
