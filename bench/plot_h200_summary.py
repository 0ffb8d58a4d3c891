"""One figure and one table from an H200 results folder: output tokens/s against
batch size for transformers' compiled peer, this engine's target-only, DSpark full, uniform and
ragged, and the oracle bound priced on the full arm's accepted lengths.

    python bench/plot_h200_summary.py bench/results/h200-2026-11-30-fused
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows_of(doc: dict) -> list[dict]:
    """A bench_decode.json's rows, one per (arm, batch): with rounds > 1, the first round's row
    carrying the median over the rounds of ms/step and output tokens/s."""
    medians = {(m["arm"], m["batch_size"]): m for m in doc.get("median_over_rounds") or []}
    rows = []
    for r in doc["results"]:
        if r.get("round", 0) != 0:
            continue
        m = medians.get((r["arm"], r["batch_size"]))
        rows.append({**r, "ms_per_step_median": m["ms_per_step_median"],
                     "output_tokens_per_s": m["output_tokens_per_s"]} if m else r)
    return rows


def load(folder: Path) -> dict[str, dict[int, dict]]:
    series: dict[str, dict[int, dict]] = {}
    for arm in ("target", "full", "uniform", "ragged"):
        f = folder / f"bench_{arm}" / "bench_decode.json"
        if f.exists():
            series[arm] = {r["batch_size"]: r for r in rows_of(json.loads(f.read_text()))}
    together = folder / "bench_decode.json"  # all arms from one process (outputs compared across arms)
    if together.exists():
        for r in rows_of(json.loads(together.read_text())):
            series.setdefault(r["arm"], {})[r["batch_size"]] = r
    peer = folder / "transformers_peer.json"
    if peer.exists():
        series["transformers (static cache, compiled)"] = {
            r["batch"]: {"output_tokens_per_s": r["tokens_per_s"], "ms_per_step_median": r["ms_per_step"]}
            for r in json.loads(peer.read_text())["rows"] if r["mode"] == "static_compiled"}
    if "full" in series:  # oracle: the full arm's tokens at the cost table's oracle rate
        series["oracle bound"] = {}
        for b, r in series["full"].items():
            o = r.get("oracle") or {}
            if o.get("full_block_tokens_per_ms"):
                series["oracle bound"][b] = {"output_tokens_per_s": r["output_tokens_per_s"]
                                             * o["oracle_tokens_per_ms"] / o["full_block_tokens_per_ms"]}
    return series


def main(folder: str) -> None:
    root = Path(folder)
    series = load(root)
    batches = sorted({b for s in series.values() for b in s})
    names = list(series)
    lines = ["| batch | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for b in batches:
        cells = [f"{series[n][b]['output_tokens_per_s']:,.0f}" if b in series[n] else "-" for n in names]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    (root / "summary.md").write_text("Output tokens/s (greedy, poetry prompts, 96 new tokens)\n\n"
                                     + "\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for n in names:
        xs = sorted(series[n])
        ax.plot(xs, [series[n][b]["output_tokens_per_s"] for b in xs], marker="o",
                linestyle="--" if n == "oracle bound" else "-", label=n)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (requests)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("SmolLM2-135M on one H200, bf16, CUDA graphs + overlap")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(root / "summary.png", dpi=120)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/h200-2026-11-30-fused")
