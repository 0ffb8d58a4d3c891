"""runners.ab interrupted (SIGTERM, SIGINT) after the first arm-block: nothing measured is lost, the
summary says it is partial, and a rerun in the same folder is refused without ab.force_rerun."""

from __future__ import annotations

import json
import os
import signal

import pandas as pd
import pytest

import runners.ab as ab
from dspark.config import ConfigError
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

    # The same folder again: refused, naming the setting; with it, a full run replaces the partial one.
    with pytest.raises(ConfigError, match=r"unfinished run \(interrupted by .*ab.force_rerun=true"):
        ab.run(compose_ab(TINY, out_dir=tmp_path), engine_factory=tiny_factory())
    done = ab.run(compose_ab([*TINY, "ab.force_rerun=true"], out_dir=tmp_path), engine_factory=tiny_factory())
    assert "interrupted" not in done and done["guards_passed"]
    assert len(list((tmp_path / "requests").iterdir())) == 4


def test_crashed_run_is_not_silently_overwritten(tmp_path):
    (tmp_path / "blocks.csv").write_text("block,arm\n0,A\n")
    with pytest.raises(ConfigError, match="without a finished summary.json"):
        ab.run(compose_ab(TINY, out_dir=tmp_path), engine_factory=tiny_factory())
