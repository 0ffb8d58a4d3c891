"""Kernel settings belong to an engine (dspark.config.KernelConfig, carried by every step's
AttentionMetadata), not to the process: two engines with different settings share a process (an
A/B's two arms), and bad values are refused with the key's name before any model loads.

On CPU the Triton kernels run under TRITON_INTERPRET=1 (set by tests/conftest.py before triton is
imported); on a CUDA machine the same tests run the compiled kernels.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dspark.config import DEFAULT_KERNELS, ConfigError, EngineConfig, KernelConfig, KernelSwitches, SamplingParams
from tiny import tiny_drafter, tiny_engine_config, tiny_target

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def attention_calls(monkeypatch):
    """Every attention call of any engine, as ("triton", batch_invariant) or ("torch", None)."""
    import dspark.attention as attention
    import kernels.paged_attention as pa

    calls = []
    triton_attn, reference = pa.paged_attention, attention.paged_attention_reference

    def spy_triton(*a, **kw):
        calls.append(("triton", kw.get("batch_invariant")))
        return triton_attn(*a, **kw)

    def spy_reference(*a, **kw):
        calls.append(("torch", None))
        return reference(*a, **kw)

    monkeypatch.setattr(pa, "paged_attention", spy_triton)
    monkeypatch.setattr(attention, "paged_attention_reference", spy_reference)
    return calls


@pytest.mark.usefixtures("few_sms")  # tests/conftest.py: fewer empty KV splits to interpret
def test_two_engines_in_one_process_keep_their_own_backend(attention_calls):
    """Arm A on the torch backend, arm B on the Triton backend, built in that order (the last engine
    built used to decide for both): each engine's steps run its own attention, also when their
    generate calls interleave, and both emit the same greedy tokens (fp32)."""
    from dspark.engine import Engine

    target = tiny_target(3, num_layers=3)  # few layers: the Triton kernels run interpreted on a CPU
    drafter = tiny_drafter(target, 4, block_size=3)
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    a = Engine(target, None, tiny_engine_config(attention_backend="torch", kv_block_size=16, device=DEV), drafter)
    b = Engine(target, None, tiny_engine_config(attention_backend="triton", kv_block_size=16, device=DEV), drafter)
    assert a.runner.kernels.attention_backend == "torch" and b.runner.kernels.attention_backend == "triton"
    runs = {}
    for name, engine in (("A", a), ("B", b), ("A again", a)):
        attention_calls.clear()
        runs[name] = [o.token_ids for o in engine.generate(prompts, sp)]
        kinds = {kind for kind, _ in attention_calls}
        assert attention_calls and kinds == ({"torch"} if name.startswith("A") else {"triton"}), (name, kinds)
    assert runs["A"] == runs["B"] == runs["A again"]
    assert a.fingerprint()["kernels"] == "torch" and b.fingerprint()["kernels"].startswith("triton+fused")


@pytest.mark.usefixtures("few_sms")  # tests/conftest.py: fewer empty KV splits to interpret
def test_two_triton_engines_keep_their_own_batch_invariance(attention_calls):
    """Two Triton engines, one batch-invariant and one not: each step's attention runs in its own
    engine's mode (unsplit for the batch-invariant one), whichever engine was built last."""
    from dspark.engine import Engine

    target = tiny_target(5, num_layers=2)  # few layers: the Triton kernels run interpreted on a CPU
    prompts = [[5, 6, 7, 8, 9, 10, 11]]
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    cfg = dict(attention_backend="triton", kv_block_size=16, device=DEV, spec="off")
    invariant = Engine(target, None, tiny_engine_config(batch_invariant=True, **cfg))
    plain = Engine(target, None, tiny_engine_config(**cfg))
    for engine, want in ((invariant, True), (plain, False), (invariant, True)):
        attention_calls.clear()
        engine.generate(prompts, sp)
        assert attention_calls and {mode for _, mode in attention_calls} == {want}
    assert "batch_invariant" in invariant.fingerprint()["kernels"].split("+")
    assert "batch_invariant" not in plain.fingerprint()["kernels"].split("+")


