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
