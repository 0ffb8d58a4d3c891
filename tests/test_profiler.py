"""Cost-table profiler: forced verify lengths give M = B * (v + 1), a flat or noisy measurement
is refused (the fit's quality check), the time budget and the progress bar, tables are found
again by fingerprint and settings and reused only with a passed fit, the plot is written beside
the table, and the Hydra configs (runners.profile, conf/tiers) compose and reach the profiler."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import dspark.profiler as profiler
from dspark.config import ConfigError
from dspark.cost_table import CostTable, CostTableFileError, CostTableMismatchError, fingerprint_digest
from dspark.engine import Engine
from dspark.profiler import (MIN_LADDER_BATCH, ProfileBudgetError, ProfileError, ProfileFitError, ProfileFlatError, ProfileSettings,
                             collect_measurements, cost_table_path_for, find_or_profile, plot_cost_curve,
                             batch_size_ladder, default_batch_sizes, profile_engine, recommend_tier_ladder, refused_plot_path)
from tiny import tiny_drafter, tiny_engine_config, tiny_target

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
BLOCK = 4  # tiny_drafter's block
SWEEP = dict(batch_sizes=[1, 2], verify_lens=[0, 1, 2, 4], warmup_steps=1, measure_steps=2, prompt_len=6, seed=0,
             progress=False)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a shared 2-core box: one torch thread avoids spin contention (restored after)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def models():
    target = tiny_target()
    return target, tiny_drafter(target)


def make_engine(models, **kw) -> Engine:
    target, drafter = models
    return Engine(target, None, tiny_engine_config(**kw), drafter)


def synthetic_clock(monkeypatch, cost):
    """Replace every step's measured time by cost(num_tokens, num_decodes); returns the call log."""
    real_step = Engine.step
    calls = []

    def step(self):
        out = real_step(self)
        info = self.last_step
        if info is not None:
            self.last_step = dataclasses.replace(info, step_ms=cost(info.num_tokens, info.num_decodes))
            calls.append(info.num_tokens)
        return out

    monkeypatch.setattr(Engine, "step", step)
    return calls


def record_profile_calls(monkeypatch, module) -> list[dict]:
    """``module.profile_engine`` replaced by a spy that records each call's keyword arguments, then profiles."""
    calls: list[dict] = []
    real = module.profile_engine

    def recording(engine, **kw):
        calls.append(kw)
        return real(engine, **kw)

    monkeypatch.setattr(module, "profile_engine", recording)
    return calls