@pytest.mark.usefixtures("few_sms")  # tests/conftest.py: fewer empty KV splits to interpret
def test_switches_reach_the_layers_through_the_metadata(monkeypatch):
    """engine.kernels.fused_layers=false: an engine on the Triton backend runs the plain layers (its
    attention stays Triton's) while another engine in the process keeps the fused kernels."""
    import kernels.rmsnorm as rmsnorm
    from dspark.engine import Engine

    calls = []
    real = rmsnorm.rmsnorm_triton
    monkeypatch.setattr(rmsnorm, "rmsnorm_triton", lambda *a, **k: calls.append(1) or real(*a, **k))
    target = tiny_target(7, num_layers=2)  # few layers: the Triton kernels run interpreted on a CPU
    sp = SamplingParams(max_tokens=3, ignore_eos=True)
    cfg = dict(attention_backend="triton", kv_block_size=16, device=DEV, spec="off")
    unfused = Engine(target, None, tiny_engine_config(kernels={"fused_layers": False}, **cfg))
    fused = Engine(target, None, tiny_engine_config(**cfg))
    out_unfused = unfused.generate([[4, 5, 6]], sp)[0].token_ids
    assert calls == []
    out_fused = fused.generate([[4, 5, 6]], sp)[0].token_ids
    assert calls and out_fused == out_unfused
    assert "fused" not in unfused.fingerprint()["kernels"].split("+")


def test_metadata_without_kernels_is_the_default_torch_backend():
    from dspark.attention import AttentionMetadata

    z = torch.zeros(1, dtype=torch.int32)
    meta = AttentionMetadata(qo_indptr=torch.tensor([0, 1], dtype=torch.int32), kv_lens=z + 1,
                             block_tables=torch.zeros(1, 1, dtype=torch.int32), slot_mapping=torch.zeros(1).long())
    assert meta.kernels is DEFAULT_KERNELS and DEFAULT_KERNELS == KernelConfig(attention_backend="torch")
    assert dataclasses.replace(meta, kernels=None).kernels is DEFAULT_KERNELS


def test_kernel_config_is_frozen_and_combines_the_engine_settings():
    ecfg = EngineConfig(attention_backend="triton", batch_invariant=True,
                        kernels={"fused_qkv_rope": False, "small_m_tiles": "t.json"})
    kc = ecfg.kernel_config()
    assert isinstance(ecfg.kernels, KernelSwitches) and not isinstance(ecfg.kernels, KernelConfig)
    assert (kc.attention_backend, kc.batch_invariant, kc.fused_qkv_rope, kc.small_m_tiles) == (
        "triton", True, False, "t.json")
    assert kc.fused_layers and kc.small_m_kernels and not kc.l2_prefetch and not kc.decode_megakernel
    with pytest.raises(dataclasses.FrozenInstanceError):
        kc.fused_layers = False  # type: ignore[misc]
    assert kc.to_dict() == {"attention_backend": "triton", "batch_invariant": True, **ecfg.kernels.to_dict()}
    assert KernelConfig.from_dict(kc.to_dict()) == kc
    assert ecfg.to_dict()["kernels"]["fused_qkv_rope"] is False
    assert dataclasses.asdict(ecfg)["kernels"]["small_m_tiles"] == "t.json"  # (what an A/B records per arm)
    # replace() keeps the switches and takes the new backend
    torch_cfg = dataclasses.replace(ecfg, attention_backend="torch", batch_invariant=False)
    assert torch_cfg.kernel_config().attention_backend == "torch" and not torch_cfg.kernel_config().fused_qkv_rope
    # a whole KernelConfig is taken as the switches when it agrees with the engine
    same = EngineConfig(attention_backend="triton", batch_invariant=True, kernels=kc)
    assert same.kernel_config() == kc


