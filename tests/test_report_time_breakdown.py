"""The A/B report's "Where the time went" section: step-path counters per arm, with and without them."""

import math

import numpy as np
import pandas as pd
import pytest

from dspark.bench.report import time_breakdown, where_time_went, write_report
from test_bench_report import build_experiment


def labelled(summary):
    return {**summary, "arms": {"A": {"label": "verify_all", "verify": "all"},
                                "B": {"label": "ragged", "verify": "ragged"}}}


def section(text: str) -> str:
    start = text.index("## Where the time went")
    return text[start:text.index("## Engine counters", start)]


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def with_step_counters(blocks: pd.DataFrame) -> pd.DataFrame:
    """The new engine counters on every block; eager reasons only where they occurred (NaN elsewhere)."""
    blocks = blocks.copy()
    is_b = blocks["arm"] == "B"
    blocks["counter/decode_steps"] = np.where(is_b, 100, 200)
    blocks["counter/graph_replays"] = np.where(is_b, 90, 200)
    blocks["counter/graph_eager_steps"] = 0
    blocks["counter/eager_steps"] = np.where(is_b, 10, 0)
    blocks["counter/eager_reason/ragged_window"] = np.where(is_b, 8.0, np.nan)
    blocks["counter/eager_reason/prefill_in_step"] = np.where(is_b, 2.0, np.nan)
    blocks["counter/eager_reason/never_happened"] = 0
    blocks["counter/device_resident_share"] = np.where(is_b, 0.9, 1.0)
    blocks["counter/prefill_graph_replays"] = 4
    blocks["counter/prefill_eager_steps"] = 1
    blocks["counter/host_ms_per_graph_step_median"] = np.where(is_b, 0.75, 0.5) + 0.01 * blocks["block"]
    blocks["counter/device_idle_fraction"] = np.where(is_b, np.nan, 0.125)  # B never measured it
    blocks["counter/graphs_captured"] = np.where(is_b & (blocks["block"] == 0), 3, 0)
    blocks["counter/mean_running_batch"] = np.where(is_b, 15.5, 16.0)
    blocks["counter/kv_pool_tokens"] = 32768
    return blocks


def test_section_without_the_new_counters_leaves_cells_empty(tmp_path):
    summary, blocks, requests = build_experiment()
    text = write_report(tmp_path, labelled(summary), blocks, requests)["report"].read_text()
    part = section(text)
    lines = [line for line in part.splitlines() if line.startswith("| verify_all") or line.startswith("| ragged")]
    assert len(lines) == 2 and "| A |" not in part and "| B |" not in part
    row = cells(lines[0])
    assert row[1:9] == ["-"] * 8  # no step-path counter in an older run
    assert row[9].endswith("x")  # first / median block still comes from the blocks' throughput
    assert "⚠" not in text and "KV pool" not in part
    # first block over median block, from the headline metric
    rows = {r["arm"]: r for r in time_breakdown(summary, blocks)}
    a = blocks[blocks["arm"] == "A"].sort_values("block")["output_tokens_per_s"]
    assert rows["A"]["first_block_vs_median"] == pytest.approx(a.iloc[0] / a.median())
    assert rows["A"]["label"] == "A"  # no labels in the summary: the arm's key


def test_section_with_the_new_counters_and_timing_health(tmp_path):
    summary, blocks, requests = build_experiment()
    blocks = with_step_counters(blocks)
    summary = labelled(summary)
    summary["timing_health"] = {"captured_in_timed_blocks": [{"block": 0, "arm": "B", "graphs": 3}],
                                "first_block_vs_median": {"A": 0.8, "B": 1.01},
                                "flags": ["arm ragged captured 3 graphs in timed block 0",
                                          "arm verify_all's first block ran at 0.80x its median"]}
    rows = {r["arm"]: r for r in time_breakdown(summary, blocks)}
    n_b = int((blocks["arm"] == "B").sum())
    assert rows["B"]["decode_steps"] == 100 * n_b and rows["B"]["device_resident_share"] == pytest.approx(0.9)
    assert rows["B"]["eager_reasons"] == {"ragged_window": 8.0 * n_b, "prefill_in_step": 2.0 * n_b}
    assert rows["A"]["eager_reasons"] == {} and rows["A"]["eager_steps"] == 0
    assert rows["B"]["device_idle_fraction"] is None and rows["A"]["device_idle_fraction"] == pytest.approx(0.125)
    assert rows["B"]["graphs_captured_timed"] == 3 and rows["A"]["graphs_captured_timed"] == 0
    assert rows["A"]["first_block_vs_median"] == 0.8  # timing_health's own ratio wins
    host_b = blocks.loc[blocks["arm"] == "B", "counter/host_ms_per_graph_step_median"]
    assert rows["B"]["host_ms_per_step"] == pytest.approx(host_b.median())

    text = write_report(tmp_path, summary, blocks, requests)["report"].read_text()
    part = section(text)
    ragged = next(line for line in part.splitlines() if line.startswith("| ragged"))
    assert "90%" in ragged and f"{10 * n_b}: ragged_window {8 * n_b}, prefill_in_step {2 * n_b}" in ragged
    assert "never_happened" not in part and "**3** ⚠" in ragged and "1.01x" in ragged
    verify_all = next(line for line in part.splitlines() if line.startswith("| verify_all"))
    assert "100%" in verify_all and "12.5%" in verify_all and "0.80x" in verify_all and "16.0" in cells(verify_all)
    assert "- ⚠ arm ragged captured 3 graphs in timed block 0" in part
    assert "KV pool (tokens): verify_all 32,768, ragged 32,768." in part
    assert "⚠ 2 timing warning(s)" in text.split("\n## ")[0]  # pointed at next to the verdict
    assert len(part.splitlines()) < 20  # compact


