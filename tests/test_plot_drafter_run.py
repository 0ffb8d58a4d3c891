"""bench/plot_drafter_run.py reads a run folder's training logs whether they are plain or xz-compressed (as results
folders keep them), and says so when there are none."""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import plot_drafter_run  # noqa: E402


def _log(steps: int) -> str:
    return "".join(json.dumps({"step": 25 * (i + 1), "expected_accept_length": 1.0 + 0.01 * i}) + "\n"
                   for i in range(steps))


def test_reads_plain_and_compressed_logs_and_refuses_a_folder_without_them(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "train_log_dspark.jsonl").write_text(_log(12))
    (tmp_path / "train_log_dflash.jsonl.xz").write_bytes(lzma.compress(_log(10).encode()))
    (tmp_path / "eval_dspark").mkdir()
    (tmp_path / "eval_dspark" / "eval.json").write_text(json.dumps(
        {"results": [{"workload": "poetry", "temperature": 0.0, "mean_accept_length": 4.2}]}))
    assert plot_drafter_run.train_log(tmp_path, "dflash").name == "train_log_dflash.jsonl.xz"
    out = plot_drafter_run.main(str(tmp_path))
    assert out == tmp_path / "drafter_run.png" and out.stat().st_size > 10_000
    empty = tmp_path / "empty"
    empty.mkdir()
    assert plot_drafter_run.train_log(empty, "dspark") is None
    with pytest.raises(SystemExit, match="no train_log_dspark.jsonl"):
        plot_drafter_run.main(str(empty))
