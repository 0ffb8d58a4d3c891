"""DSpark drafter: paged inference path == dense training path, non-causal block, no context leak,
Markov / confidence heads, checkpoints."""

from __future__ import annotations

import json
import lzma
import os

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from safetensors.torch import save as save_bytes

from dspark.attention import AttentionMetadata
from dspark.config import ConfigError, DrafterConfig, ModelConfig
from dspark.kv_cache import BlockManager, KVCache
from dspark.models.drafter import DSparkDrafter

GAMMA = 4


def _target_cfg(**overrides) -> ModelConfig:
    base = dict(arch="llama", vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=4, num_heads=4,
                num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0)
    base.update(overrides)
    return ModelConfig(**base)


def _drafter_cfg(**overrides) -> DrafterConfig:
    base = dict(block_size=GAMMA, num_layers=2, target_layer_ids=(0, 2, 3), markov_rank=8,
                markov_variant="vanilla", use_confidence_head=True)
    base.update(overrides)
    return DrafterConfig(**base)


def _make(target_cfg: ModelConfig | None = None, seed: int = 0, **overrides) -> DSparkDrafter:
    """A drafter with weights large enough that every path visibly changes the output."""
    torch.manual_seed(seed)
    drafter = DSparkDrafter(target_cfg or _target_cfg(), _drafter_cfg(**overrides))
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return drafter.eval()


class FrozenTarget:
    """Stand-in for the target's shared embedding and lm_head."""

    def __init__(self, cfg: ModelConfig, seed: int = 1):
        gen = torch.Generator().manual_seed(seed)
        self.embedding = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
        self.lm_head_weight = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen) * 0.5

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embedding)


def _meta(manager: BlockManager, requests: list[tuple[int, int, int]], causal: bool) -> AttentionMetadata:
    """requests: (req_id, first position, count) -> metadata of one packed step (pages reserved here)."""
    indptr, lens, slots, tables = [0], [], [], []
    for rid, start, count in requests:
        manager.reserve(rid, start + count)
        indptr.append(indptr[-1] + count)
        lens.append(start + count)
        slots += [manager.slot(rid, p) for p in range(start, start + count)]
        tables.append(manager.table(rid) or [0])
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return AttentionMetadata(qo_indptr=torch.tensor(indptr, dtype=torch.int32),
                             kv_lens=torch.tensor(lens, dtype=torch.int32), block_tables=table,
                             slot_mapping=torch.tensor(slots, dtype=torch.int64), causal=causal)


def _batch(cfg: ModelConfig, drafter: DSparkDrafter, seq_len: int = 12, anchors=((0, 5), (3, 11), (9, 1)), seed=3):
    gen = torch.Generator().manual_seed(seed)
    n_seq = len(anchors)
    n_cat = len(drafter.cfg.target_layer_ids) * cfg.hidden_size
    hidden_cat = torch.randn(n_seq, seq_len, n_cat, generator=gen)
    ids = torch.randint(0, cfg.vocab_size, (n_seq, seq_len + GAMMA), generator=gen)
    anchor_positions = torch.tensor(anchors, dtype=torch.long)
    offsets = torch.arange(1, GAMMA + 1)
    block_targets = ids.gather(1, (anchor_positions[:, :, None] + offsets).reshape(n_seq, -1)).view(n_seq, -1, GAMMA)
    return hidden_cat, ids[:, :seq_len], anchor_positions, block_targets


