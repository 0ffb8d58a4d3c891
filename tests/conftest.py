import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("WANDB_MODE", "offline")
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
