"""The training-only source code_debugging: ids, splits, counts, text, and no overlap with the packaged
arena-hard-style questions or with worked_problems' snippets (torch-free, seconds)."""

from __future__ import annotations

import re

import pytest

from source_checks import (arena_shingles, assert_deterministic_across_loads, assert_fits_context,
                           assert_refuses_path, assert_training_only_source, outside_code, prompts_sharing_shingles)
from workloads import DEFAULTS, build_workload, make_spec, split_of
from workloads import worked_problems
from workloads.code_debugging import ASKS, FRAMES, SNIPPETS, TEMPLATES, CodeDebuggingWorkload, debugging_text

NAME = "code_debugging"


@pytest.fixture(scope="module")
def workload() -> CodeDebuggingWorkload:
    w = build_workload(make_spec(NAME, split="all", num_prompts=None))
    w.pool()
    return w


def test_ids_are_unique_stable_and_built_from_keys(workload):
    pool = workload.pool()
    ids = [p.id for p in pool]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"code_debugging/[a-z0-9_]+/[a-z_]+/[a-z_]+", i)
                                             for i in ids)
    assert len({p.text for p in pool}) == len(pool)  # every combination reads differently
    by_id = {p.id: p for p in pool}
    key = next(iter(SNIPPETS))
    pid = f"{NAME}/{key}/two_fixes/on_call"
    assert by_id[pid].text == debugging_text(key, "two_fixes", "on_call")
    assert by_id[pid].text.startswith("I am on call and this started failing tonight. ")
    assert ASKS["two_fixes"] in by_id[pid].text and SNIPPETS[key].code in by_id[pid].text
    # the asks and frames of worked_problems come first, unchanged, and more follow
    assert list(ASKS)[:len(worked_problems.DEBUG_ASKS)] == list(worked_problems.DEBUG_ASKS)
    assert list(FRAMES)[:len(worked_problems.DEBUG_FRAMES)] == list(worked_problems.DEBUG_FRAMES)
    assert len(ASKS) > len(worked_problems.DEBUG_ASKS) and len(FRAMES) > len(worked_problems.DEBUG_FRAMES)
    # every template is used, the one each id picks
    assert {_template_of(p) for p in pool} == set(range(len(TEMPLATES)))


def _template_of(prompt) -> int:
    """The index of the template that reads as ``prompt``'s text."""
    key, ask, frame = prompt.id.split("/")[1:]
    s = SNIPPETS[key]
    (index,) = [i for i, t in enumerate(TEMPLATES)
                if worked_problems.snippet_prompt(prompt.id, s, ASKS[ask], FRAMES[frame], (t,)) == prompt.text]
    return index


def test_counts_languages_and_sources(workload):
    pool = workload.pool()
    assert len(pool) == len(SNIPPETS) * len(ASKS) * len(FRAMES)
    assert len(SNIPPETS) >= 150
    languages = {s.language for s in SNIPPETS.values()}
    assert languages <= set(worked_problems.FENCES) and len(languages) >= 10
    assert {p.source for p in pool} == {f"{NAME}:{s.fence}" for s in SNIPPETS.values()}
    assert all(re.fullmatch(r"[a-z]+_[a-z0-9_]+", k) for k in SNIPPETS)


def test_snippets_are_new_to_worked_problems():
    assert not set(SNIPPETS) & set(worked_problems.SNIPPETS)
    theirs = {line.strip() for s in worked_problems.SNIPPETS.values() for line in s.code.splitlines()
              if len(line.strip()) >= 40}
    for key, s in SNIPPETS.items():
        ours = {line.strip() for line in s.code.splitlines() if len(line.strip()) >= 40}
        assert len(ours & theirs) <= 1, (key, sorted(ours & theirs))
    assert len({s.code for s in SNIPPETS.values()}) == len(SNIPPETS)
    assert len({s.symptom for s in SNIPPETS.values()}) == len(SNIPPETS)


def test_splits_are_disjoint_and_non_empty(workload):
    train, evaluation = workload.available("train"), workload.available("eval")
    assert not {p.id for p in train} & {p.id for p in evaluation}
    assert len(train) + len(evaluation) == len(workload.pool())
    assert 0.7 < len(train) / len(workload.pool()) < 0.9
    assert all(split_of(p.id) == "eval" for p in evaluation)
    spec = make_spec(NAME)
    assert spec.split == "train" and spec.num_prompts is None and DEFAULTS[NAME]["max_tokens"] == 512
    drawn = build_workload(make_spec(NAME, num_prompts=40, seed=2)).prompts()
    assert {p.id for p in drawn} <= {p.id for p in train}


def test_text_is_filled_and_holds_one_fenced_snippet(workload):
    for p in workload.pool():
        assert len(p.messages) == 1 and p.messages[0]["role"] == "user"
        assert not re.search(r"\{(frame|language|symptom|fence|code|ask)\}", outside_code(p.text)), p.id  # filled
        s = SNIPPETS[p.id.split("/")[1]]
        blocks = re.findall(r"```(\w+)\n(.*?)\n```", p.text, flags=re.S)
        assert blocks == [(s.fence, s.code)], p.id
        assert s.code and s.code == s.code.strip("\n"), p.id
        assert not s.symptom.endswith(".") and re.match(r"(\(\w+\) )?[a-z]", s.symptom), p.id  # "(dialect) should"


def test_deterministic_across_loads(workload):
    assert_deterministic_across_loads(NAME, CodeDebuggingWorkload, workload.pool())


def test_path_is_refused_clearly():
    assert_refuses_path(NAME)


def test_no_prompt_shares_an_8_word_shingle_with_the_arena_hard_questions(workload):
    shared = prompts_sharing_shingles(workload.pool(), arena_shingles())
    assert not shared, list(shared.items())[:5]


def test_prompts_fit_a_2048_token_context_with_their_output_cap(workload, smollm2_tokenizer):
    assert_fits_context(NAME, workload.pool(), smollm2_tokenizer)


def test_make_training_data_composes_it_without_making_it_a_default():
    assert_training_only_source(NAME)
