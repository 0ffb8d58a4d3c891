"""bench/markov_head_spectrum.py: the spectrum of a Markov head's bias without the [V, V] matrix, and its report."""

from __future__ import annotations

import json

import pytest
import torch

from bench_scripts import load_bench_script
from tiny import tiny_drafter, tiny_target


def _script():
    return load_bench_script("markov_head_spectrum")


def test_spectrum_is_the_bias_matrix_singular_values():
    torch.manual_seed(0)
    w1, w2 = torch.randn(40, 6), torch.randn(40, 6)
    expected = torch.linalg.svdvals(w1.double() @ w2.double().T)[:6]  # rank 6: the rest are zeros
    assert torch.allclose(_script().spectrum(w1, w2), expected, rtol=1e-9, atol=1e-9)


def test_report_counts_the_rows_training_moved(tmp_path):
    drafter = tiny_drafter(tiny_target(), markov_rank=64)  # 64 entries a row: its norm varies little
    with torch.no_grad():
        w1 = drafter.markov_head.w1.weight
        w1.normal_(0.0, 0.02)  # every row at its initial scale ...
        w1[[2, 7, 9]] *= 20.0  # ... but three that training moved
    drafter.save(tmp_path / "d")
    result = _script().main([str(tmp_path / "out"), f"drafter={tmp_path / 'd'}", "tail=2"])
    assert result["rank"] == 64 and len(result["singular_values"]) == 64
    assert result["w1_rows_moved"] == 3
    assert 0.0 < result["energy_share_of_last_2_beyond_the_first"] < 1.0
    assert json.loads((tmp_path / "out" / "markov_head_spectrum.json").read_text()) == result
    with pytest.raises(SystemExit, match="unknown option"):
        _script().main([str(tmp_path / "out"), "rnak=3"])
    for bad in ("tail=64", "tail=0", "tail=x", "moved=-1"):
        with pytest.raises(SystemExit, match="tail="):
            _script().main([str(tmp_path / "out"), f"drafter={tmp_path / 'd'}", bad])
