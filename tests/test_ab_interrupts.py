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


def _raise(how):
    """Interrupt the run as ``how`` says: SIGTERM (whose handler raises inside the run) or SIGINT's KeyboardInterrupt."""
    if how == "SIGTERM":
        os.kill(os.getpid(), signal.SIGTERM)
    raise KeyboardInterrupt


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
    _interrupt_after_first_block(monkeypatch, lambda: _raise(how))
    cfg = compose_ab(TINY, out_dir=tmp_path)
    with pytest.raises(SystemExit) as info:
        ab.run(cfg, engine_factory=tiny_factory())
    assert info.value.code == code
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] == {"signal": how, "phase": ab.TIMED_BLOCKS, "completed_arm_blocks": 1,
                                      "scheduled_arm_blocks": 4}
    assert not summary["guards_passed"]
    assert any(g["name"] == "interrupted" and not g["passed"] for g in summary["guards"])
    guards = {g["name"]: g for g in summary["guards"]}
    assert guards["did_nothing[B]"]["message"] == "arm B: not judged: it completed no block"  # B never ran a block
    report = (tmp_path / "report.md").read_text()  # no statistics, and the report says why
    assert "No verdict on output_tokens_per_s: no statistics" in report and "**Interrupted: " in report
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


@pytest.mark.parametrize("how,code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_interrupt_while_judging_keeps_the_statistics_of_every_block(tmp_path, monkeypatch, how, code):
    """An interrupt during the lossless control, after the last block: every block's statistics and the verdict
    are written, the guards judged with arm A's target are not (none claims to pass), and the run exits as
    interrupted."""
    judged = []

    def control(*args, **kw):
        judged.append(1)
        _raise(how)

    monkeypatch.setattr(ab, "run_lossless_control", control)
    monkeypatch.setattr(ab, "reference_guards", lambda *a, **k: pytest.fail("judged after the interrupt"))
    with pytest.raises(SystemExit) as info:
        ab.run(compose_ab(TINY, out_dir=tmp_path), engine_factory=tiny_factory())
    assert info.value.code == code and judged == [1]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] == {"signal": how, "phase": ab.REFERENCE_GUARDS, "completed_arm_blocks": 4,
                                      "scheduled_arm_blocks": 4}
    assert summary["statistics"]["output_tokens_per_s"]["n_blocks"] == 2
    assert summary["verdict"] == summary["statistics"]["output_tokens_per_s"]["verdict"]
    names = {g["name"]: g["passed"] for g in summary["guards"]}
    assert names["interrupted"] is False and "lossless" not in names and not summary["guards_passed"]
    assert "after all 4 arm-blocks" in next(g["message"] for g in summary["guards"] if g["name"] == "interrupted")
    assert (tmp_path / "report.md").is_file() and len(pd.read_csv(tmp_path / "blocks.csv")) == 4
    assert signal.getsignal(signal.SIGTERM) is not None  # the run's handler is gone again
    assert ab.partial_run(tmp_path) is not None  # the same command measures again


def test_interrupt_during_the_greedy_replicas_skips_the_control_and_the_guards(tmp_path, monkeypatch):
    """A sampled workload's greedy replicas run after the blocks; SIGTERM there ends judging the same way."""
    generate_calls = []
    factory = tiny_factory()

    def engines(cfg, arm_cfgs):
        built = factory(cfg, arm_cfgs)
        generate = built["A"].generate

        def generating(inputs, params, ids=None, **k):
            if ids and all(str(i).endswith("#greedy") for i in ids):
                generate_calls.append(len(ids))
                _raise("SIGTERM")
            return generate(inputs, params, ids=ids, **k)

        built["A"].generate = generating  # arm A runs the replicas first
        return built

    monkeypatch.setattr(ab, "run_lossless_control", lambda *a, **k: pytest.fail("control after the interrupt"))
    cfg = compose_ab([*TINY, "workload.temperature=0.7", "workload.greedy_replica_count=2"], out_dir=tmp_path)
    with pytest.raises(SystemExit) as info:
        ab.run(cfg, engine_factory=engines)
    assert info.value.code == 143 and generate_calls == [2]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"]["phase"] == ab.GREEDY_REPLICAS
    assert summary["interrupted"]["completed_arm_blocks"] == 4
    assert [g["name"] for g in summary["guards"] if not g["passed"]] == ["interrupted"]
