"""bench/compare_replays.py: two drafters' replays of the same blocks, paired by sequence."""

from __future__ import annotations

import json

import pytest
import torch

from bench_scripts import load_bench_script


def _script():
    return load_bench_script("compare_replays")


def _replay(accept_lengths: list[list[int]], block: int = 4) -> dict[str, torch.Tensor]:
    """A replay cache's fields for sequences of blocks with the given accept lengths (accepted drafts + 1)."""
    lengths = [n for seq in accept_lengths for n in seq]
    accepted = torch.zeros(len(lengths), block)
    for i, n in enumerate(lengths):
        accepted[i, :n - 1] = 1.0
    seq = torch.tensor([s for s, blocks in enumerate(accept_lengths) for _ in blocks])
    anchor = torch.tensor([10 + 2 * j for blocks in accept_lengths for j in range(len(blocks))])
    return {"accept_length": torch.tensor(lengths, dtype=torch.float32), "accepted": accepted, "seq_index": seq,
            "anchor": anchor}


def test_the_change_is_the_ratio_of_mean_accept_lengths_and_position_acceptance_counts_reached_blocks_only():
    a = _replay([[1, 3, 5], [2, 2], [4, 1, 1, 3]])
    b = _replay([[2, 3, 5], [2, 3], [4, 2, 1, 3]])
    out = _script().compare(a, b, resamples=200)
    assert out["blocks"] == 9 and out["sequences"] == 3
    assert out["accept_length"]["A"] == pytest.approx(22 / 9) and out["accept_length"]["B"] == pytest.approx(25 / 9)
    assert out["change"] == pytest.approx(25 / 22 - 1)
    low, high = out["change_ci95"]
    assert low <= out["change"] <= high
    # A: position 1 is reached by all 9 blocks and accepted in 6 (accept length > 1); position 2 by those 6, accepted
    # in 4 (length > 2); position 3 by those 4, accepted in 2 (5 and 4); position 4 by those 2, accepted in 1 (5)
    assert out["position_acceptance"]["A"] == pytest.approx([6 / 9, 4 / 6, 2 / 4, 1 / 2])
    assert out["ci_method"].startswith("BCa")


def test_an_unchanged_drafter_reads_zero_with_an_interval_of_zero_and_a_better_one_an_interval_above_zero():
    blocks = [[1 + (s + j) % 5 for j in range(6)] for s in range(12)]
    a = _replay(blocks)
    same = _script().compare(a, _replay(blocks), resamples=200)
    assert same["change"] == 0.0 and same["change_ci95"] == [0.0, 0.0] and same["ci_method"].startswith("none")
    better = _script().compare(a, _replay([[min(n + 1, 5) for n in seq] for seq in blocks]), resamples=500)
    assert better["change"] > 0 and better["change_ci95"][0] > 0


def test_replays_of_different_blocks_are_refused(tmp_path, capsys):
    a = _replay([[1, 3], [2, 2]])
    b = _replay([[1, 3], [2, 2]])
    b["anchor"] = b["anchor"] + 1
    with pytest.raises(ValueError, match="different blocks.*anchor"):
        _script().compare(a, b)
    pa, pb = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({"key": "{}", "replay": a}, pa)
    torch.save({"key": "{}", "replay": b}, pb)
    assert _script().main([str(pa), str(pb)]) == 2
    assert "different blocks" in capsys.readouterr().err
    torch.save({"key": "{}", "replay": _replay([[1, 3], [2, 2]])}, pb)
    assert _script().main([str(pa), str(pb), "--resamples", "100"]) == 0
    assert json.loads(capsys.readouterr().out)["change"] == 0.0
    torch.save({"no": "replay"}, pb)
    assert _script().main([str(pa), str(pb)]) == 2
    assert "not a runners.calibrate replay cache" in capsys.readouterr().err
