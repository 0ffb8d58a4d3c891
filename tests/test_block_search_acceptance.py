"""bench/block_search_acceptance.py: a beam over the block under the drafter's slot distributions, against the
greedy draft."""

from __future__ import annotations

import pytest
import torch

from bench_scripts import load_bench_script
from tiny import tiny_drafter, tiny_target


def expected_accept_length(drafter, hidden, anchor_ids, lm_head, tokens) -> torch.Tensor:
    """1 + sum_k prod_{j<=k} q(d_j | d_<j) of each row's block ``tokens`` [N, G] under the drafter."""
    base = drafter._base_logits(hidden, lm_head)
    head = drafter.markov_head
    state = head.initial_state(len(tokens), hidden) if head is not None else None
    prev, survive, total = anchor_ids, torch.ones(len(tokens)), torch.ones(len(tokens))
    for k in range(tokens.shape[1]):
        logits, state = drafter._slot_logits(hidden[:, k], base[:, k], prev, state)
        survive = survive * logits.softmax(-1).gather(1, tokens[:, k:k + 1])[:, 0]
        total, prev = total + survive, tokens[:, k]
    return total


@pytest.mark.parametrize("variant", ["vanilla", "rnn", "rank0"])
def test_width_one_is_the_greedy_draft_and_a_wider_beam_never_scores_lower(variant):
    script = load_bench_script("block_search_acceptance")
    target = tiny_target()
    kw = dict(markov_rank=0) if variant == "rank0" else dict(markov_variant=variant)
    drafter = tiny_drafter(target, block_size=5, **kw)
    with torch.no_grad():
        for p in drafter.parameters():
            p.mul_(8.0)  # peaked slot distributions whose Markov bias changes the drafts
        gen = torch.Generator().manual_seed(1)
        hidden = torch.randn(64, 5, target.cfg.hidden_size, generator=gen)
        anchor = torch.randint(3, 97, (64,), generator=gen)
        greedy = drafter.draft(hidden, anchor, target.lm_head_weight, lambda lg, k: lg.argmax(-1)).tokens
        assert torch.equal(script.beam_block(drafter, hidden, anchor, target.lm_head_weight, 1), greedy)
        base = expected_accept_length(drafter, hidden, anchor, target.lm_head_weight, greedy)
        wide = script.beam_block(drafter, hidden, anchor, target.lm_head_weight, 4)
        score = expected_accept_length(drafter, hidden, anchor, target.lm_head_weight, wide)
    assert (score >= base - 1e-5).all()
    if variant == "rank0":  # independent slots: the greedy draft already maximises the expected accept length
        assert torch.equal(wide, greedy)
    else:
        assert (score > base + 1e-4).any()  # the search finds a better block somewhere


def test_accept_lengths_summary_and_refusals():
    script = load_bench_script("block_search_acceptance")
    per_seq = {"poetry": [[2.0, 2.2, 2.0], [4.0, 4.4, 4.0], [3.0, 3.3, 3.0]], "chat": [[2.0, 1.0, 2.0]]}
    summary = script.summarize(per_seq, [2, 4])
    assert summary["poetry"]["accept_length"] == {"1": 3.0, "2": 3.3, "4": 3.0}
    assert summary["poetry"]["width_2_vs_greedy_pct"]["change"] == pytest.approx(10.0)
    assert summary["poetry"]["width_4_vs_greedy_pct"] == {"change": 0.0, "ci95": [0.0, 0.0], "method": "zero-width"}
    assert summary["chat"]["width_2_vs_greedy_pct"]["change"] == pytest.approx(-50.0)
    assert summary["chat"]["width_2_vs_greedy_pct"]["ci95"] == [None, None]  # one sequence: no interval
    truth = torch.tensor([[1, 2, 3], [1, 2, 3], [4, 2, 3]])
    drafts = torch.tensor([[1, 2, 3], [1, 5, 3], [1, 2, 3]])
    assert script.accept_lengths(drafts, truth).tolist() == [4, 2, 1]
    for argv in ([], ["out"], ["out", "data=x", "width=2"], ["out", "data=x", "widths=1"],
                 ["out", "data=x", "stride=0"], ["out", "data=x", "widths=two"],
                 ["out", "data=no/such/file.safetensors"]):
        with pytest.raises(SystemExit):
            script.main(argv)
