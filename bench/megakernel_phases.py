"""Where the one-launch decode kernel's time goes (kernels/decode_megakernel.py), measured per phase.

Random SmolLM2-135M-shaped bf16 weights, one token over a KV cache of ``KV_LENS`` tokens. For each
setting (programs, KV splits, warps):

- ``one_launch_us``: the one-launch form (grid barrier between phases), graph-replayed, CUDA events,
  median of ``REPEATS`` blocks of 50 replays;
- ``phase_us``: the one-launch-per-phase form under torch.profiler: each phase's own device time
  (no barrier, no launch gap), median per phase kind (A qkv, B attention, C o_proj, D gate/up,
  E down) and their sum over the step;
- ``barrier_only_us``: a kernel of the same grid that does nothing but the same number of grid
  barriers: the synchronisation floor.

    python bench/megakernel_phases.py OUT_DIR          # on a CUDA machine

Writes OUT_DIR/megakernel_phases.json and .md.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from dspark.bench.cuda_timing import graph_us
from kernels import decode_megakernel as mk

KINDS = ("A qkv+rope", "B attention", "C o_proj", "D norm+gate/up", "E down")


@triton.jit
def _barriers_only(bar_ptr, n):
    nprog = tl.num_programs(0)
    for i in range(n):
        mk._grid_sync(bar_ptr, (i + 1) * nprog)
    tl.debug_barrier()
    done = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if done == nprog - 1:
        tl.atomic_xchg(bar_ptr, 0)
        tl.atomic_xchg(bar_ptr + 1, 0)


def main(out_dir: str) -> None:
    kv_lens = [int(v) for v in os.environ.get("KV_LENS", "512,2048").split(",")]
    settings = json.loads(os.environ.get("SETTINGS", '[{"programs": 0, "kv_splits": 16, "num_warps": 8}]'))
    repeats = int(os.environ.get("REPEATS", "5"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    w = mk.random_stack_weights(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536,
                                dtype=torch.bfloat16, device="cuda", scale=0.05, theta=100000.0)  # SmolLM2-135M
    L = w.num_layers
    page = 16
    rows = []
    bar = torch.zeros(2, dtype=torch.int32, device="cuda")
    floors = {}
    for s in settings:
        P = s.get("programs") or sms
        if P not in floors:
            floors[P] = graph_us(lambda i: _barriers_only[(P,)](bar, mk.PHASES_PER_LAYER * L, num_warps=8),
                                 replays=50, repeats=repeats)
    for kv_len in kv_lens:
        pages = -(-kv_len // page) + 2
        kc = torch.randn(L, pages, page, w.num_kv_heads, w.head_dim, device="cuda").to(torch.bfloat16)
        vc = torch.randn_like(kc)
        table = torch.arange(pages - 1, device="cuda", dtype=torch.int32)
        dev = lambda v, dt=torch.int64: torch.tensor([v], device="cuda", dtype=dt)  # noqa: E731
        pos, slot, kvl = dev(kv_len - 1), dev(kv_len - 1), dev(kv_len, torch.int32)
        x = torch.randn(1, w.hidden, device="cuda").to(torch.bfloat16)
        out = torch.empty_like(x)
        for s in settings:
            P = s.get("programs") or sms
            kw = dict(programs=P, kv_splits=s.get("kv_splits", mk.DEFAULT_KV_SPLITS),
                      num_warps=s.get("num_warps", mk.NUM_WARPS))
            one = graph_us(lambda i: mk.decode_megakernel(w, x, pos, slot, table, kvl, kc, vc, out=out, sync=True, **kw),
                           replays=50, repeats=repeats)
            mk.decode_megakernel(w, x, pos, slot, table, kvl, kc, vc, out=out, sync=False, **kw)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                mk.decode_megakernel(w, x, pos, slot, table, kvl, kc, vc, out=out, sync=False, **kw)
                torch.cuda.synchronize()
            ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                  and "decode_stack" in e.name]
            dur = [getattr(e, "device_time_total", None) or e.cuda_time_total for e in ev]
            per_kind = {k: statistics.median(dur[i: mk.PHASES_PER_LAYER * L: mk.PHASES_PER_LAYER])
                        for i, k in enumerate(KINDS)} if len(dur) == mk.PHASES_PER_LAYER * L + 1 else {}
            row = {"kv_len": kv_len, "programs": P, "kv_splits": kw["kv_splits"], "num_warps": kw["num_warps"],
                   "one_launch_us": one, "phase_us_median": per_kind, "phases_sum_us": sum(dur),
                   "phase_launches_profiled": len(dur), "barrier_only_us": floors[P]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out_p = Path(out_dir)
    out_p.mkdir(parents=True, exist_ok=True)
    (out_p / "megakernel_phases.json").write_text(json.dumps(
        {"rows": rows, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
         "triton": triton.__version__, "layers": L, "barriers_per_launch": mk.PHASES_PER_LAYER * L}, indent=2))
    lines = ["| kv_len | programs | splits | warps | one launch µs | phases alone, summed µs | "
             + " | ".join(KINDS) + " | barriers alone µs |", "|---" * (8 + len(KINDS)) + "|"]
    for r in rows:
        kinds = " | ".join(f"{r['phase_us_median'].get(k, float('nan')):.2f}" for k in KINDS)
        lines.append(f"| {r['kv_len']} | {r['programs']} | {r['kv_splits']} | {r['num_warps']} | "
                     f"{r['one_launch_us']:.1f} | {r['phases_sum_us']:.1f} | {kinds} | {r['barrier_only_us']:.1f} |")
    (out_p / "megakernel_phases.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/megakernel_phases")
