"""Paired same-node A/B benchmark of two engine configurations.

    python -m runners.ab +workload=poetry
    python -m runners.ab +workload=agentic ab.n_blocks=6 load.concurrency=16
    python -m runners.ab -m +workload=agentic,arena_hard load.concurrency=4,16
    python -m runners.ab -m hydra/launcher=local +workload=agentic ab.seed=0,1     # submitit, local processes
    python -m runners.ab -m hydra/launcher=slurm hydra.launcher.partition=PART ...  # submitit, Slurm jobs

Both arms run in this process over the same requests and seeds, in an order schedule
(ABBA by default), each block preceded by an engine reset. Results land in the Hydra run
folder: requests.parquet, blocks.csv and requests/block<N>_<arm>.parquet (written after every
arm-block, so a crash keeps the finished blocks), summary.json, report.md with plots, and offline
W&B runs. SIGINT or SIGTERM during the timed blocks ends the run with the summary and report of the
completed blocks, marked ``interrupted`` (exit 130 / 143); during the greedy replicas, the lossless control or
the reference guards after the last block, it ends the run with the statistics of every block and those guards
not judged, marked the same way. A multirun
also gets sweep_summary.{md,csv} + sweep_gain.png in the sweep folder
(:class:`runners.callbacks.SweepSummaryCallback`); ``python -m runners.report FOLDER``
re-renders either kind of report later. In a multirun a job whose guards fail does not stop the
sweep: it is marked failed in its job_status.json (:func:`main`), and the multirun exits 1 after
the sweep summary. Each job's folder is named after what the sweep varies in it
(:mod:`runners.sweep_dirs`); ``--help`` lists every config key with its description.

Every configuration mistake (unknown key, wrong type, bad value, in any arm) is refused
before a model loads (:func:`check_config`).

Reruns: when the output folder already holds a complete summary.json of the same
configuration (same config hash; ``ab.force_rerun``, ``ab.fail_on_guard`` and ``progress``
excluded), run() logs that and returns it without measuring again (still raising
ABGuardError when its guards failed and ab.fail_on_guard is set); ``ab.force_rerun=true``
measures anew. An unfinished run in the folder (interrupted, or blocks without a finished summary)
is measured again from the start after its files move to ``unfinished-<n>/`` there, and a finished run
that a new one replaces (another config, or ab.force_rerun) moves to ``previous-<n>/``: nothing measured
is overwritten.
A rerun of a sweep with the same ``hydra.sweep.dir`` therefore only runs the jobs that
did not finish.

HTTP arms: an arm with ``ab.arms.<arm>.http`` set (conf/ab/http_full_vs_ragged.yaml) is an OpenAI-compatible
server instead of an engine in this process: its launch command is started before each of its blocks,
health-checked, warmed up and stopped after the block (so the two arms' servers never share the node), its
requests are streamed (closed loop or Poisson, as for an in-process arm), and its acceptance and engine counters
are read from its responses and its Prometheus counters by delta per block (:mod:`runners.ab_http`,
:mod:`dspark.bench.http`). The schedule, statistics and report are the same; the guards say what an HTTP arm
cannot give.

Engines: run(cfg, engine_factory=...) takes a callable ``(cfg, arm_engine_cfgs) -> {"A":
Engine, "B": Engine}`` (one engine per in-process arm, the keys of ``arm_engine_cfgs``); the default,
:func:`default_engine_factory`, loads the configured target and drafter. Test hook: with the environment variable ``DSPARK_TEST_TINY_MODELS=1``
the default factory instead builds the tiny random models of ``tests/tiny.py`` with a
character tokenizer, so that whole Hydra multiruns (subprocesses) finish in seconds in
the test suite. Its speed numbers mean nothing; never set it for a real measurement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationValidationError

from dspark.bench.fingerprint import config_hash, device_telemetry, node_fingerprint
from dspark.atomic import atomic_write, atomic_write_text
from dspark.bench.compiles import TritonCompiles
from dspark.bench.gc_pauses import GcPauses
from dspark.bench.guards import (FULL_PRECISION_DTYPES, ABGuardError, GuardResult, did_nothing_guard, errors_guard,
                                 lossless_guard, nothing_compared_guard, trim_expected)
from dspark.bench.metrics import (RequestRecord, aggregate_block, finish_reason_counts, prediction_health,
                                  requests_dataframe, truncation_counts)
from dspark.bench.report import (KEPT_RUN_PREFIXES, UnreadableSummaryError, read_summary, render_console_table,
                                 verdict_note, write_report)
from dspark.bench.schedule import build_schedule, first_arm_by_block
from dspark.bench.statistics import compare_blocks
from dspark.bench.wandb_log import WandbLogger
from dspark.bench.wandb_names import ab_run_names
from dspark.config import ConfigError, EngineConfig
from dspark.engine import Engine
from runners import ab_http
from runners.common import TINY_MODELS_ENV, TinyCharTokenizer, tiny_models, tiny_models_requested
from runners.config_keys import schema_at, unknown_keys, unknown_keys_message
from runners.hydra_main import reported_errors, runner_main
from runners.job_status import in_multirun, write_job_status
from runners.schema import (ABSchema, EngineSchema, LoadMode, profile_context, to_engine_config,
                            to_profile_settings)
from runners.sweep_dirs import hydra_job_name
from workloads.registry import build_workload, make_spec

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]


HEADLINE = "output_tokens_per_s"
# The throughput inside each block's full-load window, without its drain (dspark.bench.metrics.full_load_window).
FULL_LOAD = "steady_output_tokens_per_s"
ARMS = ("A", "B")
TEST_HOOK_NAMES = (TINY_MODELS_ENV, TinyCharTokenizer)  # the tiny-model test hook, also importable from here
LOAD_MODES = tuple(m.value for m in LoadMode)
# Keys that do not change what is measured: left out of the config hash that decides reruns.
UNHASHED_KEYS = (("ab", "force_rerun"), ("ab", "fail_on_guard"), ("progress",))
# A summary.json holding all of these was written by a run that finished.
COMPLETE_SUMMARY_KEYS = ("experiment", "headline_metric", "statistics", "verdict", "guards", "guards_passed",
                         "arms", "counters", "schedule", "fingerprint", "config_hash")

EngineFactory = Callable[[DictConfig, Mapping[str, EngineConfig]], Mapping[str, Engine]]


class ArmFailed(RuntimeError):
    """An arm raised mid-run; finished blocks are already on disk."""


# ---- configuration -------------------------------------------------------------------------
def check_keys(cfg: DictConfig) -> None:
    """Refuse keys no schema declares, naming each one, the closest declared keys and those allowed next to it;
    the per-arm engine overrides (a free-form dict) are checked against the engine's schema."""
    bad = unknown_keys(OmegaConf.to_container(cfg, resolve=False), ABSchema)
    engine_keys = {f.name for f in dataclasses.fields(EngineSchema)}
    for arm in ARMS:
        arms = cfg.get("ab", {}).get("arms", {})
        engine = arms.get(arm, {}).get("engine") if arm in arms else None
        for key in (engine or {}):
            if key not in engine_keys:
                bad.append(f"ab.arms.{arm}.engine.{key}")
    if bad:
        raise ConfigError(unknown_keys_message(bad, _schema_at))


def _schema_at(path: str) -> type | None:
    if path.startswith("ab.arms.") and path.endswith(".engine"):
        return EngineSchema
    return schema_at(ABSchema, path)


def in_process_arms(cfg: DictConfig) -> tuple[str, ...]:
    """The arms whose engine runs in this process (the others have ``ab.arms.<arm>.http``: runners.ab_http)."""
    return tuple(arm for arm in ARMS if cfg.ab.arms[arm].get("http") is None)


def arm_engine_configs(cfg: DictConfig) -> dict[str, EngineConfig]:
    """Engine config of each in-process arm: the engine group plus the arm's overrides, validated now (an arm
    served over HTTP runs its server's engine and has none here)."""
    if cfg.load.concurrency < 1:
        raise ConfigError(f"load.concurrency: must be >= 1, got {cfg.load.concurrency}")
    base = OmegaConf.to_container(cfg.engine, resolve=True)
    # The group's own values are checked too, though the arms override some of them: a bad value must
    # not pass silently because no arm happened to use it (the tier ladder is checked per arm below).
    to_engine_config({**base, "tiers": None})
    arm_overrides = {arm: OmegaConf.to_container(cfg.ab.arms[arm].engine, resolve=True) or {}
                     for arm in in_process_arms(cfg)}
    if not arm_overrides:  # every arm served over HTTP: the group configures no engine here (runners.ab_http)
        return {}
    # A value moved off the engine's default (by the command line or the engine group) that no arm uses is
    # refused; the default itself is not (every arm of ab=head_vs_max_prob sets verify, for example).
    defaults = {f.name: f.default for f in dataclasses.fields(EngineSchema) if f.default is not dataclasses.MISSING}
    for key, value in base.items():
        if key != "kernels" and key in defaults and value != defaults[key] and all(
                key in o for o in arm_overrides.values()) and all(o[key] != value for o in arm_overrides.values()):
            per_arm = ", ".join(f"{arm}: {arm_overrides[arm][key]!r}" for arm in arm_overrides)
            raise ConfigError(f"engine.{key}={value!r} has no effect: every arm sets its own ({per_arm}); "
                              f"set it per arm, e.g. ab.arms.B.engine.{key}={value}")
    out = {}
    for arm in arm_overrides:
        overrides = arm_overrides[arm]
        unknown = set(overrides) - set(base)
        if unknown:
            raise ConfigError(f"ab.arms.{arm}.engine: unknown keys {sorted(unknown)}; allowed: {sorted(base)}")
        merged = {**base, **overrides}
        if isinstance(overrides.get("kernels"), dict):  # engine.kernels.* overrides: on top of the group's
            merged["kernels"] = {**(base.get("kernels") or {}), **overrides["kernels"]}
        if merged.get("tiers") is not None and merged.get("verify") != "uniform" and "tiers" not in overrides:
            # A tier ladder (the tiers group) describes uniform verification; arms that verify
            # otherwise have no ladder. At least one arm must use it (checked below).
            merged["tiers"] = None
        try:
            out[arm] = to_engine_config(merged)
        except ConfigError as e:
            raise ConfigError(f"ab.arms.{arm}: {e}") from e
    if out and base.get("tiers") is not None and not any(c.tiers is not None for c in out.values()):
        raise ConfigError(f"engine.tiers={base['tiers']} is set (tiers group) but no arm verifies uniform; "
                          "set ab.arms.B.engine.verify=uniform (or drop the tiers override)")
    for arm in out:
        out[arm].max_num_seqs = int(cfg.load.concurrency)
    return out


