"""Reports (markdown + plots, console table, sweeps), the node fingerprint, and W&B offline logging."""

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from dspark.bench.fingerprint import config_hash, device_telemetry, node_fingerprint
from dspark.bench.guards import errors_guard, lossless_guard
from dspark.bench.metrics import RequestRecord, aggregate_block, requests_dataframe
from dspark.bench.report import compare_runs, render_console_table, write_report, write_sweep_report
from dspark.bench.schedule import build_schedule, first_arm_by_block
from dspark.bench.statistics import compare_blocks
from dspark.bench.wandb_log import WandbLogger

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_records(arm, block, speed, rng):
    records = []
    for i in range(4):
        n = 8
        step = 0.02 / speed
        chunks = list(np.cumsum(np.full(4, step * 2)) + 0.1)
        records.append(RequestRecord(
            request_id=f"r{i}", arm=arm, block=block, prompt_tokens=16, output_token_ids=list(range(n)),
            arrival_s=0.0, first_token_s=chunks[0], finish_s=chunks[-1] + rng.uniform(0, 0.01),
            chunk_times_s=chunks, accept_lengths=[2, 2, 2, 2], verify_lengths=[3, 3, 3, 3],
            per_position_accepts=[4, 0, 0], per_position_reached=[4, 4, 0]))
    return records


def build_experiment(gain=0.10, n_blocks=8, seed=0):
    rng = np.random.default_rng(seed)
    schedule = build_schedule("ABBA", n_blocks, seed=seed)
    first = first_arm_by_block(schedule)
    block_rows, all_records = [], []
    for block, arm in schedule:
        speed = (1 + gain if arm == "B" else 1.0) * (1 + 0.01 * block)
        records = make_records(arm, block, speed, rng)
        wall = 1.0 / speed * float(np.exp(rng.normal(0, 0.02)))
        row = aggregate_block(records, wall_time_s=wall, counters={"drafted_tokens": 48})
        block_rows.append({"block": block, "arm": arm, "first_arm": first[block], **row})
        all_records += records
    blocks = pd.DataFrame(block_rows)
    stats = compare_blocks(blocks, {"output_tokens_per_s": "higher", "e2e_s_p50": "lower"}, n_boot=1000)
    outputs = {r.request_id: r.output_token_ids for r in all_records if r.block == 0}
    summary = {
        "experiment": f"gain{gain}",
        "headline_metric": "output_tokens_per_s",
        "arms": {"A": {"verify": "all"}, "B": {"verify": "ragged"}},
        "statistics": {k: v.to_dict() for k, v in stats.items()},
        "guards": [lossless_guard(outputs, outputs, dtype="float32").to_dict(), errors_guard(all_records).to_dict()],
        "fingerprint": {"hostname": "test-node", "config_hash": config_hash({"gain": gain})},
        "counters": {"A": {"drafted_tokens": 384}, "B": {"drafted_tokens": 384, "trimmed_steps": 17}},
        "sweep_params": {"gain": gain},
    }
    return summary, blocks, requests_dataframe(all_records)


def test_write_report_writes_markdown_and_plots(tmp_path):
    summary, blocks, requests = build_experiment()
    paths = write_report(tmp_path / "report", summary, blocks, requests)
    assert set(paths) == {"report", "per_block_plot", "distributions_plot", "acceptance_plot"}
    for name, path in paths.items():
        if name != "report":
            assert path.read_bytes()[:8] == PNG_MAGIC
    text = paths["report"].read_text()
    assert "Verdict on output_tokens_per_s: faster" in text
    assert "| lossless | yes |" in text
    assert "trimmed_steps" in text and "test-node" in text
    assert "(per_block.png)" in text


def test_report_says_what_it_could_not_draw(tmp_path):
    summary, blocks, _ = build_experiment()
    paths = write_report(tmp_path, {**summary, "guards": []}, blocks.drop(columns="per_position_acceptance"), None)
    text = paths["report"].read_text()
    assert "not drawn: latency distributions" in text and "not drawn: per-position acceptance" in text
    assert "unchecked" in text
    with pytest.raises(KeyError, match="headline_metric"):
        write_report(tmp_path, {"statistics": {}}, blocks, None)


def test_console_table_lists_every_metric():
    summary, _, _ = build_experiment()
    console = Console(file=io.StringIO(), width=160, record=True)
    table = render_console_table(summary, console=console)
    assert table.row_count == 2
    out = console.export_text()
    assert "output_tokens_per_s" in out and "faster" in out and "guards: 2/2 passed" in out


