"""Fused layer kernels (RMSNorm + residual, rotary, SiLU*mul) against their references.

On CPU they run under TRITON_INTERPRET=1 (set by conftest); outputs are poisoned before
each run so a kernel that skips a row cannot pass on stale memory.
"""

import pytest
import torch

from dspark.models.layers import apply_rotary, rotary_cos_sin
from kernels.rmsnorm import rmsnorm_reference, rmsnorm_triton
from kernels.rotary import rotary_kv_write_reference, rotary_kv_write_triton, rotary_reference
from kernels.silu_mul import silu_mul_reference, silu_mul_triton

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("rows,n", [(1, 64), (7, 576), (33, 100)])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_reference(rows, n, with_residual, dtype):
    g = torch.Generator().manual_seed(rows * n)
    x = torch.randn(rows, n, generator=g).to(DEV, dtype)
    r = torch.randn(rows, n, generator=g).to(DEV, dtype) if with_residual else None
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(DEV, dtype)
    out, h = rmsnorm_triton(x, w, 1e-5, r)
    ref, ref_h = rmsnorm_reference(x, w, 1e-5, r)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    if DEV == "cuda" or dtype == torch.float32:
        assert torch.equal(h, ref_h)  # the residual stream is rounded exactly as torch rounds x + r
    else:  # Triton's CPU interpreter truncates fp32 -> bf16 instead of rounding to nearest: 1 ulp
        torch.testing.assert_close(h, ref_h, atol=0, rtol=2 ** -7)


def test_rmsnorm_reference_is_the_layers_norm():
    from dspark.models.layers import RMSNorm

    norm = RMSNorm(48, 1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(5, 48)
    torch.testing.assert_close(rmsnorm_reference(x, norm.weight, 1e-6)[0], norm(x))


@pytest.mark.parametrize("T,hq,hk,d", [(1, 9, 3, 64), (13, 4, 2, 16), (40, 8, 8, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_matches_reference_and_the_layers_rotary(T, hq, hk, d, dtype):
    g = torch.Generator().manual_seed(T + d)
    # q and k are views into one fused QKV output, as the fused attention path passes them.
    qkv = torch.randn(T, (hq + 2 * hk) * d, generator=g).to(DEV, dtype)
    q = qkv[:, : hq * d].unflatten(-1, (hq, d))
    k = qkv[:, hq * d: (hq + hk) * d].unflatten(-1, (hk, d))
    guard = torch.full((T + 4, (hq + 2 * hk) * d), float("nan"), device=DEV, dtype=dtype)
    pos = torch.randint(0, 4000, (T,), generator=g).to(DEV)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32, device=DEV) / d))
    v = qkv[:, (hq + hk) * d:].unflatten(-1, (hk, d))
    cache = torch.full((2, T, 1, hk, d), float("nan"), device=DEV, dtype=dtype)  # one slot per token, in order
    qo = rotary_kv_write_triton(q, k, v, pos, inv_freq, cache[0], cache[1], torch.arange(T, device=DEV))
    ko = cache[0].view(T, hk, d)
    assert torch.equal(cache[1].view(T, hk, d), v)  # v lands unrotated
    assert qo.is_contiguous() and torch.isnan(guard).all()
    rq, rk = rotary_reference(q, k, pos, inv_freq)
    tol = 2e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(qo, rq, atol=tol, rtol=tol)
    torch.testing.assert_close(ko, rk, atol=tol, rtol=tol)
    cos, sin = rotary_cos_sin(pos, d, 10000.0, torch.float32)
    torch.testing.assert_close(rq, apply_rotary(q, cos, sin), atol=tol, rtol=tol)


@pytest.mark.parametrize("T,hq,hk,d,page", [(1, 9, 3, 64, 16), (13, 4, 2, 16, 4), (40, 8, 8, 32, 8)])
@pytest.mark.parametrize("with_q", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_kv_write_matches_rotary_then_scatter(T, hq, hk, d, page, with_q, dtype):
    """One kernel = rotary + KV scatter: q comes back rotated, k (rotated) and v land at their
    slots, padding tokens (slot -1) write nothing, every other cache slot keeps its value."""
    g = torch.Generator().manual_seed(3 * T + d)
    qkv = torch.randn(T, (hq + 2 * hk) * d, generator=g).to(DEV, dtype)
    q = qkv[:, : hq * d].unflatten(-1, (hq, d))
    k = qkv[:, hq * d: (hq + hk) * d].unflatten(-1, (hk, d))
    v = qkv[:, (hq + hk) * d:].unflatten(-1, (hk, d))
    pages = T // page + 3
    slots = torch.randperm(pages * page, generator=g)[:T]
    slots[torch.rand(T, generator=g) < 0.25] = -1  # padding tokens
    slots = slots.to(DEV)
    pos = torch.randint(0, 4000, (T,), generator=g).to(DEV)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32, device=DEV) / d))
    init = torch.randn(2, pages, page, hk, d, generator=g).to(DEV, dtype)
    kc, vc = init[0].clone(), init[1].clone()
    rk, rv = init[0].clone(), init[1].clone()
    qo = rotary_kv_write_triton(q if with_q else None, k, v, pos, inv_freq, kc, vc, slots)
    rq = rotary_kv_write_reference(q, k, v, pos, inv_freq, rk, rv, slots)
    tol = 2e-4 if dtype == torch.float32 else 2e-2
    if with_q:
        torch.testing.assert_close(qo, rq, atol=tol, rtol=tol)
    else:
        assert qo is None
    torch.testing.assert_close(kc, rk, atol=tol, rtol=tol)
    assert torch.equal(vc, rv)  # v is copied, not computed
    untouched = torch.ones(pages * page, dtype=torch.bool, device=DEV)
    untouched[slots[slots >= 0]] = False
    assert torch.equal(kc.view(-1, hk, d)[untouched], init[0].view(-1, hk, d)[untouched])


