"""runners.report on folders written by a tiny end-to-end A/B: a run folder is re-rendered
identically, a sweep folder is summarized, anything else is refused by name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import runners.ab as ab
import runners.report as report
from test_ab_runner import TINY, tiny_factory
from test_configs import ROOT, compose_ab

RENDERED = ("report.md", "report_appendix.md", "per_block.png", "latency_cdf.png", "acceptance.png")


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("report_run")
    ab.run(compose_ab(TINY, out_dir=out), engine_factory=tiny_factory())
    return out


def test_run_folder_report_is_rerendered_identically(run_folder, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(run_folder, folder)
    original = (folder / "report.md").read_text()
    for name in RENDERED:
        (folder / name).unlink()
    assert report.main([str(folder)]) == 0
    for name in RENDERED:
        assert (folder / name).is_file(), name
    # Same text: the blocks.parquet round trip (per-position acceptance lists included) loses nothing.
    assert (folder / "report.md").read_text() == original
    out = capsys.readouterr().out
    assert "output_tokens_per_s" in out and "guards: 5/5 passed" in out
    assert "W&B report skipped" in out and "disabled" in out


def test_run_folder_without_requests_table_still_reports(run_folder, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(run_folder, folder)
    (folder / "requests.parquet").unlink()
    (folder / "latency_cdf.png").unlink()
    assert report.main([str(folder), "--no-wandb-report"]) == 0
    out = capsys.readouterr().out
    assert "requests.parquet is missing" in out and "--no-wandb-report" in out
    assert not (folder / "latency_cdf.png").exists()
    assert "not drawn: latency CDFs" in (folder / "report.md").read_text()


def test_run_folder_of_an_older_run_with_json_list_cells_renders_the_same_report(run_folder, tmp_path):
    """Runs before list columns went to parquet wrote blocks.csv with per-position acceptance as JSON text and
    requests.parquet with JSON-text lists; their report reads them back as lists."""
    folder = tmp_path / "run"
    shutil.copytree(run_folder, folder)
    original = (folder / "report.md").read_text()
    blocks = pd.read_parquet(folder / "blocks.parquet")
    blocks["per_position_acceptance"] = blocks["per_position_acceptance"].map(lambda v: json.dumps(list(v)))
    blocks.to_csv(folder / "blocks.csv", index=False)
    (folder / "blocks.parquet").unlink()
    requests = pd.read_parquet(folder / "requests.parquet")
    for column in ("output_token_ids", "chunk_times_s", "accept_lengths", "verify_lengths", "per_position_accepts",
                   "per_position_reached"):
        requests[column] = requests[column].map(lambda v: json.dumps([x.item() for x in v]))
    requests.to_parquet(folder / "requests.parquet", index=False)
    assert report.main([str(folder), "--no-wandb-report"]) == 0
    assert (folder / "report.md").read_text() == original
    read = report.read_requests(folder / "requests.parquet")
    assert isinstance(read.loc[0, "chunk_times_s"], list) and len(read.loc[0, "chunk_times_s"]) > 0


def test_sweep_folder_gets_summary_files_and_table(run_folder, tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for job, seed in ((0, "0"), (1, "1")):
        dest = sweep / f"{job}_ab.seed={seed}"
        shutil.copytree(run_folder, dest)
        summary = json.loads((dest / "summary.json").read_text())
        summary["sweep_params"] = {"ab.seed": seed}
        (dest / "summary.json").write_text(json.dumps(summary))
    assert report.main([str(sweep)]) == 0
    for name in ("sweep_summary.md", "sweep_summary.csv", "sweep_gain.png"):
        assert (sweep / name).is_file(), name
    table = pd.read_csv(sweep / "sweep_summary.csv")
    headline = table[table["is_headline"]]
    assert set(headline["job"]) == {"seed=0", "seed=1"}  # what the sweep varies, as the job folders are named
    assert set(headline["overrides"]) == {"ab.seed=0", "ab.seed=1"}  # every override of the job
    out = capsys.readouterr().out
    assert "seed=0" in out and "seed=1" in out and "sweep_summary.md" in out
    assert "2 job(s)" in (sweep / "sweep_summary.md").read_text()
    # The throughput against per-user speed frontier: one point per (job, arm), from each job's blocks.
    frontier = pd.read_csv(sweep / "sweep_frontier.csv")
    assert len(frontier) == 4 and set(frontier["job"]) == {"seed=0", "seed=1"}
    assert (frontier["tokens_per_s"] > 0).all() and (frontier["per_user_tokens_per_s"] > 0).all()
    assert (sweep / "sweep_frontier.png").is_file()
    assert "Throughput against per-user speed" in (sweep / "sweep_summary.md").read_text()


@pytest.mark.parametrize("limit_ms,attained", [(1e6, 1.0), (1e-6, 0.0)])
def test_goodput_at_a_service_level(tmp_path, limit_ms, attained):
    """With load.sla_ttft_ms / sla_tpot_ms every block reports goodput and the share of requests within the
    limits; the statistics compare goodput between the arms and the report states the service level."""
    out = tmp_path / "run"
    summary = ab.run(compose_ab([*TINY, f"load.sla_ttft_ms={limit_ms}", f"load.sla_tpot_ms={limit_ms}"],
                                out_dir=out), engine_factory=tiny_factory())
    blocks = pd.read_csv(out / "blocks.csv")
    assert (blocks["sla_attainment"] == attained).all()
    if attained:
        assert (blocks["goodput_tokens_per_s"] == blocks["output_tokens_per_s"]).all()
        assert {"goodput_tokens_per_s", "goodput_requests_per_s"} <= set(summary["statistics"])
        assert summary["statistics_left_out"] == {}
    else:
        assert (blocks["goodput_tokens_per_s"] == 0).all()
        # no goodput to compare: said so in the summary and the report, not silently dropped
        assert not {"goodput_tokens_per_s", "goodput_requests_per_s"} & set(summary["statistics"])
        why = summary["statistics_left_out"]["goodput_tokens_per_s"]
        assert why.startswith(f"{len(blocks)} of {len(blocks)} arm-blocks at 0 or unmeasured")
        assert f"- goodput_tokens_per_s: not compared ({why})." in (out / "report.md").read_text()
    assert summary["sla"] == {"ttft_ms": limit_ms, "tpot_ms": limit_ms}
    text = (out / "report.md").read_text()
    assert "requests within the SLA" in text and f"TTFT <= {limit_ms:g} ms and TPOT <= {limit_ms:g} ms" in text


def test_service_level_must_be_positive(tmp_path):
    from dspark.config import ConfigError

    with pytest.raises(ConfigError, match="load.sla_tpot_ms"):
        ab.check_config(compose_ab([*TINY, "load.sla_tpot_ms=0"], out_dir=tmp_path))


def test_folder_with_neither_is_refused(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("nothing here")
    with pytest.raises(SystemExit) as info:
        report.main([str(tmp_path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "holds neither an A/B run" in err and "notes.txt" in err
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "missing")])
    assert "is not a folder" in capsys.readouterr().err


def test_run_folder_without_blocks_is_refused(run_folder, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(run_folder, folder)
    (folder / "blocks.csv").unlink()
    assert report.main([str(folder), "--no-wandb-report"]) == 0  # blocks.parquet is enough
    (folder / "blocks.parquet").unlink()
    with pytest.raises(SystemExit):
        report.main([str(folder)])
    assert "blocks.csv is missing (and blocks.parquet too)" in capsys.readouterr().err


def test_wandb_report_needs_online_runs_the_package_and_a_key(monkeypatch):
    assert "not online" in report.wandb_report_blocker([{"wandb": {"mode": "offline"}}])
    assert "not recorded" in report.wandb_report_blocker([{}])
    online = [{"wandb": {"mode": "online", "project": "p"}}]
    monkeypatch.setattr(report.importlib.util, "find_spec", lambda name: None)
    assert "wandb-workspaces is not installed" in report.wandb_report_blocker(online)
    monkeypatch.setattr(report.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr("dspark.bench.wandb_log._has_api_key", lambda: False)
    assert "no W&B API key" in report.wandb_report_blocker(online)


def test_cli_entry_point(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "runners.report", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "holds neither" in proc.stderr


def interrupted_run_folder(folder, completed: int, scheduled: int = 16):
    """A run folder as the A/B runner leaves it after a SIGINT in the timed blocks, built by hand (no model):
    summary.json marked interrupted (no statistics before a block ran in both arms) and blocks.parquet with
    the ``completed`` arm-blocks (none: no per-block table)."""
    from test_bench_report import build_experiment

    summary, blocks, _ = build_experiment()
    record = {"signal": "SIGINT", "phase": ab.TIMED_BLOCKS, "completed_arm_blocks": completed,
              "scheduled_arm_blocks": scheduled}
    summary |= {"interrupted": record, "guards": [*summary["guards"], ab.interrupted_guard(record).to_dict()],
                "guards_passed": False}
    if completed < 2:
        summary |= {"statistics": {}, "verdict": "interrupted before a block ran in both arms"}
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    if completed:
        blocks.head(completed).to_parquet(folder / "blocks.parquet", index=False)
    return folder


@pytest.mark.parametrize("completed", [1, 0])
def test_run_interrupted_before_a_block_ran_in_both_arms_is_reported(tmp_path, capsys, completed):
    folder = interrupted_run_folder(tmp_path / "run", completed)
    assert report.main([str(folder), "--no-wandb-report"]) == 0
    lines = (folder / "report.md").read_text().splitlines()
    assert lines[2] == ("**No verdict on output_tokens_per_s: no statistics (interrupted before a block ran in both "
                        "arms).**")
    assert lines[4].startswith(f"**Interrupted: SIGINT after {completed} of 16 arm-blocks: ")
    out = capsys.readouterr().out
    assert "No verdict on output_tokens_per_s: no statistics" in out and "FAILED: interrupted" in out
    if not completed:  # no per-block table: the report leaves out its per-block parts and says why
        assert "blocks.csv is missing (and blocks.parquet too): the run was interrupted before an arm-block" in out
        assert "No block completed: the run was interrupted" in (folder / "report.md").read_text()
    # W&B: the summary without statistics is no obstacle either.
    assert report.main([str(folder)]) == 0
    assert "W&B report skipped" in capsys.readouterr().out


def test_run_without_statistics_that_was_not_interrupted_is_refused(tmp_path, capsys):
    folder = interrupted_run_folder(tmp_path / "run", completed=1)
    summary = json.loads((folder / "summary.json").read_text())
    del summary["interrupted"]
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(SystemExit) as info:
        report.main([str(folder), "--no-wandb-report"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"{folder / 'summary.json'}: headline_metric 'output_tokens_per_s' has no entry in statistics" in err
    assert "not marked interrupted" in err and "Traceback" not in err


@pytest.mark.parametrize("text,reason", [("", "the file is empty"), ('{"experiment": "ab", "stat', "not valid JSON")])
def test_run_with_an_unreadable_summary_is_refused_by_name(tmp_path, capsys, text, reason):
    folder = interrupted_run_folder(tmp_path / "run", completed=4)
    (folder / "summary.json").write_text(text)
    with pytest.raises(SystemExit) as info:
        report.main([str(folder)])
    assert info.value.code == 2
    assert f"cannot read A/B summary {folder / 'summary.json'}: {reason}" in capsys.readouterr().err


def sweep_job(folder, job: str):
    """A sweep job's folder built by hand: an interrupted run with statistics, named by its sweep_job."""
    interrupted_run_folder(folder, completed=4)
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "sweep_job": job}))
    return folder


