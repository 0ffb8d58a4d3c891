"""DSpark block drafter: KV injection backbone, Markov head, confidence head.

Backbone (DFlash-style KV injection). The outputs of a few target decoder layers are
concatenated per position, projected by ``fc`` and RMS-normed into *context states*.
Each draft layer turns the context states into K/V with its own ``k_proj``/``v_proj``
(rotary at the context positions) and stores them in the drafter's paged cache. A block
``[anchor, mask x (gamma-1)]`` then runs through the draft layers in one forward; every
block row attends non-causally to all context before the anchor and to the whole block.
Slot k (0-based) predicts the token k+1 positions after the anchor.

Sequential stage. Slot k's logits are ``h_k @ lm_head.T`` plus a Markov bias from the
token before it (the anchor for slot 0, then the drafted tokens), so drafting samples
left to right:

- ``vanilla``: bias = W2(W1[x_{k-1}]), W1 an Embedding(V, r), W2 a Linear(r, V);
- ``gated``:   the vanilla bias scaled by sigmoid(w_g . [h_k; W1[x_{k-1}]]);
- ``rnn``:     a gated recurrent state s_k of size r carried across the block's slots:
  z = [s_{k-1}; W1[x_{k-1}]; h_k], (g, c, o) = split(Linear(z)),
  s_k = sigmoid(g) * s_{k-1} + (1 - sigmoid(g)) * tanh(c), bias = W2(tanh(o)), s_0 = 0;
- rank 0: no bias (DFlash-style independent slots).

Confidence head. z_k = w . [h_k; W1[x_{k-1}]] (h_k alone at rank 0); sigmoid(z_k / T_k + b_k)
estimates the probability that slot k's draft is accepted given that all earlier ones
were, with per-slot temperatures T_k from sequential temperature scaling (default 1) and
per-slot biases b_k from its sts_bias variant (default 0; temperatures.json "biases").

The target's embedding and lm_head are not parameters of the drafter: callers pass
``embed_fn`` and ``lm_head_weight`` (frozen, shared) at call time.

The inference path (:meth:`DSparkDrafter.context_kv` + :meth:`DSparkDrafter.forward_block`
over the paged cache) and the training path (:meth:`DSparkDrafter.forward_train`, dense)
compute the same function; tests/test_drafter.py checks that they agree.
"""

from __future__ import annotations

import hashlib
import json
import lzma
from pathlib import Path
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from dspark.attention import AttentionMetadata
from dspark.config import ConfigError, DrafterConfig, KernelConfig, ModelConfig
from dspark.kv_cache import KVCache
from dspark.models.layers import DecoderLayer, RMSNorm, run_decoder_stack
from dspark.models.loading import DamagedFileError, file_sha256, read_safetensors

EmbedFn = Callable[[torch.Tensor], torch.Tensor]
SampleFn = Callable[[torch.Tensor, int], torch.Tensor]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TEMPERATURES_FILE = "temperatures.json"
PACKED_SUFFIX = ".xz"  # a shard stored xz-compressed (compress_shards): <shard>.safetensors.xz
ASSETS_DIR = Path(__file__).resolve().parents[1] / "assets"  # drafters shipped with the package
DEFAULT_MAX_SHARD_BYTES = 16 * 1024 * 1024
# Target fields a drafter checkpoint depends on; load() refuses a target that differs in any.
TARGET_COMPAT_KEYS = ("arch", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                      "intermediate_size", "rope_theta")


class DraftOutput(NamedTuple):
    tokens: torch.Tensor  # int64 [B, gamma]
    logits: torch.Tensor | None  # float32 [B, gamma, V]: the logits each token was drawn from (Markov bias
    # included); None when draft(keep_logits=False), as the engine's steps call it
    confidence_logits: torch.Tensor | None  # float32 [B, gamma] raw z_k; None without a confidence head


class TrainOutput(NamedTuple):
    logits: torch.Tensor  # float32 [N, A, gamma, V]
    confidence_logits: torch.Tensor | None  # float32 [N, A, gamma]; None without a confidence head
    hidden: torch.Tensor  # [N, A, gamma, d] backbone output (final norm applied)


def fused_draft_logits_enabled(kernels: KernelConfig | None, device: torch.device | str) -> bool:
    """Whether a draft's slot logits come from kernels/draft_logits.py for an engine with ``kernels`` and tensors
    on ``device``: the Triton backend, ``engine.kernels.fused_draft_logits`` on, and CUDA only."""
    from kernels.switches import cuda_switch_on

    return cuda_switch_on(kernels, "fused_draft_logits", device)


