"""The target model: a Llama-family decoder (Llama, Qwen2, Qwen3) over the paged KV cache.

Weights use Hugging Face names, so a converted GGUF and a local HF folder load the same
way. Attention goes through :mod:`dspark.attention`, so the backend can change without
touching the model.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from dspark.attention import AttentionMetadata
from dspark.config import KernelConfig, ModelConfig
from dspark.kv_cache import KVCache
from dspark.models.layers import DecoderLayer, RMSNorm, run_decoder_stack, use_fused_kernels, use_row_invariant
from dspark.models.row_invariant import row_tiled_linear


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer.from_config(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def decode_megakernel_applies(cfg: ModelConfig, input_ids: torch.Tensor, cache, meta: AttentionMetadata,
                              capture_layers: tuple[int, ...]) -> bool:
    """Whether a target step runs as the one-launch decode kernel (kernels/decode_megakernel.py):
    ``engine.kernels.decode_megakernel=true`` (experimental, off by default: its reductions are not
    those of the layer kernels that verify DSpark's blocks, so in bf16 a target-only run with it can
    part from a DSpark run at a near-tie), the fused Triton kernels in use, not the batch-invariant
    mode, one token of one request, no layer outputs wanted (target-only decode: DSpark steps capture
    layers for the drafter), and a model the kernel covers (no q/k norms, power-of-two head size,
    unsplit paged cache)."""
    kc = meta.kernels
    if not kc.decode_megakernel:  # the default path's one check
        return False
    if input_ids.dim() != 1 or input_ids.shape[0] != 1 or capture_layers or meta.block_tables.shape[0] != 1:
        return False
    if not use_fused_kernels(kc) or kc.batch_invariant:
        return False
    D = cfg.head_dim
    return (not cfg.qk_norm and D >= 16 and D & (D - 1) == 0 and isinstance(cache, KVCache)
            and cache.k.is_contiguous() and cache.v.is_contiguous())


class TargetModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.origin: dict | None = None  # the checkpoint it was loaded from (dspark.models.provenance), if any
        self.megakernel_launches = 0  # forward calls that ran the decode megakernel (eager or captured)
        self.model = Backbone(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, meta: AttentionMetadata,
                capture_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids/positions: [T] -> (final-normed hidden [T, d], captured layer outputs [T, n*d] or None).

        A one-token step with nothing captured runs the whole stack as one persistent kernel where
        :func:`decode_megakernel_applies` says so (kernels/decode_megakernel.py)."""
        if decode_megakernel_applies(self.cfg, input_ids, cache, meta, capture_layers):
            return self._forward_megakernel(input_ids, positions, cache, meta), None
        hidden, captured = run_decoder_stack(self.model.layers, self.embed(input_ids), positions, cache, meta,
                                             self.model.norm, capture_layers)
        cap = torch.cat(captured, dim=-1) if capture_layers else None
        return hidden, cap

    def stack_weights(self):
        """The layers' weights stacked for the decode megakernel (kernels.decode_megakernel.StackWeights):
        built once, rebuilt when any weight is replaced or updated in place (a copy: the stack does
        not alias the modules' parameters)."""
        from kernels.decode_megakernel import StackWeights

        layers = self.model.layers
        parts = [p for layer in layers for p in layer.parameters()] + [self.model.norm.weight]
        stamp = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in parts)
        cached = self.__dict__.get("_stack_weights")
        if cached is not None and cached[0] == stamp:
            return cached[1]
        attn0 = layers[0].self_attn
        with torch.no_grad():
            # Each layer's fused q/k/v, o_proj, fused gate/up and down_proj, as the GEMV path reads them.
            per_layer = [layer.small_m_weights() for layer in layers]
            stack = lambda ts: torch.stack(list(ts))  # noqa: E731  (a new contiguous tensor)
            w = StackWeights(
                qkv=stack(m[0] for m in per_layer),
                qkv_bias=None if attn0.q_proj.bias is None else stack(
                    layer.self_attn.qkv_weights()[1] for layer in layers),
                o=stack(m[1] for m in per_layer), gate_up=stack(m[2] for m in per_layer),
                down=stack(m[3] for m in per_layer),
                norm1=stack(layer.input_layernorm.weight for layer in layers),
                norm2=stack(layer.post_attention_layernorm.weight for layer in layers),
                final_norm=self.model.norm.weight.detach().clone(),
                inv_freq=attn0._inv_freq_on(attn0.q_proj.weight.device).contiguous(),
                num_heads=self.cfg.num_heads, num_kv_heads=self.cfg.num_kv_heads, head_dim=self.cfg.head_dim,
                eps=float(self.cfg.rms_norm_eps))
        self.__dict__["_stack_weights"] = (stamp, w)
        return w

    def _forward_megakernel(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                            meta: AttentionMetadata) -> torch.Tensor:
        from kernels.decode_megakernel import decode_megakernel

        self.megakernel_launches += 1
        return decode_megakernel(self.stack_weights(), self.embed(input_ids), positions, meta.slot_mapping,
                                 meta.block_tables[0], meta.kv_lens, cache.k, cache.v,
                                 programs=meta.kernels.megakernel_programs)

    def compute_logits(self, hidden: torch.Tensor, kernels: KernelConfig | None = None) -> torch.Tensor:
        """hidden [N, d] -> float32 logits [N, V]. ``kernels``: the engine's settings (the step's
        ``meta.kernels``); in the batch-invariant mode the LM head runs the fixed-tile Triton GEMM, so
        a row's logits do not depend on the step's row count (the plain backend: fixed row tiles,
        :mod:`dspark.models.row_invariant`). Without them: ``F.linear``."""
        if kernels is not None and kernels.batch_invariant and use_fused_kernels(kernels) and hidden.dim() == 2:
            from kernels.small_m_linear import linear_triton

            return linear_triton(hidden, self.lm_head_weight.contiguous(), any_m=True,
                                 tiles=kernels.small_m_tiles).float()
        if use_row_invariant(kernels):
            return row_tiled_linear(hidden, self.lm_head_weight).float()
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
