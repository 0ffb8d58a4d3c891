"""bench/h200_heldout_eval.sh refuses bad settings before it stages anything (the run itself needs a GPU lease; the
evaluations it starts are runners.eval_drafter's, tested on their own)."""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work")}
    return subprocess.run(["bash", str(REPO / "bench" / "h200_heldout_eval.sh"), str(tmp_path / "no-stage")],
                          capture_output=True, text=True, env={**base, **env}, timeout=60)


def test_a_sample_without_a_prompt_count_is_refused(tmp_path):
    done = _run(tmp_path, DRAFTER="builtin:dspark-smollm2", SAMPLES="agentic:96 poetry")
    assert done.returncode == 2
    assert "SAMPLES: 'poetry' is not workload:prompts" in done.stdout
    assert not (tmp_path / "work" / "site").exists()  # nothing staged


def test_the_drafter_is_required(tmp_path):
    done = _run(tmp_path)
    assert done.returncode != 0
    assert "set DRAFTER" in done.stderr
