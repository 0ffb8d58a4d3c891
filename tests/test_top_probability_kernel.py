"""Top-token probability kernel (kernels/top_probability.py), interpreted on CPU: the reference is the torch
expression exp(max - logsumexp) in float32, and the one-pass kernel matches it (rtol 1e-5) over random rows
in float32, bfloat16 and float16, ties, peaked and flat rows, vocabularies that end inside a tile, rows
strided in memory, a strided ``out=``, and gives NaN where the reference does (+inf, NaN, only -inf).
The dispatcher dspark.sampling.top_probability, its switch, and the engine's draft stage on both of its
sampling closures with the kernel forced on. tests/test_kernels_gpu.py repeats the checks on CUDA at
V = 49152 and under CUDA-graph capture."""

import pytest
import torch  # does not import triton

from interpreter_only import interpreter_module  # noqa: E402  (tests/interpreter_only.py)

interpreter_module()

from kernels.top_probability import top_probability_reference, top_probability_triton  # noqa: E402
from dspark.config import DEFAULT_KERNELS, ConfigError, KernelConfig, KernelSwitches  # noqa: E402

# the interpreter runs the kernel's arithmetic in numpy, which warns where a masked lane computes -inf - -inf
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

NAN, INF = float("nan"), float("inf")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def torch_expression(x):
    """The expression the draft stage used before the kernel, on the float32 values."""
    x = x.float()
    return torch.exp(x.max(dim=-1).values - torch.logsumexp(x, dim=-1))


def check(x, rtol=1e-5, **kw):
    """top_probability_triton(x) against the reference: float32 [T], close, NaN where the reference is NaN."""
    want = top_probability_reference(x)
    got = top_probability_triton(x, **kw)
    assert got.dtype == torch.float32 and got.shape == (x.shape[0],) and got.device == x.device
    torch.testing.assert_close(got, want, rtol=rtol, atol=0.0, equal_nan=True)
    return got


def test_reference_is_the_torch_expression():
    x = torch.tensor([[1.0, 2.0, 3.0, 0.5],
                      [0.0, 0.0, 0.0, 0.0],  # flat: 1 / V
                      [-INF, 4.0, -INF, -INF],  # -inf beside a finite maximum weighs nothing: 1
                      [-INF, 2.0, 2.0, -INF],  # a tie of two: 1/2
                      [0.0, INF, 1.0, 2.0],  # +inf: inf - inf, NaN
                      [-INF, -INF, -INF, -INF],  # only -inf: NaN
                      [0.0, NAN, 1.0, 2.0]])  # NaN
    want = torch.exp(x.max(-1).values - torch.logsumexp(x, -1))
    got = top_probability_reference(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, equal_nan=True)
    torch.testing.assert_close(got, torch.softmax(x, -1).amax(-1), equal_nan=True)
    assert got[1].item() == 0.25 and got[2].item() == 1.0 and got[3].item() == 0.5
    assert got[4:].isnan().all()
    # computed in float32 on the widened values, whatever the input dtype; any leading shape
    h = torch.randn(3, 5, 40).bfloat16()
    assert top_probability_reference(h).dtype == torch.float32
    torch.testing.assert_close(top_probability_reference(h), torch.softmax(h.float(), -1).amax(-1))