def declined_experiment(tmp_path):
    """build_experiment's summary where B (ragged) declined every step as predicted no gain, with its cost table
    and the finish reasons the A/B runner records."""
    from dspark.bench.guards import did_nothing_guard
    from dspark.cost_table import CostTable

    summary, blocks, requests = build_experiment(gain=0.0)
    counters_b = {"drafted_tokens": 384, "trimmed_steps": 0, "trim_ratio": 0.0,
                  "sched/plan_reason.declined_below_min_gain": 690, "sched/plan_reason.declined_mixed_step": 12}
    guard = did_nothing_guard("B", {"verify": "ragged"}, counters_b, expects_trim=True, expects_graphs=False,
                              expects_speculation=True)
    counts = tuple(range(1, 65))
    CostTable(token_counts=counts, theta_ms=tuple(0.05 * m for m in counts), fixed_overhead_ms=90.0,
              batch_sizes=(1, 2), batch_overhead_ms=(0.0, 1.0)).save(tmp_path / "table.json")
    summary = {**summary, "guards": [*summary["guards"], guard.to_dict()],
               "arms": {"A": {"label": "verify_all", "engine": {"spec": "dspark", "verify": "full"}},
                        "B": {"label": "ragged", "engine": {"spec": "dspark", "verify": "ragged"}}},
               "counters": {"A": {"drafted_tokens": 384}, "B": counters_b},
               "cost_tables": {"A": {"path": str(tmp_path / "table.json"), "how": "shared for the oracle bound"},
                               "B": {"path": str(tmp_path / "table.json"), "how": "reused"}},
               "finish_reasons": {"A": {"length": 12, "stop": 52}, "B": {"stop": 52, "length": 12}},
               "truncated": {"A": {"max_tokens": 12, "max_model_len": 0}, "B": {"max_tokens": 11, "max_model_len": 1}}}
    return summary, blocks, requests


NOTE = ("B declined every step (planner predicted no gain): A and B ran the same work; the measured difference is "
        "noise, not an effect of trimming")


def test_declined_everything_is_said_next_to_the_verdict_with_the_planner_and_the_cost_table(tmp_path):
    from dspark.bench.report import verdict_note

    summary, blocks, requests = declined_experiment(tmp_path)
    assert verdict_note(summary) == NOTE
    paths = write_report(tmp_path / "report", summary, blocks, requests)
    assert paths["cost_table_plot"].read_bytes()[:8] == PNG_MAGIC
    text = paths["report"].read_text()
    verdict_at = text.index("**Verdict on output_tokens_per_s:")
    assert text.index(f"**{NOTE}.**") > verdict_at  # right below the verdict, which stays
    assert "Truncated outputs (finish_reason length): A 12/64 (max_tokens 12), B 12/64 (max_tokens 11, max_model_len 1)" in text
    assert ("- Planner B (ragged): 702 decisions: declined_below_min_gain 690, declined_mixed_step 12; trimmed steps 0, "
            "trim_ratio 0.000") in text
    assert "- `declined_below_min_gain`: the planner predicted less than engine.min_predicted_gain" in text
    assert "(cost_table.png)" in text
    console = Console(file=io.StringIO(), width=200, record=True)
    render_console_table(summary, console=console)
    out = console.export_text()
    assert f"Verdict: {NOTE}." in out
    assert "Planner B (ragged): 702 decisions: declined_below_min_gain 690, declined_mixed_step 12" in out
    assert "  declined_mixed_step: steps carried a prefill and engine.skip_mixed_trim declines those" in out
    assert "Truncated outputs (finish_reason length): A 12/64" in out
    # A verify-all arm that ran target-only is not the same work: the note says only what B did.
    other = {**summary, "arms": {**summary["arms"], "A": {"label": "target", "engine": {"spec": "off", "verify": "full"}}}}
    assert verdict_note(other) == ("B declined every step (planner predicted no gain): B verified the whole drafted "
                                   "block on every step; the measured difference is not an effect of trimming")
    # A table that cannot be read is named, not fatal; a run whose B trimmed has no note.
    missing = {**summary, "cost_tables": {"B": {"path": str(tmp_path / "gone.json")}}}
    text = write_report(tmp_path / "missing", missing, blocks, requests)["report"].read_text()
    assert "not drawn: cost table: " in text and "gone.json" in text
    assert verdict_note(build_experiment()[0]) is None
    # A sweep names the jobs whose B declined every step next to their verdict.
    (tmp_path / "sweep" / "0").mkdir(parents=True)
    (tmp_path / "sweep" / "0" / "summary.json").write_text(json.dumps(summary))
    assert set(compare_runs([tmp_path / "sweep" / "0" / "summary.json"])["declined_all"]) == {"B"}
    assert "(B declined every step: no trimming measured)" in write_sweep_report(tmp_path / "sweep")["markdown"].read_text()