def workload_from(cfg: DictConfig):
    if cfg.get("workload") is None:
        raise ConfigError("no workload chosen: add one, e.g. `python -m runners.ab +workload=poetry` "
                          "(agentic, poetry, arena_hard, mixed_chat, custom)")
    w = OmegaConf.to_container(cfg.workload, resolve=True)
    name = w.pop("name")
    return build_workload(make_spec(name, **w))


def check_config(cfg: DictConfig):
    """Every check that needs no model: returns (the in-process arms' engine configs, workload, schedule).

    Raises ConfigError naming the bad key and what is allowed. Called first by run(), so a
    mistake costs no model load; `python -m runners.ab ... --cfg job` prints the config
    without running anything. Types and the allowed values of string choices (load.mode,
    ab.schedule, ab.gc_mode, wandb.mode) are the typed schema's, checked at composition; the
    checks here are ranges and what spans several keys.
    """
    check_interpolations(cfg)
    check_keys(cfg)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"required config value(s) not set (??? in the YAML): {', '.join(missing)}; give them on "
                          f"the command line, e.g. `{missing[0]}=...`")
    ab_http.check_http_arms(cfg, ab_http.http_endpoints(cfg))
    arm_cfgs = arm_engine_configs(cfg)
    if cfg.load.mode == "poisson" and not cfg.load.request_rate > 0:
        raise ConfigError(f"load.request_rate: must be > 0 requests/s for load.mode=poisson, got {cfg.load.request_rate}")
    for key in ("sla_ttft_ms", "sla_tpot_ms"):
        value = cfg.load.get(key)
        if value is not None and not value > 0:
            raise ConfigError(f"load.{key}: must be null (no goodput) or a limit > 0 ms, got {value!r}")
    if cfg.ab.n_blocks < 1:
        raise ConfigError(f"ab.n_blocks: must be >= 1 (each block runs both arms once), got {cfg.ab.n_blocks}")
    if cfg.ab.warmup_requests < 0:
        raise ConfigError(f"ab.warmup_requests: must be >= 0, got {cfg.ab.warmup_requests}")
    if cfg.ab.cooldown_s < 0:
        raise ConfigError(f"ab.cooldown_s: must be >= 0 seconds, got {cfg.ab.cooldown_s}")
    if cfg.ab.distribution_min_tokens < 1 or not 0 < cfg.ab.distribution_alpha < 1:
        raise ConfigError(f"ab.distribution_min_tokens must be >= 1 and ab.distribution_alpha in (0, 1), got "
                          f"{cfg.ab.distribution_min_tokens} and {cfg.ab.distribution_alpha}")
    if not cfg.ab.max_prediction_error >= 0:
        raise ConfigError(f"ab.max_prediction_error: must be >= 0 (a relative error), got {cfg.ab.max_prediction_error}")
    if not 0 < cfg.ab.lossless_alpha < 1:
        raise ConfigError(f"ab.lossless_alpha: must be in (0, 1) (the rate test's significance level), got "
                          f"{cfg.ab.lossless_alpha}")
    if cfg.ab.n_boot < 100:
        raise ConfigError(f"ab.n_boot: must be >= 100 bootstrap resamples, got {cfg.ab.n_boot}")
    cap = cfg.ab.greedy_replica_max_tokens
    if cap is not None and cap < 1:
        raise ConfigError(f"ab.greedy_replica_max_tokens: must be null (no cap) or an integer >= 1, got {cap!r}")
    try:
        to_profile_settings(cfg.ab.profile, context=2)  # a null prompt_len is the workload's context, known later
    except ConfigError as e:
        raise ConfigError(f"ab.profile.{e}") from e
    check_calibration_files(cfg, arm_cfgs)
    workload = workload_from(cfg)
    if not workload.sampling().greedy and workload.spec.greedy_replica_count == 0:
        # Known now, before any model loads: reference_guards will report it as the failed lossless guard.
        log.warning("workload.temperature=%s and workload.greedy_replica_count=0: no output of this run is greedy, "
                    "so its lossless guard compares nothing and fails%s; add workload.greedy_replica_count=1 to "
                    "run the first drawn prompt greedily in both arms as well", workload.spec.temperature,
                    " (ab.fail_on_guard: the run exits 1 after its blocks)" if cfg.ab.fail_on_guard else "")
    schedule = build_schedule(cfg.ab.schedule, int(cfg.ab.n_blocks), seed=int(cfg.ab.seed))
    return arm_cfgs, workload, schedule


def check_calibration_files(cfg: DictConfig, arm_cfgs: Mapping[str, EngineConfig]) -> None:
    """Each speculative arm's engine.confidence_calibration and greedy_confidence_calibration read now, before any
    model loads; an error names the key that set it (the arm's override, or the engine group's)."""
    from dspark.training.calibration import calibration_method_of
    from runners.common import ENGINE_CALIBRATION_KEYS, check_calibration_owner, resolve_drafter_path

    for arm, ecfg in arm_cfgs.items():
        for name in ENGINE_CALIBRATION_KEYS:
            path = getattr(ecfg, name)
            if path is None or ecfg.spec != "dspark":
                continue
            own = name in (cfg.ab.arms[arm].get("engine") or {})
            key = f"ab.arms.{arm}.engine.{name}" if own else f"engine.{name}"
            try:
                calibration_method_of(path)
            except (FileNotFoundError, ValueError) as e:
                raise ConfigError(f"{key}: {e}") from None
            check_calibration_owner(path, resolve_drafter_path(cfg.drafter.path), key)


def check_interpolations(cfg: DictConfig) -> None:
    """Resolve every interpolation now: a value its key's type refuses (wandb.mode from the environment,
    ``${oc.env:WANDB_MODE,offline}``, outside the allowed modes) fails here, naming the key, the value, the
    allowed ones and the environment variable it came from, and not where the value is first read."""
    import re

    try:
        OmegaConf.to_container(cfg, resolve=True)
    except InterpolationValidationError as exc:
        key = str(exc.full_key)
        reason = str(exc.msg).splitlines()[0].split("': ", 1)[-1]  # after "While dereferencing interpolation '...'"
        parent, _, name = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        raw = str(OmegaConf.to_container(node, resolve=False).get(name, ""))
        env = re.search(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)", raw)
        if env is None:
            raise ConfigError(f"{key}: {raw} is refused: {reason}") from exc
        value = os.environ.get(env.group(1))
        raise ConfigError(f"{key}: {value!r} is refused: {reason}; {key} follows the {env.group(1)} environment "
                          f"variable, here {value!r}, unless set on the command line") from exc


def hashed_config(cfg: DictConfig) -> dict:
    """The resolved config that identifies a measurement (UNHASHED_KEYS removed)."""
    d = OmegaConf.to_container(cfg, resolve=True)
    for path in UNHASHED_KEYS:
        node = d
        for part in path[:-1]:
            node = node.get(part, {})
        node.pop(path[-1], None)
    return d


def _read_summary(out_dir: Path) -> tuple[dict | None, str | None]:
    """(the parsed summary.json of ``out_dir``, None) or (None, why there is none that can be read)."""
    path = out_dir / "summary.json"
    if not path.exists():
        return None, "no summary.json"
    try:
        return read_summary(path), None
    except UnreadableSummaryError as exc:
        return None, str(exc)


def _is_complete(summary: dict | None) -> bool:
    return summary is not None and all(k in summary for k in COMPLETE_SUMMARY_KEYS)


def finished_summary(out_dir: Path, chash: str) -> dict | None:
    """The summary.json in ``out_dir`` when it is complete and of the config with hash ``chash``."""
    path = out_dir / "summary.json"
    summary, problem = _read_summary(out_dir)
    if summary is None:
        if path.exists():
            log.warning("%s: running the experiment again", problem)
        return None
    if not _is_complete(summary):
        missing = [k for k in COMPLETE_SUMMARY_KEYS if k not in summary]
        log.warning("%s lacks %s (an unfinished or older run): running the experiment again", path, missing)
        return None
    if summary.get("interrupted"):
        return None
    if summary["config_hash"] != chash:
        log.warning("%s holds a run of another config (hash %s, this one %s): running this one", path,
                    summary["config_hash"][:12], chash[:12])
        return None
    return summary


def finished_run(out_dir: Path) -> bool:
    """Whether ``out_dir`` holds a finished run (a complete summary.json not marked interrupted)."""
    summary, _ = _read_summary(out_dir)
    return summary is not None and _is_complete(summary) and not summary.get("interrupted")


def partial_run(out_dir: Path) -> str | None:
    """Why ``out_dir`` holds measurements of a run that did not finish (None when it does not): blocks or
    per-block records without a finished summary, or a summary marked interrupted."""
    summary, _ = _read_summary(out_dir)
    if summary is not None and summary.get("interrupted"):
        i = summary["interrupted"]
        return f"interrupted by {i.get('signal')} after {i.get('completed_arm_blocks')} arm-blocks"
    if not _is_complete(summary) and ((out_dir / "blocks.csv").exists()
                                      or any((out_dir / "requests").glob("*.parquet"))):
        return "blocks.csv or requests/ without a finished summary.json"
    return None


RESULT_FILES = ("summary.json", "blocks.csv", "blocks.parquet", "requests.parquet", "requests", "report.md",
                "report_appendix.md", "wandb", "servers")  # servers/: the logs of HTTP arms' launched servers


def keep_earlier_run(out_dir: Path, prefix: str = "unfinished") -> Path:
    """Move a run's results (summary, blocks, per-block requests, report, plots, W&B runs, the logs of its served
    arms) into ``out_dir/<prefix>-<n>/`` before a new run writes there: a rerun of an interrupted run, or of a
    sweep whose job crashed, measures again without losing what the first attempt measured (``unfinished``); a
    run of another config, or one measured again with ab.force_rerun, keeps the finished run it replaces
    (``previous``)."""
    if prefix not in KEPT_RUN_PREFIXES:
        raise ValueError(f"prefix: one of {KEPT_RUN_PREFIXES}, got {prefix!r}")
    n = 1
    while (out_dir / f"{prefix}-{n}").exists():
        n += 1
    dest = out_dir / f"{prefix}-{n}"
    dest.mkdir()
    for p in [*(out_dir / name for name in RESULT_FILES), *out_dir.glob("*.png")]:
        if p.exists():
            p.rename(dest / p.name)
    return dest


