"""Files that committed results and the shipped drafter keep xz-compressed: ``<name>.xz`` stands for ``<name>``.

Readers look for the plain file first, then its ``.xz`` copy, and read either the same way, so a folder works
whether its files were packed for the repository or are fresh from a run."""

from __future__ import annotations

import lzma
from pathlib import Path
from typing import IO


def plain_or_packed(path: str | Path) -> Path | None:
    """``path`` when it is a file, else ``<path>.xz`` when that is one, else None."""
    path = Path(path)
    if path.is_file():
        return path
    packed = path.with_name(path.name + ".xz")
    return packed if packed.is_file() else None


def read_text(path: str | Path) -> str:
    """The text of ``path``, decompressed when its name ends in ``.xz`` (lzma.LZMAError when that is corrupt)."""
    path = Path(path)
    if path.suffix == ".xz":
        return lzma.decompress(path.read_bytes()).decode()
    return path.read_text()


def open_text(path: str | Path, newline: str | None = None) -> IO[str]:
    """``path`` opened for reading text (for csv, ``newline=""``), decompressing as it reads when it ends in ``.xz``."""
    path = Path(path)
    if path.suffix == ".xz":
        return lzma.open(path, "rt", newline=newline)
    return open(path, newline=newline)
