"""The drafting ledger: a drafting arm's longer step against the tokens its row-steps emit, from the counters."""

import re

import pytest

from dspark.bench.draft_ledger import draft_ledger
from dspark.bench.report import draft_ledger_lines, write_report
from test_bench_report import build_experiment


def target_only(**extra):
    """900,000 tokens in 900,000 row-steps; 256-row steps of 3.0 ms."""
    return {"decode_steps": 4000, "request_steps": 900_000, "verified_tokens": 0, "emitted_tokens": 900_000,
            "trimmed_steps": 0, "device_idle_fraction": 0.05,
            "device/full_b256_step_ms_median": 3.0, "device/full_b256_steps": 3000,
            "device/full_b128_step_ms_median": 2.0, "device/full_b128_steps": 500, **extra}


def drafting(**extra):
    """The same tokens at 3.0 a row-step; at 256 rows 600 whole-block steps of 6.0 ms and 400 trimmed of 5.0 ms."""
    return {"decode_steps": 1300, "request_steps": 300_000, "verified_tokens": 2_100_000, "emitted_tokens": 900_000,
            "trimmed_steps": 400, "device_idle_fraction": 0.02,
            "device/full_b256_step_ms_median": 6.0, "device/full_b256_steps": 600,
            "device/ragged_b256_step_ms_median": 5.0, "device/ragged_b256_steps": 400, **extra}


def summary_of(a, b, full_load=40.0, whole=35.0):
    return {"counters": {"A": a, "B": b}, "headline_metric": "output_tokens_per_s",
            "arms": {"A": {"label": "target_only"}, "B": {"label": "dspark"}},
            "statistics": {"output_tokens_per_s": {"change_pct": whole},
                           "steady_output_tokens_per_s": {"change_pct": full_load}}}


def test_drafting_pays_while_its_step_grows_less_than_its_tokens_per_row_step():
    ledger = draft_ledger(summary_of(target_only(), drafting()))
    assert (ledger.target_only.arm, ledger.drafting.arm, ledger.rows) == ("A", "B", 256)
    assert ledger.token_ratio == pytest.approx(3.0)
    assert ledger.drafting_step_ms == pytest.approx(0.6 * 6.0 + 0.4 * 5.0)  # every mode, by its steps
    assert ledger.step_ratio == pytest.approx(5.6 / 3.0)
    assert ledger.device_bound_change == pytest.approx(3.0 / (5.6 / 3.0) - 1)


def test_no_ledger_without_one_target_only_arm_and_one_drafting_arm():
    assert draft_ledger(summary_of(drafting(), drafting())) is None
    assert draft_ledger(summary_of(target_only(), target_only())) is None
    assert draft_ledger({"counters": {"A": target_only()}}) is None and draft_ledger({}) is None


def test_without_a_common_bucket_the_steps_are_not_compared():
    b = {k: v for k, v in drafting().items() if not k.startswith("device/")}
    summary = summary_of(target_only(), b)
    assert draft_ledger(summary).rows is None and draft_ledger(summary).device_bound_change is None
    assert "not compared" in "\n".join(draft_ledger_lines(summary))


def test_the_drafting_arm_may_be_a_and_the_measured_change_is_turned_to_its_direction():
    text = "\n".join(draft_ledger_lines(summary_of(drafting(), target_only(), full_load=-20.0, whole=-50.0)))
    assert "+100.00% over whole blocks" in text and "+25.00% at full load" in text


def test_the_report_shows_the_ledger_where_the_time_went(tmp_path):
    summary, blocks, requests = build_experiment()
    summary["counters"] = {"A": target_only(), "B": drafting()}
    text = re.sub(r" +", " ", write_report(tmp_path / "r", summary, blocks, requests)["report"].read_text())
    part = text[text.index("## Where the time went"):]
    assert "What drafting bought and cost: B against A" in part
    assert "| tokens per row-step | 1.000 | 3.000 | +200.0% |" in part
    assert "| device ms per step at 256 rows | 3.00 | 5.60 | +86.7% |" in part
    assert "device step took 1.87x A's" in part and "pays while its step is under 3.00x as long" in part
    assert "it nets +60.7%" in part