def staircase(m: int, b: int) -> float:
    """A GPU-like cost: 5 ms fixed, 0.5 ms per request, shelves of 4 tokens at 1 ms each."""
    return 5.0 + 0.5 * b + 1.0 * ((m + 3) // 4)


def test_measurements_are_forced_verify_lengths_with_real_timing(models):
    engine = make_engine(models)
    samples = collect_measurements(engine, **SWEEP)
    keys = sorted({(b, m) for b, m, _ in samples})
    assert keys == sorted({(b, b * (v + 1)) for b in (1, 2) for v in (0, 1, 2, 4)})
    per_key = {k: sum(1 for b, m, _ in samples if (b, m) == k) for k in keys}
    assert set(per_key.values()) == {SWEEP["measure_steps"]}
    assert all(ms > 0 for _, _, ms in samples)
    # The engine handed in is not modified: profiling runs on engines of its own.
    assert engine.cfg.verify == "full" and engine.cfg.force_verify_len is None and not engine.has_unfinished()


def test_profile_writes_a_table_that_round_trips(models, monkeypatch, tmp_path):
    synthetic_clock(monkeypatch, staircase)
    engine = make_engine(models)
    result = profile_engine(engine, **SWEEP)
    expected_m = sorted({b * (v + 1) for b in (1, 2) for v in (0, 1, 2, 4)})
    assert list(result.table.token_counts) == expected_m
    assert [m for _, m, _ in result.measurements] == [b * (v + 1) for b in (1, 2) for v in (0, 1, 2, 4)]
    assert result.table.batch_sizes == (1, 2)
    # The additive model reproduces the synthetic cost exactly.
    for b, m, ms in result.measurements:
        assert result.table.step_ms(m, b) == pytest.approx(staircase(m, b), abs=1e-6)
    path = tmp_path / "table.json"
    result.table.save(path)
    loaded = CostTable.load(path)
    assert loaded == result.table
    loaded.check_fingerprint(engine.fingerprint())
    # The context the steps ran at is recorded (informational: not a checked field).
    assert loaded.fingerprint["profile_context_tokens"] == str(SWEEP["prompt_len"])
    # Measured shelves end at M = 4 and 6 (8 is not measured): batch 2 -> v = 1 and 2, plus the block.
    assert recommend_tier_ladder(result.table, BLOCK, 2) == [1, 2, 4]
    assert recommend_tier_ladder(result.table, BLOCK, 1) == [3, 4]


def test_drafted_block_stays_full_while_the_verify_length_is_forced(models, monkeypatch):
    drafted = []
    from dspark.models.drafter import DSparkDrafter

    real_draft = DSparkDrafter.draft

    def draft(self, *args, **kwargs):
        out = real_draft(self, *args, **kwargs)
        drafted.append(out.tokens.shape[1])
        return out

    monkeypatch.setattr(DSparkDrafter, "draft", draft)
    collect_measurements(make_engine(models), **{**SWEEP, "batch_sizes": [1], "verify_lens": [0, 1]})
    assert drafted and set(drafted) == {BLOCK}


def test_flat_measurement_is_refused(models, monkeypatch):
    synthetic_clock(monkeypatch, lambda m, b: 7.0)
    with pytest.raises(ProfileFlatError, match="does not increase") as err:
        profile_engine(make_engine(models), **SWEEP)
    assert err.value.measurements and all(ms == 7.0 for _, _, ms in err.value.measurements)


def test_nearly_flat_fit_is_refused(models, monkeypatch):
    # Grows a little with M, but theta stays within 2% of the cheapest step: trimming would look free.
    synthetic_clock(monkeypatch, lambda m, b: 100.0 + 0.01 * m)
    with pytest.raises(ProfileFlatError, match="flat") as err:
        profile_engine(make_engine(models), **SWEEP)
    assert err.value.table is not None and err.value.table.is_flat(0.02)


def test_sweep_without_shared_token_counts_is_refused_by_the_fit(models, monkeypatch):
    # B=1 gives M in {1, 5}, B=4 gives {4, 20}: nothing ties the batch overhead to theta.
    synthetic_clock(monkeypatch, staircase)
    with pytest.raises(ProfileFitError, match="do not separate the batch overhead") as err:
        profile_engine(make_engine(models), **{**SWEEP, "batch_sizes": [1, 4], "verify_lens": [0, 4]})
    assert [m for _, m, _ in err.value.measurements] == [1, 5, 4, 20]


def test_disturbed_sweep_is_refused(models, monkeypatch):
    # The smallest step measured 4x slower than every other (a busy machine): no table.
    synthetic_clock(monkeypatch, lambda m, b: 40.0 if m == 1 else staircase(m, b))
    with pytest.raises(ProfileFitError, match="M=1 is .* above the cost at the larger"):
        profile_engine(make_engine(models), **SWEEP)


def test_bad_settings_are_refused_before_measuring(models):
    engine = make_engine(models)
    with pytest.raises(ProfileError, match=r"verify_lens must be integers in \[0, block=4\]"):
        profile_engine(engine, **{**SWEEP, "verify_lens": [0, 5]})
    with pytest.raises(ProfileError, match="no drafter"):
        profile_engine(make_engine(models, spec="off"), **SWEEP)


def test_batches_above_the_engines_own_are_profiled_on_an_engine_sized_for_them(models, monkeypatch):
    # On a GPU at concurrency 1 a ladder that stopped at one request would see a flat cost and be refused; the
    # default ladder there reaches MIN_LADDER_BATCH requests, measured on a profiling engine with room for them.
    # On a CPU it stays the engine's own (the cost grows with M at any batch).
    assert default_batch_sizes(1, "cuda") == batch_size_ladder(MIN_LADDER_BATCH) == [1, 2, 4, 8, 16]
    assert default_batch_sizes(256, "cuda") == batch_size_ladder(256) and default_batch_sizes(2, "cpu") == [1, 2]
    engine = make_engine(models, max_num_seqs=1)  # and 64 tokens a step: 16 requests x 5 need 80
    assert ProfileSettings.from_kwargs({}).resolved(engine).batch_sizes == (1,)
    seen = synthetic_clock(monkeypatch, staircase)
    table = profile_engine(engine, **{**SWEEP, "batch_sizes": [1, 2, 4, 8, 16]}).table
    top = 16 * (max(SWEEP["verify_lens"]) + 1)
    assert max(seen) == top and table.token_counts[-1] == top  # 16 requests' steps ran, on an engine that admits one
    assert engine.cfg.max_num_seqs == 1  # the profiled engine itself is unchanged


def test_table_is_found_again_by_fingerprint_without_reprofiling(models, monkeypatch, tmp_path):
    synthetic_clock(monkeypatch, staircase)
    calls = record_profile_calls(monkeypatch, profiler)
    lines: list[str] = []
    engine = make_engine(models)
    kwargs = {k: v for k, v in SWEEP.items()}
    settings = ProfileSettings.from_kwargs(kwargs).resolved(engine)
    first = find_or_profile(lambda: engine, tmp_path, kwargs, lines.append)
    assert len(calls) == 1 and first.path.exists() and first.how == "profiled now"
    assert first.path == cost_table_path_for(engine.fingerprint(), tmp_path, settings)
    assert any("profiling now" in line for line in lines)
    lines.clear()
    second = find_or_profile(engine, tmp_path, kwargs, lines.append)
    assert second.path == first.path and len(calls) == 1 and second.how == "reused from cache"
    assert second.table == first.table and second.plot == first.plot
    assert any("reusing" in line and str(first.path) in line for line in lines)
    # Another dtype (or device, model, drafter...) is another file; so are other settings.
    other = dict(engine.fingerprint(), dtype="bfloat16")
    assert cost_table_path_for(other, tmp_path, settings) != first.path
    assert cost_table_path_for(dict(engine.fingerprint(), hostname="elsewhere"), tmp_path, settings) == first.path
    more_repeats = dataclasses.replace(settings, measure_steps=settings.measure_steps + 1)
    assert cost_table_path_for(engine.fingerprint(), tmp_path, more_repeats) != first.path
    # The time budget decides whether a sweep finishes, not the table: the same file.
    assert cost_table_path_for(engine.fingerprint(), tmp_path,
                               dataclasses.replace(settings, time_budget_s=5.0)) == first.path
    # The table it returns is accepted by an engine that loads it.
    planned = make_engine(models, verify="uniform", cost_table=str(first.path), max_num_seqs=max(SWEEP["batch_sizes"]))
    assert planned.cost_table == CostTable.load(first.path)


def test_corrupt_cached_cost_table_says_delete(models, monkeypatch, tmp_path):
    synthetic_clock(monkeypatch, staircase)
    engine = make_engine(models)
    kwargs = dict(SWEEP)
    path = cost_table_path_for(engine.fingerprint(), tmp_path, ProfileSettings.from_kwargs(kwargs).resolved(engine))
    path.write_text('{"format_version": 1, "token_counts_include_bonus": true, "token_co')  # torn by a crash
    with pytest.raises(CostTableFileError, match=rf"cost table {path}: not valid JSON .*This is the table cached for "
                                                 rf"this setup: delete {path} and the next run profiles this node"):
        find_or_profile(engine, tmp_path, kwargs, lambda line: None)
    # Copied from another node under this node's name: refused the same way.
    foreign = CostTable(token_counts=(1, 2), theta_ms=(1.0, 2.0), fingerprint={"device_name": "NVIDIA H200"})
    foreign.save(path)
    with pytest.raises(CostTableMismatchError, match=rf"cost table {path} was measured on a different setup "
                                                     r"\(device_name: table='NVIDIA H200'.*delete .* and the next run"):
        find_or_profile(engine, tmp_path, kwargs, lambda line: None)
    # ...and deleting it is enough: the next run profiles again.
    path.unlink()
    lines: list[str] = []
    assert find_or_profile(engine, tmp_path, kwargs, lines.append).path == path and path.exists()
    assert any("profiling now" in line for line in lines)


def test_plot_is_written(models, monkeypatch, tmp_path):
    synthetic_clock(monkeypatch, staircase)
    result = profile_engine(make_engine(models), **SWEEP)
    png = plot_cost_curve(result, result.table, tmp_path / "sub" / "curve.png")
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


# A sweep of two batch sizes that share token counts 2 and 4, so the fit has residuals to judge.
SHARED = {**SWEEP, "verify_lens": [0, 1, 2, 3, 4]}


def test_png_is_written_beside_the_table_and_a_refused_profile_caches_nothing(models, monkeypatch, tmp_path):
    synthetic_clock(monkeypatch, lambda m, b: 3.0)  # flat: refused
    engine = make_engine(models)
    path = cost_table_path_for(engine.fingerprint(), tmp_path, ProfileSettings.from_kwargs(SWEEP).resolved(engine))
    with pytest.raises(ProfileFlatError, match=rf"The measured curve is in {refused_plot_path(path)}\. Nothing was "
                                               "cached"):
        find_or_profile(engine, tmp_path, SWEEP, lambda line: None)
    assert not path.exists() and refused_plot_path(path).is_file()
    synthetic_clock(monkeypatch, staircase)
    obtained = find_or_profile(engine, tmp_path, SWEEP, lambda line: None)
    assert obtained.path == path and obtained.plot == path.with_suffix(".png")
    assert obtained.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not refused_plot_path(path).exists()  # the refusal's curve no longer describes this file
    record = obtained.describe()
    assert record["how"] == "profiled now" and record["plot"] == str(path.with_suffix(".png"))
    assert record["fingerprint"] == fingerprint_digest(engine.fingerprint()) and record["fit"]["passed"] is True
    assert record["settings"]["measure_steps"] == SWEEP["measure_steps"] and record["profile_s"] >= 0


def test_a_noisy_sweep_fails_the_quality_check_and_says_what_to_change(models, monkeypatch, tmp_path):
    """Batch 2 at verify length 1 (M=4) ran 3x slow: the two batch sizes disagree where they share token
    counts, the fit misses a median by more than max_rel_residual, and the profile is refused, not cached."""
    synthetic_clock(monkeypatch, lambda m, b: staircase(m, b) * (3.0 if (b, m) == (2, 4) else 1.0))
    with pytest.raises(ProfileFitError, match=r"does not fit the measured medians: R\^2 = 0\.\d+ is below min_r2 = "
                                              r"0\.95; the median at batch \d, M=\d is \d+% off the fitted cost, above "
                                              r"max_rel_residual = 35%") as err:
        profile_engine(make_engine(models), **SHARED)
    message = str(err.value)
    assert "quieter machine" in message and "measure_steps" in message and "batch_sizes" in message
    assert err.value.table is not None and err.value.table.fit.max_rel_residual > 0.35  # the refused fit, to plot
    # Looser thresholds accept the same sweep, and the table records the thresholds it passed.
    result = profile_engine(make_engine(models), **SHARED, max_rel_residual=0.9, min_r2=0.5, monotone="envelope")
    assert result.table.fit.passed and result.table.fit.max_rel_residual_allowed == 0.9
    assert dict(result.table.profile_settings)["max_rel_residual"] == 0.9
    # find_or_profile caches nothing for the refused sweep.
    with pytest.raises(ProfileFitError):
        find_or_profile(make_engine(models), tmp_path, SHARED, lambda line: None)
    assert not list(tmp_path.glob("*.json")) and len(list(tmp_path.glob("*.refused.png"))) == 1


def test_a_cached_table_without_a_passed_quality_check_is_profiled_again(models, monkeypatch, tmp_path):
    synthetic_clock(monkeypatch, staircase)
    engine = make_engine(models)
    obtained = find_or_profile(engine, tmp_path, SWEEP, lambda line: None)
    failed = dataclasses.replace(obtained.table, fit=dataclasses.replace(obtained.table.fit, passed=False))
    for stale, why in ((dataclasses.replace(obtained.table, fit=None), "records no checked fit quality"),
                       (failed, "its fit failed the quality check"),
                       (dataclasses.replace(obtained.table, profile_settings={**obtained.table.profile_settings,
                                                                              "measure_steps": 99}),
                        "measured with other settings (measure_steps: table 99, now 2)")):
        stale.save(obtained.path)
        lines: list[str] = []
        again = find_or_profile(engine, tmp_path, SWEEP, lines.append)
        assert again.how == "profiled now" and why in again.replaced and again.describe()["replaced"] == again.replaced
        assert any("not reusing" in line and why in line for line in lines), lines
        assert CostTable.load(obtained.path).fit.passed is True  # replaced by the new profile


def test_time_budget_stops_a_sweep_that_would_overrun(models, monkeypatch):
    from dspark.profiler import SweepClock

    now = [100.0]
    monkeypatch.setattr(profiler.time, "perf_counter", lambda: now[0])
    clock = SweepClock(budget_s=9.0, total_configs=10)
    now[0] += 1.0
    clock.config_done(row_complete=False)  # 1 s: within the budget, and no projection from half a row
    now[0] += 1.0
    with pytest.raises(ProfileBudgetError, match=r"ran 2 s for 2 of 10 .* projected to take about 10 s in all, past "
                                                 r"time_budget_s=9"):
        clock.config_done(row_complete=True)  # a row of 2 configurations in 2 s: about 10 s for all 10
    unlimited = SweepClock(budget_s=None, total_configs=2)
    now[0] += 1e6
    unlimited.config_done(row_complete=True)  # no budget: never stops
    monkeypatch.undo()
    # In a real sweep the error says what to change, and nothing is measured past it.
    with pytest.raises(ProfileBudgetError, match="fewer batch sizes .*raise time_budget_s"):
        profile_engine(make_engine(models), **SWEEP, time_budget_s=1e-6)


def test_progress_bar_counts_the_configurations(models, monkeypatch, capsys):
    synthetic_clock(monkeypatch, staircase)
    profile_engine(make_engine(models), **{**SWEEP, "progress": True})
    configs = len(SWEEP["batch_sizes"]) * len(SWEEP["verify_lens"])
    err = capsys.readouterr().err
    assert "cost-table profile" in err and f"{configs}/{configs}" in err
    profile_engine(make_engine(models), **SWEEP)  # progress=False
    assert "cost-table profile" not in capsys.readouterr().err


def test_profile_settings_refuse_bad_values():
    with pytest.raises(ProfileError, match="min_r2 must be in"):
        ProfileSettings(min_r2=1.5)
    with pytest.raises(ProfileError, match="time_budget_s must be > 0"):
        ProfileSettings(time_budget_s=0)
    with pytest.raises(ProfileError, match="unknown profile settings \\['repeats'\\]"):
        ProfileSettings.from_kwargs({"repeats": 3})


# ---- Hydra -----------------------------------------------------------------------------------
def compose_profile(overrides=()):
    import runners.profile  # noqa: F401  (registers profile_schema)

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="profile"):
        return compose(config_name="profile", overrides=list(overrides))