def _paged_blocks(drafter: DSparkDrafter, target: FrozenTarget, hidden_cat, input_ids, anchor_positions,
                  page_size: int):
    """Run every (sequence, anchor) as its own request through context_kv + forward_block."""
    n_seq, n_anchor = anchor_positions.shape
    manager = BlockManager(num_pages=64, page_size=page_size)
    manager.reserve(999, 3)  # someone else's pages: tables do not start at page 0
    cache = KVCache(drafter.cfg.num_layers, 64, page_size, drafter.target_cfg.num_kv_heads,
                    drafter.target_cfg.head_dim, torch.float32, "cpu")
    blocks = [(s, a) for s in range(n_seq) for a in anchor_positions[s].tolist()]
    # Context in two chunks per request (chunked prefill), requests with no context skipped.
    for lo, hi in ((0, 0.5), (0.5, 1.0)):
        reqs, rows, pos = [], [], []
        for rid, (s, a) in enumerate(blocks):
            start, end = int(a * lo), int(a * hi)
            if end > start:
                reqs.append((rid, start, end - start))
                rows.append(hidden_cat[s, start:end])
                pos.append(torch.arange(start, end))
        if reqs:
            drafter.context_kv(torch.cat(rows), torch.cat(pos), cache, _meta(manager, reqs, causal=True))
    meta = _meta(manager, [(rid, a, GAMMA) for rid, (_, a) in enumerate(blocks)], causal=False)
    anchor_ids = torch.stack([input_ids[s, a] for s, a in blocks])
    starts = torch.tensor([a for _, a in blocks])
    hidden = drafter.forward_block(anchor_ids, starts, cache, meta, target.embed)
    return hidden, anchor_ids


