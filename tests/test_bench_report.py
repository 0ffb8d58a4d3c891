"""Reports (markdown + plots, console table, sweeps), the node fingerprint, and W&B offline logging."""

import io
import json
import re
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
    """Four requests; request i waited 0.05 * i s for a concurrency slot before it was submitted at 0.05 * i."""
    records = []
    for i in range(4):
        n = 8
        step = 0.02 / speed
        submitted = 0.05 * i
        chunks = list(np.cumsum(np.full(4, step * 2)) + 0.1 + submitted)
        records.append(RequestRecord(
            request_id=f"r{i}", arm=arm, block=block, prompt_tokens=16, output_token_ids=list(range(n)),
            arrival_s=submitted, first_token_s=chunks[0], finish_s=chunks[-1] + rng.uniform(0, 0.01),
            chunk_times_s=chunks, accept_lengths=[2, 2, 2, 2], verify_lengths=[3, 3, 3, 3],
            per_position_accepts=[4, 0, 0], per_position_reached=[4, 4, 0], scheduled_arrival_s=0.0))
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


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the first markdown table under ``heading`` (header row first, separator left out)."""
    part = text[text.index(heading):]
    lines = []
    for line in part.splitlines()[1:]:
        if line.startswith("|"):
            lines.append([c.strip() for c in line.strip("|").split("|")])
        elif lines:
            break
    return [lines[0], *lines[2:]]


def test_write_report_writes_markdown_appendix_and_plots(tmp_path):
    summary, blocks, requests = build_experiment()
    paths = write_report(tmp_path / "report", summary, blocks, requests)
    assert set(paths) == {"report", "appendix", "per_block_plot", "latency_cdf_plot", "acceptance_plot"}
    for name, path in paths.items():
        if name.endswith("_plot"):
            assert path.read_bytes()[:8] == PNG_MAGIC
    text = paths["report"].read_text()
    assert text.startswith("# A/B report: gain0.1\n\n**Verdict on output_tokens_per_s: B faster than A by ")
    assert table_rows(text, "## Guards")[1][:2] == ["lossless", "yes"]
    assert "trimmed_steps" in text and "test-node" in text
    assert "(per_block.png)" in text and "(latency_cdf.png)" in text
    assert "[report_appendix.md](report_appendix.md)" in text
    # The order a reader meets: verdict, results per arm, differing settings, CDFs, then the rest.
    order = [text.index(h) for h in ("**Verdict on", "## Results per arm", "## Settings that differ between arms",
                                     "## Latency CDFs", "## Statistics", "## Guards", "## Engine counters")]
    assert order == sorted(order)


def test_report_says_what_it_could_not_draw(tmp_path):
    summary, blocks, _ = build_experiment()
    paths = write_report(tmp_path, {**summary, "guards": []}, blocks.drop(columns="per_position_acceptance"), None)
    text = paths["report"].read_text()
    assert "not drawn: latency CDFs" in text and "not drawn: per-position acceptance" in text
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
    assert "Verdict on output_tokens_per_s: B faster than A by" in out


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
               "counters": {"A": {"drafted_tokens": 384, "oracle/headroom_vs_full_block": 0.131,
                                  "oracle/headroom_in_service": 0.075}, "B": counters_b},
               "cost_tables": {"A": {"path": str(tmp_path / "table.json"), "how": "shared for the oracle bound"},
                               "B": {"path": str(tmp_path / "table.json"), "how": "reused"}},
               "finish_reasons": {"A": {"length": 12, "stop": 52}, "B": {"stop": 52, "length": 12}},
               "truncated": {"A": {"max_tokens": 12, "max_model_len": 0}, "B": {"max_tokens": 11, "max_model_len": 1}}}
    return summary, blocks, requests


NOTE = ("B declined every step (planner predicted no gain, steps with prefills): A and B ran the same work; the "
        "measured difference is noise, not an effect of trimming")


def test_declined_everything_is_said_next_to_the_verdict_with_the_planner_and_the_cost_table(tmp_path):
    from dspark.bench.report import verdict_note

    summary, blocks, requests = declined_experiment(tmp_path)
    assert verdict_note(summary) == NOTE
    paths = write_report(tmp_path / "report", summary, blocks, requests)
    assert paths["cost_table_plot"].read_bytes()[:8] == PNG_MAGIC
    text = paths["report"].read_text()
    verdict_at = text.index("**Verdict on output_tokens_per_s:")
    assert "ragged (B)" in text[verdict_at:text.index("\n", verdict_at)]  # the arms by their labels
    assert text.index(f"**{NOTE}.**") > verdict_at  # right below the verdict, which stays
    assert "Truncated outputs (finish_reason length): A 12/64 (12 at max_tokens), B 12/64 (11 at max_tokens, 1 at max_model_len)" in text
    assert ("- Planner B (ragged): 702 decisions: declined_below_min_gain 690, declined_mixed_step 12; trimmed steps 0, "
            "trim_ratio 0.000") in text
    assert "- `declined_below_min_gain`: the planner predicted less than engine.min_predicted_gain" in text
    assert "(cost_table.png)" in text
    assert ("- arm A, the oracle bound over its full-block steps (a trim to exactly the drafts each request accepted, "
            "on the same acceptances): +13.1% at the cost table's prices; +7.5% of the steps' measured time") in text
    console = Console(file=io.StringIO(), width=200, record=True)
    render_console_table(summary, console=console)
    out = console.export_text()
    assert f"Verdict: {NOTE}." in out
    assert "Planner B (ragged): 702 decisions: declined_below_min_gain 690, declined_mixed_step 12" in out
    assert "  declined_mixed_step: steps carried a prefill and engine.skip_mixed_trim declines those" in out
    assert "Truncated outputs (finish_reason length): A 12/64" in out
    # A verify-all arm that ran target-only is not the same work: the note says only what B did.
    other = {**summary, "arms": {**summary["arms"], "A": {"label": "target", "engine": {"spec": "off", "verify": "full"}}}}
    assert verdict_note(other) == ("B declined every step (planner predicted no gain, steps with prefills): B verified "
                                   "the whole drafted block on every step; the measured difference is not an effect of "
                                   "trimming")
    # the reasons as the counters give them: a batch below plan_min_rows is not a predicted loss
    small = {**summary, "counters": {**summary["counters"], "B": {"sched/plan_reason.declined_small_batch": 14}}}
    assert verdict_note(small).startswith("B declined every step (fewer rows than engine.plan_min_rows): ")
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
    csv = pd.read_csv(paths["csv"])
    assert len(csv) == 6 and set(csv["job"]) == set(csv["overrides"]) == {"gain=0.0", "gain=0.1", "gain=0.2"}
    assert "| gain=0.2 " in paths["markdown"].read_text()
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
    logger = WandbLogger(mode=None, project="dspark-bench-test", dir=tmp_path)
    assert logger.mode == "offline"
    summary, blocks, requests = build_experiment(n_blocks=2)
    for arm in ("A", "B"):
        logger.start_arm(arm, config={"verify": summary["arms"][arm]["verify"]})
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
        assert run_dir.is_dir() and run_dir.name.startswith("offline-run-") and run_dir.parent == tmp_path / "wandb"
        (log_file,) = run_dir.glob("*.wandb")
        data = log_file.read_bytes()  # the offline run log; `wandb sync` uploads it later
        assert b"gain_sentinel_pct" in data and b"output_tokens_per_s" in data


def test_wandb_online_without_key_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match="WANDB_API_KEY"):
        WandbLogger(mode="online", dir=tmp_path)
    with pytest.raises(ValueError, match="'cloud'"):
        WandbLogger(mode="cloud")
    disabled = WandbLogger(mode="disabled")
    disabled.start_arm("A", {})
    disabled.log_block("A", 0, {"x": 1})
    assert disabled.status()["failures"] == []


def test_report_shows_the_cost_tables_predictions_against_the_planned_steps(tmp_path):
    summary, blocks, requests = build_experiment()
    summary["prediction_health"] = {"B": {"tokens_realised_over_predicted": 0.98, "step_ms_measured_over_predicted": 1.31,
                                          "tolerance": 0.15, "flags": ["arm B: step time 1.31x ..."]}}
    text = write_report(tmp_path / "report", summary, blocks, requests)["report"].read_text()
    assert ("arm B, the cost table's predictions against its planned steps: tokens per step 0.98x predicted, "
            "step time 1.31x predicted **FLAGGED** (beyond +/-15%)") in text
    summary["prediction_health"]["B"].update(step_ms_measured_over_service_price=1.04)
    text = write_report(tmp_path / "report1", summary, blocks, requests)["report"].read_text()
    assert ("step time 1.31x predicted; at the service price it planned with, step time 1.04x **FLAGGED** "
            "(beyond +/-15%): arm B: step time 1.31x ...") in text
    summary["cost_tables"] = {"B": {"path": "/t/smollm2.json", "how": "reused from cache", "fingerprint": "ab12",
                                    "fit_summary": "R² 0.997, largest residual 4.1%"}}
    text = write_report(tmp_path / "report2", summary, blocks, requests)["report"].read_text()
    assert ("arm B priced its steps with `/t/smollm2.json` (reused from cache, fingerprint ab12; fit R² 0.997, "
            "largest residual 4.1%)") in text



def test_report_shows_the_plan_gate_per_bucket(tmp_path):
    summary, blocks, requests = build_experiment()
    text = write_report(tmp_path / "report0", summary, blocks, requests)["report"].read_text()
    assert "the plan gate per batch bucket" not in text  # no gate counters: no table
    gate = {"plan_gate/planned_steps": 9, "plan_gate/b256/planned_steps": 5, "plan_gate/b256/skipped_steps": 95,
            "plan_gate/b256/probe_steps": 5, "plan_gate/b256/charged_costs": 4,
            "plan_gate/b256/benefit_ms_estimate": 0.3, "plan_gate/b256/cost_ms_estimate": 0.51,
            "plan_gate/b16/planned_steps": 4, "plan_gate/b16/skipped_steps": 0, "plan_gate/b16/probe_steps": 0,
            "plan_gate/b16/charged_costs": 0, "plan_gate/b16/benefit_ms_estimate": 0.0,
            "plan_gate/b16/cost_ms_estimate": 0.0}
    summary["counters"] = {**summary.get("counters", {}), "B": {**summary.get("counters", {}).get("B", {}), **gate}}
    text = re.sub(r" +", " ", write_report(tmp_path / "report1", summary, blocks, requests)["report"].read_text())
    assert "- arm B, the plan gate per batch bucket" in text
    assert "| 16 | 4 | 0 | 0 | 0 | 0 | 0 |" in text and "| 256 | 5 | 95 | 5 | 4 | 0.3 | 0.51 |" in text
    assert text.index("| 16 | 4 |") < text.index("| 256 | 5 |")


def test_report_shows_the_online_calibration_per_position(tmp_path):
    summary, blocks, requests = build_experiment()
    text = write_report(tmp_path / "report0", summary, blocks, requests)["report"].read_text()
    assert "engine.online_calibration" not in text  # no such counters: no table
    online = {"online_calibration/refits": 12, "online_calibration/tested": 4000,
              "online_calibration/offset.1": -0.25, "online_calibration/offset.2": 0.5,
              "online_calibration/observed_over_predicted.1": 0.91,
              "online_calibration/observed_over_predicted.2": 1.02}
    summary["counters"] = {**summary.get("counters", {}), "B": {**summary.get("counters", {}).get("B", {}), **online}}
    text = re.sub(r" +", " ", write_report(tmp_path / "report1", summary, blocks, requests)["report"].read_text())
    assert "- arm B, the head's calibration corrected in service (engine.online_calibration): 12 refits over" in text
    assert "| 1 | -0.25 | 0.91 |" in text and "| 2 | 0.5 | 1.02 |" in text


def test_report_shows_the_measured_choice_per_bucket(tmp_path):
    summary, blocks, requests = build_experiment()
    text = write_report(tmp_path / "report0", summary, blocks, requests)["report"].read_text()
    assert "the measured choice per batch bucket" not in text  # no such counters: no table
    share = {"verify_share/b1024/full_steps": 40, "verify_share/b1024/share_steps": 1960,
             "verify_share/b1024/pairs": 75, "verify_share/b1024/share_vs_full_pct": 2.46,
             "verify_share/b1024/full_tok_per_ms": 67.1, "verify_share/b1024/share_tok_per_ms": 93.2,
             "verify_share/b256/full_steps": 30, "verify_share/b256/share_steps": 0, "verify_share/b256/pairs": 0,
             "verify_share/b256/full_tok_per_ms": 20.5, "verify_share/b256/share_tok_per_ms": 0.0}
    summary["counters"] = {**summary.get("counters", {}), "B": {**summary.get("counters", {}).get("B", {}), **share}}
    text = re.sub(r" +", " ", write_report(tmp_path / "report1", summary, blocks, requests)["report"].read_text())
    assert "- arm B, the measured choice per batch bucket (engine.verify_share" in text
    assert "| 256 | 30 | 0 | 0 | - | 20.5 | 0 |" in text and "| 1024 | 40 | 1,960 | 75 | +2.5% | 67.1 | 93.2 |" in text
    assert text.index("| 256 | 30 |") < text.index("| 1024 | 40 |")


LABELLED_ARMS = {
    "A": {"label": "verify_all", "engine": {"spec": "dspark", "verify": "full", "max_num_seqs": 4,
                                            "kernels": {"fused_layers": True, "l2_prefetch": False}}},
    "B": {"label": "ragged", "engine": {"spec": "dspark", "verify": "ragged", "max_num_seqs": 4,
                                        "kernels": {"fused_layers": False, "l2_prefetch": False}},
          "engine_ran": {"dtype": "bfloat16"}},
}


def test_results_table_gives_each_arms_throughput_and_latency_percentiles_with_block_intervals(tmp_path):
    from scipy import stats as sps

    summary, blocks, requests = build_experiment()
    summary = {**summary, "arms": LABELLED_ARMS}
    text = write_report(tmp_path, summary, blocks, requests)["report"].read_text()
    rows = table_rows(text, "## Results per arm")
    assert rows[0] == ["metric", "verify_all (A)", "ragged (B)", "B vs A"]
    names = [r[0] for r in rows[1:]]
    assert names[:2] == ["output tokens/s", "requests/s"]
    for latency in ("TTFT", "TPOT", "ITL", "E2E", "queue wait"):
        assert [f"{latency} p{q}" for q in (50, 90, 99)] == [n for n in names if n.startswith(latency + " ")]
    by_name = {r[0]: r for r in rows[1:]}
    # output tokens/s of A: the geometric mean over A's blocks, its 95% t-interval (on the logs) in brackets.
    a = np.log(blocks.loc[blocks["arm"] == "A", "output_tokens_per_s"].to_numpy())
    low, high = np.exp(sps.t.interval(0.95, a.size - 1, loc=a.mean(), scale=sps.sem(a)))
    assert by_name["output tokens/s"][1] == f"{np.exp(a.mean()):.3g} ({low:.3g} .. {high:.3g})"
    stat = summary["statistics"]["output_tokens_per_s"]
    assert by_name["output tokens/s"][3] == f"{stat['change_pct']:+.1f}%"  # the statistics' own estimator
    assert by_name["TTFT p50"][1].endswith(")") and " ms (" in by_name["TTFT p50"][1]
    # Request i waited 0.05 * i s for a slot: the queue wait is its own row, and TTFT does not contain it.
    assert by_name["queue wait p99"][1].startswith("149 ms")  # p99 of 0, 50, 100, 150 ms
    ttft_p50_a, ttft_p99_a = (float(by_name[f"TTFT p{q}"][1].split()[0]) for q in (50, 99))
    assert 130 < ttft_p50_a <= ttft_p99_a < 150  # ms: 0.1 s + the first chunk, without the wait of up to 150 ms
    # An older run without queue-wait columns has no queue-wait rows.
    older = blocks.drop(columns=[c for c in blocks.columns if c.startswith("queue_wait_s")])
    text = write_report(tmp_path / "older", summary, older, requests)["report"].read_text()
    assert not any(r[0].startswith("queue wait") for r in table_rows(text, "## Results per arm"))


def test_settings_table_shows_only_what_differs_and_the_appendix_everything(tmp_path):
    summary, blocks, requests = build_experiment()
    summary = {**summary, "arms": LABELLED_ARMS}
    paths = write_report(tmp_path, summary, blocks, requests)
    rows = table_rows(paths["report"].read_text(), "## Settings that differ between arms")
    assert rows == [["setting", "verify_all (A)", "ragged (B)"],
                    ["engine.kernels.fused_layers", "true", "false"],
                    ["engine.verify", "full", "ragged"],
                    ["engine_ran.dtype", "-", "bfloat16"]]
    appendix = paths["appendix"].read_text()
    settings = {r[0]: r[1:] for r in table_rows(appendix, "## Arm settings")[1:]}
    assert settings["engine.max_num_seqs"] == ["4", "4"] and settings["engine.spec"] == ["dspark", "dspark"]
    assert "engine.kernels.l2_prefetch" in settings and "label" not in settings
    same = {**summary, "arms": {"A": {"label": "x", "engine": {"verify": "full"}},
                                "B": {"label": "y", "engine": {"verify": "full"}}}}
    text = write_report(tmp_path / "same", same, blocks, requests)["report"].read_text()
    assert "None: the arms ran the same settings (their labels aside)." in text
    assert "## Arms\n" not in text and "allow_foreign" not in text  # no JSON dump of every field


def test_latency_cdfs_are_drawn_per_arm_for_ttft_itl_tpot_e2e_and_queue_wait(tmp_path):
    from dspark.bench.report_plots import latency_samples

    summary, blocks, requests = build_experiment(n_blocks=2)
    requests.to_parquet(tmp_path / "requests.parquet", index=False)
    from_disk = pd.read_parquet(tmp_path / "requests.parquet")  # list columns come back as arrays
    samples = latency_samples(from_disk)
    assert list(samples) == ["ttft_s", "itl", "tpot_s", "e2e_s", "queue_wait_s"]
    assert set(samples["itl"]) == {"A", "B"}
    assert samples["itl"]["A"].size == 2 * 4 * 3  # blocks x requests x gaps between 4 chunks
    assert sorted(set(np.round(samples["queue_wait_s"]["B"], 6))) == [0.0, 0.05, 0.1, 0.15]
    paths = write_report(tmp_path / "report", summary, blocks, from_disk)
    assert paths["latency_cdf_plot"] == tmp_path / "report" / "latency_cdf.png"
    assert paths["latency_cdf_plot"].read_bytes()[:8] == PNG_MAGIC
    assert "![latency CDFs](latency_cdf.png)" in paths["report"].read_text()


def test_counters_and_the_bucket_histogram_live_in_the_appendix(tmp_path):
    summary, blocks, requests = build_experiment()
    many = {f"sched/token_bucket_hist.{b}": 10 * b for b in (8, 16, 32, 64, 128, 256, 512)}
    many |= {f"sched/verify_len_hist.{v}": v for v in range(1, 8)}
    many |= {f"counter_{i}": i for i in range(60)}
    summary = {**summary, "counters": {"A": {"decode_steps": 100, **many},
                                       "B": {"decode_steps": 90, "trimmed_steps": 17}}}
    paths = write_report(tmp_path, summary, blocks, requests)
    text = paths["report"].read_text()
    assert "token_bucket_hist" not in text and "counter_59" not in text
    counters = table_rows(text, "## Engine counters")
    assert [r[0] for r in counters[1:]] == ["decode_steps", "trimmed_steps"]
    assert "All 75 counters per arm" in text and "(report_appendix.md#engine-counters)" in text
    appendix = paths["appendix"].read_text()
    buckets = table_rows(appendix, "## Token buckets histogram")
    assert [r[0] for r in buckets[1:]] == ["8", "16", "32", "64", "128", "256", "512"]  # numeric order
    assert buckets[-1] == ["512", "5,120", "0"]
    assert [r[0] for r in table_rows(appendix, "## Verify lengths histogram")[1:]] == [str(v) for v in range(1, 8)]
    all_counters = {r[0] for r in table_rows(appendix, "## Engine counters")[1:]}
    assert {"decode_steps", "trimmed_steps", "counter_59"} <= all_counters
    assert not any("hist." in c for c in all_counters)
    assert '"hostname": "test-node"' in appendix  # the whole fingerprint


def test_sweep_plot_wraps_long_job_labels_inside_the_image(tmp_path):
    from dspark.bench.report_plots import _tick_label

    label = "ab.arms.B.engine.verify=uniform,load.concurrency=16,+workload=agentic"
    assert _tick_label(label).splitlines() == ["ab.arms.B.engine.verify=uniform,", "load.concurrency=16,",
                                               "+workload=agentic"]  # overrides kept whole, one or more a line
    assert _tick_label("a=1,b=2,c=3") == "a=1, b=2, c=3"
    for job, gain in enumerate((0.0, 0.10)):
        summary, _, _ = build_experiment(gain=gain, seed=job)
        summary["sweep_params"] = {"ab.arms.B.engine.verify": ["uniform", "ragged"][job],
                                   "load.concurrency": 16 * (job + 1), "+workload": ["agentic", "poetry"][job]}
        (tmp_path / str(job)).mkdir()
        (tmp_path / str(job) / "summary.json").write_text(json.dumps(summary))
    paths = write_sweep_report(tmp_path)
    from matplotlib.image import imread

    height = imread(paths["plot"]).shape[0]
    assert height > 4.5 * 110  # the tight bounding box grew to hold the turned, wrapped labels
    markdown = paths["markdown"].read_text()
    assert "- verify=ragged,concurrency=32,workload=poetry: B faster than A by" in markdown


def test_sweep_jobs_are_named_as_their_folders_with_every_override_in_the_csv(tmp_path):
    """The job column holds the short name a job's folder has after its number (runners.sweep_dirs): the name
    the job recorded (sweep_job), or, for a summary without one, its overrides that differ between the jobs;
    the overrides column holds every override of the job, as on the command line."""
    def write(folder: str, params: dict, sweep_job: str | None = None, gain: float = 0.1) -> Path:
        summary, _, _ = build_experiment(gain=gain)
        summary["sweep_params"] = params
        if sweep_job is not None:
            summary["sweep_job"] = sweep_job
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "summary.json").write_text(json.dumps(summary))
        return tmp_path / folder / "summary.json"

    shared = {"ab.n_blocks": "8", "wandb.mode": "disabled"}
    recorded = [write("sweep/0_agentic,concurrency=4", {"+workload": "agentic", "load.concurrency": "4", **shared},
                      "agentic,concurrency=4"),
                write("sweep/1_poetry,concurrency=4", {"+workload": "poetry", "load.concurrency": "4", **shared},
                      "poetry,concurrency=4", gain=0.2)]
    paths = write_sweep_report(tmp_path / "sweep")
    table = pd.read_csv(paths["csv"])
    headline = table[table["is_headline"]].set_index("job")
    assert list(headline.index) == ["agentic,concurrency=4", "poetry,concurrency=4"]
    assert headline.loc["agentic,concurrency=4", "overrides"] == (
        "+workload=agentic load.concurrency=4 ab.n_blocks=8 wandb.mode=disabled")
    markdown = paths["markdown"].read_text()
    assert "| agentic,concurrency=4 " in markdown and "ab.n_blocks=8" not in markdown

    # Summaries without a recorded name: the overrides that differ between them (a key set in one job only
    # among them), named as sweep_dirs names a job's folder.
    older = [write("older/0", {"ab.seed": "0", **shared}), write("older/1", {"ab.seed": "1", **shared}),
             write("older/2", {"ab.seed": "1", "ab.arms.B.engine.verify": "uniform", **shared})]
    assert list(compare_runs(older).drop_duplicates("job")["job"]) == ["seed=0", "seed=1", "seed=1,verify=uniform"]
    # Jobs that would share a name are named by their folders; a summary without overrides by its experiment.
    same = [write("same/a", shared), write("same/b", shared)]
    assert set(compare_runs(same)["job"]) == {"a", "b"}
    assert set(compare_runs([*recorded, older[0]])["job"]) == {"agentic,concurrency=4", "poetry,concurrency=4",
                                                               "seed=0,n_blocks=8,mode=disabled"}
    alone = write("alone/x", {})
    assert set(compare_runs([alone])["job"]) == {"gain0.1"} and set(compare_runs([alone])["overrides"]) == {""}


def interrupted_summary(summary: dict, completed: int, scheduled: int = 16) -> dict:
    """``summary`` as the A/B runner writes it after a SIGINT in the timed blocks: its ``interrupted`` record and
    failing guard; before a block ran in both arms, with no statistics and the runner's verdict for that."""
    record = {"signal": "SIGINT", "phase": "timed blocks", "completed_arm_blocks": completed,
              "scheduled_arm_blocks": scheduled}
    guard = {"name": "interrupted", "passed": False, "details": record,
             "message": f"SIGINT after {completed} of {scheduled} arm-blocks: statistics and guards cover the "
                        "completed blocks only (no greedy replicas, no lossless control)"}
    out = {**summary, "interrupted": record, "guards": [*summary["guards"], guard], "guards_passed": False}
    if completed < 2:
        out |= {"statistics": {}, "verdict": "interrupted before a block ran in both arms"}
    return out


