"""Running bench/h200_session.sh in a test: a CPU rehearsal (SMOKE=1, one GPU's worth of shards) with a stage folder
whose model file no phase reads, so argument checks and the carry-up steps run without a model; and fake data
folders as its data calls leave them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_session(tmp_path: Path, stage: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """bench/h200_session.sh STAGE with OUT and WORK under ``tmp_path`` and ``env`` on top (PHASES, STYLES, ...).
    Without ``stage`` (a folder holding the GGUF), a stage folder whose model file is not a model."""
    if stage is None:
        stage = tmp_path / "stage"
        stage.mkdir(exist_ok=True)
        (stage / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"not read: no phase runs")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # python3: this interpreter
    return subprocess.run(["bash", str(REPO / "bench" / "h200_session.sh"), str(stage)], capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "PATH": path, "SMOKE": "1", "GPUS": "1", "OUT": str(tmp_path / "out"),
                               "WORK": str(tmp_path / "work"), **env})


def data_folder(folder: Path, records: dict[str, list[str]], bare: tuple[str, ...] = ()) -> Path:
    """Data files named as a data call names them, each with a prompt record of ``records[tag]`` (``bare``: none)."""
    from runners.make_training_data import write_prompt_record

    folder.mkdir(parents=True, exist_ok=True)
    for tag, ids in records.items():
        (folder / f"train_{tag}.safetensors").write_bytes(b"not read")
        write_prompt_record(folder / f"train_{tag}.prompts.json", ids, {"tag": tag}, {"poetry": len(ids)})
    for tag in bare:
        (folder / f"train_{tag}.safetensors").write_bytes(b"not read")
    return folder