# ---- engines -------------------------------------------------------------------------------
def real_engine_factory(cfg: DictConfig, arm_cfgs: Mapping[str, EngineConfig]) -> dict[str, Engine]:
    """The first arm from the configured model/drafter; the other shares its target (and drafter when both
    speculate). ``arm_cfgs`` holds the in-process arms only."""
    from runners.common import build_engine

    first, *others = list(arm_cfgs)
    engines: dict[str, Engine] = {first: build_engine(cfg, arm_cfgs[first])}
    for arm in others:
        engines[arm] = Engine(engines[first].target, engines[first].tokenizer, arm_cfgs[arm],
                              _drafter_for(cfg, engines[first], arm_cfgs[arm]))
    return engines


def tiny_engine_factory(cfg: DictConfig, arm_cfgs: Mapping[str, EngineConfig]) -> dict[str, Engine]:
    """Test hook (DSPARK_TEST_TINY_MODELS=1): the in-process arms on the random models of tests/tiny.py."""
    target, drafter, tok = tiny_models()
    return {arm: Engine(target, tok, ecfg, drafter if ecfg.spec == "dspark" else None)
            for arm, ecfg in arm_cfgs.items()}


def _tiny_models_requested() -> bool:
    return tiny_models_requested()


def default_engine_factory(cfg: DictConfig, arm_cfgs: Mapping[str, EngineConfig]) -> dict[str, Engine]:
    if _tiny_models_requested():
        log.warning("%s=%s: benchmarking the TINY RANDOM test models, not %s (test hook; the speed numbers "
                    "mean nothing)", TINY_MODELS_ENV, os.environ[TINY_MODELS_ENV], cfg.model.source)
        return tiny_engine_factory(cfg, arm_cfgs)
    return real_engine_factory(cfg, arm_cfgs)


def attach_cost_tables(cfg: DictConfig, arm_cfgs: dict[str, EngineConfig], engines: dict[str, Engine],
                       context: int | None = None) -> dict:
    """Give every trimming arm without a cost table the one profiled for this node; describe each arm's table.

    "Profile this node once, reuse the table": the table is looked up under paths.cost_tables
    by the engine's fingerprint and the ab.profile settings, reused when its fit passed the
    quality check, and otherwise profiled first with those settings (the PNG of its measured
    curve is saved beside it). The arm's engine is rebuilt around the same model weights.
    Returns, per arm with a table, :func:`dspark.profiler.describe_table`'s record: path, how
    it was obtained (configured / reused from cache / profiled now / shared for the oracle
    bound), fingerprint digest, fit quality, settings and plot. ``context``: the prompt length the
    profile runs at when ab.profile.prompt_len is null (:func:`runners.schema.profile_context` of
    this A/B's prompts).
    """
    import dataclasses

    from dspark.cost_table import CostTable, CostTableError
    from dspark.profiler import ProfileError, ProfileRefusedError, describe_table, find_or_profile

    settings = to_profile_settings(cfg.ab.profile, context=context)
    used: dict[str, dict] = {}
    for arm in engines:
        ecfg = arm_cfgs[arm]
        if ecfg.verify == "full" or ecfg.cost_table is not None:
            if ecfg.cost_table is not None:
                try:
                    table = CostTable.load(ecfg.cost_table)
                except (OSError, CostTableError):  # the engine loaded it; the record only describes it
                    table = None
                used[arm] = describe_table(ecfg.cost_table, table, "configured")
            continue
        e = engines[arm]
        try:
            obtained = find_or_profile(e, cfg.paths.cost_tables, settings, log.info, progress=bool(cfg.progress))
        except ProfileError as exc:  # the same error, naming the settings as this runner's keys
            message = f"the cost-table profile of arm {arm} (its settings are ab.profile.*): {exc}"
            raise (type(exc)(message, exc.measurements, exc.table, exc.samples)
                   if isinstance(exc, ProfileRefusedError) else type(exc)(message)) from exc
        arm_cfgs[arm] = dataclasses.replace(ecfg, cost_table=str(obtained.path))
        engines[arm] = Engine(e.target, e.tokenizer, arm_cfgs[arm], e.drafter)
        used[arm] = obtained.describe()
    # A verify-all arm on the same node gets the table too: it prices that arm's oracle bound
    # (what an all-knowing scheduler would have delivered on the same acceptances).
    for arm in engines:
        other = used.get("B" if arm == "A" else "A")
        ecfg = arm_cfgs[arm]
        if ecfg.verify == "full" and ecfg.spec == "dspark" and ecfg.cost_table is None and other is not None:
            e = engines[arm]
            try:
                arm_cfgs[arm] = dataclasses.replace(ecfg, cost_table=other["path"])
                engines[arm] = Engine(e.target, e.tokenizer, arm_cfgs[arm], e.drafter)
                shared = {k: v for k, v in other.items() if k not in ("profile_s", "replaced")}  # this arm's own
                used[arm] = {**shared, "how": "shared for the oracle bound"}
            except ValueError as exc:  # another drafter or dtype (a foreign table): no oracle, and say why
                arm_cfgs[arm] = ecfg
                used[arm] = {"path": None, "how": f"no oracle bound: {exc}"}
    for arm, record in used.items():
        if record.get("path"):
            log.info("cost table of arm %s: %s (%s; fingerprint %s; fit: %s)", arm, record["path"], record["how"],
                     record.get("fingerprint"), record.get("fit_summary") or "not recorded")
    return used


def _drafter_for(cfg: DictConfig, engine_a: Engine, ecfg_b: EngineConfig):
    """The second arm shares the first arm's drafter when both speculate; else loads one if it needs it."""
    if ecfg_b.spec == "off":
        return None
    if engine_a.drafter is not None:
        return engine_a.drafter
    from runners.common import build_engine

    return build_engine(cfg, ecfg_b).drafter


def _checked_engines(engines: Any, arms: Any = ARMS) -> dict[str, Engine]:
    """The factory's engines, one for each in-process arm of ``arms``."""
    if not isinstance(engines, Mapping) or set(engines) != set(arms):
        got = sorted(engines) if isinstance(engines, Mapping) else type(engines).__name__
        wanted = ", ".join(f"'{arm}': Engine" for arm in arms)
        raise TypeError(f"engine_factory must return {{{wanted}}}, got {got}")
    return dict(engines)


# ---- running one arm over one block ----------------------------------------------------------
def drive(engine: Engine, inputs: list, params: list, ids: list[str], load: DictConfig, seed: int,
          on_finished: Callable[[int], Any] | None = None):
    """Closed loop (at most load.concurrency requests in the engine; the next is submitted as one finishes, as
    `vllm bench serve --max-concurrency` sends it) or Poisson arrivals. Returns the outputs in input order, the
    wall seconds, and each request's scheduled arrival on the perf_counter clock (closed loop: the block's start;
    Poisson: its arrival), from which its queue wait is measured apart from its TTFT. ``on_finished(n)`` is
    told of the requests as they finish (or are refused), n at a time: a progress bar's update."""
    if load.mode not in LOAD_MODES:
        raise ConfigError(f"load.mode: {load.mode!r} not in {list(LOAD_MODES)}")
    from dspark.bench.http.load import arrival_offsets
    from dspark.engine import RequestError
    from dspark.request import RequestOutput

    n = len(inputs)
    rate = load.request_rate if load.mode != "closed" else 0.0  # (a closed-loop load needs no rate)
    offsets = arrival_offsets(n, load.mode, rate, seed)  # the same draws as an HTTP arm's
    limit = int(load.concurrency) if load.mode == "closed" else n
    t0 = time.perf_counter()
    outs: list[Any] = [None] * n
    order: dict[int, int] = {}
    sent = 0
    while sent < n or engine.has_unfinished():
        now = time.perf_counter() - t0
        while sent < n and len(order) < limit and offsets[sent] <= now:
            try:
                order[engine.add_request(inputs[sent], params[sent], user_id=ids[sent])] = sent
            except (RequestError, ConfigError) as exc:  # refused: an errored output, as Engine.generate gives
                at = time.perf_counter()
                outs[sent] = RequestOutput(-1, ids[sent], [], [], "", "error", str(exc), 0, [], [], [], [], at, None,
                                           at, [], [], 0)
                if on_finished is not None:
                    on_finished(1)
            sent += 1
        if engine.has_unfinished():
            finished = engine.step()
            for o in finished:
                outs[order.pop(o.req_id)] = o
            if finished and on_finished is not None:
                on_finished(len(finished))
        elif sent < n:
            time.sleep(min(0.01, max(0.0, offsets[sent] - now)))
    return outs, time.perf_counter() - t0, (t0 + offsets).tolist()


def sla_limits(load: DictConfig) -> dict[str, float | None]:
    """The service level of load.sla_ttft_ms / load.sla_tpot_ms, in seconds, as aggregate_block takes it."""
    ttft, tpot = load.get("sla_ttft_ms"), load.get("sla_tpot_ms")
    return {"sla_ttft_s": None if ttft is None else float(ttft) / 1e3,
            "sla_tpot_s": None if tpot is None else float(tpot) / 1e3}


def check_prompt_lengths(token_ids: Mapping[str, list[int]], arm_cfgs: Mapping[str, EngineConfig]) -> None:
    """Refuse, before any block runs, prompts the context cannot hold with one generated token (the engine
    would refuse each of them at every block, and the run would end on the errors guard)."""
    max_len = min(c.max_model_len for c in arm_cfgs.values())
    long = sorted(((len(ids), pid) for pid, ids in token_ids.items() if len(ids) >= max_len), reverse=True)
    if long:
        shown = ", ".join(f"{pid!r} ({n} tokens)" for n, pid in long[:5])
        raise ConfigError(f"{len(long)} prompt(s) do not fit engine.max_model_len={max_len} with one generated "
                          f"token: {shown}; raise engine.max_model_len or drop them from the workload")


