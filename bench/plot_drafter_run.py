"""Plot a drafter training run folder: expected accept length on the training batches against
steps (DSpark and the DFlash ablation), and held-out accept length per workload and temperature.

    python bench/plot_drafter_run.py bench/results/h200-2026-11-30-drafter4

Reads train_log_{dspark,dflash}.jsonl (or its .xz, as results folders keep it) and eval_{dspark,dflash}/eval.json;
writes drafter_run.png there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dspark.packed_files import plain_or_packed, read_text


def train_log(root: Path, style: str) -> Path | None:
    """The run's train_log_STYLE.jsonl, or its .xz, or None."""
    return plain_or_packed(root / f"train_log_{style}.jsonl")


def main(folder: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    root = Path(folder)
    logs = {s: train_log(root, s) for s in ("dspark", "dflash")}
    styles = [s for s, path in logs.items() if path is not None]
    if not styles:
        raise SystemExit(f"{root}: no train_log_dspark.jsonl / train_log_dflash.jsonl (nor their .xz)")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for style in styles:
        path = logs[style]
        rows = [json.loads(line) for line in read_text(path).splitlines() if line]
        steps = [r["step"] for r in rows]
        tau = [r["expected_accept_length"] for r in rows]
        k = 8  # moving average over 8 log points (200 steps)
        smooth = [sum(tau[max(0, i - k + 1): i + 1]) / len(tau[max(0, i - k + 1): i + 1]) for i in range(len(tau))]
        ax1.plot(steps, smooth, label=style)
    ax1.set_xlabel("training step")
    ax1.set_ylabel("expected accept length (training batches)")
    ax1.set_title("training: analytical accept length, 200-step moving mean")
    ax1.grid(alpha=0.3)
    ax1.legend()
    bars = {}
    for style in styles:
        path = root / f"eval_{style}" / "eval.json"
        if path.exists():
            for r in json.loads(path.read_text())["results"]:
                bars[(r["workload"], r["temperature"], style)] = r["mean_accept_length"]
    labels = sorted({(w, t) for w, t, _ in bars}, key=lambda x: (x[0], x[1]))
    width = 0.8 / max(1, len(styles))
    for j, style in enumerate(styles):
        xs = [i + j * width for i in range(len(labels))]
        ax2.bar(xs, [bars.get((w, t, style), 0.0) for w, t in labels], width, label=style)
    ax2.set_xticks([i + width * (len(styles) - 1) / 2 for i in range(len(labels))])
    ax2.set_xticklabels([f"{w}\nT={t:g}" for w, t in labels], fontsize=8)
    ax2.set_ylabel("accept length with bonus (held-out prompts)")
    ax2.set_title("held-out acceptance per workload")
    ax2.grid(axis="y", alpha=0.3)
    ax2.legend()
    fig.tight_layout()
    out = root / "drafter_run.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else "."))
