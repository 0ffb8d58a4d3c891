"""runners.ab end to end on the tiny random models: outputs, guards, crash handling, custom
workloads, schedule order, rerun skipping, and a submitit multirun (subprocess, slow)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

import runners.ab as ab
from dspark.bench.guards import ABGuardError
from dspark.engine import Engine
from test_configs import ROOT, compose_ab
from tiny import tiny_drafter, tiny_target

TINY = ["ab=spec_off_vs_dspark", "+workload=agentic", "workload.num_prompts=2", "workload.max_tokens=6", "ab.n_blocks=2",
        "ab.warmup_requests=1", "ab.n_boot=200", "load.concurrency=2", "wandb.mode=disabled",
        "engine.plan_min_rows=0"]  # two rows: the planner runs there only below the default engine.plan_min_rows


class FakeTokenizer:
    """Characters -> ids 3..96 of the tiny 97-token vocabulary (1 bos, 2 eos); keeps the last 32 characters."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1] + [3 + ord(c) % 94 for c in text[-32:]]

    def encode_chat(self, messages, add_generation_prompt: bool = True) -> list[int]:
        return self.encode("".join(f"[{m['role']}]{m['content']}" for m in messages) + "[assistant]")

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(32 + (i - 3) % 94) for i in ids if i > 2)


# At scale 1 the tiny target's residual stream dominates and it repeats its last input token;
# at scale 4 its greedy outputs vary, so the lossless comparisons mean something.
TARGET_SCALE = 4.0


