"""A sampled draft slot's draw kernel (kernels/draft_sampling.py), interpreted on CPU: greedy rows take the first
index of the largest logit, sampled rows the reference's inverse-CDF token (a different token only where the
uniform falls within rounding of a boundary), probabilities equal to the reference's softmax within fp32
rounding and written into a slot of a [R, G, V] buffer, draws that follow the probabilities (chi-square over
many uniforms), bad inputs refused; each row's top-2 logit gap (gap_out) equal to the reference's bitwise, ties
and special values included; and the device-resident engine's sampled outputs unchanged with the kernel drawing
its drafts, an sts_top_gap drafter's gaps taken from the draw's own pass. tests/test_kernels_gpu.py repeats the
checks on CUDA at SmolLM2's vocabulary."""

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


def gap_case(V: int = 200) -> torch.Tensor:
    """Rows whose two largest logits sit where the tiles (64 here) make the gap hard: ties within a tile and
    across tiles, the runner-up in another tile before or after the top, a partial last tile, and the special
    values top_gap_reference defines (NaN, +inf twice, one +inf, only -inf, a finite top over -inf)."""
    g = torch.Generator().manual_seed(5)
    rows = torch.randn(14, V, generator=g) * 3
    rows[1, [3, 40]] = 20.0  # a tie within one tile: gap 0
    rows[2, [10, 150]] = 20.0  # a tie across tiles
    rows[3, 130], rows[3, 5] = 20.0, 19.5  # the runner-up in an earlier tile
    rows[4, 5], rows[4, 130] = 20.0, 19.25  # ... and in a later one
    rows[5, V - 1], rows[5, 0] = 30.0, 29.0  # the top in the partial last tile
    rows[6, 77] = float("nan")
    rows[7, [2, 190]] = float("inf")  # inf - inf: NaN
    rows[8, 66] = float("inf")
    rows[9] = -float("inf")
    rows[10] = -float("inf")
    rows[10, 100] = 1.5  # a finite top over -inf: +inf
    rows[11, 63], rows[11, 64] = 20.0, 20.0  # a tie straddling the tile edge
    rows[12, 64], rows[12, 63] = 20.0, 19.0
    return rows


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on the NaN and inf rows
def test_the_gap_equals_the_reference_bitwise_and_goes_into_a_strided_column():
    from kernels.argmax import top_gap_reference

    logits = gap_case()
    M = logits.shape[0]
    temperature = torch.tensor([0.0, 0.8] * (M // 2))
    gaps = torch.full((M, 3), -7.0)  # one slot's column of the decoder's [R, G] buffer
    plain_t, plain_p = sample_slot_triton(logits, temperature, torch.rand(M))
    u = torch.rand(M, generator=torch.Generator().manual_seed(2))
    tokens, probs = sample_slot_triton(logits, temperature, u, gap_out=gaps[:, 1])
    want = top_gap_reference(logits)
    torch.testing.assert_close(gaps[:, 1], want, rtol=0, atol=0, equal_nan=True)
    assert gaps[1, 1] == 0 and gaps[2, 1] == 0 and gaps[11, 1] == 0 and gaps[3, 1] == 0.5
    assert gaps[8, 1] == float("inf") and gaps[10, 1] == float("inf") and gaps[7, 1].isnan() and gaps[9, 1].isnan()
    assert (gaps[:, [0, 2]] == -7.0).all()  # the other slots untouched
    # the draw is the same with or without the gap (the same uniforms)
    again_t, again_p = sample_slot_triton(logits, temperature, u)
    assert torch.equal(tokens, again_t) and torch.equal(probs.nan_to_num(), again_p.nan_to_num())
    two = torch.tensor([[1.0, 3.5], [2.0, 2.0]])  # the smallest vocabulary a gap has
    out = torch.empty(2)
    sample_slot_triton(two, torch.zeros(2), torch.rand(2), gap_out=out)
    assert out.tolist() == [2.5, 0.0]


def test_a_bad_gap_out_is_refused():
    logits, temperature, u = case(4, 50, seed=1)
    with pytest.raises(ValueError, match="gap_out must be float32"):
        sample_slot_triton(logits, temperature, u, gap_out=torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="gap_out must be float32"):
        sample_slot_triton(logits, temperature, u, gap_out=torch.zeros(3))
    with pytest.raises(ValueError, match="at least 2 columns"):
        sample_slot_triton(logits[:, :1], temperature, u, gap_out=torch.zeros(4))


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


def test_an_sts_top_gap_drafter_takes_its_sampled_gaps_from_the_draw(monkeypatch):
    """Sampled rows of an sts_top_gap drafter with the fused draw on (as on CUDA): the kernel writes each slot's
    gap in its first pass (gap_out given, no separate dspark.sampling.top_gap), the gaps equal a full sort's, and
    the outputs and the survival equal those of the unfused path, which takes them from top_gap."""
    import dspark.sampling as sampling
    from dspark.config import SamplingParams
    from test_calibration_max_prob import head_engine, spy_draft_stage
    from test_calibration_top_gap import B_ENGINE, T_ENGINE, V_ENGINE, _sorted_gap
    from test_engine_lossless import prompts_for
    from tiny import tiny_drafter, tiny_target

    target = tiny_target(21)
    drafter = tiny_drafter(target, 22, block_size=4)
    drafter.set_confidence_temperatures(T_ENGINE, B_ENGINE, None, V_ENGINE)
    prompts = prompts_for(41, 3)
    params = [SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, seed=7 + i) for i in range(3)]
    real_kernel, real_gap = mod.sample_slot_triton, sampling.top_gap
    results = {}
    for fused in (False, True):
        kernel_gaps, separate = [], []

        def kernel(*args, gap_out=None, **kw):
            kernel_gaps.append(gap_out is not None)
            return real_kernel(*args, gap_out=gap_out, **kw)

        def top_gap(*args, **kw):
            separate.append(1)
            return real_gap(*args, **kw)

        monkeypatch.setattr(mod, "sample_slot_triton", kernel)
        monkeypatch.setattr(sampling, "top_gap", top_gap)
        monkeypatch.setattr(sampling, "fused_draft_sampling_enabled", lambda kernels, device, on=fused: on)
        seen = spy_draft_stage(monkeypatch, "top_gap", _sorted_gap)
        eng = head_engine(target, drafter, max_num_seqs=4)
        outs = [o.token_ids for o in eng.generate(prompts, params)]
        monkeypatch.undo()
        assert seen and eng.counters()["confidence_calibration/sts_top_gap_steps"] > 0
        for step in seen:
            torch.testing.assert_close(step["top_gap"], step["independent"], rtol=0, atol=0)
        if fused:
            assert kernel_gaps and all(kernel_gaps) and not separate
        else:
            assert separate and not kernel_gaps
        results[fused] = outs, torch.cat([s["survival"] for s in seen])
    assert results[True][0] == results[False][0]
    torch.testing.assert_close(results[True][1], results[False][1], rtol=1e-6, atol=1e-7)
