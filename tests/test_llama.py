"""The target forward over the paged cache matches transformers' implementation."""

import pytest
import torch

from dspark.attention import AttentionMetadata
from dspark.kv_cache import BlockManager, KVCache
from tiny import paged_logits, tiny_target

transformers = pytest.importorskip("transformers")


def hf_reference(model):
    cfg = model.cfg
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                  num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                  num_key_value_heads=cfg.num_kv_heads, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
                  max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings)
    if cfg.arch == "llama":
        hf_cfg = transformers.LlamaConfig(head_dim=cfg.head_dim, **common)
        ref = transformers.LlamaForCausalLM(hf_cfg)
    elif cfg.arch == "qwen2":
        hf_cfg = transformers.Qwen2Config(**common)
        ref = transformers.Qwen2ForCausalLM(hf_cfg)
    else:
        hf_cfg = transformers.Qwen3Config(head_dim=cfg.head_dim, **common)
        ref = transformers.Qwen3ForCausalLM(hf_cfg)
    missing, unexpected = ref.load_state_dict(model.hf_state_dict(), strict=False)
    assert not [m for m in missing if "rotary" not in m], missing
    assert not unexpected, unexpected
    return ref.eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_paged_forward_matches_transformers(arch):
    model = tiny_target(0, arch)
    ref = hf_reference(model)
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (19, 5, 33)]
    # prefill in chunks of different sizes, then single-token decode steps, all packed together
    got = paged_logits(model, seqs, chunk=[7, 1, 16])
    for s, lg in zip(seqs, got):
        with torch.no_grad():
            want = ref(torch.tensor([s])).logits[0].float()
        torch.testing.assert_close(lg, want, atol=2e-4, rtol=1e-4)


def test_capture_layers_returns_layer_outputs():
    model = tiny_target(0)
    ref = hf_reference(model)
    seq = list(range(3, 20))
    cfg = model.cfg
    blocks = BlockManager(8, 8)
    blocks.reserve(0, len(seq))
    cache = KVCache(cfg.num_layers, 8, 8, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu")
    meta = AttentionMetadata(torch.tensor([0, len(seq)], dtype=torch.int32), torch.tensor([len(seq)], dtype=torch.int32),
                             torch.tensor([blocks.table(0)], dtype=torch.int32),
                             torch.tensor([blocks.slot(0, p) for p in range(len(seq))]))
    with torch.no_grad():
        _, cap = model(torch.tensor(seq), torch.arange(len(seq)), cache, meta, capture_layers=(2, 0))
        hs = ref(torch.tensor([seq]), output_hidden_states=True).hidden_states
    d = cfg.hidden_size
    torch.testing.assert_close(cap[:, :d], hs[3][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(cap[:, d:], hs[1][0], atol=1e-4, rtol=1e-4)


def test_load_rejects_mismatched_weights():
    model = tiny_target(0)
    sd = model.hf_state_dict()
    sd.pop("model.layers.0.mlp.up_proj.weight")
    with pytest.raises(ValueError, match="missing"):
        model.load_hf_state_dict(sd)
    sd = model.hf_state_dict()
    sd["model.norm.weight"] = torch.ones(3)
    with pytest.raises(ValueError, match="shape"):
        model.load_hf_state_dict(sd)
