"""runners.ab interrupted (SIGTERM, SIGINT) after the first arm-block: nothing measured is lost, the
summary says it is partial, and a rerun in the same folder keeps the partial files in unfinished-<n>/."""

from __future__ import annotations

import json
import os
import signal

import pandas as pd
import pytest

import runners.ab as ab
from test_ab_runner import TINY, tiny_factory
from test_configs import compose_ab


def _interrupt_after_first_block(monkeypatch, interrupt):
    calls = []
    drive = ab.drive

    def driving(*args, **kw):
        if calls:
            interrupt()
        calls.append(1)
        return drive(*args, **kw)

    monkeypatch.setattr(ab, "drive", driving)


@pytest.mark.parametrize("how,code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_interrupt_after_block0_keeps_every_finished_block(tmp_path, monkeypatch, how, code):
    if how == "SIGTERM":
        interrupt = lambda: os.kill(os.getpid(), signal.SIGTERM)  # noqa: E731
    else:
        def interrupt():
            raise KeyboardInterrupt
    _interrupt_after_first_block(monkeypatch, interrupt)
    cfg = compose_ab(TINY, out_dir=tmp_path)
    with pytest.raises(SystemExit) as info:
        ab.run(cfg, engine_factory=tiny_factory())
    assert info.value.code == code
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] == {"signal": how, "completed_arm_blocks": 1, "scheduled_arm_blocks": 4}
    assert not summary["guards_passed"]
    assert any(g["name"] == "interrupted" and not g["passed"] for g in summary["guards"])
    assert len(pd.read_csv(tmp_path / "blocks.csv")) == 1
    assert sorted(p.name for p in (tmp_path / "requests").iterdir()) == ["block0_A.parquet"]
    per_block = pd.read_parquet(tmp_path / "requests" / "block0_A.parquet")
    assert len(per_block) == 2 and per_block["output_token_ids"].map(len).gt(0).all()
    assert signal.getsignal(signal.SIGTERM) is not None  # the run's handler is gone again
    monkeypatch.undo()

    # The same command again measures from the start; the interrupted run's files move to unfinished-1/.
    done = ab.run(compose_ab(TINY, out_dir=tmp_path), engine_factory=tiny_factory())
    assert "interrupted" not in done and done["guards_passed"]
    assert len(list((tmp_path / "requests").iterdir())) == 4
    kept = tmp_path / "unfinished-1"
    assert json.loads((kept / "summary.json").read_text())["interrupted"]["signal"] == how
    assert len(pd.read_csv(kept / "blocks.csv")) == 1 and (kept / "requests" / "block0_A.parquet").is_file()


def test_a_crashed_runs_blocks_are_kept_when_the_folder_is_reused(tmp_path):
    (tmp_path / "blocks.csv").write_text("block,arm\n0,A\n")
    ab.run(compose_ab(TINY, out_dir=tmp_path), engine_factory=tiny_factory())
    assert (tmp_path / "unfinished-1" / "blocks.csv").read_text() == "block,arm\n0,A\n"
    assert len(pd.read_csv(tmp_path / "blocks.csv")) == 4
