"""Command lines of the bench scripts that take ``OUT_DIR key=value ...`` (bench/greedy_miss_ranks.py and the like):
the output folder and the options, refused with the script's usage on anything else."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable


def out_and_options(argv: list[str], usage: str, allowed: Iterable[str], required: Iterable[str] = ()
                    ) -> tuple[Path, dict[str, str]]:
    """(OUT_DIR, {key: value}) from ``argv``; SystemExit with ``usage`` when the first argument is missing or is an
    option, an argument is not key=value, a key is not ``allowed`` or a ``required`` key is missing."""
    if not argv or "=" in argv[0]:
        raise SystemExit(usage)
    loose = [a for a in argv[1:] if "=" not in a]
    if loose:
        raise SystemExit(f"not key=value: {loose}; see the usage:\n{usage}")
    opts = dict(a.split("=", 1) for a in argv[1:])
    unknown = sorted(set(opts) - set(allowed))
    missing = [k for k in required if k not in opts]
    if unknown or missing:
        raise SystemExit(f"unknown option(s) {unknown}" + (f", no {'=, '.join(missing)}=" if missing else "")
                         + f"; see the usage:\n{usage}")
    return Path(argv[0]), opts


def existing_files(value: str, key: str = "data") -> list[str]:
    """The comma-separated files of option ``key``; SystemExit naming those that are not there."""
    files = value.split(",")
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise SystemExit(f"{key}: no such file(s) {missing}")
    return files
