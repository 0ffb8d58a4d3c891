"""The training-only source scenario_requests: ids, splits, counts, text, well-posed math cases, and no overlap with
the packaged arena-hard-style questions or the other arena-style training sources (torch-free, seconds)."""

from __future__ import annotations

import re

import pytest

from source_checks import (arena_shingles, assert_deterministic_across_loads, assert_fits_context,
                           assert_refuses_path_and_unknown_category, assert_training_only_source, outside_code,
                           prompts_sharing_shingles, shingles)
from workloads import DEFAULTS, WorkloadError, build_workload, make_spec, split_of
from workloads.scenario_requests import (CATEGORIES, INCIDENTS, MATH, SCENARIOS, ScenarioRequestsWorkload,
                                         category_items, coding_text, debugging_text, math_text, reasoning_text,
                                         system_design_text, writing_text)

NAME = "scenario_requests"
# Pinned ids and fragments of their text: a change here means prompts (and their train/eval split) moved.
PINNED = {
    "scenario_requests/debugging/go_goroutine_leak/no_debugger/three_hypotheses": (
        "climbs from 300 at start to 250,000 after two days", "```go\nfunc fetchAll(ctx context.Context",
        "cannot attach a debugger", "Rank three hypotheses"),
    "scenario_requests/debugging/alb_502s/release_freeze/postmortem": (
        "About one request in 800", "idle timeout is 60 seconds", "blameless postmortem"),
    "scenario_requests/reasoning/warehouse_site/z_doubles/table": (
        "X (4,000 orders a month), Y (2,500) and Z (1,500)", "redo the decision assuming orders from Z double"),
    "scenario_requests/math/car_loan_offers/18500-3500-5-7.9-6.4-600/sensitivity": (
        "buying a used car for $18,500", "a 5-year loan at 7.9% a year", "a $600 arrangement fee",
        "changes by 10%"),
    "scenario_requests/math/latency_sample/twelve/worked": (
        "of twelve requests", "42, 38, 51, 40, 45, 39, 220, 44", "sanity-check the result"),
    "scenario_requests/writing/late_sofa_reply/bullets/half_length": (
        "Daniel Price", "order 48213", "refund of the $89 delivery charge", "second version at half the length"),
    "scenario_requests/coding/parse_duration/rust/tests_first": (
        "parse_duration(text) -> int", '"1h30m" gives 5400', "Rust", "Write the tests first"),
    "scenario_requests/system_design/bike_sharing/national/region_loss": (
        "a bike-sharing system with docking stations", "five million users", "loss of a whole cloud region"),
    # appended later (the lists grow at their ends): an incident with a new context and ask, a new system, scale and
    # requirement, a new decision with a new ask
    "scenario_requests/debugging/redis_evictions/vendor_blame/roll_back_or_not": (
        "maxmemory 4 GB, policy allkeys-lru", "evidence I can show them", "roll back, ship a hot fix or wait"),
    "scenario_requests/system_design/feature_flags/enterprise_tenants/exactly_once": (
        "switch features on for chosen users", "300 business customers", "take effect exactly once"),
    "scenario_requests/reasoning/solar_panels/battery/break_even": (
        "4 kW solar system costs $7,800", "raises the share used at home to 80%", "Work out where the options break"),
}
COUNT_RANGES = {"debugging": (3000, 3700), "reasoning": (1200, 1600), "math": (900, 1200), "writing": (2300, 2900),
                "coding": (2300, 2900), "system_design": (2100, 2700)}


@pytest.fixture(scope="module")
def workload() -> ScenarioRequestsWorkload:
    w = build_workload(make_spec(NAME, split="all", num_prompts=None))
    w.pool()
    return w


def _shingles(text: str) -> set[tuple[str, ...]]:
    """8-word shingles of the prose (fenced code left out)."""
    return shingles(outside_code(text))


def test_ids_are_unique_well_formed_and_pinned(workload):
    pool = workload.pool()
    ids = [p.id for p in pool]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"scenario_requests/[a-z_]+/[\w.\-]+/[\w.\-]+/[\w.\-]+", i) for i in ids)
    assert len({p.text for p in pool}) == len(pool)  # every combination reads differently
    by_id = {p.id: p for p in pool}
    for pid, fragments in PINNED.items():
        text = by_id[pid].messages[0]["content"]
        for fragment in fragments:
            assert fragment in text, (pid, fragment)
    assert {pid.split("/")[1] for pid in PINNED} == set(CATEGORIES)
    assert [split_of(pid) for pid in PINNED] == [workload.split_of(by_id[pid]) for pid in PINNED]
    # the same text from the module's builders
    assert debugging_text("alb_502s", "release_freeze", "postmortem") == \
        by_id["scenario_requests/debugging/alb_502s/release_freeze/postmortem"].text
    assert reasoning_text("warehouse_site", "z_doubles", "table") == \
        by_id["scenario_requests/reasoning/warehouse_site/z_doubles/table"].text
    assert math_text("car_loan_offers", (18500, 3500, 5, 7.9, 6.4, 600), "sensitivity") == \
        by_id["scenario_requests/math/car_loan_offers/18500-3500-5-7.9-6.4-600/sensitivity"].text
    assert writing_text("late_sofa_reply", "bullets", "half_length") == \
        by_id["scenario_requests/writing/late_sofa_reply/bullets/half_length"].text
    assert coding_text("parse_duration", "rust", "tests_first") == \
        by_id["scenario_requests/coding/parse_duration/rust/tests_first"].text
    assert system_design_text("bike_sharing", "national", "region_loss") == \
        by_id["scenario_requests/system_design/bike_sharing/national/region_loss"].text


