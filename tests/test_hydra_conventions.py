"""The runners follow Hydra's conventions: sweep job folders named after what the sweep varies, config
groups chosen the same way in every runner, `--help` describing every key, a mistyped key answered with
the closest ones, a failed guard failing its job but not the sweep, progress within an arm-block, and
string choices checked by the typed schema at composition."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import typing

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf, open_dict, read_write

import runners.ab as ab
from dspark.config import ConfigError
from test_ab_runner import TINY, tiny_factory
from test_configs import CONF, ROOT, compose_ab, full_message


# Every Hydra runner (runners/<name>.py, run as `python -m runners.<name>`) and the primary configs it
# runs: conf/<name>.yaml, and the others chosen with --config-name.
RUNNER_CONFIGS = {
    "ab": ["ab"],
    "bench_decode": ["bench_decode", "bench_graphs", "bench_sched_graphs", "bench_scheduling"],
    "calibrate": ["calibrate"],
    "eval_drafter": ["eval_drafter"],
    "generate": ["generate"],
    "make_training_data": ["make_training_data"],
    "profile": ["profile"],
    "serve": ["serve"],
    "train_drafter": ["train_drafter"],
}
CONFIG_RUNNER = {config: runner for runner, configs in RUNNER_CONFIGS.items() for config in configs}


# Runs each case's runner module as `python -m runners.<name> ARGS` does (as __main__), all in one
# interpreter: one start-up and one import of torch for every runner. Prints {label: [exit code, stdout, stderr]}.
RUN_AS_MAIN = r"""
import contextlib, io, json, runpy, sys

results = {}
for label, runner, args in json.loads(sys.argv[1]):
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = [runner, *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(f"runners.{runner}", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code
    results[label] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(results))
"""


def run_as_main(cases: list[tuple[str, str, list[str]]], cwd) -> dict[str, tuple[int, str, str]]:
    """``{label: (exit code, stdout, stderr)}`` of ``python -m runners.<runner> ARGS`` for each
    ``(label, runner, ARGS)`` of ``cases``, run in one subprocess (:data:`RUN_AS_MAIN`)."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run([sys.executable, "-c", RUN_AS_MAIN, json.dumps(cases)], cwd=cwd,
                          env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {label: tuple(result) for label, result in json.loads(proc.stdout.splitlines()[-1]).items()}


# Every command line the tests below check as a user types it, {label: (runner, ARGS)}: all run in one subprocess
# (:func:`cli_results`), so that they pay for one start-up and one import of torch, not one each.
MISTYPED = {"ab": ("ab.n_block=4", "ab.n_blocks"), "bench_decode": ("new_token=8", "new_tokens"),
            "calibrate": ("n_gird=3", "n_grid"), "eval_drafter": ("num_prompt=3", "num_prompts"),
            "generate": ("prompt_file=p.jsonl", "prompts_file"), "make_training_data": ("max_token=3", "max_tokens"),
            "profile": ("measure_step=3", "measure_steps"), "serve": ("prot=1", "port"),
            "train_drafter": ("train.max_step=3", "train.max_steps")}
CLI_CASES = {
    **{f"{runner}/workload/{case}": (runner, args) for runner in ("ab", "bench_decode") for case, args in (
        ("chosen", ["+workload=poetry", "workload.num_prompts=3", "--cfg", "job"]),
        ("unchosen", ["workload.num_prompts=3", "--cfg", "job"]),
        ("plain", ["workload=poetry", "--cfg", "job"]))},
    "ab/help": ("ab", ["--help"]),
    "ab/config_error": ("ab", ["+workload=poetry", "ab.n_blocks=0"]),
    "ab/sweep/key_of_swept_group": ("ab", ["-m", "+workload=poetry,arena_hard", "workload.num_prompts=2"]),
    "ab/http/key_under_null": ("ab", ["+workload=poetry", "ab.arms.A.http.base_url=http://x", "--cfg", "job"]),
    "ab/http/null_section": ("ab", ["+workload=poetry", "ab.arms.A.http={base_url: http://x}", "--cfg", "job"]),
    "ab/help/overrides": ("ab", ["+workload=agentic", "ab.n_blocks=6", "--help"]),
    # ab runs the mistyped key as a run does; the others show the config (--cfg job), so that nothing could start a run.
    **{f"{runner}/mistyped": (runner, [typo] if runner == "ab" else [typo, "--cfg", "job"])
       for runner, (typo, _) in MISTYPED.items()},
    "profile/help": ("profile", ["--help"]),
}


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory) -> dict[str, tuple[int, str, str]]:
    """``{label: (exit code, stdout, stderr)}`` of every command line of :data:`CLI_CASES`, run in one subprocess
    (:func:`run_as_main`) in an empty folder."""
    cases = [(label, runner, args) for label, (runner, args) in CLI_CASES.items()]
    return run_as_main(cases, cwd=tmp_path_factory.mktemp("cli"))


