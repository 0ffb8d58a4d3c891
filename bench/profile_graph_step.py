"""Where a captured decode step's time goes on the GPU (issue 6: profile, not guess).

A random target with SmolLM2-135M's shape (30 layers, hidden 576) and a random drafter of
the shipped drafter's shape, bf16, Triton attention, device-resident steps: for each batch
size, count the kernels one step launches and their summed GPU time (torch.profiler over
an uncaptured run of the same step function), time graph replays with CUDA events, and
time the host's share of an overlapped engine step.

    python bench/profile_graph_step.py OUT_DIR [VARIANT ...]       # on a CUDA machine

VARIANTs (default: plain fused): ``engine.kernels`` settings of the layer kernels, each measured on the
same weights in one process (``VARIANTS`` below; ``rope+splitsN``: attention with N KV splits): ``plain`` (unfused modules), ``cublas`` (fused
norms, cuBLAS GEMMs), ``fused`` (small-M GEMV kernels, rotary separate), ``rope`` (the defaults: GEMV
with the QKV + rotary + K/V-write epilogue), ``rope+tiles`` (rope with the GEMV tile table named by
``CENSUS_TILES``, e.g. bench/small_m_sweep.py's small_m_tiles.json: split-K, unrolled loops),
``rope-step-kernels`` (rope with the step's argmax and packing/commit as PyTorch ops:
triton_argmax=false, fused_step_metadata=false), ``rope+l2`` (rope with the next layer's weights
read into L2 on a side stream, l2_prefetch=true), ``mega`` (rope, and one-token target steps as the
one-launch decode kernel, kernels/decode_megakernel.py), ``mega66`` / ``mega32`` (with 66 / 32
programs instead of one per SM). Batch sizes: ``PROFILE_BATCHES`` (default 1,16,64,256); arms:
``PROFILE_SPECS`` (default off,dspark); prompt lengths: ``PROFILE_PROMPT_LENS``, a JSON file whose
``prompt_tokens`` list is cycled over the requests (bench/prompt_lengths_mixed_chat.json: the mixed_chat
workload's), default 512 tokens each. ``PROFILE_TRACE=1`` also keeps every kernel of each census in launch order
(``trace`` in the JSON: name and device us), to find chains of small kernels worth fusing.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from dspark.config import DrafterConfig, EngineConfig, ModelConfig, SamplingParams
from dspark.engine import Engine
from dspark.models.drafter import DSparkDrafter
from dspark.models.llama import TargetModel

SMOLLM2 = ModelConfig(arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                      num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0,
                      max_position_embeddings=8192, tie_word_embeddings=True, attention_bias=False, qk_norm=False,
                      bos_token_id=1, eos_token_ids=(2,))
DRAFTER = DrafterConfig(block_size=7, num_layers=2, target_layer_ids=(2, 15, 27), markov_rank=32)


NEW_TOKENS = 400  # per request: more than the steps a profile runs


def prompt_lengths(batch: int) -> list[int]:
    """The batch's prompt lengths: PROFILE_PROMPT_LENS's list cycled, or 512 each."""
    import os

    path = os.environ.get("PROFILE_PROMPT_LENS")
    if not path:
        return [512] * batch
    lens = json.loads(Path(path).read_text())["prompt_tokens"]
    return [int(lens[i % len(lens)]) for i in range(batch)]


def engine_for(spec: str, lens: list[int], target, drafter, kernels: dict | None = None) -> Engine:
    longest = max(lens) + NEW_TOKENS + 16
    cfg = EngineConfig(device="cuda", dtype="bfloat16", attention_backend="triton", max_num_seqs=len(lens),
                       kv_cache_tokens=sum(lens) + len(lens) * (NEW_TOKENS + 16) + longest, max_model_len=longest,
                       max_num_batched_tokens=8192, spec=spec, cuda_graphs=True, overlap=True, kernels=kernels or {})
    return Engine(target, None, cfg, drafter if spec == "dspark" else None)


def profile(spec: str, batch: int, target, drafter, kernels: dict | None = None) -> dict:
    lens = prompt_lengths(batch)
    eng = engine_for(spec, lens, target, drafter, kernels)
    g = torch.Generator().manual_seed(batch)
    sp = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    for n in lens:
        eng.add_request(torch.randint(3, 49000, (n,), generator=g).tolist(), sp)
    sched = eng.scheduler
    while (eng.counters()["graph_replays"] < 5 or sched.waiting
           or any(r.in_prefill for r in sched.running)):  # every prompt prefilled: the steps below decode only
        eng.step()
    gd = eng.graph
    R = gd.bucket_for(batch) // gd.M
    # The overlapped step's period, and the host's own work per step (wall time minus the wait
    # for the device, from the engine's counters): overlap hides the host work when it is shorter.
    eng._host_step_ms = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(30):
        eng.step()
    torch.cuda.synchronize()
    period_ms = (time.perf_counter() - t0) * 1e3 / 30
    host_ms = eng.counters()["host_ms_per_graph_step_median"]
    megakernel_steps = eng.counters()["megakernel_steps"]  # > 0: the step ran the one-launch decode kernel
    eng._drain()
    # Graph replay alone (device time per step): state advances, which is fine for timing.
    graph = gd.graphs[("step", gd.bucket_for(batch), gd.sampling)]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    replay_ms = start.elapsed_time(end) / 20
    # Kernel census of one uncaptured run of the same step function.
    saved = (gd.seq_len.clone(), gd.anchor.clone())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof, torch.inference_mode():
        gd._step(R)  # under inference mode, as the engine runs it (the fused kernels need grad off)
        torch.cuda.synchronize()
    gd.seq_len.copy_(saved[0])
    gd.anchor.copy_(saved[1])
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    us = [e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total for e in kernels]
    by_name: Counter = Counter()
    count: Counter = Counter()
    for e, t in zip(kernels, us):
        name = e.name[:60]
        by_name[name] += t
        count[name] += 1
    total_us = sum(by_name.values())
    top = [{"kernel": k, "calls": count[k], "us": round(v, 1)} for k, v in by_name.most_common(12)]
    # PROFILE_TRACE=1: every kernel of the step in launch order (name, us), to find chains worth fusing.
    import os

    trace = None
    if os.environ.get("PROFILE_TRACE"):
        trace = [{"kernel": e.name[:90], "us": round(t, 2)}
                 for e, t in sorted(zip(kernels, us), key=lambda p: p[0].time_range.start)]
    del eng
    torch.cuda.empty_cache()
    return {"spec": spec, "batch": batch, "mean_prompt_tokens": sum(lens) / len(lens), "longest_prompt": max(lens),
            "tokens_per_step": R * gd.M, "kernels_per_step": len(kernels),
            "kernel_time_ms": total_us / 1e3, "graph_replay_ms": replay_ms, "overlapped_step_period_ms": period_ms,
            "host_ms_per_step_median": host_ms, "megakernel_steps": megakernel_steps, "top_kernels": top,
            **({"trace": trace} if trace is not None else {})}


VARIANTS = {  # engine.kernels settings (dspark.config.KernelSwitches) of each variant
    "plain": {"fused_layers": False},
    "cublas": {"small_m_kernels": False},
    "fused": {"fused_qkv_rope": False},
    "rope": {},
    "mega": {"decode_megakernel": True},
    "mega66": {"decode_megakernel": True, "megakernel_programs": 66},
    "mega32": {"decode_megakernel": True, "megakernel_programs": 32},
    "rope+tiles": {"small_m_tiles": "$CENSUS_TILES"},
    "rope-step-kernels": {"triton_argmax": False, "fused_step_metadata": False},
    "rope+splits1": {"attention_splits": 1},
    "rope+splits2": {"attention_splits": 2},
    "rope+splits4": {"attention_splits": 4},
    "rope+splits8": {"attention_splits": 8},
    "rope+splits16": {"attention_splits": 16},
    "rope+l2": {"l2_prefetch": True},
    "rope+l2x8": {"l2_prefetch": True, "l2_prefetch_programs": 8},
    "rope+l2x32": {"l2_prefetch": True, "l2_prefetch_programs": 32},
}


def _settings(variant: str) -> dict:
    """A variant's engine.kernels settings, with ``$NAME`` values read from this process's environment."""
    import os

    out = {}
    for key, value in VARIANTS[variant].items():
        if isinstance(value, str) and value.startswith("$"):
            if not os.environ.get(value[1:]):
                raise SystemExit(f"variant {variant} needs {value[1:]} (e.g. {value[1:]}=.../small_m_tiles.json)")
            value = os.environ[value[1:]]
        out[key] = value
    return out


def main(out_dir: str, variants: list[str]) -> None:
    import os

    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    batches = [int(b) for b in os.environ.get("PROFILE_BATCHES", "1,16,64,256").split(",")]
    settings = {v: _settings(v) for v in variants}
    torch.manual_seed(0)
    target = TargetModel(SMOLLM2)
    drafter = DSparkDrafter(SMOLLM2, DRAFTER)
    rows = []
    for variant in variants:
        for spec in os.environ.get("PROFILE_SPECS", "off,dspark").split(","):
            for b in batches:
                try:
                    measured = profile(spec, b, target, drafter, settings[variant])
                except Exception as e:  # a variant this machine cannot run is recorded, and the others still run
                    print(f"variant {variant} spec {spec} batch {b} failed: {type(e).__name__}: {e}", flush=True)
                    torch.cuda.empty_cache()
                    break
                r = {"variant": variant, "fused": variant != "plain", **measured}
                rows.append(r)
                print(json.dumps({k: v for k, v in r.items() if k not in ("top_kernels", "trace")}), flush=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile_graph_step.json").write_text(json.dumps({"rows": rows, "torch": torch.__version__,
                                                             "device": torch.cuda.get_device_name()}, indent=2))
    lines = ["| variant | spec | batch | tokens/step | kernels/step | summed kernel ms | graph replay ms | "
             "overlapped step ms | host ms/step |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['spec']} | {r['batch']} | {r['tokens_per_step']} | {r['kernels_per_step']} | "
                     f"{r['kernel_time_ms']:.2f} | {r['graph_replay_ms']:.2f} | {r['overlapped_step_period_ms']:.2f} | "
                     f"{r['host_ms_per_step_median']:.2f} |")
    for r in rows:
        if r["batch"] == min(batches) or os.environ.get("PROFILE_TOP_ALL"):
            lines += ["", f"Top kernels, {r['variant']}, spec={r['spec']}, batch {r['batch']}:", ""]
            lines += [f"- {t['kernel']}: {t['calls']} calls, {t['us']} us" for t in r["top_kernels"]]
    (out / "profile_graph_step.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/profile", sys.argv[2:] or ["plain", "fused"])