def test_profile_config_composes_and_runs(models, monkeypatch, tmp_path):
    import runners.profile as runner

    cfg = compose_profile([f"paths.root={ROOT}", f"paths.output_dir={tmp_path / 'run'}",
                           f"paths.cost_tables={tmp_path / 'tables'}", "progress=false"])
    assert list(cfg.batch_sizes) == [1, 4, 16] and cfg.verify_lens is None and cfg.out is None
    assert cfg.engine.spec == "dspark" and cfg.drafter.name == "dspark_smollm2"
    with pytest.raises(Exception, match="batch_size"):  # typed schema: unknown keys fail at composition
        compose_profile(["batch_size=4"])
    cfg = compose_profile([f"paths.root={ROOT}", f"paths.output_dir={tmp_path / 'run'}",
                           f"paths.cost_tables={tmp_path / 'tables'}", "progress=false", "batch_sizes=[1,2]",
                           "verify_lens=[0,1,2,4]", "warmup_steps=1", "measure_steps=2", "prompt_len=6"])
    synthetic_clock(monkeypatch, staircase)
    engine = make_engine(models)
    summary = runner.run(cfg, engine=engine)
    table_path = Path(summary["cost_table"])
    settings = ProfileSettings(batch_sizes=(1, 2), verify_lens=(0, 1, 2, 4), warmup_steps=1, measure_steps=2,
                               prompt_len=6)
    assert table_path == cost_table_path_for(engine.fingerprint(), tmp_path / "tables", settings).resolve()
    assert summary["settings_digest"] == settings.digest() and summary["fit"]["passed"] is True
    assert CostTable.load(table_path).token_counts == (1, 2, 3, 4, 5, 6, 10)
    assert Path(summary["plot"]).exists() and Path(summary["plot"]).suffix == ".png"
    assert summary["recommended_tiers"]["2"] == [1, 2, 4]
    saved = json.loads((tmp_path / "run" / "profile.json").read_text())
    assert saved["table"]["token_counts"] == [1, 2, 3, 4, 5, 6, 10]