def tiny_factory(b_target_seed: int | None = None, b_spec: str | None = None, calls: list | None = None):
    """Engines on tests/tiny.py models. ``b_target_seed``: arm B gets another target (changes its
    outputs); ``b_spec``: arm B runs this spec whatever its config says."""

    def factory(cfg, arm_cfgs):
        if calls is not None:
            calls.append(dict(arm_cfgs))
        target = tiny_target(seed=0, scale=TARGET_SCALE)
        drafter = tiny_drafter(target, seed=1)
        engines = {}
        for arm in ("A", "B"):
            ecfg, tgt = arm_cfgs[arm], target
            if arm == "B" and b_target_seed is not None:
                tgt = tiny_target(seed=b_target_seed, scale=TARGET_SCALE)
            if arm == "B" and b_spec is not None:
                ecfg = replace(ecfg, spec=b_spec)
            engines[arm] = Engine(tgt, FakeTokenizer(), ecfg, drafter if ecfg.spec == "dspark" else None)
        return engines

    return factory


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One full A/B on the tiny models with offline W&B: (output folder, summary)."""
    out = tmp_path_factory.mktemp("ab_run")
    cfg = compose_ab([*TINY, "wandb.mode=offline"], out_dir=out)
    return out, ab.run(cfg, engine_factory=tiny_factory())


def test_end_to_end_writes_every_output_and_guards_pass(tiny_run):
    out, summary = tiny_run
    for name in ("requests.parquet", "blocks.csv", "blocks.parquet", "summary.json", "report.md", "report_appendix.md",
                 "per_block.png", "latency_cdf.png", "acceptance.png"):
        assert (out / name).is_file(), name
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["verdict"] == summary["verdict"] and on_disk["config_hash"] == summary["config_hash"]
    assert summary["guards_passed"] is True
    names = [g["name"] for g in summary["guards"]]
    assert names == ["errors", "lossless/block0", "lossless/block1", "did_nothing[A]", "did_nothing[B]"]
    assert summary["counters"]["B"]["drafted_tokens"] > 0 and summary["counters"]["A"]["drafted_tokens"] == 0
    requests = pd.read_parquet(out / "requests.parquet")
    assert len(requests) == 2 * 2 * 2  # prompts x arms x blocks
    outputs = [list(t) for t in requests["output_token_ids"]]  # a list column
    assert len({t for out_ids in outputs for t in out_ids}) > 3  # real outputs, not one repeated token
    assert set(requests["arm"]) == {"A", "B"} and requests["error"].isna().all()
    # Every request's finish reason; at most 6 new tokens (workload.max_tokens=6), cut requests say "length".
    assert set(requests["finish_reason"]) <= {"stop", "length"}
    cut = requests[requests["finish_reason"] == "length"]
    assert len(cut) > 0 and (cut["output_tokens"] == 6).all()
    assert (requests.loc[requests["finish_reason"] == "stop", "output_tokens"] <= 6).all()
    assert summary["finish_reasons"] == {arm: requests[requests["arm"] == arm]["finish_reason"].value_counts().to_dict()
                                         for arm in ("A", "B")}
    assert summary["truncated"] == {arm: {"max_tokens": int((cut["arm"] == arm).sum()), "max_model_len": 0}
                                    for arm in ("A", "B")}
    assert summary["verdict_note"] is None  # spec off vs DSpark: no trimming arm
    # What each arm ran: its models (built in memory here: architecture, no checkpoint), in the appendix too.
    models = {arm: summary["arms"][arm]["models"] for arm in ("A", "B")}
    assert models["A"]["drafter"] is None and models["B"]["drafter"]["arch"] == "block4-L1-r8-vanilla"
    assert models["A"]["target"] == models["B"]["target"] == {"arch": "llama-h64-L4-V97", "dtype": "float32",
                                                              "origin": None}
    assert "models.drafter.arch" in (out / "report_appendix.md").read_text()
    # Each chunk's token count adds up to the output; the full-load throughput is measured and compared.
    assert all(sum(c) == n for c, n in zip(requests["chunk_tokens"], requests["output_tokens"]))
    blocks = pd.read_csv(out / "blocks.csv")
    assert (blocks["steady_output_tokens_per_s"] > 0).all() and (blocks["steady_share"] <= 1).all()
    assert "steady_output_tokens_per_s" in summary["statistics"]
    report = (out / "report.md").read_text()
    assert "At full load, the blocks' drains left out" in report and "output tokens/s at full load" in report
    assert "Verdict on output_tokens_per_s" in report and "lossless/block1" in report
    assert f"Truncated outputs (finish_reason length): A {summary['truncated']['A']['max_tokens']}/4" in report
    # W&B offline: one run folder per arm; its run log (what `wandb sync` uploads) holds the final summary.
    assert summary["wandb"]["mode"] == "offline" and sorted(summary["wandb"]["run_dirs"]) == ["A", "B"]
    assert not summary["wandb"]["failures"]
    for arm, run_dir in summary["wandb"]["run_dirs"].items():
        run_dir = Path(run_dir)
        assert run_dir.is_dir() and out in run_dir.parents and run_dir.name.startswith("offline-run-")
        (log_file,) = run_dir.glob("*.wandb")
        data = log_file.read_bytes()
        for needle in ("verdict", json.dumps(summary["verdict"]), "guards_passed", "counter/drafted_tokens",
                       "truncated/max_tokens",
                       "output_tokens_per_s", summary["arms"][arm]["label"]):
            assert needle.encode() in data, (arm, needle)
        # The per-request table (requests.parquet's columns, finish_reason included) is logged beside it.
        tables = list(run_dir.rglob("requests_*.table.json"))
        assert tables and all('"finish_reason"' in t.read_text() for t in tables), tables


def test_blocks_csv_order_is_the_abba_schedule_that_ran(tiny_run):
    out, summary = tiny_run
    blocks = pd.read_csv(out / "blocks.csv")
    ran = list(zip(blocks["block"], blocks["arm"]))
    assert ran == [(0, "A"), (0, "B"), (1, "B"), (1, "A")]
    assert [tuple(x) for x in summary["schedule"]] == ran
    assert list(blocks["first_arm"]) == ["A", "A", "B", "B"]
    assert "per_position_acceptance" not in blocks  # list columns live in blocks.parquet
    with_lists = pd.read_parquet(out / "blocks.parquet")
    assert list(zip(with_lists["block"], with_lists["arm"])) == ran
    acceptance = with_lists.loc[with_lists["arm"] == "B", "per_position_acceptance"].iloc[0]
    assert len(acceptance) == 4  # the tiny drafter's block size


def test_rerun_returns_finished_summary_unless_forced(tmp_path, caplog):
    out = tmp_path / "run"  # a run of its own (the reruns below move its files)
    cfg = compose_ab([*TINY, "wandb.mode=offline"], out_dir=out)
    ab.run(cfg, engine_factory=tiny_factory())
    calls: list = []
    with caplog.at_level("INFO", logger="runners.ab"):
        again = ab.run(cfg, engine_factory=tiny_factory(calls=calls))
    assert calls == [] and again == json.loads((out / "summary.json").read_text())
    assert "already holds a finished run" in caplog.text

    class Measured(Exception):
        pass

    def must_run(cfg, arm_cfgs):
        raise Measured

    with pytest.raises(Measured):  # force_rerun does not change the hash, but measures again
        ab.run(compose_ab([*TINY, "wandb.mode=offline", "ab.force_rerun=true"], out_dir=out), engine_factory=must_run)
    # The finished run it replaces is kept, not overwritten.
    assert json.loads((out / "previous-1" / "summary.json").read_text()) == again
    assert not (out / "summary.json").exists() and (out / "previous-1" / "report.md").is_file()
    shutil.copy(out / "previous-1" / "summary.json", out / "summary.json")
    with pytest.raises(Measured):  # another config in the same folder is measured, not skipped
        ab.run(compose_ab([*TINY, "wandb.mode=offline", "ab.seed=1"], out_dir=out), engine_factory=must_run)
    assert (out / "previous-2" / "summary.json").is_file()


def test_lossless_guard_fires_after_results_are_written(tmp_path):
    cfg = compose_ab([*TINY, "workload.num_prompts=1", "ab.warmup_requests=0"], out_dir=tmp_path)
    with pytest.raises(ABGuardError, match="lossless/block0"):
        ab.run(cfg, engine_factory=tiny_factory(b_target_seed=7))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["guards_passed"] is False
    failed = {g["name"] for g in summary["guards"] if not g["passed"]}
    assert failed == {"lossless/block0", "lossless/block1"}
    assert (tmp_path / "report.md").is_file() and "**NO**" in (tmp_path / "report.md").read_text()
    # A rerun finds the finished run: the guard still fails it, unless guards are only reported.
    with pytest.raises(ABGuardError, match="lossless/block0"):
        ab.run(cfg, engine_factory=tiny_factory(calls=(calls := [])))
    relaxed = compose_ab([*TINY, "workload.num_prompts=1", "ab.warmup_requests=0", "ab.fail_on_guard=false"],
                         out_dir=tmp_path)
    assert ab.run(relaxed, engine_factory=tiny_factory(calls=calls)) == summary
    assert calls == []


def test_did_nothing_guard_fires_when_b_never_drafted(tmp_path):
    cfg = compose_ab([*TINY, "workload.num_prompts=1", "ab.warmup_requests=0"], out_dir=tmp_path)
    with pytest.raises(ABGuardError, match=r"did_nothing\[B\].*drafted_tokens == 0"):
        ab.run(cfg, engine_factory=tiny_factory(b_spec="off"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    by_name = {g["name"]: g["passed"] for g in summary["guards"]}
    assert by_name["did_nothing[B]"] is False and by_name["did_nothing[A]"] is True
    assert by_name["lossless/block0"] is True  # same target, both target-only: identical outputs
    assert summary["arms"]["B"]["engine_ran"] == {"spec": "off"}  # the mismatch is recorded next to the result


def test_arm_crash_keeps_finished_blocks_and_raises_arm_failed(tmp_path, monkeypatch):
    real_drive = ab.drive
    count = {"n": 0}

    def flaky(*args, **kwargs):  # the third arm-block's load generator raises, as a device fault would
        count["n"] += 1
        if count["n"] == 3:
            raise RuntimeError("simulated device fault")
        return real_drive(*args, **kwargs)

    monkeypatch.setattr(ab, "drive", flaky)
    cfg = compose_ab([*TINY, "workload.num_prompts=1", "ab.warmup_requests=0"], out_dir=tmp_path)
    with pytest.raises(ab.ArmFailed) as info:
        ab.run(cfg, engine_factory=tiny_factory())
    message = str(info.value)
    assert "arm B failed in block 1" in message and "simulated device fault" in message
    assert "2 finished arm-blocks" in message and str(tmp_path / "blocks.csv") in message
    blocks = pd.read_csv(tmp_path / "blocks.csv")
    assert list(zip(blocks["block"], blocks["arm"])) == [(0, "A"), (0, "B")]
    assert not (tmp_path / "summary.json").exists()


def test_custom_workload_from_a_new_jsonl(tmp_path):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in [
        {"id": "q1", "prompt": "Name three rivers of Europe."},
        {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
         "max_tokens": 4},
    ]) + "\n")
    cfg = compose_ab(["ab=spec_off_vs_dspark", "+workload=custom", f"workload.path={prompts}", "workload.max_tokens=6", "ab.n_blocks=2",
                      "ab.warmup_requests=0", "ab.n_boot=200", "wandb.mode=disabled"], out_dir=tmp_path / "run")
    summary = ab.run(cfg, engine_factory=tiny_factory())
    assert summary["guards_passed"] is True
    assert summary["workload"]["name"] == "custom" and summary["workload"]["num_selected"] == 2
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert set(requests["request_id"]) == {"custom/q1", "custom/line2"}
    capped = requests[requests["request_id"] == "custom/line2"]["output_tokens"]
    assert (capped <= 4).all()  # the per-line max_tokens was applied


@pytest.mark.slow
def test_a_sweep_job_with_a_setting_it_cannot_run_fails_alone(tmp_path):
    """A sweep over workloads whose workload keys are one-value sweeps (the form a swept group's keys need), and a
    swept value a job cannot run with (load.concurrency=0): that job records the ConfigError in its job status, the
    other runs and is summarized, and the multirun exits 1."""
    sweep = tmp_path / "sweep"
    env = {**os.environ, "PYTHONPATH": str(ROOT), ab.TINY_MODELS_ENV: "1", "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "runners.ab", "-m", "ab=spec_off_vs_dspark", "+workload=arena_hard",
           "workload.num_prompts=choice(2)", "workload.max_tokens=choice(4)", "ab.n_blocks=2", "ab.warmup_requests=0",
           "ab.n_boot=200", "wandb.mode=disabled", "progress=false", "load.concurrency=0,2", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    failed, passed = sorted(p for p in sweep.iterdir() if p.is_dir())
    status = json.loads((failed / "job_status.json").read_text())
    assert status["exit_code"] == 1 and status["error"].startswith("ConfigError: load.concurrency")
    assert not (failed / "summary.json").exists() and json.loads((passed / "summary.json").read_text())["guards_passed"]
    summary_md = (sweep / "sweep_summary.md").read_text()
    assert "2 job(s)" in summary_md and f"- {failed.name}: **FAIL**, no results: ConfigError: load.concurrency" \
        in summary_md and "Traceback" not in proc.stderr


def test_engine_factory_must_return_both_arms(tmp_path):
    cfg = compose_ab([*TINY], out_dir=tmp_path)
    with pytest.raises(TypeError, match="'A': Engine, 'B': Engine"):
        ab.run(cfg, engine_factory=lambda cfg, arm_cfgs: {"A": None})


@pytest.mark.slow
def test_submitit_local_multirun_writes_jobs_and_sweep_summary(tmp_path):
    sweep = tmp_path / "sweep"
    env = {**os.environ, "PYTHONPATH": str(ROOT), ab.TINY_MODELS_ENV: "1", "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "runners.ab", "-m", "hydra/launcher=local", "ab=spec_off_vs_dspark", "+workload=agentic",
           "workload.num_prompts=1", "workload.max_tokens=4", "ab.n_blocks=2", "ab.warmup_requests=0",
           "ab.n_boot=200", "wandb.mode=disabled", "progress=false", "ab.seed=0,1", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = sorted(p.parent for p in sweep.glob("*/summary.json"))
    assert [j.name.split("_")[0] for j in jobs] == ["0", "1"]
    seeds = set()
    for job in jobs:
        summary = json.loads((job / "summary.json").read_text())
        assert summary["guards_passed"] and "tiny_engine_factory" in summary["engine_factory"]
        seeds.add(summary["sweep_params"]["ab.seed"])
        assert job.name == f"{job.name.split('_')[0]}_{summary['sweep_job']}"  # the folder's name after its number
    assert seeds == {"0", "1"}
    sweep_md = (sweep / "sweep_summary.md").read_text()
    assert "2 job(s)" in sweep_md and (sweep / "sweep_summary.csv").is_file() and (sweep / "sweep_gain.png").is_file()
    table = pd.read_csv(sweep / "sweep_summary.csv")
    headline = table[table["is_headline"]].set_index("job")
    assert set(headline.index) == {"seed=0", "seed=1"} and "| seed=1 " in sweep_md
    assert "ab.n_blocks=2" in headline.loc["seed=1", "overrides"] and "ab.seed=1" in headline.loc["seed=1", "overrides"]

    # The same sweep again: both jobs are finished, so both are skipped, and the summary is rewritten.
    (sweep / "sweep_summary.md").unlink()
    before = {j: (j / "summary.json").stat().st_mtime_ns for j in jobs}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {j: (j / "summary.json").stat().st_mtime_ns for j in jobs} == before
    for job in jobs:
        assert "already holds a finished run" in (job / "ab.log").read_text()
    assert (sweep / "sweep_summary.md").is_file()


def test_default_arms_trim_with_a_table_and_guards_pass(tmp_path):
    """The default A/B (verify-all vs ragged): arm B really trims when its cost table makes trimming pay."""
    from test_engine_scheduling import steep_table

    target = tiny_target(seed=0, scale=TARGET_SCALE)
    drafter = tiny_drafter(target, seed=1)
    probe = Engine(target, FakeTokenizer(), replace(ab.arm_engine_configs(compose_ab(
        [o for o in TINY if not o.startswith("ab=")], out_dir=tmp_path))["B"], cost_table=None), drafter)
    table = steep_table(probe, tmp_path / "steep.json")
    overrides = [o for o in TINY if not o.startswith("ab=")] + [f"+ab.arms.B.engine.cost_table={table}"]
    cfg = compose_ab(overrides, out_dir=tmp_path / "run")
    summary = ab.run(cfg, engine_factory=tiny_factory())
    assert summary["arms"]["B"]["label"] == "ragged"
    assert summary["counters"]["B"]["trimmed_steps"] > 0
    assert summary["guards_passed"], summary["guards"]
    assert summary["cost_tables"]["B"]["how"] == "configured"
    # The summary names the table: its path, its fingerprint digest and its fit (none: a hand-made table).
    from dspark.cost_table import CostTable, fingerprint_digest

    named = json.loads((tmp_path / "run" / "summary.json").read_text())["cost_tables"]["B"]
    assert named["path"] == str(table) and named["fit"] is None
    assert named["fingerprint"] == fingerprint_digest(CostTable.load(table).fingerprint)
    # The verify-all arm is priced with the same table: its oracle bound is in the counters.
    assert summary["cost_tables"]["A"]["how"] == "shared for the oracle bound"
    assert any(k.startswith("oracle/") for k in summary["counters"]["A"]), sorted(summary["counters"]["A"])


def test_forced_trim_arm_verifies_a_fixed_share_of_every_step_and_its_guard_reads_the_force(tmp_path):
    """ab=full_vs_forced_trim: B verifies three quarters of every step's drafted cells (no planner), stays
    lossless, and its did_nothing guard checks the forced trims instead of a planner's decisions."""
    from test_engine_scheduling import steep_table

    target = tiny_target(seed=0, scale=TARGET_SCALE)
    drafter = tiny_drafter(target, seed=1)
    base = [o for o in TINY if not o.startswith("ab=")] + ["ab=full_vs_forced_trim"]
    arm_b = ab.arm_engine_configs(compose_ab(base, out_dir=tmp_path))["B"]
    assert arm_b.force_budget_frac == 0.75 and arm_b.verify == "ragged"
    probe = Engine(target, FakeTokenizer(), replace(arm_b, cost_table=None, force_budget_frac=None), drafter)
    table = steep_table(probe, tmp_path / "steep.json")
    summary = ab.run(compose_ab([*base, f"+ab.arms.B.engine.cost_table={table}"], out_dir=tmp_path / "run"),
                     engine_factory=tiny_factory())
    assert summary["arms"]["B"]["label"] == "forced_trim" and summary["guards_passed"], summary["guards"]
    c = summary["counters"]["B"]
    assert c["trimmed_steps"] == c["decode_steps"] > 0 and c["sched/plan_reason.forced"] == c["decode_steps"]
    assert 0.0 < c["trim_ratio"] <= 0.3 and summary["counters"]["A"]["trimmed_steps"] == 0
    guard = {g["name"]: g for g in summary["guards"]}["did_nothing[B]"]
    assert "forced trim" in guard["message"]


def test_verify_share_arm_runs_without_a_planner_and_passes_its_guards(tmp_path):
    """ab=full_vs_verify_share on the tiny models: B's steps are the measured choice's (the share or the whole
    block), none the planner's, outputs match A's, and every guard passes."""
    from test_engine_scheduling import steep_table

    target = tiny_target(seed=0, scale=TARGET_SCALE)
    drafter = tiny_drafter(target, seed=1)
    base = [o for o in TINY if not o.startswith("ab=")] + ["ab=full_vs_verify_share", "workload.max_tokens=24"]
    arm_b = ab.arm_engine_configs(compose_ab(base, out_dir=tmp_path))["B"]
    assert arm_b.verify_share == 0.75 and arm_b.min_verify_len == 0
    probe = Engine(target, FakeTokenizer(), replace(arm_b, cost_table=None, verify_share=None), drafter)
    table = steep_table(probe, tmp_path / "steep.json")
    summary = ab.run(compose_ab([*base, f"+ab.arms.B.engine.cost_table={table}"], out_dir=tmp_path / "run"),
                     engine_factory=tiny_factory())
    assert summary["arms"]["B"]["label"] == "verify_share" and summary["guards_passed"], summary["guards"]
    reasons = {k.split(".", 1)[1] for k, v in summary["counters"]["B"].items()
               if k.startswith("sched/plan_reason.") and v}
    # which kind the timed blocks ran depends on the rates the warm-up measured (the choice is kept across blocks)
    assert reasons and reasons <= {"verify_share", "share_choice_full_block"}
    assert any(k.startswith("verify_share/b") for k in summary["counters"]["B"])


def test_target_vs_scheduled_runs_every_safeguard_and_passes_its_guards(tmp_path):
    """ab=target_vs_scheduled with draft-free steps added to B (engine.draft_free_steps): target-only against
    DSpark with ragged verification priced at the service step (engine.service_cost); B makes both choices, its
    outputs are target-only's (greedy, fp32) and every guard passes, did_nothing[B] naming both features."""
    from test_engine_scheduling import steep_table

    target = tiny_target(seed=0, scale=TARGET_SCALE)
    drafter = tiny_drafter(target, seed=1)
    args = ["ab=target_vs_scheduled" if o.startswith("ab=") else o for o in TINY] + ["+ab.arms.B.engine.draft_free_steps=true"]
    probe = Engine(target, FakeTokenizer(), replace(ab.arm_engine_configs(compose_ab(args, out_dir=tmp_path))["B"],
                                                    cost_table=None), drafter)
    table = steep_table(probe, tmp_path / "steep.json")
    summary = ab.run(compose_ab([*args, f"+ab.arms.B.engine.cost_table={table}", "workload.max_tokens=24"],
                                out_dir=tmp_path / "run"), engine_factory=tiny_factory())
    assert summary["guards_passed"], summary["guards"]
    b = summary["counters"]["B"]
    assert any(k.startswith("draft_free/b") for k in b)
    message = next(g["message"] for g in summary["guards"] if g["name"] == "did_nothing[B]")
    if b["draft_free_steps"] == b["decode_steps"]:
        # Drafting measured slower on this CPU in the warm-up: every timed step ran draft-free, which the guard
        # and the verdict say in words (the tiny models make either outcome possible on a given machine).
        assert "draft-free" in message and "target-only" in summary["verdict_note"]
    else:
        assert b["service_cost/extra_steps"] > 0 and "draft_free" in message and "service_cost" in message


def test_b_declining_every_step_passes_and_the_verdict_says_it_was_the_same_work(tmp_path):
    """The default A/B where trimming is predicted not to pay (engine.min_predicted_gain out of reach): B's
    planner prices every step and declines it, did_nothing[B] passes saying so, and the verdict, the report
    and the console say A and B ran the same work; the statistics stay."""
    import io

    from rich.console import Console
    from test_engine_scheduling import steep_table

    from dspark.bench.report import render_console_table

    target = tiny_target(seed=0, scale=TARGET_SCALE)
    drafter = tiny_drafter(target, seed=1)
    probe = Engine(target, FakeTokenizer(), replace(ab.arm_engine_configs(compose_ab(
        [o for o in TINY if not o.startswith("ab=")], out_dir=tmp_path))["B"], cost_table=None), drafter)
    table = steep_table(probe, tmp_path / "steep.json")
    overrides = [o for o in TINY if not o.startswith("ab=")] + [f"+ab.arms.B.engine.cost_table={table}",
                                                                "+ab.arms.B.engine.min_predicted_gain=1000"]
    summary = ab.run(compose_ab(overrides, out_dir=tmp_path / "run"), engine_factory=tiny_factory())
    assert summary["counters"]["B"]["trimmed_steps"] == 0
    guard = next(g for g in summary["guards"] if g["name"] == "did_nothing[B]")
    assert summary["guards_passed"] and guard["passed"], guard["message"]
    reasons = guard["details"]["plan_reasons"]
    assert guard["details"]["declined_all"] is True and reasons.get("declined_below_min_gain", 0) > 0
    assert set(reasons) <= {"declined_below_min_gain", "declined_mixed_step"}
    assert guard["message"].startswith(f"B declined all {sum(reasons.values())} steps: predicted gain below "
                                       "engine.min_predicted_gain at this batch depth on this node")
    note = ("B declined every step (planner predicted no gain): A and B ran the same work; the measured "
            "difference is noise, not an effect of trimming")
    assert summary["verdict_note"] == note
    assert summary["verdict"] == summary["statistics"]["output_tokens_per_s"]["verdict"]  # the statistics stay
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"**{note}.**" in report and "## Planner" in report and "(cost_table.png)" in report
    assert (tmp_path / "run" / "cost_table.png").is_file()
    # The table's predictions against the steps B's planner priced (the engine's sched/ counters), in the report.
    health = summary["prediction_health"]
    assert set(health) == {"B"} and health["B"]["tokens_realised_over_predicted"] > 0
    assert health["B"]["step_ms_measured_over_predicted"] > 0
    assert "arm B, the cost table's predictions against its planned steps: tokens per step" in report
    console = Console(file=io.StringIO(), width=200, record=True)
    render_console_table(summary, console=console)
    out = console.export_text()
    assert f"Verdict: {note}." in out
    assert "Planner B (ragged): " in out and "declined_below_min_gain" in out and "trimmed steps 0" in out
    assert "Truncated outputs (finish_reason length): A " in out


def test_timing_health_flags_captures_and_a_slow_first_block():
    from runners.ab import timing_health

    rows = [{"block": b, "arm": arm, "output_tokens_per_s": v, "counter/graphs_captured": g}
            for b, arm, v, g in [(0, "A", 80.0, 3), (0, "B", 100.0, 0), (1, "B", 101.0, 0), (1, "A", 100.0, 0),
                                 (2, "A", 101.0, 0), (2, "B", 99.0, 0)]]
    h = timing_health(rows, 0.05, {"A": {"graphs": 10, "seconds": 1.0}})
    assert h["captured_in_timed_blocks"] == [{"block": 0, "arm": "A", "graphs": 3}]
    assert h["first_block_vs_median"] == {"A": 0.8, "B": 1.0}
    assert len(h["flags"]) == 2 and "captured inside the timed block" in h["flags"][0]
    assert "warm-up leak" in h["flags"][1]
    clean = timing_health([r | {"counter/graphs_captured": 0, "output_tokens_per_s": 100.0} for r in rows], 0.05, {})
    assert clean["flags"] == []


def test_timing_health_flags_a_block_that_compiled_kernels():
    from runners.ab import timing_health

    rows = [{"block": 0, "arm": "A", "output_tokens_per_s": 100.0, "compile/triton_kernels": 2,
             "compile/kernel_names": "_paged_attention_kernel"},
            {"block": 0, "arm": "B", "output_tokens_per_s": 100.0, "compile/triton_kernels": 0}]
    h = timing_health(rows, 0.05, {})
    assert h["compiled_in_timed_blocks"] == [{"block": 0, "arm": "A", "kernels": 2, "names": "_paged_attention_kernel"}]
    assert h["flags"] == ["block 0 arm A: 2 Triton kernel(s) compiled inside the timed block (_paged_attention_kernel)"]


def test_triton_compiles_are_counted_while_entered_and_the_old_hook_comes_back(monkeypatch):
    """Triton calls its post-compile hook once per kernel it compiles (no compiler on this CPU: the
    hook is called as Triton calls it)."""
    from triton import knobs

    from dspark.bench.compiles import TritonCompiles

    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda *a, **kw: seen.append(kw["repr"]))
    with TritonCompiles() as c:
        assert c.available
        for name in ("k1", "k2", "k1"):
            knobs.runtime.jit_post_compile_hook(key=None, repr=name, fn=None, compile={}, is_manual_warmup=False,
                                                already_compiled=False)
        assert c.take() == {"compiled": 3, "kernels": ["k1", "k2"]}
        assert c.take() == {"compiled": 0, "kernels": []}
    assert seen == ["k1", "k2", "k1"]  # the hook that was there before still ran, and is back
    knobs.runtime.jit_post_compile_hook(key=None, repr="k3", fn=None, compile={}, is_manual_warmup=False,
                                        already_compiled=False)
    assert seen[-1] == "k3" and c.take()["compiled"] == 0