# ---- sweep job folders ------------------------------------------------------------------------------
def test_a_job_is_named_after_what_the_sweep_varies():
    from runners.sweep_dirs import job_name, swept_keys

    job = ["+workload=arena_hard", "load.concurrency=16", "ab.n_blocks=8", "progress=false"]
    swept = swept_keys(["+workload=agentic,arena_hard", "load.concurrency=4,16", "ab.n_blocks=8", "progress=false"])
    assert swept == {"workload", "load.concurrency"}
    assert job_name(job, swept, groups=["workload", "ab", "engine"]) == "arena_hard,concurrency=16"
    # Nothing swept (or no record of the sweep): every override of the job, noise keys left out.
    assert job_name(job, set(), groups=["workload"], exclude=["progress"]) == "arena_hard,concurrency=16,n_blocks=8"
    # hydra.sweeper.params sweeps too.
    assert swept_keys(["ab.n_blocks=8"], {"ab.seed": "0,1,2"}) == {"ab.seed"}
    # A one-value sweep (the way to set a key of a swept group) varies nothing: it does not name the jobs.
    assert swept_keys(["+workload=agentic,arena_hard", "workload.num_prompts=choice(2)", "ab.seed=range(0,1)",
                       "load.concurrency=choice(1,4)"]) == {"workload", "load.concurrency"}


def test_job_names_keep_keys_with_the_same_last_part_apart_and_stay_short():
    from runners.sweep_dirs import NAME_LIMIT, job_name

    arms = ["ab.arms.A.engine.verify=full", "ab.arms.B.engine.verify=ragged"]
    assert job_name(arms) == "A.engine.verify=full,B.engine.verify=ragged"
    assert job_name(["ab.seed=1", "engine.seed=2"]) == "ab.seed=1,engine.seed=2"
    long = [f"ab.arms.B.engine.key{i}=value{i}" for i in range(20)]
    name = job_name(long)
    assert len(name) == NAME_LIMIT and name != job_name(long[:-1] + ["ab.arms.B.engine.key19=other"])
    assert job_name(["engine.cost_table=/abs/../t.json"]) == "cost_table=_abs___t.json"  # one folder, inside the sweep


def test_the_sweep_subdir_resolver_reads_the_sweeps_record(tmp_path):
    """conf/ab.yaml's hydra.sweep.subdir as a job resolves it: the job number, then the swept overrides
    (from the multirun.yaml Hydra writes in the sweep folder); the keys in exclude_keys never name a job."""
    overrides = ["+workload=agentic", "load.concurrency=16", "ab.n_blocks=8", "progress=false", "wandb.mode=disabled"]
    cfg = compose_ab([*overrides, f"hydra.sweep.dir={tmp_path}"], hydra_config=True)
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.job.num = 3
    # No record of the sweep: every override of the job (the test's own paths.* first), those excluded left out.
    name = OmegaConf.select(cfg, "hydra.sweep.subdir")
    assert name.startswith("3_root=") and "progress" not in name and "mode=" not in name
    master = OmegaConf.create({"hydra": {"overrides": {"task": ["+workload=agentic,poetry", "load.concurrency=4,16",
                                                                 "ab.n_blocks=8", "progress=false"]}}})
    OmegaConf.save(master, tmp_path / "multirun.yaml")
    assert OmegaConf.select(cfg, "hydra.sweep.subdir") == "3_agentic,concurrency=16"
    # The name an A/B job records in its summary.json (sweep_job), which the sweep summary shows.
    from runners.sweep_dirs import hydra_job_name
    assert hydra_job_name(cfg.hydra) == "agentic,concurrency=16"


