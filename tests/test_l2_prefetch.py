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
    with pytest.raises(ValueError, match="programs=0"):
        pf.l2_prefetch([a], programs=0)
    got = pf.l2_prefetch([ints(40000, 3)], out=torch.zeros(pf.MAX_TENSORS, 3), programs=3)  # the sums follow it
    assert torch.equal(got[:1], pf.l2_prefetch_reference([ints(40000, 3)], programs=3))
    assert not pf.prefetch_runs(torch.device("cpu"))  # CUDA only
    # The engine's switch: engine.kernels.l2_prefetch (off by default), checked with the others.
    from dspark.config import ConfigError, EngineConfig, KernelConfig
    from dspark.models.layers import kernel_set, l2_prefetch_applies

    on = KernelConfig(attention_backend="triton", l2_prefetch=True, l2_prefetch_programs=8)
    assert not KernelConfig(attention_backend="triton").l2_prefetch
    assert not l2_prefetch_applies(on, torch.device("cpu")) and "l2_prefetch" not in kernel_set(on, "cpu")
    with pytest.raises(ConfigError, match="engine.kernels.l2_prefetch_programs"):
        EngineConfig(attention_backend="triton", kernels={"l2_prefetch": True, "l2_prefetch_programs": 65})
    with pytest.raises(ConfigError, match="engine.kernels.l2_prefetch"):
        EngineConfig(attention_backend="triton", kernels={"l2_prefetch": "yes"})
    with pytest.raises(ConfigError, match="engine.kernels.l2_prefetch.*small_m_kernels"):
        EngineConfig(attention_backend="triton", kernels={"l2_prefetch": True, "small_m_kernels": False})
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="CUDA"):
        pf.l2_prefetch([a])
