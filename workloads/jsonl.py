"""JSON-lines reading shared by the prompt sources, with ``file:line`` in every error."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator

from .base import WorkloadError


def iter_json_lines(path: str | Path, *, what: str = "JSON-lines file") -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, record)`` for each non-blank line of a JSONL file (``.gz`` allowed).

    Raises :class:`WorkloadError` naming ``file:line`` for a line that is not JSON or
    not a JSON object, and naming the path when the file does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"{what} {str(path)!r} does not exist or is not a file; check workload.path")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno}); "
                                    "each line must hold one JSON object") from exc
            if not isinstance(record, dict):
                raise WorkloadError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            yield lineno, record


def read_json_lines(path: str | Path, *, what: str = "JSON-lines file") -> list[dict[str, Any]]:
    """All records of a JSONL file (see :func:`iter_json_lines`)."""
    return [record for _, record in iter_json_lines(path, what=what)]


__all__ = ["iter_json_lines", "read_json_lines"]
