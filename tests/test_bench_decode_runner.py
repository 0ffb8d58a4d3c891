"""runners.bench_decode end to end on the CPU with the real SmolLM2 and the shipped drafter."""

import json

import pytest
from hydra import compose, initialize_config_dir

from test_configs import CONF, ROOT

pytestmark = pytest.mark.smollm2


def test_prompt_sets_cover_min_requests():
    from runners.bench_decode import prompt_sets

    assert [prompt_sets(b, 8) for b in (1, 3, 8, 64)] == [8, 3, 1, 1]
    with pytest.raises(Exception, match="min_requests"):
        prompt_sets(4, 0)


def test_small_batches_run_several_prompt_sets_and_arms_are_compared(tmp_path):
    from runners import bench_decode

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="bench_decode"):
        cfg = compose(config_name="bench_decode", overrides=[
            f"paths.root={ROOT}", f"paths.output_dir={tmp_path}", f"output_dir={tmp_path}", "progress=false",
            f"paths.cost_tables={tmp_path / 'cost_tables'}", "batch_sizes=[1,2]",
            "new_tokens=8", "warmup_steps=0", "min_requests=3"])
    doc = bench_decode.run(cfg)
    rows = {(r["arm"], r["batch_size"]): r for r in doc["results"]}
    assert rows[("target_only", 1)]["prompt_sets"] == 3 and rows[("target_only", 1)]["requests"] == 3
    assert rows[("target_only", 2)]["prompt_sets"] == 2 and rows[("target_only", 2)]["requests"] == 4
    for b in (1, 2):
        spec = rows[("dspark_full", b)]
        assert spec["requests_differing_from_target_only"] == 0  # fp32 greedy: lossless
        assert spec["accept_length"] > 1.0 and spec["output_tokens_total"] == spec["requests"] * 8
    saved = json.loads((tmp_path / "bench_decode.json").read_text())
    assert len(saved["results"]) == 4
    assert (tmp_path / "bench_decode.md").exists() and (tmp_path / "bench_decode.png").exists()
    for r in doc["results"]:  # prompt plus half of the 8 generated tokens
        assert r["mean_context_tokens"] > 4 and r["cost_table_context_tokens"] is None  # no table: full arms
        # Eager CPU steps synchronise inside step(): no separate wait, so host time is the step time.
        assert r["wait_ms_timed_median"] == 0.0 and r["host_ms_timed_median"] == pytest.approx(r["ms_per_step_median"])
        assert r["ms_per_step_median"] <= r["ms_per_step_p90"] <= r["ms_per_step_max"]
        assert r["gc_mode"] == "default" and len(r["gc_collections"]) == 3 and r["gc_pause_ms_total"] >= 0.0
    assert "Where the timed steps' time went" in (tmp_path / "bench_decode.md").read_text()


def test_gc_pauses_count_collections_and_apply_the_mode():
    import gc

    from dspark.bench.gc_pauses import GcPauses

    with pytest.raises(Exception, match="gc_mode"):
        GcPauses("sometimes")
    with GcPauses("default") as p:
        gc.collect(1)
        gc.collect(2)
    assert p.count[1] >= 1 and p.count[2] >= 1 and p.ms > 0.0 and p.max_ms <= p.ms
    assert p._callback not in gc.callbacks  # uninstalled on exit
    was = gc.isenabled()
    with GcPauses("disable"):
        assert not gc.isenabled()
    assert gc.isenabled() == was
    with GcPauses("freeze") as p:
        assert gc.get_freeze_count() > 0
        frozen = gc.get_freeze_count()
        kept = [[i] for i in range(1000)]  # what a timed block leaves alive
        p.settle()  # joins the permanent generation: later collections do not rescan it
        assert gc.get_freeze_count() >= frozen + len(kept)
    assert gc.get_freeze_count() == 0 and p.summary()["gc_mode"] == "freeze"
    with GcPauses("default") as p:
        p.settle()
        assert gc.get_freeze_count() == 0  # only the freeze mode freezes


