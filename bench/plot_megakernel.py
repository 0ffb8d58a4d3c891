"""Plot the one-launch decode kernel's results (bench/results/h200-2026-11-30-megakernel/).

    python bench/plot_megakernel.py RESULTS_DIR

Left: batch-1 graph replay ms per step of the census (bench/profile_graph_step.py) per variant and
run. Right: the kernel's phases, each timed alone (bench/megakernel_phases.py), µs per layer at a
512-token KV length, per kernel version, next to the one-launch time per layer and the barrier-only
floor per layer. Writes RESULTS_DIR/megakernel.png.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KINDS = ("A qkv+rope", "B attention", "C o_proj", "D norm+gate/up", "E down")


def main(root: str) -> None:
    base = Path(root)
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 4.8))
    labels, values = [], []
    for census in sorted(base.glob("run*/census/profile_graph_step.json")):
        for r in json.loads(census.read_text())["rows"]:
            if r["batch"] == 1 and r["spec"] == "off":
                labels.append(f"{census.parts[-3]}\n{r['variant']}")
                values.append(r["graph_replay_ms"])
    if not values:
        raise SystemExit(f"no census rows under {base}")
    left.bar(range(len(values)), values, color=["#999" if "rope" in lab else "#2a7" for lab in labels])
    left.set_xticks(range(len(values)), labels, fontsize=8)
    left.axhline(0.5, color="r", ls="--", lw=1, label="aim: 0.5 ms (2,000 tokens/s)")
    for i, v in enumerate(values):
        left.text(i, v + 0.01, f"{v:.2f}", ha="center", fontsize=8)
    left.set_ylabel("graph replay ms per step")
    left.set_title("target-only decode, batch 1 (random SmolLM2-shaped weights)")
    left.legend(fontsize=8)
    versions = []
    for phases in sorted(base.glob("run*/phases/megakernel_phases.json")):
        data = json.loads(phases.read_text())
        layers = data["layers"]
        rows = [r for r in data["rows"] if r["kv_len"] == 512 and r["phase_us_median"]]
        if rows:
            best = min(rows, key=lambda r: r["one_launch_us"])
            versions.append((f"{phases.parts[-3]}\n{best['kv_splits']} splits, {best['num_warps']} warps", best, layers))
    x = range(len(versions))
    bottom = [0.0] * len(versions)
    for kind in KINDS:
        vals = [v[1]["phase_us_median"][kind] for v in versions]
        right.bar(x, vals, bottom=bottom, label=f"{kind} (alone)")
        bottom = [b + v for b, v in zip(bottom, vals)]
    right.plot(list(x), [v[1]["one_launch_us"] / v[2] for v in versions], "ko-", label="one launch, per layer")
    right.plot(list(x), [v[1]["barrier_only_us"] / v[2] for v in versions], "k^--", label="5 barriers alone, per layer")
    right.set_xticks(list(x), [v[0] for v in versions], fontsize=8)
    right.set_ylabel("µs per layer (KV length 512)")
    right.set_title("where a layer's time goes")
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(base / "megakernel.png", dpi=110)
    print(base / "megakernel.png")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/h200-2026-11-30-megakernel")
