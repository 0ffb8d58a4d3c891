"""The trim ledger: a trimming arm's step time saved against the tokens its trims cost, from the arms' counters."""

import json
import re

import pandas as pd
import pytest

from dspark.bench.report import compare_runs, trim_ledger_lines, write_report, write_sweep_report
from dspark.bench.trim_ledger import trim_ledger
from test_bench_report import build_experiment


def whole_block(**extra):
    """A verify-all arm: 1,000 decode steps of 200 rows, 7 drafts verified per row, 4.5 tokens per row-step; its
    256-row steps take 6.0 ms; 500 prefills of 3.0 ms beside them (7.5 us per row-step)."""
    return {"decode_steps": 1000, "request_steps": 200_000, "verified_tokens": 1_400_000, "emitted_tokens": 900_000,
            "trimmed_steps": 0, "device_idle_fraction": 0.04, "prefill_graph_replays": 500,
            "device/prefill_step_ms_median": 3.0,
            "device/full_b256_step_ms_median": 6.0, "device/full_b256_steps": 600,
            "device/full_b128_step_ms_median": 3.0, "device/full_b128_steps": 100, **extra}


def forced_trim(**extra):
    """Every step trimmed to 4 drafts a row; the same 900,000 tokens at 4.0 a row-step (225,000 row-steps); its
    256-row steps take 5.4 ms."""
    return {"decode_steps": 1100, "request_steps": 225_000, "verified_tokens": 900_000, "emitted_tokens": 900_000,
            "trimmed_steps": 1100, "device_idle_fraction": 0.06, "prefill_graph_replays": 500,
            "device/ragged_b256_step_ms_median": 5.4, "device/ragged_b256_steps": 700,
            "device/ragged_b64_step_ms_median": 1.5, "device/ragged_b64_steps": 90,
            "device/prefill_step_ms_median": 3.0, **extra}


def summary_of(a, b, full_load=0.5, whole=-2.0):
    return {"counters": {"A": a, "B": b}, "headline_metric": "output_tokens_per_s",
            "arms": {"A": {"label": "verify_all"}, "B": {"label": "forced_trim"}},
            "statistics": {"output_tokens_per_s": {"change_pct": whole},
                           "steady_output_tokens_per_s": {"change_pct": full_load}}}


def test_the_ledger_prices_the_trims_step_saving_against_the_tokens_they_cost():
    ledger = trim_ledger(summary_of(whole_block(), forced_trim()))
    assert (ledger.full.arm, ledger.trim.arm, ledger.rows) == ("A", "B", 256)  # the deepest bucket both timed
    assert ledger.full.verified_per_row_step == pytest.approx(7.0)
    assert ledger.trim.verified_per_row_step == pytest.approx(4.0)
    assert ledger.token_cost == pytest.approx(1 - 4.0 / 4.5)
    assert ledger.step_saving == pytest.approx(0.1)
    # device-bound at 256 rows: (4.0 / 4.5) x (6.0 / 5.4) - 1 = -1.2%: the trims cost more tokens than time
    assert ledger.device_bound_change == pytest.approx((4.0 / 4.5) * (6.0 / 5.4) - 1)
    assert ledger.device_bound_change < 0
    # the same prefills over more row-steps; with their device time on every step the change is diluted: at 256
    # rows the whole-block arm takes 200,000 / 256 steps of 6.0 ms and 1,500 ms of prefills, the trimming arm
    # 225,000 / 256 steps of 5.4 ms and the same prefills, for the same tokens
    assert ledger.trim.prefill_us_per_row_step == pytest.approx(1.5e6 / 225_000)
    serial = (200_000 / 256 * 6.0 + 1500) / (225_000 / 256 * 5.4 + 1500) - 1
    assert ledger.serial_bound_change == pytest.approx(serial)
    assert ledger.device_bound_change < ledger.serial_bound_change < 0  # the fixed prefill time dilutes the loss
    # 0.6 ms saved over 256 rows x 3 drafts left out
    assert ledger.us_per_trimmed_draft == pytest.approx(600 / (256 * 3))


def test_an_arm_that_trimmed_some_steps_prices_its_whole_block_steps_as_the_whole_block_arms():
    # its own whole-block steps at 256 rows ran lighter moments (a median of 5.0 ms): they are priced at the other
    # arm's 6.0 ms, the same work, so the saving is only what its trimmed steps saved
    b = forced_trim(trimmed_steps=550, **{"device/full_b256_step_ms_median": 5.0, "device/full_b256_steps": 300})
    ledger = trim_ledger(summary_of(whole_block(), b))
    assert ledger.trimmed_share_at_rows == pytest.approx(0.7)
    assert ledger.trim_step_ms == pytest.approx(0.7 * 5.4 + 0.3 * 6.0)
    assert ledger.step_saving == pytest.approx(0.7 * 0.1)
    assert ledger.trimmed_share_of_steps == pytest.approx(0.5)
    assert ledger.us_per_trimmed_draft is None  # its average cells per row-step mix trimmed and whole steps


