"""A draft slot's logits kernel (kernels/draft_logits.py), interpreted on CPU: the same bits as the PyTorch
reference (``base.float() + bias.float()``, the gated variant's ``gate * bias`` first) for fp32 and bf16 inputs,
a strided slot view of the block logits, ragged vocabularies; bad shapes refused. tests/test_kernels_gpu.py
repeats the checks on CUDA at SmolLM2's vocabulary and through the drafter's draft."""

import pytest
import torch  # does not import triton

from interpreter_only import interpreter_module  # noqa: E402  (tests/interpreter_only.py)

interpreter_module()

from kernels import draft_logits as mod  # noqa: E402
from kernels.draft_logits import draft_slot_logits, draft_slot_logits_reference, draft_slot_logits_triton  # noqa: E402


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    monkeypatch.setattr(mod, "BLOCK_V", 64)  # several programs per row at these vocabularies


def inputs(M, V, dtype, seed, gamma=3):
    g = torch.Generator().manual_seed(seed)
    block = (torch.randn(M, gamma, V, generator=g) * 3).to(dtype)  # [M, gamma, V]: a slot is a strided view
    bias = (torch.randn(M, V, generator=g)).to(dtype)
    gate = torch.rand(M, 1, generator=g)
    return block, bias, gate


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,V", [(1, 1), (3, 64), (5, 100), (2, 200)])
def test_same_bits_as_the_reference(M, V, dtype):
    block, bias, gate = inputs(M, V, dtype, seed=M * 1000 + V)
    for k in range(block.shape[1]):
        base = block[:, k]
        assert not base.is_contiguous() or M == 1
        for g in (None, gate):
            want = draft_slot_logits_reference(base, bias, g)
            got = draft_slot_logits_triton(base, bias, g)
            assert got.dtype == torch.float32 and want.dtype == torch.float32
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (k, g is None)
            assert torch.equal(draft_slot_logits(base, bias, g, fused=True), want)
            assert torch.equal(draft_slot_logits(base, bias, g, fused=False), want)


def test_reference_is_the_drafters_old_arithmetic():
    block, bias, gate = inputs(4, 50, torch.bfloat16, seed=7)
    base = block[:, 1]
    assert torch.equal(draft_slot_logits_reference(base, bias), base.float() + bias.float())
    assert torch.equal(draft_slot_logits_reference(base, bias, gate), base.float() + gate * bias.float())


def test_bad_inputs_are_refused():
    block, bias, gate = inputs(4, 50, torch.float32, seed=1)
    with pytest.raises(ValueError, match=r"both be \[M, V\]"):
        draft_slot_logits_triton(block[:, 0], bias[:, :49])
    with pytest.raises(ValueError, match="contiguous last dim"):
        draft_slot_logits_triton(block[:, 0], bias.t().contiguous().t())
    with pytest.raises(ValueError, match="gate must be float32"):
        draft_slot_logits_triton(block[:, 0], bias, gate[:3])
    with pytest.raises(ValueError, match="gate must be float32"):
        draft_slot_logits_triton(block[:, 0], bias, gate.double())
