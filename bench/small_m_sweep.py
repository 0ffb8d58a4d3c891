"""Tile sweep for the small-M GEMV kernels (kernels/small_m_linear.py) on SmolLM2's layer shapes.

    python bench/small_m_sweep.py OUT_DIR [SHAPE ...]   # on a CUDA machine; about 100 s per shape

For each projection of a decoder layer (norm + QKV, the same with the fused rotary + paged K/V write
epilogue, o_proj, norm + gate/up + SiLU*mul, down) and each row count M in 1, 8 and 16, it times every
tile setting (BLOCK_N, BLOCK_K, warps, stages, split-K, unrolled loops; ``SWEEP_GRID=small`` for the
previous four-knob grid) and the cuBLAS path the layers used before (RMSNorm kernel + F.linear, + the
SiLU*mul kernel) on CUDA graphs of at least 50 launches that cycle through copies of the weight, so
that each replay streams 150 MB from HBM as a decode step does instead of hitting L2; replayed 20
times: microseconds per launch, median of 5 replays. Each setting's output is checked against the reference; the best setting per shape is checked
for batch invariance (rows at M=8 bitwise equal to the same rows at M=1). Writes small_m_sweep.json and
small_m_sweep.md to OUT_DIR, and small_m_tiles.json: the tile table the engine reads with
engine.kernels.small_m_tiles=PATH (per weight shape, the best correct and batch-invariant setting, where it beats
the default setting at every M).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.rmsnorm import rmsnorm_triton  # noqa: E402
from kernels.silu_mul import silu_mul_triton  # noqa: E402
from kernels.small_m_linear import (_launch, default_tiles, norm_linear_reference, norm_qkv_rope_reference,  # noqa: E402
                                    split_cuts_evenly)

HIDDEN, INTER, QKV = 576, 1536, 576 + 2 * 192
HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
SHAPES = {  # name: (N of the weight, K, fused norm, silu_mul, rope epilogue); the engine's shapes first
    "down": (HIDDEN, INTER, False, False, False),
    "norm+gate_up+silu": (2 * INTER, HIDDEN, True, True, False),
    "norm+qkv+rope": (QKV, HIDDEN, True, False, True),
    "o_proj": (HIDDEN, HIDDEN, False, False, False),
    "norm+qkv": (QKV, HIDDEN, True, False, False),  # the unfused-rotary path's
}
ROWS = (1, 8, 16)
KNOBS = ("block_n", "block_k", "num_warps", "num_stages", "split_k", "unroll")
GRIDS = {
    "small": {"block_n": (16, 32), "block_k": (128, 256, 512), "num_warps": (2, 4), "num_stages": (2, 3),
              "split_k": (1,), "unroll": (False,)},
    "split": {"block_n": (16, 32), "block_k": (128, 256), "num_warps": (4,), "num_stages": (3,),
              "split_k": (1, 2, 3, 4, 6), "unroll": (False, True)},
}
GRID = GRIDS[os.environ.get("SWEEP_GRID", "split")]
LAUNCHES, REPLAYS, REPEATS = 50, 20, 5
# Weights stream from HBM in a decode step (30 layers of weights are 5x the H200's 50 MB L2), so a
# graph cycles through enough copies of the weight that each replay reads over STREAM_BYTES: timed
# on one L2-resident copy, a GEMV looks up to a third faster than it runs in a step
# (bench/results/h200-2026-11-30-gemv-split/README.md).
STREAM_BYTES = 150 << 20


def launches_for(weight_bytes: int) -> int:
    """Launches per graph (= weight copies): LAUNCHES, or more so a replay streams STREAM_BYTES."""
    return max(LAUNCHES, -(-STREAM_BYTES // max(weight_bytes, 1)))


def valid(cfg: dict, K: int, rope: bool) -> bool:
    """Whether a setting runs on this shape: the rope epilogue's tile is 16 wide, BLOCK_K at most
    K's power of two, and split-K must cut K's chunks into that many non-empty shares."""
    if rope and cfg["block_n"] != 16:
        return False
    if cfg["block_k"] > max(16, 1 << (K - 1).bit_length()):
        return False
    return split_cuts_evenly(-(-K // cfg["block_k"]), cfg["split_k"])


def graph_us(fn, launches: int = LAUNCHES) -> float:
    """Median microseconds per call of ``fn(i)`` (i: the launch's index in the graph, to pick a
    weight copy) over REPEATS replays of a graph of ``launches`` calls."""
    from dspark.bench.cuda_timing import graph_us as timed

    return timed(fn, launches=launches, replays=REPLAYS, repeats=REPEATS)


def _rope_args(M: int, dev: str, dt: torch.dtype) -> dict:
    """SmolLM2's rotary settings and a paged cache for the rope shape (one page per row)."""
    from dspark.models.layers import rotary_inv_freq

    return {"hq": HEADS, "hk": KV_HEADS, "half": HEAD_DIM // 2,
            "positions": torch.arange(100, 100 + M, device=dev), "inv_freq": rotary_inv_freq(HEAD_DIM, 1e5, dev),
            "slot_mapping": torch.arange(M, device=dev) * 16 + 3,
            "k_cache": torch.zeros(16, 16, KV_HEADS, HEAD_DIM, device=dev, dtype=dt),
            "v_cache": torch.zeros(16, 16, KV_HEADS, HEAD_DIM, device=dev, dtype=dt)}


