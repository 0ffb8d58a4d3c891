"""runners.eval_drafter's prompt-bootstrap intervals and the paired comparison of two reports, on synthetic
engine outputs (objects with the fields acceptance_metrics reads): no model runs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from runners import eval_drafter as ev

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
BLOCK = 4
FAST = dict(n_resamples=500, ci_level=0.95, seed=0)


def fake_output(lengths, error=None, prompt_len=10):
    """An engine output with these per-step accept lengths (bonus included) and full-block drafts."""
    lengths = [int(v) for v in lengths]
    return SimpleNamespace(
        error=error, accept_lengths=lengths, num_steps=len(lengths), token_ids=[0] * sum(lengths), user_id=None,
        prompt_token_ids=[1] * prompt_len,
        mean_accept_length=sum(lengths) / len(lengths) if lengths else float("nan"),
        pos_accepted=[sum(v > i + 1 for v in lengths) for i in range(BLOCK)], pos_reached=[len(lengths)] * BLOCK)


def fake_outputs(n_prompts, seed=1, scale=1.0):
    rng = np.random.default_rng(seed)
    outs = []
    for _ in range(n_prompts):
        p = rng.uniform(0.3, 0.9)  # prompts differ in how easy they are
        lengths = np.minimum(rng.geometric(1 - p, size=24), BLOCK + 1)
        outs.append(fake_output(np.maximum(1, np.round(lengths * scale))))
    return outs


def report_of(outputs, ids=None, workload="w", temperature=0.0, **kw):
    ids = ids or [f"p{i}" for i in range(len(outputs))]
    row = {"workload": workload, "temperature": temperature,
           **ev.acceptance_metrics(outputs, BLOCK, ids, **{**FAST, **kw})}
    return {"block_size": BLOCK, "results": [row], "greedy_lossless": True,
            "bootstrap": {"unit": "prompt", **FAST}}


def test_interval_contains_the_estimate_is_seeded_and_widens_with_fewer_prompts():
    outs = fake_outputs(24)
    row = ev.acceptance_metrics(outs, BLOCK, [f"p{i}" for i in range(24)], **FAST)
    ci = row["mean_accept_length_ci"]
    assert ci["method"] == "bca" and ci["n_prompts"] == 24 and ci["note"] is None
    assert ci["low"] < row["mean_accept_length"] < ci["high"]
    # the statistic is the row's: mean over prompts of each prompt's mean accept length
    assert row["mean_accept_length"] == pytest.approx(np.mean([o.mean_accept_length for o in outs]))
    p1 = row["p1_acceptance_ci"]
    assert p1["low"] < row["per_position_acceptance"][0] < p1["high"]
    again = ev.acceptance_metrics(outs, BLOCK, [f"p{i}" for i in range(24)], **FAST)
    assert again["mean_accept_length_ci"] == ci
    other_seed = ev.acceptance_metrics(outs, BLOCK, [f"p{i}" for i in range(24)], **{**FAST, "seed": 5})
    assert other_seed["mean_accept_length_ci"]["low"] != ci["low"]
    few = ev.acceptance_metrics(outs[:6], BLOCK, **FAST)["mean_accept_length_ci"]
    assert few["high"] - few["low"] > ci["high"] - ci["low"]


def test_rows_without_two_prompts_or_spread_say_why():
    one = ev.acceptance_metrics(fake_outputs(1) + [fake_output([], error="boom")], BLOCK, **FAST)
    ci = one["mean_accept_length_ci"]
    assert ci["low"] is None and ci["high"] is None and ci["method"] is None and "at least 2" in ci["note"]
    assert one["per_prompt"]["1"]["error"] == "boom" and one["per_prompt"]["1"]["mean_accept_length"] is None
    same = ev.acceptance_metrics([fake_output([2, 3]), fake_output([3, 2])], BLOCK, **FAST)["mean_accept_length_ci"]
    assert same["method"] == "zero-width" and same["low"] == same["high"] == 2.5
    rep = report_of(fake_outputs(1))
    assert "none (1 prompt)" in ev.markdown_table(rep)


def test_bca_undefined_falls_back_to_percentile_and_says_so():
    # A and B equal but varying: every resample and jackknife value is 0, so BCa's acceleration is 0/0
    ci = ev.bootstrap_interval([[1.0, 1.0, 2.0], [1.0, 1.0, 2.0]], ev._relative_change, paired=True, **FAST)
    assert ci["method"] == "percentile" and "BCa" in ci["note"] and ci["low"] == ci["high"] == 0.0


def test_markdown_table_shows_the_interval_and_its_method():
    rep = report_of(fake_outputs(12))
    row = rep["results"][0]
    table = ev.markdown_table(rep)
    ci = row["mean_accept_length_ci"]
    assert f"{row['mean_accept_length']:.3f} ({ci['low']:.3f} .. {ci['high']:.3f})" in table
    assert "| w | 0 | 12 |" in table and "| BCa |" in table and "accept length (95% CI)" in table


def test_accept_length_is_split_by_prompt_length():
    outs = ([fake_output([4] * 8, prompt_len=100) for _ in range(3)]
            + [fake_output([1, 2] * 4, prompt_len=ev.LONG_PROMPT_TOKENS + 1) for _ in range(2)])
    row = ev.acceptance_metrics(outs, BLOCK, [f"p{i}" for i in range(5)], n_resamples=200)
    split = row["accept_length_by_prompt_length"]
    assert split["short"] == {"prompts": 3, "mean_accept_length": 4.0}
    assert split["long"] == {"prompts": 2, "mean_accept_length": 1.5}
    assert row["per_prompt"]["p4"]["prompt_tokens"] == ev.LONG_PROMPT_TOKENS + 1
    table = ev.markdown_table({"block_size": BLOCK, "results": [{"workload": "agentic", "temperature": 0.0, **row}]})
    assert f"prompts <= {ev.LONG_PROMPT_TOKENS} / longer" in table and "4.000 (3) / 1.500 (2)" in table


def test_json_round_trip_keeps_per_prompt_values(tmp_path):
    outs = fake_outputs(8)
    ids = [f"agentic-{i}" for i in range(8)]
    rep = report_of(outs, ids)
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(rep))
    back = ev.load_report(tmp_path)
    pp = back["results"][0]["per_prompt"]
    assert list(pp) == ids
    assert [pp[i]["mean_accept_length"] for i in ids] == [o.mean_accept_length for o in outs]
    assert [pp[i]["pos_accepted"] for i in ids] == [o.pos_accepted for o in outs]
    # the stored intervals can be recomputed from the stored per-prompt values
    assert ev.row_intervals(pp, **FAST) == {k: rep["results"][0][k] for k in ("mean_accept_length_ci",
                                                                               "p1_acceptance_ci")}


def test_paired_comparison_of_identical_reports_is_zero():
    rep = report_of(fake_outputs(10))
    row = ev.compare_reports(rep, rep, **FAST)["rows"][0]
    assert row["change_pct"] == 0.0 and row["n_prompts"] == 10
    assert row["ci"]["low"] == row["ci"]["high"] == 0.0 and row["ci"]["method"] == "zero-width"


def test_paired_comparison_finds_a_ten_percent_gain():
    rng = np.random.default_rng(3)
    n = 16
    base = rng.uniform(1.5, 4.0, size=n)  # prompts differ a lot; B is 10% better on each, with small noise
    a = [fake_output([1]) for _ in range(n)]
    b = [fake_output([1]) for _ in range(n)]
    for o, v in zip(a, base):
        o.mean_accept_length = float(v)
    for o, v in zip(b, base * 1.10 * rng.normal(1.0, 0.02, size=n)):
        o.mean_accept_length = float(v)
    ids = [f"p{i}" for i in range(n)]
    cmp = ev.compare_reports(report_of(a, ids), report_of(b, ids), **FAST)
    row = cmp["rows"][0]
    assert row["change_pct"] == pytest.approx(10.0, abs=1.5)
    assert row["ci"]["method"] == "bca" and 0 < row["ci"]["low"] < row["change_pct"] < row["ci"]["high"] < 15
    # unpaired, the prompt-to-prompt spread would hide the gain: the paired interval is much narrower
    assert row["ci"]["high"] - row["ci"]["low"] < 5
    # prompts only one report holds are left out of the pairing and named
    cmp2 = ev.compare_reports(report_of(a[:-1], ids[:-1]), report_of(b, ids), **FAST)
    assert cmp2["rows"][0]["n_prompts"] == n - 1 and cmp2["rows"][0]["only_b"] == [ids[-1]]
    assert any("only in B" in note for note in cmp2["notes"])
    assert "+" in ev.compare_markdown(cmp) and "| w | 0 | 16 |" in ev.compare_markdown(cmp)


def test_compare_needs_per_prompt_values():
    rep = report_of(fake_outputs(4))
    del rep["results"][0]["per_prompt"]
    with pytest.raises(ValueError, match="per_prompt"):
        ev.compare_reports(rep, rep, **FAST)


def test_compare_from_the_config(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, scale in ((a, 1.0), (b, 1.2)):
        d.mkdir()
        (d / "eval.json").write_text(json.dumps(report_of(fake_outputs(8, scale=scale))))
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="eval_drafter", overrides=[
            f"compare=[{a / 'eval.json'},{b}]", f"output_dir={tmp_path / 'cmp'}", "n_resamples=300"])
    comparison = ev.run_compare(cfg)
    assert comparison["rows"][0]["change_pct"] > 0 and comparison["bootstrap"]["n_resamples"] == 300
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert saved["rows"][0]["change_pct"] == comparison["rows"][0]["change_pct"]
    assert "B vs A (95% CI)" in (tmp_path / "cmp" / "compare.md").read_text()


def test_checkpoint_names_the_shipped_drafter_or_a_folder():
    """checkpoint=builtin:NAME resolves to dspark/assets/NAME; a name that is not shipped fails before any loading."""
    from dspark.config import ConfigError
    from runners.common import ASSETS, resolve_drafter_path

    assert Path(resolve_drafter_path("builtin:dspark-smollm2")) == ASSETS / "dspark-smollm2"
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="eval_drafter", overrides=["checkpoint=builtin:no-such-drafter"])
    with pytest.raises(ConfigError, match="^checkpoint: the shipped drafter 'no-such-drafter'"):
        ev.run(cfg)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="eval_drafter", overrides=["checkpoint=/no/such/folder"])
    with pytest.raises(ConfigError, match="^checkpoint: '/no/such/folder' is not a folder"):
        ev.run(cfg)
