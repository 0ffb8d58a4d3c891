"""Host scheduling work per device-resident step, by engine function, on any machine.

With the overlap scheduler the host's own work per step (deciding the next step, committing
the last one's tokens, page bookkeeping) is hidden only while it is shorter than the device's
step; on the H200 at batch 128-256 it was not (bench/results/h200-2026-11-30-fused). This
times that work without a GPU: a small random model (its forward runs inside ``launch``,
which is not counted), graph-path engines at several batch sizes, each host function wrapped
with a timer. Medians over the timed steps, ms per step.

    python bench/host_overhead.py OUT_DIR [batches=64,128,256] [steps=30]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dspark.config import DrafterConfig, EngineConfig, ModelConfig, SamplingParams  # noqa: E402
from dspark.cost_table import CostTable  # noqa: E402
from dspark.engine import Engine  # noqa: E402
from dspark.models.drafter import DSparkDrafter  # noqa: E402
from dspark.models.llama import TargetModel  # noqa: E402

HOST_FUNCS = ("_reserve_rows_ahead", "_graph_decision", "_commit_launched")
TINY = ModelConfig(arch="llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                   num_kv_heads=1, head_dim=32, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=2048,
                   tie_word_embeddings=True, attention_bias=False, qk_norm=False, bos_token_id=1, eos_token_ids=(2,))
TINY_DRAFTER = DrafterConfig(block_size=7, num_layers=1, target_layer_ids=(0, 1), markov_rank=8)


def engine(batch: int, verify: str, spec: str, table: str | None, target, drafter) -> Engine:
    cfg = EngineConfig(device="cpu", dtype="float32", attention_backend="torch", max_num_seqs=batch,
                       kv_cache_tokens=batch * 300, max_model_len=280, max_num_batched_tokens=8192, spec=spec,
                       verify=verify, cost_table=table, cuda_graphs=True, overlap=True, budget_lag=2)
    return Engine(target, None, cfg, drafter if spec == "dspark" else None)


def measure(eng: Engine, batch: int, steps: int) -> dict:
    times: dict[str, list[float]] = defaultdict(list)
    for name in HOST_FUNCS:
        fn = getattr(eng, name)

        def timed(*a, _fn=fn, _name=name, **k):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                times[_name].append((time.perf_counter() - t0) * 1e3)
        setattr(eng, name, timed)
    for i in range(batch):
        eng.add_request(list(range(3, 40 + i % 11)), SamplingParams(max_tokens=250, ignore_eos=True))
    while eng.counters()["graph_eager_steps"] < 3:  # past prefill: steady device-resident steps
        eng.step()
    times.clear()
    for _ in range(steps):
        eng.step()
    per = {k: statistics.median(v) for k, v in times.items()}
    per["total"] = sum(per.values())
    return per


def main() -> None:
    out = Path(sys.argv[1])
    kv = dict(a.split("=", 1) for a in sys.argv[2:])
    batches = [int(b) for b in kv.get("batches", "64,128,256").split(",")]
    steps = int(kv.get("steps", 30))
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    target = TargetModel(TINY)
    drafter = DSparkDrafter(TINY, TINY_DRAFTER)
    rows = []
    for b in batches:
        probe = engine(b, "full", "dspark", None, target, drafter)
        counts = tuple(range(1, 257)) + tuple(range(264, 8193, 8))
        table = out / "steep.json"  # steep: every verified token costs, so the planner trims
        CostTable(token_counts=counts, theta_ms=tuple(1.0 + 0.01 * m for m in counts), fixed_overhead_ms=0.5,
                  fingerprint=probe.fingerprint()).save(table)
        for label, spec, verify in (("target", "off", "full"), ("full", "dspark", "full"),
                                    ("uniform", "dspark", "uniform"), ("ragged", "dspark", "ragged")):
            eng = engine(b, verify, spec, None if verify == "full" else str(table), target, drafter)
            r = {"arm": label, "batch": b, **measure(eng, b, steps)}
            rows.append(r)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
        table.unlink()
    import platform

    (out / "host_overhead.json").write_text(json.dumps({"rows": rows, "machine": platform.processor() or platform.machine(),
                                                        "python": platform.python_version()}, indent=2))
    cols = list(HOST_FUNCS) + ["total"]
    lines = ["| arm | batch | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
    lines += [f"| {r['arm']} | {r['batch']} | " + " | ".join(f"{r.get(c, 0.0):.3f}" for c in cols) + " |" for r in rows]
    (out / "host_overhead.md").write_text("Host ms per device-resident step (median)\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