def test_the_deepest_bucket_is_one_where_the_trimming_arm_trimmed():
    b = forced_trim(**{"device/full_b512_step_ms_median": 9.0, "device/full_b512_steps": 40})
    a = whole_block(**{"device/full_b512_step_ms_median": 9.0, "device/full_b512_steps": 60})
    assert trim_ledger(summary_of(a, b)).rows == 256  # at 512 rows it trimmed nothing


@pytest.mark.parametrize("b", [whole_block(), forced_trim(trimmed_steps=0, verified_tokens=1_400_000)])
def test_no_ledger_without_exactly_one_trimming_arm_and_one_whole_block_arm(b):
    assert trim_ledger(summary_of(whole_block(), b)) is None  # neither trims
    assert trim_ledger(summary_of(forced_trim(), forced_trim())) is None  # both trim
    target_only = {"decode_steps": 900, "request_steps": 900_000, "verified_tokens": 0, "emitted_tokens": 900_000}
    assert trim_ledger(summary_of(target_only, forced_trim())) is None  # the other arm drafted nothing
    assert trim_ledger({"counters": {}}) is None and trim_ledger({}) is None


def test_without_a_common_bucket_the_ledger_gives_the_token_cost_and_says_the_saving_is_unknown():
    b = {k: v for k, v in forced_trim().items() if not k.startswith("device/ragged_b256")}
    b.update({"device/ragged_b32_step_ms_median": 1.2, "device/ragged_b32_steps": 50})
    summary = summary_of(whole_block(), b)
    ledger = trim_ledger(summary)
    assert ledger.rows is None and ledger.step_saving is None and ledger.device_bound_change is None
    text = "\n".join(trim_ledger_lines(summary))
    assert "not known" in text and "11.1% of the tokens a row-step emits" in text


def test_the_trimming_arm_may_be_a_and_the_measured_change_is_turned_to_its_direction():
    summary = summary_of(forced_trim(), whole_block(), full_load=-0.5, whole=25.0)  # B vs A
    ledger = trim_ledger(summary)
    assert (ledger.full.arm, ledger.trim.arm) == ("B", "A")
    text = "\n".join(trim_ledger_lines(summary))
    assert "-20.00% over whole blocks" in text  # 1 / 1.25 - 1
    assert "+0.50% at full load" in text


def test_the_report_shows_the_ledger_in_the_planner_section(tmp_path):
    summary, blocks, requests = build_experiment()
    text = write_report(tmp_path / "r0", summary, blocks, requests)["report"].read_text()
    assert "trims bought and cost" not in text  # the fixture's counters hold no row-steps: no ledger
    summary["counters"] = {"A": whole_block(), "B": forced_trim()}
    text = re.sub(r" +", " ", write_report(tmp_path / "r1", summary, blocks, requests)["report"].read_text())
    planner = text[text.index("## Planner"):text.index("## Where the time went")]
    assert "- What B's trims bought and cost against A" in planner
    assert "| drafts verified per row-step | 7.00 | 4.00 | -42.9% |" in planner
    assert "| tokens per row-step | 4.500 | 4.000 | -11.1% |" in planner
    assert "| device ms at 256 rows: a whole-block / a trimmed step | 6.00 | 5.40 | -10.0% |" in planner
    assert "| share of the steps at 256 rows trimmed | 0% | 100% | |" in planner
    assert "| device ms per step at 256 rows, mean | 6.00 | 5.40 | -10.0% |" in planner
    assert "mean device step 10.0% shorter, 0.78 us per draft left out" in planner
    assert "| prefill device us per row-step | 7.5 | 6.7 | -11.1% |" in planner
    assert "Breaking even takes a step 11.1% shorter" in planner
    assert "the two net -1.2% against A (tokens per row-step x steps per ms) if the prefills hid beside the steps, " \
           "-0.9% if they ran beside none" in planner


def test_a_sweep_tables_the_ledger_of_each_job_that_trimmed(tmp_path):
    jobs = ({"A": whole_block(), "B": forced_trim()}, {"A": whole_block(), "B": whole_block()})
    for job, counters in enumerate(jobs):
        summary, _, _ = build_experiment(gain=0.05 * job, seed=job)
        summary["counters"] = counters
        (tmp_path / str(job)).mkdir()
        (tmp_path / str(job) / "summary.json").write_text(json.dumps(summary))
    table = compare_runs(sorted(tmp_path.rglob("summary.json")))
    headline = table[table["is_headline"]].set_index("param/gain")
    assert headline.loc[0.0, "trim_ledger/token_cost_pct"] == pytest.approx(100 * (1 - 4.0 / 4.5))
    assert headline.loc[0.0, "trim_ledger/rows"] == 256
    assert pd.isna(headline.loc[0.05, "trim_ledger/trim_arm"])  # neither arm trimmed: no ledger
    text = re.sub(r" +", " ", write_sweep_report(tmp_path)["markdown"].read_text())
    section = text[text.index("## What the trims bought and cost"):]
    assert "| gain=0.0 | B | 256 | 7.00 -> 4.00 | 11.1% | 10.0% | 0.78 | -1.2% / -0.9% |" in section
    assert "gain=0.05" not in section.split("\n\n")[1]  # the table lists only the job that trimmed
