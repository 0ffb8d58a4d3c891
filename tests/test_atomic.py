"""Writes are not torn: a result file is replaced whole or left as it was (dspark/atomic.py)."""

import pytest

from dspark.atomic import atomic_write, atomic_write_text


def test_writes_are_not_atomic_no_longer(tmp_path):
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