@pytest.mark.parametrize("override,words", [
    ("engine.verify=bogus", ["engine.verify", "'bogus'"]),
    ("engine.spec=bogus", ["engine.spec", "'bogus'"]),
    ("engine.verify=uniform", ["engine.verify='uniform' has no effect", "ab.arms.B.engine.verify=uniform"]),
])
def test_arm_settings_silently_ignored_are_refused(tmp_path, override, words):
    """A base engine value that every arm overrides, or that is invalid, is refused before any model
    loads instead of running with the arms' values (full_vs_ragged: both arms set verify)."""
    from dspark.config import ConfigError
    from runners.ab import check_config

    args = ["ab=full_vs_ragged" if a.startswith("ab=") else a for a in TINY]
    cfg = compose_ab([*args, override], out_dir=tmp_path)
    with pytest.raises(ConfigError) as info:
        check_config(cfg)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


@pytest.mark.parametrize("replicas,fail_on_guard,warned", [(0, True, True), (0, False, True), (1, True, False)])
def test_a_sampled_run_with_nothing_greedy_is_warned_of_before_it_runs(tmp_path, caplog, replicas, fail_on_guard,
                                                                        warned):
    """A sampled workload without greedy replicas compares no output, so its lossless guard fails after every block
    has run; the config check says so first, with the fix, before any model loads."""
    from runners.ab import check_config

    cfg = compose_ab([*TINY, "workload.temperature=0.7", f"workload.greedy_replica_count={replicas}",
                      f"ab.fail_on_guard={str(fail_on_guard).lower()}"], out_dir=tmp_path)
    with caplog.at_level("WARNING", logger="runners.ab"):
        check_config(cfg)
    said = [r.getMessage() for r in caplog.records if "compares nothing" in r.getMessage()]
    assert bool(said) == warned, caplog.text
    if warned:
        assert "workload.greedy_replica_count=1" in said[0] and "temperature=0.7" in said[0]
        assert ("the run exits 1" in said[0]) == fail_on_guard
    caplog.clear()
    with caplog.at_level("WARNING", logger="runners.ab"):  # a greedy workload compares every block
        check_config(compose_ab([*TINY, "workload.temperature=0", "workload.greedy_replica_count=0"],
                                out_dir=tmp_path / "greedy"))
    assert "compares nothing" not in caplog.text