def test_context_note_warns_when_the_cost_table_saw_much_shorter_contexts():
    from runners.bench_decode import context_note

    rows = [{"cost_table_context_tokens": 128, "mean_context_tokens": 150.0},
            {"cost_table_context_tokens": None, "mean_context_tokens": 900.0}]
    assert context_note(rows) is None  # within 1.5x, and a row without a table says nothing
    rows.append({"cost_table_context_tokens": 128, "mean_context_tokens": 512.0})
    note = context_note(rows)
    assert note is not None and "128-token contexts" in note and "512 tokens" in note and "prompt_len" in note


def test_throughput_interval_brackets_the_rate_and_shrinks_with_steps():
    from runners.bench_decode import throughput_interval

    few = throughput_interval([4.0, 4.4, 3.8, 4.2], [800, 790, 805, 795])
    lo, hi = few["output_tokens_per_s_ci95"]
    rate = sum([800, 790, 805, 795]) / (sum([4.0, 4.4, 3.8, 4.2]) / 1e3)
    assert lo <= rate <= hi and few["ms_per_step_mean"] == pytest.approx(4.1)
    many = throughput_interval([4.0, 4.4, 3.8, 4.2] * 16, [800, 790, 805, 795] * 16)
    assert many["output_tokens_per_s_ci95"][1] - many["output_tokens_per_s_ci95"][0] < hi - lo
    assert many["ms_per_step_se"] < few["ms_per_step_se"]
    one = throughput_interval([4.0], [800])
    assert one["output_tokens_per_s_ci95"] is None and one["ms_per_step_se"] is None


def test_run_order_kinds_and_refusals():
    from runners.bench_decode import run_order

    arms, batches = ["t", "f", "r"], [64, 256]
    assert run_order(arms, batches) == [(0, "t", 64), (0, "t", 256), (0, "f", 64), (0, "f", 256), (0, "r", 64),
                                        (0, "r", 256)]
    assert run_order(arms, batches, "batch_major") == [(0, "t", 64), (0, "f", 64), (0, "r", 64), (0, "t", 256),
                                                       (0, "f", 256), (0, "r", 256)]
    alt = run_order(arms, batches, "alternating", rounds=2)
    assert [a for _, a, _ in alt] == ["t", "f", "r", "r", "f", "t", "t", "f", "r", "r", "f", "t"]
    assert [b for _, _, b in alt] == [64] * 3 + [256] * 3 + [64] * 3 + [256] * 3
    # one batch size: the rounds alternate instead, so every arm runs first once and last once
    one = run_order(arms, [256], "alternating", rounds=2)
    assert [a for _, a, _ in one] == ["t", "f", "r", "r", "f", "t"] and [r for r, _, _ in one] == [0, 0, 0, 1, 1, 1]
    for order, rounds, match in (("random", 1, "order"), ("alternating", 0, "rounds")):
        with pytest.raises(Exception, match=match):
            run_order(arms, batches, order, rounds)


def test_rounds_are_reported_with_positions_and_a_median_table(tmp_path):
    from runners import bench_decode

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="bench_decode"):
        cfg = compose(config_name="bench_decode", overrides=[
            f"paths.root={ROOT}", f"paths.output_dir={tmp_path}", f"output_dir={tmp_path}", "progress=false",
            f"paths.cost_tables={tmp_path / 'cost_tables'}", "batch_sizes=[2]", "new_tokens=6",
            "warmup_steps=0", "min_requests=2", "order=alternating", "rounds=2"])
    doc = bench_decode.run(cfg)
    order = [(r["round"], r["arm"], r["run_position"]) for r in doc["results"]]
    assert order == [(0, "target_only", 0), (0, "dspark_full", 1), (1, "dspark_full", 2), (1, "target_only", 3)]
    assert all(r["requests_differing_from_target_only"] == 0 for r in doc["results"])  # per round's reference
    summary = {s["arm"]: s for s in doc["median_over_rounds"]}
    assert summary["dspark_full"]["run_positions"] == [1, 2] and len(summary["target_only"]["output_tokens_per_s_by_round"]) == 2
    md = (tmp_path / "bench_decode.md").read_text()
    assert "Run order: alternating, 2 round(s)" in md and "Median over the 2 rounds" in md
