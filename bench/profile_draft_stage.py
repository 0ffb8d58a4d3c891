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
from profile_sched_stages import census, config, print_top  # noqa: E402

from dspark.bench.cuda_timing import graph_us  # noqa: E402
from dspark.config import SamplingParams  # noqa: E402
from dspark.engine import Engine  # noqa: E402
from dspark.models.drafter import DSparkDrafter  # noqa: E402
from dspark.models.llama import TargetModel  # noqa: E402


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
            c = census(lambda: gd._draft_stage(R), top=top, width=90)
            with torch.inference_mode():
                ms = graph_us(lambda i: gd._draft_stage(R), replays=10) / 1e3
            gd.seq_len.copy_(saved[0])
            gd.anchor.copy_(saved[1])
            row = {"batch": batch, "greedy": signature[0], **switches, "draft_graph_ms": round(ms, 3),
                   "kernels": c["kernels"], "kernel_ms": round(c["kernel_ms"], 3), "top": c["top"]}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "top"}), flush=True)
            print_top(c)
        gd.kernels = shipped
        del eng
        torch.cuda.empty_cache()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "profile_draft_stage.json").write_text(json.dumps({"rows": rows, "torch": torch.__version__,
                                                                  "device": torch.cuda.get_device_name()}, indent=2))


if __name__ == "__main__":
    main()