def test_report_of_a_run_interrupted_before_a_block_ran_in_both_arms(tmp_path):
    """No statistics: the report says so in place of the verdict, says it was interrupted, and renders the rest."""
    summary, blocks, _ = build_experiment()
    summary = interrupted_summary(summary, completed=1)
    one_arm = blocks[(blocks["block"] == 0) & (blocks["arm"] == "A")]
    paths = write_report(tmp_path / "one", summary, one_arm, None)
    lines = paths["report"].read_text().splitlines()
    assert lines[2] == ("**No verdict on output_tokens_per_s: no statistics (interrupted before a block ran in both "
                        "arms).**")
    assert lines[4].startswith("**Interrupted: SIGINT after 1 of 16 arm-blocks: statistics and guards cover")
    text = "\n".join(lines)
    assert "## Statistics\n\nNone: interrupted before a block ran in both arms." in text
    assert table_rows(text, "## Guards")[-1][:2] == ["interrupted", "**NO**"]
    assert table_rows(text, "## Results per arm")[0] == ["metric", "A", "B vs A"]  # the one arm's block
    assert "not drawn: per-block plot: blocks of arm A only: no block ran in both arms" in text
    assert "per_block_plot" not in paths and paths["appendix"].is_file()
    # No arm-block completed: the block-based parts say why they are empty.
    text = write_report(tmp_path / "none", interrupted_summary(build_experiment()[0], completed=0), pd.DataFrame(),
                        None)["report"].read_text()
    assert "## Results per arm\n\nNo block completed: the run was interrupted before its first arm-block ended." in text
    assert "not drawn: per-block plot: no block completed" in text
    console = Console(file=io.StringIO(), width=200, record=True)
    render_console_table(summary, console=console)
    out = console.export_text()
    assert "No verdict on output_tokens_per_s: no statistics (interrupted before a block ran in both arms)." in out
    assert "Interrupted: SIGINT after 1 of 16 arm-blocks" in out and "FAILED: interrupted" in out
    # A run that was not interrupted must have statistics on its headline metric.
    with pytest.raises(KeyError, match="has no entry in statistics .* not marked interrupted"):
        write_report(tmp_path / "bad", {**build_experiment()[0], "statistics": {}}, blocks, None)


