"""Draft-free steps (engine.draft_free_steps): the per-step choice, and steps without drafting that emit what a
target-only engine emits."""

import pytest

from dspark.config import SamplingParams
from dspark.draft_free import DraftFreeChoice
from test_engine_scheduling import make_engine, steep_table
from test_graph_decode import generate, prompts_for
from tiny import tiny_drafter, tiny_target


def test_choice_alternates_then_keeps_the_faster_and_explores():
    choice = DraftFreeChoice(window=4, min_steps=2, explore_every=7)
    picks = []
    for _ in range(4):
        free = choice.draft_free(8)
        picks.append(free)
        # drafting: 4 tokens/ms, draft-free: 8 tokens/ms
        choice.update(8, draft_free=free, tokens=8 if free else 16, step_ms=1.0 if free else 4.0)
    assert picks == [False, True, False, True]  # the two kinds in turn, drafting first
    later = [choice.draft_free(8) for _ in range(8)]  # decisions 5..12 of bucket 8
    assert later == [True, True, False, True, True, True, True, True]  # 7: one drafting step to keep comparing
    assert choice.draft_free(16) is False  # another bucket starts over
    s = choice.summary()
    assert s["draft_free/b8/free_tok_per_ms"] == 8.0 and s["draft_free/b8/draft_steps"] == 2
    assert s["draft_free/b8/pairs"] == 3 and s["draft_free/b8/free_vs_draft_pct"] == 100.0
    with pytest.raises(ValueError, match="window"):
        DraftFreeChoice(window=0)


def test_the_choice_compares_adjacent_steps_not_two_phases_of_the_load():
    """The load lifts every step's rate 5% a step; at equal load drafting is 10% faster. Each draft-free step,
    taken after the drafting steps it is compared with, out-rates them, yet beside its neighbours it is slower:
    the choice keeps drafting, with a draft-free step only to explore."""
    choice = DraftFreeChoice(window=8, min_steps=2, explore_every=3)
    picks = []
    for step in range(30):
        free = choice.draft_free(8)
        picks.append(free)
        rate = 1.05 ** step * (1.0 if free else 1.1)
        choice.update(8, draft_free=free, tokens=int(1000 * rate), step_ms=10.0)
    assert -10.0 < choice.summary()["draft_free/b8/free_vs_draft_pct"] < 0.0
    assert picks[:4] == [False, True, False, True]
    assert picks[4:] == [i % 3 == 1 for i in range(26)]  # decisions 6, 9, ...: a draft-free step to explore


def test_one_step_timed_long_does_not_turn_the_choice():
    """The comparisons' median: one drafting step whose period caught a host stall (here 200 ms) leaves drafting
    the faster kind."""
    choice = DraftFreeChoice(window=16, min_steps=3, explore_every=100)
    for ms in (200.0, 3.0, 4.0, 3.0, 4.0, 3.0):
        free = choice.draft_free(8)
        # drafting: 16 tokens per 4 ms (the first one stalled); draft-free: 8 tokens per 3 ms
        choice.update(8, draft_free=free, tokens=8 if free else 16, step_ms=ms)
    assert [choice.draft_free(8) for _ in range(10)] == [False] * 10
    assert choice.summary()["draft_free/b8/draft_tok_per_ms"] == 4.0


def test_choice_keeps_drafting_when_drafting_is_faster():
    choice = DraftFreeChoice(window=1, min_steps=1, explore_every=100)
    assert not choice.draft_free(4)
    choice.update(4, draft_free=False, tokens=12, step_ms=2.0)
    assert choice.draft_free(4)
    choice.update(4, draft_free=True, tokens=4, step_ms=1.5)
    assert [choice.draft_free(4) for _ in range(20)] == [False] * 20


@pytest.mark.parametrize("cuda_graphs", [False, True])
@pytest.mark.parametrize("verify", ["full", "ragged"])
def test_draft_free_steps_emit_what_target_only_emits(tmp_path, cuda_graphs, verify):
    """Greedy, fp32: an engine that mixes drafting and draft-free steps emits the target-only tokens; its
    draft-free steps count no drafted tokens and no scheduling step (sched/ counts only drafting steps)."""
    target = tiny_target(11)
    drafter = tiny_drafter(target, 12, block_size=4)
    prompts = prompts_for(13, 6)
    params = [SamplingParams(max_tokens=30 + 5 * (i % 3), ignore_eos=True) for i in range(len(prompts))]
    expected, _ = generate(target, None, prompts, params)
    kw = dict(cuda_graphs=cuda_graphs, overlap=cuda_graphs, budget_lag=2 if cuda_graphs else 1)
    if verify != "full":
        probe = make_engine(target, drafter, spec="dspark", **kw)
        kw["cost_table"] = steep_table(probe, tmp_path / "steep.json")
    out, eng = generate(target, drafter, prompts, params, verify=verify, draft_free_steps=True, **kw)
    assert out == expected
    c = eng.counters()
    assert c["draft_free_steps"] > 0 and c["draft_free_steps"] < c["decode_steps"]
    # (the pipeline's last launched step can hold only finished requests: launched, not recorded)
    assert 0 <= c["decode_steps"] - c["draft_free_steps"] - c["sched/verify_steps"] <= int(cuda_graphs)
    assert c["drafted_tokens"] == 4 * c["sched/request_steps"]
    assert any(k.startswith("draft_free/b") for k in c)


def test_draft_free_steps_off_by_default_and_inert_without_drafting():
    target = tiny_target(11)
    drafter = tiny_drafter(target, 12, block_size=4)
    _, eng = generate(target, drafter, prompts_for(13, 2), [SamplingParams(max_tokens=12, ignore_eos=True)] * 2)
    assert eng.draft_free is None and eng.counters()["draft_free_steps"] == 0
    _, off = generate(target, None, prompts_for(13, 2), [SamplingParams(max_tokens=12, ignore_eos=True)] * 2,
                      draft_free_steps=True)
    assert off.draft_free is None  # target-only: nothing to leave out