@pytest.mark.parametrize("ab", sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "ab").glob("*.yaml")))
@pytest.mark.parametrize("engine", ["cpu", "h200_graphs"])
def test_every_shipped_ab_config_passes_the_config_check(tmp_path, ab, engine, monkeypatch):
    """Each conf/ab/*.yaml runs as shipped on each engine group: the check refuses only values moved off
    the engine's defaults that no arm uses, not a default every arm overrides (head_vs_max_prob: verify).
    in_process_vs_served launches its server with the run's engine group (${hydra:runtime.choices.engine}):
    the Hydra config is set for it as in a real run, and the launch command carries the group. (The GPU
    groups' device is taken as present: the check that one is runs first and is tested on its own.)"""
    from hydra.core.hydra_config import HydraConfig

    import runners.schema
    from runners.ab import check_config

    monkeypatch.setattr(runners.schema, "check_device_present", lambda device: None)

    args = [f"ab={ab}" if a.startswith("ab=") else a for a in TINY]
    overrides = [*args, f"engine={engine}"]
    scored = {"scheduled_vs_max_prob_calibration": ("max_prob", "head_and_max_prob_logistic_regression"),
              "scheduled_vs_top_gap_calibration": ("top_gap", "head_and_top_gap_logistic_regression")}
    if ab in scored:  # B's calibration is required: an sts_max_prob (sts_top_gap) file
        score, method = scored[ab]
        path = tmp_path / score / "temperatures.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"method": method, "temperatures": [1.0] * 4, "biases": [0.0] * 4,
                                    f"{score}_weights": [0.5] * 4}))
        overrides.append(f"ab.arms.B.engine.confidence_calibration={path}")
    if ab != "in_process_vs_served":
        check_config(compose_ab(overrides, out_dir=tmp_path))
        return
    HydraConfig.instance().set_config(compose_ab(overrides, out_dir=tmp_path, hydra_config=True))
    try:
        cfg = compose_ab(overrides, out_dir=tmp_path)
        check_config(cfg)
        assert f"engine={engine}" in list(cfg.ab.arms.B.http.launch)
    finally:
        HydraConfig.instance().cfg = None


