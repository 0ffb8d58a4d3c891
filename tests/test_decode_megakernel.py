"""The one-launch decode kernel (kernels/decode_megakernel.py), interpreted on CPU: one launch per
phase (the interpreter runs programs one after another, so the grid barrier of the one-launch
form cannot run here; tests/test_kernels_gpu.py runs that form on CUDA against this one).

fp32 against the reference (the same rounding points; only summation orders differ) over shapes
that exercise ragged K halves, item loops (fewer programs than items), empty KV splits, page
boundaries and biases, with the output and the written cache slot poisoned first; bf16 within a
loose bound (the interpreter truncates fp32 -> bf16 casts instead of rounding them); refusals; and
the engine: a target-only request decoded with the kernel emits what the layer kernels emit."""

import pytest
import torch

from interpreter_only import interpreter_module  # noqa: E402  (tests/interpreter_only.py)

interpreter_module()

from kernels import decode_megakernel as mk  # noqa: E402
from tiny import tiny_engine_config, tiny_target  # noqa: E402


def stack(L=2, H=80, Hq=4, Hk=2, D=16, I=96, dtype=torch.float32, bias=False, seed=0):
    return mk.random_stack_weights(layers=L, hidden=H, heads=Hq, kv_heads=Hk, head_dim=D, intermediate=I, dtype=dtype,
                                   bias=bias, seed=seed)