# (T, V, block): V below, at and past multiples of the tile
SHAPES = [(1, 1, 16), (1, 16, 16), (3, 17, 16), (2, 100, 16), (5, 64, 32), (4, 95, 32), (11, 50, 16),
          (7, 130, 64), (40, 33, 16), (1, 300, 16), (6, 1000, 128), (3, 4097, None)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,V,block", SHAPES)
def test_random_rows(T, V, block, dtype):
    g = torch.Generator().manual_seed(T * 1000 + V)
    x = (torch.randn(T, V, generator=g) * 4).to(dtype)
    kw = {} if block is None else {"block": block}
    got = check(x, **kw)
    torch.testing.assert_close(got, torch_expression(x), rtol=1e-5, atol=0.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_full_vocabulary(dtype):
    """SmolLM2's 49,152 entries with the default tile, and a slot's logits scaled like a drafter's."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 49152, generator=g) * torch.tensor([[1.0], [6.0], [20.0]])).to(dtype)
    got = check(x)
    assert ((got > 0) & (got <= 1)).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties(dtype):
    V = 80  # block 16: five tiles per row
    x = torch.randn(6, V).clamp(-3, 3).to(dtype)
    x[0, [70, 5, 33]] = 9.0  # equal maxima in three tiles
    x[1, [20, 21, 27]] = 9.0  # the maximum repeated inside one tile
    x[2, [15, 16]] = 9.0  # on either side of a tile boundary
    x[3, [0, 16, 32, 48, 64]] = 9.0  # the same lane of every tile
    x[4, :] = 9.0  # all equal: 1 / V
    x[5] = -INF
    x[5, [3, 50, 79]] = 1.0  # a three-way tie and nothing else: 1/3
    got = check(x, block=16)
    torch.testing.assert_close(got[4:], torch.tensor([1 / V, 1 / 3]), rtol=1e-6, atol=0.0)


def test_peaked_and_flat_rows():
    V = 200
    x = torch.zeros(6, V)
    x[0, 123] = 200.0  # every other term underflows: exactly 1
    x[1, 7] = 12.0  # 1 / (1 + 199 e^-12)
    x[2, 199] = 5.0  # the maximum in the last lane of a partial tile
    x[3] = -5.0  # flat: 1 / V
    x[4] = torch.linspace(-1e-3, 1e-3, V)  # nearly flat
    x[5, :] = -1e30  # huge magnitudes, flat
    x[5, 100] = 3e38
    got = check(x, block=32)
    assert got[0].item() == 1.0 and got[5].item() == 1.0
    want1 = 1.0 / (1.0 + 199.0 * torch.exp(torch.tensor(-12.0, dtype=torch.float64)))
    assert abs(got[1].item() - want1.item()) < 1e-6 * want1.item()
    torch.testing.assert_close(got[3], torch.tensor(1.0 / V), rtol=1e-6, atol=0.0)
    # a slot with a clear favourite: 1 - p (about 1e-3) against float64
    y = (torch.randn(4, 500, generator=torch.Generator().manual_seed(4)) * 3).double()
    y[:, 17] = 18.0
    p64 = torch.softmax(y, -1).amax(-1)
    got = top_probability_triton(y.float(), block=64).double()
    assert ((1 - p64) > 1e-4).all()
    torch.testing.assert_close(1 - got, 1 - p64, rtol=1e-3, atol=0.0)


def test_infinities_and_nan():
    V = 70  # block 16: the special entries in different tiles
    x = torch.randn(9, V)
    x[0, 50] = INF  # NaN, as exp(inf - inf)
    x[1, [3, 60]] = INF
    x[2] = -INF  # only -inf: NaN
    x[3] = -INF
    x[3, 69] = -2.0  # -inf everywhere but the last entry: 1
    x[4, :40] = -INF  # whole tiles of -inf before the finite values
    x[5, 33] = NAN
    x[6, 69] = NAN  # in the last lane of the partial tile
    x[7, 0] = -NAN
    x[7, 1] = INF
    x[8] = -INF
    x[8, [2, 40]] = -3.0  # a tie of two finite values in different lanes, -inf everywhere else
    got = check(x, block=16)
    assert got[[0, 1, 2, 5, 6, 7]].isnan().all()
    assert got[3].item() == 1.0 and got[8].item() == 0.5
    assert not got[[3, 4, 8]].isnan().any()
    for dtype in (torch.bfloat16, torch.float16):
        check(x.to(dtype), block=16)


def test_one_and_no_rows():
    x = torch.randn(1, 300)
    check(x, block=16)
    assert top_probability_triton(torch.randn(1, 1)).item() == 1.0
    empty = top_probability_triton(torch.zeros(0, 50))
    assert empty.shape == (0,) and empty.dtype == torch.float32
    out = torch.zeros(0)
    assert top_probability_triton(torch.zeros(0, 50), out=out) is out


def test_rows_strided_in_memory():
    """A [T, V] slice of a wider tensor: rows stride 120 apart, columns 10..10+V; every other row; stride 0."""
    g = torch.Generator().manual_seed(11)
    wide = torch.randn(9, 120, generator=g)
    wide[:, :10] = 50.0  # would dominate every row if it were read
    wide[:, 90:] = 50.0
    x = wide[:, 10:90]
    assert x.stride() == (120, 1)
    got = check(x, block=16)
    assert (got < 0.9).all()
    check(wide.bfloat16()[::2, 10:90], block=32)  # stride 240
    rep = check(wide[4:5, 10:90].expand(5, 80), block=16)
    assert torch.equal(rep, got[4:5].expand(5))  # the same row gives the same bits wherever it is


def test_out_is_a_strided_column():
    """``out=`` one slot's column of a [rows, slots] buffer: written there, nothing else touched."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(13, 70, generator=g) * 3
    buffer = torch.full((13, 4), -7.0)
    res = top_probability_triton(x, out=buffer[:, 2], block=16)
    assert res.data_ptr() == buffer[:, 2].data_ptr()
    torch.testing.assert_close(buffer[:, 2], top_probability_reference(x), rtol=1e-5, atol=0.0)
    assert (buffer[:, [0, 1, 3]] == -7.0).all()


def test_repeatable_bits():
    """The sum order depends on the tile size alone: a row's result is the same whatever the other rows."""
    g = torch.Generator().manual_seed(13)
    x = torch.randn(8, 333, generator=g) * 5
    a = top_probability_triton(x, block=32)
    b = top_probability_triton(x[[5, 2]], block=32)
    assert torch.equal(b, a[[5, 2]]) and torch.equal(top_probability_triton(x, block=32), a)


def test_rejects_bad_input():
    x = torch.randn(4, 50)
    with pytest.raises(TypeError, match="torch.Tensor"):
        top_probability_triton(x.numpy())
    with pytest.raises(ValueError, match="2-D"):
        top_probability_triton(torch.randn(50))
    with pytest.raises(ValueError, match="2-D"):
        top_probability_triton(torch.randn(2, 3, 50))
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        top_probability_triton(x.double())
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        top_probability_triton(torch.zeros(4, 50, dtype=torch.int32))
    with pytest.raises(ValueError, match="empty vocabulary"):
        top_probability_triton(torch.zeros(4, 0))
    with pytest.raises(ValueError, match="unit stride"):
        top_probability_triton(torch.randn(50, 4).t())
    with pytest.raises(TypeError, match="out must be a torch.Tensor"):
        top_probability_triton(x, out=[0.0] * 4)
    with pytest.raises(TypeError, match="float32"):
        top_probability_triton(x, out=torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        top_probability_triton(x, out=torch.zeros(5))
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        top_probability_triton(x, out=torch.zeros(4, 1))
    with pytest.raises(ValueError, match="power of two"):
        top_probability_triton(x, block=24)
    with pytest.raises(ValueError, match="power of two"):
        top_probability_triton(x, block=8)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        top_probability_triton(torch.randn(2, 10))


# ------------------------------------------------------------------------------ dispatcher and switch

TRITON = KernelConfig(attention_backend="triton", triton_top_probability=True)


def test_dispatch(monkeypatch):
    import dspark.sampling as sampling

    calls = []

    def spy(logits, out=None):
        calls.append(tuple(logits.shape))
        return top_probability_triton(logits, out=out, block=16)

    monkeypatch.setattr("kernels.top_probability.top_probability_triton", spy)
    x = torch.randn(5, 50) * 3
    want = top_probability_reference(x)
    # CPU tensors never take the kernel, whatever the engine's settings
    assert torch.equal(sampling.top_probability(x, TRITON), want) and calls == []
    # as on CUDA: an engine on the Triton backend takes the kernel
    real = sampling.triton_top_probability_enabled
    monkeypatch.setattr(sampling, "triton_top_probability_enabled", lambda kernels, device: real(kernels, "cuda"))
    torch.testing.assert_close(sampling.top_probability(x, TRITON), want, rtol=1e-5, atol=0.0)
    assert calls == [(5, 50)]
    buffer = torch.zeros(5, 3)
    assert sampling.top_probability(x, TRITON, out=buffer[:, 1]).data_ptr() == buffer[:, 1].data_ptr()
    torch.testing.assert_close(buffer[:, 1], want, rtol=1e-5, atol=0.0)
    assert calls == [(5, 50)] * 2 and (buffer[:, [0, 2]] == 0).all()
    # shapes, dtypes and outputs the kernel does not take go to the reference
    h = torch.randn(2, 3, 50)
    assert torch.equal(sampling.top_probability(h, TRITON), top_probability_reference(h))
    for other in (x.double(), torch.randn(50, 5).t()):
        assert torch.equal(sampling.top_probability(other, TRITON), top_probability_reference(other))
    assert len(calls) == 2
    # the torch backend, the switch off, or no engine settings at all: the reference, into out= too
    for kernels in (DEFAULT_KERNELS, KernelConfig(attention_backend="triton", triton_top_probability=False), None):
        assert torch.equal(sampling.top_probability(x, kernels), want)
        out = torch.zeros(5, 2)
        sampling.top_probability(x, kernels, out=out[:, 0])
        assert torch.equal(out[:, 0], want) and (out[:, 1] == 0).all()
    assert len(calls) == 2


def test_switch():
    from dspark.sampling import triton_top_probability_enabled

    assert triton_top_probability_enabled(TRITON, "cuda") and not triton_top_probability_enabled(TRITON, "cpu")
    assert not triton_top_probability_enabled(DEFAULT_KERNELS, "cuda")
    assert not triton_top_probability_enabled(None, "cuda")
    assert KernelSwitches().triton_top_probability  # on by default
    assert triton_top_probability_enabled(KernelConfig(attention_backend="triton"), "cuda")
    off = KernelConfig(attention_backend="triton", triton_top_probability=False)
    assert not triton_top_probability_enabled(off, "cuda")
    with pytest.raises(ConfigError, match="engine.kernels.triton_top_probability"):
        KernelSwitches(triton_top_probability=1)


def test_runner_schema_has_the_switch():
    from runners.schema import KernelsSchema

    assert KernelsSchema().triton_top_probability is KernelSwitches().triton_top_probability is True


# ------------------------------------------------------------------------------ the engine's draft stage

@pytest.mark.parametrize("sampled", [False, True])
def test_draft_stage_keeps_the_kernels_top_probability(monkeypatch, sampled):
    """Both sampling closures of the draft stage write the kernel's values into max_prob (forced on here, as on
    CUDA), equal to the softmax max of the logits each slot drew from; the tokens do not change."""
    import dspark.sampling as sampling
    from dspark.config import SamplingParams
    from dspark.engine import Engine
    from dspark.graph_decode import GraphDecoder
    from dspark.models.drafter import DSparkDrafter
    from test_engine_lossless import prompts_for
    from tiny import tiny_drafter, tiny_engine_config, tiny_target

    target = tiny_target(21)
    drafter = tiny_drafter(target, 22, block_size=4)
    # an sts_max_prob calibration: the draft stage keeps max_prob
    drafter.set_confidence_temperatures([0.8, 1.5, 1.0, 0.6], [0.3, -0.4, 0.2, 0.1], [1.5, -0.7, 0.9, 2.0])
    prompts = prompts_for(41, 3)
    params = [SamplingParams(max_tokens=10, ignore_eos=True, **({"temperature": 0.8, "seed": 3 + i} if sampled
                                                               else {})) for i in range(len(prompts))]
    real_stage, real_draft = GraphDecoder._draft_stage, DSparkDrafter.draft

    def run(forced: bool):
        seen, probs, calls = [], [], []

        def draft(self, hidden, anchor_ids, lm_head_weight, sample_fn, *args, **kw):
            def watch(logits, k):
                probs.append(torch.softmax(logits.float(), -1).amax(-1))
                return sample_fn(logits, k)
            return real_draft(self, hidden, anchor_ids, lm_head_weight, watch, *args, **kw)

        def stage(self, R, host_driven=False):
            probs.clear()
            real_stage(self, R, host_driven)
            seen.append((self.max_prob[:R].clone(), torch.stack(probs, 1)))

        def kernel(logits, out=None):
            calls.append(tuple(logits.shape))
            return top_probability_triton(logits, out=out)

        with monkeypatch.context() as m:
            m.setattr(GraphDecoder, "_draft_stage", stage)
            m.setattr(DSparkDrafter, "draft", draft)
            m.setattr("kernels.top_probability.top_probability_triton", kernel)
            m.setattr(sampling, "triton_top_probability_enabled", lambda kernels, device: forced)
            eng = Engine(target, None, tiny_engine_config(max_num_seqs=4), drafter)
            eng.steps.confidence = True  # the head runs, as a planning engine's does: its calibration reads max_prob
            outs = eng.generate(prompts, params)
        assert eng.steps.keeps_max_prob() and seen
        return [o.token_ids for o in outs], seen, calls

    tokens_on, seen_on, calls_on = run(True)
    tokens_off, seen_off, calls_off = run(False)
    assert calls_off == [] and len(calls_on) == 4 * len(seen_on)  # one call per slot of every draft stage
    assert tokens_on == tokens_off
    for (kept, softmax_max), (kept_off, _) in zip(seen_on, seen_off):
        torch.testing.assert_close(kept, softmax_max, rtol=1e-5, atol=0.0)
        torch.testing.assert_close(kept, kept_off, rtol=1e-5, atol=0.0)
