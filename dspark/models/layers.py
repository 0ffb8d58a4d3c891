"""Building blocks shared by the target model and the DSpark drafter.

Parameter names follow Hugging Face Llama/Qwen (``q_proj``, ``gate_proj``,
``input_layernorm`` ...) so checkpoints load by their HF names. Rotary embeddings use
the HF convention: the head dimension is split into two halves that rotate together
(``rotate_half``), not interleaved pairs.

Attention modules work in two modes:

- paged (:meth:`PagedSelfAttention.forward`): packed tokens of several requests, K/V
  written into one layer of the paged cache, then :func:`dspark.attention.attend`;
- dense (:meth:`PagedSelfAttention.forward_dense`): batched queries against explicit
  K/V and a boolean visibility mask, used by the drafter's training forward.

Both share :meth:`PagedSelfAttention.project_qkv`, so they compute the same function.

Which kernels a paged forward runs comes from the engine's :class:`dspark.config.KernelConfig`
in the step's metadata (``meta.kernels``); modules called without metadata (an RMSNorm given no
``kernels``, the dense training forward) run the plain PyTorch code.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dspark.attention import AttentionMetadata, attend, write_kv
from dspark.config import KernelConfig, ModelConfig
from dspark.models.row_invariant import row_tiled_linear


def use_fused_kernels(kernels: KernelConfig | None) -> bool:
    """Inference on the Triton backend runs the fused layer kernels (kernels/rmsnorm.py,
    rotary.py, silu_mul.py) and fused QKV / gate-up projections; training (autograd on) and
    the torch backend run the plain modules, which are the kernels' references.
    ``engine.kernels.fused_layers=false`` turns the fusion off (to measure what it buys)."""
    return (kernels is not None and kernels.attention_backend == "triton" and kernels.fused_layers
            and not torch.is_grad_enabled())


def use_small_m_kernels(x: torch.Tensor, kernels: KernelConfig) -> bool:
    """Decode-sized steps (at most kernels.small_m_linear.SMALL_M_MAX packed tokens) run the layers'
    GEMMs as Triton GEMV kernels with the norms and SwiGLU fused in (fused kernels on, 2-D input),
    and so does every step in the batch-invariant mode (every row count, so that no row's result
    depends on the step's size). ``engine.kernels.small_m_kernels=false`` keeps cuBLAS for them."""
    from kernels.small_m_linear import SMALL_M_MAX

    if x.dim() != 2 or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if kernels.batch_invariant:
        return True
    return kernels.small_m_kernels and x.shape[0] <= SMALL_M_MAX


def use_row_invariant(kernels: KernelConfig | None) -> bool:
    """The plain-PyTorch backend's batch-invariant mode (``engine.batch_invariant=true`` with
    ``engine.attention_backend=torch``): GEMMs on fixed row tiles and attention row by row
    (:mod:`dspark.models.row_invariant`)."""
    return kernels is not None and kernels.batch_invariant and kernels.attention_backend == "torch"


def project(linear: nn.Linear, x: torch.Tensor, kernels: KernelConfig | None = None) -> torch.Tensor:
    """``linear(x)``, on row tiles in the plain backend's batch-invariant mode."""
    if use_row_invariant(kernels):
        return row_tiled_linear(x, linear.weight, linear.bias)
    return linear(x)


def l2_prefetch_applies(kernels: KernelConfig, device: torch.device) -> bool:
    """Whether decode-sized steps on ``device`` read the next layer's weights into L2 on a side
    stream (``engine.kernels.l2_prefetch``, experimental; CUDA only, kernels/l2_prefetch.py)."""
    if not kernels.l2_prefetch:  # the default path's one check
        return False
    from kernels.l2_prefetch import prefetch_runs

    return (kernels.attention_backend == "triton" and kernels.fused_layers and kernels.small_m_kernels
            and not kernels.batch_invariant and prefetch_runs(device))


def kernel_set(kernels: KernelConfig, device: torch.device | str) -> str:
    """Which kernels an engine with ``kernels`` runs on ``device``, as one string (``torch``, or the
    Triton kernels in effect: fused norms/projections, small-M GEMV or the batch-invariant mode, fused
    QKV + rotary epilogue, a tile table's hash, the graph steps' argmax and metadata kernels, the L2
    prefetch). Cost tables and benchmark outputs record it: a step's cost depends on it. (The decode
    megakernel is not in it: DSpark steps never run it, and runs count its steps.)"""
    if kernels.attention_backend != "triton":
        return kernels.attention_backend + ("+batch_invariant" if kernels.batch_invariant else "")
    dev = torch.device(device)
    parts = ["triton"]
    if kernels.fused_layers:
        parts.append("fused")
        if kernels.batch_invariant:
            parts.append("batch_invariant")
        elif kernels.small_m_kernels:
            parts.append("small_m")
        if kernels.fused_qkv_rope and (kernels.batch_invariant or kernels.small_m_kernels):
            parts.append("qkv_rope")
        if kernels.small_m_tiles:  # a device's tuned GEMV tiles (bench/small_m_sweep.py)
            import hashlib
            from pathlib import Path

            table = Path(kernels.small_m_tiles).read_bytes()
            parts.append("tiles:" + hashlib.sha256(table).hexdigest()[:10])
    from dspark.sampling import triton_argmax_enabled

    if triton_argmax_enabled(kernels, dev):  # dspark.sampling.greedy_argmax
        parts.append("argmax")
    if dev.type == "cuda" and kernels.fused_step_metadata:  # the graph steps' packing/commit
        parts.append("step_metadata")
    if l2_prefetch_applies(kernels, dev):
        parts.append("l2_prefetch")  # decode-sized steps read the next layer's weights into L2 (kernels/l2_prefetch.py)
    return "+".join(parts)


def _fused_weight(module: nn.Module, key: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(parts) cached on ``module``; rebuilt when any part is replaced or updated in place."""
    stamp = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in parts)
    cached = module.__dict__.get(key)
    if cached is None or cached[0] != stamp:
        cached = (stamp, torch.cat([t.detach() for t in parts], dim=0))
        module.__dict__[key] = cached
    return cached[1]


def _fused_linear(owner: nn.Module, key: str, x: torch.Tensor, projections: list[nn.Linear]) -> torch.Tensor:
    """One GEMM for several projections of x: their weights (and biases) concatenated and cached on ``owner``."""
    w = _fused_weight(owner, key + "_w", [p.weight for p in projections])
    b = _fused_weight(owner, key + "_b", [p.bias for p in projections]) if projections[0].bias is not None else None
    return F.linear(x, w, b)


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last axis; computed in float32, cast back to the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, kernels: KernelConfig | None = None) -> torch.Tensor:
        """``kernels``: the step's settings (``meta.kernels``); without them, the plain computation."""
        if use_fused_kernels(kernels) and x.shape[-1] == self.weight.shape[0]:
            from kernels.rmsnorm import rmsnorm_triton

            return rmsnorm_triton(x, self.weight, self.eps)[0]
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (self.weight.float() * x32).to(x.dtype)


def rotary_inv_freq(head_dim: int, theta: float, device: torch.device | str) -> torch.Tensor:
    """fp32 [head_dim/2] rotary frequencies 1 / theta^(2i/D)."""
    if head_dim % 2 != 0:
        raise ValueError(f"rotary head_dim must be even, got {head_dim}")
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                   dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for integer positions of any shape [...] -> two tensors [..., head_dim].

    Frequencies are computed in float32; the second half of the last axis repeats the first
    (HF ``rotate_half`` layout).
    """
    inv_freq = rotary_inv_freq(head_dim, theta, positions.device)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # [..., D/2]
    angles = torch.cat((angles, angles), dim=-1)  # [..., D]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., T, H, D] by cos/sin [..., T, D] (broadcast over heads); float32 math, input dtype out."""
    cos = cos.float().unsqueeze(-2)
    sin = sin.float().unsqueeze(-2)
    x32 = x.float()
    return (x32 * cos + _rotate_half(x32) * sin).to(x.dtype)


class SwiGLUMLP(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x)), no biases."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor, kernels: KernelConfig | None = None) -> torch.Tensor:
        """``kernels``: the step's settings (the plain backend's batch-invariant mode tiles the GEMMs)."""
        act = F.silu(project(self.gate_proj, x, kernels)) * project(self.up_proj, x, kernels)
        return project(self.down_proj, act, kernels)


class PagedSelfAttention(nn.Module):
    """Multi-head self-attention with grouped K/V heads and rotary positions.

    ``bias`` puts biases on q/k/v (Qwen2); ``qk_norm`` adds per-head RMSNorms ``q_norm`` /
    ``k_norm`` applied before rotary (Qwen3). Scale is 1/sqrt(head_dim).
    """

    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, bias: bool = False,
                 qk_norm: bool = False, eps: float = 1e-6, rope_theta: float = 10000.0):
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.rope_theta = float(rope_theta)
        self.scale = 1.0 / math.sqrt(head_dim)
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self._inv_freq: dict = {}  # device -> fp32 [D/2] rotary frequencies (fused path)

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> "PagedSelfAttention":
        return cls(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, bias=cfg.attention_bias,
                   qk_norm=cfg.qk_norm, eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta)

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary_cos_sin(positions, self.head_dim, self.rope_theta, torch.float32)

    def project_kv(self, x: torch.Tensor, positions: torch.Tensor, kernels: KernelConfig | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """K (normed, rotated) and V of x [..., T, hidden] at positions [..., T] -> [..., T, Hkv, D] each."""
        k = project(self.k_proj, x, kernels).unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = project(self.v_proj, x, kernels).unflatten(-1, (self.num_kv_heads, self.head_dim))
        if self.k_norm is not None:
            k = self.k_norm(k, kernels)
        cos, sin = self._rotary(positions)
        return apply_rotary(k, cos, sin), v

    def write_context_kv(self, x: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, meta: AttentionMetadata) -> None:
        """K/V of x [T, hidden] (no queries) written into the paged cache at meta.slot_mapping."""
        if use_fused_kernels(meta.kernels) and self.k_norm is None and x.dim() == 2:
            from kernels.rotary import rotary_kv_write_triton

            Hk, D = self.num_kv_heads, self.head_dim
            kv = _fused_linear(self, "_fused_kv", x, [self.k_proj, self.v_proj])
            rotary_kv_write_triton(None, kv[:, : Hk * D].unflatten(-1, (Hk, D)), kv[:, Hk * D:].unflatten(-1, (Hk, D)),
                                   positions, self._inv_freq_on(x.device), k_cache, v_cache, meta.slot_mapping)
            return
        k, v = self.project_kv(x, positions, meta.kernels)
        write_kv(k_cache, v_cache, k, v, meta)

    def project_qkv(self, x: torch.Tensor, positions: torch.Tensor, kernels: KernelConfig | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [..., T, H, D], k and v [..., T, Hkv, D] with norms and rotary applied."""
        q = project(self.q_proj, x, kernels).unflatten(-1, (self.num_heads, self.head_dim))
        if self.q_norm is not None:
            q = self.q_norm(q, kernels)
        cos, sin = self._rotary(positions)
        q = apply_rotary(q, cos, sin)
        k, v = self.project_kv(x, positions, kernels)
        return q, k, v

    def _inv_freq_on(self, device: torch.device) -> torch.Tensor:
        inv_freq = self._inv_freq.get(device)
        if inv_freq is None:
            inv_freq = self._inv_freq[device] = rotary_inv_freq(self.head_dim, self.rope_theta, device)
        return inv_freq

    def qkv_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The q/k/v projections' weights (and biases) concatenated, cached (see _fused_weight)."""
        parts = [self.q_proj, self.k_proj, self.v_proj]
        w = _fused_weight(self, "_fused_qkv_w", [p.weight for p in parts])
        b = _fused_weight(self, "_fused_qkv_b", [p.bias for p in parts]) if self.q_proj.bias is not None else None
        return w, b

    def attend_projected(self, qkv: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Attention from the fused q/k/v projection [T, (H + 2 Hk) D]: one kernel rotates q and k
        and writes k and v into the paged cache (kernels/rotary.py), then attention. -> [T, H * D]
        (before o_proj)."""
        from kernels.rotary import rotary_kv_write_triton

        H, Hk, D = self.num_heads, self.num_kv_heads, self.head_dim
        q = qkv[..., : H * D].unflatten(-1, (H, D))
        k = qkv[..., H * D: (H + Hk) * D].unflatten(-1, (Hk, D))
        v = qkv[..., (H + Hk) * D:].unflatten(-1, (Hk, D))
        q = rotary_kv_write_triton(q, k, v, positions, self._inv_freq_on(qkv.device), k_cache, v_cache,
                                   meta.slot_mapping)
        return attend(q, k_cache, v_cache, meta, self.scale).flatten(-2)  # [T, H * D]

    def _forward_fused(self, x: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """forward in four kernels before attention's: one GEMM for q/k/v, then the fused
        rotary + paged K/V write (:meth:`attend_projected`)."""
        w, b = self.qkv_weights()
        return self.o_proj(self.attend_projected(F.linear(x, w, b), positions, k_cache, v_cache, meta))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """x [T, hidden] packed tokens -> [T, hidden]; writes this step's K/V at meta.slot_mapping first."""
        if use_fused_kernels(meta.kernels) and self.q_norm is None and x.dim() == 2:
            return self._forward_fused(x, positions, k_cache, v_cache, meta)
        q, k, v = self.project_qkv(x, positions, meta.kernels)
        write_kv(k_cache, v_cache, k, v, meta)
        out = attend(q, k_cache, v_cache, meta, self.scale)  # [T, H, D]
        return project(self.o_proj, out.flatten(-2), meta.kernels)

    def forward_dense(self, x: torch.Tensor, positions: torch.Tensor, prefix_k: torch.Tensor | None,
                      prefix_v: torch.Tensor | None, visible: torch.Tensor | None) -> torch.Tensor:
        """Dense attention for batched queries.

        x [N, R, hidden] at positions [N, R]; keys are ``prefix_k`` [N, P, Hkv, D] (already
        rotated, e.g. injected context) followed by the R rows' own keys; ``visible`` is a
        bool mask [N, R, P + R] (True = may attend). Every row must see at least one key.
        ``visible=None`` (no prefix) is plain causal attention over the rows, computed without
        a mask tensor, so fused attention kernels apply on long sequences.
        """
        q, k, v = self.project_qkv(x, positions)
        if visible is None and prefix_k is not None:
            raise ValueError("visible=None is causal attention over the rows alone; a prefix needs a visible mask")
        if prefix_k is not None:
            k = torch.cat((prefix_k.to(k.dtype), k), dim=1)
            v = torch.cat((prefix_v.to(v.dtype), v), dim=1)
        if visible is not None and visible.shape != (x.shape[0], x.shape[1], k.shape[1]):
            raise ValueError(f"visible mask has shape {tuple(visible.shape)}, expected "
                             f"{(x.shape[0], x.shape[1], k.shape[1])} = [N, rows, prefix + rows]")
        group = self.num_heads // self.num_kv_heads
        qh = q.transpose(1, 2)  # [N, H, R, D]
        kh = k.repeat_interleave(group, dim=2).transpose(1, 2)  # [N, H, P + R, D]
        vh = v.repeat_interleave(group, dim=2).transpose(1, 2)
        if visible is None:
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=self.scale)
        else:
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=visible[:, None], scale=self.scale)
        return self.o_proj(out.transpose(1, 2).flatten(-2))


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, hidden: int, intermediate: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 bias: bool = False, qk_norm: bool = False, eps: float = 1e-6, rope_theta: float = 10000.0):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = PagedSelfAttention(hidden, num_heads, num_kv_heads, head_dim, bias=bias, qk_norm=qk_norm,
                                            eps=eps, rope_theta=rope_theta)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = SwiGLUMLP(hidden, intermediate)

    @classmethod
    def from_config(cls, cfg: ModelConfig, intermediate: int | None = None) -> "DecoderLayer":
        return cls(cfg.hidden_size, intermediate or cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                   cfg.head_dim, bias=cfg.attention_bias, qk_norm=cfg.qk_norm, eps=cfg.rms_norm_eps,
                   rope_theta=cfg.rope_theta)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        kc = meta.kernels
        x = x + self.self_attn(self.input_layernorm(x, kc), positions, k_cache, v_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x, kc), kc)

    def forward_carry(self, x: torch.Tensor, delta: torch.Tensor | None, positions: torch.Tensor,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """The fused kernels' form of :meth:`forward`: the residual stream is carried as (x, delta),
        its value x + delta, so that every residual add happens inside the RMSNorm kernel that
        follows it (the last one in the next layer's input norm or the final norm). Returns the
        stream after this layer as (x', delta'), with the same rounding as the plain forward."""
        from kernels.rmsnorm import rmsnorm_triton
        from kernels.silu_mul import silu_mul_triton

        if use_small_m_kernels(x, meta.kernels) and self.self_attn.q_norm is None:
            return self._forward_carry_small_m(x, delta, positions, k_cache, v_cache, meta)
        norm1, norm2, mlp = self.input_layernorm, self.post_attention_layernorm, self.mlp
        n1, x = rmsnorm_triton(delta if delta is not None else x, norm1.weight, norm1.eps,
                               residual=x if delta is not None else None)
        a = self.self_attn(n1, positions, k_cache, v_cache, meta)
        n2, x = rmsnorm_triton(a, norm2.weight, norm2.eps, residual=x)  # x <- x + a, n2 = norm(x)
        gate_up = _fused_linear(mlp, "_fused_gate_up", n2, [mlp.gate_proj, mlp.up_proj])
        return x, mlp.down_proj(silu_mul_triton(gate_up))

    def small_m_weights(self) -> list[torch.Tensor]:
        """The weight matrices :meth:`_forward_carry_small_m` streams, in the order it reads them: the
        fused q/k/v, o_proj, the fused gate/up and down_proj (what ``kernels.l2_prefetch`` pulls into L2)."""
        mlp = self.mlp
        return [self.self_attn.qkv_weights()[0], self.self_attn.o_proj.weight,
                _fused_weight(mlp, "_fused_gate_up_w", [mlp.gate_proj.weight, mlp.up_proj.weight]),
                mlp.down_proj.weight]

    def _forward_carry_small_m(self, x: torch.Tensor, delta: torch.Tensor | None, positions: torch.Tensor,
                               k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
                               ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward_carry` for at most SMALL_M_MAX tokens in four kernels besides attention's
        (kernels/small_m_linear.py): residual add + norm + QKV + rotary + paged K/V write, o_proj,
        residual add + norm + gate/up + silu*mul, down_proj. (Five where the head size does not fit
        the fused rotary epilogue, or with engine.kernels.fused_qkv_rope=false: rotary + K/V write
        separately.) The batch-invariant mode runs them over row tiles (``any_m``), at any row count."""
        from kernels.small_m_linear import linear_triton, norm_linear_triton, norm_qkv_rope_triton, rope_fusable

        attn, norm1, norm2, mlp = self.self_attn, self.input_layernorm, self.post_attention_layernorm, self.mlp
        kc = meta.kernels
        any_m, tiles = kc.batch_invariant, kc.small_m_tiles
        w_qkv, b_qkv = attn.qkv_weights()
        src, res = (delta, x) if delta is not None else (x, None)
        if kc.fused_qkv_rope and rope_fusable(attn.head_dim):
            q, x = norm_qkv_rope_triton(src, norm1.weight, norm1.eps, w_qkv, residual=res, bias=b_qkv,
                                        num_heads=attn.num_heads, num_kv_heads=attn.num_kv_heads,
                                        positions=positions, inv_freq=attn._inv_freq_on(x.device),
                                        k_cache=k_cache, v_cache=v_cache, slot_mapping=meta.slot_mapping,
                                        any_m=any_m, tiles=tiles)
            heads = attend(q, k_cache, v_cache, meta, attn.scale).flatten(-2)
        else:
            qkv, x = norm_linear_triton(src, norm1.weight, norm1.eps, w_qkv, residual=res, bias=b_qkv, any_m=any_m,
                                        tiles=tiles)
            heads = attn.attend_projected(qkv, positions, k_cache, v_cache, meta)
        o = attn.o_proj
        a = linear_triton(heads, o.weight, o.bias, any_m=any_m, tiles=tiles)
        w_gu = _fused_weight(mlp, "_fused_gate_up_w", [mlp.gate_proj.weight, mlp.up_proj.weight])
        act, x = norm_linear_triton(a, norm2.weight, norm2.eps, w_gu, residual=x, silu_mul=True, any_m=any_m,
                                    tiles=tiles)
        return x, linear_triton(act, mlp.down_proj.weight, any_m=any_m, tiles=tiles)

    def forward_dense(self, x: torch.Tensor, positions: torch.Tensor, prefix_k: torch.Tensor | None,
                      prefix_v: torch.Tensor | None, visible: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn.forward_dense(self.input_layernorm(x), positions, prefix_k, prefix_v, visible)
        return x + self.mlp(self.post_attention_layernorm(x))


def run_decoder_stack(layers, x: torch.Tensor, positions: torch.Tensor, cache, meta: AttentionMetadata,
                      final_norm: RMSNorm, capture_layers: tuple[int, ...] = ()
                      ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Run paged decoder layers over packed tokens x [T, hidden] with layer i on ``cache.layer(i)``.

    Returns (final_norm of the last stream, [stream after layer i for i in capture_layers]).
    With the fused kernels on (and 2-D inputs) the layers run in their carried-residual form
    (:meth:`DecoderLayer.forward_carry`); otherwise in the plain form. Both compute the same function.
    Which kernels run is ``meta.kernels``' choice.
    """
    kc = meta.kernels
    wanted = {layer: slot for slot, layer in enumerate(capture_layers)}
    captured: list[torch.Tensor | None] = [None] * len(capture_layers)
    fused = use_fused_kernels(kc) and x.dim() == 2
    delta = None
    # Experimental (engine.kernels.l2_prefetch): on decode-sized steps on the GEMV kernels, layer i+1's
    # weights are read into L2 on a side stream while layer i runs (kernels/l2_prefetch.py); the side
    # stream joins before the final norm.
    prefetch = (kc.l2_prefetch and fused and len(layers) > 1 and use_small_m_kernels(x, kc)
                and l2_prefetch_applies(kc, x.device))
    if prefetch:
        from kernels.l2_prefetch import l2_prefetch, side_stream

        main, side = torch.cuda.current_stream(x.device), side_stream(x.device)
    for i, layer in enumerate(layers):
        if prefetch and i + 1 < len(layers):
            weights = layers[i + 1].small_m_weights()  # (any first-time concatenation stays on the step's stream)
            side.wait_stream(main)  # not before layer i starts: keeps at most two layers' weights in flight
            with torch.cuda.stream(side):
                l2_prefetch(weights, programs=kc.l2_prefetch_programs)
        k_cache, v_cache = cache.layer(i)
        if fused:
            x, delta = layer.forward_carry(x, delta, positions, k_cache, v_cache, meta)
            if i in wanted:
                captured[wanted[i]] = x + delta
        else:
            x = layer(x, positions, k_cache, v_cache, meta)
            if i in wanted:
                captured[wanted[i]] = x
    if prefetch:
        main.wait_stream(side)  # the fork joins (a graph capture requires it)
    if fused and delta is not None:
        from kernels.rmsnorm import rmsnorm_triton

        return rmsnorm_triton(delta, final_norm.weight, final_norm.eps, residual=x)[0], captured  # type: ignore[return-value]
    return final_norm(x, kc), captured  # type: ignore[return-value]


__all__ = ["kernel_set", "l2_prefetch_applies", "project", "use_fused_kernels", "use_row_invariant",
           "use_small_m_kernels", "run_decoder_stack",
           "RMSNorm", "rotary_cos_sin", "apply_rotary", "SwiGLUMLP", "PagedSelfAttention", "DecoderLayer"]