def test_profile_runner_settings_reach_the_profiler(models, monkeypatch, tmp_path):
    """Every key of the shared profile schema (runners.schema.CostProfileSchema) given to runners.profile
    reaches profile_engine, and the bar follows progress."""
    import runners.profile as runner

    seen = record_profile_calls(monkeypatch, runner)
    synthetic_clock(monkeypatch, staircase)
    cfg = compose_profile([f"paths.root={ROOT}", f"paths.output_dir={tmp_path / 'run'}",
                           f"paths.cost_tables={tmp_path / 'tables'}", "progress=false", "batch_sizes=[1,2]",
                           "verify_lens=[0,1,2,4]", "warmup_steps=1", "measure_steps=3", "prompt_len=6", "seed=5",
                           "flat_rel_tol=0.01", "max_drop_rel=0.5", "monotone=envelope", "min_r2=0.9",
                           "max_rel_residual=0.2", "time_budget_s=300"])
    summary = runner.run(cfg, engine=make_engine(models))
    assert seen == [dict(batch_sizes=(1, 2), verify_lens=(0, 1, 2, 4), warmup_steps=1, measure_steps=3,
                         prompt_len=6, seed=5, flat_rel_tol=0.01, max_drop_rel=0.5, monotone="envelope", min_r2=0.9,
                         max_rel_residual=0.2, time_budget_s=300.0, remeasure_rounds=2, progress=False)]
    assert summary["fit"]["min_r2"] == 0.9 and summary["settings"]["time_budget_s"] == 300.0
    assert Path(summary["plot"]) == Path(summary["cost_table"]).with_suffix(".png")
    with pytest.raises(Exception, match=r"(?s)monotone.*sometimes"):  # not a MonotoneMode: refused at composition
        compose_profile(["monotone=sometimes"])
    with pytest.raises(ConfigError, match=r"max_rel_residual must be > 0"):  # refused before any model loads
        runner.run(compose_profile(["max_rel_residual=0"]))


