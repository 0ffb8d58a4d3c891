"""Per-round, paired view of multi-round decode benchmarks: each trimming arm's output tokens/s over
the full block's in the same round and batch, for every round of every run given.

    python bench/plot_round_ratios.py OUT.png RUN_DIR [RUN_DIR ...]   # each RUN_DIR holds bench_decode.json

A median over rounds hides how an arm's rounds scatter; this shows each round as a point, so a
bimodal arm (some rounds at the full block's speed, some far below) reads as such. Writes OUT.png
and OUT.md (the same numbers as a table).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def ratios(runs: list[Path]) -> dict[tuple[str, int], list[float]]:
    """(arm, batch) -> [arm tok/s / full tok/s of the same run and round, ...]."""
    out: dict[tuple[str, int], list[float]] = {}
    for run in runs:
        path = run / "bench_decode.json" if run.is_dir() else run
        if not path.exists():
            raise SystemExit(f"{path}: no bench_decode.json (runners.bench_decode writes one per run)")
        rows = json.loads(path.read_text())["results"]
        full = {(r["batch_size"], r.get("round", 0)): r["output_tokens_per_s"] for r in rows if r["arm"] == "full"}
        for r in rows:
            key = (r["batch_size"], r.get("round", 0))
            if r["arm"] != "full" and key in full:
                out.setdefault((r["arm"], r["batch_size"]), []).append(r["output_tokens_per_s"] / full[key])
    return out


def main(png: str, runs: list[str]) -> None:
    if not runs:
        raise SystemExit(__doc__)
    data = ratios([Path(r) for r in runs])
    lines = ["| arm | batch | rounds | tok/s over full, per round | median |", "|---|---|---|---|---|"]
    for (arm, batch), vals in sorted(data.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lines.append(f"| {arm} | {batch} | {len(vals)} | " + ", ".join(f"{v:.3f}" for v in vals)
                     + f" | {statistics.median(vals):.3f} |")
    Path(png).with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = sorted({a for a, _ in data if a != "target"})
    batches = sorted({b for _, b in data})
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, arm in enumerate(arms):
        for j, b in enumerate(batches):
            vals = data.get((arm, b), [])
            x = j + (i - (len(arms) - 1) / 2) * 0.25
            ax.scatter([x] * len(vals), vals, s=22, alpha=0.75, color=f"C{i}", label=arm if j == 0 else None)
            if vals:
                ax.hlines(statistics.median(vals), x - 0.1, x + 0.1, color=f"C{i}")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    ax.set_ylabel("output tok/s / full block's (same round)")
    ax.set_title("Trimming arms against the full block, each round a point (bar: median)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
