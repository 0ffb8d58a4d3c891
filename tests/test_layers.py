"""Shared layers against direct dense references: RMSNorm, rotary, SwiGLU, paged attention (GQA, qk-norm, bias)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dspark.attention import AttentionMetadata
from dspark.kv_cache import BlockManager, KVCache
from dspark.models.layers import (DecoderLayer, PagedSelfAttention, RMSNorm, SwiGLUMLP, apply_rotary,
                                  rotary_cos_sin)


def _randomize(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + (1.0 if p.dim() == 1 and p.shape[0] <= 16 else 0.0))


def test_rmsnorm_matches_formula_and_keeps_dtype():
    norm = RMSNorm(8, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 8))
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(0))
    expected = norm.weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(norm(x), expected)
    xb = x.to(torch.bfloat16)
    out = norm(xb)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), norm(xb.float()), atol=1e-2, rtol=1e-2)


def test_rotary_matches_complex_rotation_of_half_pairs():
    head_dim, theta = 16, 500.0
    positions = torch.tensor([0, 1, 7, 123, 4095])
    x = torch.randn(len(positions), 3, head_dim, generator=torch.Generator().manual_seed(0))
    cos, sin = rotary_cos_sin(positions, head_dim, theta, torch.float32)
    assert cos.shape == (len(positions), head_dim)
    out = apply_rotary(x, cos, sin)
    # HF layout: element i pairs with element i + D/2, rotated by angle pos * theta^(-2i/D).
    half = head_dim // 2
    # Angles rounded to float32 as HF computes them (4095 rad carries ~2e-4 rad of float32 rounding).
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angle = (positions.float()[:, None] * freqs).double()  # [T, D/2]
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * torch.polar(torch.ones_like(angle), angle)[:, None]
    expected = torch.cat((z.real, z.imag), dim=-1).float()
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out[0], x[0])  # position 0 is the identity


def test_rotary_scores_depend_only_on_relative_position():
    head_dim = 8
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, head_dim, generator=gen), torch.randn(1, 1, head_dim, generator=gen)

    def score(m: int, n: int) -> float:
        cq = rotary_cos_sin(torch.tensor([m]), head_dim, 10000.0)
        ck = rotary_cos_sin(torch.tensor([n]), head_dim, 10000.0)
        return float((apply_rotary(q, *cq) * apply_rotary(k, *ck)).sum())

    assert score(10, 3) == pytest.approx(score(57, 50), abs=1e-4)
    assert score(10, 3) != pytest.approx(score(10, 4), abs=1e-4)


def test_rotary_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="even"):
        rotary_cos_sin(torch.tensor([0]), 7, 10000.0)


def test_swiglu_matches_formula():
    mlp = SwiGLUMLP(6, 10)
    x = torch.randn(4, 6)
    g, u, d = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight
    expected = (F.silu(x @ g.T) * (x @ u.T)) @ d.T
    torch.testing.assert_close(mlp(x), expected)
    assert set(dict(mlp.named_parameters())) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}


def _dense_reference(attn: PagedSelfAttention, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Causal attention over one contiguous sequence, written directly from the weights."""
    h, hk, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(-1, h, d)
    k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(-1, hk, d)
    v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(-1, hk, d)
    if attn.q_norm is not None:
        q = attn.q_norm.weight * q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + attn.q_norm.eps)
        k = attn.k_norm.weight * k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + attn.k_norm.eps)
    freqs = attn.rope_theta ** (-torch.arange(d // 2, dtype=torch.float32) * 2 / d)
    ang = positions.float()[:, None] * freqs
    cos, sin = torch.cat((ang, ang), -1).cos()[:, None], torch.cat((ang, ang), -1).sin()[:, None]

    def rot(t):
        return t * cos + torch.cat((-t[..., d // 2:], t[..., : d // 2]), -1) * sin

    q, k = rot(q), rot(k)
    k = k.repeat_interleave(h // hk, dim=1)
    v = v.repeat_interleave(h // hk, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    return attn.o_proj(out.transpose(0, 1).reshape(len(x), h * d))


def _meta_for(manager: BlockManager, requests: list[tuple[int, int, int]], causal: bool) -> AttentionMetadata:
    """requests: (req_id, first position, number of new tokens) -> metadata for one packed step."""
    indptr, lens, slots, tables = [0], [], [], []
    for rid, start, count in requests:
        manager.reserve(rid, start + count)
        indptr.append(indptr[-1] + count)
        lens.append(start + count)
        slots += [manager.slot(rid, p) for p in range(start, start + count)]
        tables.append(manager.table(rid))
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return AttentionMetadata(qo_indptr=torch.tensor(indptr, dtype=torch.int32),
                             kv_lens=torch.tensor(lens, dtype=torch.int32), block_tables=table,
                             slot_mapping=torch.tensor(slots, dtype=torch.int64), causal=causal)


@pytest.mark.parametrize("bias,qk_norm", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_paged_attention_equals_dense_causal_gqa(bias, qk_norm, page_size):
    torch.manual_seed(0)
    hidden, heads, kv_heads, head_dim = 32, 4, 2, 8
    attn = PagedSelfAttention(hidden, heads, kv_heads, head_dim, bias=bias, qk_norm=qk_norm, eps=1e-6, rope_theta=1000.0)
    _randomize(attn, seed=1)
    lengths = {0: 11, 1: 5}
    xs = {rid: torch.randn(n, hidden) for rid, n in lengths.items()}
    manager = BlockManager(num_pages=40, page_size=page_size)
    manager.reserve(7, 5)  # another request's pages, so the tables are not contiguous from 0
    cache = KVCache(1, 40, page_size, kv_heads, head_dim, torch.float32, "cpu")
    k_cache, v_cache = cache.layer(0)
    # Two packed steps: a chunk of each request, then the rest (chunked prefill).
    split = {0: 6, 1: 2}
    outs = {rid: [] for rid in lengths}
    for step in range(2):
        reqs = [(rid, 0 if step == 0 else split[rid], split[rid] if step == 0 else lengths[rid] - split[rid])
                for rid in lengths]
        meta = _meta_for(manager, reqs, causal=True)
        x = torch.cat([xs[rid][s:s + c] for rid, s, c in reqs])
        pos = torch.cat([torch.arange(s, s + c) for rid, s, c in reqs])
        y = attn(x, pos, k_cache, v_cache, meta)
        offset = 0
        for rid, s, c in reqs:
            outs[rid].append(y[offset:offset + c])
            offset += c
    for rid, n in lengths.items():
        got = torch.cat(outs[rid])
        expected = _dense_reference(attn, xs[rid], torch.arange(n))
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_forward_dense_equals_paged_non_causal():
    torch.manual_seed(0)
    attn = PagedSelfAttention(32, 4, 1, 8, qk_norm=True, rope_theta=10000.0)
    _randomize(attn, seed=2)
    n = 9
    x = torch.randn(n, 32)
    positions = torch.arange(n)
    manager = BlockManager(num_pages=8, page_size=4)
    cache = KVCache(1, 8, 4, 1, 8, torch.float32, "cpu")
    meta = _meta_for(manager, [(0, 0, n)], causal=False)
    paged = attn(x, positions, *cache.layer(0), meta)
    visible = torch.ones(1, n, n, dtype=torch.bool)
    dense = attn.forward_dense(x[None], positions[None], None, None, visible)[0]
    torch.testing.assert_close(paged, dense, atol=1e-5, rtol=1e-5)
    # A prefix of pre-rotated keys behaves like the same tokens written earlier.
    k_prefix, v_prefix = attn.project_kv(x[None, :5], positions[None, :5])
    visible = torch.ones(1, n - 5, n, dtype=torch.bool)
    split = attn.forward_dense(x[None, 5:], positions[None, 5:], k_prefix, v_prefix, visible)[0]
    torch.testing.assert_close(split, paged[5:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="visible mask has shape"):
        attn.forward_dense(x[None], positions[None], None, None, torch.ones(1, n, n + 1, dtype=torch.bool))
    # visible=None: causal attention without a mask tensor, equal to an explicit lower-triangular mask.
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None]
    torch.testing.assert_close(attn.forward_dense(x[None], positions[None], None, None, None),
                               attn.forward_dense(x[None], positions[None], None, None, causal), atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="needs a visible mask"):
        attn.forward_dense(x[None, 5:], positions[None, 5:], k_prefix, v_prefix, None)


def test_hf_parameter_names():
    layer = DecoderLayer(16, 24, 2, 1, 8, bias=True, qk_norm=True)
    names = set(dict(layer.named_parameters()))
    assert {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
            "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.o_proj.weight",
            "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
            "mlp.down_proj.weight"} == names - {"self_attn.k_proj.weight", "self_attn.v_proj.weight"}
    plain = PagedSelfAttention(16, 2, 2, 8)
    assert "o_proj.bias" not in dict(plain.named_parameters()) and plain.q_norm is None
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        PagedSelfAttention(16, 3, 2, 8)