def test_profile_runner_writes_the_refused_curve(models, monkeypatch, tmp_path):
    import runners.profile as runner

    cfg = compose_profile([f"paths.root={ROOT}", f"paths.output_dir={tmp_path / 'run'}",
                           f"paths.cost_tables={tmp_path / 'tables'}", "progress=false", "batch_sizes=[1,2]",
                           "verify_lens=[0,1,2,4]", "warmup_steps=0", "measure_steps=1", "prompt_len=6"])
    synthetic_clock(monkeypatch, lambda m, b: 3.0)
    with pytest.raises(ProfileFlatError):
        runner.run(cfg, engine=make_engine(models))
    assert (tmp_path / "run" / "refused_cost_curve.png").exists()
    assert not (tmp_path / "tables").exists()  # nothing the planner could pick up


@pytest.mark.parametrize("name,tiers", [("ladder_1357", [1, 3, 5, 7]), ("fine_234567", [2, 3, 4, 5, 6, 7]),
                                        ("ladder_135", [1, 3, 5]), ("fine_2345", [2, 3, 4, 5]), ("full", None)])
def test_tier_files_set_engine_tiers(name, tiers):
    import runners.schema  # noqa: F401  (registers ab_schema)

    paths = [f"paths.root={ROOT}", "paths.output_dir=/nonexistent/ab-out", f"paths.cost_tables={ROOT / 'cost_tables'}"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="ab"):
        cfg = compose(config_name="ab", overrides=[*paths, f"+tiers={name}", "engine.verify=uniform"])
    got = cfg.engine.tiers
    assert (None if got is None else list(got)) == tiers
    assert "tiers" not in cfg  # the files are `# @package engine`: nothing lands at the top level


