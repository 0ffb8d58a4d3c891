"""Writes are not torn: a result file is replaced whole or left as it was (dspark/atomic.py)."""

import pytest

from dspark.atomic import atomic_write, atomic_write_text


def test_a_write_is_whole_or_not_at_all(tmp_path):
    path = tmp_path / "summary.json"
    atomic_write_text(path, '{"a": 1}')
    assert path.read_text() == '{"a": 1}'

    def torn(tmp):  # half a file written, then the process dies
        tmp.write_text('{"a": 2, "b"')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, torn)
    assert path.read_text() == '{"a": 1}'  # the previous file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary left behind


def test_a_written_file_has_the_mode_a_created_file_would(tmp_path):
    """Not the temporary file's private 0o600: 0o666 less the umask for a new file, the old mode for a replaced one
    (results and cost tables in a shared folder stay readable)."""
    import os

    from dspark.atomic import new_file_mode

    old = os.umask(0o027)
    try:
        assert new_file_mode() == 0o640
        path = tmp_path / "cost_table.json"
        atomic_write_text(path, "{}")
        assert path.stat().st_mode & 0o777 == 0o640
        os.chmod(path, 0o644)
        atomic_write_text(path, "[]")
        assert path.stat().st_mode & 0o777 == 0o644 and path.read_text() == "[]"
    finally:
        os.umask(old)
