"""kernels/confidence_survival.py: the reference is the engine's own path (the drafter's head over the block, its
calibration, the prefix survival, the mask), and the Triton kernel (CPU interpreter) computes the reference's
values over random blocks, fp32 and bf16, with and without a Markov embedding, online offsets, an sts_max_prob
calibration's max-probability term and an sts_top_gap calibration's gap term. On CUDA see tests/test_kernels_gpu.py."""

import pytest
import torch

from interpreter_only import interpreter_module  # noqa: E402  (tests/interpreter_only.py)

interpreter_module()

from kernels.confidence_survival import (BlockConfidence, confidence_survival_reference,  # noqa: E402
                                         confidence_survival_triton)


def block_case(R, G, d, rank, dtype, seed, offsets=False, max_prob=False, top_gap=False):
    g = torch.Generator().manual_seed(seed)
    V = 300
    case = dict(hidden=torch.randn(R, G, d, generator=g).to(dtype),
                anchor=torch.randint(0, V, (R,), generator=g), tokens=torch.randint(0, V, (R, G), generator=g),
                embedding=(torch.randn(V, rank, generator=g) * 0.5).to(dtype) if rank else None,
                head_weight=(torch.randn(1, d + rank, generator=g) * 0.3).to(dtype),
                head_bias=(torch.randn(1, generator=g) * 0.5).to(dtype),
                temperatures=torch.rand(G, generator=g) + 0.5, biases=torch.randn(G, generator=g) * 0.3,
                offsets=torch.randn(G, generator=g) * 0.2 if offsets else None,
                active=torch.rand(R, generator=g) < 0.7)
    if max_prob:  # top probabilities from (0, 1], 0 and 1 among them (the clamp), and weights of both signs
        p = torch.rand(R, G, generator=g)
        p.view(-1)[:2] = torch.tensor([0.0, 1.0])[: p.numel()]
        case.update(max_prob=p, max_prob_weights=torch.randn(G, generator=g) * 0.4)
    if top_gap:  # gaps >= 0, exact ties (0) among them, and weights of both signs
        gap = torch.rand(R, G, generator=g) * 6.0
        gap.view(-1)[:1] = 0.0
        case.update(top_gap=gap, top_gap_weights=torch.randn(G, generator=g) * 0.4)
    case["active"][0] = True
    return case


def test_the_reference_is_the_engines_torch_path():
    """What the draft stage computes without the kernel: DSparkDrafter.confidence_logits over the block, its
    calibrated_confidence (sts_bias, with online offsets), prefix_survival, zero on inactive rows."""
    from dspark.survival import calibrated_confidence, prefix_survival
    from tiny import tiny_drafter, tiny_target

    drafter = tiny_drafter(tiny_target(0), 3, block_size=4)
    drafter.set_confidence_temperatures([0.7, 0.9, 1.2, 1.5], biases=[0.1, -0.2, 0.3, 0.0],
                                        max_prob_weights=[0.5, -0.3, 0.8, 0.1])
    R, G, d = 6, 4, drafter.hidden_size
    g = torch.Generator().manual_seed(1)
    hidden, anchor = torch.randn(R, G, d, generator=g), torch.randint(3, 90, (R,), generator=g)
    tokens, act = torch.randint(3, 90, (R, G), generator=g), torch.tensor([True, False, True, True, False, True])
    offsets = torch.tensor([0.05, -0.1, 0.0, 0.2])
    top = torch.rand(R, G, generator=g)
    with torch.no_grad():
        z = drafter.confidence_logits(hidden, torch.cat((anchor[:, None], tokens[:, :-1]), 1))
        want = torch.where(act[:, None], prefix_survival(drafter.calibrated_confidence(z, top, offsets)), 0.0)
        got = confidence_survival_reference(
            hidden=hidden, anchor=anchor, tokens=tokens, embedding=drafter.markov_head.w1.weight,
            head_weight=drafter.confidence_head.weight, head_bias=drafter.confidence_head.bias,
            temperatures=drafter.confidence_temperatures, biases=drafter.confidence_biases, offsets=offsets,
            active=act, max_prob=top, max_prob_weights=drafter.confidence_max_prob_weights)
    assert torch.equal(got.logits, z) and torch.equal(got.survival, want)
    assert torch.equal(calibrated_confidence(z, drafter.confidence_temperatures, drafter.confidence_biases, top,
                                             drafter.confidence_max_prob_weights, offsets),
                       drafter.calibrated_confidence(z, top, offsets=offsets))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank,offsets,score", [(0, False, None), (8, False, "max_prob"), (32, True, None),
                                                (32, True, "max_prob"), (8, True, "top_gap")])