def test_block7_ladders_are_accepted_and_block5_ladders_refused_by_a_block7_planner():
    from dspark.planner import PlannerConfig, PlannerConfigError

    for tiers in ([1, 3, 5, 7], [2, 3, 4, 5, 6, 7]):
        PlannerConfig(block=7, mode="uniform", allowed_verify_lens=tuple(tiers))
    for tiers in ([1, 3, 5], [2, 3, 4, 5]):
        with pytest.raises(PlannerConfigError, match="must end at block=7"):
            PlannerConfig(block=7, mode="uniform", allowed_verify_lens=tuple(tiers))


def test_batch_size_ladder_covers_the_concurrency():
    assert batch_size_ladder(1) == [1]
    assert batch_size_ladder(8) == [1, 2, 4, 8]
    assert batch_size_ladder(12) == [1, 2, 4, 8, 12]
    with pytest.raises(ProfileError, match="max_batch"):
        batch_size_ladder(0)


def test_bumpy_cost_is_refused_or_repaired_by_the_monotone_envelope(models, monkeypatch):
    def bumpy(m, b):  # a step of 6 tokens costs more than the steps of 8 and 10 tokens
        return staircase(m, b) + (5.0 if m == 6 else 0.0)

    synthetic_clock(monkeypatch, bumpy)
    with pytest.raises(ProfileFitError, match="above the cost at the larger"):
        profile_engine(make_engine(models), **SWEEP)
    result = profile_engine(make_engine(models), **SWEEP, monotone="envelope")
    theta = result.table.theta_ms
    assert all(theta[i] <= theta[i + 1] for i in range(len(theta) - 1))
    assert result.settings["monotone_repaired"] >= 1
    with pytest.raises(ProfileError, match="monotone"):
        profile_engine(make_engine(models), **SWEEP, monotone="sometimes")