def test_section_copes_with_some_counters_and_nan_values(tmp_path):
    summary, blocks, requests = build_experiment(n_blocks=4)
    blocks = blocks.copy()
    blocks["counter/eager_steps"] = 5
    blocks["counter/device_idle_fraction"] = math.nan
    blocks["counter/graphs_captured"] = 0
    summary = {**summary, "timing_health": {"flags": []}}
    text = write_report(tmp_path, summary, blocks, None)["report"].read_text()
    part = section(text)
    a = next(line for line in part.splitlines() if line.startswith("| A "))
    cells_a = cells(a)
    n_a = int((blocks["arm"] == "A").sum())
    assert cells_a[1] == "-" and cells_a[2] == "-" and cells_a[3] == str(5 * n_a) and cells_a[6] == "-"
    assert cells_a[8] == "0"
    assert "⚠" not in text


def test_host_phases_table_gives_each_arms_median_per_phase_and_the_cycle(tmp_path):
    summary, blocks, requests = build_experiment()
    blocks = with_step_counters(blocks)
    is_b = blocks["arm"] == "B"
    blocks["counter/host/plan_ms_per_step"] = np.where(is_b, 0.5, 0.0) + 0.01 * blocks["block"]
    blocks["counter/host/commit_ms_per_step"] = 1.0
    blocks["counter/host/wait_ms_per_step"] = np.where(is_b, np.nan, 2.0)  # B never reported a wait
    rows = {r["arm"]: r for r in time_breakdown(labelled(summary), blocks)}
    plan_b = blocks.loc[is_b, "counter/host/plan_ms_per_step"].median()
    assert rows["B"]["host_phases"] == {"plan": pytest.approx(plan_b), "commit": 1.0}
    assert rows["A"]["host_phases"] == {"plan": pytest.approx(blocks.loc[~is_b, "counter/host/plan_ms_per_step"].median()),
                                        "wait": 2.0, "commit": 1.0}
    part = section(write_report(tmp_path, labelled(summary), blocks, requests)["report"].read_text())
    header = next(line for line in part.splitlines() if cells(line)[:2] == ["arm", "plan"])
    assert cells(header) == ["arm", "plan", "wait", "commit", "cycle"]  # the phases any arm reported, in step order
    ragged = [line for line in part.splitlines() if line.startswith("| ragged")][-1]
    assert cells(ragged) == ["ragged", f"{plan_b:.2f}", "-", "1.00", f"{plan_b + 1.0:.2f}"]


def test_device_time_per_batch_bucket_puts_a_trimmed_step_beside_a_whole_block_step_of_the_same_rows(tmp_path):
    """The engine's device/<mode>_b<rows>_step_ms_median counters become one table: a row per batch bucket, a
    column per arm and step mode (whole block first), median over blocks; '-' where a mode never ran at a bucket."""
    summary, blocks, requests = build_experiment()
    blocks = with_step_counters(blocks)
    is_b = blocks["arm"] == "B"
    blocks["counter/device/full_b128_step_ms_median"] = np.where(is_b, 3.5, 3.0) + 0.1 * blocks["block"]
    blocks["counter/device/ragged_b128_step_ms_median"] = np.where(is_b, 4.0, np.nan)
    blocks["counter/device/draft_free_b256_step_ms_median"] = np.where(is_b, 2.0, np.nan)
    rows = {r["arm"]: r for r in time_breakdown(labelled(summary), blocks)}
    full_b = blocks.loc[is_b, "counter/device/full_b128_step_ms_median"].median()
    assert rows["B"]["device_step_ms"] == {("full", 128): pytest.approx(full_b), ("ragged", 128): 4.0,
                                           ("draft_free", 256): 2.0}
    assert set(rows["A"]["device_step_ms"]) == {("full", 128)}
    part = section(write_report(tmp_path, labelled(summary), blocks, requests)["report"].read_text())
    header = next(line for line in part.splitlines() if line.startswith("| batch rows"))
    assert cells(header) == ["batch rows", "verify_all: full", "ragged: full", "ragged: draft_free", "ragged: ragged"]
    row128 = next(line for line in part.splitlines() if line.startswith("| 128 "))
    assert cells(row128)[2:] == [f"{full_b:.2f}", "-", "4.00"]
    assert cells(next(line for line in part.splitlines() if line.startswith("| 256 "))) == ["256", "-", "-", "2.00", "-"]