def test_report_of_an_interrupted_run_with_statistics_says_so_under_the_verdict(tmp_path):
    summary, blocks, requests = build_experiment()
    lines = write_report(tmp_path, interrupted_summary(summary, completed=8), blocks, requests)["report"] \
        .read_text().splitlines()
    assert lines[2].startswith("**Verdict on output_tokens_per_s: B faster than A by ")
    assert lines[4] == ("**Interrupted: SIGINT after 8 of 16 arm-blocks: statistics and guards cover the completed "
                        "blocks only (no greedy replicas, no lossless control); the same command measures the run "
                        "again, keeping this attempt's files in unfinished-<n>/.**")
    assert not any(line.startswith("**Interrupted") for line in
                   write_report(tmp_path / "whole", summary, blocks, requests)["report"].read_text().splitlines())


def test_read_summary_names_the_file_and_why_it_cannot_be_read(tmp_path):
    from dspark.bench.report import UnreadableSummaryError, read_summaries, read_summary

    summary, _, _ = build_experiment()
    cases = {"empty": ("", "the file is empty"), "truncated": (json.dumps(summary)[:80], "not valid JSON, truncated?"),
             "list": ("[]", "it holds a JSON list, not an object")}
    for name, (text, reason) in cases.items():
        (tmp_path / f"{name}.json").write_text(text)
        with pytest.raises(UnreadableSummaryError, match=re.escape(f"{tmp_path / name}.json: {reason}")):
            read_summary(tmp_path / f"{name}.json")
    with pytest.raises(UnreadableSummaryError, match="missing.json"):
        read_summary(tmp_path / "missing.json")
    (tmp_path / "good.json").write_text(json.dumps(summary))
    readable, unreadable = read_summaries(sorted(tmp_path.glob("*.json")))
    assert list(readable) == [tmp_path / "good.json"] and readable[tmp_path / "good.json"] == summary
    assert unreadable[tmp_path / "empty.json"] == "the file is empty" and len(unreadable) == 3


