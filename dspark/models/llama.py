"""The target model: a Llama-family decoder (Llama, Qwen2, Qwen3) over the paged KV cache.

Weights use Hugging Face names, so a converted GGUF and a local HF folder load the same
way. Attention goes through :mod:`dspark.attention`, so the backend can change without
touching the model.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from dspark.attention import AttentionMetadata, batch_invariant
from dspark.config import ModelConfig
from dspark.kv_cache import KVCache
from dspark.models.layers import DecoderLayer, RMSNorm, run_decoder_stack, use_fused_kernels


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer.from_config(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class TargetModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, meta: AttentionMetadata,
                capture_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids/positions: [T] -> (final-normed hidden [T, d], captured layer outputs [T, n*d] or None)."""
        hidden, captured = run_decoder_stack(self.model.layers, self.embed(input_ids), positions, cache, meta,
                                             self.model.norm, capture_layers)
        cap = torch.cat(captured, dim=-1) if capture_layers else None
        return hidden, cap

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if batch_invariant() and use_fused_kernels() and hidden.dim() == 2:
            from kernels.small_m_linear import linear_triton

            return linear_triton(hidden, self.lm_head_weight.contiguous(), any_m=True).float()
        return F.linear(hidden, self.lm_head_weight).float()

    def load_hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load weights named as in Hugging Face checkpoints; missing or unexpected keys are errors."""
        sd = dict(state_dict)
        if self.lm_head is None:
            sd.pop("lm_head.weight", None)  # tied: the embedding is the head
        sd = {k: v for k, v in sd.items() if not k.endswith("rotary_emb.inv_freq")}
        own = self.state_dict()
        missing = sorted(set(own) - set(sd))
        unexpected = sorted(set(sd) - set(own))
        if missing or unexpected:
            raise ValueError(f"target weights do not match the architecture {self.cfg.arch}: "
                             f"missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
                             f"unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}")
        for k, v in sd.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise ValueError(f"target weight {k}: shape {tuple(v.shape)} in the checkpoint, "
                                 f"{tuple(own[k].shape)} expected by the config")
        self.load_state_dict(sd, strict=True)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        sd = self.state_dict()
        if self.lm_head is None:
            sd["lm_head.weight"] = self.model.embed_tokens.weight
        return sd
