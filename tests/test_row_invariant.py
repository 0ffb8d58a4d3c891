"""The plain-PyTorch backend's batch-invariant mode (dspark/models/row_invariant.py): a token's logits
are bitwise the same however its step is composed (prefill chunk sizes, other requests, decode or a
verified block), which is what makes float32 greedy outputs of two arms identical by construction."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from dspark.config import ConfigError, KernelConfig, SamplingParams
from dspark.models.layers import kernel_set
from dspark.models.row_invariant import ROW_TILE, paged_attention_rowwise, row_tiled_linear
from kernels.paged_attention import paged_attention_reference
from tiny import paged_logits, random_prompts, tiny_drafter, tiny_engine_config, tiny_target

INVARIANT = KernelConfig(attention_backend="torch", batch_invariant=True)
PLAIN = KernelConfig(attention_backend="torch")


# Step compositions of the same three sequences: whole prefills, token by token, prefill then
# verify-sized blocks, and mixed chunk sizes; with 20- to 40-token sequences the steps' row counts
# run from 1 to past two GEMM tiles.
SCHEDULES = {
    "whole": [40, 33, 20],
    "one_by_one": [1, 1, 1],
    "prefill_then_blocks": [[24, 8], [17, 8], [12, 8]],
    "mixed": [[7, 1, 3], [16, 2], [5]],
}


def _model(arch: str = "llama"):
    # wide enough that the BLAS runs its blocked GEMM kernels (64-wide layers take other paths)
    return tiny_target(4, arch, hidden_size=256, intermediate_size=640, num_heads=8, num_kv_heads=2, head_dim=32,
                       num_layers=3, vocab=401)


def _sequences():
    g = torch.Generator().manual_seed(9)
    return [torch.randint(3, 401, (n,), generator=g).tolist() for n in (40, 33, 20)]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])  # qwen2: q/k/v biases; qwen3: q/k norms
def test_logits_are_bitwise_independent_of_the_step_composition(arch):
    model, seqs = _model(arch), _sequences()
    runs = {name: paged_logits(model, seqs, chunks, INVARIANT) for name, chunks in SCHEDULES.items()}
    base = runs.pop("whole")
    for name, got in runs.items():
        for r, (a, b) in enumerate(zip(base, got)):
            assert torch.equal(a, b), (name, r, (a - b).abs().max().item())


def test_the_mode_computes_the_plain_forward():
    """Same function, other rounding: the invariant logits are the plain ones within float32 noise (as
    far as the plain ones part between two step compositions: about 1e-6 of the largest logit)."""
    model, seqs = _model(), _sequences()
    for a, b in zip(paged_logits(model, seqs, SCHEDULES["mixed"], INVARIANT),
                    paged_logits(model, seqs, SCHEDULES["mixed"], PLAIN)):
        torch.testing.assert_close(a, b, atol=4e-6 * b.abs().max().item(), rtol=0)


def test_the_plain_forward_is_not_batch_invariant_here():
    """The control: without the mode the same schedules part, in the last bits only, on this BLAS (what the
    mode exists for). Skipped where the BLAS happens to round every row count alike: then the plain forward
    is batch-invariant too, and there is no difference for the mode to remove."""
    model, seqs = _model(), _sequences()
    base = paged_logits(model, seqs, SCHEDULES["whole"], PLAIN)
    other = paged_logits(model, seqs, SCHEDULES["one_by_one"], PLAIN)
    if all(torch.equal(a, b) for a, b in zip(base, other)):
        pytest.skip("this BLAS rounds a row alike at every row count: nothing to control")
    for a, b in zip(base, other):  # rounding, not another function
        torch.testing.assert_close(b, a, atol=4e-6 * a.abs().max().item(), rtol=0)


@pytest.mark.parametrize("m", [1, 2, 9, 15, 16, 17, 40])
def test_row_tiled_linear_rows_do_not_depend_on_the_rest(m):
    g = torch.Generator().manual_seed(m)
    w, b = torch.randn(384, 256, generator=g), torch.randn(384, generator=g)
    x = torch.randn(m, 256, generator=g)
    got = row_tiled_linear(x, w, b)
    torch.testing.assert_close(got, F.linear(x, w, b), atol=1e-4, rtol=1e-5)
    for i in range(m):
        alone = row_tiled_linear(x[i: i + 1], w, b)
        others = torch.randn(m + 5 + ROW_TILE, 256, generator=g)
        others[i + 5] = x[i]
        assert torch.equal(got[i], alone[0]) and torch.equal(got[i], row_tiled_linear(others, w, b)[i + 5])
    assert row_tiled_linear(x.reshape(1, m, 256), w).shape == (1, m, 384)
    with pytest.raises(ValueError, match="rows must be >= 1"):
        row_tiled_linear(x, w, rows=0)


def test_rowwise_attention_matches_the_reference():
    g = torch.Generator().manual_seed(2)
    page, hkv, hq, d = 4, 2, 6, 16
    k_cache, v_cache = torch.randn(12, page, hkv, d, generator=g), torch.randn(12, page, hkv, d, generator=g)
    q = torch.randn(9, hq, d, generator=g)
    kw = dict(qo_indptr=torch.tensor([0, 1, 1, 9], dtype=torch.int32),  # decode, an idle request, a block of 8
              kv_lens=torch.tensor([5, 3, 14], dtype=torch.int32),
              block_tables=torch.tensor([[3, 7, 0, 0], [1, 0, 0, 0], [2, 4, 9, 11]], dtype=torch.int32), scale=0.25)
    for causal in (True, False):
        torch.testing.assert_close(paged_attention_rowwise(q, k_cache, v_cache, causal=causal, **kw),
                                   paged_attention_reference(q, k_cache, v_cache, causal=causal, **kw),
                                   atol=1e-5, rtol=1e-5)


def test_engine_config_and_kernel_set():
    """The mode is set on the engine (engine.batch_invariant=true on either backend) and named in
    the kernels a run records; the arms of an A/B in it emit identical greedy tokens."""
    from dspark.engine import Engine

    assert kernel_set(INVARIANT, "cpu") == "torch+batch_invariant" and kernel_set(PLAIN, "cpu") == "torch"
    target = tiny_target(3, num_layers=3)
    drafter = tiny_drafter(target, 4, block_size=3)
    prompts = random_prompts(5, 4, 3, 20)
    sp = SamplingParams(max_tokens=10, ignore_eos=True)
    spec = Engine(target, None, tiny_engine_config(batch_invariant=True), drafter)
    off = Engine(target, None, tiny_engine_config(batch_invariant=True, spec="off"))
    assert spec.fingerprint()["kernels"] == "torch+batch_invariant"
    assert [o.token_ids for o in spec.generate(prompts, sp)] == [o.token_ids for o in off.generate(prompts, sp)]
    with pytest.raises(ConfigError, match="engine.batch_invariant"):
        KernelConfig(attention_backend="torch", batch_invariant="yes")  # type: ignore[arg-type]
