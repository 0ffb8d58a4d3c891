"""dspark.bench.compare_plot: the figure of a paired drafter comparison, one panel per (workload, T)."""

from __future__ import annotations

import matplotlib.image as mpimg

from dspark.bench.compare_plot import _entries, plot_comparison


def _row(workload, change, sources):
    ci = {"low": change - 2.0, "high": change + 2.0, "level": 0.95}
    return {"workload": workload, "temperature": 0.0, "n_prompts": 12, "change_pct": change, "ci": ci,
            "by_source": [{"source": name, "n_prompts": n, "change_pct": c,
                           "ci": {"low": None, "high": None, "note": "too few"} if n < 5 else
                           {"low": c - 5.0, "high": c + 5.0}} for name, n, c in sources]}


def _comparison(rows):
    return {"a": {"path": "a.json"}, "b": {"path": "b.json"}, "bootstrap": {"ci_level": 0.95}, "rows": rows,
            "notes": []}


def test_one_panel_per_row_whole_row_first_then_each_source(tmp_path):
    rows = [_row("arena_hard", 9.9, [("arena_hard:writing", 12, 6.7), ("arena_hard:math", 3, 7.4)]),
            _row("poetry", 6.2, [])]
    assert [e[0] for e in _entries(rows[0])] == ["all prompts", "arena_hard:writing", "arena_hard:math"]
    path = plot_comparison(_comparison(rows), tmp_path / "compare.png")
    assert path == tmp_path / "compare.png"
    image = mpimg.imread(path)
    # taller with more entries: 3 + 1 rows of entries against 1 + 1
    short = plot_comparison(_comparison([_row("poetry", 6.2, []), _row("agentic", 8.0, [])]), tmp_path / "s.png")
    assert image.shape[0] > mpimg.imread(short).shape[0]


def test_nothing_to_draw_writes_no_file(tmp_path):
    empty = {"workload": "w", "temperature": 0.0, "n_prompts": 0, "change_pct": None, "ci": {}, "by_source": []}
    assert plot_comparison(_comparison([empty]), tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
