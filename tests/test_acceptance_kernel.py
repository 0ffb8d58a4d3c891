"""Acceptance rule: hand-built greedy cases, Triton (interpreted) == reference, and a
statistical check that the sampled rule is lossless while deliberately broken rules are not.

The statistical checks run on the reference (the interpreter runs one program per row, too
slow for thousands of rows); the kernel inherits them through exact parity, and
tests/test_kernels_gpu.py repeats them on the kernel itself on CUDA."""

import pytest
import torch  # does not import triton

from interpreter_only import interpreter_module  # noqa: E402  (tests/interpreter_only.py)

interpreter_module()

from scipy.stats import chi2  # noqa: E402

from kernels.acceptance import (  # noqa: E402
    accept,
    accept_reference,
    accept_triton,
    sample_from_probs_inverse_cdf,
)

NAN = float("nan")


def one_hot_rows(argmaxes, V):
    """target_probs rows peaked (0.6) at the given tokens, rest spread evenly."""
    rows = torch.full((len(argmaxes), V), 0.4 / (V - 1))
    for i, a in enumerate(argmaxes):
        rows[i, a] = 0.6
    return rows


def greedy_case(draft, window, argmaxes, V=6):
    G = len(draft)
    tp = torch.full((1, G + 1, V), NAN)  # padding rows stay NaN: they must never be read
    tp[0, : window + 1] = one_hot_rows(argmaxes[: window + 1], V)
    return dict(draft_tokens=torch.tensor([draft]), windows=torch.tensor([window], dtype=torch.int32),
                target_probs=tp, draft_probs=None, greedy=torch.tensor([True]),
                accept_uniforms=torch.rand(1, G), sample_uniforms=torch.rand(1))


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("draft,window,argmaxes,want_n,want_next", [
    ([2, 4, 1], 3, [2, 4, 1, 5], 3, 5),  # all accepted: bonus from row v
    ([2, 4, 1], 3, [2, 3, 1, 5], 1, 3),  # rejected at k=1: correction = argmax of row 1
    ([2, 4, 1], 0, [3, 0, 0, 0], 0, 3),  # v=0: next = argmax of row 0
    ([2, 4, 1], 2, [2, 4, 0, 0], 2, 0),  # window 2 of 3: bonus from row 2, row 3 is padding
    ([0, 0], 1, [1, 0, 0], 0, 1),  # rejected at 0
])
def test_greedy_hand_built(impl, draft, window, argmaxes, want_n, want_next):
    res = accept(**greedy_case(draft, window, argmaxes), impl=impl)
    assert res.num_accepted.tolist() == [want_n]
    assert res.next_token.tolist() == [want_next]
    assert res.num_accepted.dtype == torch.int32 and res.next_token.dtype == torch.int64


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_greedy_ties_go_to_lowest_index(impl):
    V = 40  # > block_v 16 in the triton call below: the tie spans two vocabulary tiles
    tp = torch.zeros(1, 2, V)
    tp[0, 0, [7, 30]] = 0.5
    tp[0, 1, [3, 33]] = 0.5
    kw = dict(draft_tokens=torch.tensor([[30]]), windows=torch.tensor([1], dtype=torch.int32), target_probs=tp,
              draft_probs=None, greedy=torch.tensor([True]), accept_uniforms=torch.zeros(1, 1),
              sample_uniforms=torch.zeros(1))
    res = accept_reference(**kw) if impl == "torch" else accept_triton(**kw, block_v=16)
    assert res.num_accepted.tolist() == [0] and res.next_token.tolist() == [7]
    kw["draft_tokens"] = torch.tensor([[7]])
    res = accept_reference(**kw) if impl == "torch" else accept_triton(**kw, block_v=16)
    assert res.num_accepted.tolist() == [1] and res.next_token.tolist() == [3]


