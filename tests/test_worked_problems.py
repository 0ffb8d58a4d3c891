"""The training-only source worked_problems: ids, splits, text, well-posed puzzles, and no overlap with the packaged
arena-hard-style questions (torch-free, seconds)."""

from __future__ import annotations

import re
from itertools import permutations, product

import pytest

from source_checks import (arena_shingles, assert_deterministic_across_loads, assert_fits_context,
                           assert_refuses_path_and_unknown_category, assert_training_only_source, outside_code,
                           prompts_sharing_shingles)
from workloads import DEFAULTS, WorkloadError, build_workload, make_spec, split_of
from workloads.worked_problems import (CATEGORIES, DEBUG_ASKS, DEBUG_FRAMES, KNIGHT_SETUPS, MATH, MATH_ASKS,
                                       OWNERSHIP_SETUPS, PUZZLES, RACE_SETUPS, REASONING_ASKS, SEATING_SETUPS,
                                       SNIPPETS, SUSPECT_SETUPS, WorkedProblemsWorkload, category_items, math_text,
                                       reasoning_text)

NAME = "worked_problems"
# Pinned ids and fragments of their text: a change here means prompts (and their train/eval split) moved.
PINNED = {
    "worked_problems/debug/go_race_counter/minimal_fix/production": (
        "A bug report came in from production.", "```go\nfunc countWords(docs []string) int {",
        "total += len(strings.Fields(text))", "write a regression test that fails before the fix"),
    "worked_problems/debug/sql_equals_null/junior/learning": (
        "I am learning SQL and I am stuck.", "```sql\nSELECT COUNT(*) AS open_tickets", "WHERE closed_at = NULL;"),
    "worked_problems/math/saline_mixture/10-30-20-15/steps": (
        "a 10% salt solution and a 30% salt solution", "20 litres of a 15% solution", "showing every calculation"),
    "worked_problems/math/compound_interest/2.4-quarterly-25000-12/check": (
        "pays 2.4% a year, compounded quarterly", "If 25,000 dollars is deposited", "after 12 years"),
    "worked_problems/reasoning/knights_and_knaves/s2/island/facts_first": (
        "Ash says: \"Cole is a knight.\" Briar says: \"Ash is a knave.\"", "Which of them are knights"),
    "worked_problems/reasoning/critical_path/g2/dinner/steps": (
        "- T2, make the stock: 50 minutes, waits for nothing", "- T6, set the table: 10 minutes, waits for T4, T5"),
}


@pytest.fixture(scope="module")
def workload() -> WorkedProblemsWorkload:
    w = build_workload(make_spec(NAME, split="all", num_prompts=None))
    w.pool()
    return w


def test_ids_are_unique_stable_and_pinned(workload):
    pool = workload.pool()
    ids = [p.id for p in pool]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"worked_problems/[\w.\-/]+", i) for i in ids)
    assert len({p.text for p in pool}) == len(pool)  # every combination reads differently
    by_id = {p.id: p for p in pool}
    for pid, fragments in PINNED.items():
        text = by_id[pid].messages[0]["content"]
        for fragment in fragments:
            assert fragment in text, (pid, fragment)
    assert [split_of(pid) for pid in PINNED] == [workload.split_of(by_id[pid]) for pid in PINNED]
    # the same text from the module's builders
    debug = dict(category_items("debug"))
    assert debug["sql_equals_null/junior/learning"] == \
        by_id["worked_problems/debug/sql_equals_null/junior/learning"].text
    assert math_text("saline_mixture", (10, 30, 20, 15), "steps") == \
        by_id["worked_problems/math/saline_mixture/10-30-20-15/steps"].text
    assert reasoning_text("critical_path", ("g2/dinner",), "steps") == \
        by_id["worked_problems/reasoning/critical_path/g2/dinner/steps"].text


def test_categories_counts_and_sources(workload):
    pool = workload.pool()
    counts = {c: sum(p.source == f"{NAME}:{c}" for p in pool) for c in CATEGORIES}
    assert {p.source for p in pool} == {f"{NAME}:{c}" for c in CATEGORIES}
    assert counts["debug"] == len(SNIPPETS) * len(DEBUG_ASKS) * len(DEBUG_FRAMES)
    assert counts["math"] == sum(len(t.cases) for t in MATH.values()) * len(MATH_ASKS)
    assert counts["reasoning"] == sum(len(list(product(*p.axes))) for p in PUZZLES.values()) * len(REASONING_ASKS)
    assert len(SNIPPETS) >= 40 and len(MATH) >= 30 and len(PUZZLES) >= 20
    assert len({s.language for s in SNIPPETS.values()}) >= 8
    assert all(500 <= n <= 1500 for n in counts.values()), counts
    assert 1500 <= len(pool) <= 4000
    assert all(p.id.startswith(f"{NAME}/{p.source.split(':')[1]}/") for p in pool)


def test_splits_are_disjoint_and_non_empty_in_every_category(workload):
    train, evaluation = workload.available("train"), workload.available("eval")
    assert not {p.id for p in train} & {p.id for p in evaluation}
    assert len(train) + len(evaluation) == len(workload.pool())
    for category in CATEGORIES:
        source = f"{NAME}:{category}"
        assert sum(p.source == source for p in train) > 300
        assert sum(p.source == source for p in evaluation) > 50
    assert all(split_of(p.id) == "eval" for p in evaluation)
    spec = make_spec(NAME)
    assert spec.split == "train" and spec.num_prompts is None and DEFAULTS[NAME]["max_tokens"] == 512
    drawn = build_workload(make_spec(NAME, num_prompts=30, seed=2)).prompts()
    assert {p.id for p in drawn} <= {p.id for p in train}
    assert {p.source for p in drawn} == {f"{NAME}:{c}" for c in CATEGORIES}  # stratified by category


