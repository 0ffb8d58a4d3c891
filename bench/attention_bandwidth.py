"""Paged-attention bandwidth against the device's copy bandwidth, padded SDPA and flex attention.

    python bench/attention_bandwidth.py OUT_DIR          # on a CUDA machine (writes JSON + markdown)

Shapes: SmolLM2-135M's heads (9 query / 3 KV heads, head dim 64) and a larger GQA case,
bf16, page 16, decode (1 query row per request) and verification (8 rows, causal), batch
64..256, KV length 1024..4096. Bandwidth counts the unique K and V bytes each call must
read (B x L x Hkv x D x 2 tensors x 2 bytes); the copy bandwidth is a device-to-device
copy of a 2 GiB buffer. SDPA and flex get the same KV already gathered into a padded dense
[B, Hkv, L, D] layout, which favours them (no page-table indirection).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels.paged_attention import paged_attention


def bench_ms(fn, iters: int = 50, graphs: bool | None = None) -> float:
    """Device ms per call of fn, timed over CUDA-graph replays of `iters` calls when fn can be
    captured (as the engine runs it: no Python launch overhead in the figure), else eagerly."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if GRAPHS if graphs is None else graphs:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(iters):
                    fn()
            graph.replay()
            torch.cuda.synchronize()
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / iters
        except Exception as e:  # noqa: BLE001 - e.g. flex's compiled callable: timed eagerly, and said so
            torch.cuda.synchronize()
            EAGER_FALLBACKS.append(f"{getattr(fn, '__name__', 'fn')}: {type(e).__name__}: {e}"[:160])
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def copy_bandwidth_gbs() -> float:
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    # Eager: a captured device-to-device copy becomes a copy-engine node (~2.8 TB/s on an H200),
    # while the eager copy runs as a kernel at the HBM rate this figure is meant to be.
    ms = bench_ms(lambda: dst.copy_(src), iters=20, graphs=False)
    return 2 * src.numel() / ms / 1e6  # read + write


def case(B: int, L: int, q_rows: int, hq: int, hkv: int, d: int, page: int = 16) -> dict:
    dev, dt = "cuda", torch.bfloat16
    pages_per = L // page
    num_pages = B * pages_per + 1
    k_cache = torch.randn(num_pages, page, hkv, d, device=dev, dtype=dt)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(B * pages_per, device=dev).to(torch.int32)  # scattered pages, as in a real pool
    tables = perm.view(B, pages_per).contiguous()
    q = torch.randn(B * q_rows, hq, d, device=dev, dtype=dt)
    indptr = (torch.arange(B + 1, device=dev) * q_rows).to(torch.int32)
    kv_lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    scale = d ** -0.5
    kv_bytes = 2 * B * L * hkv * d * 2
    paged = bench_ms(lambda: paged_attention(q, k_cache, v_cache, qo_indptr=indptr, kv_lens=kv_lens,
                                             block_tables=tables, scale=scale, causal=True, max_q_len=q_rows))
    kd = k_cache[tables.long()].reshape(B, L, hkv, d).transpose(1, 2).contiguous()  # [B, Hkv, L, D]
    vd = v_cache[tables.long()].reshape(B, L, hkv, d).transpose(1, 2).contiguous()
    qd = q.view(B, q_rows, hq, d).transpose(1, 2).contiguous()  # [B, Hq, q, D]
    mask = None
    if q_rows > 1:  # causal inside the window: row o sees L - q + o + 1 keys
        o = torch.arange(q_rows, device=dev)[:, None]
        mask = torch.arange(L, device=dev)[None, :] <= (L - q_rows + o)
    fallbacks_before = len(EAGER_FALLBACKS)
    out = {"batch": B, "kv_len": L, "q_rows": q_rows, "hq": hq, "hkv": hkv, "head_dim": d,
           "kv_bytes": kv_bytes, "paged_ms": paged, "paged_gbs": kv_bytes / paged / 1e6}
    # The split-KV heuristic against every forced split count (which one the default should pick).
    sweep = {s: bench_ms(lambda s=s: paged_attention(q, k_cache, v_cache, qo_indptr=indptr, kv_lens=kv_lens,
                                                     block_tables=tables, scale=scale, causal=True,
                                                     max_q_len=q_rows, num_splits=s)) for s in (1, 2, 4, 8, 16, 32)}
    best = min(sweep, key=sweep.get)
    out.update(split_sweep_ms=sweep, best_splits=best, best_gbs=kv_bytes / sweep[best] / 1e6)
    if PAGED_ONLY:
        out["timed_eagerly"] = EAGER_FALLBACKS[fallbacks_before:]
        return out
    try:
        sdpa = bench_ms(lambda: F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, scale=scale, enable_gqa=True))
        out.update(sdpa_ms=sdpa, sdpa_gbs=kv_bytes / sdpa / 1e6)
    except Exception as e:  # report, never hide
        out["sdpa_error"] = f"{type(e).__name__}: {e}"[:200]
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex = torch.compile(flex_attention)

        def causal(b, h, qi, ki):
            return ki <= L - q_rows + qi

        bm = create_block_mask(causal, B, None, q_rows, L, device=dev)
        fx = bench_ms(lambda: flex(qd, kd, vd, block_mask=bm, scale=scale, enable_gqa=True))
        out.update(flex_ms=fx, flex_gbs=kv_bytes / fx / 1e6)
    except Exception as e:
        out["flex_error"] = f"{type(e).__name__}: {e}"[:200]
    out["timed_eagerly"] = EAGER_FALLBACKS[fallbacks_before:]
    return out


PAGED_ONLY = "--paged-only" in sys.argv  # skip SDPA and flex (their compile dominates the run time)
GRAPHS = "--eager-timing" not in sys.argv  # time captured replays (default) or eager launches
EAGER_FALLBACKS: list[str] = []  # calls that could not be captured and were timed eagerly instead


def main(out_dir: str) -> None:
    copy = copy_bandwidth_gbs()
    rows = []
    for hq, hkv, d in ((9, 3, 64), (32, 8, 128)):
        for B in (64, 128, 256):
            for L in (1024, 4096):
                for q_rows in (1, 8):
                    r = case(B, L, q_rows, hq, hkv, d)
                    r["paged_of_copy"] = r["paged_gbs"] / copy
                    rows.append(r)
                    print(json.dumps(r))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention_bandwidth.json").write_text(json.dumps({"copy_gbs": copy, "rows": rows,
                                                              "timing": "graph replays" if GRAPHS else "eager",
                                                              "device": torch.cuda.get_device_name(),
                                                              "torch": torch.__version__}, indent=2))
    lines = [f"Copy bandwidth (device-to-device, read + write): {copy:.0f} GB/s", "",
             "| Hq/Hkv/D | batch | KV len | q rows | paged GB/s | % of copy | best split count: GB/s | "
             "SDPA padded GB/s | flex GB/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['hq']}/{r['hkv']}/{r['head_dim']} | {r['batch']} | {r['kv_len']} | {r['q_rows']} | "
                     f"{r['paged_gbs']:.0f} | {100 * r['paged_of_copy']:.0f}% | {r['best_splits']}: {r['best_gbs']:.0f} | "
                     f"{r.get('sdpa_gbs', float('nan')):.0f} | {r.get('flex_gbs', float('nan')):.0f} |")
    (out / "attention_bandwidth.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(args[0] if args else "bench/results/attention")
