"""Service throughput on the H200: target-only against DSpark verify-all at each concurrency a results folder
measured, each beside the steady state of the same engine, from committed results only.

    python bench/plot_service.py [RUN_DIR] [OUT.png]

RUN_DIR (default: bench/results/h200-2026-12-02-prefill-stream) holds one A/B run folder per
concurrency, ``ab_c<C>/`` (runners.ab ab=spec_off_vs_dspark), and steady-state runs on the same prompts,
``steady*/bench_decode.json`` (runners.bench_decode). Reads each A/B run's blocks.csv or blocks.csv.xz (median output
tokens/s over its timed blocks, per arm, and the range over the blocks) and the steady state at the same
batch where one was measured; prints a markdown table and writes OUT.png (default
RUN_DIR/service_throughput.png).
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

from dspark.packed_files import open_text, plain_or_packed

RESULTS = Path(__file__).resolve().parent / "results"
RUN = RESULTS / "h200-2026-12-02-prefill-stream"


def runs(run_dir: Path) -> dict[int, tuple[Path, list[Path]]]:
    """concurrency -> (its A/B run folder, the steady-state bench_decode.json files of the folder)."""
    found = {int(d.name[len("ab_c"):]): d for d in run_dir.glob("ab_c*") if d.name[len("ab_c"):].isdigit()}
    if not found:
        raise SystemExit(f"{run_dir}: no ab_c<concurrency>/ run folders")
    steady_files = sorted(run_dir.glob("steady*/bench_decode.json"))
    return {c: (found[c], steady_files) for c in sorted(found)}


ARMS = {"A": ("target-only", "target_only"), "B": ("DSpark verify-all", "dspark_full")}


def service(run: Path) -> dict[str, list[float]]:
    """Output tokens/s of each timed block, per arm (A, B)."""
    path = plain_or_packed(run / "blocks.csv") or run / "blocks.csv"  # committed folders keep it xz-compressed
    with open_text(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {arm: [float(r["output_tokens_per_s"]) for r in rows if r["arm"] == arm] for arm in ARMS}


def steady(paths: list[Path], batch: int) -> dict[str, float]:
    """Steady-state output tokens/s at ``batch``, per arm (A, B), from the first file that measured it."""
    out: dict[str, float] = {}
    for path in paths:
        rows = json.loads(path.read_text())["results"]
        for arm, (_, name) in ARMS.items():
            hits = [r["output_tokens_per_s"] for r in rows if r["arm"] == name and r["batch_size"] == batch]
            if hits and arm not in out:
                out[arm] = float(hits[0])
    return out


def main(run_dir: str | None = None, out: str | None = None) -> Path:
    folder = Path(run_dir) if run_dir else RUN
    target = Path(out) if out else folder / "service_throughput.png"
    data = {c: (service(run), steady(st, c)) for c, (run, st) in runs(folder).items()}

    has_steady = any(st for _, st in data.values())
    head = " (steady)" if has_steady else ""
    lines = [f"| concurrency | target-only tok/s{head} | DSpark verify-all tok/s{head} | DSpark / target-only |",
             "|---|---|---|---|"]

    def cell(value: float, st: dict, arm: str) -> str:
        return f"{value:,.0f}" + (f" ({st[arm]:,.0f})" if arm in st else " (-)" if has_steady else "")

    for c, (blocks, st) in data.items():
        a, b = statistics.median(blocks["A"]), statistics.median(blocks["B"])
        lines.append(f"| {c} | {cell(a, st, 'A')} | {cell(b, st, 'B')} | {b / a:.2f}x |")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_blocks = "/".join(sorted({str(len(blocks["A"])) for blocks, _ in data.values()}))
    fig, axes = plt.subplots(1, len(data), figsize=(2.6 * len(data) + 0.6, 3.8), squeeze=False)
    axes = axes[0]
    colours = {"A": "#8c8c8c", "B": "#1f77b4"}
    for ax, (c, (blocks, st)) in zip(axes, data.items()):
        for i, arm in enumerate(ARMS):
            vals = blocks[arm]
            med = statistics.median(vals)
            ax.bar(i, med, width=0.6, color=colours[arm], label=f"{ARMS[arm][0]} (service)")
            ax.vlines(i, min(vals), max(vals), color="black", linewidth=1)
            if arm in st:
                ax.hlines(st[arm], i - 0.35, i + 0.35, colors="black", linestyles="--", linewidth=1.2,
                          label="steady state (bench_decode)")
        ratio = statistics.median(blocks["B"]) / statistics.median(blocks["A"])
        ax.text(1, statistics.median(blocks["B"]) * 0.5, f"{ratio:.2f}x", ha="center", color="white",
                fontsize=10, fontweight="bold")
        ax.set_xticks([0, 1], ["target\nonly", "DSpark"])
        ax.set_title(f"concurrency {c}", fontsize=10)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _: f"{v / 1000:.1f}k" if 0 < v < 10_000 else f"{v / 1000:.0f}k"))
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("output tokens/s")
    handles, labels = axes[0].get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    fig.legend(uniq.values(), uniq.keys(), loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("SmolLM2-135M bf16 on one H200, engine=h200_graphs, mixed_chat, greedy, <= 256 new tokens\n"
                 f"bars: median of {n_blocks} ABBA blocks (line: range over blocks)"
                 + ("; dashed: steady state at full batch" if has_steady else ""),
                 fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(target, dpi=120)
    print(f"wrote {target}")
    return target


if __name__ == "__main__":
    main(*sys.argv[1:3])