def test_text_is_filled_and_debug_prompts_hold_one_fenced_snippet(workload):
    for p in workload.pool():
        assert len(p.messages) == 1 and p.messages[0]["role"] == "user"
        assert not re.search(r"\{[^{}\n]*\}", outside_code(p.text)), p.id
        if p.source == f"{NAME}:debug":
            snippet = SNIPPETS[p.id.split("/")[2]]
            blocks = re.findall(r"```(\w+)\n(.*?)\n```", p.text, flags=re.S)
            assert blocks == [(snippet.fence, snippet.code)], p.id
        else:
            assert "```" not in p.text


def test_deterministic_across_loads(workload):
    assert_deterministic_across_loads(NAME, WorkedProblemsWorkload, workload.pool())


def test_path_and_bad_input_are_refused_clearly():
    assert_refuses_path_and_unknown_category(NAME, category_items)
    with pytest.raises(WorkloadError, match="'saline_mixture' case .* is not a well-posed problem"):
        math_text("saline_mixture", (10, 30, 20, 40), "steps")
    with pytest.raises(WorkloadError, match="needs values for"):
        math_text("saline_mixture", (10, 30), "steps")
    with pytest.raises(WorkloadError, match="has 2 axes"):
        reasoning_text("seating", ("s1",), "steps")


def test_no_prompt_shares_an_8_word_shingle_with_the_arena_hard_questions(workload):
    shared = prompts_sharing_shingles(workload.pool(), arena_shingles())
    assert not shared, list(shared.items())[:5]


# --- the deduction puzzles have exactly one solution ---------------------------------------------------------------

KNIGHT_MEANINGS = {
    "x_is_T": lambda x, y, z: x, "y_is_T": lambda x, y, z: y, "z_is_T": lambda x, y, z: z,
    "x_is_F": lambda x, y, z: not x, "y_is_F": lambda x, y, z: not y, "z_is_F": lambda x, y, z: not z,
    "y_z_same": lambda x, y, z: y == z, "at_least_one_F": lambda x, y, z: not (x and y and z),
    "all_F": lambda x, y, z: not (x or y or z), "exactly_two_T": lambda x, y, z: x + y + z == 2,
    "if_y_T_then_z_T": lambda x, y, z: (not y) or z, "x_or_y_T": lambda x, y, z: x or y,
}


def _position_holds(pos: dict[str, int], kind: str, a: str, b: str | int | None = None) -> bool:
    if kind == "at":
        return pos[a] == b
    if kind == "end":
        return pos[a] in (1, 5)
    if kind == "not_end":
        return pos[a] not in (1, 5)
    gap = abs(pos[a] - pos[b])
    return {"left": pos[a] < pos[b], "next": gap == 1, "not_next": gap != 1, "gap1": gap == 2}[kind]


def _ownership_holds(pa: dict[str, str], pb: dict[str, str], kind: str, *args: str) -> bool:
    owner_a = {v: k for k, v in pa.items()}
    owner_b = {v: k for k, v in pb.items()}
    return {"pa": lambda: pa[args[0]] == args[1], "not_pa": lambda: pa[args[0]] != args[1],
            "pb": lambda: pb[args[0]] == args[1], "not_pb": lambda: pb[args[0]] != args[1],
            "ab": lambda: owner_a[args[0]] == owner_b[args[1]],
            "not_ab": lambda: owner_a[args[0]] != owner_b[args[1]],
            "pa_or": lambda: pa[args[0]] in args[1:]}[kind]()


def test_deduction_puzzles_have_exactly_one_solution():
    assert set(PUZZLES["knights_and_knaves"].axes[0]) == set(KNIGHT_SETUPS)
    for key, said in KNIGHT_SETUPS.items():
        solutions = [v for v in product([True, False], repeat=3)
                     if all(v[i] == KNIGHT_MEANINGS[s](*v) for i, s in enumerate(said))]
        assert len(solutions) == 1, key
    people = ["p1", "p2", "p3", "p4", "p5"]
    for key, clues in {**SEATING_SETUPS, **RACE_SETUPS}.items():
        solutions = [order for order in permutations(range(1, 6))
                     if all(_position_holds(dict(zip(people, order)), *clue) for clue in clues)]
        assert len(solutions) == 1, key
    four = ["p1", "p2", "p3", "p4"]
    for key, clues in OWNERSHIP_SETUPS.items():
        solutions = [(a, b) for a, b in product(permutations(["a1", "a2", "a3", "a4"]),
                                                permutations(["b1", "b2", "b3", "b4"]))
                     if all(_ownership_holds(dict(zip(four, a)), dict(zip(four, b)), *clue) for clue in clues)]
        assert len(solutions) == 1, key
    for key, (mode, statements) in SUSPECT_SETUPS.items():
        def true_count(culprit: str) -> int:
            return sum({"did": culprit == s[1], "didnt": culprit != s[1], "one_of": culprit in s[1:]}[s[0]]
                       for s in statements)
        wanted = 1 if mode == "one_true" else len(statements) - 1
        assert len([c for c in four if true_count(c) == wanted]) == 1, key
        assert all(s[1:].count(f"p{i}") == 0 for i, s in enumerate(statements, 1)), key  # nobody names themself


def test_prompts_fit_a_2048_token_context_with_their_output_cap(workload, smollm2_tokenizer):
    assert_fits_context(NAME, workload.pool(), smollm2_tokenizer)


# --- make_training_data --------------------------------------------------------------------------------------------

def test_make_training_data_composes_it_without_making_it_a_default():
    assert_training_only_source(NAME)
