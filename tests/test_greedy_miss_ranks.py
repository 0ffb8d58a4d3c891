"""bench/greedy_miss_ranks.py: the cells a greedy draft reaches, the target token's rank at a miss, the summary."""

from __future__ import annotations

import numpy as np
import torch

from bench_scripts import load_bench_script
from tiny import tiny_drafter, tiny_target


def _script():
    return load_bench_script("greedy_miss_ranks")


def test_the_cells_are_the_replays_reached_cells_and_a_miss_ranks_the_targets_token_below_the_first():
    from dspark.training.trainer import dense_target_forward, replay_blocks

    target = tiny_target(vocab=8).eval()  # a small vocabulary: random drafts are accepted often enough to go deep
    drafter = tiny_drafter(target)
    torch.manual_seed(3)
    ids = torch.randint(3, 8, (120,))
    anchors = torch.arange(9, 120 - drafter.block_size)
    cells = _script().block_cells(target, drafter, ids, anchors)

    with torch.no_grad():
        replay = replay_blocks(target, drafter, ids[None], anchors[None])
    accepted = replay["accepted"][0]  # [A, G]
    reached = torch.cumprod(torch.cat((torch.ones(len(anchors), 1, dtype=torch.bool), accepted[:, :-1]), 1).int(),
                            1).bool()
    assert np.array_equal(cells["accepted"], accepted[reached].numpy())
    assert np.array_equal(cells["slot"], torch.arange(drafter.block_size).expand_as(accepted)[reached].numpy())
    assert (cells["slot"] >= 2).sum() > 0  # the test reaches past the second slot
    assert np.array_equal(cells["rank"] == 0, cells["accepted"])  # accepted exactly where the target's token leads
    miss = ~cells["accepted"]
    assert (cells["p_target_token"][miss] <= cells["p_draft"][miss]).all()
    # at the first slot the context is the sequence up to the anchor, and the target's token its argmax after it
    first = cells["slot"] == 0
    with torch.no_grad():
        top = target.compute_logits(dense_target_forward(target, ids[None])[0][0]).argmax(-1)
    repeat = [bool(((ids[:a] == ids[a]) & (ids[1: a + 1] == top[a])).any()) for a in anchors.tolist()]
    assert np.array_equal(cells["repeat"][first], np.array(repeat))
    assert 0 < sum(repeat) < len(repeat)  # both kinds occur
    # deeper slots: the context ends with the block's accepted drafts, not with the sequence's own tokens
    drafts, deeper = replay["tokens"][0], []
    for i, a in enumerate(anchors.tolist()):
        for k in range(1, drafter.block_size):
            if reached[i, k]:
                context = torch.cat((ids[: a + 1], drafts[i, :k]))
                with torch.no_grad():
                    nxt = target.compute_logits(dense_target_forward(target, context[None])[0][0, -1:]).argmax()
                deeper.append(bool(((context[:-1] == context[-1]) & (context[1:] == nxt)).any()))
    assert np.array_equal(cells["repeat"][~first], np.array(deeper))
    assert (cells["target_top2"] <= cells["target_top1"]).all()


def test_the_summary_counts_shares_of_the_misses():
    c = {"slot": np.array([0, 0, 0, 0, 1, 1]),
         "repeat": np.array([True, True, False, False, False, True]),
         "accepted": np.array([True, False, False, False, True, False]),
         "rank": np.array([0, 1, 2, 12, 0, 1]),
         "p_draft": np.array([0.9, 0.5, 0.6, 0.7, 0.8, 0.4]),
         "p_target_token": np.array([0.9, 0.48, 0.3, 0.01, 0.8, 0.33]),
         "target_top1": np.array([0.99, 0.5, 0.6, 0.9, 0.95, 0.4]),
         "target_top2": np.array([0.01, 0.45, 0.2, 0.05, 0.02, 0.35])}
    s = _script().summarize(c)
    assert (s["reached"], s["missed"]) == (6, 4) and s["accepted"] == round(2 / 6, 4)
    ranks = (s["missed_target_token_rank_2"], s["rank_3"], s["rank_4_to_10"], s["beyond_rank_10"])
    assert ranks == (0.5, 0.25, 0, 0.25)
    assert (s["missed_within_0.05"], s["missed_within_0.1"], s["missed_within_0.2"]) == (0.25, 0.5, 0.5)
    assert s["missed_target_margin_below_0.1"] == 0.5 and s["missed_target_top1_median"] == 0.55
    assert s["accepted_target_top1_median"] == 0.97
    repeats = (s["repeat_share_accepted"], s["repeat_share_missed_within_top10"], s["repeat_share_missed_beyond_top10"])
    assert repeats == (0.5, round(2 / 3, 4), 0.0)
    assert [b["reached"] for b in s["by_slot"]] == [4, 2] and s["by_slot"][1]["missed_target_token_rank_2"] == 1.0
