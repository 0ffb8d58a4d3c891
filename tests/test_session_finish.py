"""bench/h200_session.sh's finish phase with SKIP_EVAL=1: it ships the trained weights (bf16 shards and the prompt
record) and evaluates nothing, for bench/h200_heldout_eval.sh to evaluate the shipped copy on larger samples."""

from __future__ import annotations

import json
import shutil

from session_script import run_session


def test_skip_eval_ships_the_weights_and_evaluates_nothing(tmp_path, stage_with_model):
    from runners.common import resolve_drafter_path
    from runners.make_training_data import write_prompt_record

    work = tmp_path / "work"
    shutil.copytree(resolve_drafter_path("builtin:dspark-smollm2"), work / "run_dspark" / "final")
    write_prompt_record(work / "data" / "train_0.prompts.json", ["poetry/1", "agentic/2"], {"seed": 5},
                        {"poetry": 1, "agentic": 1})
    done = run_session(tmp_path, stage_with_model, PHASES="finish", STYLES="dspark", SKIP_CAL="1", SKIP_EVAL="1")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "evaluation skipped (SKIP_EVAL=1)" in out and "evaluate: acceptance" not in out
    shipped = sorted(p.name for p in (tmp_path / "out" / "drafter").iterdir())
    assert any(name.endswith(".safetensors") for name in shipped), shipped
    record = json.loads((work / "ship" / "training_prompts.json").read_text())
    assert record["prompt_ids"] == ["agentic/2", "poetry/1"]
    assert not (work / "eval_dspark").exists() and not (work / "eval_compare").exists()
    assert (tmp_path / "out" / "results.tar.gz").is_file()


def test_a_failed_ship_stops_the_script(tmp_path):
    """No trained weights (and a stage whose model is not a model): the ship step fails, and so does the script."""
    done = run_session(tmp_path, PHASES="finish", STYLES="dspark", SKIP_CAL="1", SKIP_EVAL="1")
    out = done.stdout + done.stderr
    assert done.returncode == 6 and "SHIP FAILED" in out, out
    assert "evaluation skipped" not in out and not (tmp_path / "out" / "results.tar.gz").exists()