def test_sweep_with_an_unreadable_job_reports_the_others_and_names_it(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep_job(sweep / "0_x", "x")
    sweep_job(sweep / "1_y", "y")
    bad = sweep_job(sweep / "2_z", "z") / "summary.json"
    bad.write_text(bad.read_text()[:50])
    assert report.main([str(sweep)]) == 0  # the W&B report's summaries leave it out as well
    assert set(pd.read_csv(sweep / "sweep_summary.csv")["job"]) == {"x", "y"}
    assert f"- `{bad}`: unreadable: not valid JSON, truncated?" in (sweep / "sweep_summary.md").read_text()
    out = capsys.readouterr().out
    assert f"{bad}: left out, unreadable: not valid JSON" in out and "W&B report skipped" in out
    for job in ("0_x", "1_y"):
        (sweep / job / "summary.json").write_text("")
    with pytest.raises(SystemExit) as info:
        report.main([str(sweep), "--no-wandb-report"])
    assert info.value.code == 2
    assert "no job's summary.json can be read" in capsys.readouterr().err


def test_unfinished_attempts_are_not_sweep_jobs_and_leave_a_run_folder_a_run(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep_job(sweep / "0_x", "x")
    sweep_job(sweep / "1_y", "y")
    sweep_job(sweep / "0_x" / "unfinished-1", "x")  # the attempt runners.ab kept before measuring x again
    assert report.folder_kind(sweep / "0_x") == "run"
    assert report.main([str(sweep), "--no-wandb-report"]) == 0
    assert "2 job(s)" in (sweep / "sweep_summary.md").read_text()
    assert list(pd.read_csv(sweep / "sweep_summary.csv").drop_duplicates("job")["job"]) == ["x", "y"]
    assert len(report.render_sweep(sweep, report.Console())[1]) == 2
    # A folder whose only summary.json is a kept attempt (the rerun was killed before writing its own) is neither.
    (sweep / "0_x" / "summary.json").unlink()
    with pytest.raises(SystemExit):
        report.main([str(sweep / "0_x")])
    err = capsys.readouterr().err
    assert "outside unfinished-<n>/ and previous-<n>/ folders" in err
    assert "killed before it could (SIGKILL, a crash)" in err


def test_a_sweep_report_reads_each_summary_once(tmp_path, monkeypatch):
    """runners.report reads every job's summary.json one time for the sweep's tables, plot, console table and
    W&B report (a sweep of many long runs has large summaries)."""
    import dspark.bench.report as bench_report

    sweep = tmp_path / "sweep"
    sweep_job(sweep / "0_x", "x")
    sweep_job(sweep / "1_y", "y")
    reads = []
    real = bench_report.read_summary

    def counting(path):
        reads.append(Path(path).parent.name)
        return real(path)

    monkeypatch.setattr(bench_report, "read_summary", counting)
    assert report.main([str(sweep)]) == 0  # the W&B report's check runs on the same summaries
    assert sorted(reads) == ["0_x", "1_y"]
