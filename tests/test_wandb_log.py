"""W&B logging of runners.ab, read back from what an offline run leaves for `wandb sync`: the group, run
names, tags, notes, config, summary statistics, the statistics table and the results artifact; the
WANDB_MODE precedence; the W&B report (built from mocks: there is no network here) and its command line."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict

import runners.ab as ab
import runners.wandb_report as wandb_report_cli
from dspark.bench import wandb_log, wandb_report
from dspark.bench.wandb_log import STATISTICS_COLUMNS, WandbLogger
from dspark.bench.wandb_names import ABRunNames, ab_run_names, results_artifact_name
from dspark.config import ConfigError
from test_ab_runner import TINY, tiny_factory
from test_configs import compose_ab

# ---- reading an offline run ---------------------------------------------------------------------------
# A .wandb file is wandb's transaction log: a 7-byte header (":W&B", magic, version), then LevelDB-log
# records (4-byte checksum, 2-byte length, 1-byte kind: 1 full, 2 first, 3 middle, 4 last) in 32 KiB
# blocks, each a serialized wandb.proto Record. wandb ships no Python reader for it any more, so the
# tests read it here to check exactly what `wandb sync` would upload.
BLOCK_BYTES = 32 * 1024
HEADER_BYTES = 7


def wandb_records(path: Path):
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, pending = HEADER_BYTES, b""
    while pos + HEADER_BYTES <= len(data):
        left_in_block = BLOCK_BYTES - pos % BLOCK_BYTES
        if left_in_block < HEADER_BYTES:
            pos += left_in_block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER_BYTES])
        if kind == 0 and length == 0:  # zero padding up to the next block
            pos += left_in_block
            continue
        chunk = data[pos + HEADER_BYTES:pos + HEADER_BYTES + length]
        pos += HEADER_BYTES + length
        if kind == 1:
            yield wandb_internal_pb2.Record.FromString(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield wandb_internal_pb2.Record.FromString(pending + chunk)


def offline_run(run_dir: Path) -> dict:
    """The run record, config, final summary (values logged nested under "a/b" keys) and artifacts of an offline run."""
    (log_file,) = Path(run_dir).glob("*.wandb")
    out = {"run": None, "config": {}, "summary": {}, "artifacts": [], "history": []}
    for record in wandb_records(log_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
            out["config"] = {item.key: json.loads(item.value_json) for item in record.run.config.update}
        elif kind == "summary":
            for item in record.summary.update:
                out["summary"]["/".join(item.nested_key) or item.key] = json.loads(item.value_json)
        elif kind == "artifact":
            out["artifacts"].append(record.artifact)
        elif kind == "history":  # one committed row: its step and the keys logged in it
            out["history"].append({"step": record.history.step.num,
                                   "keys": sorted("/".join(i.nested_key) or i.key for i in record.history.item)})
    return out


# ---- an offline A/B on the tiny models ----------------------------------------------------------------
OVERRIDES = [*TINY, "wandb.mode=offline", "wandb.tags=[nightly,tiny]", "wandb.notes=a tiny check",
             "wandb.report=true", "+ab.arms.B.engine.max_num_batched_tokens=1024"]


@pytest.fixture(scope="module")
def offline_ab(tmp_path_factory):
    """(output folder, summary) of one A/B on the tiny models, logged to W&B offline."""
    out = tmp_path_factory.mktemp("wandb_ab") / "2026-01-01_12-00-00"
    data_dir, previous = tmp_path_factory.mktemp("wandb_data"), os.environ.get("WANDB_DATA_DIR")
    os.environ["WANDB_DATA_DIR"] = str(data_dir)  # the artifact's staged copies, until `wandb sync`
    try:
        summary = ab.run(compose_ab(OVERRIDES, out_dir=out), engine_factory=tiny_factory())
    finally:
        if previous is None:
            os.environ.pop("WANDB_DATA_DIR", None)
        else:
            os.environ["WANDB_DATA_DIR"] = previous
    return out, summary


def test_one_group_per_job_and_run_names_that_say_arm_setting_and_job(offline_ab):
    out, summary = offline_ab
    w = summary["wandb"]
    assert w["group"] == "spec_off_vs_dspark_full/2026-01-01_12-00-00"
    # Labels follow what the arms run: B's override shows beside its configured label.
    assert w["run_names"] == {"A": "A target_only (max_num_batched_tokens=2048, spec=off) [2026-01-01_12-00-00]",
                              "B": "B dspark_full (max_num_batched_tokens=1024, spec=dspark) [2026-01-01_12-00-00]"}
    assert not w["failures"] and w["stopped"] is None
    for arm, run_dir in w["run_dirs"].items():
        run = offline_run(Path(run_dir))
        assert run["run"].run_group == w["group"] and run["run"].display_name == w["run_names"][arm]
        assert run["run"].job_type == f"{arm} {run['config']['arm_label']}"
        assert list(run["run"].tags) == ["nightly", "tiny", "spec_off_vs_dspark_full"] == w["tags"]
        assert run["run"].notes == "a tiny check" and run["run"].project == "dspark-bench"
        assert run["config"]["arm"] == arm and run["config"]["job"] == "2026-01-01_12-00-00"
        assert run["config"]["sweep"] is None and run["config"]["wandb"]["tags"] == ["nightly", "tiny"]


def test_offline_runs_sit_in_the_run_folders_wandb_folder_not_a_nested_one(offline_ab):
    out, summary = offline_ab
    run_dirs = [Path(d) for d in summary["wandb"]["run_dirs"].values()]
    assert sorted(p.parent for p in run_dirs) == [out / "wandb"] * 2
    assert all(p.name.startswith("offline-run-") for p in run_dirs)
    assert not (out / "wandb" / "wandb").exists()
    assert summary["wandb"]["sync_command"] == "wandb sync " + " ".join(sorted(map(str, run_dirs)))


def test_statistics_and_verdict_are_in_both_runs_summaries_and_a_table(offline_ab):
    out, summary = offline_ab
    headline = summary["statistics"]["output_tokens_per_s"]
    for arm, run_dir in summary["wandb"]["run_dirs"].items():
        logged = offline_run(Path(run_dir))["summary"]
        assert logged["verdict"] == summary["verdict"] and logged["headline_metric"] == "output_tokens_per_s"
        assert logged["guards_passed"] is True and "counter/drafted_tokens" in logged
        for metric, stat in summary["statistics"].items():
            for field in ("change_pct", "ci_low_pct", "ci_high_pct", "wilcoxon_p", "mde_pct", "verdict", "n_blocks"):
                assert logged["statistics"][metric][field] == stat[field], (arm, metric, field)
        assert logged["statistics_table/_type"] == "table-file"
        assert logged["statistics_table/nrows"] == len(summary["statistics"]) == 3  # tokens/s, at full load, requests/s
        (table_file,) = Path(run_dir).rglob("statistics_table_*.table.json")
        table = json.loads(table_file.read_text())
        assert table["columns"] == list(STATISTICS_COLUMNS)
        row = dict(zip(table["columns"], next(r for r in table["data"] if r[0] == "output_tokens_per_s")))
        assert row["change_pct"] == pytest.approx(headline["change_pct"]) and row["verdict"] == headline["verdict"]


def test_the_history_holds_one_row_per_block_and_the_tables_in_the_last(offline_ab):
    out, summary = offline_ab
    for run_dir in summary["wandb"]["run_dirs"].values():
        rows = offline_run(Path(run_dir))["history"]
        steps = [r["step"] for r in rows]
        assert steps == list(range(len(summary["schedule"]) // 2)), steps  # two schedule entries per block
        assert all("block" in r["keys"] for r in rows)  # no row without a block
        tables = {k.split("/")[0] for k in rows[-1]["keys"]} & {"requests", "statistics_table"}
        assert tables == {"requests", "statistics_table"}, rows[-1]["keys"]


def test_summary_report_and_plots_are_an_artifact_of_both_runs(offline_ab):
    out, summary = offline_ab
    for run_dir in summary["wandb"]["run_dirs"].values():
        (artifact,) = [a for a in offline_run(Path(run_dir))["artifacts"] if a.type == "ab-results"]
        assert artifact.name == results_artifact_name(summary["wandb"]["group"])
        assert artifact.name == "ab-results-spec_off_vs_dspark_full-2026-01-01_12-00-00"
        files = {entry.path: entry for entry in artifact.manifest.contents}
        pngs, markdown = [p.name for p in out.glob("*.png")], [p.name for p in out.glob("report*.md")]
        assert pngs and "report.md" in markdown
        assert set(files) == {"summary.json", "blocks.csv", *markdown, *pngs}
        assert all(entry.size == (out / name).stat().st_size for name, entry in files.items() if name != "summary.json")


def test_report_requested_offline_says_why_and_how_to_make_it_after_sync(offline_ab):
    out, summary = offline_ab
    command = "python -m runners.wandb_report dspark-bench spec_off_vs_dspark_full/2026-01-01_12-00-00"
    report = summary["wandb"]["report"]
    assert report["url"] is None and "the runs are offline" in report["reason"] and "wandb sync" in report["reason"]
    assert report["command"] == command == summary["wandb"]["report_command"]
    # summary.json on disk is rewritten with what W&B did after it was first written.
    assert json.loads((out / "summary.json").read_text())["wandb"]["report"] == report


# ---- groups of multirun jobs ----------------------------------------------------------------------------
def test_every_sweep_job_gets_its_own_group(tmp_path):
    arms = {"A": ("verify_all", {"verify": "full"}), "B": ("ragged", {"verify": "ragged"})}
    groups = {ab_run_names("exp", tmp_path / "x", arms, sweep_dir=f"/m/{sweep}", job_num=job).group
              for sweep in ("2026-01-01_00-00-00", "2026-01-02_00-00-00") for job in (0, 1)}
    assert groups == {"exp/2026-01-01_00-00-00/job0", "exp/2026-01-01_00-00-00/job1",
                      "exp/2026-01-02_00-00-00/job0", "exp/2026-01-02_00-00-00/job1"}
    names = ab_run_names("exp", tmp_path / "x", arms, sweep_dir="/m/s1", job_num=3)
    assert names.run_name("B") == "B ragged (verify=ragged) [job3]"
    assert names.tags(["mine"]) == ["mine", "exp", "sweep:s1"]
    assert names.run_config("A") == {"arm": "A", "arm_label": "verify_all (verify=full)", "job": "job3",
                                     "sweep": "s1"}


def test_hydra_multirun_job_names_its_sweep_and_job_number(tmp_path):
    cfg = compose_ab(["+workload=agentic"], hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.job.num = 7
        cfg.hydra.sweep.dir = str(tmp_path / "multirun" / "2026-01-03_09-00-00")
    hydra_config = HydraConfig.instance()
    previous = hydra_config.cfg
    try:
        hydra_config.set_config(cfg)
        assert ab._hydra_job() == {"sweep_dir": str(tmp_path / "multirun" / "2026-01-03_09-00-00"), "job_num": 7}
        single = compose_ab(["+workload=agentic"], hydra_config=True)
        with open_dict(single):
            single.hydra.mode = RunMode.RUN
        hydra_config.set_config(single)
        assert ab._hydra_job() == {}
    finally:
        hydra_config.cfg = previous
    assert ab._hydra_job() == {}  # run() called directly


def test_labels_show_an_override_that_contradicts_the_configured_label():
    cfg = compose_ab(["+workload=agentic", "ab.arms.B.engine.verify=uniform", "+tiers=ladder_135"])
    arm_cfgs = ab.arm_engine_configs(cfg)
    names = ab_run_names(cfg.experiment, "/out/2026-01-01_00-00-00",
                         {arm: (cfg.ab.arms[arm].label, ab.vars_of(arm_cfgs[arm])) for arm in ("A", "B")})
    assert names.label("B") == "ragged (verify=uniform, tiers=[1,3,5])"
    assert names.label("A") == "verify_all (verify=full, tiers=null)"
    same = ab_run_names("e", "/out/r", {"A": ("x", {"spec": "dspark"}), "B": ("y", {"spec": "dspark"})})
    assert same.label("B") == "y (same engine settings as the other arm)"
    many = ab_run_names("e", "/out/r", {"A": ("x", {k: 0 for k in "abcde"}), "B": ("y", {k: 1 for k in "abcde"})})
    assert many.label("B") == "y (a=1, b=1, c=1, +2 more)"


@pytest.mark.slow
def test_multirun_jobs_log_to_separate_groups(guard_sweep):
    """A real Hydra multirun (two jobs in one process, offline W&B from WANDB_MODE): each job's runs in its own
    group, named by job. The sweep is tests/conftest.py's guard_sweep (workload.temperature=0.0,0.7), shared with
    tests/test_hydra_conventions.py: its second job fails its lossless guard by design, which fails that job (the
    multirun exits 1) after its results and runs are written."""
    sweep, proc = guard_sweep
    logged = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "1 job(s) of the sweep failed" in logged, logged[-3000:]
    assert "1_temperature=0.7: guards failed: lossless" in logged  # the designed failure, and no other
    seen = {}
    for job in sorted(p.parent for p in sweep.glob("*/summary.json")):
        w = json.loads((job / "summary.json").read_text())["wandb"]
        num = job.name.split("_")[0]
        assert w["mode"] == "offline" and w["group"] == f"spec_off_vs_dspark_full/sweep/job{num}"
        for arm, run_dir in w["run_dirs"].items():
            run = offline_run(Path(run_dir))["run"]
            assert run.run_group == w["group"] and run.display_name.endswith(f"[job{num}]")
            assert "sweep:sweep" in run.tags and not (job / "wandb" / "wandb").exists()
            seen[(num, arm)] = run.run_group
    assert sorted(seen) == [("0", "A"), ("0", "B"), ("1", "A"), ("1", "B")] and len(set(seen.values())) == 2


# ---- WANDB_MODE ------------------------------------------------------------------------------------------
def test_wandb_mode_precedence_command_line_then_environment_then_offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert compose_ab(["+workload=agentic"]).wandb.mode == "disabled"
    assert compose_ab(["+workload=agentic", "wandb.mode=offline"]).wandb.mode == "offline"
    monkeypatch.setenv("WANDB_MODE", "online")
    assert compose_ab(["+workload=agentic", "wandb.mode=disabled"]).wandb.mode == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    assert compose_ab(["+workload=agentic"]).wandb.mode == "offline"
    monkeypatch.setenv("WANDB_MODE", "cloud")
    with pytest.raises(ConfigError, match="wandb.mode: 'cloud'.*WANDB_MODE environment variable, here 'cloud'"):
        ab.check_config(compose_ab(["+workload=agentic"]))


def test_wandb_mode_from_the_environment_reaches_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    overrides = [o for o in TINY if not o.startswith("wandb.mode=")]
    summary = ab.run(compose_ab(overrides, out_dir=tmp_path / "run"), engine_factory=tiny_factory())
    assert summary["wandb"]["mode"] == "disabled" and not (tmp_path / "run" / "wandb").exists()


def test_the_config_keys_are_the_loggers_arguments():
    cfg = compose_ab(["+workload=agentic", "wandb.mode=disabled", "wandb.entity=team", "wandb.tags=[a]",
                      "wandb.notes=n", "wandb.report=true"])
    logger = WandbLogger(**OmegaConf.to_container(cfg.wandb, resolve=True))
    assert (logger.mode, logger.entity, logger.tags, logger.notes) == ("disabled", "team", ["a"], "n")
    assert logger.report is True
    logger.close()
    assert "W&B is disabled" in logger.status()["report"]["reason"]


# ---- API key lookup (wandb's own) ------------------------------------------------------------------------
def test_api_key_is_found_the_way_wandb_finds_it(tmp_path, monkeypatch):
    from wandb.sdk import wandb_setup
    from urllib.parse import urlparse

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert wandb_log._has_api_key() is False
    host = urlparse(wandb_setup.singleton().settings.base_url).hostname
    (tmp_path / "netrc").write_text(f"machine {host}\n  login user\n  password {'b' * 40}\n")
    assert wandb_log._has_api_key() is True
    (tmp_path / "netrc").unlink()
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    assert wandb_log._has_api_key() is True


# ---- the W&B report -------------------------------------------------------------------------------------
STATS = {"output_tokens_per_s": {"change_pct": 12.5, "ci_low_pct": 8.0, "ci_high_pct": 17.25, "ci_level": 0.95,
                                 "ci_method": "bca", "wilcoxon_p": 0.0039, "mde_pct": 3.1, "n_blocks": 8,
                                 "verdict": "faster", "verdict_reason": "CI excludes 0 and p < 0.05"},
         "requests_per_s": {"change_pct": 0.4, "ci_low_pct": None, "ci_high_pct": None, "wilcoxon_p": None,
                            "mde_pct": None, "n_blocks": 8, "verdict": "no detectable difference"}}
GROUP = "exp/2026-01-01_00-00-00/job2"


class FakeRun:
    def __init__(self, name, arm):
        self.name, self.config, self.url = name, {"arm": arm}, f"https://wandb.test/runs/{arm}"
        self.summary_metrics = {"statistics": STATS, "verdict": "faster", "headline_metric": "output_tokens_per_s"}


class FakeApi:
    """wandb.Api's surface the report uses; ``fail`` makes every server call raise as offline."""

    default_entity = "team"

    def __init__(self, runs=(), fail: Exception | None = None):
        self._runs, self.fail, self.queries = list(runs), fail, []

    def runs(self, path, filters=None):
        if self.fail is not None:
            raise self.fail
        self.queries.append((path, filters))
        return self._runs