@pytest.mark.parametrize("kw,key,words", [
    (dict(attention_backend="cuda"), "engine.attention_backend", ["'cuda'", "torch", "triton"]),
    (dict(batch_invariant="yes"), "engine.batch_invariant", ["true or false", "'yes'"]),
    (dict(batch_invariant=True, device="cuda"), "engine.batch_invariant", ["the CPU's", "attention_backend=triton"]),
    (dict(kernels={"fused_layers": "no"}), "engine.kernels.fused_layers", ["true or false", "'no'"]),
    (dict(kernels={"triton_argmax": 1}), "engine.kernels.triton_argmax", ["true or false"]),
    (dict(kernels={"small_m_tiles": ""}), "engine.kernels.small_m_tiles", ["tile table"]),
    (dict(kernels={"attention_splits": 0}), "engine.kernels.attention_splits", ["1 to 32"]),
    (dict(kernels={"attention_splits": 64}), "engine.kernels.attention_splits", ["1 to 32"]),
    (dict(attention_backend="triton", kernels={"l2_prefetch": True, "l2_prefetch_programs": 0}),
     "engine.kernels.l2_prefetch_programs", ["1 to 64"]),
    (dict(attention_backend="triton", kernels={"decode_megakernel": True, "megakernel_programs": -3}),
     "engine.kernels.megakernel_programs", [">= 1"]),
    (dict(kernels={"l2_prefetch": True}), "engine.kernels.l2_prefetch", ["attention_backend=triton"]),
    (dict(attention_backend="triton", kernels={"decode_megakernel": True, "fused_layers": False}),
     "engine.kernels.decode_megakernel", ["fused_layers=true"]),
    (dict(attention_backend="triton", batch_invariant=True, kernels={"decode_megakernel": True}),
     "engine.kernels.decode_megakernel", ["batch-invariant"]),
    (dict(kernels={"pdl": True}), "engine.kernels", ["unknown keys ['pdl']", "fused_layers"]),
    (dict(kernels=KernelConfig(attention_backend="triton")), "engine.kernels", ["set those on the engine"]),
])
def test_bad_values_are_refused_naming_the_key(kw, key, words):
    with pytest.raises(ConfigError) as info:
        EngineConfig(**kw)
    text = str(info.value)
    assert text.startswith(key + ":"), text
    for word in words:
        assert word in text, text


def test_kernel_config_alone_checks_its_values():
    with pytest.raises(ConfigError, match="engine.attention_backend"):
        KernelConfig(attention_backend="cuda")
    with pytest.raises(ConfigError, match="engine.kernels.l2_prefetch_programs"):
        KernelConfig(attention_backend="triton", l2_prefetch_programs=65)
    with pytest.raises(ConfigError, match="engine.kernels: unknown keys"):
        KernelSwitches.from_dict({"fused_kernels": False})


def test_a_retired_environment_switch_is_refused_naming_its_engine_key(monkeypatch):
    from dspark.engine import Engine
    from tiny import tiny_engine_config, tiny_target

    monkeypatch.setenv("DSPARK_FUSED_KERNELS", "0")
    monkeypatch.setenv("DSPARK_PDL", "1")
    with pytest.raises(ConfigError, match=r"DSPARK_FUSED_KERNELS -> engine.kernels.fused_layers.*DSPARK_PDL \(removed"):
        Engine(tiny_target(1), None, tiny_engine_config(spec="off"), None)


def test_attention_splits_reach_the_kernel_and_the_fingerprint(monkeypatch):
    """engine.kernels.attention_splits is the engine's (in its kernel config and fingerprint) and reaches
    paged attention as num_splits; the batch-invariant mode keeps attention unsplit."""
    import kernels.paged_attention as pa
    from dspark.attention import AttentionMetadata, attend

    seen = []
    monkeypatch.setattr(pa, "paged_attention", lambda *a, **kw: seen.append(kw["num_splits"]))
    meta = dict(qo_indptr=torch.tensor([0, 1], dtype=torch.int32), kv_lens=torch.tensor([1], dtype=torch.int32),
                block_tables=torch.zeros((1, 1), dtype=torch.int32), slot_mapping=torch.zeros(1, dtype=torch.int64))
    for cfg, want in ((EngineConfig(attention_backend="triton", kernels={"attention_splits": 4}), 4),
                      (EngineConfig(attention_backend="triton"), None),
                      (EngineConfig(attention_backend="triton", batch_invariant=True, kernels={"attention_splits": 4}),
                       None)):
        kc = cfg.kernel_config()
        attend(torch.zeros(1, 2, 16), torch.zeros(1, 16, 1, 16), torch.zeros(1, 16, 1, 16),
               AttentionMetadata(**meta, kernels=kc), 1.0)
        assert seen[-1] == want
    assert EngineConfig(attention_backend="triton", kernels={"attention_splits": 4}).kernel_config().to_dict()[
        "attention_splits"] == 4