def case(w, kv_len, page=4, pages=12, slot_page=None, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    L, Hk, D = w.num_layers, w.num_kv_heads, w.head_dim
    kc = torch.randn(L, pages, page, Hk, D, generator=g).to(dtype)
    vc = torch.randn(L, pages, page, Hk, D, generator=g).to(dtype)
    table = torch.randperm(pages - 1, generator=g)[: -(-kv_len // page)].to(torch.int32)
    pos = kv_len - 1
    slot = int(table[pos // page]) * page + pos % page if slot_page is None else slot_page
    x = torch.randn(1, w.hidden, generator=g).to(dtype)
    return x, torch.tensor([pos]), torch.tensor([slot]), table, torch.tensor([kv_len], dtype=torch.int32), kc, vc


SHAPES = [  # (stack kwargs, kv_len, programs, kv_splits)
    (dict(), 11, 5, 3),  # K halves 64 + 16, 96 = 64 + 32; several items per program
    (dict(), 1, 64, 4),  # one cached token: three of four splits empty; more programs than items
    (dict(bias=True, L=3), 23, 7, 16),  # splits of 2 tokens, biases
    (dict(H=64, Hq=6, Hk=2, D=16, I=64), 33, 3, 5),  # power-of-two K (the second half fully masked), group 3
    (dict(Hq=4, Hk=4, D=32, I=48), 40, 16, 2),  # no grouping; a split spans page boundaries and tiles
]


@pytest.mark.parametrize("kw,kv_len,programs,splits", SHAPES)
def test_fp32_matches_the_reference(kw, kv_len, programs, splits):
    w = stack(**kw)
    x, pos, slot, table, kvl, kc, vc = case(w, kv_len)
    kr, vr = kc.clone(), vc.clone()
    want = mk.decode_stack_reference(w, x, pos, slot, table, kvl, kr, vr)
    s = int(slot)
    kc.flatten(1, 2)[:, s] = float("nan")  # the kernel must write this step's K/V before attending to them
    vc.flatten(1, 2)[:, s] = float("nan")
    out = torch.full_like(x, float("nan"))
    got = mk.decode_megakernel(w, x, pos, slot, table, kvl, kc, vc, out=out, programs=programs, kv_splits=splits)
    assert got is out
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(kc, kr, rtol=2e-5, atol=2e-5)  # the new slot; every other slot untouched
    torch.testing.assert_close(vc, vr, rtol=2e-5, atol=2e-5)


def test_padding_slot_writes_nothing():
    w = stack()
    x, pos, _, table, kvl, kc, vc = case(w, 9)
    slot = torch.tensor([-1])
    kr, vr = kc.clone(), vc.clone()
    want = mk.decode_stack_reference(w, x, pos, slot, table, kvl, kr.clone(), vr.clone())
    got = mk.decode_megakernel(w, x, pos, slot, table, kvl, kc, vc, programs=4)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


def test_repeated_launches_reuse_the_workspace():
    # The ticket counters reset after each combine: a second step (next position) is right too.
    w = stack(seed=3)
    x, pos, slot, table, kvl, kc, vc = case(w, 14, seed=4)
    kr, vr = kc.clone(), vc.clone()
    for step in range(2):
        p = pos + step
        n = kvl + step
        sl = torch.tensor([int(table[int(p) // 4]) * 4 + int(p) % 4])
        want = mk.decode_stack_reference(w, x, p, sl, table, n, kr, vr)
        got = mk.decode_megakernel(w, x, p, sl, table, n, kc, vc, programs=6, kv_splits=4)
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
        x = got * 0.5


def test_bf16_within_rounding():
    w = stack(dtype=torch.bfloat16, L=2)
    x, pos, slot, table, kvl, kc, vc = case(w, 19, dtype=torch.bfloat16)
    want = mk.decode_stack_reference(w, x, pos, slot, table, kvl, kc.clone(), vc.clone())
    got = mk.decode_megakernel(w, x, pos, slot, table, kvl, kc, vc, programs=8)
    assert got.dtype == torch.bfloat16
    err = (got.float() - want.float()).abs().max().item()
    assert err < 0.1 * want.float().abs().max().item(), err


def test_refusals(monkeypatch):
    w = stack()
    x, pos, slot, table, kvl, kc, vc = case(w, 5)
    with pytest.raises(ValueError, match="one token"):
        mk.decode_megakernel(w, x.repeat(2, 1), pos, slot, table, kvl, kc, vc)
    with pytest.raises(ValueError, match="interpreter"):
        mk.decode_megakernel(w, x, pos, slot, table, kvl, kc, vc, sync=True)
    with pytest.raises(ValueError, match="caches must be"):
        mk.decode_megakernel(w, x, pos, slot, table, kvl, kc[:1], vc[:1])
    with pytest.raises(ValueError, match="is torch.bfloat16"):
        mk.decode_megakernel(w, x.bfloat16(), pos, slot, table, kvl, kc, vc)
    with pytest.raises(ValueError, match="kv_splits"):
        mk.decode_megakernel(w, x, pos, slot, table, kvl, kc, vc, kv_splits=0)
    with pytest.raises(ValueError, match="one element"):
        mk.decode_megakernel(w, x, pos.repeat(2), slot, table, kvl, kc, vc)
    with pytest.raises(ValueError, match="power-of-two head_dim"):
        mk.decode_megakernel(stack(D=12), x, pos, slot, table, kvl, kc, vc)
    bad = mk.StackWeights(**{**w.__dict__, "o": w.o[:, :, :-1]})
    with pytest.raises(ValueError, match="StackWeights.o"):
        mk.decode_megakernel(bad, x, pos, slot, table, kvl, kc, vc)
    with pytest.raises(ValueError, match="engine.kernels.megakernel_programs"):
        mk.megakernel_programs(torch.device("cpu"), 0)
    assert mk.megakernel_programs(torch.device("cpu")) == 8 and mk.megakernel_programs(torch.device("cpu"), 3) == 3


def test_the_switch_is_an_experimental_engine_setting():
    from dspark.config import ConfigError, DEFAULT_KERNELS, EngineConfig, KernelConfig

    assert not DEFAULT_KERNELS.decode_megakernel and not KernelConfig(attention_backend="triton").decode_megakernel
    with pytest.raises(ConfigError, match="engine.kernels.decode_megakernel.*attention_backend=triton"):
        EngineConfig(kernels={"decode_megakernel": True})  # the torch backend
    with pytest.raises(ConfigError, match="engine.kernels.decode_megakernel"):
        EngineConfig(attention_backend="triton", kernels={"decode_megakernel": "yes"})
    with pytest.raises(ConfigError, match="engine.kernels.megakernel_programs"):
        EngineConfig(attention_backend="triton", kernels={"decode_megakernel": True, "megakernel_programs": 0})


def test_stack_weights_follow_the_model():
    target = tiny_target(5)
    w = target.stack_weights()
    assert target.stack_weights() is w  # cached
    layer = target.model.layers[1]
    assert torch.equal(w.qkv[1, : layer.self_attn.q_proj.weight.shape[0]], layer.self_attn.q_proj.weight)
    assert torch.equal(w.gate_up[1, target.cfg.intermediate_size:], layer.mlp.up_proj.weight)
    with torch.no_grad():
        layer.mlp.down_proj.weight.mul_(2.0)  # an in-place update: the stack is rebuilt
    w2 = target.stack_weights()
    assert w2 is not w and torch.equal(w2.down[1], layer.mlp.down_proj.weight)


@pytest.mark.usefixtures("few_sms")  # tests/conftest.py: fewer empty KV splits to interpret
def test_engine_target_only_decode_emits_what_the_layer_kernels_emit():
    from dspark.config import SamplingParams
    from dspark.engine import Engine

    target = tiny_target(11, num_layers=2)  # (each interpreted step runs 11 launches)
    prompt = [[5, 17, 33, 8, 61, 12, 40]]
    sp = SamplingParams(max_tokens=5, ignore_eos=True)
    runs = {}
    for switch in ("0", "1"):
        eng = Engine(target, None, tiny_engine_config(spec="off", attention_backend="triton", max_num_seqs=1,
                                                   kv_block_size=16,
                                                   kernels={"decode_megakernel": switch == "1"}))
        out = eng.generate(prompt, sp)[0].token_ids
        c = eng.counters()
        runs[switch] = (out, c["megakernel_steps"], c["decode_steps"])
    assert runs["1"][0] == runs["0"][0]
    assert runs["0"][1] == 0
    assert runs["1"][1] == runs["1"][2] >= 4  # every decode step (the first token comes from the prefill)


def test_applies_only_to_one_token_steps_without_captured_layers():
    from dspark.attention import AttentionMetadata
    from dspark.config import KernelConfig
    from dspark.kv_cache import KVCache
    from dspark.models.llama import decode_megakernel_applies

    target = tiny_target(2)
    cfg = target.cfg
    cache = KVCache(cfg.num_layers, 4, 8, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu")
    one = torch.tensor([3])

    on = KernelConfig(attention_backend="triton", decode_megakernel=True)

    def meta(rows, kernels=on):
        return AttentionMetadata(qo_indptr=torch.arange(rows + 1, dtype=torch.int32),
                                 kv_lens=torch.ones(rows, dtype=torch.int32),
                                 block_tables=torch.zeros(rows, 2, dtype=torch.int32),
                                 slot_mapping=torch.zeros(rows, dtype=torch.int64), kernels=kernels)

    with torch.inference_mode():
        assert decode_megakernel_applies(cfg, one, cache, meta(1), ())
        assert not decode_megakernel_applies(cfg, torch.tensor([3, 4]), cache, meta(2), ())
        assert not decode_megakernel_applies(cfg, one, cache, meta(1), (0, 2))  # a DSpark target step
        off = KernelConfig(attention_backend="triton")  # the default: off
        assert not decode_megakernel_applies(cfg, one, cache, meta(1, off), ())
        assert not decode_megakernel_applies(tiny_target(2, arch="qwen3").cfg, one, cache, meta(1), ())
        assert not decode_megakernel_applies(cfg, one, cache, meta(1, None), ())  # the torch backend