# ---- the workload group: +workload=NAME in every runner ------------------------------------------
@pytest.mark.parametrize("runner", ["ab", "bench_decode"])
def test_the_workload_group_is_chosen_alike_in_both_runners(runner, cli_results):
    # python -m runners.<runner> +workload=poetry workload.num_prompts=3 --cfg job
    code, out, err = cli_results[f"{runner}/workload/chosen"]
    assert code == 0, err
    printed = OmegaConf.create(out)
    assert printed.workload.name == "poetry" and printed.workload.num_prompts == 3
    # A workload key without the group (workload.num_prompts=3 --cfg job): a message saying to choose it, no traceback.
    code, out, err = cli_results[f"{runner}/workload/unchosen"]
    assert code == 1 and "+workload=NAME" in err and "Traceback" not in err
    # A key under a section the chosen config leaves null (an arm's http in an in-process A/B), key by key or
    # as a whole: a message naming the A/B pairs that set it, no traceback.
    if runner == "ab":
        for case in ("key_under_null", "null_section"):
            code, out, err = cli_results[f"ab/http/{case}"]
            assert code == 1 and "ab=http_full_vs_ragged" in err and "Traceback" not in err, (case, err)
        assert "Could not set 'ab.arms.A.http'" in cli_results["ab/http/null_section"][2]
    # A sweep over workloads that also sets a plain workload key: how to write it (a one-value sweep).
    if runner == "ab":
        code, out, err = cli_results["ab/sweep/key_of_swept_group"]
        assert code == 1 and "'workload.num_prompts=choice(2)'" in err and "Traceback" not in err, err
    # The group without `+` (workload=poetry --cfg job): Hydra's own hint.
    code, out, err = cli_results[f"{runner}/workload/plain"]
    assert code == 1 and "+workload=poetry" in err


# ---- --help ---------------------------------------------------------------------------------------
def test_help_lists_every_key_with_its_value_and_description(cli_results):
    from runners.config_keys import field_descriptions, schema_keys
    from runners.schema import ABSchema, ABSettingsSchema

    code, stdout, stderr = cli_results["ab/help"]  # python -m runners.ab --help
    assert code == 0, stderr
    lines = {line.split()[0].split("=")[0]: line for line in stdout.splitlines() if line.startswith("  ")}
    n_blocks = lines["ab.n_blocks"]
    assert n_blocks.split()[0] == "ab.n_blocks=2"  # the value the ab group sets, not the schema's default
    assert field_descriptions(ABSettingsSchema)["n_blocks"] in n_blocks
    assert "[closed | poisson]" in lines["load.mode"]  # a choice lists its values
    assert lines["wandb.mode"].split()[0] == "wandb.mode=${oc.env:WANDB_MODE,offline}"
    for key, _, _ in schema_keys(ABSchema):
        assert key in lines or any(k.startswith(key + ".") for k in lines), key
    assert "workload: agentic, arena_hard, custom, mixed_chat, poetry" in stdout  # the groups stay listed
    # The values shown are those composed with the command line's overrides (+workload=agentic ab.n_blocks=6 --help).
    code, stdout, stderr = cli_results["ab/help/overrides"]
    assert code == 0 and "  ab.n_blocks=6 " in stdout and "  workload.name=agentic" in stdout, stderr
    # ... and those the runner's config sets.
    from hydra import compose, initialize_config_dir

    from runners.config_keys import help_listing
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="bench_decode"):
        listing = help_listing(compose(config_name="bench_decode"))
    assert "  new_tokens=64 " in listing and "  order=arm_major " in listing


