"""Device time of the step kernels on the GPU, written to a file: diagnostics beside the GPU tests (which
check correctness only).

    python bench/kernel_timings.py OUT_DIR        # on a CUDA machine; writes OUT_DIR/kernel_timings.{json,md}

- ``decode_bandwidth``: paged attention of 64 one-token rows (32 query / 8 kv heads, head dim 128) at 1,024
  and 4,096 keys, against torch SDPA over the same keys already gathered dense;
- ``batch1_splits``: SmolLM2's batch-1 decode attention (9 / 3 heads, head dim 64) per KV split count;
- ``verify_packing``: the verify step's row packing and state commit, torch ops against the Triton kernels;
- ``argmax``: greedy argmax over SmolLM2's vocabulary, torch against kernels/argmax.py.

Each time is the median of three blocks of replays of one CUDA graph (dspark.bench.cuda_timing).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

DEV = "cuda"


def graph_ms(fn, replays: int = 20) -> float:
    from dspark.bench.cuda_timing import graph_us

    return graph_us(lambda i: fn(), replays=replays, repeats=3, warmup=1) / 1e3


def paged_case(B: int, L: int, hq: int, hkv: int, d: int, page: int = 16, seed: int = 0) -> dict:
    """B one-token rows over L keys each, pages shuffled across requests, bf16 on the GPU."""
    g = torch.Generator().manual_seed(seed)
    per = -(-L // page)
    num_pages = B * per + 1
    tables = torch.randperm(num_pages, generator=g)[: B * per].view(B, per).to(torch.int32)
    return dict(q=torch.randn(B, hq, d, generator=g).to(torch.bfloat16).to(DEV),
                k_cache=torch.randn(num_pages, page, hkv, d, generator=g).to(torch.bfloat16).to(DEV),
                v_cache=torch.randn(num_pages, page, hkv, d, generator=g).to(torch.bfloat16).to(DEV),
                qo_indptr=torch.arange(B + 1, dtype=torch.int32).to(DEV),
                kv_lens=torch.full((B,), L, dtype=torch.int32).to(DEV), block_tables=tables.to(DEV))


def attend(case: dict, num_splits=None):
    from kernels.paged_attention import paged_attention

    d = case["q"].shape[-1]
    return paged_attention(case["q"], case["k_cache"], case["v_cache"], qo_indptr=case["qo_indptr"],
                           kv_lens=case["kv_lens"], block_tables=case["block_tables"], scale=d ** -0.5,
                           causal=True, max_q_len=1, num_splits=num_splits)


def decode_bandwidth() -> list[dict]:
    B, hq, hkv, d = 64, 32, 8, 128
    rows = []
    for L in (1024, 4096):
        case = paged_case(B, L, hq, hkv, d, seed=L)
        kv_bytes = 2 * B * L * hkv * d * 2
        ms = graph_ms(lambda: attend(case))
        k = torch.randn(B, hkv, L, d, device=DEV, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        q = torch.randn(B, hq, 1, d, device=DEV, dtype=torch.bfloat16)
        ms_sdpa = graph_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        rows.append({"keys": L, "paged_us": ms * 1e3, "paged_GBps": kv_bytes / ms / 1e6,
                     "sdpa_dense_us": ms_sdpa * 1e3, "sdpa_dense_GBps": kv_bytes / ms_sdpa / 1e6})
    return rows


def batch1_splits() -> list[dict]:
    rows = []
    for L in (256, 512, 1024, 4096):
        case = paged_case(1, L, 9, 3, 64, seed=L)
        row = {"keys": L}
        for splits in (1, 4, 8, 16, 32, None):
            def thirty(splits=splits):
                for _ in range(30):
                    attend(case, splits)
            row[f"splits_{splits or 'default'}_us"] = graph_ms(thirty) / 30 * 1e3
        rows.append(row)
    return rows


def verify_packing() -> list[dict]:
    from kernels.verify_packing import (commit_state_reference, commit_state_triton, pack_verify_rows_reference,
                                        pack_verify_rows_triton)

    rows = []
    for R, G in ((1, 7), (1, 0), (64, 7), (256, 7)):
        g = torch.Generator().manual_seed(R)
        P = 60
        state = dict(active=torch.ones(R, dtype=torch.bool), seq_len=torch.randint(20, 500, (R,), generator=g),
                     anchor=torch.randint(0, 49152, (R,), generator=g),
                     drafts=torch.randint(0, 49152, (R, G), generator=g),
                     tables=torch.randperm(R * P + 7, generator=g)[: R * P].view(R, P).to(torch.int32))
        w = torch.randint(0, G + 1, (R,), generator=g).to(DEV)
        row = {"rows": R, "block": G}
        for impl, pack, commit in (("torch", pack_verify_rows_reference, commit_state_reference),
                                   ("triton", pack_verify_rows_triton, commit_state_triton)):
            bufs = {key: v.to(DEV) for key, v in state.items()}
            out = torch.zeros((R, G + 3), dtype=torch.int64, device=DEV)
            k = torch.zeros(R, dtype=torch.int64, device=DEV)

            def step():
                p = pack(windows=w, num_tokens=R * (G + 1), page_size=16, **bufs)
                commit(accepted=k, next_token=p.ids[:R], windows=p.windows, active=bufs["active"],
                       drafts=bufs["drafts"], anchor=bufs["anchor"], seq_len=bufs["seq_len"], out=out)

            row[f"{impl}_us"] = graph_ms(step, replays=50) * 1e3
        rows.append(row)
    return rows


def argmax() -> list[dict]:
    from kernels.argmax import argmax_triton

    rows = []
    for T in (1, 16, 300, 2048):
        x = (torch.randn(T, 49152, device=DEV) * 4).to(torch.bfloat16)
        row = {"rows": T}
        for name, fn in (("torch", lambda: torch.argmax(x, dim=-1)), ("triton", lambda: argmax_triton(x))):
            def seven(fn=fn):
                for _ in range(7):
                    fn()
            row[f"{name}_us"] = graph_ms(seven, replays=50) / 7 * 1e3
        rows.append(row)
    return rows


def main(out_dir: str) -> None:
    if not torch.cuda.is_available():
        raise SystemExit("bench/kernel_timings.py times CUDA kernels: run it on a GPU machine")
    results = {name: fn() for name, fn in (("decode_bandwidth", decode_bandwidth), ("batch1_splits", batch1_splits),
                                           ("verify_packing", verify_packing), ("argmax", argmax))}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel_timings.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                          **results}, indent=2))
    import pandas as pd

    md = [f"# Kernel timings ({torch.cuda.get_device_name()}, torch {torch.__version__})", ""]
    for name, rows in results.items():
        md += [f"## {name}", "", pd.DataFrame(rows).round(1).to_markdown(index=False), ""]
    (out / "kernel_timings.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/kernel_timings")
