"""JSON-lines reading shared by the prompt sources, with ``file:line`` in every error."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any, Iterator

from .base import WorkloadError


def iter_json_lines(path: str | Path, *, what: str = "JSON-lines file") -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, record)`` for each non-blank line of a JSONL file (``.gz`` allowed).

    Raises :class:`WorkloadError` naming ``file:line`` for a line that is not UTF-8 (with the
    byte offset and an ``iconv`` hint), not JSON or not a JSON object, naming the path when the
    file does not exist or a ``.gz`` file is truncated. A UTF-8 byte-order mark on line 1 is allowed.
    """
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"{what} {str(path)!r} does not exist or is not a file; check workload.path")
    gz = path.suffix == ".gz"
    opener = gzip.open if gz else open
    offset = 0  # byte offset of the current line's start (in the decompressed text for .gz)
    try:
        with opener(path, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                line = _decoded(raw, path, lineno, offset, gz, what)
                offset += len(raw)
                if lineno == 1:
                    line = line.removeprefix("\ufeff")
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
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:  # only .gz files raise these
        raise WorkloadError(f"{path}: the gzip file is truncated or corrupt ({exc}); re-create or re-download "
                            "it") from None


def _decoded(raw: bytes, path: Path, lineno: int, offset: int, gz: bool, what: str) -> str:
    """One line's bytes as text; a :class:`WorkloadError` naming file, line and byte offset if not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start:exc.end]
        utf16 = lineno == 1 and raw[:2] in (b"\xff\xfe", b"\xfe\xff")
        guess = "utf-16" if utf16 else "<encoding>"
        where = "of the decompressed text" if gz else "in the file"
        fix = (f"convert it, e.g. `iconv -f {guess} -t utf-8 {path} > {path.with_suffix('')}.utf8{path.suffix}`"
               if not gz else f"convert it, e.g. `zcat {path} | iconv -f {guess} -t utf-8 | gzip > fixed.jsonl.gz`")
        raise WorkloadError(
            f"{path}:{lineno}: the {what} is not UTF-8 (bytes {bad.hex(' ')} at byte offset {offset + exc.start} "
            f"{where}, column {len(raw[:exc.start].decode('utf-8', 'replace')) + 1} of line {lineno}"
            f"{'; the file starts with a UTF-16 byte-order mark' if utf16 else ''}); JSONL files must be UTF-8: "
            f"{fix}{'' if utf16 else ' (the encoding is often latin1 or cp1252; `file -i` guesses it)'}") from None


def read_json_lines(path: str | Path, *, what: str = "JSON-lines file") -> list[dict[str, Any]]:
    """All records of a JSONL file (see :func:`iter_json_lines`)."""
    return [record for _, record in iter_json_lines(path, what=what)]


__all__ = ["iter_json_lines", "read_json_lines"]