def test_every_runner_enters_through_runner_main():
    """Each Hydra runner's main is ``@runner_main("<its name>")`` (runners.hydra_main), so that its --help lists
    its keys and a mistyped key is answered with the closest ones."""
    sources = {p.stem: p.read_text() for p in (ROOT / "runners").glob("*.py") if p.stem != "hydra_main"}
    assert {name for name, text in sources.items() if "@runner_main(" in text} == set(RUNNER_CONFIGS)
    assert [name for name, text in sources.items() if "@hydra.main(" in text] == []
    for runner in RUNNER_CONFIGS:
        assert f'@runner_main("{runner}")' in sources[runner], runner
    assert set(CONFIG_RUNNER) == {p.stem for p in CONF.glob("*.yaml")}  # every primary config has its runner


@pytest.mark.parametrize("config", sorted(CONFIG_RUNNER))
def test_every_config_lists_each_key_of_its_schema_in_help(config):
    """The config selects the key listing as its help (hydra/help=config_keys) and has a typed schema whose every
    key the listing shows, as ``--help`` prints it."""
    from hydra import compose, initialize_config_dir

    from runners.config_keys import help_listing, schema_keys

    runner = CONFIG_RUNNER[config]
    importlib.import_module(f"runners.{runner}")  # registers the config's schema
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name=runner):
        cfg = compose(config_name=config, return_hydra_config=True)
    assert cfg.hydra.runtime.choices["hydra/help"] == "config_keys"
    schema = OmegaConf.get_type(cfg)
    assert dataclasses.is_dataclass(schema), f"conf/{config}.yaml has no typed schema ({schema})"
    listing = help_listing(cfg)
    assert listing.replace("$", "$$") in cfg.hydra.help.template  # the help template shows it
    listed = {line.split()[0].split("=")[0] for line in listing.splitlines()}
    for key, _, _ in schema_keys(schema):
        assert key in listed or any(k.startswith(key + ".") for k in listed), key


@pytest.mark.parametrize("config,listed,absent", [
    ("ab", {"ab", "engine", "workload", "load", "tiers", "wandb"}, set()),
    ("train_drafter", {"model"}, {"ab", "engine", "workload", "load", "tiers", "wandb", "drafter"}),
    ("calibrate", {"model"}, {"ab", "workload", "load", "wandb"}),
])
def test_help_lists_the_groups_its_runner_reads_and_no_other(config, listed, absent):
    """--help's groups are those whose package is a key of the runner's schema (``tiers`` writes into ``engine``):
    train_drafter's help does not offer ab= or workload= groups that it would refuse."""
    from hydra import compose, initialize_config_dir

    from runners.config_keys import group_listing

    runner = CONFIG_RUNNER[config]
    importlib.import_module(f"runners.{runner}")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name=runner):
        cfg = compose(config_name=config, return_hydra_config=True)
    assert "${config_groups:}" in OmegaConf.to_container(cfg.hydra.help)["template"]
    groups = {line.split(":")[0] for line in group_listing(cfg).splitlines()}
    assert listed <= groups and not (absent & groups), groups


def test_an_error_that_names_a_setting_is_printed_without_a_traceback(cli_results):
    """A ConfigError from a runner (here ab.n_blocks=0, refused before any model loads) is its message alone,
    exit status 1."""
    code, out, err = cli_results["ab/config_error"]
    assert code == 1 and "ConfigError: ab.n_blocks: must be >= 1" in err and "Traceback" not in err, err


def test_swept_group_hint_names_each_key_under_a_swept_group():
    from runners.hydra_main import swept_group_hint

    args = ["-m", "+workload=agentic,arena_hard", "workload.num_prompts=4", "++workload.seed=1",
            "load.concurrency=4,16"]
    hint = swept_group_hint(args)
    assert "'workload.num_prompts=choice(4)' '++workload.seed=choice(1)'" in hint and "load.concurrency" not in hint
    assert swept_group_hint(args[1:]) is None  # not a multirun
    assert swept_group_hint(["-m", "+workload=agentic", "workload.num_prompts=4"]) is None  # the group not swept
    assert swept_group_hint(["-m", "+workload=a,b", "workload.num_prompts=choice(4)"]) is None  # already the fix


