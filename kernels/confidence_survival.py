"""A drafted block's confidence and survival: the confidence head, its calibration and the prefix product.

Slot k of row r has the drafter's hidden state ``h[r, k]`` and the token before it, ``x_{k-1}`` (the anchor
for k = 0, then the block's drawn tokens). The head is one linear unit over ``[h, W1[x_{k-1}]]`` (the Markov
head's embedding of that token; the hidden state alone without one), computed in the head's dtype, so its raw
logit is ``z = round_to_dtype(w . feats + b)``. The survival the planner reads is

    c_k = sigmoid(z_k / T_k + b_k + w_k * logit(p_k) + v_k * g_k + o_k)
    survival_k = c_1 * ... * c_k    (0 on inactive rows)

with the calibration's temperatures T and biases b, an engine's online offsets o, for the sts_max_prob
calibration its weights w on the logit of the drafter's top-token probability p_k at each slot (p clamped to
[1e-6, 1 - 1e-6]), and for the sts_top_gap calibration its weights v on the gap g_k between the drafter's two
largest logits at each slot (each term is absent where its calibration is not in use):
``dspark.survival.calibrated_confidence`` and ``prefix_survival``, which the reference calls.

:func:`confidence_survival_reference` is the specification in PyTorch: a gather, a concatenation, the linear
layer, then the elementwise calibration, a cumulative product and a mask, about fifteen launches per step.
:func:`confidence_survival_triton` is one launch: a program per row walks the slots, takes each slot's dot
product in fp32 (the head has one output: a reduction over d + r inputs), rounds it to the head's dtype as the
layer's output is, and carries the product. Its raw logits are the layer's value reduced in fp32 and rounded
once to the head's dtype, up to the order of that reduction (one unit in the last place, rarely); cuBLAS's own
bf16 layer may reduce in bf16 (torch's ``allow_bf16_reduced_precision_reduction``) and lie a few units away. The
survival follows from the logits by the same formula. It steers which drafts are verified, never which tokens
are emitted.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

try:  # Triton is optional at import time: the torch reference is the specification.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only on machines without triton
    triton = None
    tl = None


class BlockConfidence(NamedTuple):
    logits: torch.Tensor  # float32 [R, G]: the head's raw z (its dtype's values, widened)
    survival: torch.Tensor  # float32 [R, G]: the calibrated prefix survival, 0 on inactive rows


def _check(hidden, anchor, tokens, embedding, head_weight, head_bias, temperatures, biases, offsets, active,
           max_prob=None, max_prob_weights=None, top_gap=None, top_gap_weights=None) -> None:
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be [R, G, d], got shape {tuple(hidden.shape)}")
    R, G, d = hidden.shape
    if anchor.shape != (R,) or tokens.shape != (R, G) or anchor.dtype != torch.int64 or tokens.dtype != torch.int64:
        raise ValueError(f"anchor must be int64 [{R}] and tokens int64 [{R}, {G}], got {anchor.dtype} "
                         f"{tuple(anchor.shape)} and {tokens.dtype} {tuple(tokens.shape)}")
    rank = 0 if embedding is None else embedding.shape[1]
    if head_weight.shape != (1, d + rank) or head_bias is None or head_bias.shape != (1,):
        raise ValueError(f"the head must be one linear unit over {d} + {rank} inputs with a bias, got weight "
                         f"{tuple(head_weight.shape)} and bias {None if head_bias is None else tuple(head_bias.shape)}")
    for name, t in (("temperatures", temperatures), ("biases", biases), ("offsets", offsets)):
        if t is not None and t.shape != (G,):
            raise ValueError(f"{name} must be [{G}] (one per slot), got shape {tuple(t.shape)}")
    if active.shape != (R,) or active.dtype != torch.bool:
        raise ValueError(f"active must be bool [{R}], got {active.dtype} {tuple(active.shape)}")
    if (max_prob is None) != (max_prob_weights is None):
        raise ValueError("max_prob and max_prob_weights come together (an sts_max_prob calibration) or not at all")
    if (top_gap is None) != (top_gap_weights is None):
        raise ValueError("top_gap and top_gap_weights come together (an sts_top_gap calibration) or not at all")
    for name, score, weights in (("max_prob", max_prob, max_prob_weights), ("top_gap", top_gap, top_gap_weights)):
        if score is None:
            continue
        if score.shape != (R, G) or score.dtype != torch.float32 or score.stride(-1) != 1:
            raise ValueError(f"{name} must be float32 [{R}, {G}] with a unit last stride, got {score.dtype} "
                             f"{tuple(score.shape)} strides {score.stride()}")
        if weights.shape != (G,):
            raise ValueError(f"{name}_weights must be [{G}] (one per slot), got shape {tuple(weights.shape)}")


def confidence_survival_reference(*, hidden: torch.Tensor, anchor: torch.Tensor, tokens: torch.Tensor,
                                  embedding: torch.Tensor | None, head_weight: torch.Tensor, head_bias: torch.Tensor,
                                  temperatures: torch.Tensor, biases: torch.Tensor, offsets: torch.Tensor | None,
                                  active: torch.Tensor, max_prob: torch.Tensor | None = None,
                                  max_prob_weights: torch.Tensor | None = None, top_gap: torch.Tensor | None = None,
                                  top_gap_weights: torch.Tensor | None = None) -> BlockConfidence:
    """The specification (module docstring). hidden [R, G, d] and the weights in the head's dtype; anchor int64
    [R]; tokens int64 [R, G] (the block); embedding: the Markov head's W1 [V, r] or None; temperatures, biases,
    offsets float32 [G] (offsets may be None); active bool [R]; max_prob float32 [R, G] and max_prob_weights
    float32 [G] for an sts_max_prob calibration, top_gap float32 [R, G] and top_gap_weights float32 [G] for an
    sts_top_gap calibration (None otherwise)."""
    _check(hidden, anchor, tokens, embedding, head_weight, head_bias, temperatures, biases, offsets, active,
           max_prob, max_prob_weights, top_gap, top_gap_weights)
    G = hidden.shape[1]
    feats = hidden
    if embedding is not None:
        before = torch.cat((anchor[:, None], tokens[:, : G - 1]), dim=1)
        feats = torch.cat((hidden, F.embedding(before, embedding)), dim=-1)
    z = F.linear(feats, head_weight, head_bias).float().squeeze(-1)
    from dspark.survival import calibrated_confidence, prefix_survival  # the engine's own calibration and product

    survival = prefix_survival(calibrated_confidence(z, temperatures, biases, max_prob, max_prob_weights, offsets,
                                                     top_gap, top_gap_weights))
    return BlockConfidence(z, torch.where(active[:, None], survival, 0.0))


if triton is not None:

    @triton.jit
    def _confidence_survival_kernel(h_ptr, h_sr, h_sk, anchor_ptr, tok_ptr, tok_sr, emb_ptr, emb_sr, w_ptr, hb_ptr,
                                    temp_ptr, bias_ptr, off_ptr, act_ptr, mp_ptr, mp_sr, mpw_ptr, mp_eps, gap_ptr,
                                    gap_sr, gapw_ptr, z_ptr, z_sr, s_ptr, s_sr, G, D, RANK, HAS_EMB: tl.constexpr,
                                    HAS_OFF: tl.constexpr, HAS_MP: tl.constexpr, HAS_GAP: tl.constexpr,
                                    BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr):
        r = tl.program_id(0)
        active = tl.load(act_ptr + r) != 0
        dd = tl.arange(0, BLOCK_D)
        w_h = tl.load(w_ptr + dd, mask=dd < D, other=0.0).to(tl.float32)
        ee = tl.arange(0, BLOCK_E)
        if HAS_EMB:
            w_e = tl.load(w_ptr + D + ee, mask=ee < RANK, other=0.0).to(tl.float32)
        head_bias = tl.load(hb_ptr).to(tl.float32)
        prev = tl.load(anchor_ptr + r)
        survival = 1.0
        for k in range(G):
            h = tl.load(h_ptr + r * h_sr + k * h_sk + dd, mask=dd < D, other=0.0).to(tl.float32)
            acc = tl.sum(h * w_h, axis=0)
            if HAS_EMB:
                e = tl.load(emb_ptr + prev * emb_sr + ee, mask=ee < RANK, other=0.0).to(tl.float32)
                acc += tl.sum(e * w_e, axis=0)
            z = (acc + head_bias).to(w_ptr.dtype.element_ty).to(tl.float32)  # the layer's output dtype
            x = z / tl.load(temp_ptr + k) + tl.load(bias_ptr + k)
            if HAS_MP:  # sts_max_prob: w_k * logit(p_k), p clamped as dspark.survival.max_prob_logit does
                p = tl.minimum(tl.maximum(tl.load(mp_ptr + r * mp_sr + k), mp_eps), 1.0 - mp_eps)
                x = x + tl.load(mpw_ptr + k) * tl.log(p / (1.0 - p))
            if HAS_GAP:  # sts_top_gap: v_k * g_k
                x = x + tl.load(gapw_ptr + k) * tl.load(gap_ptr + r * gap_sr + k)
            if HAS_OFF:
                x = x + tl.load(off_ptr + k)
            survival = survival * (1.0 / (1.0 + tl.exp(-x)))
            tl.store(z_ptr + r * z_sr + k, z)
            tl.store(s_ptr + r * s_sr + k, tl.where(active, survival, 0.0))
            prev = tl.load(tok_ptr + r * tok_sr + k)


def confidence_survival_triton(*, hidden: torch.Tensor, anchor: torch.Tensor, tokens: torch.Tensor,
                               embedding: torch.Tensor | None, head_weight: torch.Tensor, head_bias: torch.Tensor,
                               temperatures: torch.Tensor, biases: torch.Tensor, offsets: torch.Tensor | None,
                               active: torch.Tensor, out: BlockConfidence, max_prob: torch.Tensor | None = None,
                               max_prob_weights: torch.Tensor | None = None, top_gap: torch.Tensor | None = None,
                               top_gap_weights: torch.Tensor | None = None) -> BlockConfidence:
    """One launch computing :func:`confidence_survival_reference`'s values into ``out`` (float32 [R, G] each,
    unit stride on the last dim, e.g. rows of persistent buffers); returns ``out``. Capture-safe."""
    _check(hidden, anchor, tokens, embedding, head_weight, head_bias, temperatures, biases, offsets, active,
           max_prob, max_prob_weights, top_gap, top_gap_weights)
    if triton is None:
        raise RuntimeError("the fused confidence kernel needs the triton package: install it, or set "
                           "engine.kernels.fused_confidence=false")
    R, G, D = hidden.shape
    for name, t in (("out.logits", out.logits), ("out.survival", out.survival)):
        if t.shape != (R, G) or t.dtype != torch.float32 or t.stride(-1) != 1:
            raise ValueError(f"{name} must be float32 [{R}, {G}] with a unit last stride, got {t.dtype} "
                             f"{tuple(t.shape)} strides {t.stride()}")
    for name, t in (("hidden", hidden), ("tokens", tokens), ("embedding", embedding), ("head_weight", head_weight)):
        if t is not None and t.stride(-1) != 1:
            raise ValueError(f"{name} needs a unit stride on its last dim, got strides {t.stride()}")
    rank = 0 if embedding is None else embedding.shape[1]
    weight = head_weight.reshape(-1)
    has_mp = max_prob is not None
    has_gap = top_gap is not None
    from dspark.survival import MAX_PROB_EPS

    _confidence_survival_kernel[(R,)](
        hidden, hidden.stride(0), hidden.stride(1), anchor, tokens, tokens.stride(0),
        embedding if embedding is not None else weight, embedding.stride(0) if embedding is not None else 0,
        weight, head_bias, temperatures, biases, offsets if offsets is not None else temperatures, active,
        max_prob if has_mp else temperatures, max_prob.stride(0) if has_mp else 0,
        max_prob_weights if has_mp else temperatures, MAX_PROB_EPS,
        top_gap if has_gap else temperatures, top_gap.stride(0) if has_gap else 0,
        top_gap_weights if has_gap else temperatures,
        out.logits, out.logits.stride(0), out.survival, out.survival.stride(0), G, D, rank,
        HAS_EMB=embedding is not None, HAS_OFF=offsets is not None, HAS_MP=has_mp, HAS_GAP=has_gap,
        BLOCK_D=triton.next_power_of_2(D),
        BLOCK_E=triton.next_power_of_2(max(rank, 1)))
    return out


__all__ = ["BlockConfidence", "confidence_survival_reference", "confidence_survival_triton"]