def tokenize_prompt(tok, prompt) -> list[int]:
    """A workload prompt's token ids, as the engine would make them (chat template for messages)."""
    return tok.encode_chat(prompt.messages) if prompt.messages is not None else tok.encode(prompt.prompt)


def to_records(outs, arm: str, block: int, scheduled_arrivals=None) -> list[RequestRecord]:
    recs = []
    for o, scheduled in zip(outs, scheduled_arrivals or [None] * len(outs)):
        recs.append(RequestRecord(
            request_id=str(o.user_id), arm=arm, block=block, prompt_tokens=len(o.prompt_token_ids),
            output_token_ids=list(o.token_ids), arrival_s=o.arrival_time, first_token_s=o.first_token_time,
            finish_s=o.finish_time, chunk_times_s=list(o.chunk_times), chunk_tokens=list(o.chunk_sizes),
            accept_lengths=list(o.accept_lengths),
            verify_lengths=list(o.verify_lens), per_position_accepts=list(o.pos_accepted),
            per_position_reached=list(o.pos_reached), error=o.error,
            finish_reason=o.finish_reason, scheduled_arrival_s=scheduled))
    return recs


def write_blocks_csv(rows: list[dict], path: Path) -> None:
    """blocks.csv (the scalar columns) and blocks.parquet beside it (every column, the list-valued ones such as
    per-position acceptance as list columns), which runners.report reads back."""
    frame = pd.DataFrame(rows)
    lists = [c for c in frame.columns if frame[c].map(lambda v: isinstance(v, (list, tuple))).any()]
    atomic_write(path, lambda tmp: frame.drop(columns=lists).to_csv(tmp, index=False))
    atomic_write(path.with_suffix(".parquet"), lambda tmp: frame.to_parquet(tmp, index=False))


def _raise_on_failed_guards(cfg: DictConfig, summary: dict) -> None:
    if cfg.ab.fail_on_guard:
        failed = [g for g in summary["guards"] if not g["passed"]]
        if failed:
            raise ABGuardError("; ".join(f"{g['name']}: {g['message']}" for g in failed))


# ---- the experiment --------------------------------------------------------------------------
def run(cfg: DictConfig, engine_factory: EngineFactory | None = None) -> dict:
    """Run the A/B experiment of ``cfg``; return (and write) its summary.

    ``engine_factory(cfg, arm_engine_cfgs) -> {"A": Engine, "B": Engine}`` builds the two
    engines (default: :func:`default_engine_factory`). Raises ConfigError before any model
    loads, ArmFailed when an arm raises mid-run (finished blocks stay in blocks.csv), and
    ABGuardError after writing every result when a guard failed and ab.fail_on_guard is set.
    """
    arm_cfgs, workload, schedule = check_config(cfg)  # every config error surfaces before any model loads
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    endpoints = ab_http.http_endpoints(cfg)
    # The HTTP arms' servers (none start before their first block) are stopped however the run ends.
    with output_folder_lock(out_dir), ab_http.HttpArms(endpoints, out_dir, int(cfg.load.concurrency)) as http_arms:
        return _run_in(cfg, engine_factory, arm_cfgs, workload, schedule, out_dir, http_arms)


class output_folder_lock:
    """An exclusive lock on ``out_dir/.lock`` for as long as a run writes there: a second run in the same
    folder (the same ``hydra.run.dir``, or two started in the same second under the default name) is
    refused with a ConfigError instead of both writing the same files. The OS drops the lock when the
    process ends, however it ends."""

    def __init__(self, out_dir: Path):
        self.path = out_dir / ".lock"
        self._file = None

    def __enter__(self) -> "output_folder_lock":
        import fcntl

        self._file = self.path.open("a+")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise ConfigError(f"{self.path.parent} is in use by another run ({holder}); give this run its own "
                              f"folder (hydra.run.dir=...) or wait for that one to finish") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()}")
        self._file.flush()
        return self

    def __exit__(self, *exc) -> None:
        import fcntl

        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()