def write_job(folder: Path, gain: float, seed: int = 0) -> Path:
    """A sweep job's folder: summary.json (named by its sweep_job) and blocks.csv."""
    summary, blocks, _ = build_experiment(gain=gain, seed=seed)
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({**summary, "sweep_job": folder.name.split("_", 1)[-1]}))
    blocks.drop(columns="per_position_acceptance").to_csv(folder / "blocks.csv", index=False)
    return folder / "summary.json"


def test_sweep_leaves_out_the_unfinished_attempts_kept_in_a_jobs_folder(tmp_path):
    """runners.ab keeps an unfinished run's files in <run folder>/unfinished-<n>/ before measuring it again, and a
    finished run it replaces in previous-<n>/: such a summary.json is an earlier attempt of a job, not a job. A job
    that failed without results (its job status) is listed and counted."""
    from dspark.bench.report import sweep_summary_paths

    jobs = [write_job(tmp_path / "0_x", 0.0), write_job(tmp_path / "1_y", 0.1, seed=1)]
    write_job(tmp_path / "0_x" / "unfinished-1", 0.2)
    write_job(tmp_path / "1_y" / "unfinished-12", 0.2)
    write_job(tmp_path / "1_y" / "previous-1", 0.2)
    assert sweep_summary_paths(tmp_path) == jobs
    failed = write_sweep_report(tmp_path, failed_jobs={"1_y": "guards failed", "3_w": "ConfigError: bad"})
    text = failed["markdown"].read_text()
    assert "3 job(s)" in text and "- 3_w: **FAIL**, no results: ConfigError: bad" in text
    assert "1_y: **FAIL**" not in text  # (a failed job with results is in the table, marked by its guards)
    assert sweep_summary_paths(tmp_path) == jobs
    paths = write_sweep_report(tmp_path)
    assert "2 job(s)" in paths["markdown"].read_text()
    assert set(pd.read_csv(paths["csv"])["job"]) == {"x", "y"}
    assert set(pd.read_csv(paths["frontier_csv"])["job"]) == {"x", "y"}
    # A folder merely named like one is a job where the name is not exactly unfinished-<n>.
    write_job(tmp_path / "2_unfinished-run", 0.3)
    assert len(sweep_summary_paths(tmp_path)) == 3


