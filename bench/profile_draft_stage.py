"""Where the draft stage's device time goes at a deep batch (greedy and sampled rows): a kernel census
(torch.profiler) of the uncaptured draft stage, and the captured draft graph's replay time, with
engine.kernels.fused_draft_logits off and on (and, for sampled rows, fused_draft_sampling), on random
weights of SmolLM2-135M's and the shipped drafter's shapes (bench/profile_graph_step.py), bf16, Triton attention.

    python bench/profile_draft_stage.py OUT_DIR [batches=256] [top=14]      # on a CUDA machine
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_graph_step import DRAFTER, SMOLLM2  # noqa: E402
from profile_sched_stages import census, config  # noqa: E402

from dspark.config import SamplingParams  # noqa: E402
from dspark.engine import Engine  # noqa: E402
from dspark.models.drafter import DSparkDrafter  # noqa: E402
from dspark.models.llama import TargetModel  # noqa: E402


def replay_ms(fn, n: int = 10) -> float:
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def main() -> None:
    out_dir = Path(sys.argv[1])
    kv = dict(a.split("=", 1) for a in sys.argv[2:])
    top = int(kv.get("top", 14))
    torch.manual_seed(0)
    target, drafter = TargetModel(SMOLLM2), DSparkDrafter(SMOLLM2, DRAFTER)
    rows = []
    for batch in [int(b) for b in kv.get("batches", "256").split(",")]:
        eng = Engine(target, None, config(batch, "ragged", None), drafter)
        g = torch.Generator().manual_seed(batch)
        for i in range(batch):
            sp = SamplingParams(max_tokens=1000, ignore_eos=True, temperature=0.7 if i % 2 else 0.0, seed=i)
            eng.add_request(torch.randint(3, 49000, (256,), generator=g).tolist(), sp)
        while eng.counters()["graph_replays"] < 4:
            eng.step()
        eng._drain()
        gd = eng.graph
        R = gd.bucket_for(batch) // gd.M
        shipped = gd.kernels
        greedy, sampled = (True, False, False), (False, False, False)
        variants = [(greedy, dict(fused_draft_logits=False)), (greedy, dict(fused_draft_logits=True)),
                    (sampled, dict(fused_draft_logits=False, fused_draft_sampling=False)),
                    (sampled, dict(fused_draft_logits=True, fused_draft_sampling=False)),
                    (sampled, dict(fused_draft_logits=True, fused_draft_sampling=True))]
        for signature, switches in variants:
            gd.set_sampling(signature)
            gd.kernels = dataclasses.replace(shipped, **switches)
            saved = (gd.seq_len.clone(), gd.anchor.clone())
            c = census(lambda: gd._draft_stage(R))
            prof_top = census_top(lambda: gd._draft_stage(R), top)
            with torch.inference_mode():
                ms = replay_ms(lambda: gd._draft_stage(R))
            gd.seq_len.copy_(saved[0])
            gd.anchor.copy_(saved[1])
            row = {"batch": batch, "greedy": signature[0], **switches, "draft_graph_ms": round(ms, 3),
                   "kernels": c["kernels"], "kernel_ms": round(c["kernel_ms"], 3), "top": prof_top}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "top"}), flush=True)
            for t in prof_top:
                print(f"   {t['us']:9.1f} us  x{t['calls']:<4d} {t['kernel']}", flush=True)
        gd.kernels = shipped
        del eng
        torch.cuda.empty_cache()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "profile_draft_stage.json").write_text(json.dumps({"rows": rows, "torch": torch.__version__,
                                                                  "device": torch.cuda.get_device_name()}, indent=2))


def census_top(fn, top: int) -> list[dict]:
    from collections import Counter

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof, torch.inference_mode():
        fn()
        torch.cuda.synchronize()
    by_name: Counter = Counter()
    calls: Counter = Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name[:90]] += getattr(e, "device_time_total", 0.0)
            calls[e.name[:90]] += 1
    return [{"kernel": k, "calls": calls[k], "us": round(v, 1)} for k, v in by_name.most_common(top)]


if __name__ == "__main__":
    main()