def test_late_validation_loses_no_run(tmp_path):
    """A bad greedy-replica cap is refused by the config check, and a prompt the context cannot hold is
    refused before any block runs (not by the errors guard after the whole A/B)."""
    from dspark.config import ConfigError
    from runners.ab import check_config, run

    with pytest.raises(ConfigError, match="ab.greedy_replica_max_tokens"):
        check_config(compose_ab([*TINY, "ab.greedy_replica_max_tokens=0"], out_dir=tmp_path))
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "short", "id": "ok"}\n{"prompt": "' + "x" * 5000 + '", "id": "huge"}\n')
    args = [a for a in TINY if not a.startswith(("+workload", "workload."))]
    cfg = compose_ab([*args, "+workload=custom", f"workload.path={path}", "workload.max_tokens=4",
                      "engine.max_model_len=64"], out_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"1 prompt\(s\) do not fit engine.max_model_len=64.*huge"):
        run(cfg)
    assert not (tmp_path / "run" / "blocks.csv").exists()


def test_a_sweep_writes_outside_its_folder_no_longer():
    from runners.sweep_dirs import job_name, safe_dirname

    assert safe_dirname("+workload=custom,workload.path=../../x.jsonl") == "+workload=custom,workload.path=____x.jsonl"
    assert "/" not in safe_dirname("engine.cost_table=/abs/t.json") and ".." not in safe_dirname("a=../..")
    long = ",".join(f"ab.arms.B.engine.key{i}=value{i}" for i in range(12))
    short = safe_dirname(long)
    assert len(short) == 80 and short != safe_dirname(long + "x")
    assert job_name(["workload.path=../../x.jsonl"]) == "path=____x.jsonl"
    assert "subdir: ${hydra.job.num}_${sweep_job_name:}" in (Path(ab.ROOT) / "conf" / "ab.yaml").read_text()