def random_case(B, G, V, seed, greedy_frac=0.5, nan_padding=True):
    """Random batch; draft tokens partly copy the target argmax so greedy rows accept
    sometimes; target rows past v, draft rows at and past v and draft tokens past v are NaN/-1."""
    g = torch.Generator().manual_seed(seed)
    tp = torch.softmax(torch.randn(B, G + 1, V, generator=g) * 2, -1)
    dp = torch.softmax(torch.log(tp[:, :G]) + torch.randn(B, G, V, generator=g), -1)
    dt = torch.multinomial(dp.reshape(-1, V), 1, generator=g).view(B, G)
    dt = torch.where(torch.rand(B, G, generator=g) < 0.6, tp[:, :G].argmax(-1), dt)
    windows = torch.randint(0, G + 1, (B,), generator=g, dtype=torch.int32)
    if nan_padding:
        k = torch.arange(G + 1)
        tp = torch.where(k[None, :, None] > windows[:, None, None].long(), NAN, tp)
        dp = torch.where(k[None, :G, None] >= windows[:, None, None].long(), NAN, dp)
        dt = torch.where(k[None, :G] >= windows[:, None].long(), -1, dt)
    return dict(draft_tokens=dt, windows=windows, target_probs=tp, draft_probs=dp,
                greedy=torch.rand(B, generator=g) < greedy_frac, accept_uniforms=torch.rand(B, G, generator=g),
                sample_uniforms=torch.rand(B, generator=g))


@pytest.mark.parametrize("B,G,V,seed", [(16, 8, 50, 0), (9, 3, 50, 1), (5, 1, 33, 2), (12, 5, 64, 3)])
def test_triton_equals_reference_exactly(B, G, V, seed):
    case = random_case(B, G, V, seed)
    ref = accept_reference(**case)
    out = accept_triton(**case, block_v=16)
    assert torch.equal(out.num_accepted, ref.num_accepted)
    assert torch.equal(out.next_token, ref.next_token)
    assert (ref.num_accepted <= case["windows"]).all()
    # the random cases do exercise acceptance, rejection and the bonus
    assert (ref.num_accepted > 0).any()


def test_padding_values_cannot_change_the_result():
    clean = random_case(16, 6, 40, seed=4, nan_padding=False)
    dirty = random_case(16, 6, 40, seed=4, nan_padding=True)
    for impl in ("torch", "triton"):
        a, b = accept(**clean, impl=impl), accept(**dirty, impl=impl)
        assert torch.equal(a.num_accepted, b.num_accepted) and torch.equal(a.next_token, b.next_token)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_empty_residual_falls_back_to_target(impl):
    """p == q up to rounding, yet u * q(d) >= p(d) rejects: the residual is empty and the
    correction must come from p (here p puts all mass on tokens 2 and 3)."""
    p = torch.tensor([0.0, 0.0, 0.5, 0.5])
    tp = torch.stack([p, p])[None]
    dp = p[None, None].clone()
    kw = dict(draft_tokens=torch.tensor([[2]]), windows=torch.tensor([1], dtype=torch.int32), target_probs=tp,
              draft_probs=dp, greedy=torch.tensor([False]), accept_uniforms=torch.tensor([[1.0]]),
              sample_uniforms=torch.tensor([0.75]))
    res = accept(**kw, impl=impl)
    assert res.num_accepted.tolist() == [0] and res.next_token.tolist() == [3]


