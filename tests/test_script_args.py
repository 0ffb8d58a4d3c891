"""dspark.bench.script_args: the bench scripts' OUT_DIR key=value command lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dspark.bench.script_args import existing_files, out_and_options


def test_the_folder_and_options_come_back_and_anything_else_is_refused_with_the_usage(tmp_path):
    out, opts = out_and_options(["o", "data=a,b", "stride=2"], "USAGE", ("data", "stride"), ("data",))
    assert out == Path("o") and opts == {"data": "a,b", "stride": "2"}
    for argv, message in (([], "USAGE"), (["data=x"], "USAGE"), (["o", "stride=2"], "no data="),
                          (["o", "data=x", "strid=2"], "unknown option(s) ['strid']"),
                          (["o", "data"], "not key=value")):
        with pytest.raises(SystemExit, match=re.escape(message)):
            out_and_options(argv, "USAGE", ("data", "stride"), ("data",))
    (tmp_path / "a").write_text("x")
    assert existing_files(f"{tmp_path / 'a'}") == [str(tmp_path / "a")]
    with pytest.raises(SystemExit, match=r"data: no such file\(s\) \['.*b'\]"):
        existing_files(f"{tmp_path / 'a'},{tmp_path / 'b'}")