def test_categories_counts_and_sources(workload):
    pool = workload.pool()
    counts = {c: sum(p.source == f"{NAME}:{c}" for p in pool) for c in CATEGORIES}
    assert {p.source for p in pool} == {f"{NAME}:{c}" for c in CATEGORIES}
    for category, (low, high) in COUNT_RANGES.items():
        assert low <= counts[category] <= high, (category, counts[category])
    assert 12500 <= len(pool) <= 14500
    assert all(p.id.startswith(f"{NAME}/{p.source.split(':')[1]}/") for p in pool)
    assert len(INCIDENTS) >= 50 and len(SCENARIOS) >= 30 and len(MATH) >= 20
    assert sum("```" in text for text in INCIDENTS.values()) >= 3  # some incidents quote code or config
    assert all(len(changes) >= 2 for _, changes in SCENARIOS.values())


def test_splits_are_disjoint_near_20_percent_and_non_empty_in_every_category(workload):
    train, evaluation = workload.available("train"), workload.available("eval")
    assert not {p.id for p in train} & {p.id for p in evaluation}
    assert len(train) + len(evaluation) == len(workload.pool())
    assert 0.17 <= len(evaluation) / len(workload.pool()) <= 0.23
    for category in CATEGORIES:
        source = f"{NAME}:{category}"
        n_eval, n_all = sum(p.source == source for p in evaluation), sum(p.source == source for p in workload.pool())
        assert 0.14 <= n_eval / n_all <= 0.26, (category, n_eval, n_all)
    assert all(split_of(p.id) == "eval" for p in evaluation)
    spec = make_spec(NAME)
    assert spec.split == "train" and spec.num_prompts is None and spec.temperature == 0.0
    assert DEFAULTS[NAME]["max_tokens"] == 512
    drawn = build_workload(make_spec(NAME, num_prompts=30, seed=2)).prompts()
    assert {p.id for p in drawn} <= {p.id for p in train}
    assert {p.source for p in drawn} == {f"{NAME}:{c}" for c in CATEGORIES}  # stratified by category


def test_text_is_filled_single_user_turn_and_40_to_400_words(workload):
    for p in workload.pool():
        assert len(p.messages) == 1 and p.messages[0]["role"] == "user"
        assert p.max_tokens is None
        assert not re.search(r"\{[a-z_]+\}", outside_code(p.text)), p.id
        assert 40 <= len(p.text.split()) <= 400, (p.id, len(p.text.split()))
        assert "  " not in outside_code(p.text), p.id
        assert p.text.count("```") % 2 == 0
        if p.source != f"{NAME}:debugging":
            assert "```" not in p.text


def test_deterministic_across_loads(workload):
    assert_deterministic_across_loads(NAME, ScenarioRequestsWorkload, workload.pool())


def test_path_and_bad_input_are_refused_clearly():
    assert_refuses_path_and_unknown_category(NAME, category_items)
    with pytest.raises(WorkloadError, match="'ladder_slip' case .* is not a well-posed problem"):
        math_text("ladder_slip", (4, 3, 2), "worked")  # the foot would end up further out than the ladder is long
    with pytest.raises(WorkloadError, match="needs values for"):
        math_text("ladder_slip", (4, 1), "worked")


def test_math_cases_are_well_posed_and_formatted():
    for name, template in MATH.items():
        for case in template.cases:
            assert len(case) == len(template.fields), name
            assert template.valid is None or template.valid(*case), (name, case)
    text = math_text("garden_path", (15, 9, 1, 22, 6.5), "worked")
    assert "$6.50 per square metre" in text and "$22 per square metre" in text


def test_no_prompt_shares_an_8_word_shingle_with_the_arena_hard_questions(workload):
    shared = prompts_sharing_shingles(workload.pool(), arena_shingles(), _shingles)
    assert not shared, list(shared.items())[:5]


@pytest.mark.parametrize("other", ["hard_questions", "worked_problems"])
def test_no_prompt_shares_an_8_word_shingle_with_the_other_arena_style_training_sources(workload, other):
    theirs: set[tuple[str, ...]] = set()
    for p in build_workload(make_spec(other, split="all", num_prompts=None)).pool():
        theirs |= _shingles(p.text)
    shared = prompts_sharing_shingles(workload.pool(), theirs, _shingles)
    assert not shared, list(shared.items())[:5]


def test_prompts_fit_a_2048_token_context_with_their_output_cap(workload, smollm2_tokenizer):
    assert_fits_context(NAME, workload.pool(), smollm2_tokenizer)


# --- make_training_data --------------------------------------------------------------------------------------------

def test_make_training_data_composes_it_without_making_it_a_default():
    assert_training_only_source(NAME)