def test_inverse_cdf_sampler():
    probs = torch.tensor([[0.0, 0.2, 0.0, 0.8], [3.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    assert sample_from_probs_inverse_cdf(probs, torch.tensor([0.0, 0.0, 0.0])).tolist() == [1, 0, 3]
    assert sample_from_probs_inverse_cdf(probs, torch.tensor([0.2, 0.75, 0.5])).tolist() == [3, 1, 3]
    assert sample_from_probs_inverse_cdf(probs, torch.tensor([0.1999, 0.7499, 0.9999])).tolist() == [1, 0, 3]
    with pytest.raises(ValueError, match="no mass"):
        sample_from_probs_inverse_cdf(torch.zeros(1, 3), torch.zeros(1))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        sample_from_probs_inverse_cdf(probs[:1], torch.tensor([1.0]))


def test_reference_validates_inputs():
    case = random_case(4, 3, 10, seed=5, nan_padding=False)
    with pytest.raises(ValueError, match="windows must lie"):
        accept_reference(**{**case, "windows": torch.tensor([0, 1, 4, 2], dtype=torch.int32)})
    with pytest.raises(ValueError, match="some rows are sampled"):
        accept_reference(**{**case, "draft_probs": None, "greedy": torch.tensor([True, False, True, True])})
    with pytest.raises(ValueError, match="target_probs must be"):
        accept_reference(**{**case, "target_probs": case["target_probs"][:, :3]})
    with pytest.raises(ValueError, match="impl"):
        accept(**case, impl="cuda")
    # The kernel cannot raise without a sync: a sampled row without q is flagged with -1.
    res = accept_triton(**{**case, "draft_probs": None, "greedy": torch.tensor([True, False, True, True])})
    assert res.next_token[1].item() == -1 and res.num_accepted[1].item() == 0


# --------------------------------------------------------------------------------------
# Losslessness: the first emitted token must be distributed as p_0 whatever q is.
# --------------------------------------------------------------------------------------

P0 = torch.tensor([0.05, 0.40, 0.10, 0.25, 0.20])
Q0 = torch.tensor([0.30, 0.10, 0.35, 0.05, 0.20])
P1 = torch.tensor([0.50, 0.05, 0.15, 0.10, 0.20])
Q1 = torch.tensor([0.10, 0.40, 0.15, 0.15, 0.20])
N_DRAWS = 40000


def draw_batch(window, seed):
    """N_DRAWS independent speculative steps with G = 2: drafts d_k ~ q_k, uniforms fresh."""
    g = torch.Generator().manual_seed(seed)
    d = torch.stack([torch.multinomial(Q0, N_DRAWS, replacement=True, generator=g),
                     torch.multinomial(Q1, N_DRAWS, replacement=True, generator=g)], 1)
    tp = torch.stack([P0, P1, P0])[None].expand(N_DRAWS, 3, 5).contiguous()
    dp = torch.stack([Q0, Q1])[None].expand(N_DRAWS, 2, 5).contiguous()
    return dict(draft_tokens=d, windows=torch.full((N_DRAWS,), window, dtype=torch.int32), target_probs=tp,
                draft_probs=dp, greedy=torch.zeros(N_DRAWS, dtype=torch.bool),
                accept_uniforms=torch.rand(N_DRAWS, 2, generator=g), sample_uniforms=torch.rand(N_DRAWS, generator=g))


def chi_square_ok(tokens, p):
    """Pearson chi-square goodness of fit at a false-alarm rate of 1e-6."""
    counts = torch.bincount(tokens, minlength=len(p)).double()
    expected = p.double() * len(tokens)
    stat = float(((counts - expected) ** 2 / expected).sum())
    return stat < chi2.ppf(1 - 1e-6, len(p) - 1), stat


def emitted(case, res, position):
    """Token emitted at `position` (0 or 1) of the step; None where the step emitted fewer."""
    n = res.num_accepted.long()
    d = case["draft_tokens"]
    if position == 0:
        return torch.where(n >= 1, d[:, 0], res.next_token)
    keep = n >= 1
    return torch.where(n >= 2, d[:, 1], res.next_token)[keep]


def broken_first_token_inverted_ratio(case):
    """First emitted token under a rule that accepts with min(1, q/p) instead of min(1, p/q)."""
    d0 = case["draft_tokens"][:, :1]
    p, q = case["target_probs"][:, 0], case["draft_probs"][:, 0]
    p_d, q_d = p.gather(1, d0).squeeze(1), q.gather(1, d0).squeeze(1)
    accepted = case["accept_uniforms"][:, 0] * p_d < q_d
    correction = sample_from_probs_inverse_cdf((p - q).clamp_min(0), case["sample_uniforms"])
    return torch.where(accepted, d0.squeeze(1), correction)


def broken_first_token_resample_target(case):
    """First emitted token when acceptance is right but a rejection resamples from p, not max(p - q, 0)."""
    res = accept_reference(**case)
    rows = torch.arange(len(res.num_accepted))
    p_rows = case["target_probs"][rows, res.num_accepted.long()]
    wrong = type(res)(res.num_accepted, sample_from_probs_inverse_cdf(p_rows, case["sample_uniforms"]))
    return emitted(case, wrong, 0)


@pytest.mark.parametrize("window", [0, 1, 2])
def test_sampled_rule_is_lossless(window):
    case = draw_batch(window, seed=10 + window)
    res = accept_reference(**case)
    ok, stat = chi_square_ok(emitted(case, res, 0), P0)
    assert ok, f"first token not distributed as p_0 (chi2 = {stat:.1f})"
    if window >= 1:  # given d_1 accepted, the second token (d_2, correction or bonus) follows p_1
        ok, stat = chi_square_ok(emitted(case, res, 1), P1)
        assert ok, f"second token not distributed as p_1 (chi2 = {stat:.1f})"


@pytest.mark.parametrize("broken", [broken_first_token_inverted_ratio, broken_first_token_resample_target])
def test_broken_rules_are_detected(broken):
    case = draw_batch(1, seed=20)
    ok, stat = chi_square_ok(broken(case), P0)
    assert not ok, f"{broken.__name__} passed the losslessness check (chi2 = {stat:.1f})"