def test_triton_computes_the_reference(dtype, rank, offsets, score):
    from dspark.survival import max_prob_logit

    for i, (R, G, d) in enumerate(((1, 1, 16), (5, 4, 64), (37, 7, 96))):
        case = block_case(R, G, d, rank, dtype, seed=10 * i + rank, offsets=offsets, max_prob=score == "max_prob",
                          top_gap=score == "top_gap")
        want = confidence_survival_reference(**case)
        out = BlockConfidence(torch.full((R + 2, G), -7.0)[:R], torch.full((R + 2, G), -7.0)[:R])
        got = confidence_survival_triton(**case, out=out)
        assert got is out
        if dtype == torch.float32:
            torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
        else:  # the layer's output dtype: the same value, or a neighbour where the reduction order rounds apart
            ulp = 2.0 ** (torch.floor(torch.log2(want.logits.abs().clamp_min(1e-3))) - 7)
            assert ((got.logits - want.logits).abs() <= ulp).all(), (got.logits - want.logits).abs().max()
        # the survival is the calibration's prefix product of the kernel's own logits (so, in fp32, the reference's)
        x = got.logits / case["temperatures"] + case["biases"] + (case["offsets"] if offsets else 0.0)
        if score == "max_prob":
            x = x + case["max_prob_weights"] * max_prob_logit(case["max_prob"])
        if score == "top_gap":
            x = x + case["top_gap_weights"] * case["top_gap"]
        from_logits = torch.where(case["active"][:, None], torch.cumprod(torch.sigmoid(x), 1), 0.0)
        torch.testing.assert_close(got.survival, from_logits, rtol=1e-5, atol=1e-6)
        if dtype == torch.float32:
            torch.testing.assert_close(got.survival, want.survival, rtol=1e-5, atol=1e-6)
        assert (got.survival[~case["active"]] == 0).all() and (got.survival[case["active"]] > 0).all()
        assert (got.survival[:, 1:] <= got.survival[:, :-1]).all()  # a prefix product: non-increasing


def test_refusals_name_the_input():
    case = block_case(3, 4, 16, 8, torch.float32, seed=0)
    out = BlockConfidence(torch.zeros(3, 4), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="tokens int64"):
        confidence_survival_triton(**{**case, "tokens": case["tokens"][:, :3]}, out=out)
    with pytest.raises(ValueError, match="one linear unit"):
        confidence_survival_reference(**{**case, "head_weight": case["head_weight"][:, :10]})
    with pytest.raises(ValueError, match="temperatures must be"):
        confidence_survival_reference(**{**case, "temperatures": torch.ones(3)})
    with pytest.raises(ValueError, match="come together"):
        confidence_survival_reference(**case, max_prob=torch.rand(3, 4))
    with pytest.raises(ValueError, match="max_prob must be float32"):
        confidence_survival_triton(**case, out=out, max_prob=torch.rand(3, 4).double(), max_prob_weights=torch.ones(4))
    with pytest.raises(ValueError, match="max_prob_weights must be"):
        confidence_survival_reference(**case, max_prob=torch.rand(3, 4), max_prob_weights=torch.ones(3))
    with pytest.raises(ValueError, match="top_gap and top_gap_weights come together"):
        confidence_survival_reference(**case, top_gap_weights=torch.ones(4))
    with pytest.raises(ValueError, match="top_gap must be float32"):
        confidence_survival_triton(**case, out=out, top_gap=torch.rand(3, 4).half(), top_gap_weights=torch.ones(4))
    with pytest.raises(ValueError, match="out.survival"):
        confidence_survival_triton(**case, out=BlockConfidence(torch.zeros(3, 4), torch.zeros(3, 4).double()))