def test_two_runs_in_one_output_folder_are_refused_not_lost(tmp_path):
    from dspark.config import ConfigError
    from runners.ab import output_folder_lock, run

    with output_folder_lock(tmp_path):  # a run in progress holds the folder
        with pytest.raises(ConfigError, match=r"is in use by another run \(pid \d+\)"):
            run(compose_ab(TINY, out_dir=tmp_path))
        assert not (tmp_path / "blocks.csv").exists()
    with output_folder_lock(tmp_path):  # released: the folder can be used again
        pass


def _tiny_engines(tmp_path, concurrency: int):
    cfg = compose_ab([*TINY, f"load.concurrency={concurrency}", "engine.max_model_len=64"], out_dir=tmp_path)
    return tiny_factory()(cfg, ab.arm_engine_configs(cfg))


def test_closed_loop_ttft_starts_when_the_request_is_sent_and_queue_wait_is_apart(tmp_path):
    from omegaconf import OmegaConf

    from dspark.bench.metrics import request_metrics
    from dspark.config import SamplingParams

    engine = _tiny_engines(tmp_path, concurrency=1)["A"]
    tok = FakeTokenizer()
    inputs = [tok.encode(f"prompt number {i}") for i in range(3)]
    params = [SamplingParams(max_tokens=5, temperature=0.0) for _ in inputs]
    outs, wall, scheduled = ab.drive(engine, inputs, params, ["r0", "r1", "r2"],
                                     OmegaConf.create({"mode": "closed", "concurrency": 1}), seed=0)
    assert len(set(scheduled)) == 1  # a closed loop: every request is due at the block's start
    assert [o.user_id for o in outs] == ["r0", "r1", "r2"] and wall > 0
    # One request in the engine at a time (concurrency 1): each is sent once the one before has finished.
    for before, after in zip(outs, outs[1:]):
        assert after.arrival_time >= before.finish_time
    metrics = [request_metrics(r) for r in ab.to_records(outs, "A", 0, scheduled)]
    assert metrics[0]["queue_wait_s"] < metrics[2]["queue_wait_s"]
    # r2 waited for r0 and r1 to finish; that wait is its queue wait, not part of its TTFT.
    assert metrics[2]["queue_wait_s"] == pytest.approx(outs[2].arrival_time - scheduled[2])
    assert metrics[2]["queue_wait_s"] >= outs[1].finish_time - scheduled[2] > 0
    assert metrics[2]["ttft_s"] == pytest.approx(outs[2].first_token_time - outs[2].arrival_time)
    assert metrics[2]["ttft_s"] <= outs[2].first_token_time - outs[1].finish_time  # none of the wait for r0, r1


