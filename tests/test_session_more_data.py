"""bench/h200_session.sh MORE_DATA: one stage trained on the data of several data calls (each in its own WORK), the
shipped prompt record holding every call's prompts. Folders that cannot be read whole are refused before anything
runs, with a reason; a train call names every file it trains on."""

from __future__ import annotations

import json
import shutil

import pytest

from session_script import data_folder, run_session


@pytest.mark.parametrize("case, message", [
    ("missing", "MORE_DATA: no folder"),
    ("empty", "MORE_DATA: no train_*.safetensors in"),
    ("no_record", "has no prompt record beside it"),
    ("own", "is already read"),
    ("twice", "is already read"),
])
def test_folders_that_cannot_be_read_whole_are_refused_first(tmp_path, case, message):
    more = tmp_path / "more"
    if case == "empty":
        more.mkdir()
    elif case == "no_record":
        data_folder(more, {"0p0": ["poetry/1"]}, bare=("0p1",))
    elif case in ("own", "twice"):
        data_folder(more, {"0p0": ["poetry/1"]})
    folders = {"own": str(tmp_path / "work" / "data"), "twice": f"{more} {tmp_path}/./more"}.get(case, str(more))
    if case == "own":
        data_folder(tmp_path / "work" / "data", {"0": ["poetry/2"]})
    refused = run_session(tmp_path, STYLES="dspark", PHASES="train", MORE_DATA=folders)
    assert refused.returncode == 2 and message in refused.stdout, refused.stdout + refused.stderr
    assert not (tmp_path / "work" / "site").exists() and not (tmp_path / "work" / "train_dspark.log").exists()


def test_a_train_call_reads_this_works_data_then_every_more_data_folders(tmp_path):
    """The list the trainer gets: this WORK's parts as SHARDS and PARTS name them, then each folder's files in
    order (the trainer fails on these fake files; what it was given is in the call's log)."""
    data_folder(tmp_path / "work" / "data", {"0p0": ["poetry/1"], "0p1": ["poetry/2"]})
    first = data_folder(tmp_path / "new", {"0p0": ["scenario_requests/1"], "0p1": ["scenario_requests/2"]})
    second = data_folder(tmp_path / "other", {"0": ["agentic/3"]})
    done = run_session(tmp_path, STYLES="dspark", PHASES="train", PARTS="2", MORE_DATA=f"{first} {second}")
    assert done.returncode == 8, done.stdout + done.stderr  # the fake files fail the trainer, after the list
    work = tmp_path / "work" / "data"
    files = [work / "train_0p0.safetensors", work / "train_0p1.safetensors", first / "train_0p0.safetensors",
             first / "train_0p1.safetensors", second / "train_0.safetensors"]
    assert f"training data: [{','.join(map(str, files))}]" in done.stdout


def test_the_shipped_record_holds_every_folders_prompts(tmp_path, stage_with_model):
    from runners.common import resolve_drafter_path

    work = tmp_path / "work"
    shutil.copytree(resolve_drafter_path("builtin:dspark-smollm2"), work / "run_dspark" / "final")
    data_folder(work / "data", {"0p0": ["poetry/1"], "0p1": ["poetry/2"]})
    more = data_folder(tmp_path / "new", {"0p0": ["scenario_requests/1", "poetry/1"], "0p1": ["scenario_requests/2"]})
    done = run_session(tmp_path, stage_with_model, PHASES="finish", STYLES="dspark", PARTS="2", SKIP_CAL="1",
                       SKIP_EVAL="1", MORE_DATA=str(more))
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((work / "ship" / "training_prompts.json").read_text())
    assert record["prompt_ids"] == ["poetry/1", "poetry/2", "scenario_requests/1", "scenario_requests/2"]
    assert record["admitted_requests_per_source"] == {"poetry": 5}  # the four records' counts, summed
    assert [shard["tag"] for shard in record["recipe"]["shards"]] == ["0p0", "0p1", "0p0", "0p1"]
