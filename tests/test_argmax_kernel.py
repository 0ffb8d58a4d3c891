"""Greedy argmax kernel (kernels/argmax.py), interpreted on CPU: index-exact against
torch.argmax on CPU (first maximum, NaN largest and first NaN wins, -0.0 == +0.0) over random
shapes, ties across and within chunks, special rows, strided rows, ``out=`` and repeated
calls that depend on the kernel leaving its per-row counters and cells clean. The outputs of the
same pass, top_out (the top softmax probability) and gap_out (the top-2 gap, bitwise against
top_gap_reference), and the dispatcher dspark.sampling.greedy_argmax are checked here too.

Rows are split into many chunks by passing small ``block``/``tiles`` (the interpreter runs
one program at a time, so most vocabularies stay small); tests/test_kernels_gpu.py repeats
the checks on CUDA at V = 49152 with the default tiling and under CUDA-graph replay."""

import pytest
import torch  # does not import triton

from interpreter_only import interpreter_module  # noqa: E402  (tests/interpreter_only.py)

interpreter_module()

from kernels import argmax as argmax_mod  # noqa: E402
from kernels.argmax import argmax_reference, argmax_triton, top_gap_reference  # noqa: E402
from dspark.config import DEFAULT_KERNELS, KernelConfig  # noqa: E402

NAN, INF = float("nan"), float("inf")


def check(x, **kw):
    """argmax_triton(x) must equal torch.argmax on CPU exactly; returns the index list."""
    want = torch.argmax(x, dim=-1)
    got = argmax_triton(x, **kw)
    assert got.dtype == torch.int64 and got.shape == want.shape
    assert torch.equal(got, want), f"got {got.tolist()}, torch.argmax {want.tolist()}"
    return got.tolist()


def workspace_is_clean():
    ws = argmax_mod._WORKSPACES.get(torch.device("cpu"))
    return ws is None or (bool((ws.counts == 0).all()) and bool((ws.cells == argmax_mod._INT64_MIN).all()))


def test_reference_is_torch_argmax():
    x = torch.tensor([[1.0, NAN, 3.0, NAN], [-0.0, 0.0, -1.0, 0.0], [-INF, -INF, -INF, -INF], [1.0, 2.0, 2.0, 1.0]])
    assert argmax_reference(x).tolist() == [1, 0, 0, 1]
    assert torch.equal(argmax_reference(x), torch.argmax(x, dim=-1))