class MarkovHead(nn.Module):
    """Low-rank transition bias from the previous block token; see the module docstring for variants."""

    def __init__(self, hidden: int, vocab: int, rank: int, variant: str):
        super().__init__()
        if variant not in DrafterConfig.VARIANTS:
            raise ConfigError(f"drafter.markov_variant: unknown variant {variant!r}; "
                              f"allowed: {list(DrafterConfig.VARIANTS)}")
        self.rank = rank
        self.variant = variant
        self.w1 = nn.Embedding(vocab, rank)
        self.w2 = nn.Linear(rank, vocab, bias=False)
        self.gate = nn.Linear(hidden + rank, 1) if variant == "gated" else None
        self.cell = nn.Linear(2 * rank + hidden, 3 * rank) if variant == "rnn" else None

    def initial_state(self, batch: int, like: torch.Tensor) -> torch.Tensor | None:
        if self.variant != "rnn":
            return None
        return torch.zeros(batch, self.rank, dtype=self.w1.weight.dtype, device=like.device)

    def forward(self, h: torch.Tensor, prev_emb: torch.Tensor, state: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """h [M, d], prev_emb = W1[x_{k-1}] [M, r], state [M, r] (rnn) -> (bias float32 [M, V], new state)."""
        bias, gate, new_state = self.bias_parts(h, prev_emb, state)
        return (bias.float() if gate is None else gate * bias.float()), new_state

    def bias_parts(self, h: torch.Tensor, prev_emb: torch.Tensor, state: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The bias before it is widened: (W2 output [M, V] in the weights' dtype, the gated variant's gate
        float32 [M, 1] or None, new rnn state). The bias is ``gate * output.float()`` (``output.float()``
        without a gate), which kernels/draft_logits.py adds to the backbone's logits in one pass."""
        if self.variant == "vanilla":
            return self.w2(prev_emb), None, None
        if self.variant == "gated":
            gate = torch.sigmoid(self.gate(torch.cat((h, prev_emb), dim=-1)).float())  # [M, 1]
            return self.w2(prev_emb), gate, None
        z = torch.cat((state, prev_emb, h), dim=-1)
        g, c, o = self.cell(z).chunk(3, dim=-1)
        keep = torch.sigmoid(g)
        new_state = keep * state + (1.0 - keep) * torch.tanh(c)
        return self.w2(torch.tanh(o)), None, new_state


def check_anchor_range(anchors: torch.Tensor, seq_len: int) -> None:
    """ValueError unless every anchor position lies in [0, seq_len) (an empty tensor passes)."""
    if anchors.numel() and (int(anchors.min()) < 0 or int(anchors.max()) >= seq_len):
        raise ValueError(f"anchor_positions must lie in [0, {seq_len}), got min {int(anchors.min())} "
                         f"max {int(anchors.max())}")


class DSparkDrafter(nn.Module):
    """DSpark block drafter attached to a target model of config ``target_cfg``."""

    def __init__(self, target_cfg: ModelConfig, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.validate_target_layers(target_cfg)
        if cfg.mask_token_id is not None and not 0 <= cfg.mask_token_id < target_cfg.vocab_size:
            raise ConfigError(f"drafter.mask_token_id: {cfg.mask_token_id} is outside the target vocabulary "
                              f"[0, {target_cfg.vocab_size}); use a valid token id, or null for a learned "
                              f"mask embedding")
        self.target_cfg = target_cfg
        self.origin: dict | None = None  # the checkpoint load() read (dspark.models.provenance); None in memory
        self.block_size = cfg.block_size
        d = target_cfg.hidden_size
        self.hidden_size = d
        self.fc = nn.Linear(len(cfg.target_layer_ids) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, target_cfg.rms_norm_eps)
        self.layers = nn.ModuleList(
            DecoderLayer.from_config(target_cfg, intermediate=cfg.intermediate_size) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(d, target_cfg.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(d)) if cfg.mask_token_id is None else None
        r = cfg.markov_rank
        self.markov_head = MarkovHead(d, target_cfg.vocab_size, r, cfg.markov_variant) if r > 0 else None
        self.confidence_head = nn.Linear(d + r, 1) if cfg.use_confidence_head else None
        self.register_buffer("confidence_temperatures", torch.ones(cfg.block_size, dtype=torch.float32),
                             persistent=False)
        self.register_buffer("confidence_biases", torch.zeros(cfg.block_size, dtype=torch.float32),
                             persistent=False)
        # sts_max_prob: the weight of logit(top-token probability) per slot; read only while
        # confidence_uses_max_prob (then calibrated_confidence needs the max probabilities)
        self.register_buffer("confidence_max_prob_weights", torch.zeros(cfg.block_size, dtype=torch.float32),
                             persistent=False)
        self.confidence_uses_max_prob = False
        # sts_top_gap: the weight of the gap between the two largest logits per slot; read only while
        # confidence_uses_top_gap (then calibrated_confidence needs the gaps)
        self.register_buffer("confidence_top_gap_weights", torch.zeros(cfg.block_size, dtype=torch.float32),
                             persistent=False)
        self.confidence_uses_top_gap = False
        self._init_weights()

    # ------------------------------------------------------------------ setup

    def validate_target_layers(self, target_cfg: ModelConfig) -> None:
        """Every id in drafter.target_layer_ids must name a decoder layer of target_cfg."""
        cfg = self.cfg
        bad = [i for i in cfg.target_layer_ids if not 0 <= i < target_cfg.num_layers]
        if bad:
            raise ConfigError(f"drafter.target_layer_ids: {list(cfg.target_layer_ids)} has ids {bad} outside "
                              f"[0, {target_cfg.num_layers}) for this {target_cfg.num_layers}-layer target; "
                              f"pick 0-based layer ids of the target")

    def _init_weights(self, std: float = 0.02) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)
        if self.mask_embedding is not None:
            nn.init.normal_(self.mask_embedding, std=std)

    def _apply(self, fn, recurse: bool = True):
        """Module.to()/.half()/.cuda() move the calibration (temperatures, biases, score weights) with the model
        but keep it float32."""
        names = ("confidence_temperatures", "confidence_biases", "confidence_max_prob_weights",
                 "confidence_top_gap_weights")
        kept = [getattr(self, name) for name in names]
        super()._apply(fn, recurse)
        device = fn(kept[0]).device
        for name, value in zip(names, kept):
            setattr(self, name, value.to(device=device, dtype=torch.float32))
        return self

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    # ------------------------------------------------------------------ backbone

    def _block_inputs(self, anchor_ids: torch.Tensor, embed_fn: EmbedFn) -> torch.Tensor:
        """anchor_ids [...] -> block inputs [..., gamma, d]: embed(anchor) then gamma-1 mask slots."""
        anchor = embed_fn(anchor_ids).to(self.dtype)  # [..., d]
        if self.mask_embedding is not None:
            mask = self.mask_embedding
        else:
            mask_id = torch.tensor([self.cfg.mask_token_id], dtype=torch.long, device=anchor_ids.device)
            mask = embed_fn(mask_id)[0].to(self.dtype)
        masks = mask.expand(*anchor.shape[:-1], self.block_size - 1, self.hidden_size)
        return torch.cat((anchor.unsqueeze(-2), masks), dim=-2)

    def _context_states(self, target_hidden_cat: torch.Tensor, kernels: KernelConfig | None = None) -> torch.Tensor:
        """fc + RMSNorm of the captured target layers; ``kernels``: the step's settings (``meta.kernels``)."""
        expected = len(self.cfg.target_layer_ids) * self.hidden_size
        if target_hidden_cat.shape[-1] != expected:
            raise ValueError(f"target_hidden_cat has last dim {target_hidden_cat.shape[-1]}, expected {expected} "
                             f"= {len(self.cfg.target_layer_ids)} captured layers x hidden {self.hidden_size}; "
                             f"capture drafter.target_layer_ids {list(self.cfg.target_layer_ids)} from the target")
        return self.hidden_norm(self.fc(target_hidden_cat.to(self.dtype)), kernels)

    def _check_cache(self, cache: KVCache) -> None:
        if cache.k.shape[0] != len(self.layers):
            raise ValueError(f"drafter cache has {cache.k.shape[0]} layers, the drafter has {len(self.layers)}; "
                             f"allocate KVCache(num_layers=drafter.num_layers, ...)")

    def context_kv(self, target_hidden_cat: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                   meta: AttentionMetadata) -> None:
        """Write every draft layer's context K/V for target_hidden_cat [T, n*d] at positions [T] (meta.slot_mapping)."""
        self._check_cache(cache)
        ctx = self._context_states(target_hidden_cat, meta.kernels)
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = cache.layer(i)
            layer.self_attn.write_context_kv(ctx, positions, k_cache, v_cache, meta)

    def forward_block(self, anchor_ids: torch.Tensor, start_positions: torch.Tensor | None, cache: KVCache,
                      meta: AttentionMetadata, embed_fn: EmbedFn, positions: torch.Tensor | None = None
                      ) -> torch.Tensor:
        """One block forward over the paged cache -> hidden [B, gamma, d] (final norm applied).

        anchor_ids int64 [B]; start_positions int64 [B] (= n-1, the anchor's position), or None with
        ``positions``, the block's positions already laid out (int64 [B*gamma]: start..start+gamma-1 per
        request, as kernels/verify_packing.py's draft_rows gives them with the metadata);
        meta: causal=False, qo_indptr = arange(B+1)*gamma, kv_lens = start+gamma, slot_mapping
        for positions start..start+gamma-1 of each request (the block's K/V are written there).
        """
        self._check_cache(cache)
        batch, gamma = anchor_ids.shape[0], self.block_size
        if meta.causal:
            raise ValueError("forward_block needs AttentionMetadata(causal=False): block rows see the whole block")
        if meta.num_tokens != batch * gamma or meta.batch_size != batch:
            raise ValueError(f"metadata describes {meta.batch_size} requests / {meta.num_tokens} tokens, "
                             f"expected {batch} requests x block_size {gamma} = {batch * gamma} tokens")
        if positions is None:
            if start_positions is None:
                raise ValueError("forward_block needs start_positions or positions")
            offsets = torch.arange(gamma, device=anchor_ids.device)
            positions = (start_positions.long()[:, None] + offsets).reshape(-1)  # [B*gamma]
        elif positions.shape != (batch * gamma,):
            raise ValueError(f"positions must be [{batch * gamma}] (batch x block_size), got {tuple(positions.shape)}")
        x = self._block_inputs(anchor_ids, embed_fn).reshape(batch * gamma, self.hidden_size)
        hidden, _ = run_decoder_stack(self.layers, x, positions, cache, meta, self.norm)
        return hidden.view(batch, gamma, self.hidden_size)

    # ------------------------------------------------------------------ heads

    @staticmethod
    def _base_logits(hidden: torch.Tensor, lm_head_weight: torch.Tensor, widen: bool = True) -> torch.Tensor:
        """Backbone logits U_k for all slots at once: hidden [..., d] -> [..., V], float32 when widen
        (else in the head's dtype, for callers that widen one slot at a time)."""
        logits = F.linear(hidden.to(lm_head_weight.dtype), lm_head_weight)
        return logits.float() if widen else logits

    def _slot_logits(self, h: torch.Tensor, base_logits: torch.Tensor, prev_tokens: torch.Tensor,
                     state: torch.Tensor | None, fused: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One slot for M rows: h [M, d], base_logits [M, V] (any float dtype: widened here), prev_tokens
        x_{k-1} [M] -> (logits float32 [M, V] with the Markov bias, new rnn state). ``fused``: widen and add in
        one Triton pass (kernels/draft_logits.py; the same bits)."""
        from kernels.draft_logits import draft_slot_logits

        if self.markov_head is None:
            return base_logits.float(), state
        prev_emb = self.markov_head.w1(prev_tokens)
        bias, gate, state = self.markov_head.bias_parts(h, prev_emb, state)
        return draft_slot_logits(base_logits, bias, gate, fused=fused), state

    def confidence_logits(self, hidden: torch.Tensor, prev_tokens: torch.Tensor,
                          stop_grad: bool = False) -> torch.Tensor:
        """The confidence head's raw logits z_k of every slot at once: hidden [..., gamma, d] and the token before
        each slot, prev_tokens x_{k-1} [..., gamma] (the anchor, then the block's tokens) -> float32 [..., gamma].
        A slot's confidence reads no token drawn at that slot, so the head runs once over the block after the
        slots are drawn, not once per slot (at batch 1 the per-slot head was five of a slot's nine launches).
        ``stop_grad``: the head reads its inputs detached, so a loss on these logits trains the head alone."""
        feats = hidden
        if self.markov_head is not None:
            feats = torch.cat((hidden, self.markov_head.w1(prev_tokens)), dim=-1)
        if stop_grad:
            feats = feats.detach()
        return self.confidence_head(feats).float().squeeze(-1)

    def draft(self, hidden: torch.Tensor, anchor_ids: torch.Tensor, lm_head_weight: torch.Tensor,
              sample_fn: SampleFn, keep_logits: bool = True, confidence: bool = True,
              kernels: KernelConfig | None = None) -> DraftOutput:
        """Sample the block left to right from hidden [B, gamma, d].

        ``sample_fn(logits [B, V] float32, slot k) -> tokens int64 [B]``; slot k's Markov bias and
        confidence use the token before it (anchor_ids for slot 0, then the token drawn at k-1).
        keep_logits=False returns no logits: the engine's steps need only the tokens (and the
        sampled rows' probabilities, which sample_fn keeps), and at batch 256 the stacked fp32
        logits alone are 350 MB of writes per step. confidence=False skips the confidence head
        (an engine that estimates acceptance another way): no confidence logits are returned.
        ``kernels``: the engine's kernel settings; with ``fused_draft_logits`` on the Triton backend and CUDA
        tensors, each slot's logits come from kernels/draft_logits.py (the same values in one pass).
        """
        fused = fused_draft_logits_enabled(kernels, hidden.device)
        batch, gamma, _ = hidden.shape
        state = self.markov_head.initial_state(batch, hidden) if self.markov_head is not None else None
        prev = anchor_ids.long()
        # [B, gamma, V] in the head's dtype; each slot is widened to fp32 when its bias is added
        # (the same values as widening all of it first, without the fp32 copy of the whole block).
        base = self._base_logits(hidden, lm_head_weight, widen=False)
        tokens, logits_all = [], []
        for k in range(gamma):
            logits, state = self._slot_logits(hidden[:, k], base[:, k], prev, state, fused)
            drawn = sample_fn(logits, k)
            if drawn.shape != (batch,):
                raise ValueError(f"sample_fn returned shape {tuple(drawn.shape)} for slot {k}, expected ({batch},)")
            prev = drawn.long()
            tokens.append(prev)
            if keep_logits:
                logits_all.append(logits)
        chain = torch.stack([anchor_ids.long(), *tokens], dim=1)  # [B, gamma + 1]: the anchor, then the block
        conf_out = None
        if self.confidence_head is not None and confidence:
            conf_out = self.confidence_logits(hidden, chain[:, :gamma])  # x_{k-1} of every slot
        return DraftOutput(chain[:, 1:], torch.stack(logits_all, dim=1) if keep_logits else None, conf_out)

    def calibrated_confidence(self, confidence_logits: torch.Tensor, max_prob: torch.Tensor | None = None,
                              offsets: torch.Tensor | None = None, top_gap: torch.Tensor | None = None
                              ) -> torch.Tensor:
        """c_k = sigmoid(z_k / T_k + b_k + w_k * logit(p_k) + v_k * g_k + o_k) for confidence_logits [..., gamma]
        (temperatures from STS, default 1; biases from sts_bias / sts_max_prob / sts_top_gap, default 0;
        max-probability weights w_k from sts_max_prob; top-gap weights v_k from sts_top_gap). ``max_prob``
        [..., gamma]: the drafter's top-token probability per slot, REQUIRED while :attr:`confidence_uses_max_prob`
        (ValueError without it) and not used otherwise; ``top_gap`` [..., gamma]: the gap between its two largest
        logits per slot, likewise with :attr:`confidence_uses_top_gap`. ``offsets`` [gamma]: an engine's own logit
        offsets (engine.online_calibration), None for none; the drafter keeps no such state."""
        from dspark.survival import calibrated_confidence

        flat = confidence_logits.reshape(-1, confidence_logits.shape[-1])
        weights = top = gap_weights = gap = None
        if self.confidence_uses_max_prob:
            if max_prob is None:
                raise ValueError("this drafter's confidence calibration (sts_max_prob) weighs the drafter's top-token "
                                 "probability of every slot: pass max_prob (the max of its softmax at each slot)")
            weights, top = self.confidence_max_prob_weights, max_prob.reshape(flat.shape)
        if self.confidence_uses_top_gap:
            if top_gap is None:
                raise ValueError("this drafter's confidence calibration (sts_top_gap) weighs the gap between the "
                                 "drafter's two largest logits of every slot: pass top_gap")
            gap_weights, gap = self.confidence_top_gap_weights, top_gap.reshape(flat.shape)
        return calibrated_confidence(flat, self.confidence_temperatures, self.confidence_biases, top,
                                     weights, offsets, gap, gap_weights).reshape(confidence_logits.shape)

    @property
    def confidence_calibration_method(self) -> str:
        """The calibration in effect, by its config name: ``sts_max_prob`` (max-probability weights),
        ``sts_top_gap`` (top-gap weights), ``sts_bias`` (a bias not 0), ``sts`` (a temperature not 1) or ``none``
        (the raw head). Reads the buffers on the host: for reports, not for steps."""
        from dspark.training.calibration import calibration_method

        return calibration_method(self.confidence_temperatures.tolist(), self.confidence_biases.tolist(),
                                  self.confidence_uses_max_prob, self.confidence_uses_top_gap)

    def calibration_values(self) -> tuple[list[float], list[float], list[float] | None, list[float] | None]:
        """(temperatures, biases, max-probability weights or None, top-gap weights or None) as host lists, as
        :meth:`set_confidence_temperatures` takes them."""
        weights = self.confidence_max_prob_weights.tolist() if self.confidence_uses_max_prob else None
        gap_weights = self.confidence_top_gap_weights.tolist() if self.confidence_uses_top_gap else None
        return self.confidence_temperatures.tolist(), self.confidence_biases.tolist(), weights, gap_weights

    def with_calibration(self, temperatures, biases=None, max_prob_weights=None,
                         top_gap_weights=None) -> "DSparkDrafter":
        """A drafter that shares this one's modules and weights (nothing copied) but has its own
        confidence calibration (:meth:`set_confidence_temperatures`), e.g. one fitted on the
        workload an engine serves; this drafter's calibration is left as it is."""
        import copy

        twin = copy.copy(self)
        twin._buffers = dict(self._buffers)  # its own buffer table; modules and parameters stay shared
        twin.confidence_temperatures = self.confidence_temperatures.clone()
        twin.confidence_biases = self.confidence_biases.clone()
        twin.confidence_max_prob_weights = self.confidence_max_prob_weights.clone()
        twin.confidence_top_gap_weights = self.confidence_top_gap_weights.clone()
        twin.set_confidence_temperatures(temperatures, biases, max_prob_weights, top_gap_weights)
        return twin

    def _finite_per_slot(self, what: str, values) -> list[float]:
        """One finite float per slot (zeros when ``values`` is None), or ConfigError naming ``what``."""
        if values is None:
            return [0.0] * self.block_size
        try:
            out = [float(v) for v in values]
        except (TypeError, ValueError):
            raise ConfigError(f"{what}: need a list of {self.block_size} finite numbers (one per slot), "
                              f"got {values!r}") from None
        if len(out) != self.block_size:
            raise ConfigError(f"{what}: got {len(out)} values, need one per slot "
                              f"(drafter.block_size = {self.block_size})")
        if not all(abs(v) < float("inf") for v in out):
            raise ConfigError(f"{what} must be finite, got {out}")
        return out

    def set_confidence_temperatures(self, temperatures, biases=None, max_prob_weights=None,
                                    top_gap_weights=None) -> None:
        """Set the per-slot calibration: temperatures (finite, > 0), biases (finite; None: zeros, i.e. STS),
        max-probability weights (finite; None: no max-probability term) and top-gap weights (finite; None: no
        gap term). A calibration weighs one of the two scores at most (ConfigError for both).

        Written in place into the existing buffers, so a CUDA graph captured earlier sees the new values.
        Whether the calibration weighs the max probability (:attr:`confidence_uses_max_prob`) or the top gap
        (:attr:`confidence_uses_top_gap`) decides what a draft stage computes, so an engine's captured draft graphs
        hold the answer of when they were captured: switching it (weights to None or back) needs graphs captured
        again; changing values does not.
        """
        temps = [float(t) for t in temperatures]
        if len(temps) != self.block_size:
            raise ConfigError(f"confidence temperatures: got {len(temps)} values, need one per slot "
                              f"(drafter.block_size = {self.block_size})")
        if not all(t > 0 and t == t and t != float("inf") for t in temps):
            raise ConfigError(f"confidence temperatures must be finite and > 0, got {temps}")
        bias_values = self._finite_per_slot("confidence biases", biases)
        weight_values = self._finite_per_slot("confidence max_prob_weights", max_prob_weights)
        gap_values = self._finite_per_slot("confidence top_gap_weights", top_gap_weights)
        if max_prob_weights is not None and top_gap_weights is not None:
            raise ConfigError("a confidence calibration weighs one drafter score at most: max_prob_weights "
                              "(sts_max_prob) or top_gap_weights (sts_top_gap), not both")
        self.confidence_uses_max_prob = max_prob_weights is not None
        self.confidence_uses_top_gap = top_gap_weights is not None
        for name, values in (("confidence_temperatures", temps), ("confidence_biases", bias_values),
                             ("confidence_max_prob_weights", weight_values),
                             ("confidence_top_gap_weights", gap_values)):
            buf = getattr(self, name)
            new = torch.tensor(values, dtype=torch.float32)
            if buf.is_inference() and not torch.is_inference_mode_enabled():
                setattr(self, name, new.to(buf.device))  # an inference tensor cannot be written outside inference mode
            else:
                with torch.no_grad():
                    buf.copy_(new)

    # ------------------------------------------------------------------ training

    def forward_train(self, target_hidden_cat: torch.Tensor, input_ids: torch.Tensor, anchor_positions: torch.Tensor,
                      embed_fn: EmbedFn, lm_head_weight: torch.Tensor, block_targets: torch.Tensor,
                      anchors_checked: bool = False, conf_stop_grad: bool = False) -> TrainOutput:
        """Dense training forward for A blocks per sequence.

        target_hidden_cat [N, S, n*d]; input_ids int64 [N, S]; anchor_positions int64 [N, A] in
        [0, S); block_targets int64 [N, A, gamma] = tokens at anchor+1..anchor+gamma. A block at
        anchor a sees context positions 0..a-1 of its own sequence and its own gamma slots
        (rotary positions a..a+gamma-1). Teacher forcing: the Markov/confidence features of slot k
        use the true token at a+k (input_ids[a] for k=0, block_targets[k-1] after). Negative
        block_targets (padding past the sequence end) are looked up as token 0 for those
        features; the slots after them have padded targets too and must carry no loss.
        ``anchors_checked``: the caller has checked that the anchors lie in [0, S) (:func:`check_anchor_range` on
        the host copy), so the check here, which reads device anchors back and stalls the host, is skipped.
        ``conf_stop_grad``: the confidence head reads h_k and W1[x_{k-1}] detached (:meth:`confidence_logits`), so
        a loss on the confidence logits reaches neither the backbone nor the Markov head.
        """
        hidden = self.block_hidden(target_hidden_cat, input_ids, anchor_positions, embed_fn, anchors_checked)
        n_seq, n_anchor, gamma, d = hidden.shape
        if block_targets.shape != (n_seq, n_anchor, gamma):
            raise ValueError(f"block_targets has shape {tuple(block_targets.shape)}, expected "
                             f"{(n_seq, n_anchor, gamma)} = [N, A, block_size]")
        anchor_ids = input_ids.long().gather(1, anchor_positions.long())  # [N, A]
        prev_tokens = torch.cat((anchor_ids[..., None], block_targets[..., : gamma - 1].long()), dim=-1).clamp_min(0)
        rows = n_seq * n_anchor
        flat_hidden = hidden.reshape(rows, gamma, d)
        flat_prev = prev_tokens.reshape(rows, gamma)
        base = self._base_logits(flat_hidden, lm_head_weight)  # [N*A, gamma, V]
        state = self.markov_head.initial_state(rows, flat_hidden) if self.markov_head is not None else None
        logits_all = []
        for k in range(gamma):
            logits, state = self._slot_logits(flat_hidden[:, k], base[:, k], flat_prev[:, k], state)
            logits_all.append(logits)
        logits = torch.stack(logits_all, dim=1).view(n_seq, n_anchor, gamma, -1)
        confidence = (self.confidence_logits(flat_hidden, flat_prev, stop_grad=conf_stop_grad)
                      .view(n_seq, n_anchor, gamma)
                      if self.confidence_head is not None else None)
        return TrainOutput(logits, confidence, hidden)

    def block_hidden(self, target_hidden_cat: torch.Tensor, input_ids: torch.Tensor, anchor_positions: torch.Tensor,
                     embed_fn: EmbedFn, anchors_checked: bool = False) -> torch.Tensor:
        """The backbone's output (final norm applied) for a block at each anchor, densely: [N, A, gamma, d] from
        target_hidden_cat [N, S, n*d], input_ids int64 [N, S] and anchor_positions int64 [N, A] in [0, S); what
        :meth:`forward_train` reads its logits from and drafting (:meth:`draft`) starts from. A block at anchor a
        sees context positions 0..a-1 of its own sequence and its own gamma slots (rotary positions a..a+gamma-1).
        ``anchors_checked``: as in :meth:`forward_train`."""
        n_seq, seq_len, _ = target_hidden_cat.shape
        gamma, d = self.block_size, self.hidden_size
        n_anchor = anchor_positions.shape[1]
        if input_ids.shape != (n_seq, seq_len):
            raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}, expected {(n_seq, seq_len)} "
                             f"to match target_hidden_cat [N, S, n*d]")
        if anchor_positions.shape[0] != n_seq:
            raise ValueError(f"anchor_positions has {anchor_positions.shape[0]} rows, expected N = {n_seq}")
        anchors = anchor_positions.long()
        if not anchors_checked:
            check_anchor_range(anchors, seq_len)
        dev = target_hidden_cat.device
        ctx = self._context_states(target_hidden_cat)  # [N, S, d]
        ctx_positions = torch.arange(seq_len, device=dev).expand(n_seq, seq_len)
        offsets = torch.arange(gamma, device=dev)
        block_positions = (anchors[:, :, None] + offsets).reshape(n_seq, n_anchor * gamma)
        anchor_ids = input_ids.long().gather(1, anchors)  # [N, A]
        x = self._block_inputs(anchor_ids, embed_fn).reshape(n_seq, n_anchor * gamma, d)

        # Visibility: block rows of anchor a see context j < a, and every slot of their own block.
        ctx_visible = torch.arange(seq_len, device=dev)[None, None, :] < anchors[:, :, None]  # [N, A, S]
        ctx_visible = ctx_visible.repeat_interleave(gamma, dim=1)  # [N, A*gamma, S]
        block_of_row = torch.arange(n_anchor, device=dev).repeat_interleave(gamma)  # [A*gamma]
        same_block = (block_of_row[:, None] == block_of_row[None, :]).expand(n_seq, -1, -1)
        visible = torch.cat((ctx_visible, same_block), dim=-1)  # [N, A*gamma, S + A*gamma]

        for layer in self.layers:
            ctx_k, ctx_v = layer.self_attn.project_kv(ctx, ctx_positions)
            x = layer.forward_dense(x, block_positions, ctx_k, ctx_v, visible)
        return self.norm(x).view(n_seq, n_anchor, gamma, d)

    # ------------------------------------------------------------------ checkpoint

    def save(self, directory: str | Path, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
        """Write config.json, the drafter's own weights (sharded above max_shard_bytes) and temperatures.json."""
        if max_shard_bytes < 1:
            raise ValueError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        target = self.target_cfg.to_dict()
        config = {"target": {k: target[k] for k in TARGET_COMPAT_KEYS}, "drafter": self.cfg.to_dict()}
        (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")

        stale_files = [out / WEIGHTS_FILE, out / INDEX_FILE, out / TEMPERATURES_FILE,
                       *out.glob("model-*-of-*.safetensors"), *out.glob(f"model-*-of-*.safetensors{PACKED_SUFFIX}")]
        for stale in stale_files:
            stale.unlink(missing_ok=True)
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.state_dict().items()}
        shards: list[dict[str, torch.Tensor]] = [{}]
        shard_bytes = 0
        for name, tensor in state.items():
            size = tensor.numel() * tensor.element_size()
            if shards[-1] and shard_bytes + size > max_shard_bytes:
                shards.append({})
                shard_bytes = 0
            shards[-1][name] = tensor
            shard_bytes += size
        if len(shards) == 1:
            save_file(shards[0], str(out / WEIGHTS_FILE))
        else:
            weight_map = {}
            for i, shard in enumerate(shards):
                fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(out / fname))
                weight_map.update({name: fname for name in shard})
            total = sum(t.numel() * t.element_size() for t in state.values())
            # Each shard's size and sha256, checked by load(): a truncated or altered shard is named.
            files = {fname: {"size": (out / fname).stat().st_size, "sha256": file_sha256(out / fname)}
                     for fname in sorted(set(weight_map.values()))}
            index = {"metadata": {"total_size": total, "files": files}, "weight_map": weight_map}
            (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        temps, biases, weights, gap_weights = self.calibration_values()
        scored = weights is not None or gap_weights is not None
        if any(t != 1.0 for t in temps) or any(b != 0.0 for b in biases) or scored:
            from dspark.training.calibration import save_temperatures

            save_temperatures(out, temps, biases=biases if any(b != 0.0 for b in biases) or scored else None,
                              max_prob_weights=weights, top_gap_weights=gap_weights)
        return out

    @classmethod
    def load(cls, directory: str | Path, target_cfg: ModelConfig, device: str | torch.device = "cpu",
             dtype: torch.dtype = torch.float32) -> "DSparkDrafter":
        """Load a checkpoint written by :meth:`save` for a compatible target; strict on weight names.

        A sharded checkpoint's index records each shard's size and sha256 (``metadata.files``); every
        shard is checked against them before it is read (hashing the shipped 22 MB drafter takes
        ~20 ms). A shard may be stored xz-compressed (:func:`compress_shards`, ``<shard>.xz``): it is
        decompressed in memory (about 0.3 s for the shipped drafter) and the same record is checked on
        the decompressed bytes. A shard that differs, or any weights file that is not readable safetensors, raises
        :class:`~dspark.models.loading.DamagedFileError` naming the file and how to restore it.
        """
        src = Path(directory)
        config_path = src / CONFIG_FILE
        if not config_path.is_file():
            raise FileNotFoundError(f"drafter checkpoint {src}: no {CONFIG_FILE}; point to a folder written by "
                                    f"DSparkDrafter.save")
        config = _read_checkpoint_json(config_path)
        if "target" not in config or "drafter" not in config:
            raise ConfigError(f"drafter checkpoint {config_path}: needs keys 'target' and 'drafter', "
                              f"found {sorted(config)}")
        target = target_cfg.to_dict()
        for key, saved in config["target"].items():
            if key not in target:
                raise ConfigError(f"drafter checkpoint {config_path}: unknown target field {key!r}")
            if saved != target[key]:
                raise ConfigError(f"drafter checkpoint {src} was trained for a target with {key} = {saved!r}, "
                                  f"but this target has model.{key} = {target[key]!r}; use a drafter trained "
                                  f"for this target")
        model = cls(target_cfg, DrafterConfig.from_dict(config["drafter"]))

        index_path = src / INDEX_FILE
        if index_path.is_file():
            index = _read_checkpoint_json(index_path)
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ConfigError(f"drafter checkpoint {index_path}: 'weight_map' is missing or empty. "
                                  f"{restore_hint(index_path)}")
            recorded = (index.get("metadata") or {}).get("files") or {}
            state: dict[str, torch.Tensor] = {}
            for fname in sorted(set(weight_map.values())):
                shard, packed = src / fname, src / (fname + PACKED_SUFFIX)
                if shard.is_file():
                    _check_recorded(shard, recorded.get(fname))
                    state.update(read_safetensors(shard, restore_hint(shard)))
                elif packed.is_file():
                    state.update(_read_packed_shard(packed, recorded.get(fname)))
                else:
                    raise FileNotFoundError(f"drafter checkpoint {src}: shard {fname} listed in {INDEX_FILE} is "
                                            f"missing (neither {fname} nor {packed.name}). {restore_hint(shard)}")
        elif (src / WEIGHTS_FILE).is_file():
            state = read_safetensors(src / WEIGHTS_FILE, restore_hint(src / WEIGHTS_FILE))
        else:
            raise FileNotFoundError(f"drafter checkpoint {src}: neither {WEIGHTS_FILE} nor {INDEX_FILE} found")
        expected = set(model.state_dict())
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or unexpected:
            raise ConfigError(f"drafter checkpoint {src} does not match drafter config {config['drafter']}: "
                              f"missing weights {missing}, unexpected weights {unexpected}")
        model.load_state_dict(state, strict=True)
        model.to(device=device, dtype=dtype)

        temps_path = src / TEMPERATURES_FILE
        if temps_path.is_file():
            from dspark.training.calibration import load_calibration

            try:
                model.set_confidence_temperatures(*load_calibration(src, model.block_size).as_lists())
            except (ConfigError, ValueError) as err:
                raise ConfigError(f"{temps_path}: {err}") from None
        from dspark.models.provenance import drafter_record

        model.origin = drafter_record(src)
        return model


def shard_xz_filters(preset: int) -> list[dict[str, int]]:
    """The xz filter chain for a weight shard: LZMA2 at ``preset`` with its literal and match positions taken
    modulo 4 bytes (lp=2, pb=2) and two literal context bits (lc=2), so that the coder models each byte of a
    2- or 4-byte element (bf16, fp32) by its place in the element: about 5% smaller than the preset alone on the
    shipped drafter's bf16 shards. A standard xz stream; any xz reader decompresses it."""
    return [{"id": lzma.FILTER_LZMA2, "preset": preset, "lc": 2, "lp": 2, "pb": 2}]


def compress_shards(directory: str | Path, preset: int = 9 | lzma.PRESET_EXTREME) -> list[Path]:
    """Replace every shard a sharded checkpoint's index lists by an xz-compressed copy (``<shard>.xz``,
    Python's ``lzma`` with :func:`shard_xz_filters`), each checked to decompress to the shard's exact bytes
    before the shard is removed. The index is unchanged: it records the shards' own sizes and sha256, which
    :meth:`DSparkDrafter.load` checks after decompressing. The shipped drafter is stored this way (bf16 weights
    compress to about 67%). Returns the compressed files."""
    src = Path(directory)
    index_path = src / INDEX_FILE
    if not index_path.is_file():
        raise FileNotFoundError(f"compress_shards: {src} has no {INDEX_FILE} (save the checkpoint sharded: "
                                f"DSparkDrafter.save(..., max_shard_bytes=...))")
    weight_map = _read_checkpoint_json(index_path).get("weight_map") or {}
    written = []
    for fname in sorted(set(weight_map.values())):
        shard, packed = src / fname, src / (fname + PACKED_SUFFIX)
        if not shard.is_file():
            if packed.is_file():
                continue  # compressed already
            raise FileNotFoundError(f"compress_shards: shard {shard} listed in {INDEX_FILE} is missing")
        raw = shard.read_bytes()
        data = lzma.compress(raw, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, filters=shard_xz_filters(preset))
        if lzma.decompress(data) != raw:
            raise RuntimeError(f"compress_shards: {shard} does not survive compression; left as it is")
        tmp = packed.with_name(packed.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(packed)
        shard.unlink()
        written.append(packed)
    return written


def _read_packed_shard(packed: Path, want: dict | None) -> dict[str, torch.Tensor]:
    """The tensors of an xz-compressed shard, its decompressed bytes checked against the index's record."""
    from safetensors import SafetensorError
    from safetensors.torch import load as load_bytes

    hint = restore_hint(packed)
    try:
        raw = lzma.decompress(packed.read_bytes())
    except lzma.LZMAError as exc:
        raise DamagedFileError(f"drafter checkpoint shard {packed}: not a readable xz file ({exc}; "
                               f"{packed.stat().st_size} bytes): it is truncated or corrupt. {hint}") from None
    if isinstance(want, dict):
        if "size" in want and len(raw) != want["size"]:
            raise DamagedFileError(f"drafter checkpoint shard {packed} decompresses to {len(raw)} bytes but its index "
                                   f"records {want['size']} bytes: it was overwritten. {hint}")
        if "sha256" in want and hashlib.sha256(raw).hexdigest() != want["sha256"]:
            raise DamagedFileError(f"drafter checkpoint shard {packed}: its decompressed sha256 differs from the one "
                                   f"its index records ({want['sha256']}): the file is corrupt. {hint}")
    try:
        return load_bytes(raw)
    except (SafetensorError, ValueError) as exc:
        raise DamagedFileError(f"drafter checkpoint shard {packed}: not readable safetensors after decompressing "
                               f"({type(exc).__name__}: {exc}). {hint}") from None


def restore_hint(path: Path) -> str:
    """How to get an intact copy of a drafter checkpoint file back."""
    path = Path(path).resolve()
    if ASSETS_DIR in path.parents:
        repo = next((p for p in path.parents if (p / ".git").exists()), None)
        if repo is not None:
            return (f"It ships with the repository: restore it with "
                    f"`git -C {repo} checkout -- {path.relative_to(repo)}`")
        return "It ships with dspark-bench: reinstall the package to restore it"
    return ("Restore it from where this checkpoint came from (copy it again, or re-run the training that "
            "wrote it)")


def _read_checkpoint_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"drafter checkpoint {path}: not valid JSON ({exc}); the file is truncated or corrupt. "
                          f"{restore_hint(path)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"drafter checkpoint {path}: expected a JSON object, got {type(data).__name__}. "
                          f"{restore_hint(path)}")
    return data


def _check_recorded(shard: Path, want: dict | None) -> None:
    """Refuse a shard whose size or sha256 differs from what the index recorded (nothing recorded: no check)."""
    if not isinstance(want, dict):
        return
    size = shard.stat().st_size
    if "size" in want and size != want["size"]:
        raise DamagedFileError(f"drafter checkpoint shard {shard} is {size} bytes but its index records "
                               f"{want['size']} bytes (sha256 {want.get('sha256')}): it is truncated or was "
                               f"overwritten. {restore_hint(shard)}")
    if "sha256" in want and file_sha256(shard) != want["sha256"]:
        raise DamagedFileError(f"drafter checkpoint shard {shard}: its sha256 differs from the one its index "
                               f"records ({want['sha256']}, {size} bytes): the file is corrupt. {restore_hint(shard)}")


__all__ = ["DSparkDrafter", "DraftOutput", "TrainOutput", "MarkovHead", "TARGET_COMPAT_KEYS", "check_anchor_range",
           "compress_shards"]
