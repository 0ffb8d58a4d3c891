"""bench/h200_session.sh WEIGHTS_FROM: the weights a train call sent back (RETURN_WEIGHTS), carried up to a new
machine, land where the finish phase reads them, with the data's prompt records; bad input is refused with a
reason before anything else runs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from session_script import run_session

REPO = Path(__file__).resolve().parents[1]


def session(tmp_path: Path, weights_from: Path | str, **env: str) -> subprocess.CompletedProcess:
    return run_session(tmp_path, STYLES="dspark", WEIGHTS_FROM=str(weights_from), **env)


def returned_parts(tmp_path: Path, files: dict[str, bytes]) -> list[Path]:
    """``files`` packed as the train call's RETURN_WEIGHTS packs them (bench/carry_state.sh, a folder
    returned_dspark/, small parts), the parts and their sha256 in tmp_path/carried."""
    returned = tmp_path / "returned_dspark"
    for name, data in files.items():
        (returned / name).parent.mkdir(parents=True, exist_ok=True)
        (returned / name).write_bytes(data)
    done = subprocess.run(["bash", str(REPO / "bench" / "carry_state.sh"), "pack", str(returned), "final_dspark",
                           str(tmp_path / "carried")], capture_output=True, text=True,
                          env={**os.environ, "PART_BYTES": "400"})
    assert done.returncode == 0, done.stderr
    return sorted((tmp_path / "carried").glob("final_dspark.tar.xz.*"))


FILES = {"final/config.json": json.dumps({"block_size": 8}).encode(),
         "final/model.safetensors": os.urandom(2000),
         "prompts/train_0.prompts.json": json.dumps({"prompt_ids": ["poetry/1"]}).encode()}


def test_carried_weights_and_prompt_records_land_where_the_finish_phase_reads_them(tmp_path):
    parts = returned_parts(tmp_path, FILES)
    assert len(parts) >= 3
    second = tmp_path / "carried2"  # carried up in two calls: the parts in two folders
    second.mkdir()
    parts[-1].rename(second / parts[-1].name)
    done = session(tmp_path, f"{tmp_path / 'carried'} {second}", PHASES="none")
    assert done.returncode == 0, done.stdout + done.stderr
    work = tmp_path / "work"
    assert (work / "run_dspark" / "final" / "config.json").read_bytes() == FILES["final/config.json"]
    assert (work / "run_dspark" / "final" / "model.safetensors").read_bytes() == FILES["final/model.safetensors"]
    assert (work / "data" / "train_0.prompts.json").read_bytes() == FILES["prompts/train_0.prompts.json"]
    assert not (work / "weights_from").exists()


def test_a_missing_part_a_missing_checksum_or_folder_is_refused(tmp_path):
    parts = returned_parts(tmp_path, FILES)
    parts[-1].unlink()
    refused = session(tmp_path, tmp_path / "carried", PHASES="none")
    out = refused.stdout + refused.stderr
    assert refused.returncode == 5 and "sha256 mismatch" in out and "WEIGHTS_FROM FAILED" in out
    assert not (tmp_path / "work" / "run_dspark" / "final").exists()
    (tmp_path / "carried" / "final_dspark.sha256").unlink()
    unchecked = session(tmp_path, tmp_path / "carried", PHASES="none")
    assert unchecked.returncode == 5 and "no NAME.sha256" in unchecked.stdout + unchecked.stderr
    nothing = session(tmp_path, tmp_path / "nowhere", PHASES="none")
    assert nothing.returncode == 5 and "WEIGHTS_FROM FAILED" in nothing.stdout + nothing.stderr


def test_parts_of_another_archive_are_not_taken_for_the_weights(tmp_path):
    other = tmp_path / "data"  # a pack of something else (RESTORE's data, say)
    other.mkdir()
    (other / "train_0.safetensors").write_bytes(b"\0" * 100)
    done = subprocess.run(["bash", str(REPO / "bench" / "carry_state.sh"), "pack", str(other), "data",
                           str(tmp_path / "carried")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    refused = session(tmp_path, tmp_path / "carried", PHASES="none")
    assert refused.returncode == 5 and "no final_dspark parts in" in refused.stdout


def test_finishing_from_carried_weights_needs_the_calibration_skipped(tmp_path):
    returned_parts(tmp_path, FILES)
    refused = session(tmp_path, tmp_path / "carried", PHASES="finish")
    assert refused.returncode == 2 and "set SKIP_CAL=1" in refused.stdout
