"""Result files written whole or not at all: into a temporary file beside the target, then renamed
over it (``os.replace`` is atomic on one filesystem), so a crash or a full disk mid-write leaves the
previous file, never a torn one that a reader would choke on. The file gets the mode a plainly created
file would (0o666 less the umask; a replaced file's own mode), not the temporary file's private 0o600, so that
results and cost tables in a shared folder stay readable to the others who use it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def new_file_mode() -> int:
    """0o666 less this process's umask: the mode ``open()`` gives a new file. The umask is read from
    /proc/self/status where there is one (setting it to read it back would race other threads' file creation)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)`` to produce the file, then rename it to ``path``; on any error the
    temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    mode = path.stat().st_mode & 0o777 if path.exists() else new_file_mode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))