def _run_in(cfg: DictConfig, engine_factory, arm_cfgs, workload, schedule, out_dir: Path,
            http_arms: ab_http.HttpArms) -> dict:
    """run()'s work once its output folder is locked. ``arm_cfgs``: the in-process arms' engine configs;
    ``http_arms``: the arms served over HTTP."""
    hashed = hashed_config(cfg)
    chash = config_hash(hashed)
    if not cfg.ab.get("force_rerun", False):
        done = finished_summary(out_dir, chash)
        if done is not None:
            log.info("%s already holds a finished run of this config (hash %s): returning it without running; "
                     "set ab.force_rerun=true to measure again", out_dir / "summary.json", chash[:12])
            _raise_on_failed_guards(cfg, done)
            return done
    partial = partial_run(out_dir)
    if partial:
        kept = keep_earlier_run(out_dir)
        log.warning("%s held an unfinished run (%s): its files moved to %s; measuring from the start", out_dir,
                    partial, kept)
    elif finished_run(out_dir):  # another config's, or this one's measured again (ab.force_rerun)
        kept = keep_earlier_run(out_dir, "previous")
        log.warning("%s held a finished run this one replaces: its files moved to %s", out_dir, kept)
    prompts = workload.prompts()  # a bad custom file fails here, still before any model loads
    replicas = workload.greedy_replicas()
    ab_http.check_prompt_kinds(http_arms.endpoints, [*prompts, *replicas])
    identity = {arm: vars_of(arm_cfgs[arm]) if arm in arm_cfgs else {"http": http_arms.endpoints[arm].describe()}
                for arm in ARMS}
    names = ab_run_names(cfg.experiment, out_dir, {arm: (cfg.ab.arms[arm].label, identity[arm]) for arm in ARMS},
                         **_hydra_job())
    logger = WandbLogger(**OmegaConf.to_container(cfg.wandb, resolve=True), names=names,
                         dir=out_dir)  # refuses online mode without an API key, before loading

    factory = engine_factory or default_engine_factory
    engines = _checked_engines(factory(cfg, arm_cfgs), list(arm_cfgs)) if arm_cfgs else {}
    # An in-process arm's tokenizer; an A/B of HTTP arms only leaves tokenization to the servers.
    tok = next((e.tokenizer for e in engines.values()), None)
    params = [workload.sampling_for(p) for p in prompts]
    ids = [p.id for p in prompts]
    # Prompts are tokenized (chat template applied) once, before any timed block, and both arms get the
    # same token ids: a serving front end tokenizes a request as it arrives, beside the engine loop, so a
    # closed-loop block that queues every request at once must not bill the whole workload's tokenization
    # to its first step (0.5-0.9 s of a 2.5-3.5 s block at 1,024 requests on the H200).
    start = time.perf_counter()
    token_ids = {p.id: tokenize_prompt(tok, p) for p in prompts} if tok is not None else {}
    tokenize_s = time.perf_counter() - start
    inputs = [token_ids[p.id] for p in prompts] if tok is not None else []
    length_stats = None  # HTTP arms only: from the servers' prompt token counts, after the blocks
    if tok is not None:
        check_prompt_lengths(token_ids, arm_cfgs)
        length_stats = workload.length_stats(lambda p: len(token_ids[p.id]))  # the same prompts, tokenized above
    context = None  # ab.profile.prompt_len=null: profile at this A/B's own context
    if inputs and cfg.ab.profile.prompt_len is None:
        context = profile_context([len(t) for t in inputs], [sp.max_tokens for sp in params])
    cost_tables = attach_cost_tables(cfg, arm_cfgs, engines, context)
    http_requests = ab_http.http_requests(prompts, params)

    config_dict = OmegaConf.to_container(cfg, resolve=True)
    for arm in ARMS:  # an in-process arm's config also names the checkpoints it runs (Engine.models)
        logger.start_arm(arm, config={**config_dict, "models": engines[arm].models()} if arm in engines
                         else config_dict)

    # Warm-up per arm (first requests of the workload), then measured blocks.
    warm = int(cfg.ab.warmup_requests)
    if warm and cfg.ab.warmup_full_batch:  # the first timed block must not be the first at full batch depth
        warm = max(warm, min(int(cfg.load.concurrency), len(prompts)))
    # An HTTP arm warms its server up with the same requests after every launch (dspark.bench.http.arm).
    http_arms.set_warmup(ab_http.warmup_requests(http_requests, warm))
    for arm in engines:
        if warm:
            e = engines[arm]
            try:
                # Warm-up exercises every code path (prefill, drafting, verification); its
                # output length does not matter, so it is capped to keep CPU runs short.
                e.generate(inputs[:warm], [dataclasses.replace(p, max_tokens=min(p.max_tokens, 64))
                                           for p in params[:warm]], ids=ids[:warm])
            except Exception as exc:
                logger.close()
                raise ArmFailed(f"arm {arm} failed during warm-up: {type(exc).__name__}: {exc}") from exc
            e.reset()
    # Every graph a run can replay, captured now: a capture inside a timed block synchronises the device
    # and compiles, which would be billed to that block (counted per block as counter/graphs_captured).
    captured_ahead = {}
    for arm in engines:
        e = engines[arm]
        if cfg.ab.capture_before_timing:
            start = time.perf_counter()
            n = e.capture_graphs(params)
            captured_ahead[arm] = {"graphs": n, "seconds": round(time.perf_counter() - start, 2)}
            if n:
                log.info("arm %s: %d CUDA graphs captured before the timed blocks (%.1f s)", arm, n,
                         captured_ahead[arm]["seconds"])
        if cfg.ab.device_timing and e.graph is not None and e.graph.use_graphs:
            e.graph.start_timing()  # re-armed by every reset(): device idle share per block

    records: list[RequestRecord] = []
    block_rows: list[dict] = []
    outputs: dict[str, dict[int, dict[str, list[int] | None]]] = {"A": {}, "B": {}}  # None: ids unknown (HTTP)
    texts: dict[str, dict[int, dict[str, str]]] = {"A": {}, "B": {}}
    first_arm = first_arm_by_block(schedule)
    blocks_csv = out_dir / "blocks.csv"
    from tqdm.auto import tqdm

    bar = tqdm(schedule, desc=f"A/B {cfg.experiment}", unit="arm-block", disable=not cfg.progress)
    # The collector over the timed blocks (ab.gc_mode, default freeze: what is alive after the warm-up and
    # the captures is never scanned again, as serving engines do after start-up); its pauses per block
    # go to blocks.csv (gc/...), so a full collection inside a block is seen, not guessed.
    interrupts = _Interrupts(block_rows, len(schedule))
    with (GcPauses(str(cfg.ab.gc_mode)) as gc_pauses, TritonCompiles() as compiles,
          interrupts.catch(TIMED_BLOCKS)):
        _run_blocks(bar, engines, inputs, params, ids, cfg, first_arm, logger, block_rows, records, outputs,
                    blocks_csv, gc_pauses, compiles, http_arms, http_requests, texts)

    # Greedy replicas: sampled workloads cannot be compared token by token, their greedy copies can.
    replica_outputs: dict[str, dict[str, list[int] | None]] = {}
    replica_texts: dict[str, dict[str, str]] = {}
    prompt_ids = dict(token_ids)  # what the lossless guard re-scores outputs after (the replicas' join below)
    if replicas and interrupts.record is None:
        r_params = _replica_params(cfg, workload, replicas)
        r_ids = [p.id for p in replicas]
        if tok is not None:
            r_inputs = [tokenize_prompt(tok, p) for p in replicas]
            prompt_ids.update(zip(r_ids, r_inputs))
        with interrupts.catch(GREEDY_REPLICAS):
            for arm in ARMS:
                try:
                    if arm in http_arms:
                        results = _http_untimed(http_arms[arm], ab_http.http_requests(replicas, r_params), cfg)
                        replica_outputs[arm] = {r.request_id: r.token_ids for r in results}
                        replica_texts[arm] = {r.request_id: r.text for r in results}
                        continue
                    engines[arm].reset()
                    outs = engines[arm].generate(r_inputs, r_params, ids=r_ids)
                except Exception as exc:
                    logger.close()
                    raise ArmFailed(f"arm {arm} failed on the greedy replicas: {type(exc).__name__}: {exc}; all "
                                    f"{len(block_rows)} arm-blocks are in {blocks_csv}") from exc
                replica_outputs[arm] = {str(o.user_id): list(o.token_ids) for o in outs}
                replica_texts[arm] = {str(o.user_id): o.text for o in outs}

    def reference() -> list[GuardResult]:
        """The guards that judge the outputs with arm A's target in this process, after A's lossless control run
        (:func:`reference_guards`); an A/B with an HTTP arm calls them only where they can judge (ab_http). An
        interrupt after the timed blocks leaves them unjudged (the ``interrupted`` guard says so)."""
        if interrupts.record is not None and interrupts.record["phase"] != TIMED_BLOCKS:
            return []
        with interrupts.catch(REFERENCE_GUARDS):
            control = None
            if interrupts.record is None:
                control = run_lossless_control(cfg, arm_cfgs, engines, workload, inputs, params, ids, replicas, tok,
                                               logger, blocks_csv, len(block_rows))
            return reference_guards(cfg, arm_cfgs["A"].dtype, engines, workload, outputs, replica_outputs,
                                    prompt_ids, control, dict(zip(ids, params)),
                                    replicas_skipped=interrupts.record is not None)
        return []  # interrupted while judging

    blocks_df = pd.DataFrame(block_rows)
    requests_df = requests_dataframe(records)
    atomic_write(out_dir / "requests.parquet", lambda tmp: requests_df.to_parquet(tmp, index=False))
    paired = _paired_blocks(blocks_df)
    compared = {HEADLINE: "higher", "requests_per_s": "higher"}
    left_out = {}  # metrics recorded per block but not compared, and why
    for metric in (FULL_LOAD, "goodput_tokens_per_s", "goodput_requests_per_s"):  # (compared as ratios: every block above 0)
        if metric not in blocks_df:
            continue
        values = pd.to_numeric(blocks_df[metric], errors="coerce")
        if bool((values > 0).all()):
            compared[metric] = "higher"
        else:
            left_out[metric] = (f"{int((~(values > 0)).sum())} of {len(values)} arm-blocks at 0 or unmeasured: B vs A "
                                "is a ratio of blocks, undefined there (blocks.csv holds the values)")
            log.warning("%s not compared: %s", metric, left_out[metric])
    stats = (compare_blocks(paired, compared, n_boot=int(cfg.ab.n_boot), seed=int(cfg.ab.seed))
             if len(paired) else {})
    # Each arm's engine configuration: configured (in-process), reported by its server (HTTP), or None (unknown).
    engine_cfgs = {arm: arm_cfgs[arm] if arm in arm_cfgs else ab_http.engine_config_of(http_arms[arm]) for arm in ARMS}
    if http_arms:
        guards = ab_http.http_guards(cfg, workload, records, outputs, texts, replica_outputs, replica_texts, block_rows,
                                     engine_cfgs, http_arms, arm_did_nothing_guard,
                                     reference if "A" in engines else None)
    else:
        guards = [errors_guard(records), *reference(),
                  *(arm_did_nothing_guard(arm, arm_cfgs[arm], block_rows) for arm in ARMS)]
    for arm in http_arms.arms:
        served_table = ab_http.served_cost_table(http_arms[arm])
        if served_table is not None:
            cost_tables[arm] = served_table
    if length_stats is None:  # every arm over HTTP: the prompts' lengths as the servers counted them
        length_stats = _served_length_stats(workload, records)
    interrupted = interrupts.record
    if interrupted is not None:
        guards.append(interrupted_guard(interrupted))
    counters = {arm: _sum_counters([r for r in block_rows if r["arm"] == arm]) for arm in ARMS}
    summary = {
        "experiment": cfg.experiment,
        "headline_metric": HEADLINE,
        "statistics": {k: v.to_dict() for k, v in stats.items()},
        "statistics_left_out": left_out,
        "verdict": stats[HEADLINE].verdict if stats else "interrupted before a block ran in both arms",
        "guards": [g.to_dict() for g in guards],
        "guards_passed": all(g.passed for g in guards),
        "arms": {arm: (_arm_description(cfg, arm, arm_cfgs[arm], engines[arm]) if arm in engines
                       else ab_http.describe(http_arms[arm], cfg.ab.arms[arm].label)) for arm in ARMS},
        "counters": counters,
        "cost_tables": cost_tables,
        "workload": {**workload.describe(), "length_stats": length_stats, "tokenize_s": round(tokenize_s, 3)},
        "schedule": [list(x) for x in schedule],
        "fingerprint": node_fingerprint(hashed, ROOT),
        "config_hash": chash,
        "sweep_params": _sweep_params(),
        "sweep_job": _sweep_job(),
        "timing_health": timing_health(block_rows, float(cfg.ab.max_first_block_slowdown), captured_ahead),
    }
    if interrupted is not None:
        summary["interrupted"] = interrupted
    if not engines:
        pass  # no engine in this process
    elif factory is not default_engine_factory:
        summary["engine_factory"] = getattr(factory, "__qualname__", repr(factory))
    elif _tiny_models_requested():
        summary["engine_factory"] = f"tiny_engine_factory ({TINY_MODELS_ENV} test hook)"
    # An arm whose planner declined every step ran the same work as verify-all: the verdict must say so.
    summary["verdict_note"] = verdict_note(summary)
    summary["prediction_health"] = prediction_health(counters, float(cfg.ab.max_prediction_error))
    summary["finish_reasons"] = finish_reason_counts(requests_df)
    sla = {"ttft_ms": cfg.load.get("sla_ttft_ms"), "tpot_ms": cfg.load.get("sla_tpot_ms")}
    if any(v is not None for v in sla.values()):
        summary["sla"] = sla
    summary["truncated"] = truncation_counts(requests_df, {arm: c.max_model_len if c is not None else None
                                                           for arm, c in engine_cfgs.items()})
    for arm in ARMS:
        logger.log_requests(arm, [r for r in records if r.arm == arm])
    logger.log_statistics(summary["statistics"], summary["verdict"], HEADLINE)
    summary["wandb"] = logger.status()
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2, default=str))
    write_report(out_dir, summary, blocks_df, requests_df)  # (an interrupted run's too, saying so)
    if cfg.progress:
        from rich.console import Console

        render_console_table(summary, Console(width=max(120, Console().width)))
    logger.log_results(out_dir)  # summary.json, report.md, blocks.csv and the plots, as an artifact
    for arm in ARMS:
        logger.finish_arm(arm, {"verdict": summary["verdict"], "guards_passed": summary["guards_passed"],
                                **{f"truncated/{k}": v for k, v in summary["truncated"].get(arm, {}).items()},
                                **{f"counter/{k}": v for k, v in counters[arm].items()}})
    logger.close()
    if logger.status() != summary["wandb"]:  # what W&B did after summary.json was written (failures, the report)
        summary["wandb"] = logger.status()
        atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2, default=str))
    if interrupted is not None:
        kept = [name for name in ("summary.json", "report.md", "blocks.csv", "requests.parquet", "requests")
                if (out_dir / name).exists()]
        log.error("interrupted (%s): the %d completed arm-blocks are in %s (%s; summary.json marked interrupted)",
                  interrupted["signal"], interrupted["completed_arm_blocks"], out_dir, ", ".join(kept))
        raise SystemExit(130 if interrupted["signal"] == "SIGINT" else 143)
    _raise_on_failed_guards(cfg, summary)
    return summary


def _paired_blocks(blocks_df: pd.DataFrame) -> pd.DataFrame:
    """The rows of blocks that ran in both arms (an interrupted run may end between a block's arms)."""
    if blocks_df.empty:
        return blocks_df
    both = blocks_df.groupby("block")["arm"].nunique()
    return blocks_df[blocks_df["block"].isin(both[both == len(ARMS)].index)]


# Where an interrupt (SIGINT, SIGTERM) can end a run, in order; what the summary then holds differs.
TIMED_BLOCKS, GREEDY_REPLICAS, REFERENCE_GUARDS = "timed blocks", "greedy replicas", "lossless control and guards"


