"""bench/h200_heldout_eval.sh refuses bad settings before it stages anything, and runs no more evaluations at once
than fit in the GPU's free memory (the run itself needs a GPU lease; the evaluations it starts are
runners.eval_drafter's, tested on their own)."""

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


def _fake_gpu(tmp_path: Path, free_mib: int) -> str:
    """A PATH whose nvidia-smi reports ``free_mib`` MiB free on the GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho {free_mib}\n")
    smi.chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


def test_parallel_is_lowered_to_what_fits_in_the_gpus_free_memory(tmp_path):
    # an H100's 80 GB: two evaluations of about 28 GiB fit, not three; the bad sample then stops it before staging
    done = _run(tmp_path, PATH=_fake_gpu(tmp_path, 81000), DRAFTER="builtin:dspark-smollm2", PARALLEL="3",
                SAMPLES="agentic")
    assert "PARALLEL=3 lowered to 2: only 2 evaluations of about 28 GiB each fit in the GPU's 81000 MiB free" \
        in done.stdout
    assert done.returncode == 2 and not (tmp_path / "work" / "site").exists()


def test_parallel_unset_takes_what_fits_and_a_setting_that_fits_is_kept(tmp_path):
    done = _run(tmp_path, PATH=_fake_gpu(tmp_path, 143000), DRAFTER="builtin:dspark-smollm2", SAMPLES="agentic")
    assert "PARALLEL=4: evaluations of about 28 GiB each at once, for the GPU's 143000 MiB free" in done.stdout
    kept = _run(tmp_path, PATH=_fake_gpu(tmp_path, 143000), DRAFTER="builtin:dspark-smollm2", PARALLEL="2",
                SAMPLES="agentic")
    assert "PARALLEL" not in kept.stdout and kept.returncode == 2


def test_a_bad_parallel_or_memory_setting_is_refused(tmp_path):
    for env, message in (({"PARALLEL": "0"}, "PARALLEL=0: a whole number >= 1"),
                         ({"PER_EVAL_GIB": "lots"}, "PER_EVAL_GIB=lots: a whole number of GiB >= 1")):
        done = _run(tmp_path, DRAFTER="builtin:dspark-smollm2", **env)
        assert done.returncode == 2 and message in done.stdout
