"""Ragged's gain over the full block at batch 128 / 256: the oracle, the offline replay's predictions,
the closed-loop trace and the H200 measurements, in one figure.

    python bench/plot_capture.py bench/results/h200-2026-11-30-traces

Reads RESULTS/replay/planner_replay.json (bench/planner_replay.py ... --as-traced --first-requests 128 256
--min-verify-lens 1 0 --measured ...), RESULTS/std/bench_decode.json (runners.bench_decode with the
like-for-like oracle share) and RESULTS/ab_min_verify_len0/bench_decode.json, each as it is or xz-compressed
(``<name>.xz``, as the committed results keep them); writes RESULTS/capture.png.
"""
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dspark.packed_files import plain_or_packed, read_text  # noqa: E402


def measured_gain(doc: dict, arm: str, batch: int) -> float | None:
    """Median over rounds of arm tokens/s over the full arm's of the same round, minus 1."""
    rows = doc["results"]
    full = {r["round"]: r["output_tokens_per_s"] for r in rows if r["arm"] == "full" and r["batch_size"] == batch}
    gains = [r["output_tokens_per_s"] / full[r["round"]] - 1 for r in rows
             if r["arm"] == arm and r["batch_size"] == batch and r["round"] in full]
    return statistics.median(gains) if gains else None


def read_json(path: Path) -> dict:
    """A JSON file, or its xz-compressed copy ``<path>.xz`` when only that exists."""
    found = plain_or_packed(path)
    if found is None:
        raise SystemExit(f"{path}: missing (nor {path.name}.xz)")
    return json.loads(read_text(found))


def main(folder: str) -> Path:
    root = Path(folder)
    replay = read_json(root / "replay" / "planner_replay.json")["rows"]
    std = read_json(root / "std" / "bench_decode.json")
    m0 = read_json(root / "ab_min_verify_len0" / "bench_decode.json")

    def as_traced(batch, lag, min_len, head="traced"):
        for r in replay:
            if (r["head"] == head and r.get("mode", "").startswith("as traced") and r["batch"] == batch
                    and r["lag"] == lag and r["mode"].endswith(f"min_verify_len {min_len}")):
                return r
        return None

    bars = {}
    for batch in (128, 256):
        base = as_traced(batch, 2, 1)
        oracle = base["oracle_gain"] if base else None
        closed = [r for r in replay if r["head"] == "measured" and r["batch"] == batch]
        bars[batch] = [
            ("oracle (timed steps)", oracle, "#999999"),
            ("70% of it (aim)", 0.7 * oracle if oracle else None, "#dddddd"),
            ("replay: lag 2, min_len 1\n(the engine's setting)", base["ragged_gain"] if base else None, "#4c72b0"),
            ("replay: lag 2, min_len 0", (as_traced(batch, 2, 0) or {}).get("ragged_gain"), "#6a8fd0"),
            ("replay: fresh sizing\n(lag 0; not possible\nwith graphs)", (as_traced(batch, 0, 1) or {}).get("ragged_gain"),
             "#a9c0e8"),
            ("closed loop: eager ragged\ntrace, table-priced", closed[0]["ragged_gain"] if closed else None, "#dd8452"),
            ("H200 measured:\nragged", measured_gain(std, "ragged", batch), "#55a868"),
            ("H200 measured:\nragged, min_len 0", measured_gain(m0, "ragged_m0", batch), "#8fd19e"),
        ]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.2), sharey=True)
    for ax, batch in zip(axes, (128, 256)):
        names = [b[0] for b in bars[batch]]
        vals = [(b[1] or 0.0) * 100 for b in bars[batch]]
        ax.bar(range(len(vals)), vals, color=[b[2] for b in bars[batch]])
        for i, b in enumerate(bars[batch]):
            ax.text(i, vals[i] + 0.15, "n/a" if b[1] is None else f"{b[1]:+.1%}", ha="center", fontsize=8)
        ax.set_xticks(range(len(vals)))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_title(f"batch {batch}: ragged's gain in tokens/s over the full block")
    axes[0].set_ylabel("gain over verify=full (%)")
    fig.suptitle("SmolLM2 + shipped drafter, poetry, H200 bf16, CUDA graphs + overlap (replays priced by the cost table)",
                 fontsize=9)
    fig.tight_layout()
    out = root / "capture.png"
    fig.savefig(out, dpi=120)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/h200-2026-11-30-traces"))
