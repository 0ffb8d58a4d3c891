"""Tiny random models for fast CPU tests."""

from __future__ import annotations

import torch

from dspark.config import DrafterConfig, EngineConfig, ModelConfig
from dspark.models.llama import TargetModel


def tiny_model_config(arch: str = "llama", vocab: int = 97, **kw) -> ModelConfig:
    base = dict(arch=arch, vocab_size=vocab, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512,
                tie_word_embeddings=True, attention_bias=(arch == "qwen2"), qk_norm=(arch == "qwen3"),
                bos_token_id=1, eos_token_ids=(2,))
    base.update(kw)
    return ModelConfig(**base)


def tiny_target(seed: int = 0, arch: str = "llama", scale: float = 1.0, **kw) -> TargetModel:
    """A random target whose logits are peaked enough that greedy decoding has no near-ties."""
    torch.manual_seed(seed)
    model = TargetModel(tiny_model_config(arch, **kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08 * scale if "embed" not in name else 1.0)
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model.eval()


def tiny_drafter(target: TargetModel, seed: int = 1, **kw):
    from dspark.models.drafter import DSparkDrafter

    base = dict(block_size=4, num_layers=1, target_layer_ids=(0, 2), markov_rank=8, markov_variant="vanilla")
    base.update(kw)
    torch.manual_seed(seed)
    d = DSparkDrafter(target.cfg, DrafterConfig(**base))
    with torch.no_grad():
        for name, p in d.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.1)
    return d.eval()


def tiny_engine_config(**kw) -> EngineConfig:
    # plan_min_rows=0: tiny engines run a few rows, and their tests exercise the planner there
    base = dict(device="cpu", dtype="float32", kv_block_size=8, max_model_len=256, max_num_seqs=8,
                max_num_batched_tokens=64, spec="dspark", plan_min_rows=0)
    base.update(kw)
    return EngineConfig(**base)