def test_poisson_arrivals_and_refused_requests(tmp_path):
    import random

    from omegaconf import OmegaConf

    from dspark.config import SamplingParams

    engine = _tiny_engines(tmp_path, concurrency=2)["B"]
    tok = FakeTokenizer()
    inputs = [tok.encode(f"p{i}") for i in range(4)] + [[1] + [5] * 80]  # the last cannot fit max_model_len=64
    params = [SamplingParams(max_tokens=3, temperature=0.0) for _ in inputs]
    outs, _, scheduled = ab.drive(engine, inputs, params, [f"r{i}" for i in range(5)],
                                  OmegaConf.create({"mode": "poisson", "request_rate": 200.0}), seed=7)
    rng = random.Random(7)
    gaps = [rng.expovariate(200.0) for _ in inputs]
    offsets = [s - scheduled[0] + gaps[0] for s in scheduled]
    assert offsets == pytest.approx([sum(gaps[: i + 1]) for i in range(len(gaps))])  # the same arrival times
    assert all(o.arrival_time >= s for o, s in zip(outs, scheduled))  # never sent before it is due
    assert outs[-1].finish_reason == "error" and "max_model_len" in outs[-1].error  # refused, not a crash
    assert all(o.error is None for o in outs[:-1])


def test_ab_profile_at_the_workloads_own_context(tmp_path, monkeypatch):
    """ab.profile.prompt_len=null: the cost-table profile runs at the A/B's context (its prompts' median token
    count plus half their median output cap), recorded in the table's settings; runners.profile, which has no
    workload, refuses a null prompt_len by name."""
    import dspark.profiler as profiler
    from dspark.config import ConfigError
    from runners.schema import profile_context, to_profile_settings
    from test_profiler import record_profile_calls, staircase, synthetic_clock

    assert profile_context([10, 30, 20], [8, 8, 16]) == 24 and profile_context([0], [1]) == 2
    with pytest.raises(ValueError, match="one output cap per prompt"):
        profile_context([1, 2], [3])
    synthetic_clock(monkeypatch, staircase)
    seen = record_profile_calls(monkeypatch, profiler)
    overrides = [o for o in TINY if not o.startswith("ab=")] + [
        "ab.profile.warmup_steps=1", "ab.profile.measure_steps=3", "ab.profile.prompt_len=null",
        "ab.profile.verify_lens=[0,1,2,3,4]", "ab.profile.min_r2=0.9", "ab.profile.remeasure_rounds=1",
        "ab.fail_on_guard=false", "ab.n_blocks=2"]
    summary = ab.run(compose_ab(overrides, out_dir=tmp_path / "run"), engine_factory=tiny_factory())
    stats = summary["workload"]["length_stats"]
    want = int(stats["input_tokens"]["median"] + stats["output_cap"]["median"] // 2)
    assert len(seen) == 1 and seen[0]["prompt_len"] == want > 6
    assert summary["cost_tables"]["B"]["settings"]["prompt_len"] == seen[0]["prompt_len"]
    node = compose_ab(overrides, out_dir=tmp_path / "x").ab.profile
    with pytest.raises(ConfigError, match="prompt_len: null takes the context from an A/B's workload"):
        to_profile_settings(node)


def test_ab_profile_settings_reach_the_profiler_and_the_summary_names_the_table(tmp_path, monkeypatch):
    """A trimming arm without engine.cost_table: runners.ab profiles this node with the ab.profile settings,
    saves the table with the PNG of its curve beside it, and the summary names the table, how it was
    obtained (profiled now; reused from cache by the next run), its fingerprint and its fit quality."""
    import dspark.profiler as profiler
    from dspark.config import ConfigError
    from dspark.cost_table import fingerprint_digest
    from test_profiler import record_profile_calls, staircase, synthetic_clock

    synthetic_clock(monkeypatch, staircase)
    seen = record_profile_calls(monkeypatch, profiler)
    overrides = [o for o in TINY if not o.startswith("ab=")] + [
        "ab.profile.warmup_steps=1", "ab.profile.measure_steps=3", "ab.profile.prompt_len=6",
        "ab.profile.verify_lens=[0,1,2,3,4]", "ab.profile.min_r2=0.9", "ab.profile.time_budget_s=600", "ab.profile.remeasure_rounds=1",
        "ab.fail_on_guard=false"]
    cfg = compose_ab(overrides, out_dir=tmp_path)
    arm_cfgs = ab.arm_engine_configs(cfg)
    engines = tiny_factory()(cfg, arm_cfgs)
    used = ab.attach_cost_tables(cfg, arm_cfgs, engines)
    assert seen == [dict(batch_sizes=(1, 2), verify_lens=(0, 1, 2, 3, 4), warmup_steps=1, measure_steps=3,
                         prompt_len=6, seed=0, flat_rel_tol=0.02, max_drop_rel=0.25, monotone="envelope", min_r2=0.9,
                         max_rel_residual=0.35, time_budget_s=600.0, remeasure_rounds=1, progress=False)]
    table = used["B"]
    assert table["how"] == "profiled now" and Path(table["path"]).parent == tmp_path / "cost_tables"
    assert arm_cfgs["B"].cost_table == table["path"] and engines["B"].cfg.cost_table == table["path"]
    assert Path(table["plot"]) == Path(table["path"]).with_suffix(".png") and Path(table["plot"]).is_file()
    assert table["fingerprint"] == fingerprint_digest(engines["B"].fingerprint())
    assert table["fit"]["passed"] is True and table["fit"]["min_r2"] == 0.9 and "R^2" in table["fit_summary"]
    assert table["settings"]["measure_steps"] == 3
    assert used["A"] == {**{k: v for k, v in table.items() if k != "profile_s"}, "how": "shared for the oracle bound"}
    # The next run on this node with these settings reuses the table, and says so.
    cfg = compose_ab(overrides, out_dir=tmp_path)
    arm_cfgs = ab.arm_engine_configs(cfg)
    reused = ab.attach_cost_tables(cfg, arm_cfgs, tiny_factory()(cfg, arm_cfgs))["B"]
    assert len(seen) == 1
    assert "profile_s" not in reused  # nothing was profiled by this run
    assert reused == {**{k: v for k, v in table.items() if k != "profile_s"}, "how": "reused from cache"}
    # A profile past its time budget stops, naming the settings as runners.ab's keys.
    from dspark.profiler import ProfileBudgetError

    cfg = compose_ab([*overrides, "ab.profile.time_budget_s=1e-6", "ab.profile.measure_steps=4"], out_dir=tmp_path)
    arm_cfgs = ab.arm_engine_configs(cfg)
    with pytest.raises(ProfileBudgetError, match=r"the cost-table profile of arm B \(its settings are "
                                                 r"ab\.profile\.\*\): the cost-table profile ran \d+ s for 1 of 10 "
                                                 r".*raise time_budget_s"):
        ab.attach_cost_tables(cfg, arm_cfgs, tiny_factory()(cfg, arm_cfgs))
    # A bad profile setting is refused with the config, before any model loads.
    with pytest.raises(Exception, match=r"(?s)monotone.*sometimes"):  # not a MonotoneMode: refused at composition
        compose_ab([*overrides, "ab.profile.monotone=sometimes"], out_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"ab\.profile\.min_r2 must be in \[0, 1\]"):
        ab.check_config(compose_ab([*overrides, "ab.profile.min_r2=1.5"], out_dir=tmp_path))


def test_counters_over_blocks_add_amounts_and_average_rates_and_gauges():
    rows = [{"arm": "B", "counter/decode_steps": 10, "counter/oracle/oracle_ms": 2.0,
             "counter/oracle/oracle_tokens_per_ms": 30.0, "counter/service_cost/floor_ms": 1.5,
             "counter/service_cost/extra_ms": -0.5, "counter/service_cost/scale": 1.2,
             "counter/sched/plan_ms_total": 4.0},
            {"arm": "B", "counter/decode_steps": 14, "counter/oracle/oracle_ms": 3.0,
             "counter/oracle/oracle_tokens_per_ms": 40.0, "counter/service_cost/floor_ms": 2.5,
             "counter/service_cost/extra_ms": -1.5, "counter/service_cost/scale": 1.4,
             "counter/sched/plan_ms_total": 6.0}]
    c = ab._sum_counters(rows)
    assert c["decode_steps"] == 24 and c["oracle/oracle_ms"] == 5.0 and c["sched/plan_ms_total"] == 10.0
    # a rate and the service price the planner read are not amounts: averaged, not added
    assert c["oracle/oracle_tokens_per_ms"] == 35.0
    assert c["service_cost/floor_ms"] == 2.0 and c["service_cost/extra_ms"] == -1.0
    assert c["service_cost/scale"] == pytest.approx(1.3)


def test_the_prediction_checks_amounts_add_over_blocks():
    """Every amount prediction_health divides is a sum over the arm's blocks: the measured and the priced
    milliseconds of the same steps, the predicted and the realised tokens."""
    from dspark.bench.metrics import prediction_health

    names = ("predicted_tokens_total", "realised_tokens_on_predicted", "predicted_ms_total",
             "measured_ms_on_predicted", "priced_ms_on_measured", "predicted_ms_on_measured")
    blocks = [dict(zip(names, (10.0, 9, 4.0, 6.0, 5.0, 4.0))), dict(zip(names, (30.0, 27, 12.0, 18.0, 15.0, 12.0)))]
    rows = [{"arm": "B", **{f"counter/sched/{k}": v for k, v in b.items()}} for b in blocks]
    c = ab._sum_counters(rows)
    assert all(c[f"sched/{k}"] == sum(b[k] for b in blocks) for k in names)
    health = prediction_health({"B": c}, tolerance=0.15)["B"]
    assert health["step_ms_measured_over_service_price"] == pytest.approx(24.0 / 20.0)
    assert health["step_ms_measured_over_predicted"] == pytest.approx(24.0 / 16.0)


def test_an_arms_calibration_file_is_read_before_any_model_loads_and_named_by_its_key(tmp_path):
    from dspark.config import ConfigError
    from runners.ab import check_config

    args = ["ab=full_vs_scheduled" if a.startswith("ab=") else a for a in TINY]
    renamed = tmp_path / "cal.json"
    renamed.write_text(json.dumps({"method": "sequential_temperature_bias_scaling", "temperatures": [1.0] * 4,
                                   "biases": [0.0] * 4}))
    for path, words in [(renamed, "cal.json is a file, not a calibration"), (tmp_path / "none", "not found")]:
        cfg = compose_ab([*args, f"+ab.arms.B.engine.confidence_calibration={path}"], out_dir=tmp_path)
        with pytest.raises(ConfigError, match=f"^ab.arms.B.engine.confidence_calibration: .*{words}"):
            check_config(cfg)


def test_a_greedy_calibration_arm_is_checked_early_and_judged_by_what_it_read(tmp_path):
    """ab=scheduled_vs_greedy_top_gap_calibration: a bad engine.greedy_confidence_calibration is refused by the
    config check under its key; on greedy traffic B's did_nothing guard passes only as its all-greedy steps read
    the greedy calibration (the counters say so)."""
    from dspark.config import ConfigError
    from dspark.training.calibration import save_temperatures
    from runners.ab import check_config

    args = ["ab=scheduled_vs_greedy_top_gap_calibration" if a.startswith("ab=") else a for a in TINY]
    cfg = compose_ab([*args, f"ab.arms.B.engine.greedy_confidence_calibration={tmp_path / 'none'}"],
                     out_dir=tmp_path)
    with pytest.raises(ConfigError, match="^ab.arms.B.engine.greedy_confidence_calibration: .*not found"):
        check_config(cfg)
    from test_engine_scheduling import steep_table

    target = tiny_target(seed=0, scale=TARGET_SCALE)
    drafter = tiny_drafter(target, seed=1)
    save_temperatures(tmp_path / "gap", [1.0] * drafter.block_size, biases=[0.2] * drafter.block_size,
                      top_gap_weights=[0.5] * drafter.block_size)
    arms = [*args, f"ab.arms.B.engine.greedy_confidence_calibration={tmp_path / 'gap'}"]
    # a table for both planning arms (profiling one on a busy CPU may be refused for its fit)
    probe = Engine(target, FakeTokenizer(), replace(ab.arm_engine_configs(compose_ab(arms, out_dir=tmp_path))["A"],
                                                    cost_table=None), drafter)
    table = steep_table(probe, tmp_path / "steep.json")
    cfg = compose_ab([*arms, f"engine.cost_table={table}", "ab.fail_on_guard=false"], out_dir=tmp_path / "run")
    summary = ab.run(cfg, engine_factory=tiny_factory())
    assert {summary["cost_tables"][arm]["how"] for arm in "AB"} == {"configured"}, summary["cost_tables"]
    guard = next(g for g in summary["guards"] if g["name"] == "did_nothing[B]")
    assert guard["details"]["expects_greedy_calibration"] == "sts_top_gap", guard
    counters = summary["counters"]["B"]
    assert counters["confidence_calibration/greedy_sts_top_gap_steps"] > 0, counters
    assert guard["passed"] and "greedy calibration sts_top_gap" in guard["message"], guard["message"]
