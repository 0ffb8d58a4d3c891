"""Sampled tokens against the target distribution: randomized PIT + KS on draws with known truth."""

import math

import numpy as np
import pytest
import torch
from scipy import stats as sps

from dspark.bench.distribution import distribution_check, randomized_pit, request_pits, split_impossible
from dspark.config import SamplingParams
from dspark.sampling import RowSampling, processed_probs

ALPHA = 1e-3
MIN_TOKENS = 1000


def _logits(n, vocab, seed, scale=2.0):
    """Different random logits at every position (a different distribution per row)."""
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def _draw(probs, seed):
    return torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed)).squeeze(1)


def _check(logits, tokens, params, seed=0, **kw):
    u, impossible = split_impossible(request_pits(logits, tokens, params, torch.Generator().manual_seed(seed)))
    return distribution_check(u, alpha=ALPHA, min_tokens=MIN_TOKENS, impossible=impossible, **kw)


PROCESSING = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=10),
              SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=1.3, top_k=20, top_p=0.8),
              SamplingParams(temperature=0.5, top_p=0.5)]


@pytest.mark.parametrize("params", PROCESSING, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
def test_exact_draws_through_processed_probs_pass(params):
    logits = _logits(5000, 64, seed=1)
    tokens = _draw(processed_probs(logits, RowSampling([params] * 5000)), seed=2)
    result = _check(logits, tokens, params)
    assert result.passed is True and result.state == "passed", result.message
    assert result.n == 5000 and result.impossible == 0 and result.p_value >= ALPHA
    assert "consistent with the target distribution" in result.message and "5,000 sampled tokens" in result.message


def test_false_positive_rate_is_alpha():
    """The randomized PIT is exact, so the KS p-values of exact draws are U(0, 1): ~5% below 0.05."""
    params = SamplingParams(temperature=0.8, top_k=8)
    logits = _logits(300 * 400, 16, seed=3)
    tokens = _draw(processed_probs(logits, RowSampling([params] * logits.shape[0])), seed=4)
    u = request_pits(logits, tokens, params, torch.Generator().manual_seed(5)).numpy().reshape(300, 400)
    p = np.array([sps.kstest(row, "uniform").pvalue for row in u])
    assert 0.02 <= np.mean(p < 0.05) <= 0.09
    assert sps.kstest(p, "uniform").pvalue > 1e-3


def test_too_hot_sampler_fails():
    logits = _logits(5000, 64, seed=6)
    hot = processed_probs(logits, RowSampling([SamplingParams(temperature=1.3)] * 5000))
    result = _check(logits, _draw(hot, seed=7), SamplingParams(temperature=1.0))
    assert result.passed is False and result.p_value < 1e-3
    assert "NOT the target distribution" in result.message


def test_argmax_one_time_in_five_fails():
    params = SamplingParams(temperature=1.0)
    logits = _logits(5000, 64, seed=8)
    tokens = _draw(processed_probs(logits, RowSampling([params] * 5000)), seed=9)
    greedy = torch.rand(5000, generator=torch.Generator().manual_seed(10)) < 0.2
    tokens = torch.where(greedy, logits.argmax(-1), tokens)
    result = _check(logits, tokens, params)
    assert result.passed is False and result.p_value < 1e-3


def test_tokens_outside_top_k_are_impossible_and_fail():
    params = SamplingParams(temperature=1.0, top_k=5)
    logits = _logits(3000, 64, seed=11)
    untruncated = processed_probs(logits, RowSampling([SamplingParams(temperature=1.0)] * 3000))
    u = request_pits(logits, _draw(untruncated, seed=12), params, torch.Generator().manual_seed(0))
    finite, impossible = split_impossible(u)
    assert impossible > 0 and finite.size + impossible == 3000
    result = distribution_check(finite, alpha=ALPHA, min_tokens=MIN_TOKENS, impossible=impossible)
    assert result.passed is False and result.impossible == impossible and "probability 0" in result.message


def test_one_impossible_token_fails_even_when_ks_passes():
    params = SamplingParams(temperature=1.0, top_k=5)
    logits = _logits(5000, 64, seed=13)
    tokens = _draw(processed_probs(logits, RowSampling([params] * 5000)), seed=14)
    tokens[1234] = int(torch.argsort(logits[1234])[0])  # the least likely token, outside the top 5
    u = request_pits(logits, tokens, params, torch.Generator().manual_seed(0))
    assert math.isnan(float(u[1234])) and int(torch.isnan(u).sum()) == 1
    finite, impossible = split_impossible(u)
    result = distribution_check(finite, alpha=ALPHA, min_tokens=MIN_TOKENS, impossible=impossible)
    assert result.passed is False and result.p_value >= ALPHA and result.impossible == 1


def test_nan_markers_are_not_silently_tested():
    with pytest.raises(ValueError, match="impossible"):
        distribution_check([0.1, float("nan")], alpha=ALPHA, min_tokens=1, impossible=0)


def test_too_few_tokens_give_no_verdict():
    params = SamplingParams(temperature=1.0)
    logits = _logits(200, 64, seed=15)
    result = _check(logits, _draw(processed_probs(logits, RowSampling([params] * 200)), seed=16), params)
    assert result.passed is None and result.state == "insufficient"
    assert result.statistic is None and result.p_value is None
    assert result.message == "arm B: not enough tokens (200 < 1,000): no distribution verdict"
    # An impossible token is evidence at any sample size.
    assert distribution_check([0.5] * 10, alpha=ALPHA, min_tokens=MIN_TOKENS, impossible=1).passed is False


@pytest.mark.parametrize("vocab", [2, 3])
def test_tiny_vocabulary_exact_draws_are_uniform_only_when_randomized(vocab):
    probs = torch.softmax(_logits(5000, vocab, seed=17 + vocab), dim=-1)
    tokens = _draw(probs, seed=20)
    u = randomized_pit(probs, tokens, torch.Generator().manual_seed(21))
    assert distribution_check(u.numpy(), alpha=ALPHA, min_tokens=MIN_TOKENS, impossible=0).passed is True
    plain = torch.cumsum(probs.double(), -1).gather(1, tokens[:, None]).squeeze(1).clamp(max=1).numpy()
    assert sps.kstest(plain, "uniform").pvalue < 1e-6  # the plain PIT takes only V values per row


def test_sequence_pits_are_iid_by_rosenblatt():
    """An order-1 Markov chain over V=3: the PITs of successive positions, each under the
    distribution given its prefix, are uniform and uncorrelated."""
    gen = torch.Generator().manual_seed(22)
    transition_logits = torch.randn(3, 3, generator=gen) * 2
    params = SamplingParams(temperature=0.9)
    n_seq, length = 100, 60
    rows, tokens = [], []
    for _ in range(n_seq):
        prev = 0
        for _ in range(length):
            logits = transition_logits[prev][None]
            token = int(torch.multinomial(processed_probs(logits, RowSampling([params]))[0], 1, generator=gen))
            rows.append(logits[0])
            tokens.append(token)
            prev = token
    u = request_pits(torch.stack(rows), torch.tensor(tokens), params, torch.Generator().manual_seed(23))
    assert distribution_check(u.numpy(), alpha=ALPHA, min_tokens=MIN_TOKENS, impossible=0).passed is True
    u = u.numpy().reshape(n_seq, length)
    lag1 = np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]
    assert abs(lag1) < 0.06