def test_trim_overhead_is_measured_on_the_trimmed_path_and_kept_out_of_theta(models, monkeypatch):
    """Captured steps (cuda_graphs; on the CPU the same step functions run uncaptured): a trimmed
    step (any window below the block, or a full block forced onto the trimmed path) costing 0.8 ms
    more than its tokens. The profile measures the full block on both paths, stores the difference
    per batch size, fits theta on the tokens alone, and prices trimmed steps with it. Eager steps
    run one path: nothing is measured and the table carries no overhead."""
    real_step = Engine.step

    def step(self):
        out = real_step(self)
        info = self.last_step
        if info is not None:
            trimmed = self.cfg.force_trimmed_path or any(w < BLOCK for w in info.windows)
            self.last_step = dataclasses.replace(info, step_ms=staircase(info.num_tokens, info.num_decodes)
                                                 + (0.8 if trimmed else 0.0))
        return out

    monkeypatch.setattr(Engine, "step", step)
    eager = profile_engine(make_engine(models), **SWEEP)
    assert eager.table.trim_overhead_ms is None and eager.trim_samples == []
    assert eager.settings["trim_overhead"].startswith("not measured")
    result = profile_engine(make_engine(models, cuda_graphs=True), **SWEEP)
    table = result.table
    assert table.trim_overhead_ms == pytest.approx((0.8, 0.8))
    assert {(b, m) for b, m, _ in result.trim_samples} == {(1, 1 * (BLOCK + 1)), (2, 2 * (BLOCK + 1))}
    for b, m, ms in result.measurements:
        trimmed = m < b * (BLOCK + 1)
        assert table.step_ms(m, b, trimmed=trimmed) == pytest.approx(ms, abs=1e-6)
        assert table.step_ms(m, b) == pytest.approx(staircase(m, b), abs=1e-6)
    assert result.to_dict()["trim_overhead_ms"] == [0.8, 0.8]


