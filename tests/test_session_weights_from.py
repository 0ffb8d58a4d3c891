"""bench/h200_session.sh WEIGHTS_FROM: the weights a train call sent back (RETURN_WEIGHTS), carried up to a new
machine, land where the finish phase reads them, with the data's prompt records; bad input is refused with a
reason before anything else runs."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def session(tmp_path: Path, weights_from: Path, **env: str) -> subprocess.CompletedProcess:
    stage = tmp_path / "stage"
    stage.mkdir(exist_ok=True)
    (stage / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"not read: no phase runs")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # python3: this interpreter
    return subprocess.run(["bash", str(REPO / "bench" / "h200_session.sh"), str(stage)], capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "PATH": path, "SMOKE": "1", "GPUS": "1", "STYLES": "dspark",
                               "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"),
                               "WEIGHTS_FROM": str(weights_from), **env})


def returned_parts(folder: Path, files: dict[str, bytes], part_bytes: int = 700) -> list[Path]:
    """A tar of ``files`` split as the train call's RETURN_WEIGHTS splits it (final_dspark.tar.aa, .ab, ...),
    with its sha256 (final_dspark.sha256)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "final_dspark.sha256").write_text(hashlib.sha256(raw).hexdigest() + "\n")
    parts = []
    for i in range(0, len(raw), part_bytes):
        p = folder / f"final_dspark.tar.a{chr(ord('a') + i // part_bytes)}"
        p.write_bytes(raw[i:i + part_bytes])
        parts.append(p)
    return parts


FILES = {"final/config.json": json.dumps({"block_size": 8}).encode(),
         "final/model.safetensors": b"\0" * 2000,
         "prompts/train_0.prompts.json": json.dumps({"prompt_ids": ["poetry/1"]}).encode()}


def test_carried_weights_and_prompt_records_land_where_the_finish_phase_reads_them(tmp_path):
    parts = returned_parts(tmp_path / "carried", FILES)
    assert len(parts) >= 3
    done = session(tmp_path, tmp_path / "carried", PHASES="none")
    assert done.returncode == 0, done.stdout + done.stderr
    work = tmp_path / "work"
    assert (work / "run_dspark" / "final" / "config.json").read_bytes() == FILES["final/config.json"]
    assert (work / "run_dspark" / "final" / "model.safetensors").stat().st_size == 2000
    assert (work / "data" / "train_0.prompts.json").read_bytes() == FILES["prompts/train_0.prompts.json"]
    assert not (work / "weights_from").exists()


def test_a_missing_part_a_missing_checksum_or_folder_is_refused(tmp_path):
    parts = returned_parts(tmp_path / "carried", FILES)
    parts[-1].unlink()  # the tar's last part: what is left still untars, the checksum tells
    refused = session(tmp_path, tmp_path / "carried", PHASES="none")
    assert refused.returncode == 5 and "sha256 mismatch" in refused.stdout
    assert not (tmp_path / "work" / "run_dspark" / "final").exists()
    (tmp_path / "carried" / "final_dspark.sha256").unlink()
    unchecked = session(tmp_path, tmp_path / "carried", PHASES="none")
    assert unchecked.returncode == 5 and "no final_dspark.sha256 beside the parts" in unchecked.stdout
    nothing = session(tmp_path, tmp_path / "nowhere", PHASES="none")
    assert nothing.returncode == 5 and "no final_dspark.tar.* parts there" in nothing.stdout


def test_finishing_from_carried_weights_needs_the_calibration_skipped(tmp_path):
    returned_parts(tmp_path / "carried", FILES)
    refused = session(tmp_path, tmp_path / "carried", PHASES="finish")
    assert refused.returncode == 2 and "set SKIP_CAL=1" in refused.stdout