def test_report_construction_from_the_groups_runs():
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    runs = [wandb_report.GroupRun("B dspark [job2]", "B", "https://wandb.test/B", FakeRun("b", "B").summary_metrics),
            wandb_report.GroupRun("A off [job2]", "A", "https://wandb.test/A", FakeRun("a", "A").summary_metrics)]
    report = wandb_report.build_report(wr, expr, "team", "dspark-bench", GROUP, runs)
    assert (report.entity, report.project, report.title) == ("team", "dspark-bench", f"A/B {GROUP}")
    texts = [getattr(b, "text", "") for b in report.blocks]
    assert "**Verdict on output_tokens_per_s: faster.** B vs A +12.50%, Wilcoxon p = 0.0039, 8 blocks." in texts[1]
    table = next(t for t in texts if isinstance(t, str) and t.startswith("| metric |"))
    assert "| output_tokens_per_s | +12.50% | +8.00 .. +17.25% (95% bca) | 0.0039 | 3.10% | faster |" in table
    assert "| requests_per_s | +0.40% | n/a | n/a | n/a | no detectable difference |" in table
    assert next(t for t in texts if isinstance(t, str) and t.startswith("- arm A")).splitlines() == [
        "- arm A: [A off [job2]](https://wandb.test/A)", "- arm B: [B dspark [job2]](https://wandb.test/B)"]
    (grid,) = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    (runset,) = grid.runsets
    assert runset.filters == f"Metric(\"Group\") == '{GROUP}'" and runset.project == "dspark-bench"
    kinds = [type(p).__name__ for p in grid.panels]
    assert kinds.count("LinePlot") == 5 and {"BarPlot", "WeavePanelSummaryTable", "RunComparer"} <= set(kinds)
    assert grid.panels[0].y == ["output_tokens_per_s"]
    (table_panel,) = [p for p in grid.panels if isinstance(p, wr.WeavePanelSummaryTable)]
    assert table_panel.table_name == "statistics_table"
    (files,) = [b for b in report.blocks if isinstance(b, wr.WeaveBlockArtifactVersionedFile)]
    assert (files.artifact, files.file) == (results_artifact_name(GROUP), "report.md")


