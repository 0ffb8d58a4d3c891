"""dspark.packed_files: a committed ``<name>.xz`` stands for ``<name>``; the plain file wins when both exist."""

import csv
import lzma

import pytest

from dspark.packed_files import open_text, plain_or_packed, read_text


def test_plain_file_is_found_before_its_packed_copy(tmp_path):
    (tmp_path / "log.jsonl").write_text("plain\n")
    (tmp_path / "log.jsonl.xz").write_bytes(lzma.compress(b"packed\n"))
    assert plain_or_packed(tmp_path / "log.jsonl") == tmp_path / "log.jsonl"
    assert read_text(plain_or_packed(tmp_path / "log.jsonl")) == "plain\n"


def test_packed_copy_stands_in_when_alone(tmp_path):
    (tmp_path / "eval.json.xz").write_bytes(lzma.compress(b'{"a": 1}'))
    found = plain_or_packed(tmp_path / "eval.json")
    assert found == tmp_path / "eval.json.xz"
    assert read_text(found) == '{"a": 1}'


def test_neither_is_none(tmp_path):
    assert plain_or_packed(tmp_path / "missing.json") is None
    (tmp_path / "folder.json").mkdir()  # a folder of that name is not the file
    assert plain_or_packed(tmp_path / "folder.json") is None


def test_corrupt_packed_file_raises(tmp_path):
    bad = tmp_path / "record.json.xz"
    bad.write_bytes(lzma.compress(b"x" * 1000)[:20])
    with pytest.raises(lzma.LZMAError):
        read_text(bad)


@pytest.mark.parametrize("packed", [False, True])
def test_open_text_reads_csv_either_way(tmp_path, packed):
    text = "arm,output_tokens_per_s\r\nA,\"1.5\"\r\nB,2\r\n"
    path = tmp_path / ("blocks.csv.xz" if packed else "blocks.csv")
    path.write_bytes(lzma.compress(text.encode()) if packed else text.encode())
    with open_text(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["arm"], r["output_tokens_per_s"]) for r in rows] == [("A", "1.5"), ("B", "2")]