class _Interrupts:
    """A run's first interrupt (SIGINT, SIGTERM) in a phase that may end it: ``record`` is the summary's
    ``interrupted`` entry (None while uninterrupted); ``block_rows`` grows as the arm-blocks finish."""

    def __init__(self, block_rows: list, scheduled: int):
        self.record: dict | None = None
        self._block_rows, self._scheduled = block_rows, scheduled

    @contextlib.contextmanager
    def catch(self, phase: str):
        """Run the block with SIGTERM raising; an interrupt ends the block and is recorded (a later one keeps the
        first one's record), and the run goes on to write its summary."""
        with interrupts_raise():
            try:
                yield
            except (KeyboardInterrupt, RunInterrupted) as exc:
                if self.record is None:
                    self.record = self._record(exc, phase)

    def _record(self, exc: BaseException, phase: str) -> dict:
        name = exc.signal_name if isinstance(exc, RunInterrupted) else "SIGINT"
        done = len(self._block_rows)
        if phase == TIMED_BLOCKS:
            log.warning("%s after %d of %d arm-blocks: writing the summary of the completed blocks (marked "
                        "interrupted); the same command measures again, keeping these files in unfinished-<n>/",
                        name, done, self._scheduled)
        else:
            log.warning("%s during the %s, after all %d arm-blocks: writing the summary with their statistics and "
                        "without the guards not yet judged (marked interrupted)", name, phase, done)
        return {"signal": name, "phase": phase, "completed_arm_blocks": done, "scheduled_arm_blocks": self._scheduled}


def interrupted_guard(interrupted: dict) -> GuardResult:
    """The failing guard of an interrupted run: what its statistics and other guards cover."""
    signal_name, done, scheduled = (interrupted[k] for k in ("signal", "completed_arm_blocks", "scheduled_arm_blocks"))
    if interrupted["phase"] == TIMED_BLOCKS:
        message = (f"{signal_name} after {done} of {scheduled} arm-blocks: statistics and guards cover the "
                   "completed blocks only (no greedy replicas, no lossless control)")
    else:
        message = (f"{signal_name} during the {interrupted['phase']}, after all {done} arm-blocks: the "
                   "statistics cover every block; the lossless guard and the other guards judged with arm A's target "
                   "were not judged")
    return GuardResult("interrupted", False, message, interrupted)


class RunInterrupted(BaseException):
    """SIGTERM arrived while the timed blocks or the guards ran (a BaseException, like KeyboardInterrupt, so no
    ``except Exception`` on the way up mistakes it for an arm failing)."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


class interrupts_raise:
    """While the timed blocks or the guards run, SIGTERM raises :class:`RunInterrupted` in the main thread (SIGINT
    already raises KeyboardInterrupt), so the run can write the summary of what it measured before it exits."""

    def __enter__(self):
        import signal
        import threading

        self._previous = None
        if threading.current_thread() is threading.main_thread():
            def handler(signum, frame):
                raise RunInterrupted(signal.Signals(signum).name)

            self._previous = signal.signal(signal.SIGTERM, handler)
        return self

    def __exit__(self, *exc) -> None:
        import signal

        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _run_blocks(bar, engines, inputs, params, ids, cfg, first_arm, logger, block_rows, records, outputs,
                blocks_csv, gc_pauses, compiles, http_arms=None, http_requests=None, texts=None) -> None:
    """The timed arm-blocks of the schedule (``bar`` iterates it); each block's row is appended to
    ``block_rows`` and blocks.csv is rewritten at once, so a crash keeps the finished blocks. With
    ``progress``, a second bar below counts the requests finished within the arm-block running. An arm in
    ``http_arms`` sends ``http_requests`` to its server (launched and warmed up before its block, stopped after
    it unless it keeps running: runners.ab_http); its outputs' token ids are None where the server gave none."""
    from tqdm.auto import tqdm

    texts = texts if texts is not None else {"A": {}, "B": {}}
    for block, arm in bar:
        served = http_arms is not None and arm in http_arms
        if served:
            try:
                http_arms[arm].open()  # launched, healthy and warmed up (untimed) when it was not serving
            except Exception as exc:
                logger.close()
                raise ArmFailed(f"arm {arm} could not serve block {block}: {type(exc).__name__}: {exc}; the "
                                f"{len(block_rows)} finished arm-blocks are in {blocks_csv}") from exc
        else:
            e = engines[arm]
            e.reset()
        gc_pauses.settle()  # untimed: earlier blocks' objects frozen, not rescanned by this block's collections
        gc_pauses.take()  # count this block's pauses and compilations only
        compiles.take()
        requests_bar = tqdm(total=len(ids), desc=f"block {block} arm {arm}", unit="request", leave=False,
                            position=1, disable=not cfg.progress)
        try:
            if served:
                run = http_arms[arm].run_block(http_requests, block, mode=str(cfg.load.mode),
                                               concurrency=int(cfg.load.concurrency),
                                               rate=float(cfg.load.request_rate), seed=int(cfg.ab.seed) + block,
                                               on_finished=requests_bar.update)
            else:
                outs, wall, scheduled = drive(e, inputs, params, ids, cfg.load, seed=int(cfg.ab.seed) + block,
                                              on_finished=requests_bar.update)
        except Exception as exc:  # keep what finished, then fail loudly
            logger.close()
            raise ArmFailed(f"arm {arm} failed in block {block}: {type(exc).__name__}: {exc}; the "
                            f"{len(block_rows)} finished arm-blocks are in {blocks_csv}") from exc
        finally:
            requests_bar.close()
            if served:
                http_arms[arm].after_block()  # stopped unless it keeps running: the next arm has the node
        if served:
            recs, wall, counters = run.records, run.wall_s, run.counters
            outputs[arm][block] = {r.request_id: r.token_ids for r in run.results}
            texts[arm][block] = {r.request_id: r.text for r in run.results}
        else:
            recs = to_records(outs, arm, block, scheduled)
            outputs[arm][block] = {str(o.user_id): list(o.token_ids) for o in outs}
            texts[arm][block] = {str(o.user_id): o.text for o in outs}
            counters = e.counters()
        records += recs
        # This arm-block's requests on disk at once (one file each: appending never rewrites a finished one).
        block_file = blocks_csv.parent / "requests" / f"block{block}_{arm}.parquet"
        block_file.parent.mkdir(exist_ok=True)
        block_df = requests_dataframe(recs)
        atomic_write(block_file, lambda tmp: block_df.to_parquet(tmp, index=False))
        row = {"block": block, "arm": arm, "first_arm": first_arm[block],
               **aggregate_block(recs, wall, counters, **sla_limits(cfg.load), load_mode=str(cfg.load.mode),
                                 concurrency=int(cfg.load.concurrency)),
               "wall_s": wall}
        if served:  # acceptance pooled from the server's counters when its responses did not carry it
            row.update(run.acceptance)
            row["acceptance_source"] = run.acceptance_source
        compiled = compiles.take()
        if compiled["compiled"] is not None:
            row["compile/triton_kernels"] = compiled["compiled"]
            if compiled["compiled"]:
                row["compile/kernel_names"] = ", ".join(compiled["kernels"])[:500]
        gcs = gc_pauses.take()
        row.update({"gc/collections_gen2": gcs["gc_collections"][2], "gc/collections": sum(gcs["gc_collections"]),
                    "gc/pause_ms_total": gcs["gc_pause_ms_total"], "gc/pause_ms_max": gcs["gc_pause_ms_max"]})
        tel = device_telemetry()
        row.update({f"telemetry/{k}": v for k, v in tel.items() if isinstance(v, (int, float, str, bool))})
        block_rows.append(row)
        write_blocks_csv(block_rows, blocks_csv)
        logger.log_block(arm, block, {k: v for k, v in row.items() if isinstance(v, (int, float))})
        bar.set_postfix({"arm": arm, "tok/s": f"{row.get(HEADLINE, float('nan')):.1f}"})
        if cfg.ab.cooldown_s:
            time.sleep(float(cfg.ab.cooldown_s))


def timing_health(block_rows: list[dict], max_first_slowdown: float, captured_ahead: dict) -> dict:
    """Whether the timed blocks measured steady service: graphs captured inside a timed block (each
    capture synchronises the device and compiles), and each arm's first block against its median
    block (a warm-up leak). ``flags`` lists what a reader must know before trusting the numbers."""
    import statistics

    captured = [{"block": r["block"], "arm": r["arm"], "graphs": int(r["counter/graphs_captured"])}
                for r in block_rows if r.get("counter/graphs_captured")]
    flags = [f"block {c['block']} arm {c['arm']}: {c['graphs']} CUDA graph(s) captured inside the timed block"
             for c in captured]
    compiled = [{"block": r["block"], "arm": r["arm"], "kernels": int(r["compile/triton_kernels"]),
                 "names": r.get("compile/kernel_names", "")}
                for r in block_rows if r.get("compile/triton_kernels")]
    flags += [f"block {c['block']} arm {c['arm']}: {c['kernels']} Triton kernel(s) compiled inside the timed block "
              f"({c['names']})" for c in compiled]
    first_vs_median = {}
    for arm in ARMS:
        rows = sorted((r for r in block_rows if r["arm"] == arm), key=lambda r: r["block"])
        values = [r.get(HEADLINE) for r in rows]
        if len(values) < 2 or any(v is None or not math.isfinite(v) or v <= 0 for v in values):
            continue
        ratio = values[0] / statistics.median(values)
        first_vs_median[arm] = round(ratio, 4)
        if ratio < 1.0 - max_first_slowdown:
            gc_ms = rows[0].get("gc/pause_ms_total")
            gc_note = (f"; the garbage collector paused {gc_ms:.0f} ms in it"
                       if isinstance(gc_ms, (int, float)) and math.isfinite(gc_ms) and gc_ms >= 1 else "")
            flags.append(f"arm {arm}: first block at {ratio:.1%} of the median block's {HEADLINE} "
                         f"(more than {max_first_slowdown:.0%} slower: a warm-up leak){gc_note}")
    return {"captured_ahead": captured_ahead, "captured_in_timed_blocks": captured, "compiled_in_timed_blocks": compiled,
            "first_block_vs_median": first_vs_median, "flags": flags}


def _arm_description(cfg: DictConfig, arm: str, ecfg: EngineConfig, engine: Engine) -> dict:
    out = {"label": cfg.ab.arms[arm].label, "engine": vars_of(ecfg), "models": engine.models()}
    ran = vars_of(engine.cfg)
    if ran != out["engine"]:  # the factory built something else than configured: say so next to the result
        out["engine_ran"] = {k: v for k, v in ran.items() if out["engine"].get(k) != v}
    return out


def vars_of(ecfg: EngineConfig) -> dict:
    return dataclasses.asdict(ecfg)