def test_sweep_lists_an_unreadable_job_and_reports_the_others(tmp_path):
    from dspark.bench.report import UnreadableSummaryError

    write_job(tmp_path / "0_x", 0.0)
    write_job(tmp_path / "1_y", 0.1, seed=1)
    (tmp_path / "2_z").mkdir()
    (tmp_path / "2_z" / "summary.json").write_text('{"experiment": "gain0.2", "statis')
    paths = write_sweep_report(tmp_path)
    text = paths["markdown"].read_text()
    assert "3 job(s)" in text
    assert f"- `{tmp_path / '2_z' / 'summary.json'}`: unreadable: not valid JSON, truncated?" in text
    assert set(pd.read_csv(paths["csv"])["job"]) == {"x", "y"} and paths["plot"].is_file()
    # A job interrupted before a block ran in both arms is listed too; with no job readable there is no summary.
    summary, _, _ = build_experiment()
    (tmp_path / "1_y" / "summary.json").write_text(json.dumps(interrupted_summary({**summary, "sweep_job": "y"}, 1)))
    assert "- y: no statistics (interrupted before a block ran in both arms)" in \
        write_sweep_report(tmp_path)["markdown"].read_text()
    (tmp_path / "0_x" / "summary.json").write_text(json.dumps(interrupted_summary({**summary, "sweep_job": "x"}, 0)))
    paths = write_sweep_report(tmp_path)  # no job with statistics: the jobs are listed, the tables are empty
    assert "- x: no statistics (interrupted before a block ran in both arms)" in paths["markdown"].read_text()
    assert pd.read_csv(paths["csv"]).empty and paths["plot"].is_file()
    for job in ("0_x", "1_y"):
        (tmp_path / job / "summary.json").write_text("")
    with pytest.raises(UnreadableSummaryError, match="no job's summary.json can be read .*0_x/summary.json: the file "
                                                     "is empty"):
        write_sweep_report(tmp_path)
