"""Where the time of a confidence-scheduled captured step goes (what separates ragged from
full and uniform at batch 128/256). Random SmolLM2-shaped weights (as
bench/profile_graph_step.py), bf16, graphs + overlap, a steep synthetic cost table so the
planner trims. For each verify mode and batch size:

- the overlapped step period and the host's own share (engine counters);
- device ms of each captured graph the steps used (CUDA-event timed replays);
- a kernel census (torch.profiler) of the uncaptured draft and verify stages.

    python bench/profile_sched_stages.py OUT_DIR [batches=128,256] [modes=full,uniform,ragged] [top=8] [prompt=256]
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_graph_step import DRAFTER, SMOLLM2  # noqa: E402

from dspark.config import EngineConfig, SamplingParams  # noqa: E402
from dspark.cost_table import CostTable  # noqa: E402
from dspark.engine import Engine  # noqa: E402
from dspark.models.drafter import DSparkDrafter  # noqa: E402
from dspark.models.llama import TargetModel  # noqa: E402


CUDA = torch.cuda.is_available()  # without one: a CPU smoke run of this script on a 2-layer model


def config(batch: int, verify: str, table: str | None, max_model_len: int = 1200) -> EngineConfig:
    return EngineConfig(device="cuda" if CUDA else "cpu", dtype="bfloat16" if CUDA else "float32",
                        attention_backend="triton" if CUDA else "torch", max_num_seqs=batch,
                        kv_cache_tokens=batch * (max_model_len + 200), max_model_len=max_model_len, max_num_batched_tokens=8192,
                        spec="dspark", verify=verify, cost_table=table, cuda_graphs=True, overlap=True, budget_lag=2)


def steep_table(engine: Engine, path: Path) -> str:
    counts = list(range(1, 257)) + list(range(264, 8193, 8))
    CostTable(token_counts=tuple(counts), theta_ms=tuple(1.0 + 0.01 * m for m in counts), fixed_overhead_ms=0.5,
              fingerprint=engine.fingerprint()).save(path)
    return str(path)


def census(fn, top: int = 8, width: int = 60) -> dict:
    """Kernels one call of ``fn`` launches: their count, summed device ms, and the ``top`` kernels by device time
    (names cut at ``width`` characters)."""
    act = torch.profiler.ProfilerActivity.CUDA if CUDA else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[act]) as prof, torch.inference_mode():
        fn()
        if CUDA:
            torch.cuda.synchronize()
    by_name: Counter = Counter()
    calls: Counter = Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name[:width]] += getattr(e, "device_time_total", 0.0)
            calls[e.name[:width]] += 1
    return {"kernels": sum(calls.values()), "kernel_ms": sum(by_name.values()) / 1e3,
            "top": [{"kernel": k, "calls": calls[k], "us": round(v, 1)} for k, v in by_name.most_common(top)]}


def print_top(result: dict) -> None:
    """A census's top kernels, one per line: device us, calls, name."""
    for t in result["top"]:
        print(f"    {t['us']:9.1f} us x{t['calls']:<4} {t['kernel']}", flush=True)


def run(batch: int, verify: str, target, drafter, table: str | None, top: int = 8, prompt: int = 256) -> dict:
    eng = Engine(target, None, config(batch, verify, table, max(1200, prompt + 1100)), drafter)
    g = torch.Generator().manual_seed(batch)
    sp = SamplingParams(max_tokens=1000, ignore_eos=True)
    for _ in range(batch):
        eng.add_request(torch.randint(3, 49000, (prompt,), generator=g).tolist(), sp)
    while eng.counters()["graph_replays" if CUDA else "graph_eager_steps"] < 12:
        eng.step()
    gd = eng.graph
    eng._host_step_ms = []
    sync = torch.cuda.synchronize if CUDA else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(20):
        eng.step()
    sync()
    period = (time.perf_counter() - t0) * 1e3 / 20
    c = eng.counters()
    eng._drain()
    graphs = {}
    for key, graph in gd.graphs.items():
        saved = (gd.seq_len.clone(), gd.anchor.clone())
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        for _ in range(5):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        gd.seq_len.copy_(saved[0])
        gd.anchor.copy_(saved[1])
        graphs["/".join(str(k) for k in key[:3])] = round(start.elapsed_time(end) / 5, 3)
    out = {"batch": batch, "verify": verify, "period_ms": period,
           "host_ms_median": c.get("host_ms_per_graph_step_median"), "trim_ratio": c.get("trim_ratio"),
           "graph_device_ms": graphs}
    R = gd.bucket_for(batch) // gd.M
    saved = (gd.seq_len.clone(), gd.anchor.clone(), gd.out.clone())
    if verify == "full":
        out["census_step"] = census(lambda: gd._step(R), top)
    else:
        out["census_draft"] = census(lambda: gd._draft_stage(R), top)
        T = gd.token_bucket_for(batch * gd.M)
        gd.extra.fill_(batch * (gd.G - gd.min_verify_len) // 2)
        gd.tier.fill_(gd.G)
        out["census_verify_T"] = T
        out["census_verify"] = census(lambda: gd._verify_stage(T, min(T, gd.S), verify), top)
    gd.seq_len.copy_(saved[0])
    gd.anchor.copy_(saved[1])
    gd.out.copy_(saved[2])
    del eng
    if CUDA:
        torch.cuda.empty_cache()
    return out


def main() -> None:
    out_dir = Path(sys.argv[1])
    kv = dict(a.split("=", 1) for a in sys.argv[2:])
    batches = [int(b) for b in kv.get("batches", "128,256").split(",")]
    modes = kv.get("modes", "full,uniform,ragged").split(",")
    top = int(kv.get("top", 8))
    prompt = int(kv.get("prompt", 256))  # prompt tokens per request (the context the steps attend over)
    torch.manual_seed(0)
    import dataclasses

    mcfg = SMOLLM2 if CUDA else dataclasses.replace(SMOLLM2, num_layers=4, vocab_size=49152)
    dcfg = DRAFTER if CUDA else dataclasses.replace(DRAFTER, target_layer_ids=(0, 1, 3))
    target = TargetModel(mcfg)
    drafter = DSparkDrafter(mcfg, dcfg)
    rows = []
    for b in batches:
        probe = Engine(target, None, config(b, "full", None), drafter)
        out_dir.mkdir(parents=True, exist_ok=True)
        table = steep_table(probe, out_dir / f"steep_{b}.json")
        del probe
        for verify in modes:
            r = run(b, verify, target, drafter, table, top, prompt)
            rows.append(r)
            print(json.dumps({k: v for k, v in r.items() if not k.startswith("census")}), flush=True)
            for k in ("census_step", "census_draft", "census_verify"):
                if k in r:
                    print(f"  {k}: {r[k]['kernels']} kernels, {r[k]['kernel_ms']:.2f} ms; top:", flush=True)
                    print_top(r[k])
    (out_dir / "profile_sched_stages.json").write_text(json.dumps({"rows": rows, "torch": torch.__version__,
                                                                   "device": torch.cuda.get_device_name() if CUDA else "cpu"}, indent=2))


if __name__ == "__main__":
    main()