def test_publish_report_saves_it_and_returns_its_url(monkeypatch):
    import wandb_workspaces.reports.v2 as wr

    saved = []
    monkeypatch.setattr(wandb_log, "_has_api_key", lambda: True)
    monkeypatch.setattr(wr.Report, "save", lambda self, **kw: saved.append(self) or self)
    monkeypatch.setattr(wr.Report, "url", property(lambda self: f"https://wandb.test/{self.entity}/reports/1"))
    api = FakeApi([FakeRun("A x [job2]", "A"), FakeRun("B y [job2]", "B")])
    assert wandb_report.publish_report("dspark-bench", GROUP, api=api) == "https://wandb.test/team/reports/1"
    assert api.queries == [("team/dspark-bench", {"group": GROUP})]  # the API key's default entity
    assert [r.title for r in saved] == [f"A/B {GROUP}"]


def test_publish_report_explains_what_is_missing_instead_of_crashing(monkeypatch):
    monkeypatch.setattr(wandb_log, "_has_api_key", lambda: False)
    with pytest.raises(wandb_report.ReportUnavailable, match="no W&B API key.*wandb login"):
        wandb_report.publish_report("p", GROUP, api=FakeApi())
    monkeypatch.setattr(wandb_log, "_has_api_key", lambda: True)
    offline = FakeApi(fail=ConnectionError("Failed to resolve 'api.wandb.ai'"))
    with pytest.raises(wandb_report.ReportUnavailable, match=r"could not read the W&B group .* from the W&B server "
                                                              r"\(ConnectionError: Failed to resolve .*wandb sync"):
        wandb_report.publish_report("p", GROUP, entity="team", api=offline)
    with pytest.raises(wandb_report.ReportUnavailable, match="has no runs: offline runs must be uploaded first"):
        wandb_report.publish_report("p", GROUP, entity="team", api=FakeApi([]))
    monkeypatch.setattr(wandb_report.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(wandb_report.ReportUnavailable, match="pip install wandb-workspaces"):
        wandb_report.publish_report("p", GROUP, api=FakeApi())


def test_report_command_line(tmp_path, monkeypatch, capsys):
    calls = []

    def publish(project, group, entity=None):
        calls.append((entity, project, group))
        if project == "offline-project":
            raise wandb_report.ReportUnavailable("could not read the W&B group (no network)")
        return "https://wandb.test/r"

    monkeypatch.setattr(wandb_report_cli, "publish_report", publish)
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"wandb": {"mode": "offline", "project": "p", "entity": None,
                                                            "group": GROUP}}))
    assert wandb_report_cli.main([str(run)]) == 0 and "W&B report: https://wandb.test/r" in capsys.readouterr().out
    assert wandb_report_cli.main(["team/p", GROUP]) == 0
    assert wandb_report_cli.main(["offline-project", GROUP]) == 1
    assert "W&B report not made: could not read the W&B group (no network)" in capsys.readouterr().err
    assert calls == [(None, "p", GROUP), ("team", "p", GROUP), (None, "offline-project", GROUP)]
    (run / "summary.json").write_text(json.dumps({"wandb": {"mode": "disabled", "project": "p", "group": None}}))
    with pytest.raises(SystemExit) as exc:
        wandb_report_cli.main([str(run)])
    assert exc.value.code == 2 and "names no W&B group" in capsys.readouterr().err