def test_sweep_report_collects_jobs(tmp_path):
    for job, gain in enumerate((0.0, 0.10, 0.20)):
        summary, _, _ = build_experiment(gain=gain, seed=job)
        (tmp_path / str(job)).mkdir()
        (tmp_path / str(job) / "summary.json").write_text(json.dumps(summary))
    table = compare_runs(sorted(tmp_path.rglob("summary.json")))
    assert len(table) == 6 and table["is_headline"].sum() == 3
    headline = table[table["is_headline"]].set_index("param/gain")
    assert headline.loc[0.2, "change_pct"] > headline.loc[0.1, "change_pct"] > headline.loc[0.0, "change_pct"]
    assert headline.loc[0.2, "verdict"] == "faster"
    paths = write_sweep_report(tmp_path)
    assert paths["plot"].read_bytes()[:8] == PNG_MAGIC
    assert len(pd.read_csv(paths["csv"])) == 6
    assert "gain=0.2" in paths["markdown"].read_text()
    with pytest.raises(FileNotFoundError, match="no summary.json"):
        write_sweep_report(tmp_path / "0" / "missing")


def test_node_fingerprint_and_telemetry_never_raise(tmp_path):
    fp = node_fingerprint({"b": 1, "a": [1, 2]}, project_root=tmp_path)  # not a git checkout
    assert fp["git"] == {"sha": None, "dirty": None}
    assert fp["config_hash"] == config_hash({"a": [1, 2], "b": 1})  # key order does not matter
    assert fp["config_hash"] != config_hash({"a": [1, 2], "b": 2})
    assert fp["device"] in ("cpu", "cuda") and fp["versions"]["torch"]
    telemetry = device_telemetry()
    assert telemetry["available"] in (True, False)
    if not telemetry["available"]:
        assert telemetry["reason"]


def test_wandb_offline_run_per_arm_keeps_going_after_a_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = WandbLogger(mode=None, project="dspark-bench-test", group="exp-test", dir=tmp_path)
    assert logger.mode == "offline"
    summary, blocks, requests = build_experiment(n_blocks=2)
    for arm in ("A", "B"):
        logger.start_arm(arm, job_type=arm, config={"arm": arm, "verify": summary["arms"][arm]["verify"]})
    for row in blocks.to_dict("records"):
        logger.log_block(row["arm"], row["block"], {"output_tokens_per_s": row["output_tokens_per_s"],
                                                    "per_position_acceptance": row["per_position_acceptance"]})
    logger.log_requests("A", requests[requests["arm"] == "A"])
    with pytest.warns(RuntimeWarning, match="local results are unaffected"):
        logger.log_block("C", 0, {"x": 1.0})  # no such run: recorded, not raised
    for arm in ("A", "B"):
        logger.finish_arm(arm, {"gain_sentinel_pct": 12.5, "verdict": "faster"})
    logger.close()
    status = logger.status()
    assert [f["call"] for f in status["failures"]] == ["log_block"]
    for arm in ("A", "B"):
        run_dir = Path(status["run_dirs"][arm])
        assert run_dir.is_dir() and run_dir.name.startswith("offline-run-")
        (log_file,) = run_dir.glob("*.wandb")
        data = log_file.read_bytes()  # the offline run log; `wandb sync` uploads it later
        assert b"gain_sentinel_pct" in data and b"output_tokens_per_s" in data


def test_wandb_online_without_key_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match="WANDB_API_KEY"):
        WandbLogger(mode="online", group="g", dir=tmp_path)
    with pytest.raises(ValueError, match="'cloud'"):
        WandbLogger(mode="cloud")
    disabled = WandbLogger(mode="disabled")
    disabled.start_arm("A", "A", {})
    disabled.log_block("A", 0, {"x": 1})
    assert disabled.status()["failures"] == []


def test_report_shows_the_cost_tables_predictions_against_the_planned_steps(tmp_path):
    summary, blocks, requests = build_experiment()
    summary["prediction_health"] = {"B": {"tokens_realised_over_predicted": 0.98, "step_ms_measured_over_predicted": 1.31,
                                          "tolerance": 0.15, "flags": ["arm B: step time 1.31x ..."]}}
    text = write_report(tmp_path / "report", summary, blocks, requests)["report"].read_text()
    assert ("arm B, the cost table's predictions against its planned steps: tokens per step 0.98x predicted, "
            "step time 1.31x predicted **FLAGGED** (beyond +/-15%)") in text
