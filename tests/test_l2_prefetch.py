"""L2 weight prefetch kernel (kernels/l2_prefetch.py), interpreted on CPU: the per-program sums it
writes (all that keeps its loads from being compiled away) against the reference, over 1 to 4
tensors and sizes that do not fill a block; the switch and the refusals. The prefetch's effect on
the engine (same tokens, graphs captured with the side stream) is checked on CUDA in
tests/test_kernels_gpu.py."""

import pytest
import torch  # does not import triton

from interpreter_only import interpreter_module  # noqa: E402  (tests/interpreter_only.py)

interpreter_module()

from kernels import l2_prefetch as pf  # noqa: E402


def ints(n, seed):
    # Integer values: every partial sum is exact in fp32, so any summation order gives the same sums.
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 9, (n,), generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("sizes", [[1], [16384], [20000, 17], [300000, 3, 4096, 16385]])
def test_sums_match_the_reference(sizes):
    tensors = [ints(n, i) for i, n in enumerate(sizes)]
    out = torch.full((pf.MAX_TENSORS, pf.PROGRAMS_PER_TENSOR), float("nan"))
    got = pf.l2_prefetch(tensors, out=out)
    want = pf.l2_prefetch_reference(tensors)
    assert torch.equal(got[: len(sizes)], want)
    assert torch.isnan(got[len(sizes):]).all()  # rows of absent tensors are not touched


def test_two_dimensional_weights_are_read_whole():
    w = ints(96 * 40, 7).reshape(96, 40)
    got = pf.l2_prefetch([w], out=torch.zeros(pf.MAX_TENSORS, pf.PROGRAMS_PER_TENSOR))
    assert got[0].sum().item() == w.float().sum().item()


def test_refusals_and_the_switch(monkeypatch):
    a = ints(10, 0)
    with pytest.raises(ValueError, match="1 to 4"):
        pf.l2_prefetch([a] * 5)
    with pytest.raises(ValueError, match="1 to 4"):
        pf.l2_prefetch([])
    with pytest.raises(ValueError, match="contiguous"):
        pf.l2_prefetch([ints(20, 1).reshape(4, 5).t()])
    with pytest.raises(ValueError, match="out must be"):
        pf.l2_prefetch([a], out=torch.zeros(2, 2))
    monkeypatch.setenv("DSPARK_L2_PREFETCH_PROGRAMS", "0")
    with pytest.raises(ValueError, match="DSPARK_L2_PREFETCH_PROGRAMS"):
        pf.l2_prefetch([a])
    monkeypatch.setenv("DSPARK_L2_PREFETCH_PROGRAMS", "3")  # a tuning value: the sums follow it
    got = pf.l2_prefetch([ints(40000, 3)], out=torch.zeros(pf.MAX_TENSORS, 3))
    assert torch.equal(got[:1], pf.l2_prefetch_reference([ints(40000, 3)], programs=3))
    monkeypatch.delenv("DSPARK_L2_PREFETCH_PROGRAMS")
    monkeypatch.setenv("DSPARK_L2_PREFETCH", "yes")
    with pytest.raises(ValueError, match="DSPARK_L2_PREFETCH"):
        pf.requested()
    monkeypatch.setenv("DSPARK_L2_PREFETCH", "1")
    assert pf.requested() and not pf.prefetch_enabled(torch.device("cpu"))  # CUDA only
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="CUDA"):
        pf.l2_prefetch([a])
