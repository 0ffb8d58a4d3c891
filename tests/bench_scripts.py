"""Load a script of ``bench/`` (not a package) as a module, for the tests that call its functions."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench_script(name: str) -> ModuleType:
    """``bench/<name>.py`` executed as a fresh module named ``name``."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