def main(out_dir: str, shapes: list[str] | None = None) -> None:
    unknown = [n for n in shapes or [] if n not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown shape(s) {unknown}; choose from {list(SHAPES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev, dt = os.environ.get("SWEEP_DEVICE", "cuda"), torch.bfloat16  # cpu: a smoke test under TRITON_INTERPRET=1
    g = torch.Generator(device="cpu").manual_seed(0)
    rows: list[dict] = []
    best: dict[str, dict] = {}
    for name, (N, K, norm, silu, rope) in SHAPES.items():
        if shapes and name not in shapes:
            continue
        w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dev, dt)
        nw = (1 + 0.1 * torch.randn(K, generator=g)).to(dev, dt)
        x16 = torch.randn(16, K, generator=g).to(dev, dt)
        r16 = torch.randn(16, K, generator=g).to(dev, dt)
        n_copies = launches_for(w.numel() * w.element_size())
        copies = [w] + [w.clone() for _ in range(n_copies - 1)]
        dflt = default_tiles(N, K, silu, rope=rope, norm=norm)
        cands = [dict(zip(KNOBS, v)) for v in itertools.product(*(GRID[k] for k in KNOBS))]
        cands = [c for c in cands if valid(c, K, rope)]
        if dflt not in cands:
            cands.insert(0, dflt)
        print(f"{name}: {len(cands)} settings x M in {ROWS}, {n_copies} weight copies per graph", flush=True)

        def args(M: int) -> tuple[dict, torch.Tensor]:
            x, r = x16[:M].contiguous(), r16[:M].contiguous()
            kw = dict(norm_weight=nw if norm else None, eps=1e-5, residual=r if norm else None, silu_mul=silu)
            if rope:
                kw["rope"] = _rope_args(M, dev, dt)
                ra = kw["rope"]
                ref = norm_qkv_rope_reference(x, nw, 1e-5, w, num_heads=HEADS, num_kv_heads=KV_HEADS,
                                              positions=ra["positions"], inv_freq=ra["inv_freq"],
                                              k_cache=ra["k_cache"].clone(), v_cache=ra["v_cache"].clone(),
                                              slot_mapping=ra["slot_mapping"], residual=r)[0]
            elif norm:
                ref = norm_linear_reference(x, nw, 1e-5, w, r, silu_mul=silu)[0]
            else:
                ref = F.linear(x, w)
            return kw, x, ref

        for M in ROWS:
            kw, x, ref = args(M)
            r = kw["residual"]

            def cublas(i):
                h = rmsnorm_triton(x, nw, 1e-5, r)[0] if norm else x
                z = F.linear(h, copies[i % n_copies])
                return silu_mul_triton(z) if silu else z

            rows.append({"shape": name, "M": M, "path": "cublas", "us": round(graph_us(cublas, n_copies), 3)})
            for cfg in cands:
                try:
                    y = _launch("sweep", x, w, None, **kw, **cfg)[0]
                    err = (y.float() - ref.float()).abs().max().item()
                    us = graph_us(lambda i: _launch("sweep", x, copies[i % n_copies], None, **kw, **cfg), n_copies)
                except Exception as e:  # a setting Triton cannot compile is recorded, not fatal
                    rows.append({"shape": name, "M": M, "path": "gemv", **cfg, "error": f"{type(e).__name__}: {e}"[:200]})
                    continue
                ok = bool(torch.allclose(y.float(), ref.float(), atol=2e-2, rtol=2e-2))
                rows.append({"shape": name, "M": M, "path": "gemv", **cfg, "us": round(us, 3), "max_abs_err": err,
                             "correct": ok, "default": cfg == dflt})
        # the best setting over all M (a setting may depend on the shape, never on M)
        scored = {}
        for r in rows:
            if r["shape"] == name and r["path"] == "gemv" and "us" in r and r["correct"]:
                scored.setdefault(tuple(r[k] for k in KNOBS), []).append(r["us"])
        key = min((k for k, v in scored.items() if len(v) == len(ROWS)), key=lambda k: sum(scored[k]))
        cfg = dict(zip(KNOBS, key))
        kw8, x8, _ = args(8)
        kw1, x1, _ = args(1)
        y8 = _launch("sweep", x8, w, None, **kw8, **cfg)[0]
        y1 = _launch("sweep", x1, w, None, **kw1, **cfg)[0]
        d = scored.get(tuple(dflt[k] for k in KNOBS), [])
        best[name] = {**cfg, "us_by_M": dict(zip(map(str, ROWS), scored[key])),
                      "default": dflt, "default_us_by_M": dict(zip(map(str, ROWS), d)),
                      "cublas_us_by_M": {str(r["M"]): r["us"] for r in rows if r["shape"] == name and r["path"] == "cublas"},
                      "batch_invariant": bool(torch.equal(y8[:1], y1))}
        gain = [a - b for a, b in zip(d, scored[key])] if len(d) == len(ROWS) else []
        best[name]["beats_default_at_every_M"] = bool(gain) and min(gain) > 0
        print(name, best[name], flush=True)
        write_results(out, rows, best)  # after every shape: a run cut short keeps what it measured


def write_results(out: Path, rows: list[dict], best: dict[str, dict]) -> None:
    device = torch.cuda.get_device_name()
    # The tile table the engine reads (engine.kernels.small_m_tiles=.../small_m_tiles.json): the best correct,
    # batch-invariant setting per weight shape, only where it beats the default setting at every M.
    tiles = []
    for name, b in best.items():
        N, K, norm, silu, rope = SHAPES[name]
        if b["batch_invariant"] and b["beats_default_at_every_M"]:
            tiles.append({"N": N, "K": K, "silu_mul": silu, "rope": rope, **{k: b[k] for k in KNOBS}, "shape": name})
    (out / "small_m_tiles.json").write_text(json.dumps({"device": device, "torch": torch.__version__,
                                                        "tiles": tiles}, indent=1) + "\n")

    (out / "small_m_sweep.json").write_text(json.dumps({"device": device, "torch": torch.__version__,
                                                        "grid": GRID, "best": best, "rows": rows}, indent=1) + "\n")
    lines = [f"# Small-M GEMV tile sweep ({device})", "",
             "Microseconds per launch (CUDA graph of at least 50 launches cycling through enough weight copies to stream 150 MB, median of 5 replays). Best setting per shape over M = 1, 8, 16.",
             "", "| shape | best (BLOCK_N, BLOCK_K, warps, stages, split-K, unrolled) | M=1 | M=8 | M=16 "
             "| default M=1 | M=8 | M=16 | cuBLAS path M=1 | M=8 | M=16 | batch-invariant |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, b in best.items():
        lines.append(f"| {name} | " + ", ".join(str(b[k]) for k in KNOBS) + " | "
                     + " | ".join(f"{b['us_by_M'][str(m)]:.2f}" for m in ROWS) + " | "
                     + " | ".join(f"{b['default_us_by_M'].get(str(m), float('nan')):.2f}" for m in ROWS) + " | "
                     + " | ".join(f"{b['cublas_us_by_M'][str(m)]:.2f}" for m in ROWS) + f" | {b['batch_invariant']} |")
    (out / "small_m_sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/small_m_sweep", sys.argv[2:])