def test_two_sample_comparison_is_reported():
    params = SamplingParams(temperature=1.0)
    logits = _logits(4000, 64, seed=24)
    probs = processed_probs(logits, RowSampling([params] * 4000))
    u_a, _ = split_impossible(request_pits(logits, _draw(probs, seed=25), params, torch.Generator().manual_seed(0)))
    u_b, _ = split_impossible(request_pits(logits, _draw(probs, seed=26), params, torch.Generator().manual_seed(1)))
    hot = processed_probs(logits, RowSampling([SamplingParams(temperature=1.5)] * 4000))
    u_c, _ = split_impossible(request_pits(logits, _draw(hot, seed=27), params, torch.Generator().manual_seed(2)))
    same = distribution_check(u_b, alpha=ALPHA, min_tokens=MIN_TOKENS, impossible=0, other=u_a)
    two = same.details["two_sample"]
    assert same.passed is True and two["against"] == "A" and two["n_other"] == 4000 and two["p_value"] > ALPHA
    differ = distribution_check(u_c, alpha=ALPHA, min_tokens=MIN_TOKENS, impossible=0, other=u_a)
    assert differ.passed is False and differ.details["two_sample"]["p_value"] < 1e-3
    few = distribution_check(u_b, alpha=ALPHA, min_tokens=MIN_TOKENS, impossible=0, other=u_a[:10])
    assert "not enough tokens" in few.details["two_sample"]["note"]


def test_greedy_params_are_rejected():
    with pytest.raises(ValueError, match="greedy"):
        request_pits(_logits(4, 8, seed=0), torch.zeros(4, dtype=torch.int64), SamplingParams(temperature=0.0),
                     torch.Generator().manual_seed(0))


def test_randomized_pit_stays_in_its_token_step_and_chunks_agree(monkeypatch):
    probs = torch.softmax(_logits(50, 10, seed=28), dim=-1)
    tokens = _draw(probs, seed=29)
    u = randomized_pit(probs, tokens, torch.Generator().manual_seed(30))
    p = probs.double()
    p_tok = p.gather(1, tokens[:, None])
    low = torch.where(p > p_tok, p, torch.zeros_like(p)).sum(-1)  # no ties in random logits
    assert torch.all(u >= low - 1e-12) and torch.all(u <= low + p_tok.squeeze(1) + 1e-12)
    import dspark.bench.distribution as mod
    monkeypatch.setattr(mod, "_CHUNK_ELEMENTS", 30)  # 3 rows per chunk
    assert torch.equal(randomized_pit(probs, tokens, torch.Generator().manual_seed(30)), u)
    with pytest.raises(ValueError, match="tokens must lie"):
        randomized_pit(probs, torch.full((50,), 10), torch.Generator())
