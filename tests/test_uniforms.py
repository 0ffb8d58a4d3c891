"""Counter-based uniforms: deterministic, keyed by (seed, anchor position, index), uniform."""

import math

import torch

from dspark.uniforms import counter_uniforms, step_uniforms


def test_values_are_a_pure_function_of_seed_anchor_and_index():
    seeds = torch.tensor([0, 1, 7, 2**40 + 3], dtype=torch.int64)
    anchors = torch.tensor([5, 5, 123, 9], dtype=torch.int64)
    u = counter_uniforms(seeds, anchors, 9)
    assert u.shape == (4, 9) and u.dtype == torch.float32
    assert torch.equal(u, counter_uniforms(seeds, anchors, 9))
    # Batch composition does not matter: row 2 alone gives the same numbers.
    assert torch.equal(u[2:3], counter_uniforms(seeds[2:3], anchors[2:3], 9))
    # A longer request of numbers extends, never reshuffles, the shorter one.
    assert torch.equal(u[:, :4], counter_uniforms(seeds, anchors, 4))
    # Another anchor position or another seed gives other numbers.
    assert not torch.equal(u[0], counter_uniforms(seeds[:1], anchors[:1] + 1, 9)[0])
    assert not torch.equal(u[0], u[1])
    assert step_uniforms(seeds, anchors, 3).shape == (4, 7)


def test_numbers_look_uniform_and_independent():
    n_req, n_pos = 64, 64
    seeds = torch.arange(n_req, dtype=torch.int64).repeat_interleave(n_pos)
    anchors = torch.arange(n_pos, dtype=torch.int64).repeat(n_req)
    u = counter_uniforms(seeds, anchors, 16).flatten().double()
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    n = u.numel()
    # Kolmogorov-Smirnov against U(0, 1): the 0.1% critical value is 1.95 / sqrt(n).
    s = u.sort().values
    grid = torch.arange(1, n + 1, dtype=torch.float64) / n
    ks = float(torch.maximum(grid - s, s - (grid - 1.0 / n)).max())
    assert ks < 1.95 / math.sqrt(n), ks
    # Neighbouring indices and neighbouring anchors are uncorrelated.
    grid2 = counter_uniforms(seeds, anchors, 16).double()
    for a, b in ((grid2[:, 0], grid2[:, 1]), (grid2[:-1, 3], grid2[1:, 3])):
        r = float(torch.corrcoef(torch.stack((a, b)))[0, 1])
        assert abs(r) < 4.0 / math.sqrt(a.numel()), r
    # The mean of 4096 x 16 uniforms is 0.5 within 5 standard errors.
    assert abs(float(u.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / n)