# (T, V, block, tiles): V below, at and past multiples of the chunk (block * tiles)
RANDOM_SHAPES = [(1, 1, 16, 1), (1, 16, 16, 1), (3, 17, 16, 1), (2, 100, 16, 2), (5, 64, 16, 2), (4, 95, 32, 1),
                 (11, 50, 16, 1), (7, 130, 16, 4), (40, 33, 16, 1), (23, 48, 16, 1), (1, 300, 16, 1),
                 (16, 40, 16, None)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,V,block,tiles", RANDOM_SHAPES)
def test_random_shapes(T, V, block, tiles, dtype):
    g = torch.Generator().manual_seed(T * 1000 + V)
    x = (torch.randn(T, V, generator=g) * 3).to(dtype)
    check(x, block=block, tiles=tiles)
    assert workspace_is_clean()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_full_vocabulary_default_tiling(dtype):
    """V = 49152 with the default block: 48 programs per row, combined through the cells."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 49152, generator=g).to(dtype)
    x[1, 40000] = 100.0
    x[1, 49151] = 100.0  # tie in the last chunk: the earlier index wins
    assert check(x)[1] == 40000
    assert workspace_is_clean()


def test_fp16():
    g = torch.Generator().manual_seed(8)
    check(torch.randn(6, 70, generator=g).half(), block=16, tiles=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ties_pick_the_first_index(dtype):
    V = 80  # block 16, tiles 1: five chunks per row
    x = torch.randn(6, V).clamp(-3, 3).to(dtype)
    x[0, [70, 5, 33]] = 9.0  # equal maxima in three different chunks
    x[1, [20, 21, 27]] = 9.0  # the maximum repeated inside one chunk
    x[2, [79, 64]] = 9.0  # both in the last chunk
    x[3, [15, 16]] = 9.0  # on either side of a chunk boundary
    x[4, [47, 63, 31, 79]] = 9.0  # the last lane of several chunks
    x[5, :] = 9.0  # all equal
    assert check(x, block=16, tiles=1) == [5, 20, 64, 15, 31, 0]
    # the same ties when a program covers two tiles (a lane holds its first maximum)
    assert check(x, block=16, tiles=2) == [5, 20, 64, 15, 31, 0]


def test_all_equal_rows():
    for value in (0.0, -1.5, 7.0, INF, -INF):
        x = torch.full((3, 50), value)
        assert check(x, block=16, tiles=1) == [0, 0, 0]


def test_infinite_rows():
    x = torch.full((4, 70), -INF)
    x[1, 55] = -1e30  # the only finite value
    x[2, [60, 9]] = INF
    x[3, 69] = -3.0
    assert check(x, block=16, tiles=1) == [0, 55, 9, 69]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nan_is_largest_and_the_first_nan_wins(dtype):
    x = torch.randn(5, 64).to(dtype)
    x[0, [50, 17]] = NAN  # first NaN (chunk 1) beats the later one and every number
    x[1, 3] = INF
    x[1, 40] = NAN  # NaN beats +inf
    x[2, 63] = NAN  # NaN in the last lane of the last chunk
    x[3, :] = NAN
    x[4, 30] = -NAN  # a NaN with its sign bit set is a NaN too
    x[4, 31] = NAN
    x[4, 0] = INF
    assert check(x, block=16, tiles=1) == [17, 40, 63, 0, 30]


def test_signed_zeros_compare_equal():
    x = torch.full((3, 40), -1.0)
    x[0, [20, 35]] = torch.tensor([-0.0, 0.0])  # -0.0 first: it wins as an equal
    x[1, [4, 36]] = torch.tensor([0.0, -0.0])
    x[2, :] = -0.0
    x[2, 39] = 0.0
    assert check(x, block=16, tiles=1) == [20, 4, 0]


def test_extreme_finite_values():
    x = torch.zeros(3, 40)
    x[0, 33] = torch.finfo(torch.float32).max
    x[0, 2] = 1e38
    x[1] = -torch.finfo(torch.float32).max
    x[1, 39] = -torch.finfo(torch.float32).tiny
    x[2, 11] = torch.finfo(torch.float32).tiny / 2  # subnormal above zero
    assert check(x, block=16, tiles=1) == [33, 39, 11]


def test_row_stride_wider_than_v():
    """A [T, V] slice of a wider tensor: rows stride 120 apart, columns 10..10+V."""
    g = torch.Generator().manual_seed(11)
    wide = torch.randn(9, 120, generator=g)
    wide[:, :10] = 50.0  # larger than any value inside the slice: must not be read
    wide[:, 90:] = 50.0
    x = wide[:, 10:90]
    assert x.stride() == (120, 1)
    check(x, block=16, tiles=1)
    check(wide.bfloat16()[::2, 10:90], block=16, tiles=2)  # every other row: stride 240
    assert check(wide[4:5, 10:90].expand(5, 80), block=16, tiles=1) == check(x[4:5], block=16, tiles=1) * 5


def test_out_is_written_and_returned():
    g = torch.Generator().manual_seed(12)
    x = torch.randn(13, 70, generator=g)
    out = torch.full((13,), -777, dtype=torch.int64)
    res = argmax_triton(x, out=out, block=16, tiles=1)
    assert res is out and torch.equal(out, torch.argmax(x, -1))
    out.fill_(123456789)  # single-chunk path writes out directly
    argmax_triton(x, out=out, block=128, tiles=1)
    assert torch.equal(out, torch.argmax(x, -1))


def test_repeated_calls_reset_the_workspace():
    """Each call must leave every counter at 0 and every cell empty, or the next one is wrong."""
    g = torch.Generator().manual_seed(13)
    out = torch.full((8,), -1, dtype=torch.int64)
    for call in range(3):
        x = torch.randn(8, 90, generator=g)
        x[call, 89 - call] = 20.0  # a different winner each call, late in the row
        argmax_triton(x, out=out, block=16, tiles=1)
        assert torch.equal(out, torch.argmax(x, -1)), f"call {call}"
        assert out[call].item() == 89 - call
        assert workspace_is_clean()
    # a smaller maximum after a larger one: a stale cell would keep the old winner
    big = torch.zeros(8, 90)
    big[:, 70] = 1e9
    argmax_triton(big, out=out, block=16, tiles=1)
    small = torch.zeros(8, 90)
    small[:, 3] = 1.0
    argmax_triton(small, out=out, block=16, tiles=1)
    assert out.tolist() == [3] * 8


def test_workspace_grows_and_keeps_old_buffers(monkeypatch):
    cpu = torch.device("cpu")
    before = argmax_mod._Workspace(8, cpu)  # a small workspace, so that growing needs few rows
    monkeypatch.setitem(argmax_mod._WORKSPACES, cpu, before)
    monkeypatch.setattr(argmax_mod, "_RETIRED", [])
    monkeypatch.setattr(argmax_mod, "_MIN_WORKSPACE_ROWS", 8)
    x = torch.zeros(9, 33)
    x[:, 32] = 1.0
    x[4, 0] = 2.0
    assert argmax_triton(x, block=16, tiles=1).tolist() == [32] * 4 + [0] + [32] * 4
    after = argmax_mod._WORKSPACES[cpu]
    assert after.rows == 16 and argmax_mod._RETIRED == [before]  # kept alive for captured graphs
    assert workspace_is_clean()
    assert argmax_triton(x[:3], block=16, tiles=1).tolist() == [32] * 3
    assert argmax_mod._WORKSPACES[cpu] is after  # never shrinks


def test_empty_batch():
    out = argmax_triton(torch.zeros(0, 50))
    assert out.shape == (0,) and out.dtype == torch.int64


def test_rejects_bad_input():
    x = torch.randn(4, 50)
    with pytest.raises(TypeError, match="torch.Tensor"):
        argmax_triton(x.numpy())
    with pytest.raises(ValueError, match="2-D"):
        argmax_triton(torch.randn(50))
    with pytest.raises(ValueError, match="2-D"):
        argmax_triton(torch.randn(2, 3, 50))
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        argmax_triton(x.double())
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        argmax_triton(torch.zeros(4, 50, dtype=torch.int32))
    with pytest.raises(ValueError, match="empty vocabulary"):
        argmax_triton(torch.zeros(4, 0))
    with pytest.raises(ValueError, match="unit stride"):
        argmax_triton(torch.randn(50, 4).t())
    with pytest.raises(TypeError, match="int64"):
        argmax_triton(x, out=torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        argmax_triton(x, out=torch.zeros(5, dtype=torch.int64))
    with pytest.raises(ValueError, match="contiguous"):
        argmax_triton(x, out=torch.zeros(8, dtype=torch.int64)[::2])
    with pytest.raises(ValueError, match="power of two"):
        argmax_triton(x, block=24)
    with pytest.raises(ValueError, match="power of two"):
        argmax_triton(x, tiles=3)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        argmax_triton(torch.randn(2, 10))


TRITON = KernelConfig(attention_backend="triton")


def test_greedy_argmax_dispatch(monkeypatch):
    import dspark.sampling as sampling

    calls = []

    def spy(logits):
        calls.append(tuple(logits.shape))
        return argmax_triton(logits, block=16, tiles=1)

    monkeypatch.setattr("kernels.argmax.argmax_triton", spy)
    x = torch.randn(5, 50)
    x[2, [40, 7]] = 9.0
    # CPU tensors never take the kernel, whatever the engine's settings
    assert torch.equal(sampling.greedy_argmax(x, TRITON), torch.argmax(x, -1)) and calls == []
    # as on CUDA: an engine on the Triton backend takes the kernel, and gets the same index
    real = sampling.triton_argmax_enabled
    monkeypatch.setattr(sampling, "triton_argmax_enabled", lambda kernels, device: real(kernels, "cuda"))
    assert torch.equal(sampling.greedy_argmax(x, TRITON), torch.argmax(x, -1)) and calls == [(5, 50)]
    assert sampling.greedy_argmax(x, TRITON)[2].item() == 7
    # shapes and dtypes the kernel does not take fall back to torch.argmax
    for other in (torch.randn(2, 3, 50), torch.randn(50), x.double(), torch.randn(50, 5).t()):
        assert torch.equal(sampling.greedy_argmax(other, TRITON), torch.argmax(other, -1))
    assert len(calls) == 2
    # the torch backend, the switch off, or no engine settings at all: torch.argmax
    for kernels in (DEFAULT_KERNELS, KernelConfig(attention_backend="triton", triton_argmax=False), None):
        assert torch.equal(sampling.greedy_argmax(x, kernels), torch.argmax(x, -1))
    assert len(calls) == 2


def test_switch_and_kernel_set():
    from dspark.models.layers import kernel_set
    from dspark.sampling import triton_argmax_enabled

    assert triton_argmax_enabled(TRITON, "cuda") and not triton_argmax_enabled(TRITON, "cpu")
    assert not triton_argmax_enabled(DEFAULT_KERNELS, "cuda") and not triton_argmax_enabled(None, "cuda")
    assert "argmax" in kernel_set(TRITON, "cuda").split("+")
    assert "argmax" not in kernel_set(TRITON, "cpu").split("+")  # CPU steps never run it
    assert kernel_set(DEFAULT_KERNELS, "cuda") == "torch"
    off = KernelConfig(attention_backend="triton", triton_argmax=False)
    assert not triton_argmax_enabled(off, "cuda")
    assert "argmax" not in kernel_set(off, "cuda").split("+")


# --------------------------------------------------------------------------------------
# top_out: the top softmax probability in the same pass
# --------------------------------------------------------------------------------------

def check_top(x, **kw):
    """argmax_triton(x, top_out=...) must give torch.argmax's index and top_probability_reference's value
    (rtol 1e-5, NaN where it is NaN), with the workspace left clean."""
    from kernels.top_probability import top_probability_reference

    top = torch.full((x.shape[0],), -1.0)
    got = argmax_triton(x, top_out=top, **kw)
    assert torch.equal(got, torch.argmax(x, dim=-1))
    torch.testing.assert_close(top, top_probability_reference(x), rtol=1e-5, atol=0.0, equal_nan=True)
    assert workspace_is_clean()
    return top


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,V,block,tiles", RANDOM_SHAPES)
def test_top_probability_random_shapes(T, V, block, tiles, dtype):
    g = torch.Generator().manual_seed(T * 1000 + V + 7)
    check_top((torch.randn(T, V, generator=g) * 3).to(dtype), block=block, tiles=tiles)


def test_top_probability_special_rows_across_chunks():
    """A NaN, +inf, only -inf, -inf beside finite values, one dominant value, a flat row: each split over
    chunks so that the row's last program combines states of every kind (a chunk of only -inf among them)."""
    x = torch.randn(7, 70)
    x[0, 45] = NAN
    x[1, 3] = INF
    x[2] = -INF
    x[3, :40] = -INF
    x[4, 66] = 80.0
    x[5] = 1.5
    x[6, 20:] = -INF
    top = check_top(x, block=16, tiles=1)
    assert top[:3].isnan().all() and top[3:].isfinite().all()
    assert top[4].item() == pytest.approx(1.0) and top[5].item() == pytest.approx(1 / 70)
    check_top(x, block=128, tiles=1)  # the same rows in one chunk each


def test_top_probability_into_a_strided_column():
    """top_out may be one slot's column of a [rows, slots] buffer (the draft stage's max_prob); the other
    columns are untouched."""
    x = torch.randn(5, 90)
    buf = torch.full((5, 3), -2.0)
    argmax_triton(x, top_out=buf[:, 1], block=16, tiles=2)
    from kernels.top_probability import top_probability_reference

    torch.testing.assert_close(buf[:, 1], top_probability_reference(x), rtol=1e-5, atol=0.0)
    assert (buf[:, [0, 2]] == -2.0).all()


def test_top_probability_grows_the_chunk_states(monkeypatch):
    """A workspace made without chunk states (argmax alone) is replaced by one with room for them, keeping
    its rows; a later argmax-only call keeps using it."""
    cpu = torch.device("cpu")
    before = argmax_mod._Workspace(8, cpu)
    monkeypatch.setitem(argmax_mod._WORKSPACES, cpu, before)
    monkeypatch.setattr(argmax_mod, "_RETIRED", [])
    monkeypatch.setattr(argmax_mod, "_MIN_WORKSPACE_ROWS", 8)
    x = torch.randn(6, 64)
    check_top(x, block=16, tiles=1)  # 4 chunks per row: 24 states
    after = argmax_mod._WORKSPACES[cpu]
    assert after.rows == 8 and after.partials.shape == (4, 32) and argmax_mod._RETIRED == [before]
    check(x, block=16, tiles=1)
    assert argmax_mod._WORKSPACES[cpu] is after


def test_top_probability_rejects_a_bad_output():
    x = torch.randn(4, 50)
    with pytest.raises(TypeError, match="float32"):
        argmax_triton(x, top_out=torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        argmax_triton(x, top_out=torch.zeros(3))


# --------------------------------------------------------------------------------------
# gap_out: the largest value minus the second largest in the same pass, bitwise
# --------------------------------------------------------------------------------------

def same_gap(got, want):
    """Bitwise equal float32 tensors, NaN where the other is NaN, a zero gap of either sign (-0.0 + 0.0 is +0.0)."""
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), f"NaN at {got.isnan().tolist()}, reference {nan.tolist()}"
    bits = (got[~nan] + 0.0).view(torch.int32), (want[~nan] + 0.0).view(torch.int32)
    assert torch.equal(*bits), f"got {got.tolist()}, reference {want.tolist()}"


def check_gap(x, **kw):
    """argmax_triton(x, gap_out=...) must give torch.argmax's index and top_gap_reference's gap bitwise, with the
    workspace left clean; returns the gaps."""
    gap = torch.full((x.shape[0],), -1.0)
    got = argmax_triton(x, gap_out=gap, **kw)
    assert torch.equal(got, torch.argmax(x, dim=-1))
    same_gap(gap, top_gap_reference(x))
    assert workspace_is_clean()
    return gap


def test_top_gap_reference():
    """The specification on special rows: torch.topk ranks NaN first, so any NaN gives NaN; ties give 0."""
    x = torch.tensor([[1.0, 4.0, 2.5, -1.0], [3.0, 3.0, -1.0, 0.0], [1.0, NAN, 3.0, 2.0], [-NAN, 1.0, 2.0, 3.0],
                      [-INF, -INF, -INF, -INF], [5.0, -INF, -INF, -INF], [INF, 3.0, 1.0, 2.0], [INF, INF, 1.0, 2.0],
                      [INF, -INF, -INF, -INF], [NAN, INF, 1.0, 2.0], [-0.0, 0.0, -1.0, -2.0]])
    gap = top_gap_reference(x)
    assert gap.dtype == torch.float32 and gap.shape == (11,)
    assert gap[:2].tolist() == [1.5, 0.0] and gap[[5, 6, 8]].tolist() == [INF] * 3 and gap[10].item() == 0.0
    assert gap[[2, 3, 4, 7, 9]].isnan().all()
    # bf16 and fp16 logits are widened exactly; any leading shape
    assert top_gap_reference(x[:2].bfloat16()).tolist() == [1.5, 0.0]
    assert top_gap_reference(x[:2].half().view(1, 2, 4)).tolist() == [[1.5, 0.0]]
    for bad in (torch.zeros(3, 1), torch.zeros(3, 0), torch.tensor(1.0)):
        with pytest.raises(ValueError, match="at least 2 columns"):
            top_gap_reference(bad)


# (T, V, block, tiles): several chunks of several lanes, one chunk, two tiles per program, V = 2
GAP_SHAPES = [(3, 17, 16, 1), (2, 100, 16, 2), (5, 64, 16, 2), (7, 130, 16, 4), (11, 50, 16, 1), (2, 95, 32, 1),
              (1, 300, 16, 1), (6, 40, 16, None), (4, 60, 64, 1), (3, 2, 16, 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gap_random_shapes(dtype):
    for T, V, block, tiles in GAP_SHAPES:
        g = torch.Generator().manual_seed(T * 1000 + V + 3)
        check_gap((torch.randn(T, V, generator=g) * 3).to(dtype), block=block, tiles=tiles)


def test_gap_of_ties_and_runners_up():
    """Block 16: a tie within a lane (two tiles of one program), across lanes, across chunks; the runner-up
    held by the top's own lane, by another lane, by another chunk, and below a maximum tied in one lane."""
    x = torch.randn(10, 64).clamp(-3, 3)
    x[0, [5, 21]] = 9.0  # one lane (5), two tiles: a lane holds the maximum twice
    x[1, [5, 9]] = 9.0  # two lanes of one tile
    x[2, [5, 50]] = 9.0  # two chunks (tiles 2: chunks of 32)
    x[3, [5, 21]] = torch.tensor([9.0, 8.5])  # the runner-up in the top's lane, after the top
    x[9, [5, 21]] = torch.tensor([8.5, 9.0])  # the runner-up in the top's lane, before the top
    x[4, [5, 6]] = torch.tensor([9.0, 8.5])  # the runner-up in another lane
    x[5, [5, 21, 40]] = torch.tensor([9.0, 8.0, 8.5])  # another chunk's top beats the top lane's second
    x[6, [5, 21, 40]] = torch.tensor([9.0, 8.75, 8.5])  # the top lane's second beats another chunk's top
    x[7, [5, 21, 6]] = torch.tensor([9.0, 9.0, 8.0])  # the maximum twice in one lane beats another lane
    x[8] = 2.5  # everything tied
    want = [0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.25, 0.0, 0.0, 0.5]
    for kw in (dict(block=16, tiles=2), dict(block=16, tiles=1), dict(block=64, tiles=1)):
        assert check_gap(x, **kw).tolist() == want, kw
    check_gap(x.bfloat16(), block=16, tiles=2)


def test_gap_with_a_chunk_of_one_value():
    """V = 65 over chunks of 16 or 64: the last chunk holds one value (its lanes' runner-ups are all padding),
    the row's top, the runner-up or neither."""
    x = torch.randn(4, 65).clamp(-3, 3)
    x[0, 64] = 9.0
    x[1, 64] = -9.0
    x[2, [0, 64]] = torch.tensor([8.5, 9.0])
    x[3, [63, 64]] = torch.tensor([9.0, 8.75])
    for kw in (dict(block=16, tiles=1), dict(block=64, tiles=1)):
        gap = check_gap(x, **kw)
        assert gap[2:].tolist() == [0.5, 0.25], kw


def test_gap_special_rows():
    """NaN, +inf, only -inf, -inf runner-up, signed zeros, each split over chunks (the last program combines
    chunks of only -inf, of a NaN, of +inf) and in one chunk each."""
    x = torch.randn(12, 70)
    x[0, 45] = NAN
    x[1, 3] = -NAN
    x[2, 3] = INF  # finite runner-up: +inf
    x[3, [3, 60]] = INF  # inf - inf: NaN
    x[4] = -INF  # -inf - -inf: NaN
    x[5] = -INF
    x[5, 69] = -2.0  # the only finite value, in the last lane of the last chunk: +inf
    x[6] = -INF
    x[6, [10, 50]] = torch.tensor([-1.0, -3.0])  # finite top two among -inf
    x[7, :] = -INF
    x[7, 30] = INF  # +inf over -inf: +inf
    x[8, [2, 40]] = torch.tensor([INF, NAN])  # NaN beats +inf
    x[9] = -1.0
    x[9, [20, 35]] = torch.tensor([-0.0, 0.0])  # equal zeros: 0
    x[10, :] = NAN
    x[11, 69] = 1e30  # the largest in the last lane of the last chunk
    for dtype in (torch.float32, torch.bfloat16):
        for kw in (dict(block=16, tiles=1), dict(block=128, tiles=1)):
            gap = check_gap(x.to(dtype), **kw)
            assert gap[[0, 1, 3, 4, 8, 10]].isnan().all() and gap[[2, 5, 7]].tolist() == [INF] * 3
            assert gap[6].item() == 2.0 and gap[9].item() == 0.0


def test_gap_into_a_strided_column_beside_top_out():
    """gap_out and top_out as two columns of one [rows, slots] buffer, alone and together: each right, the index
    right, the other columns untouched, the workspace grown to hold both states per chunk."""
    from kernels.top_probability import top_probability_reference

    g = torch.Generator().manual_seed(21)
    x = torch.randn(5, 90, generator=g) * 2
    x[1, [10, 70]] = 7.0
    for kw in (dict(block=16, tiles=2), dict(block=128, tiles=1)):
        buf = torch.full((5, 4), -2.0)
        assert torch.equal(argmax_triton(x, gap_out=buf[:, 1], **kw), torch.argmax(x, -1))
        same_gap(buf[:, 1], top_gap_reference(x))
        assert (buf[:, [0, 2, 3]] == -2.0).all() and buf[1, 1].item() == 0.0
        buf = torch.full((5, 4), -2.0)
        out = torch.full((5,), -1, dtype=torch.int64)
        assert argmax_triton(x, out, top_out=buf[:, 3], gap_out=buf[:, 0], **kw) is out
        assert torch.equal(out, torch.argmax(x, -1))
        same_gap(buf[:, 0], top_gap_reference(x))
        torch.testing.assert_close(buf[:, 3], top_probability_reference(x), rtol=1e-5, atol=0.0)
        assert (buf[:, [1, 2]] == -2.0).all()
        assert workspace_is_clean()
    assert argmax_mod._WORKSPACES[torch.device("cpu")].partials.shape[0] == 4


def test_gap_grows_the_chunk_states(monkeypatch):
    """gap_out alone replaces a workspace made without chunk states, keeping its rows."""
    cpu = torch.device("cpu")
    before = argmax_mod._Workspace(8, cpu)
    monkeypatch.setitem(argmax_mod._WORKSPACES, cpu, before)
    monkeypatch.setattr(argmax_mod, "_RETIRED", [])
    monkeypatch.setattr(argmax_mod, "_MIN_WORKSPACE_ROWS", 8)
    check_gap(torch.randn(3, 80), block=16, tiles=1)  # 5 chunks per row: 15 states
    after = argmax_mod._WORKSPACES[cpu]
    assert after.rows == 8 and after.partials.shape == (4, 16) and argmax_mod._RETIRED == [before]


def test_gap_rejects_a_bad_output():
    x = torch.randn(4, 50)
    with pytest.raises(TypeError, match="float32"):
        argmax_triton(x, gap_out=torch.zeros(4, dtype=torch.float64))
    with pytest.raises(TypeError, match="float32"):
        argmax_triton(x, gap_out=torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        argmax_triton(x, gap_out=torch.zeros(5))
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        argmax_triton(x, gap_out=torch.zeros(4, 1))
    with pytest.raises(ValueError, match="at least 2 columns"):
        argmax_triton(torch.randn(4, 1), gap_out=torch.zeros(4))
    assert argmax_triton(torch.randn(4, 1)).tolist() == [0] * 4  # V = 1 is fine without gap_out


def test_greedy_argmax_gap_out(monkeypatch):
    """greedy_argmax's gap_out: the kernel's pass where triton_argmax is on (whatever triton_top_probability
    says), dspark.sampling.top_gap otherwise; with top_out, each output from wherever the switches send it."""
    import dspark.sampling as sampling
    from kernels.top_probability import top_probability_reference

    calls = []

    def spy(logits, **outs):
        calls.append(sorted(outs))
        return argmax_triton(logits, block=16, tiles=1, **outs)

    monkeypatch.setattr("kernels.argmax.argmax_triton", spy)
    x = torch.randn(5, 50) * 2
    x[2, [40, 7]] = 9.0
    want_gap, want_top = top_gap_reference(x), top_probability_reference(x)

    def run(kernels, top=False, gap_dtype=torch.float32):
        buf = torch.full((5, 3), -3.0)
        gap = torch.full((5,), -3.0, dtype=gap_dtype)
        index = sampling.greedy_argmax(x, kernels, top_out=buf[:, 0] if top else None, gap_out=gap)
        assert torch.equal(index, torch.argmax(x, -1)) and index[2].item() == 7
        same_gap(gap.float(), want_gap)
        if top:
            torch.testing.assert_close(buf[:, 0], want_top, rtol=1e-5, atol=0.0)
        assert (buf[:, 1:] == -3.0).all()

    # CPU tensors never take the kernel: the reference writes gap_out (and top_out)
    run(TRITON)
    run(TRITON, top=True)
    run(None, top=True)
    assert calls == []
    # as on CUDA: the kernel writes gap_out in its pass; top_out too where triton_top_probability is on
    real = sampling.triton_argmax_enabled
    monkeypatch.setattr(sampling, "triton_argmax_enabled", lambda kernels, device: real(kernels, "cuda"))
    monkeypatch.setattr(sampling, "triton_top_probability_enabled",
                        lambda kernels, device: kernels is not None and kernels.triton_top_probability)
    run(TRITON)
    run(TRITON, top=True)
    no_prob = KernelConfig(attention_backend="triton", triton_top_probability=False)
    run(no_prob, top=True)  # gap in the pass, top_out by top_probability's reference
    run(TRITON, gap_dtype=torch.float64)  # an output the kernel does not take: top_gap
    assert calls == [["gap_out"], ["gap_out", "top_out"], ["gap_out"], []]
    # the argmax switch off: no kernel
    run(KernelConfig(attention_backend="triton", triton_argmax=False), top=True)
    assert len(calls) == 4
    # V = 1 has no gap, on either path
    with pytest.raises(ValueError, match="at least 2 columns"):
        sampling.greedy_argmax(torch.randn(3, 1), TRITON, gap_out=torch.zeros(3))
    with pytest.raises(ValueError, match="at least 2 columns"):
        sampling.greedy_argmax(torch.randn(3, 1), None, gap_out=torch.zeros(3))


def test_top_gap():
    """dspark.sampling.top_gap: the reference, returned or written into out (any stride), whatever kernels says."""
    from dspark.sampling import top_gap

    x = torch.randn(2, 6, 30).bfloat16()
    want = top_gap_reference(x)
    assert torch.equal(top_gap(x), want) and torch.equal(top_gap(x, TRITON), want)
    buf = torch.full((6, 3), -1.0)
    assert top_gap(x[1], TRITON, out=buf[:, 2]).data_ptr() == buf[:, 2].data_ptr()
    assert torch.equal(buf[:, 2], want[1]) and (buf[:, :2] == -1.0).all()
    with pytest.raises(ValueError, match="at least 2 columns"):
        top_gap(torch.zeros(4, 1))