def test_every_runners_command_line_answers_a_mistyped_key_and_help(cli_results):
    """A mistyped key exits 1 naming the closest key, for every runner; `--help` prints the key listing (checked
    for every config in-process above; here as the command line prints it for one runner, since Hydra's --help
    takes seconds). One subprocess runs them all (:func:`cli_results`). ab runs the mistyped key as a run does;
    the others show the config (--cfg job), so that nothing could start a run."""
    assert set(MISTYPED) == set(RUNNER_CONFIGS)
    for runner, (typo, closest) in MISTYPED.items():
        code, out, err = cli_results[f"{runner}/mistyped"]
        key = typo.split("=")[0]
        assert code == 1 and f"Could not override '{key}': no such key. Did you mean {closest}" in err, err
        assert "To append to your config use" not in err and "Traceback" not in err  # mistyped, not missing
    code, out, err = cli_results["profile/help"]
    assert code == 0 and "python -m runners.profile " in out and "== Config keys ==" in out, err
    assert "  monotone=refuse " in out and "refuse a fit whose R^2" in out  # a field the schema inherits, described


@pytest.mark.parametrize("config", sorted(CONFIG_RUNNER))
def test_every_key_of_every_runners_schema_has_a_description(config):
    """Every key of the typed schema each runner's config runs with has a description for --help (a nested
    schema's own key may go without: its keys are described)."""
    from hydra import compose, initialize_config_dir

    from runners.config_keys import description, nested_schema, schema_keys

    runner = CONFIG_RUNNER[config]
    importlib.import_module(f"runners.{runner}")  # registers the config's schema
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name=runner):
        schema = OmegaConf.get_type(compose(config_name=config))
    assert dataclasses.is_dataclass(schema), f"conf/{config}.yaml has no typed schema ({schema})"
    undescribed = [key for key, owner, name in schema_keys(schema)
                   if nested_schema(typing.get_type_hints(owner)[name]) is None and not description(owner, name)]
    assert undescribed == [], f"runners.{runner} ({schema.__name__}): keys without a description: {undescribed}"


def test_descriptions_are_the_comments_above_and_beside_a_field():
    from runners.config_keys import field_descriptions

    @dataclasses.dataclass
    class Example:
        plain: int = 1
        # the first line
        # and the second
        above: int = 2  # and beside

        apart: int = 3
    assert field_descriptions(Example) == {"above": "the first line and the second and beside"}

    @dataclasses.dataclass
    class Derived(Example):
        apart: int = 4  # its own description
        added: str = ""  # a field of its own
    # Inherited fields keep the description of the class that declares them.
    assert field_descriptions(Derived) == {"above": "the first line and the second and beside",
                                           "apart": "its own description", "added": "a field of its own"}


# ---- a mistyped key --------------------------------------------------------------------------------
def test_a_mistyped_key_names_the_closest_keys():
    from runners.hydra_main import UnknownConfigKeyError, unknown_key_message

    with pytest.raises(ConfigCompositionException) as info:
        compose_ab(["+workload=poetry", "ab.n_block=4"])
    message = unknown_key_message(info.value)
    assert "'ab.n_block'" in message and "Did you mean ab.n_blocks" in message
    with pytest.raises(ConfigCompositionException) as info:
        compose_ab(["+workload=poetry", "n_blocks=4"])  # a key put at the wrong level
    assert "Did you mean ab.n_blocks" in unknown_key_message(info.value)
    with pytest.raises(ConfigCompositionException) as info:
        compose_ab(["+workload=poetry", "ab.n_blocks=abc"])  # a declared key, a wrong value: Hydra's message
    assert unknown_key_message(info.value) is None
    assert issubclass(UnknownConfigKeyError, ConfigError) and issubclass(UnknownConfigKeyError,
                                                                        ConfigCompositionException)
    # As the command line answers it: test_every_runners_command_line_answers_a_mistyped_key_and_help.


