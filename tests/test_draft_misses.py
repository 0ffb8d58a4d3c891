"""dspark.bench.draft_misses: which verified drafts were rejected, read off a request's per-step record and its
tokens, and the tally by the kind of the target's token there; runners.eval_drafter's rows and table carry it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dspark.bench.draft_misses import TOKEN_KINDS, draft_misses_by_kind, misses_line, token_kind, verified_drafts
from runners import eval_drafter as ev


@pytest.mark.parametrize("text, kind", [
    (" the", "word start"), ("the", "word piece"), ("ing", "word piece"), (" don't", "word start"),
    (" 42", "number"), ("3.5", "number"), ("1,000", "number"), (".", "punctuation"), (" (", "punctuation"),
    ("```", "punctuation"), ("\n", "newline"), (".\n\n", "newline"), ("  ", "space"), ("x2", "other"),
    (" _id", "other"), ("\ufffd", "other"), (" é", "word start"),
])
def test_token_kind(text, kind):
    assert token_kind(text) == kind and kind in TOKEN_KINDS


def test_a_step_accepts_its_first_drafts_and_the_target_replaces_the_rejected_one():
    # step 1 commits 3 (2 drafts accepted, token 12 the target's in place of the third draft), step 2 commits 2
    # (1 accepted, 14 in place of the second), step 3 accepts all 4 drafts and adds a bonus no draft predicted
    tokens = [10, 11, 12, 13, 14, 20, 21, 22, 23, 24]
    got = list(verified_drafts(tokens, [3, 2, 5], [4, 4, 4]))
    assert got == [(10, True), (11, True), (12, False), (13, True), (14, False), (20, True), (21, True),
                   (22, True), (23, True)]
    # a trimmed window: 2 drafts verified and both accepted, so the third token is a bonus, not a rejection
    assert list(verified_drafts([1, 2, 3], [3], [2])) == [(1, True), (2, True)]
    # nothing accepted: the step's one token is the target's in place of the first draft
    assert list(verified_drafts([7], [1], [4])) == [(7, False)]


def test_a_cut_last_step_is_left_out_and_a_record_that_does_not_match_is_refused():
    # the last step committed 4 but max_tokens kept 2 of them: which of its drafts failed is unknown
    assert list(verified_drafts([1, 2, 3, 4], [2, 4], [4, 4])) == [(1, True), (2, False)]
    with pytest.raises(ValueError, match="commit 3 tokens but the output holds 4"):
        list(verified_drafts([1, 2, 3, 4], [2, 1], [4, 4]))  # e.g. a first token that no step committed
    with pytest.raises(ValueError, match="1 to window \\+ 1 tokens"):
        list(verified_drafts([1, 2, 3, 4], [4], [2]))
    with pytest.raises(ValueError, match="the same steps"):
        list(verified_drafts([1], [1], []))


def output(tokens, accept_lengths, window=4, error=None):
    return SimpleNamespace(token_ids=tokens, accept_lengths=accept_lengths,
                           verify_lens=[window] * len(accept_lengths), error=error)


TEXT = {1: " the", 2: " cat", 3: "42", 4: ".", 5: "\n", 6: "s"}


def test_misses_are_tallied_by_kind_largest_share_first():
    outs = [output([1, 2, 3], [3]),            # the, cat accepted; 42 rejected
            output([4, 3, 1, 6, 2], [1, 4]),  # '.' rejected; 42, the, s accepted, cat rejected (the, cat: 4 verified)
            output([9, 9], [2], error="boom")]  # an errored request is not counted
    calls = []

    def text_of(token):
        calls.append(token)
        return TEXT[token]

    got = draft_misses_by_kind(outs, text_of)
    assert list(got) == ["number", "punctuation", "word start", "word piece"]  # 42 rejected once, '.' once, ...
    assert got["number"] == {"verified": 2, "rejected": 1, "rejection_rate": 0.5, "share_of_rejections": 1 / 3}
    assert got["word start"] == {"verified": 4, "rejected": 1, "rejection_rate": 0.25, "share_of_rejections": 1 / 3}
    assert got["word piece"]["rejected"] == 0 and "newline" not in got
    assert sorted(calls) == sorted(set(calls))  # each token's text is asked once
    assert misses_line(got).startswith("number 33% (0.50), punctuation 33% (1.00), word start 33% (0.25)")


def test_an_eval_row_reports_its_misses_when_tokens_can_be_read():
    class Engine:
        block_size = 4

        def __init__(self, outs):
            self.outs, self.target = outs, None

        def reset(self):
            pass

        def generate(self, prompts, params, progress=False):
            return self.outs

    outs = [output([1, 2, 3], [3]), output([4, 3, 1, 6, 2], [1, 4])]
    for o in outs:
        o.num_steps, o.user_id, o.prompt_token_ids = len(o.accept_lengths), None, [0]
        o.mean_accept_length = sum(o.accept_lengths) / len(o.accept_lengths)
        o.pos_accepted, o.pos_reached = [0] * 4, [len(o.accept_lengths)] * 4
    sets = {"w": [("a", [0]), ("b", [0])]}
    decode = lambda ids: "".join(TEXT[i] for i in ids)  # noqa: E731
    rep = ev.evaluate(Engine(outs), None, sets, [0.7], max_tokens=8, n_resamples=1000, dtype="float32", decode=decode)
    assert rep["results"][0]["draft_misses_by_kind"] == draft_misses_by_kind(outs, lambda t: TEXT[t])
    assert "- w, T=0.7: number 33% (0.50)" in ev.markdown_table(rep)
    bare = ev.evaluate(Engine(outs), None, sets, [0.7], max_tokens=8, n_resamples=1000, dtype="float32")
    assert "draft_misses_by_kind" not in bare["results"][0] and "Rejected drafts" not in ev.markdown_table(bare)


def test_labelled_prompts_get_their_misses_per_label():
    outs = [output([1, 2, 3], [3]), output([4, 3, 1, 6, 2], [1, 4]), output([5], [1])]
    got = ev.misses_by_kind(outs, ["a", "b", "c"], TEXT.get, {"a": "s:x", "b": "s:y", "c": "s:x"})
    assert got["draft_misses_by_kind"] == draft_misses_by_kind(outs, TEXT.get)
    assert list(got["draft_misses_by_source"]) == ["s:x", "s:y"]
    assert got["draft_misses_by_source"]["s:x"] == draft_misses_by_kind([outs[0], outs[2]], TEXT.get)
    assert got["draft_misses_by_source"]["s:x"]["newline"]["rejected"] == 1
    one_label = ev.misses_by_kind(outs, ["a", "b", "c"], TEXT.get, {"a": "s:x", "b": "s:x", "c": "s:x"})
    assert "draft_misses_by_source" not in one_label and "draft_misses_by_source" not in ev.misses_by_kind(
        outs, ["a", "b", "c"], TEXT.get)


def test_a_record_that_does_not_add_up_is_reported_not_raised():
    outs = [output([1, 2, 3], [3]), output([1, 2, 3, 4], [2, 1])]  # the second: 3 tokens committed, 4 held
    row = {"workload": "w", "temperature": 0.0, **ev.misses_by_kind(outs, ["a", "b"], TEXT.get)}
    assert row["draft_misses_by_kind"] is None and "commit 3 tokens but the output holds 4" in row["draft_misses_error"]
    report = {"block_size": 4, "results": [{**report_row(), **row}]}
    assert "- w, T=0: not tallied: the steps commit 3 tokens" in ev.markdown_table(report)


def report_row():
    return {"requests": 1, "mean_accept_length": 2.0, "per_position_acceptance": [0.5] * 4}