def test_trim_overhead_ignores_noise():
    from dspark.profiler import trim_overheads

    full = [(1, 5, 10.0 + d) for d in (-0.2, 0.1, 0.0, 0.3, -0.1, 0.2)]
    same = [(1, 5, 10.05 + d) for d in (0.2, -0.1, 0.0, -0.3, 0.1, -0.2)]  # within the noise: no overhead
    slow = [(1, 5, 11.0 + d) for d in (0.2, -0.1, 0.0, -0.3, 0.1, -0.2)]
    assert trim_overheads(full, same, 4) == {1: 0.0}
    assert trim_overheads(full, slow, 4) == {1: pytest.approx(10.95 - 10.05)}  # medians
    assert trim_overheads(full, [(1, 5, 9.0)] * 3, 4) == {1: 0.0}  # cheaper is never a negative overhead
    with pytest.raises(ProfileError, match="lack a full-block step"):
        trim_overheads(full, [(2, 10, 9.0)], 4)


def test_a_sweep_disturbed_by_another_job_is_refused_not_saved():
    """A 2-core CPU shared with another job measured batch-4 steps at 1.6 s against 150 ms at batch 1 and the
    profile saved that table; a cell far above linear growth in its tokens is now refused, naming both cells."""
    from dspark.profiler import ProfileFitError, check_not_superlinear

    clean = [(1, 2, 150.0), (1, 8, 160.0), (2, 4, 155.0), (2, 16, 175.0), (4, 8, 162.0), (4, 32, 210.0)]
    check_not_superlinear(clean)
    disturbed = [*clean[:4], (4, 8, 1650.0), (4, 32, 1700.0)]
    with pytest.raises(ProfileFitError, match=r"M=8 tokens \(batch 4\) took 1650.0 ms, 5.3x .*M=4 \(batch 2, 155.0 ms\)"):
        check_not_superlinear(disturbed)


def test_a_transiently_noisy_cell_is_measured_again_and_the_fit_then_passes(models, monkeypatch):
    """Batch 2 at verify length 1 (M=4) ran 3x slow in the first sweep only (a passing disturbance): the
    fit misses the quality thresholds, the profiler sweeps every cell again and pools the repeats until the
    fit passes; the extra sweeps and why they were taken are recorded."""
    slow = {"left": SHARED["measure_steps"] + SHARED["warmup_steps"]}

    def cost(m, b):
        if (b, m) == (2, 4) and slow["left"] > 0:
            slow["left"] -= 1
            return staircase(m, b) * 3.0
        return staircase(m, b)

    synthetic_clock(monkeypatch, cost)
    result = profile_engine(make_engine(models), **SHARED)
    assert result.table.fit.passed
    rounds = result.settings["remeasured"]
    assert 1 <= len(rounds) <= 2 and all(r.startswith("fit: R^2") for r in rounds)
    per_cell = {(b, m): sum(1 for s in result.samples if s[:2] == (b, m)) for b, m, _ in result.measurements}
    assert set(per_cell.values()) == {SHARED["measure_steps"] * (len(rounds) + 1)}  # every cell, pooled


def test_no_remeasuring_rounds_refuses_a_noisy_fit_at_once(models, monkeypatch):
    calls = synthetic_clock(monkeypatch, lambda m, b: staircase(m, b) * (3.0 if (b, m) == (2, 4) else 1.0))
    with pytest.raises(ProfileFitError) as err:
        profile_engine(make_engine(models), **SHARED, remeasure_rounds=0)
    assert "more sweep" not in str(err.value)
    sweep_steps = len(calls)
    calls.clear()
    with pytest.raises(ProfileFitError, match=r"after 2 more sweep\(s\) of every cell, their repeats pooled"):
        profile_engine(make_engine(models), **SHARED)  # a lasting disturbance: refused after the extra sweeps
    assert len(calls) > 2 * sweep_steps
    with pytest.raises(ProfileError, match="remeasure_rounds must be an integer >= 0"):
        ProfileSettings(remeasure_rounds=-1)
    assert "remeasure_rounds" not in ProfileSettings().table_settings()  # the same table, however it was reached
