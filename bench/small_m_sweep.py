"""Tile sweep for the small-M GEMV kernels (kernels/small_m_linear.py) on SmolLM2's layer shapes.

    python bench/small_m_sweep.py OUT_DIR [SHAPE ...]   # on a CUDA machine; about 100 s per shape

For each projection of a decoder layer (norm + QKV, o_proj, norm + gate/up + SiLU*mul, down) and each
row count M in 1, 8 and 16, it times every tile setting (BLOCK_N, BLOCK_K, warps, stages) and the cuBLAS
path the layers used before (RMSNorm kernel + F.linear, + the SiLU*mul kernel) on CUDA graphs of 50
launches, replayed 20 times: microseconds per launch, median of 5 replays. Each setting's output is
checked against the reference; the best setting per shape is checked for batch invariance (rows at M=8
bitwise equal to the same rows at M=1). Writes small_m_sweep.json and small_m_sweep.md to OUT_DIR, and
small_m_tiles.json: the tile table the engine reads with DSPARK_SMALL_M_TILES=PATH (per weight shape, the
best correct and batch-invariant setting, where it beats the default setting, stages 3, at every M).
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.rmsnorm import rmsnorm_triton  # noqa: E402
from kernels.silu_mul import silu_mul_triton  # noqa: E402
from kernels.small_m_linear import _launch, norm_linear_reference  # noqa: E402

HIDDEN, INTER, QKV = 576, 1536, 576 + 2 * 192
SHAPES = {  # name: (N of the weight, K, fused norm, silu_mul)
    "norm+qkv": (QKV, HIDDEN, True, False),
    "o_proj": (HIDDEN, HIDDEN, False, False),
    "norm+gate_up+silu": (2 * INTER, HIDDEN, True, True),
    "down": (HIDDEN, INTER, False, False),
}
ROWS = (1, 8, 16)
GRID = {"block_n": (16, 32), "block_k": (128, 256, 512), "num_warps": (2, 4), "num_stages": (2, 3)}
LAUNCHES, REPLAYS, REPEATS = 50, 20, 5


def graph_us(fn) -> float:
    """Median microseconds per call of ``fn`` over REPEATS replays of a graph of LAUNCHES calls."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(LAUNCHES):
            fn()
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(REPLAYS):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / (REPLAYS * LAUNCHES))
    return statistics.median(times)