def test_rotary_kv_write_refuses_a_mismatched_cache():
    q, k = torch.zeros(2, 4, 8, device=DEV), torch.zeros(2, 2, 8, device=DEV)
    inv_freq = torch.ones(4, device=DEV)
    bad = torch.zeros(3, 4, 1, 8, device=DEV)  # one kv head, k has two
    with pytest.raises(ValueError, match="k_cache must be a contiguous"):
        rotary_kv_write_triton(q, k, k, torch.zeros(2, dtype=torch.long, device=DEV), inv_freq, bad, bad,
                               torch.zeros(2, dtype=torch.long, device=DEV))


@pytest.mark.parametrize("T,small_m,head_dim", [(6, "1", 16), (6, "0", 16), (20, "1", 16), (6, "1", 32),
                                                (6, "rope0", 16)])
@pytest.mark.usefixtures("few_sms")  # tests/conftest.py: fewer empty KV splits to interpret
def test_carried_residual_stack_is_the_plain_stack(T, small_m, head_dim, monkeypatch):
    """run_decoder_stack with the fused kernels (residual carried into the next norm) returns the
    final hidden and the captured layer streams of the plain layers, on the paged cache; with
    at most SMALL_M_MAX tokens through the small-M GEMV kernels (counted), else through cuBLAS.
    QKV, rotary and the K/V write run as one kernel (norm_qkv_rope_triton); ``rope0`` is
    engine.kernels.fused_qkv_rope=false, which keeps them apart (norm_linear_triton, then the rotary
    kernel); ``0`` is engine.kernels.small_m_kernels=false."""
    import dataclasses

    import kernels.small_m_linear as small_m_linear
    from dspark.attention import AttentionMetadata
    from dspark.config import KernelConfig
    from dspark.kv_cache import KVCache
    from dspark.models.layers import run_decoder_stack
    from tiny import tiny_target

    triton_kernels = KernelConfig(attention_backend="triton", small_m_kernels=small_m != "0",
                                  fused_qkv_rope=small_m != "rope0")
    calls = []
    real = small_m_linear._launch
    monkeypatch.setattr(small_m_linear, "_launch", lambda fn, *a, **k: calls.append(fn) or real(fn, *a, **k))
    target = tiny_target(4, head_dim=head_dim).to(DEV)
    cfg = target.cfg
    ids = torch.randint(3, cfg.vocab_size, (T,)).to(DEV)
    pos = torch.arange(T, device=DEV)
    meta = AttentionMetadata(qo_indptr=torch.tensor([0, T], dtype=torch.int32, device=DEV),
                             kv_lens=torch.tensor([T], dtype=torch.int32, device=DEV),
                             block_tables=torch.tensor([[0, 1]], dtype=torch.int32, device=DEV),
                             slot_mapping=torch.arange(T, device=DEV), causal=True, max_q_len=T)
    out = {}
    for backend in ("torch", "triton"):
        cache = KVCache(num_layers=cfg.num_layers, num_pages=2, page_size=16, kv_heads=cfg.num_kv_heads,
                        head_dim=cfg.head_dim, dtype=torch.float32, device=DEV)
        step = dataclasses.replace(meta, kernels=triton_kernels if backend == "triton" else None)
        with torch.inference_mode():
            out[backend] = run_decoder_stack(target.model.layers, target.embed(ids), pos, cache, step,
                                             target.model.norm, capture_layers=(0, cfg.num_layers - 1))
    (h_plain, cap_plain), (h_fused, cap_fused) = out["torch"], out["triton"]
    small = T <= small_m_linear.SMALL_M_MAX and small_m != "0"
    # four GEMV kernels per layer (norm+QKV(+rotary+K/V write), o_proj, norm+gate/up+silu*mul, down) or none
    first = "norm_qkv_rope_triton" if small_m == "1" else "norm_linear_triton"
    expected = [first, "linear_triton", "norm_linear_triton", "linear_triton"] * cfg.num_layers
    assert calls == expected if small else not calls
    tol = 1e-4 if DEV == "cuda" else 1e-5
    torch.testing.assert_close(h_fused, h_plain, atol=tol, rtol=tol)
    for a, b in zip(cap_fused, cap_plain):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@pytest.mark.parametrize("rows,i", [(1, 1536), (9, 100), (3, 2049)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_reference(rows, i, dtype):
    g = torch.Generator().manual_seed(rows + i)
    x = (3 * torch.randn(rows, 2 * i, generator=g)).to(DEV, dtype)
    out = silu_mul_triton(x)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, silu_mul_reference(x), atol=tol, rtol=tol)


@pytest.mark.parametrize("arch,head_dim", [("llama", 16), ("qwen2", 16), ("qwen3", 16)])
@pytest.mark.usefixtures("few_sms")  # tests/conftest.py: fewer empty KV splits to interpret
def test_fused_layers_compute_the_plain_layers_function(arch, head_dim):
    """Engine on the Triton backend (fused layer kernels, fused projections) vs the torch
    backend (plain modules): same logits to fp32 rounding, same greedy tokens. Llama and qwen2 take
    the fused QKV + rotary + K/V write kernel in decode steps (with q/k/v biases for qwen2;
    qwen3's q/k norms keep them apart)."""
    from dspark.config import DEFAULT_KERNELS, KernelConfig, SamplingParams
    from dspark.engine import Engine
    from tiny import tiny_drafter, tiny_engine_config, tiny_target

    # Three layers (the drafter reads layers 0 and 2) and 6 new tokens: every kernel runs interpreted on a CPU.
    target = tiny_target(8, arch=arch, head_dim=head_dim, num_layers=3)
    drafter = tiny_drafter(target, 9, block_size=3)
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    plain = Engine(target, None, tiny_engine_config(attention_backend="torch", kv_block_size=16, device=DEV),
                   drafter).generate(prompts, sp)
    fused = Engine(target, None, tiny_engine_config(attention_backend="triton", kv_block_size=16, device=DEV),
                   drafter).generate(prompts, sp)
    assert [o.token_ids for o in fused] == [o.token_ids for o in plain]
    # Training (autograd on) never takes the fused path: it has no backward.
    from dspark.models.layers import use_fused_kernels

    triton_kernels = KernelConfig(attention_backend="triton")
    with torch.enable_grad():
        assert not use_fused_kernels(triton_kernels)
    with torch.inference_mode():
        assert use_fused_kernels(triton_kernels)
        assert not use_fused_kernels(KernelConfig(attention_backend="triton", fused_layers=False))
        assert not use_fused_kernels(DEFAULT_KERNELS) and not use_fused_kernels(None)


def test_fused_weights_follow_in_place_updates():
    from dspark.models.layers import _fused_weight

    lin = torch.nn.Linear(4, 3)
    other = torch.nn.Linear(4, 2)
    w = _fused_weight(lin, "_k", [lin.weight, other.weight])
    assert torch.equal(w, torch.cat([lin.weight, other.weight]))
    with torch.no_grad():
        other.weight.add_(1.0)
    w2 = _fused_weight(lin, "_k", [lin.weight, other.weight])
    assert torch.equal(w2, torch.cat([lin.weight, other.weight])) and not torch.equal(w, w2)


@pytest.mark.parametrize("head_dim", [16])  # the fused QKV + rotary + K/V write kernel over row tiles
@pytest.mark.usefixtures("few_sms")  # tests/conftest.py: fewer empty KV splits to interpret
def test_batch_invariant_mode_rows_do_not_depend_on_the_step(head_dim, monkeypatch):
    """engine.batch_invariant: a request's target logits are bitwise the same whether its tokens
    run alone or packed with other requests' (bf16, the fixed-tile kernels and unsplit attention);
    the plain fused path makes no such promise. Then greedy DSpark output equals target-only
    output in bf16, token for token."""
    from dspark.attention import AttentionMetadata
    from dspark.config import ConfigError, EngineConfig, KernelConfig, SamplingParams
    from dspark.engine import Engine
    from dspark.kv_cache import KVCache
    from tiny import tiny_drafter, tiny_engine_config, tiny_target

    target = tiny_target(5, head_dim=head_dim, num_layers=3).to(DEV, torch.bfloat16)  # 3 layers: interpreted on a CPU
    cfg = target.cfg
    lens = [7, 3, 21, 1]  # request 0 alone, then packed with three others

    def logits(requests, kernels):
        T = sum(lens[r] for r in requests)
        cache = KVCache(num_layers=cfg.num_layers, num_pages=4 * len(requests), page_size=16,
                        kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, dtype=torch.bfloat16, device=DEV)
        ids = torch.cat([torch.arange(lens[r], device=DEV) % 50 + 3 + r for r in requests])
        pos = torch.cat([torch.arange(lens[r], device=DEV) for r in requests])
        starts = [0]
        for r in requests:
            starts.append(starts[-1] + lens[r])
        slots = torch.cat([torch.arange(lens[r], device=DEV) + 32 * k for k, r in enumerate(requests)])
        meta = AttentionMetadata(qo_indptr=torch.tensor(starts, dtype=torch.int32, device=DEV),
                                 kv_lens=torch.tensor([lens[r] for r in requests], dtype=torch.int32, device=DEV),
                                 block_tables=torch.tensor([[2 * k, 2 * k + 1] for k in range(len(requests))],
                                                           dtype=torch.int32, device=DEV),
                                 slot_mapping=slots, causal=True, max_q_len=max(lens[r] for r in requests),
                                 kernels=kernels)
        with torch.inference_mode():
            hidden, _ = target(ids, pos, cache, meta)
            return target.compute_logits(hidden, kernels=kernels)[: lens[requests[0]]]

    invariant = KernelConfig(attention_backend="triton", batch_invariant=True)
    alone, packed = logits([0], invariant), logits([0, 1, 2, 3], invariant)
    assert torch.equal(alone, packed)
    plain = KernelConfig(attention_backend="triton")
    torch.testing.assert_close(logits([0], plain), alone, atol=0.1, rtol=0.05)  # same function, other rounding

    drafter = tiny_drafter(target, 9, block_size=3)
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26]]
    sp = SamplingParams(max_tokens=7, ignore_eos=True)
    outs = {}
    for spec in ("off", "dspark"):
        ecfg = tiny_engine_config(attention_backend="triton", kv_block_size=16, device=DEV, dtype="bfloat16",
                                  spec=spec, batch_invariant=True)
        engine = Engine(target, None, ecfg, drafter if spec == "dspark" else None)
        assert engine.runner.kernels.batch_invariant
        outs[spec] = engine.generate(prompts, sp)
    assert [o.token_ids for o in outs["dspark"]] == [o.token_ids for o in outs["off"]]
    assert sum(sum(o.accept_lengths) for o in outs["dspark"]) > 0
    assert not EngineConfig(batch_invariant=True).kernel_config().triton  # the plain backend's mode (row_invariant)
    with pytest.raises(ConfigError, match="q/k norms"):
        Engine(tiny_target(1, arch="qwen3"), None, tiny_engine_config(attention_backend="triton", spec="off",
                                                                        batch_invariant=True))