def test_a_key_added_with_plus_names_the_closest_keys_too(tmp_path):
    with pytest.raises(ConfigError, match=r"ab\.nblocks \(did you mean ab\.n_blocks\? allowed here: "):
        ab.check_config(compose_ab(["+workload=agentic", "+ab.nblocks=3"], out_dir=tmp_path))


# ---- a failed guard in a sweep -------------------------------------------------------------------------
def test_the_sweep_summary_callback_exits_1_naming_the_failed_jobs(tmp_path, caplog):
    from runners.callbacks import SweepSummaryCallback
    from runners.job_status import failed_jobs, write_job_status

    for job in ("0_seed=0", "1_seed=1"):
        (tmp_path / job).mkdir()
    write_job_status(tmp_path / "0_seed=0", 0)
    write_job_status(tmp_path / "1_seed=1", 1, "guards failed: lossless/block0: outputs differ")
    assert failed_jobs(tmp_path) == {"1_seed=1": "guards failed: lossless/block0: outputs differ"}
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    with caplog.at_level("INFO"), pytest.raises(SystemExit) as info:
        SweepSummaryCallback().on_multirun_end(config)
    assert info.value.code == 1
    assert "1_seed=1: guards failed: lossless/block0" in caplog.text
    assert "no sweep summary written" in caplog.text  # these jobs wrote no summary.json; the status still counts
    write_job_status(tmp_path / "1_seed=1", 0)  # a rerun that passed replaces the status
    SweepSummaryCallback().on_multirun_end(config)  # returns: no failed job


@pytest.mark.slow
def test_a_failed_guard_fails_its_job_not_the_sweep(guard_sweep):
    """A two-job sweep whose second job fails a guard (a sampled workload without greedy replicas has no
    lossless comparison): both jobs run and write their results, the sweep summary lists both (the
    second as FAIL), the failed job's status says why, and the multirun exits 1. The sweep
    (``workload.temperature=0.0,0.7``) is tests/conftest.py's guard_sweep, shared with tests/test_wandb_log.py."""
    sweep, proc = guard_sweep
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["0_temperature=0.0", "1_temperature=0.7"]  # named after what the sweep varies
    passed, failed = (json.loads((sweep / job / "summary.json").read_text()) for job in jobs)
    assert passed["guards_passed"] and not failed["guards_passed"]
    assert json.loads((sweep / jobs[0] / "job_status.json").read_text()) == {"exit_code": 0}
    status = json.loads((sweep / jobs[1] / "job_status.json").read_text())
    assert status["exit_code"] == 1 and "lossless" in status["error"]
    assert passed["sweep_job"] == "temperature=0.0" and failed["sweep_job"] == "temperature=0.7"
    summary_md = (sweep / "sweep_summary.md").read_text()
    assert "2 job(s)" in summary_md and "**FAIL**" in summary_md and "| pass " in summary_md
    assert "| temperature=0.7 " in summary_md  # the job as its folder is named
    logged = proc.stdout + proc.stderr  # Hydra's log goes to the console's stdout
    assert "1 job(s) of the sweep failed" in logged and "1_temperature=0.7: guards failed: lossless" in logged


# ---- progress within an arm-block ---------------------------------------------------------------------
def test_drive_reports_each_finished_request(tmp_path):
    from dspark.config import SamplingParams
    from test_ab_runner import FakeTokenizer

    cfg = compose_ab([*TINY, "load.concurrency=2", "engine.max_model_len=64"], out_dir=tmp_path)
    engine = tiny_factory()(cfg, ab.arm_engine_configs(cfg))["B"]
    inputs = [FakeTokenizer().encode(f"p{i}") for i in range(4)] + [[1] + [5] * 80]  # the last is refused
    params = [SamplingParams(max_tokens=3, temperature=0.0) for _ in inputs]
    for load in ({"mode": "closed", "concurrency": 2}, {"mode": "poisson", "request_rate": 500.0}):
        seen: list[int] = []
        outs, _, _ = ab.drive(engine, inputs, params, [f"r{i}" for i in range(5)], OmegaConf.create(load), seed=1,
                              on_finished=seen.append)
        assert sum(seen) == len(inputs) == len(outs)
        engine.reset()