class FakeOnlineRun:
    def __init__(self, folder, name):
        self.dir, self.url = str(folder / name / "files"), f"https://wandb.test/{name}"
        self.entity, self.summary = "me", {}

    def log(self, row, step=None):
        pass

    def finish(self, exit_code=None, quiet=None):
        pass


class FakeOnlineWandb:
    def __init__(self, folder):
        self.folder = folder

    def init(self, **kwargs):
        return FakeOnlineRun(self.folder, kwargs["name"])

    def teardown(self):
        pass


def test_online_runs_get_their_report_when_they_end(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(wandb_log, "_has_api_key", lambda: True)
    monkeypatch.setattr(wandb_report, "publish_report",
                        lambda project, group, entity=None: made.append((entity, project, group)) or "https://r")
    names = ABRunNames("exp", "job2", "s", {"A": "a (x=0)", "B": "b (x=1)"})
    logger = WandbLogger(mode="online", project="p", report=True, names=names, dir=tmp_path)
    logger._wandb = FakeOnlineWandb(tmp_path)
    for arm in ("A", "B"):
        logger.start_arm(arm, config={})
    for arm in ("A", "B"):
        logger.finish_arm(arm, {})
    logger.close()
    assert made == [("me", "p", "exp/s/job2")]  # the entity the runs were logged to
    status = logger.status()
    assert status["report"] == {"url": "https://r", "reason": None,
                                "command": "python -m runners.wandb_report me/p exp/s/job2"}
    assert status["run_urls"] == {"A": "https://wandb.test/A a (x=0) [job2]",
                                  "B": "https://wandb.test/B b (x=1) [job2]"}