# Counters that are a state at the end of a block, not an amount of it (the service price the planner read last):
# averaged over blocks like ratios, although their names end in _ms.
GAUGE_COUNTERS = ("service_cost/floor_ms", "service_cost/extra_ms")


def _sum_counters(rows: list[dict]) -> dict:
    """Counters of one arm over its blocks: counts and times (``*_total``, ``*_ms``) add up; ratios, rates
    (``*_per_ms``), means and gauges (GAUGE_COUNTERS) are averaged over blocks (adding them would be
    meaningless), and the token ratios are recomputed from the summed counts."""
    values: dict[str, list] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("counter/") and isinstance(v, (int, float)) and not isinstance(v, bool):
                if isinstance(v, float) and math.isnan(v):
                    continue  # a counter this block did not report (CSV round trip)
                values.setdefault(k.split("/", 1)[1], []).append(v)
    out: dict[str, float] = {}
    for name, vs in values.items():
        additive = (all(isinstance(v, int) for v in vs)
                    or name.endswith(("_total", "_on_predicted", "_on_measured", "_ms"))) \
            and not name.endswith("_per_ms") and name not in GAUGE_COUNTERS
        out[name] = sum(vs) if additive else sum(vs) / len(vs)
    if out.get("ceiling_tokens"):
        out["trim_ratio"] = 1.0 - out.get("window_tokens", 0) / out["ceiling_tokens"]
    if out.get("verified_tokens"):
        out["accept_rate"] = out.get("accepted_tokens", 0) / out["verified_tokens"]
    return out


def _hydra_job() -> dict:
    """``sweep_dir`` and ``job_num`` of a Hydra multirun job (its W&B group); {} for a single run or a direct call."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return {}
    return {"sweep_dir": HydraConfig.get().sweep.dir, "job_num": int(HydraConfig.get().job.num)}


def _sweep_params() -> dict:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():  # run() called directly (tests, notebooks): no sweep
        return {}
    return {o.split("=", 1)[0]: o.split("=", 1)[1] for o in HydraConfig.get().overrides.task if "=" in o}


def _sweep_job() -> str | None:
    """A multirun job's short name, the one its folder has after its number (:mod:`runners.sweep_dirs`),
    which the sweep summary shows; None outside a multirun."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return hydra_job_name(HydraConfig.get())