VARIANTS = [dict(markov_rank=8, markov_variant="vanilla"), dict(markov_rank=8, markov_variant="gated"),
            dict(markov_rank=8, markov_variant="rnn"), dict(markov_rank=0)]


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("variant", VARIANTS, ids=["vanilla", "gated", "rnn", "rank0"])
def test_paged_inference_equals_dense_training(page_size, variant):
    cfg = _target_cfg(arch="qwen3", qk_norm=True) if variant.get("markov_variant") == "gated" else _target_cfg()
    drafter = _make(cfg, **variant)
    target = FrozenTarget(cfg)
    hidden_cat, input_ids, anchors, block_targets = _batch(cfg, drafter)
    with torch.no_grad():
        train = drafter.forward_train(hidden_cat, input_ids, anchors, target.embed, target.lm_head_weight,
                                      block_targets)
        hidden, anchor_ids = _paged_blocks(drafter, target, hidden_cat, input_ids, anchors, page_size)
        flat_targets = block_targets.reshape(-1, GAMMA)
        out = drafter.draft(hidden, anchor_ids, target.lm_head_weight, lambda logits, k: flat_targets[:, k])
    n_blocks = anchors.numel()
    torch.testing.assert_close(hidden, train.hidden.reshape(n_blocks, GAMMA, -1), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(out.logits, train.logits.reshape(n_blocks, GAMMA, -1), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.confidence_logits, train.confidence_logits.reshape(n_blocks, GAMMA),
                               atol=1e-4, rtol=1e-4)
    assert out.logits.dtype == torch.float32 and out.tokens.dtype == torch.int64
    assert train.logits.shape == (3, 2, GAMMA, cfg.vocab_size)


def test_block_is_non_causal():
    cfg = _target_cfg()
    drafter = _make(cfg)
    target = FrozenTarget(cfg)
    hidden_cat, input_ids, anchors, block_targets = _batch(cfg, drafter)
    args = (hidden_cat, input_ids, anchors, target.embed, target.lm_head_weight, block_targets)
    with torch.no_grad():
        base = drafter.forward_train(*args).hidden
        original = drafter._block_inputs

        def perturb_last_slot(anchor_ids, embed_fn):
            x = original(anchor_ids, embed_fn).clone()
            x[..., -1, :] += 1.0
            return x

        drafter._block_inputs = perturb_last_slot
        changed = drafter.forward_train(*args).hidden
    # Earlier rows (anchor slot included) see the last slot: attention inside the block is bidirectional.
    diff = (changed - base).abs().amax(dim=-1)  # [N, A, gamma]
    assert (diff[..., : GAMMA - 1] > 1e-4).all()


def test_context_at_or_after_the_anchor_never_leaks():
    cfg = _target_cfg()
    drafter = _make(cfg)
    target = FrozenTarget(cfg)
    hidden_cat, input_ids, anchors, block_targets = _batch(cfg, drafter, anchors=((5,), (0,)))
    with torch.no_grad():
        base = drafter.forward_train(hidden_cat, input_ids, anchors, target.embed, target.lm_head_weight, block_targets)
        future = hidden_cat.clone()
        future[0, 5:] = torch.randn_like(future[0, 5:]) * 10  # the anchor position itself and later
        future[1] = torch.randn_like(future[1]) * 10  # anchor 0: no context at all
        same = drafter.forward_train(future, input_ids, anchors, target.embed, target.lm_head_weight, block_targets)
        past = hidden_cat.clone()
        past[0, 4] += 1.0
        moved = drafter.forward_train(past, input_ids, anchors, target.embed, target.lm_head_weight, block_targets)
    torch.testing.assert_close(same.logits, base.logits)
    assert (moved.logits[0] - base.logits[0]).abs().max() > 1e-3
    torch.testing.assert_close(moved.logits[1], base.logits[1])


def test_markov_bias_uses_previous_token_and_greedy_argmax():
    cfg = _target_cfg()
    drafter = _make(cfg)
    target = FrozenTarget(cfg)
    hidden = torch.randn(2, GAMMA, cfg.hidden_size)
    greedy = lambda logits, k: logits.argmax(-1)  # noqa: E731
    with torch.no_grad():
        out = drafter.draft(hidden, torch.tensor([3, 50]), target.lm_head_weight, greedy)
        base = hidden @ target.lm_head_weight.T
        head = drafter.markov_head
        prev = torch.cat((torch.tensor([[3], [50]]), out.tokens[:, :-1]), dim=1)
        torch.testing.assert_close(out.logits - base, head.w2(head.w1(prev)), atol=1e-5, rtol=1e-5)
        assert torch.equal(out.tokens, out.logits.argmax(-1))
        # Slot k's confidence reads its hidden state and the token before it (the anchor, then the drawn tokens),
        # computed once over the block: the per-slot definition z_k = head([h_k, W1[x_{k-1}]]).
        per_slot = torch.stack([drafter.confidence_head(torch.cat((hidden[:, k], head.w1(prev[:, k])), -1))[:, 0]
                                for k in range(GAMMA)], dim=1)
        torch.testing.assert_close(out.confidence_logits, per_slot, atol=1e-5, rtol=1e-5)
        # Another anchor changes slot 0's logits exactly by the difference of the two biases.
        other = drafter.draft(hidden, torch.tensor([4, 50]), target.lm_head_weight, greedy)
        delta = head.w2(head.w1(torch.tensor(4))) - head.w2(head.w1(torch.tensor(3)))
        torch.testing.assert_close(other.logits[0, 0] - out.logits[0, 0], delta, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(other.logits[1], out.logits[1])
        assert not torch.allclose(other.confidence_logits[0, 0], out.confidence_logits[0, 0])


@pytest.mark.parametrize("variant,slot1_sees_anchor", [("vanilla", False), ("gated", False), ("rnn", True)])
def test_markov_variants_memory(variant, slot1_sees_anchor):
    cfg = _target_cfg()
    drafter = _make(cfg, markov_variant=variant)
    target = FrozenTarget(cfg)
    hidden = torch.randn(1, GAMMA, cfg.hidden_size)
    fixed = lambda logits, k: torch.tensor([7])  # noqa: E731 - same drafted tokens for both anchors
    with torch.no_grad():
        a = drafter.draft(hidden, torch.tensor([1]), target.lm_head_weight, fixed)
        b = drafter.draft(hidden, torch.tensor([2]), target.lm_head_weight, fixed)
    assert not torch.allclose(a.logits[:, 0], b.logits[:, 0])
    # Only the rnn head carries the anchor beyond slot 0 (through its state).
    assert torch.allclose(a.logits[:, 1], b.logits[:, 1]) != slot1_sees_anchor


def test_rank_zero_has_no_markov_head_and_confidence_from_hidden_only():
    cfg = _target_cfg()
    drafter = _make(cfg, markov_rank=0)
    assert drafter.markov_head is None
    assert not any(name.startswith("markov") for name, _ in drafter.named_parameters())
    assert drafter.confidence_head.weight.shape == (1, cfg.hidden_size)
    target = FrozenTarget(cfg)
    hidden = torch.randn(2, GAMMA, cfg.hidden_size)
    greedy = lambda logits, k: logits.argmax(-1)  # noqa: E731
    with torch.no_grad():
        a = drafter.draft(hidden, torch.tensor([1, 2]), target.lm_head_weight, greedy)
        b = drafter.draft(hidden, torch.tensor([60, 70]), target.lm_head_weight, greedy)
    torch.testing.assert_close(a.logits, hidden @ target.lm_head_weight.T)
    torch.testing.assert_close(a.logits, b.logits)
    torch.testing.assert_close(a.confidence_logits, b.confidence_logits)


def test_without_confidence_head_returns_none():
    cfg = _target_cfg()
    drafter = _make(cfg, use_confidence_head=False)
    target = FrozenTarget(cfg)
    out = drafter.draft(torch.randn(1, GAMMA, cfg.hidden_size), torch.tensor([0]), target.lm_head_weight,
                        lambda logits, k: logits.argmax(-1))
    assert out.confidence_logits is None and drafter.confidence_head is None


def test_mask_token_id_uses_target_embedding():
    cfg = _target_cfg()
    drafter = _make(cfg, mask_token_id=5)
    target = FrozenTarget(cfg)
    assert drafter.mask_embedding is None
    x = drafter._block_inputs(torch.tensor([9]), target.embed)
    torch.testing.assert_close(x[0, 0], target.embedding[9])
    torch.testing.assert_close(x[0, 1:], target.embedding[5].expand(GAMMA - 1, -1))
    with pytest.raises(ConfigError, match="drafter.mask_token_id"):
        DSparkDrafter(cfg, _drafter_cfg(mask_token_id=97))


def test_parameters_exclude_shared_embedding_and_lm_head():
    cfg = _target_cfg()
    drafter = DSparkDrafter(cfg, _drafter_cfg())
    names = set(drafter.state_dict())
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "mask_embedding", "markov_head.w1.weight",
            "markov_head.w2.weight", "confidence_head.weight", "layers.1.self_attn.q_proj.weight"} <= names
    assert drafter.fc.weight.shape == (cfg.hidden_size, 3 * cfg.hidden_size)
    assert drafter.confidence_head.weight.shape == (1, cfg.hidden_size + 8)
    assert drafter.num_parameters() == sum(p.numel() for p in drafter.parameters())
    small = DSparkDrafter(cfg, _drafter_cfg(intermediate_size=32))
    assert small.layers[0].mlp.up_proj.weight.shape == (32, cfg.hidden_size)


def test_target_layer_ids_are_validated():
    with pytest.raises(ConfigError, match=r"drafter.target_layer_ids.*\[4\]"):
        DSparkDrafter(_target_cfg(), _drafter_cfg(target_layer_ids=(0, 4)))
    drafter = DSparkDrafter(_target_cfg(), _drafter_cfg(target_layer_ids=(3,)))
    with pytest.raises(ConfigError, match="drafter.target_layer_ids"):
        drafter.validate_target_layers(_target_cfg(num_layers=2))


def test_bad_inputs_raise_clear_errors():
    cfg = _target_cfg()
    drafter = _make(cfg)
    target = FrozenTarget(cfg)
    manager = BlockManager(num_pages=8, page_size=4)
    cache = KVCache(2, 8, 4, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu")
    causal_meta = _meta(manager, [(0, 3, GAMMA)], causal=True)
    with pytest.raises(ValueError, match="causal=False"):
        drafter.forward_block(torch.tensor([1]), torch.tensor([3]), cache, causal_meta, target.embed)
    wrong_cache = KVCache(1, 8, 4, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu")
    with pytest.raises(ValueError, match="drafter cache has 1 layers"):
        drafter.context_kv(torch.randn(2, 3 * cfg.hidden_size), torch.arange(2), wrong_cache, causal_meta)
    with pytest.raises(ValueError, match="captured layers"):
        drafter.context_kv(torch.randn(2, 2 * cfg.hidden_size), torch.arange(2), cache, causal_meta)
    hidden_cat, input_ids, anchors, block_targets = _batch(cfg, drafter)
    with pytest.raises(ValueError, match="anchor_positions must lie in"):
        drafter.forward_train(hidden_cat, input_ids, anchors + 12, target.embed, target.lm_head_weight, block_targets)


# ---------------------------------------------------------------------------- checkpoints


def _outputs(drafter: DSparkDrafter, seed: int = 3):
    cfg = drafter.target_cfg
    target = FrozenTarget(cfg)
    hidden_cat, input_ids, anchors, block_targets = _batch(cfg, drafter, seed=seed)
    with torch.no_grad():
        return drafter.forward_train(hidden_cat, input_ids, anchors, target.embed, target.lm_head_weight,
                                     block_targets)


def test_checkpoint_round_trip(tmp_path):
    cfg = _target_cfg()
    drafter = _make(cfg, markov_variant="rnn")
    drafter.save(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["drafter"] == drafter.cfg.to_dict()
    assert saved["target"]["hidden_size"] == 64 and saved["target"]["arch"] == "llama"
    assert (tmp_path / "model.safetensors").is_file() and not (tmp_path / "temperatures.json").exists()
    loaded = DSparkDrafter.load(tmp_path, cfg)
    for (name, a), (_, b) in zip(drafter.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    torch.testing.assert_close(_outputs(loaded).logits, _outputs(drafter).logits)
    half = DSparkDrafter.load(tmp_path, cfg, dtype=torch.bfloat16)
    assert half.fc.weight.dtype == torch.bfloat16 and half.confidence_temperatures.dtype == torch.float32


def test_checkpoint_sharding(tmp_path):
    cfg = _target_cfg()
    drafter = _make(cfg)
    drafter.save(tmp_path, max_shard_bytes=20_000)
    shards = sorted(tmp_path.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and not (tmp_path / "model.safetensors").exists()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(drafter.state_dict())
    for shard in shards:
        tensors = load_file(str(shard))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        assert total <= 20_000 or len(tensors) == 1  # one tensor larger than the limit gets its own shard
    loaded = DSparkDrafter.load(tmp_path, cfg)
    torch.testing.assert_close(_outputs(loaded).logits, _outputs(drafter).logits)
    # Compressed shards (as the shipped drafter is stored) load to the same weights.
    from dspark.models.drafter import compress_shards

    packed = compress_shards(tmp_path, preset=1)
    assert [p.name for p in packed] == [f"{s.name}.xz" for s in shards] and not list(tmp_path.glob("model-*.safetensors"))
    assert compress_shards(tmp_path) == []  # nothing left to compress
    unpacked = DSparkDrafter.load(tmp_path, cfg)
    for (name, a), b in zip(loaded.state_dict().items(), unpacked.state_dict().values()):
        assert torch.equal(a, b), name
    # Saving again unsharded into the same folder removes the old shards, compressed or not.
    drafter.save(tmp_path)
    assert not list(tmp_path.glob("model-*-of-*.safetensors*")) and not (tmp_path / "model.safetensors.index.json").exists()
    DSparkDrafter.load(tmp_path, cfg)


def test_shard_compression_models_the_element_bytes():
    """compress_shards' filters take each byte's place in a 2- or 4-byte element into account: on bf16 and fp32
    weights they beat the same preset's default settings, and the stream stays one any xz reader decompresses."""
    from dspark.models.drafter import shard_xz_filters

    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        raw = save_bytes({"w": (torch.randn(256, 256) * 0.02).to(dtype)})
        tuned = lzma.compress(raw, format=lzma.FORMAT_XZ, filters=shard_xz_filters(6))
        plain = lzma.compress(raw, format=lzma.FORMAT_XZ, preset=6)
        assert len(tuned) < 0.97 * len(plain), (dtype, len(tuned), len(plain))
        assert lzma.decompress(tuned) == raw


def test_incompatible_target_is_refused(tmp_path):
    _make(_target_cfg()).save(tmp_path)
    with pytest.raises(ConfigError, match="hidden_size = 64.*model.hidden_size = 32"):
        DSparkDrafter.load(tmp_path, _target_cfg(hidden_size=32, head_dim=8))
    with pytest.raises(ConfigError, match="vocab_size"):
        DSparkDrafter.load(tmp_path, _target_cfg(vocab_size=100))
    with pytest.raises(ConfigError, match="arch"):
        DSparkDrafter.load(tmp_path, _target_cfg(arch="qwen2"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        DSparkDrafter.load(tmp_path / "nowhere", _target_cfg())


def test_strict_weight_names(tmp_path):
    cfg = _target_cfg()
    _make(cfg).save(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["fc.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"missing weights \['fc.weight'\]"):
        DSparkDrafter.load(tmp_path, cfg)
    _make(cfg).save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["drafter"]["markov_rank"] = 0
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="unexpected weights.*markov_head.w1.weight"):
        DSparkDrafter.load(tmp_path, cfg)


def test_confidence_temperatures(tmp_path):
    cfg = _target_cfg()
    drafter = _make(cfg)
    assert torch.equal(drafter.confidence_temperatures, torch.ones(GAMMA))
    drafter.set_confidence_temperatures([0.5, 1.0, 2.0, 4.0])
    z = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    torch.testing.assert_close(drafter.calibrated_confidence(z), torch.sigmoid(torch.tensor([[2.0, 1.0, 0.5, 0.25]])))
    drafter.save(tmp_path)
    assert json.loads((tmp_path / "temperatures.json").read_text())["temperatures"] == [0.5, 1.0, 2.0, 4.0]
    loaded = DSparkDrafter.load(tmp_path, cfg)
    assert loaded.confidence_temperatures.tolist() == [0.5, 1.0, 2.0, 4.0]
    assert "confidence_temperatures" not in loaded.state_dict()
    half = loaded.to(torch.bfloat16)  # the engine casts the whole drafter; temperatures stay exact
    assert half.confidence_temperatures.dtype == torch.float32
    assert half.confidence_temperatures.tolist() == [0.5, 1.0, 2.0, 4.0]
    def write(values):
        (tmp_path / "temperatures.json").write_text(json.dumps(
            {"temperatures": values, "method": "sequential_temperature_scaling", "ece_before": None, "ece_after": None}))

    write([1.0, 1.0, 1.0])
    with pytest.raises(ConfigError, match="holds 3 temperatures but the drafter block size is 4"):
        DSparkDrafter.load(tmp_path, cfg)
    (tmp_path / "temperatures.json").write_text(json.dumps([1.0, 1.0, 1.0, 1.0]))
    with pytest.raises(ConfigError, match="no 'temperatures' list"):
        DSparkDrafter.load(tmp_path, cfg)
    write([1.0, -1.0, 1.0, 1.0])
    with pytest.raises(ConfigError, match="> 0|positive"):
        DSparkDrafter.load(tmp_path, cfg)


def test_draft_without_logits_draws_the_same_block():
    """keep_logits=False (the engine's steps) changes nothing but the returned logits."""
    cfg = _target_cfg()
    drafter = _make(cfg)
    target = FrozenTarget(cfg)
    hidden = torch.randn(3, GAMMA, cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    anchors = torch.tensor([4, 9, 11])
    greedy = lambda logits, k: logits.argmax(-1)  # noqa: E731
    with torch.no_grad():
        full = drafter.draft(hidden, anchors, target.lm_head_weight, greedy)
        lean = drafter.draft(hidden, anchors, target.lm_head_weight, greedy, keep_logits=False)
    assert lean.logits is None and full.logits.shape == (3, GAMMA, cfg.vocab_size)
    assert torch.equal(lean.tokens, full.tokens)
    assert torch.equal(lean.confidence_logits, full.confidence_logits)


def _shipped_target_cfg(folder) -> ModelConfig:
    return ModelConfig(**json.loads((folder / "config.json").read_text())["target"])


def test_truncated_drafter_shard_names_file(tmp_path, monkeypatch):
    import shutil

    from dspark.models import drafter as drafter_module
    from dspark.models.loading import DamagedFileError

    shipped = drafter_module.ASSETS_DIR / "dspark-smollm2"
    index = json.loads((shipped / "model.safetensors.index.json").read_text())
    recorded = index["metadata"]["files"]  # the shipped index vouches for every shard it lists
    assert sorted(recorded) == sorted(set(index["weight_map"].values()))
    shards = {fname: lzma.decompress((shipped / (fname + ".xz")).read_bytes()) for fname in recorded}
    for fname, want in recorded.items():  # stored xz-compressed; the record is of the decompressed shard
        assert len(shards[fname]) == want["size"], fname
    # A copy of the shipped drafter inside a stand-in repository: its restore hint is a git checkout.
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    folder = repo / "dspark" / "assets" / "dspark-smollm2"
    shutil.copytree(shipped, folder)
    monkeypatch.setattr(drafter_module, "ASSETS_DIR", repo / "dspark" / "assets")
    packed = folder / "model-00002-of-00002.safetensors.xz"
    os.truncate(packed, 1_000_000)
    with pytest.raises(DamagedFileError, match=r"shard .*model-00002-of-00002\.safetensors\.xz: not a readable xz file"
                                               r".*truncated or corrupt.*restore it with `git -C .*repo checkout -- "
                                               r"dspark/assets/dspark-smollm2/model-00002-of-00002\.safetensors\.xz`"):
        DSparkDrafter.load(folder, _shipped_target_cfg(folder))
    # A valid xz file of other bytes: the recorded sha256 of the decompressed shard finds it.
    raw = bytearray(shards[packed.name.removesuffix(".xz")])
    raw[-1] ^= 0xFF
    packed.write_bytes(lzma.compress(bytes(raw), preset=0))  # the fastest preset: any valid xz file will do
    with pytest.raises(DamagedFileError, match=r"model-00002-of-00002\.safetensors\.xz: its decompressed sha256 "
                                               r"differs .*git -C"):
        DSparkDrafter.load(folder, _shipped_target_cfg(folder))
    # An uncompressed shard beside (or instead of) the packed one is read and checked as before.
    (folder / "model-00002-of-00002.safetensors").write_bytes(bytes(raw[:1_000_000]))
    with pytest.raises(DamagedFileError, match=rf"shard .*model-00002-of-00002\.safetensors is 1000000 bytes but its "
                                               rf"index records {recorded['model-00002-of-00002.safetensors']['size']} "
                                               r"bytes .*truncated"):
        DSparkDrafter.load(folder, _shipped_target_cfg(folder))
    # A checkpoint of one's own (no recorded sizes): still named, with where to restore it from.
    cfg = _target_cfg()
    _make(cfg).save(tmp_path / "mine")
    os.truncate(tmp_path / "mine" / "model.safetensors", 100)
    with pytest.raises(DamagedFileError, match=r"mine/model\.safetensors: not a readable safetensors file .*"
                                               r"truncated or corrupt\. Restore it from where this checkpoint came"):
        DSparkDrafter.load(tmp_path / "mine", cfg)
    # The real shipped folder's hint, in a git checkout, names the command for this repository.
    monkeypatch.undo()
    root = shipped.parents[2]
    if (root / ".git").exists():
        hint = drafter_module.restore_hint(shipped / "model-00001-of-00002.safetensors.xz")
        shard = "dspark/assets/dspark-smollm2/model-00001-of-00002.safetensors.xz"
        assert hint.endswith(f"`git -C {root} checkout -- {shard}`")


@pytest.mark.parametrize("variant", ["vanilla", "gated", "rnn"])
def test_markov_bias_parts_make_the_bias_the_head_adds(variant):
    """bias_parts (what kernels/draft_logits.py widens and adds in one pass) gives forward's bias exactly, and
    the fused path is only taken where the engine's kernels say so (the Triton backend on CUDA)."""
    from dspark.config import DEFAULT_KERNELS, KernelConfig
    from dspark.models.drafter import fused_draft_logits_enabled

    drafter = _make(markov_variant=variant).to(torch.bfloat16)
    head = drafter.markov_head
    g = torch.Generator().manual_seed(3)
    h = torch.randn(5, drafter.hidden_size, generator=g).to(torch.bfloat16)
    prev_emb = head.w1(torch.randint(0, 97, (5,), generator=g))
    state = head.initial_state(5, h)
    bias, state_a = head(h, prev_emb, state)
    low, gate, state_b = head.bias_parts(h, prev_emb, state)
    assert low.dtype == torch.bfloat16 and (gate is not None) == (variant == "gated")
    assert torch.equal(bias, low.float() if gate is None else gate * low.float())
    assert (state_a is None and state_b is None) or torch.equal(state_a, state_b)
    triton_on = KernelConfig(attention_backend="triton")
    assert fused_draft_logits_enabled(triton_on, "cuda") and not fused_draft_logits_enabled(triton_on, "cpu")
    assert not fused_draft_logits_enabled(DEFAULT_KERNELS, "cuda") and not fused_draft_logits_enabled(None, "cuda")
    assert not fused_draft_logits_enabled(KernelConfig(attention_backend="triton", fused_draft_logits=False), "cuda")