@pytest.mark.parametrize("progress", [True, False])
def test_each_arm_block_shows_its_requests_unless_progress_is_off(tmp_path, capsys, progress):
    ab.run(compose_ab([*TINY, "ab.n_blocks=1", f"progress={str(progress).lower()}"], out_dir=tmp_path),
           engine_factory=tiny_factory())
    err = capsys.readouterr().err
    assert ("block 0 arm A" in err and "2/2" in err) is progress
    assert ("block 0 arm B" in err) is progress


# ---- string choices in the typed schema ----------------------------------------------------------------
def test_choices_are_the_libraries_values_and_serialize_as_plain_strings(tmp_path):
    from dspark.bench.gc_pauses import GC_MODES
    from dspark.bench.schedule import SCHEDULE_KINDS
    from dspark.bench.wandb_log import WANDB_MODES
    from runners.schema import GcMode, ScheduleKind, WandbMode

    assert tuple(m.value for m in ScheduleKind) == SCHEDULE_KINDS
    assert tuple(m.value for m in GcMode) == GC_MODES
    assert tuple(m.value for m in WandbMode) == WANDB_MODES
    cfg = compose_ab(["+workload=agentic", "load.mode=poisson", "ab.schedule=random"], out_dir=tmp_path)
    assert cfg.load.mode == "poisson" and f"{cfg.ab.schedule}" == str(cfg.ab.schedule) == "random"
    hashed = ab.hashed_config(cfg)
    plain = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    for path in ab.UNHASHED_KEYS:
        node = plain
        for part in path[:-1]:
            node = node[part]
        node.pop(path[-1])
    # The config hash (which decides reruns) is that of the plain strings: finished runs are still found.
    assert json.dumps(hashed, sort_keys=True) == json.dumps(plain, sort_keys=True)
    with pytest.raises(ConfigCompositionException) as info:
        from hydra import compose, initialize_config_dir

        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3", job_name="bench_decode"):
            compose(config_name="bench_decode", overrides=["order=random"])
    assert all(w in full_message(info.value) for w in ("order", "arm_major", "batch_major", "alternating"))


def test_wandb_mode_from_the_environment_is_checked_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = compose_ab(["+workload=agentic"], out_dir=tmp_path)
    assert cfg.wandb.mode == "disabled"
    monkeypatch.setenv("WANDB_MODE", "cloud")
    with pytest.raises(ConfigError) as info:
        ab.check_config(compose_ab(["+workload=agentic"], out_dir=tmp_path))
    for word in ("wandb.mode", "WANDB_MODE", "cloud", "offline", "online", "disabled"):
        assert word in str(info.value), str(info.value)
    assert compose_ab(["+workload=agentic", "wandb.mode=offline"], out_dir=tmp_path).wandb.mode == "offline"


@pytest.mark.parametrize("config,override,message", [
    ("generate", "+foo=1", r"unknown config key\(s\): foo \(allowed here: drafter, engine,"),
    ("make_training_data", "+path=O.jsonl", r"unknown config key\(s\): path \("),
    ("serve", "+engine.verfy=full", r"engine.verfy \(did you mean engine.verify\?"),
    ("generate", "+sampling.temprature=0.7", r"sampling.temprature \(did you mean sampling.temperature\?"),
    ("train_drafter", "+train.lrr=0.1", r"train.lrr \(did you mean train.lr\?"),
])
def test_every_runner_refuses_a_key_its_schema_does_not_declare(config, override, message):
    """``+key=value`` adds a key even to a typed config; runner_main refuses it before the runner works, naming the
    closest keys (generate and make_training_data ran on, ignoring it)."""
    from hydra import compose, initialize_config_dir

    from runners.config_keys import refuse_unknown_keys

    runner = CONFIG_RUNNER[config]
    importlib.import_module(f"runners.{runner}")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name=runner):
        cfg = compose(config_name=config, overrides=[override])
    with pytest.raises(ConfigError, match=message):
        refuse_unknown_keys(cfg)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name=runner):
        refuse_unknown_keys(compose(config_name=config))  # the config as shipped passes