def run_lossless_control(cfg, arm_cfgs, engines, workload, inputs, params, ids, replicas, tok, logger, blocks_csv,
                         n_finished) -> dict | None:
    """The lossless guard's control in reduced precision: arm A's engine again, untimed, on the greedy
    requests the guard compares (the workload, or its greedy replicas) under another batch composition:
    half the running limit and the arrival order reversed. Its outputs part from A's only where rounding
    flips an argmax. None in float32 (exact identity is required there) or with ab.lossless_control off."""
    if arm_cfgs["A"].dtype in FULL_PRECISION_DTYPES or not cfg.ab.lossless_control:
        return None
    if workload.sampling().greedy:
        c_inputs, c_params, c_ids = inputs, params, ids
    elif replicas:
        c_inputs, c_params, c_ids = _replica_requests(cfg, workload, replicas, tok)
    else:
        return None
    e = engines["A"]
    limit = max(1, int(cfg.load.concurrency) // 2)
    e.reset()
    start = time.perf_counter()
    try:
        with e.running_limit(limit):
            outs = e.generate(c_inputs[::-1], c_params[::-1], ids=c_ids[::-1])
    except Exception as exc:
        logger.close()
        raise ArmFailed(f"arm A failed in the lossless control run: {type(exc).__name__}: {exc}; all "
                        f"{n_finished} arm-blocks are in {blocks_csv}") from exc
    log.info("lossless control: arm A on %d greedy requests at running limit %d, reversed order (%.1f s)",
             len(c_ids), limit, time.perf_counter() - start)
    return {"outputs": {str(o.user_id): list(o.token_ids) for o in outs}, "running_limit": limit,
            "order": "reversed", "requests": len(c_ids)}


def _replica_requests(cfg, workload, replicas, tok):
    """The greedy replicas of a sampled workload as (token ids, params, ids) (:func:`_replica_params`)."""
    r_inputs = [tokenize_prompt(tok, p) for p in replicas]
    return r_inputs, _replica_params(cfg, workload, replicas), [p.id for p in replicas]


def _replica_params(cfg, workload, replicas):
    """The greedy replicas' sampling, capped at ab.greedy_replica_max_tokens (the token-exact comparison needs a
    prefix, not whole poems)."""
    cap = cfg.ab.get("greedy_replica_max_tokens")
    r_params = [workload.sampling_for(p, greedy=True) for p in replicas]
    if cap is not None:
        r_params = [dataclasses.replace(p, max_tokens=min(p.max_tokens, int(cap))) for p in r_params]
    return r_params


def _http_untimed(arm, requests, cfg):
    """Untimed requests of an HTTP arm (its server launched, warmed up and stopped around them)."""
    arm.open()
    try:
        return arm.run_untimed(requests, int(cfg.load.concurrency))
    finally:
        arm.after_block()


def _served_length_stats(workload, records) -> dict:
    """The prompts' length statistics from the servers' prompt token counts (usage), for an A/B whose arms are all
    served over HTTP; says why when a prompt's count is missing."""
    counts: dict[str, int] = {}
    for r in records:
        if r.prompt_tokens is not None:
            counts.setdefault(r.request_id, int(r.prompt_tokens))
    missing = [p.id for p in workload.prompts() if p.id not in counts]
    if missing:
        return {"unavailable": f"no server reported the prompt token count (usage.prompt_tokens) of {len(missing)} "
                               f"prompt(s), e.g. {missing[0]!r}"}
    return {**workload.length_stats(lambda p: counts[p.id]), "counted_by": "the servers (usage.prompt_tokens)"}


def _evidence_guard(cfg, engines, scorer, outputs, replica_outputs, prompt_ids, control, dtype,
                    greedy_workload: bool) -> GuardResult:
    """Reduced precision: every greedy output of both arms and of the control, re-scored by a float32 reference of
    arm A's target (dspark/bench/lossless.py). A greedy workload's greedy outputs are every block's (and its greedy
    replicas', when it has some); a sampled workload's are its greedy replicas'. The control ran on the requests of
    the first pair: a greedy workload's, or the replicas."""
    from dspark.bench.lossless import RunOutputs, evidence_lossless_guard

    runs: list[RunOutputs] = []
    pairs: list[tuple[str, str]] = []
    if greedy_workload:
        for block in sorted(set(outputs["A"]) & set(outputs["B"])):
            runs += [RunOutputs(f"{arm}/block{block}", arm, outputs[arm][block]) for arm in ARMS]
            pairs.append((f"A/block{block}", f"B/block{block}"))
    if replica_outputs:
        runs += [RunOutputs(f"{arm}/greedy_replicas", arm, replica_outputs[arm]) for arm in ARMS]
        pairs.append(("A/greedy_replicas", "B/greedy_replicas"))
    control_pair = None
    if control is not None:
        runs.append(RunOutputs("control", "control", control["outputs"]))
        control_pair = (pairs[0][0], "control")
    tok = engines["A"].tokenizer
    from tqdm.auto import tqdm

    def progress(total):  # the bar's update(n), called with the outputs each packed forward scored
        return tqdm(total=total, desc="lossless: fp32 re-scoring", unit="output", disable=not cfg.progress).update

    g = evidence_lossless_guard(runs, pairs, prompt_ids, scorer,
                                control_pair=control_pair, alpha=float(cfg.ab.lossless_alpha), dtype=dtype,
                                decode=lambda ids: tok.decode(ids, skip_special_tokens=False), progress=progress)
    if control is not None:
        g.details["control"] = {k: v for k, v in control.items() if k != "outputs"}
    return g


def distribution_items(blocks: dict) -> list[tuple[str, list[int]]]:
    """(request id, output tokens) for the distribution check: each request's output from ONE block only.

    Every block replays the same requests with the same seeds (``Workload.sampling_for``), and the engine's
    sampling is a pure function of (seed, position) (``dspark.uniforms``), so a request's outputs in different
    blocks are the same draws (target-only: token for token) or share their prefix. Pooling them would count
    each draw up to n_blocks times, and the KS test, which assumes independent PITs, would then reject an exact
    sampler far more often than alpha. Request i (in sorted id order) takes the i-th of its blocks, cyclically,
    so every block contributes and the pooled PITs stay independent."""
    order = sorted(blocks)
    rids = sorted({rid for b in order for rid in blocks[b]})
    items = []
    for i, rid in enumerate(rids):
        have = [b for b in order if rid in blocks[b]]
        items.append((rid, blocks[have[i % len(have)]][rid]))
    return items


def _distribution_guards(cfg, engines, scorer, outputs, sampling_by_id, prompt_ids) -> list[GuardResult]:
    """Sampled requests: each request's tokens from one of the arm's timed blocks (distribution_items) go
    through the randomized PIT under the target's own processed distribution, teacher-forced on the arm's
    prefix in the engine's precision (dspark/bench/distribution.py); a KS test per arm once it has ab.distribution_min_tokens.
    A token the engine-precision forward gives probability 0 but the float32 reference does not is a
    rounding flip at the top-k / top-p boundary (left out of the test, counted); one impossible under
    both fails the arm."""
    from dspark.bench.distribution import distribution_check, request_pits
    from dspark.sampling import RowSampling, processed_probs

    min_tokens, alpha = int(cfg.ab.distribution_min_tokens), float(cfg.ab.distribution_alpha)
    todo = {arm: [(rid, toks) for rid, toks in distribution_items(outputs[arm])
                  if toks and sampling_by_id.get(rid) is not None and sampling_by_id[rid].temperature > 0]
            for arm in ARMS}
    counts = {arm: sum(len(t) for _, t in items) for arm, items in todo.items()}
    if all(n < min_tokens for n in counts.values()):  # too few for a verdict: skip the forwards altogether
        return [GuardResult(f"distribution[{arm}]", True,
                            f"arm {arm}: not enough sampled tokens ({n:,} < ab.distribution_min_tokens={min_tokens:,}): "
                            "no distribution verdict", {"state": "insufficient", "n": n}) for arm, n in counts.items()]
    gen = torch.Generator(device=next(engines["A"].target.parameters()).device).manual_seed(int(cfg.ab.seed))
    pits: dict[str, np.ndarray] = {}
    impossible: dict[str, int] = {}
    boundary: dict[str, int] = {}
    from tqdm.auto import tqdm

    for arm in ARMS:
        values, bad, edge = [], 0, 0
        items = [(prompt_ids[rid], toks) for rid, toks in todo[arm]]
        packed = scorer.iter_logits(items, reference=False)  # the engine's precision, packed forwards
        for i, logits in tqdm(packed, total=len(items), desc=f"distribution: arm {arm}", unit="output",
                              disable=not cfg.progress):
            rid, toks = todo[arm][i]
            params = sampling_by_id[rid]
            u = request_pits(logits, torch.tensor(toks, device=logits.device), params, gen)
            nan = torch.isnan(u)
            if bool(nan.any()):
                ref = scorer.logits(prompt_ids[rid], toks, reference=True)[nan]
                probs = processed_probs(ref, RowSampling([params] * int(nan.sum()), ref.device))
                tok_nan = torch.tensor(toks, device=ref.device)[nan]
                possible = probs.gather(1, tok_nan[:, None])[:, 0] > 0
                edge += int(possible.sum())
                bad += int((~possible).sum())
            values.append(u[~nan].double().cpu().numpy())
        pits[arm] = np.concatenate(values) if values else np.zeros(0)
        impossible[arm], boundary[arm] = bad, edge
    guards = []
    for arm in ARMS:
        other = "B" if arm == "A" else "A"
        res = distribution_check(pits[arm], alpha=alpha, min_tokens=min_tokens, impossible=impossible[arm], arm=arm,
                                 other=pits[other], other_arm=other)
        details = {**res.to_dict(), "state": res.state, "boundary_flips": boundary[arm]}
        message = res.message + (f"; {boundary[arm]} token(s) at the top-k/top-p boundary possible only under the "
                                 "float32 reference (rounding, left out)" if boundary[arm] else "")
        guards.append(GuardResult(f"distribution[{arm}]", res.passed is not False, message, details))
    return guards


def _float64_evidence(checked: list[tuple[GuardResult, Mapping]], target, prompt_ids,
                      batch_invariant: bool = False) -> None:
    """The evidence of failed float32 lossless guards (``checked``: each guard with arm A's outputs it compared):
    each difference inside both outputs gets the two tokens' logit gap in a float64 forward of arm A's target after
    the shared prefix (``float64_gap``, ``float64_prefers`` "A" or "B";
    :func:`dspark.bench.reference.float64_token_gaps`, one float64 copy for all the guards), and each guard's message
    the gaps of its first five. The guards still fail: a gap of 1e-5 names a near-tie that two batch compositions
    rounded apart, a gap of several logits an arm that emitted a token the target does not choose.
    ``batch_invariant``: whether both arms ran ``engine.batch_invariant=true``, under which no rounding can part them
    (each message says which)."""
    from dspark.bench.reference import float64_token_gaps

    found, cases = [], []  # (guard, its differences with two tokens); their cases, in that order
    for g, outputs_a in checked:
        diffs = [d for d in g.details.get("differences", []) if d["token_a"] is not None and d["token_b"] is not None]
        if g.passed or not diffs:
            continue
        key = {str(k): k for k in outputs_a}  # the guard names requests by str(id); prompt_ids shares the ids
        found.append((g, diffs))
        cases += [(prompt_ids[key[d["request_id"]]], list(outputs_a[key[d["request_id"]]])[: d["first_diff_index"]],
                   d["token_a"], d["token_b"]) for d in diffs]
    gaps = iter(float64_token_gaps(target, cases))
    for g, diffs in found:
        for d, gap in zip(diffs, gaps):
            d.update(float64_gap=gap["float64_gap"], float64_prefers="A" if gap["float64_prefers"] == "a" else "B")
        shown = ", ".join(f"{d['request_id']}@{d['first_diff_index']} {d['float64_gap']:.2g} "
                          f"(prefers {d['float64_prefers']})" for d in diffs[:5])
        g.message += f"; float64 logit gap of the two tokens: {shown}"
        g.message += ("; both arms batch-invariant (engine.batch_invariant=true): no rounding parts them"
                      if batch_invariant else "; an arm ran without engine.batch_invariant=true: a tie closer than "
                      "the rounding of its step sizes can part the arms (the mode rules that out)")


def reference_guards(cfg, dtype, engines, workload, outputs, replica_outputs, prompt_ids, control=None,
                     sampling_by_id=None, replicas_skipped: bool = False) -> list[GuardResult]:
    """The guards that judge both arms' outputs with arm A's target in this process (``engines["A"]``): lossless on
    the greedy outputs (each block, or the greedy replicas of a sampled workload), in float32 (``dtype``, arm A's)
    identical token for token, in reduced precision on evidence (:func:`_evidence_guard`, with A's ``control``
    run), and on a sampled workload the distribution check of each arm. An arm's outputs are token ids, however
    they were made (in process, or returned by a server: runners.ab_http.http_guards). ``replicas_skipped``: an
    interrupt during the timed blocks left the greedy replicas unrun."""
    from dspark.bench.reference import ReferenceScorer

    guards: list[GuardResult] = []
    greedy_workload = workload.sampling().greedy
    # One scorer for both reference checks: its float32 copy of A's target is made once, when first needed.
    scorer = ReferenceScorer(engines["A"].target)
    if dtype in FULL_PRECISION_DTYPES:  # float32: the arms' greedy outputs must be identical, token for token
        compared = []
        if greedy_workload:
            for block in sorted(set(outputs["A"]) & set(outputs["B"])):
                compared.append((f"lossless/block{block}", outputs["A"][block], outputs["B"][block]))
        if replica_outputs:
            compared.append(("lossless/greedy_replicas", replica_outputs["A"], replica_outputs["B"]))
        checked = []
        for name, out_a, out_b in compared:
            g = lossless_guard(out_a, out_b, dtype=dtype)
            g.name = name
            checked.append((g, out_a))
        invariant = all(e.cfg.batch_invariant for e in engines.values())
        _float64_evidence(checked, engines["A"].target, prompt_ids, batch_invariant=invariant)
        guards += [g for g, _ in checked]
    elif greedy_workload or replica_outputs:
        guards.append(_evidence_guard(cfg, engines, scorer, outputs, replica_outputs, prompt_ids, control, dtype,
                                      greedy_workload))
    if not greedy_workload and not replica_outputs:
        guards.append(GuardResult("lossless", False, "not judged: the run was interrupted before its greedy replicas "
                                  "ran", {}) if replicas_skipped else nothing_compared_guard())
    if not greedy_workload:
        guards += _distribution_guards(cfg, engines, scorer, outputs, sampling_by_id, prompt_ids)
    return guards


def arm_did_nothing_guard(arm: str, ecfg: EngineConfig, block_rows: list[dict]) -> GuardResult:
    """The did_nothing guard of one arm: what its engine configuration ``ecfg`` expects to run, against its
    counters summed over its blocks (in-process: the engine's; HTTP: its server's, by delta)."""
    rows = [r for r in block_rows if r["arm"] == arm]
    if not rows:  # an interrupt came before the arm's first block ended
        return GuardResult(f"did_nothing[{arm}]", False, f"arm {arm}: not judged: it completed no block", {})
    counters = _sum_counters(rows)
    # engine.force_verify_len / force_budget_frac replace the planner: such an arm must trim as forced.
    forced = ecfg.force_verify_len is not None or ecfg.force_budget_frac is not None
    return did_nothing_guard(arm, vars_of(ecfg), counters,
                             expects_trim=trim_expected(ecfg.verify, forced),
                             forces_trim=forced and trim_expected(ecfg.verify, False),
                             # CUDA graphs can only replay on a GPU; on a CPU the same
                             # device-resident steps run uncaptured (eager_reason/cpu).
                             expects_graphs=ecfg.cuda_graphs and ecfg.device.startswith("cuda"),
                             expects_speculation=ecfg.spec != "off",
                             expects_draft_free=ecfg.draft_free_steps and ecfg.spec != "off",
                             expects_service_cost=ecfg.service_cost and ecfg.verify != "full",
                             expects_online_calibration=ecfg.online_calibration,
                             expects_calibration=_configured_calibration(ecfg),
                             expects_greedy_calibration=_configured_calibration(ecfg, greedy=True))


def _configured_calibration(ecfg: EngineConfig, greedy: bool = False) -> str | None:
    """The method of the arm's engine.confidence_calibration (``greedy``: its engine.greedy_confidence_calibration)
    where its planner reads the head's survival (so the engine counts the steps whose survival came from it), None
    otherwise."""
    path = ecfg.greedy_confidence_calibration if greedy else ecfg.confidence_calibration
    if path is None or ecfg.spec == "off" or ecfg.verify == "full" or ecfg.acceptance_estimate != "head":
        return None
    from dspark.training.calibration import calibration_method_of

    return calibration_method_of(path)


@runner_main("ab")
def main(cfg: DictConfig) -> dict:
    """``python -m runners.ab``: :func:`run`. A job of a multirun whose guards fail (ab.fail_on_guard), or that
    cannot run with its settings or inputs (a ConfigError or another of :func:`runners.hydra_main.reported_errors`:
    sweep values are only checked as each job composes them), records exit code 1 and why in its job_status.json
    and returns instead of raising, so the remaining jobs run and the sweep summary is written; the multirun then
    exits 1 (:class:`runners.callbacks.SweepSummaryCallback`)."""
    if not in_multirun():
        return run(cfg)
    out_dir = Path(cfg.paths.output_dir)
    try:
        summary = run(cfg)
    except ABGuardError as exc:
        write_job_status(out_dir, 1, f"guards failed: {exc}")
        log.error("guards failed: %s; this job is marked failed (%s), the sweep goes on and exits 1 at its end",
                  exc, out_dir / "job_status.json")
        return json.loads((out_dir / "summary.json").read_text())
    except reported_errors() as exc:
        write_job_status(out_dir, 1, f"{type(exc).__name__}: {exc}")
        log.error("%s: %s; this job is marked failed (%s), the sweep goes on and exits 1 at its end",
                  type(exc).__name__, exc, out_dir / "job_status.json")
        return None
    write_job_status(out_dir, 0)
    return summary


if __name__ == "__main__":
    main()
