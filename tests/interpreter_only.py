"""Shared guard for the test modules that run Triton kernels under the CPU interpreter.

Call ``interpreter_module()`` at the top of such a module, before anything imports triton:

- on a machine with CUDA the module is skipped (setting TRITON_INTERPRET there would switch every
  kernel of the session to the interpreter; tests/test_kernels_gpu.py runs the compiled kernels);
- if triton was imported without TRITON_INTERPRET=1, it raises: triton.language's own helpers are
  decorated at import time, so the interpreter cannot be switched on afterwards (tests/conftest.py
  sets it when there is no GPU);
- otherwise it sets TRITON_INTERPRET=1, which @triton.jit reads when it decorates a function.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch  # does not import triton


def interpreter_module() -> None:
    if torch.cuda.is_available():
        pytest.skip("CPU-interpreter module; on a CUDA machine see tests/test_kernels_gpu.py", allow_module_level=True)
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set; set it in tests/conftest.py "
                           "(before any import of triton) or run this module on its own")
    os.environ["TRITON_INTERPRET"] = "1"
