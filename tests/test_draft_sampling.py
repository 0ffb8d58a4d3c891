"""A sampled draft slot's draw kernel (kernels/draft_sampling.py), interpreted on CPU: greedy rows take the first
index of the largest logit, sampled rows the reference's inverse-CDF token (a different token only where the
uniform falls within rounding of a boundary), probabilities equal to the reference's softmax within fp32
rounding and written into a slot of a [R, G, V] buffer, draws that follow the probabilities (chi-square over
many uniforms), bad inputs refused; and the device-resident engine's sampled outputs unchanged with the kernel
drawing its drafts. tests/test_kernels_gpu.py repeats the checks on CUDA at SmolLM2's vocabulary."""

import pytest
import torch  # does not import triton

from interpreter_only import interpreter_module  # noqa: E402  (tests/interpreter_only.py)

interpreter_module()

from kernels import draft_sampling as mod  # noqa: E402
from kernels.draft_sampling import sample_slot_reference, sample_slot_triton  # noqa: E402


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    monkeypatch.setattr(mod, "BLOCK_V", 64)  # several tiles per row at these vocabularies


def case(M, V, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(M, V, generator=g) * 3
    temperature = torch.tensor([0.0, 0.7, 1.0, 0.3, 1.7][:M] * (M // 5 + 1))[:M]
    return logits, temperature, torch.rand(M, generator=g)


@pytest.mark.parametrize("M,V", [(1, 1), (5, 64), (7, 100), (10, 300)])
def test_tokens_and_probabilities_match_the_reference(M, V):
    logits, temperature, u = case(M, V, seed=M * 100 + V)
    logits[0, [V // 2, V - 1]] = 50.0  # a tie for the greedy row: the first index wins
    want_t, want_p = sample_slot_reference(logits, temperature, u)
    got_t, got_p = sample_slot_triton(logits, temperature, u)
    torch.testing.assert_close(got_p, want_p, rtol=1e-5, atol=1e-7)
    assert got_t.dtype == torch.int64
    for r in range(M):
        if temperature[r] == 0 or got_t[r] == want_t[r]:
            assert got_t[r] == want_t[r], r
            continue
        # A different draw only where u * total lies within rounding of the boundary between the two tokens.
        cdf = torch.cumsum(want_p[r].double(), 0)
        lo, hi = sorted((int(got_t[r]), int(want_t[r])))
        assert abs(cdf[lo].item() - u[r].item() * cdf[-1].item()) < 1e-5, r


def test_probabilities_go_into_a_slot_of_the_decoders_buffer():
    logits, temperature, u = case(6, 90, seed=3)
    buffer = torch.full((6, 4, 90), -1.0)
    tokens, probs = sample_slot_triton(logits, temperature, u, probs_out=buffer[:, 2])
    assert probs.data_ptr() == buffer[:, 2].data_ptr()
    torch.testing.assert_close(buffer[:, 2], sample_slot_reference(logits, temperature, u)[1], rtol=1e-5, atol=1e-7)
    assert (buffer[:, [0, 1, 3]] == -1.0).all()  # the other slots untouched


def test_draws_follow_the_probabilities():
    from scipy.stats import chisquare

    V, n = 8, 1500
    g = torch.Generator().manual_seed(11)
    logits = (torch.randn(1, V, generator=g) * 1.5).expand(n, V).contiguous()
    temperature = torch.full((n,), 0.8)
    tokens, probs = sample_slot_triton(logits, temperature, torch.rand(n, generator=g))
    counts = torch.bincount(tokens, minlength=V).double()
    expected = probs[0].double() * n
    assert chisquare(counts.numpy(), expected.numpy() * counts.sum().item() / expected.sum().item()).pvalue > 1e-3


def test_bad_inputs_are_refused():
    logits, temperature, u = case(4, 50, seed=1)
    with pytest.raises(ValueError, match="logits must be float32"):
        sample_slot_triton(logits.double(), temperature, u)
    with pytest.raises(ValueError, match="temperature must be float32"):
        sample_slot_triton(logits, temperature[:3], u)
    with pytest.raises(ValueError, match="u must be float32"):
        sample_slot_triton(logits, temperature, u.double())
    with pytest.raises(ValueError, match="probs_out must be float32"):
        sample_slot_triton(logits, temperature, u, probs_out=torch.zeros(50, 4).t())


def test_the_engine_samples_the_same_outputs_with_the_kernel_drawing_its_drafts(monkeypatch):
    """The device-resident path's sampled drafts through the kernel (switched on as on CUDA): the same outputs as
    with dspark.sampling.sample_rows, and the kernel did draw them."""
    import dspark.sampling as sampling
    from dspark.config import SamplingParams
    from dspark.engine import Engine
    from tiny import tiny_drafter, tiny_engine_config, tiny_target

    target = tiny_target(seed=0, scale=4.0)
    drafter = tiny_drafter(target, seed=1)
    prompts = [[1, 5, 9, 13, 2 + i] for i in range(2)]
    params = [SamplingParams(temperature=0.8, max_tokens=10, ignore_eos=True, seed=7 + i) for i in range(2)]
    outputs, calls = {}, []
    real = mod.sample_slot_triton

    def counted(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(mod, "sample_slot_triton", counted)
    for fused in (False, True):
        monkeypatch.setattr(sampling, "fused_draft_sampling_enabled", lambda kernels, device, on=fused: on)
        engine = Engine(target, None, tiny_engine_config(cuda_graphs=False), drafter)
        outputs[fused] = [o.token_ids for o in engine.generate(prompts, params)]
    assert calls and outputs[True] == outputs[False]