def main(out_dir: str, shapes: list[str] | None = None) -> None:
    unknown = [n for n in shapes or [] if n not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown shape(s) {unknown}; choose from {list(SHAPES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(0)
    rows: list[dict] = []
    best: dict[str, dict] = {}
    for name, (N, K, norm, silu) in SHAPES.items():
        if shapes and name not in shapes:
            continue
        w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dev, dt)
        nw = (1 + 0.1 * torch.randn(K, generator=g)).to(dev, dt)
        x16 = torch.randn(16, K, generator=g).to(dev, dt)
        r16 = torch.randn(16, K, generator=g).to(dev, dt)
        for M in ROWS:
            x, r = x16[:M].contiguous(), r16[:M].contiguous()
            kw = dict(norm_weight=nw if norm else None, eps=1e-5, residual=r if norm else None, silu_mul=silu)
            ref = norm_linear_reference(x, nw, 1e-5, w, r, silu_mul=silu)[0] if norm else F.linear(x, w)

            def cublas():
                h = rmsnorm_triton(x, nw, 1e-5, r)[0] if norm else x
                z = F.linear(h, w)
                return silu_mul_triton(z) if silu else z

            rows.append({"shape": name, "M": M, "path": "cublas", "us": round(graph_us(cublas), 3)})
            for values in itertools.product(*GRID.values()):
                cfg = dict(zip(GRID, values))
                if cfg["block_k"] > max(16, 1 << (K - 1).bit_length()):
                    continue
                try:
                    y = _launch("sweep", x, w, None, **kw, **cfg)[0]
                    err = (y.float() - ref.float()).abs().max().item()
                    us = graph_us(lambda: _launch("sweep", x, w, None, **kw, **cfg))
                except Exception as e:  # a setting Triton cannot compile is recorded, not fatal
                    rows.append({"shape": name, "M": M, "path": "gemv", **cfg, "error": f"{type(e).__name__}: {e}"[:200]})
                    continue
                ok = bool(torch.allclose(y.float(), ref.float(), atol=2e-2, rtol=2e-2))
                rows.append({"shape": name, "M": M, "path": "gemv", **cfg, "us": round(us, 3), "max_abs_err": err,
                             "correct": ok})
        # the best setting over all M (a setting may depend on the shape, never on M)
        scored = {}
        for r in rows:
            if r["shape"] == name and r["path"] == "gemv" and "us" in r and r["correct"]:
                key = tuple(r[k] for k in GRID)
                scored.setdefault(key, []).append(r["us"])
        key = min((k for k, v in scored.items() if len(v) == len(ROWS)), key=lambda k: sum(scored[k]))
        cfg = dict(zip(GRID, key))
        kw8 = dict(norm_weight=nw if norm else None, eps=1e-5, residual=r16[:8].contiguous() if norm else None,
                   silu_mul=silu)
        kw1 = dict(kw8, residual=r16[:1].contiguous() if norm else None)
        y8 = _launch("sweep", x16[:8].contiguous(), w, None, **kw8, **cfg)[0]
        y1 = _launch("sweep", x16[:1].contiguous(), w, None, **kw1, **cfg)[0]
        best[name] = {**cfg, "us_by_M": dict(zip(map(str, ROWS), scored[key])),
                      "cublas_us_by_M": {str(r["M"]): r["us"] for r in rows if r["shape"] == name and r["path"] == "cublas"},
                      "batch_invariant": bool(torch.equal(y8[:1], y1))}
        print(name, best[name], flush=True)
    device = torch.cuda.get_device_name()
    # The tile table the engine reads (DSPARK_SMALL_M_TILES=.../small_m_tiles.json): the best correct,
    # batch-invariant setting per weight shape, only where it beats the default setting at every M.
    tiles = []
    for name, b in best.items():
        N, K, norm, silu = SHAPES[name]
        dflt = [r["us"] for r in rows if r["shape"] == name and r["path"] == "gemv" and "us" in r
                and (r["block_n"], r["block_k"], r["num_warps"]) == (16, min(256, 1 << (K - 1).bit_length()), 4)
                and r["num_stages"] == 3]
        gain = [d - u for d, u in zip(dflt, b["us_by_M"].values())] if len(dflt) == len(ROWS) else []
        b["beats_default_at_every_M"] = bool(gain) and min(gain) > 0
        if b["batch_invariant"] and b["beats_default_at_every_M"]:
            tiles.append({"N": N, "K": K, "silu_mul": silu, **{k: b[k] for k in GRID}, "shape": name})
    (out / "small_m_tiles.json").write_text(json.dumps({"device": device, "torch": torch.__version__,
                                                        "tiles": tiles}, indent=1) + "\n")

    (out / "small_m_sweep.json").write_text(json.dumps({"device": device, "torch": torch.__version__,
                                                        "grid": GRID, "best": best, "rows": rows}, indent=1) + "\n")
    lines = [f"# Small-M GEMV tile sweep ({device})", "",
             "Microseconds per launch (CUDA graph of 50, median of 5 replays). Best setting per shape over M = 1, 8, 16.",
             "", "| shape | best (BLOCK_N, BLOCK_K, warps, stages) | M=1 | M=8 | M=16 | cuBLAS path M=1 | M=8 | M=16 "
             "| batch-invariant |", "|---|---|---|---|---|---|---|---|---|"]
    for name, b in best.items():
        lines.append(f"| {name} | {b['block_n']}, {b['block_k']}, {b['num_warps']}, {b['num_stages']} | "
                     + " | ".join(f"{b['us_by_M'][str(m)]:.2f}" for m in ROWS) + " | "
                     + " | ".join(f"{b['cublas_us_by_M'][str(m)]:.2f}" for m in ROWS) + f" | {b['batch_invariant']} |")
    (out / "small_m_sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/small_m_sweep", sys.argv[2:])
