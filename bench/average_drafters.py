"""The element-wise mean of several drafters' weights (a weight average, or "model soup"): drafters continued from
one starting point on different data or schedules often sit in one basin, where their mean can hold out better than
each. Writes a drafter folder that runners.eval_drafter evaluates like any other.

    python bench/average_drafters.py OUT_DIR DRAFTER DRAFTER [DRAFTER...]

Each DRAFTER is a drafter folder (config.json and weights, as DSparkDrafter.save writes them) or builtin:NAME. Every
one must have the same architecture (config.json's drafter section), or nothing is written. The mean is taken in
fp32 and written in fp32. The average carries no calibration (no temperatures.json): calibration belongs to one
set of weights, so calibrate the average (runners.calibrate) before serving it with a confidence schedule.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def average_drafters(sources: list[str], out_dir: str | Path) -> Path:
    from dspark.models.drafter import CONFIG_FILE, TEMPERATURES_FILE, DSparkDrafter
    from dspark.models.loading import load_target_weights
    from runners.common import resolve_drafter_path

    if len(sources) < 2:
        raise SystemExit(f"average_drafters: give at least two drafters to average, got {len(sources)}")
    folders = [Path(resolve_drafter_path(s)) for s in sources]
    archs = [json.loads((f / CONFIG_FILE).read_text())["drafter"] for f in folders]
    for folder, arch in zip(folders[1:], archs[1:]):
        if arch != archs[0]:
            differ = sorted(k for k in set(arch) | set(archs[0]) if arch.get(k) != archs[0].get(k))
            raise SystemExit(f"average_drafters: {folder} has another architecture than {folders[0]} "
                             f"(config.json's drafter section differs in {differ}); only like drafters average")
    cfg, _, _ = load_target_weights("smollm2")
    drafters = [DSparkDrafter.load(f, cfg, device="cpu", dtype=torch.float32) for f in folders]
    states = [d.state_dict() for d in drafters]
    mean = {name: torch.stack([s[name].float() for s in states]).mean(0) if t.is_floating_point() else t
            for name, t in states[0].items()}
    soup = drafters[0]
    soup.load_state_dict(mean)
    out = soup.save(out_dir)
    (out / TEMPERATURES_FILE).unlink(missing_ok=True)  # the first drafter's calibration is not the average's
    return out


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[0] in ("-h", "--help"):
        raise SystemExit(__doc__)
    out = average_drafters(argv[1:], argv[0])
    print(f"average of {len(argv) - 1} drafters written to {out} (uncalibrated)")


if __name__ == "__main__":
    main(sys.argv[1:])
