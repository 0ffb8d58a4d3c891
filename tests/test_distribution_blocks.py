"""The A/B distribution check must not pool one request's output from several blocks.

Every block replays the same requests with the same seeds, and sampling is a pure function of (seed, position):
target-only arms emit token-identical outputs in every block (on the H200, poetry at 128: 6 x 99,082 tokens). Pooling
the blocks counts each draw n_blocks times; the one-sample KS then rejects exact samplers far more often than alpha.
"""

import numpy as np
import torch

from dspark.bench.distribution import distribution_check, randomized_pit
from runners.ab import distribution_items


def _exact_draw_pits(n, vocab, gen, copies):
    logits = torch.randn(n, vocab, generator=gen, dtype=torch.float64) * 2.5
    probs = torch.softmax(logits, -1)
    tokens = torch.multinomial(probs, 1, generator=gen)[:, 0]
    # the same draws re-scored once per block, each with its own PIT jitter (the guard's generator)
    return np.concatenate([randomized_pit(probs, tokens, gen).numpy() for _ in range(copies)])


def test_pooled_duplicate_blocks_break_the_ks_false_positive_rate():
    gen = torch.Generator().manual_seed(0)
    alpha, trials = 0.01, 60
    rej = {c: sum(not distribution_check(_exact_draw_pits(3000, 16, gen, c), alpha=alpha, min_tokens=100,
                                         impossible=0).passed for _ in range(trials)) for c in (1, 6)}
    assert rej[1] <= 4, rej  # one copy per draw: about alpha * trials = 0.6
    assert rej[6] >= 10, rej  # six copies: many times alpha (about 1 in 4 trials)


def test_each_request_contributes_one_block():
    blocks = {b: {f"r{i}": [b, i] for i in range(7)} for b in range(3)}
    blocks[2].pop("r5")  # a request missing from a block (e.g. errored) still contributes once
    items = distribution_items(blocks)
    assert [rid for rid, _ in items] == [f"r{i}" for i in range(7)]
    used = {rid: toks[0] for rid, toks in items}
    assert sorted(set(used.values())) == [0, 1, 2]  # every block contributes
    assert used["r5"] in (0, 1)
