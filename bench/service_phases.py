"""Where a closed-loop A/B block's throughput goes: the running batch and the token rate over time.

    python bench/service_phases.py RUN_DIR [--out DIR] [--full 0.95]

RUN_DIR is a runners.ab output folder (requests.parquet, summary.json). For every (arm, block) the
requests' emission timestamps (``chunk_times_s``, one per decode step that emitted tokens, sizes
``accept_lengths``) give the number of requests decoding at each moment and the tokens emitted. The
block splits into the full phase (at least ``--full`` x the concurrency decoding) and the ramp-up
and tail around it; the table gives each phase's share of the wall time and its tokens/s, so that
a block's throughput can be held against runners.bench_decode's steady state at full batch. Writes
service_phases.{csv,md} and service_phases.png (running batch and tokens/s of each arm's median block).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd


def _listed(value) -> list:
    """A list cell of requests.parquet (stored as JSON text by runners.ab)."""
    return json.loads(value) if isinstance(value, str) else list(value)


def markdown(table: pd.DataFrame) -> str:
    cells = [[("-" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v)) for v in row]
             for row in table.itertuples(index=False)]
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells]) + "\n"


def block_timeline(reqs: pd.DataFrame, bin_s: float) -> pd.DataFrame:
    """Per time bin from the block's first arrival: requests decoding (first token .. finish) and tokens emitted."""
    t0 = float(reqs["arrival_s"].min())
    end = float(reqs["finish_s"].max()) - t0
    edges = np.arange(0.0, end + bin_s, bin_s)
    tokens = np.zeros(len(edges) - 1)
    running = np.zeros(len(edges) - 1)
    for _, r in reqs.iterrows():
        times = np.asarray(_listed(r["chunk_times_s"]), dtype=float) - t0
        accepts = _listed(r["accept_lengths"])
        sizes = np.asarray(accepts, dtype=float) if len(accepts) == len(times) else np.ones(len(times))
        idx = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, len(tokens) - 1)
        np.add.at(tokens, idx, sizes)
        if r["first_token_s"] is not None and not np.isnan(r["first_token_s"]):
            lo, hi = float(r["first_token_s"]) - t0, float(r["finish_s"]) - t0
            overlap = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0.0, None)
            running += overlap / bin_s
    return pd.DataFrame({"t_s": edges[:-1], "running": running, "tokens_per_s": tokens / bin_s})


def phases(run_dir: Path, full: float, bin_s: float) -> tuple[pd.DataFrame, dict]:
    summary = json.loads((run_dir / "summary.json").read_text())
    requests = pd.read_parquet(run_dir / "requests.parquet")
    concurrency = _concurrency(run_dir)
    rows, timelines = [], {}
    for (arm, block), reqs in requests.groupby(["arm", "block"]):
        tl = block_timeline(reqs, bin_s)
        timelines[(arm, block)] = tl
        is_full = tl["running"] >= full * concurrency
        wall = len(tl) * bin_s
        tok = tl["tokens_per_s"] * bin_s
        rows.append({"arm": arm, "label": summary["arms"][arm]["label"], "block": int(block),
                     "wall_s": round(wall, 3), "tokens_per_s": round(tok.sum() / wall, 1),
                     "mean_running": round(float(tl["running"].mean()), 1),
                     "full_phase_share": round(float(is_full.mean()), 3),
                     "full_phase_tokens_per_s": round(float(tok[is_full].sum() / (is_full.sum() * bin_s)), 1)
                     if is_full.any() else None,
                     "ramp_and_tail_tokens_per_s": round(float(tok[~is_full].sum() / ((~is_full).sum() * bin_s)), 1)
                     if (~is_full).any() else None})
    return pd.DataFrame(rows), {"timelines": timelines, "concurrency": concurrency, "summary": summary}


def _concurrency(run_dir: Path) -> int:
    import yaml

    cfg = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    return int(cfg["load"]["concurrency"])


def plot(table: pd.DataFrame, extra: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for arm, group in table.groupby("arm"):
        median_block = group.sort_values("tokens_per_s").iloc[len(group) // 2]["block"]
        tl = extra["timelines"][(arm, median_block)]
        label = f"{group['label'].iloc[0]} (block {median_block})"
        ax1.plot(tl["t_s"], tl["running"], label=label)
        ax2.plot(tl["t_s"], tl["tokens_per_s"].rolling(5, min_periods=1).mean(), label=label)
    ax1.axhline(extra["concurrency"], color="grey", lw=0.8, ls="--")
    ax1.set_ylabel("requests decoding")
    ax2.set_ylabel("output tokens/s")
    ax2.set_xlabel("seconds since the block's first request")
    ax1.legend(loc="lower center")
    fig.suptitle(f"closed loop at concurrency {extra['concurrency']}: the running batch and the token rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--out", default=None, help="folder for the outputs (default: RUN_DIR)")
    ap.add_argument("--full", type=float, default=0.95, help="full phase: at least this share of the concurrency decoding")
    ap.add_argument("--bin", type=float, default=0.02, help="time bin in seconds")
    args = ap.parse_args()
    run_dir = Path(args.run_dir)
    out = Path(args.out or run_dir)
    out.mkdir(parents=True, exist_ok=True)
    table, extra = phases(run_dir, args.full, args.bin)
    table.to_csv(out / "service_phases.csv", index=False)
    (out / "service_phases.md").write_text(markdown(table))
    plot(table, extra, out / "service_phases.png")
    print(markdown(table))


if __name__ == "__main__":
    main()
