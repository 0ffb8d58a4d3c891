"""Cost-table profiler: forced verify lengths give M = B * (v + 1), a flat measurement is
refused, tables are found again by fingerprint, the plot is written, and the Hydra configs
(runners.profile, conf/tiers) compose."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import dspark.profiler as profiler
from dspark.cost_table import CostTable, CostTableFileError, CostTableMismatchError
from dspark.engine import Engine
from dspark.profiler import (ProfileError, ProfileFitError, ProfileFlatError, collect_measurements, cost_table_path_for,
                             find_or_profile, plot_cost_curve, profile_engine, recommend_tier_ladder)
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
    from dspark.model_runner import ModelRunner

    real_draft = ModelRunner.draft

    def draft(self, decodes, rows, uniforms=None):
        out = real_draft(self, decodes, rows, uniforms=uniforms)
        drafted.append(out.tokens.shape[1])
        return out

    monkeypatch.setattr(ModelRunner, "draft", draft)
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
    with pytest.raises(ProfileError, match="max_num_seqs"):
        profile_engine(engine, **{**SWEEP, "batch_sizes": [1, 64]})
    with pytest.raises(ProfileError, match="no drafter"):
        profile_engine(make_engine(models, spec="off"), **SWEEP)


def test_table_is_found_again_by_fingerprint_without_reprofiling(models, monkeypatch, tmp_path):
    synthetic_clock(monkeypatch, staircase)
    calls = []
    real_profile = profiler.profile_engine

    def counting_profile(engine, **kw):
        calls.append(kw)
        return real_profile(engine, **kw)

    monkeypatch.setattr(profiler, "profile_engine", counting_profile)
    lines: list[str] = []
    engine = make_engine(models)
    kwargs = {k: v for k, v in SWEEP.items()}
    first = find_or_profile(lambda: engine, tmp_path, kwargs, lines.append)
    assert len(calls) == 1 and first.exists()
    assert first == cost_table_path_for(engine.fingerprint(), tmp_path)
    assert any("profiling now" in line for line in lines)
    lines.clear()
    second = find_or_profile(engine, tmp_path, kwargs, lines.append)
    assert second == first and len(calls) == 1
    assert any("using" in line and str(first) in line for line in lines)
    # Another dtype (or device, model, drafter...) is another file.
    other = dict(engine.fingerprint(), dtype="bfloat16")
    assert cost_table_path_for(other, tmp_path) != first
    assert cost_table_path_for(dict(engine.fingerprint(), hostname="elsewhere"), tmp_path) == first
    # The table it returns is accepted by an engine that loads it.
    planned = make_engine(models, verify="uniform", cost_table=str(first), max_num_seqs=max(SWEEP["batch_sizes"]))
    assert planned.cost_table == CostTable.load(first)


def test_corrupt_cached_cost_table_says_delete(models, monkeypatch, tmp_path):
    synthetic_clock(monkeypatch, staircase)
    engine = make_engine(models)
    path = cost_table_path_for(engine.fingerprint(), tmp_path)
    kwargs = dict(SWEEP)
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
    assert find_or_profile(engine, tmp_path, kwargs, lines.append) == path and path.exists()
    assert any("profiling now" in line for line in lines)


def test_plot_is_written(models, monkeypatch, tmp_path):
    synthetic_clock(monkeypatch, staircase)
    result = profile_engine(make_engine(models), **SWEEP)
    png = plot_cost_curve(result, result.table, tmp_path / "sub" / "curve.png")
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


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
    assert table_path == cost_table_path_for(engine.fingerprint(), tmp_path / "tables").resolve()
    assert CostTable.load(table_path).token_counts == (1, 2, 3, 4, 5, 6, 10)
    assert Path(summary["plot"]).exists() and Path(summary["plot"]).suffix == ".png"
    assert summary["recommended_tiers"]["2"] == [1, 2, 4]
    saved = json.loads((tmp_path / "run" / "profile.json").read_text())
    assert saved["table"]["token_counts"] == [1, 2, 3, 4, 5, 6, 10]


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
    from dspark.profiler import batch_size_ladder

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
