"""A single-token decode step of a whole Llama-family decoder stack in one persistent kernel.

At batch 1 a target-only decode step runs five kernels per layer (norm + QKV + rotary + K/V write,
attention split and combine, o_proj, norm + gate/up + SiLU, down_proj). Each moves a few KB per
SM, so the step is bound by kernel boundaries, not by bandwidth. Here one launch of as many
programs as the device has SMs runs every layer as five phases separated by a grid barrier (an
arrival counter in global memory), and each program loads its next weight tile *before* it waits
at the barrier, so weight reads overlap the synchronisation.

Specification (``decode_stack_reference``), one token at ``position``, per layer l, the rounding of
the carried-residual layer path (``DecoderLayer.forward_carry``):

    h   = x (layer 0) or  h' + d  of layer l-1, rounded to the dtype
    n1  = rmsnorm(h, norm1[l]);  q, k, v = n1 @ qkv[l].T (+ bias) rounded; q, k rotated (fp32, rounded)
    k, v written to the paged cache of layer l at ``slot`` (nothing when slot < 0)
    a   = o[l] @ attention(q over the kv_len cached tokens, grouped heads, softmax(q.k * scale)) rounded
    h'  = h + a rounded;  n2 = rmsnorm(h', norm2[l])
    act = silu(n2 @ gate[l].T) * (n2 @ up[l].T), each product rounded as torch rounds it
    d   = act @ down[l].T rounded
    out = rmsnorm(h' + d of the last layer, final_norm)

Phases of layer l (each program takes items pid, pid + P, ...):

    A  norm + QKV + rotary: items of RN rotary pairs (2 RN output rows) of one head; q to a buffer,
       k/v into the cache. Program 0 stores h (the stream) for phase D.
    B  attention: items (kv head, KV split); each stores its softmax partial; the last split of a
       kv head to arrive (a per-head ticket) combines them in split order into the head outputs.
    C  o_proj: items of output rows.
    D  h' = h + a, norm, gate/up rows + SiLU * up: items of intermediate rows. Program 0 stores h'.
    E  down_proj: items of output rows.

and a final phase: the final norm of h' + d. Each GEMV item holds whole rows of K (no split-K,
no partial sums), so every result has one reduction order that depends only on the shapes.

``sync=True`` (CUDA) runs all phases in one launch with the grid barrier; ``sync=False`` launches
once per phase (the kernel boundary is the barrier): same code, and what Triton's CPU interpreter
runs, since it executes programs one after another and a grid barrier would wait forever there.
Capture-safe: no host syncs, persistent workspaces (created outside capture), counters reset by
the launch that used them. Requires: one token, contiguous stacked weights, head_dim a power of
two >= 16, a contiguous paged cache [layers, pages, page_size, kv_heads, head_dim], as many programs as
can be resident at once (at most one per SM).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.rmsnorm import rmsnorm_reference
from kernels.rotary import rotary_reference
from kernels.silu_mul import silu_mul_reference
from kernels.small_m_linear import linear_reference
from kernels.switches import interpreted

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

PHASES_PER_LAYER = 5
NUM_WARPS = 4
ATTN_BLOCK_T = 32
DEFAULT_KV_SPLITS = 32


@dataclass(frozen=True)
class StackWeights:
    """A decoder stack's weights stacked over layers (contiguous), as the megakernel reads them.

    qkv [L, (Hq + 2 Hk) D, hidden] (q rows, then k, then v), qkv_bias [L, (Hq + 2 Hk) D] or None,
    o [L, hidden, Hq D], gate_up [L, 2 I, hidden] (gate rows, then up), down [L, hidden, I],
    norm1 / norm2 [L, hidden], final_norm [hidden], inv_freq fp32 [D / 2]."""

    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    norm1: torch.Tensor
    norm2: torch.Tensor
    final_norm: torch.Tensor
    inv_freq: torch.Tensor
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float

    @property
    def num_layers(self) -> int:
        return int(self.qkv.shape[0])

    @property
    def hidden(self) -> int:
        return int(self.qkv.shape[2])

    @property
    def intermediate(self) -> int:
        return int(self.down.shape[2])

    def check(self) -> None:
        L, Hq, Hk, D, K = self.num_layers, self.num_heads, self.num_kv_heads, self.head_dim, self.hidden
        want = {"qkv": (L, (Hq + 2 * Hk) * D, K), "o": (L, K, Hq * D), "gate_up": (L, 2 * self.intermediate, K),
                "down": (L, K, self.intermediate), "norm1": (L, K), "norm2": (L, K), "final_norm": (K,),
                "inv_freq": (D // 2,)}
        if self.qkv_bias is not None:
            want["qkv_bias"] = (L, (Hq + 2 * Hk) * D)
        for name, shape in want.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape:
                raise ValueError(f"StackWeights.{name} is {tuple(t.shape)}, expected {shape}")
            if not t.is_contiguous():
                raise ValueError(f"StackWeights.{name} must be contiguous")
        if D < 16 or D & (D - 1):
            raise ValueError(f"the decode megakernel needs a power-of-two head_dim >= 16 (its attention runs on "
                             f"tl.dot), got {D}")
        if Hq % Hk:
            raise ValueError(f"num_heads ({Hq}) must be a multiple of num_kv_heads ({Hk})")
        if self.inv_freq.dtype != torch.float32:
            raise ValueError("StackWeights.inv_freq must be float32")


def random_stack_weights(*, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int,
                         dtype: torch.dtype, device: torch.device | str = "cpu", bias: bool = False, seed: int = 0,
                         scale: float = 0.2, theta: float = 10000.0, eps: float = 1e-5) -> StackWeights:
    """Random weights of a shape (for tests and benchmarks): normal(0, scale) matrices and biases,
    norm weights 1 + normal(0, 0.1), rotary frequencies of ``theta``."""
    g = torch.Generator(device=device).manual_seed(seed)

    def r(*shape: int, sc: float = scale) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * sc).to(dtype).contiguous()

    L, H, D, N = layers, hidden, head_dim, (heads + 2 * kv_heads) * head_dim
    return StackWeights(qkv=r(L, N, H), qkv_bias=r(L, N) if bias else None, o=r(L, H, heads * D),
                        gate_up=r(L, 2 * intermediate, H), down=r(L, H, intermediate),
                        norm1=(1 + r(L, H, sc=0.1)).contiguous(), norm2=(1 + r(L, H, sc=0.1)).contiguous(),
                        final_norm=(1 + r(H, sc=0.1)).contiguous(),
                        inv_freq=1.0 / (theta ** (torch.arange(0, D, 2, device=device).float() / D)),
                        num_heads=heads, num_kv_heads=kv_heads, head_dim=D, eps=eps)


def decode_stack_reference(w: StackWeights, x: torch.Tensor, position: torch.Tensor, slot: torch.Tensor,
                           block_table: torch.Tensor, kv_len: torch.Tensor, k_cache: torch.Tensor,
                           v_cache: torch.Tensor) -> torch.Tensor:
    """The specification in plain PyTorch: x [1, hidden] at position [1], new K/V at slot [1] of the
    paged caches [L, pages, page_size, Hk, D], block_table [pages] int, kv_len [1] (after this token).
    Writes the caches; returns the final-normed hidden state [1, hidden]."""
    from kernels.paged_attention import paged_attention_reference, write_kv_reference

    Hq, Hk, D = w.num_heads, w.num_kv_heads, w.head_dim
    one_request = dict(qo_indptr=torch.tensor([0, 1], dtype=torch.int32, device=x.device), kv_lens=kv_len.reshape(1),
                       block_tables=block_table.reshape(1, -1), scale=1.0 / math.sqrt(D), causal=True)
    h, d = x, None
    for layer in range(w.num_layers):
        if d is not None:
            h = h + d
        n1 = rmsnorm_reference(h, w.norm1[layer], w.eps)[0]
        z = linear_reference(n1, w.qkv[layer], None if w.qkv_bias is None else w.qkv_bias[layer])
        q = z[:, : Hq * D].unflatten(-1, (Hq, D))
        k = z[:, Hq * D: (Hq + Hk) * D].unflatten(-1, (Hk, D))
        v = z[:, (Hq + Hk) * D:].unflatten(-1, (Hk, D))
        q, k = rotary_reference(q, k, position, w.inv_freq)
        write_kv_reference(k_cache[layer], v_cache[layer], k, v, slot.reshape(1))  # (nothing for slot < 0)
        heads = paged_attention_reference(q, k_cache[layer], v_cache[layer], **one_request)  # [1, Hq, D]
        h = h + linear_reference(heads.flatten(-2), w.o[layer])
        n2 = rmsnorm_reference(h, w.norm2[layer], w.eps)[0]
        d = linear_reference(silu_mul_reference(linear_reference(n2, w.gate_up[layer])), w.down[layer])
    return rmsnorm_reference(d, w.final_norm, w.eps, residual=h)[0]


if triton is not None:
    from kernels.rotary import rotate_pair  # (a Triton helper: defined only with triton)

    @triton.jit
    def _grid_sync(bar_ptr, target):
        # Every program arrives (after all its threads' stores: release), then polls (acquire) until
        # all have. The arrival's result is not used, so the first poll need not wait for it.
        tl.debug_barrier()
        tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        while seen < target:
            seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()

    @triton.jit
    def _load_rows(w_ptr, rows, ok, K, K1: tl.constexpr, K2: tl.constexpr):
        # Rows `rows` of a [*, K] matrix as two tiles: columns [0, K1) and [K1, K1 + K2) (masked past K).
        r = rows.to(tl.int64)[:, None] * K
        k1 = tl.arange(0, K1)
        k2 = K1 + tl.arange(0, K2)
        w1 = tl.load(w_ptr + r + k1[None, :], mask=ok[:, None], other=0.0)
        w2 = tl.load(w_ptr + r + k2[None, :], mask=ok[:, None] & (k2 < K)[None, :], other=0.0)
        return w1, w2

    @triton.jit
    def _dot_rows(w1, w2, v1, v2):
        return tl.sum(w1.to(tl.float32) * v1[None, :], axis=1) + tl.sum(w2.to(tl.float32) * v2[None, :], axis=1)

    @triton.jit
    def _load_vec(ptr, K, K1: tl.constexpr, K2: tl.constexpr):
        # A vector written in this launch by other programs: read from L2 (.cg), never a stale L1 line.
        k2 = K1 + tl.arange(0, K2)
        v1 = tl.load(ptr + tl.arange(0, K1), cache_modifier=".cg")
        v2 = tl.load(ptr + k2, mask=k2 < K, other=0.0, cache_modifier=".cg")
        return v1, v2

    @triton.jit
    def _stream(a_ptr, b_ptr, K, K1: tl.constexpr, K2: tl.constexpr):
        # a + b rounded to their dtype (a residual add, as torch rounds it)
        a1, a2 = _load_vec(a_ptr, K, K1, K2)
        b1, b2 = _load_vec(b_ptr, K, K1, K2)
        h1 = (a1.to(tl.float32) + b1.to(tl.float32)).to(a1.dtype)
        h2 = (a2.to(tl.float32) + b2.to(tl.float32)).to(a2.dtype)
        return h1, h2

    @triton.jit
    def _load_norm(nw_ptr, K, K1: tl.constexpr, K2: tl.constexpr):
        k2 = K1 + tl.arange(0, K2)
        w1 = tl.load(nw_ptr + tl.arange(0, K1)).to(tl.float32)
        w2 = tl.load(nw_ptr + k2, mask=k2 < K, other=0.0).to(tl.float32)
        return w1, w2

    @triton.jit
    def _norm(h1, h2, w1, w2, K, eps):
        # rmsnorm(h) with weight halves (w1, w2), rounded to h's dtype, returned as fp32 (exact) halves
        f1 = h1.to(tl.float32)
        f2 = h2.to(tl.float32)
        rstd = 1.0 / tl.sqrt((tl.sum(f1 * f1, axis=0) + tl.sum(f2 * f2, axis=0)) / K + eps)
        n1 = (w1 * (f1 * rstd)).to(h1.dtype).to(tl.float32)
        n2 = (w2 * (f2 * rstd)).to(h1.dtype).to(tl.float32)
        return n1, n2

    @triton.jit
    def _store_vec(ptr, h1, h2, K, K1: tl.constexpr, K2: tl.constexpr):
        k2 = K1 + tl.arange(0, K2)
        tl.store(ptr + tl.arange(0, K1), h1)
        tl.store(ptr + k2, h2, mask=k2 < K)

    @triton.jit
    def _qkv_rows(item, RN: tl.constexpr, HALF: tl.constexpr):
        # Item `item` of phase A: RN rotary pairs of one head (rows j of its first half, j + HALF of its second).
        head = (item * RN) // HALF
        j = (item * RN) % HALF + tl.arange(0, RN)
        return head, j, head * (2 * HALF) + j

    @triton.jit
    def _qkv_item(item, wl1, wl2, wh1, wh2, n1, n2, b_ptr, pos, freq_ptr, slot, q_buf, kc, vc, dt,
                  HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr, RN: tl.constexpr, HAS_BIAS: tl.constexpr):
        head, j, rows = _qkv_rows(item, RN, HALF)
        lo = _dot_rows(wl1, wl2, n1, n2)
        hi = _dot_rows(wh1, wh2, n1, n2)
        if HAS_BIAS:
            lo += tl.load(b_ptr + rows).to(tl.float32)
            hi += tl.load(b_ptr + rows + HALF).to(tl.float32)
        lo = lo.to(dt)
        hi = hi.to(dt)
        if head < HQ + HK:  # q and k rotate (fp32, rounded)
            lo, hi = rotate_pair(lo.to(tl.float32), hi.to(tl.float32), pos * tl.load(freq_ptr + j))
            lo = lo.to(dt)
            hi = hi.to(dt)
        if head < HQ:
            tl.store(q_buf + head * (2 * HALF) + j, lo)
            tl.store(q_buf + head * (2 * HALF) + j + HALF, hi)
        elif slot >= 0:
            if head < HQ + HK:
                dst = kc + slot * (HK * 2 * HALF) + (head - HQ) * (2 * HALF) + j
            else:
                dst = vc + slot * (HK * 2 * HALF) + (head - HQ - HK) * (2 * HALF) + j
            tl.store(dst, lo)
            tl.store(dst + HALF, hi)

    @triton.jit
    def _phase_qkv(layer, pid, nprog, do_sync, bar_ptr, target, x_ptr, ha_ptr, hd_ptr, d_ptr, w_ptr, b_ptr, nw_ptr,
                   pos_ptr, freq_ptr, slot_ptr, q_buf, kc, vc, eps,
                   HID, HID1: tl.constexpr, HID2: tl.constexpr,
                   HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr, RN: tl.constexpr, HAS_BIAS: tl.constexpr,
                   SYNC: tl.constexpr):
        NA: tl.constexpr = (HQ + 2 * HK) * HALF // RN
        rq = (HQ + 2 * HK) * 2 * HALF
        w_l = w_ptr + layer.to(tl.int64) * rq * HID
        _, _, rows = _qkv_rows(pid, RN, HALF)
        ok = (tl.arange(0, RN) * 0 + pid) < NA
        wl1, wl2 = _load_rows(w_l, rows, ok, HID, HID1, HID2)  # before the barrier: weights never change
        wh1, wh2 = _load_rows(w_l, rows + HALF, ok, HID, HID1, HID2)
        nw1, nw2 = _load_norm(nw_ptr + layer.to(tl.int64) * HID, HID, HID1, HID2)
        pos = tl.load(pos_ptr).to(tl.float32)  # (inputs the host wrote before the launch)
        slot = tl.load(slot_ptr).to(tl.int64)
        if SYNC:
            if do_sync:
                _grid_sync(bar_ptr, target)
        if layer == 0:
            h1, h2 = _load_vec(x_ptr, HID, HID1, HID2)
        else:
            h1, h2 = _stream(hd_ptr, d_ptr, HID, HID1, HID2)
        if pid == 0:
            _store_vec(ha_ptr, h1, h2, HID, HID1, HID2)  # this layer's input stream, for phase D
        n1, n2 = _norm(h1, h2, nw1, nw2, HID, eps)
        dt = h1.dtype
        b_l = b_ptr + layer.to(tl.int64) * rq
        if pid < NA:
            _qkv_item(pid, wl1, wl2, wh1, wh2, n1, n2, b_l, pos, freq_ptr, slot, q_buf, kc, vc, dt,
                      HQ, HK, HALF, RN, HAS_BIAS)
        for item in range(pid + nprog, NA, nprog):
            _, _, rows = _qkv_rows(item, RN, HALF)
            ok = tl.arange(0, RN) < RN
            wl1, wl2 = _load_rows(w_l, rows, ok, HID, HID1, HID2)
            wh1, wh2 = _load_rows(w_l, rows + HALF, ok, HID, HID1, HID2)
            _qkv_item(item, wl1, wl2, wh1, wh2, n1, n2, b_l, pos, freq_ptr, slot, q_buf, kc, vc, dt,
                      HQ, HK, HALF, RN, HAS_BIAS)

    @triton.jit
    def _kv_tile(kc, vc, bt_ptr, t, ok, g, HK: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr):
        # K and V of tokens t (rows where ok; zeros elsewhere) of kv head g, through the block table.
        page = tl.load(bt_ptr + t // PAGE, mask=ok, other=0).to(tl.int64)
        off = (page * PAGE + t % PAGE) * (HK * D) + g * D
        d = tl.arange(0, D)
        k = tl.load(kc + off[:, None] + d[None, :], mask=ok[:, None], other=0.0, cache_modifier=".cg")
        v = tl.load(vc + off[:, None] + d[None, :], mask=ok[:, None], other=0.0, cache_modifier=".cg")
        return k, v

    @triton.jit
    def _phase_attention(pid, nprog, do_sync, bar_ptr, target, q_buf, a_buf, kc, vc, bt_ptr, kvlen_ptr,
                         ws_acc, ws_ml, cnt_ptr, qk_scale,
                         HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                         S: tl.constexpr, SP: tl.constexpr, BM: tl.constexpr, BT: tl.constexpr,
                         DOT_F32: tl.constexpr, SYNC: tl.constexpr):
        # Items (kv head g, split s): the G query heads of g (rows of a BM-row tile for tl.dot) over
        # this split's keys; partial softmax state to the workspace; the last split to arrive combines.
        G: tl.constexpr = HQ // HK
        kv_len = tl.load(kvlen_ptr)  # written by the host before the launch
        chunk = tl.cdiv(kv_len, S)
        new_t = kv_len - 1  # this step's token: its K/V are written in phase A of this layer
        # Before the barrier: the first item's first tile of cached keys, all but this step's token.
        g0 = pid // S
        lo0 = (pid % S) * chunk
        t = lo0 + tl.arange(0, BT)
        hi0 = tl.where(pid < HK * S, tl.minimum(lo0 + chunk, kv_len), 0)  # (no item: nothing to load)
        ok0 = t < hi0
        k0, v0 = _kv_tile(kc, vc, bt_ptr, t, ok0 & (t != new_t), g0, HK, D, PAGE)
        if SYNC:
            if do_sync:
                _grid_sync(bar_ptr, target)
        r = tl.arange(0, BM)
        r_ok = r < G
        d = tl.arange(0, D)
        for item in range(pid, HK * S, nprog):
            g = item // S
            s = item % S
            q = tl.load(q_buf + (g * G + r)[:, None] * D + d[None, :], mask=r_ok[:, None], other=0.0,
                        cache_modifier=".cg")
            if DOT_F32:
                q = q.to(tl.float32)
            m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BM], dtype=tl.float32)
            acc = tl.zeros([BM, D], dtype=tl.float32)
            lo = s * chunk
            hi = tl.minimum(lo + chunk, kv_len)
            for t0 in range(lo, hi, BT):
                t = t0 + tl.arange(0, BT)
                t_ok = t < hi
                if (item == pid) & (t0 == lo):  # the prefetched tile, plus this step's token if it is here
                    kn, vn = _kv_tile(kc, vc, bt_ptr, t, t_ok & (t == new_t), g, HK, D, PAGE)
                    k = k0 + kn  # (each is zero where the other holds a key: exact)
                    v = v0 + vn
                else:
                    k, v = _kv_tile(kc, vc, bt_ptr, t, t_ok, g, HK, D, PAGE)
                if DOT_F32:
                    k = k.to(tl.float32)
                    v = v.to(tl.float32)
                sc = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale  # [BM, BT], log2 units
                sc = tl.where(t_ok[None, :], sc, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(sc, axis=1))  # finite: every tile holds a key
                alpha = tl.exp2(m_i - m_new)
                p = tl.exp2(sc - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, axis=1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
                m_i = m_new
            part = (g * S + s) * G + r  # workspace rows (kv head, split, query head of the group)
            tl.store(ws_acc + part[:, None] * D + d[None, :], acc, mask=r_ok[:, None])
            tl.store(ws_ml + part * 2, m_i, mask=r_ok)
            tl.store(ws_ml + part * 2 + 1, l_i, mask=r_ok)
            tl.debug_barrier()  # every thread's partial is stored before the arrival is published
            arrived = tl.atomic_add(cnt_ptr + g, 1, sem="acq_rel", scope="gpu")
            if arrived == S - 1:  # the last split of this kv head: combine all, in split order
                sp = tl.arange(0, SP)
                sp_ok = sp < S
                for rr in tl.static_range(G):
                    rows = (g * S + sp) * G + rr
                    ms = tl.load(ws_ml + rows * 2, mask=sp_ok, other=float("-inf"), cache_modifier=".cg")
                    ls = tl.load(ws_ml + rows * 2 + 1, mask=sp_ok, other=0.0, cache_modifier=".cg")
                    accs = tl.load(ws_acc + rows[:, None] * D + d[None, :], mask=sp_ok[:, None], other=0.0,
                                   cache_modifier=".cg")
                    mx = tl.max(ms, axis=0)
                    mx = tl.where(mx == float("-inf"), 0.0, mx)  # kv_len 0 (an idle row): outputs 0, not NaN
                    wgt = tl.exp2(ms - mx)  # empty splits (m = -inf) weigh 0
                    den = tl.sum(wgt * ls, axis=0)
                    den = tl.where(den > 0, den, 1.0)
                    out = tl.sum(wgt[:, None] * accs, axis=0) / den
                    tl.store(a_buf + (g * G + rr) * D + d, out.to(a_buf.dtype.element_ty))
                tl.atomic_xchg(cnt_ptr + g, 0)

    @triton.jit
    def _phase_linear(layer, pid, nprog, do_sync, bar_ptr, target, v_ptr, w_ptr, y_ptr, N, K,
                      K1: tl.constexpr, K2: tl.constexpr, BN: tl.constexpr, SYNC: tl.constexpr):
        # y = v @ w[layer].T rounded (o_proj and down_proj): items of BN output rows.
        w_l = w_ptr + layer.to(tl.int64) * N * K
        n_items = tl.cdiv(N, BN)
        rows = pid * BN + tl.arange(0, BN)
        w1, w2 = _load_rows(w_l, rows, rows < N, K, K1, K2)
        if SYNC:
            if do_sync:
                _grid_sync(bar_ptr, target)
        v1, v2 = _load_vec(v_ptr, K, K1, K2)
        v1 = v1.to(tl.float32)
        v2 = v2.to(tl.float32)
        if pid < n_items:
            tl.store(y_ptr + rows, _dot_rows(w1, w2, v1, v2).to(y_ptr.dtype.element_ty), mask=rows < N)
        for item in range(pid + nprog, n_items, nprog):
            rows = item * BN + tl.arange(0, BN)
            w1, w2 = _load_rows(w_l, rows, rows < N, K, K1, K2)
            tl.store(y_ptr + rows, _dot_rows(w1, w2, v1, v2).to(y_ptr.dtype.element_ty), mask=rows < N)

    @triton.jit
    def _gate_up_item(rows, wg1, wg2, wu1, wu2, n1, n2, act_ptr, I, dt):
        g = _dot_rows(wg1, wg2, n1, n2).to(dt).to(tl.float32)
        u = _dot_rows(wu1, wu2, n1, n2).to(dt).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)  # silu rounded, as torch does
        tl.store(act_ptr + rows, (s * u).to(dt), mask=rows < I)

    @triton.jit
    def _phase_gate_up(layer, pid, nprog, do_sync, bar_ptr, target, ha_ptr, a_ptr, hd_ptr, w_ptr, nw_ptr, act_ptr,
                       eps, I, HID, HID1: tl.constexpr, HID2: tl.constexpr, BN: tl.constexpr, SYNC: tl.constexpr):
        w_l = w_ptr + layer.to(tl.int64) * 2 * I * HID
        n_items = tl.cdiv(I, BN)
        rows = pid * BN + tl.arange(0, BN)
        wg1, wg2 = _load_rows(w_l, rows, rows < I, HID, HID1, HID2)
        wu1, wu2 = _load_rows(w_l, rows + I, rows < I, HID, HID1, HID2)
        nw1, nw2 = _load_norm(nw_ptr + layer.to(tl.int64) * HID, HID, HID1, HID2)
        if SYNC:
            if do_sync:
                _grid_sync(bar_ptr, target)
        h1, h2 = _stream(ha_ptr, a_ptr, HID, HID1, HID2)  # h' = h + a
        if pid == 0:
            _store_vec(hd_ptr, h1, h2, HID, HID1, HID2)
        n1, n2 = _norm(h1, h2, nw1, nw2, HID, eps)
        dt = h1.dtype
        if pid < n_items:
            _gate_up_item(rows, wg1, wg2, wu1, wu2, n1, n2, act_ptr, I, dt)
        for item in range(pid + nprog, n_items, nprog):
            rows = item * BN + tl.arange(0, BN)
            wg1, wg2 = _load_rows(w_l, rows, rows < I, HID, HID1, HID2)
            wu1, wu2 = _load_rows(w_l, rows + I, rows < I, HID, HID1, HID2)
            _gate_up_item(rows, wg1, wg2, wu1, wu2, n1, n2, act_ptr, I, dt)

    @triton.jit
    def _phase_final(pid, do_sync, bar_ptr, target, hd_ptr, d_ptr, nw_ptr, out_ptr, eps,
                     HID, HID1: tl.constexpr, HID2: tl.constexpr, SYNC: tl.constexpr):
        nw1, nw2 = _load_norm(nw_ptr, HID, HID1, HID2)
        if SYNC:
            if do_sync:
                _grid_sync(bar_ptr, target)
        if pid == 0:
            h1, h2 = _stream(hd_ptr, d_ptr, HID, HID1, HID2)
            n1, n2 = _norm(h1, h2, nw1, nw2, HID, eps)
            _store_vec(out_ptr, n1.to(h1.dtype), n2.to(h1.dtype), HID, HID1, HID2)

    @triton.jit
    def _decode_stack_kernel(
            x_ptr, out_ptr, pos_ptr, slot_ptr, bt_ptr, kvlen_ptr,
            wqkv_ptr, bqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, n1_ptr, n2_ptr, nf_ptr, freq_ptr,
            kc_ptr, vc_ptr, layer_stride,
            ha_ptr, hd_ptr, q_buf, a_buf, o_buf, act_buf, d_buf, ws_acc, ws_ml, cnt_ptr, bar_ptr,
            ph_lo, ph_hi, eps, qk_scale,
            NUM_LAYERS: tl.constexpr, HID: tl.constexpr, HID1: tl.constexpr, HID2: tl.constexpr,
            I: tl.constexpr, I1: tl.constexpr, I2: tl.constexpr, AO1: tl.constexpr, AO2: tl.constexpr,
            HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
            RN: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_D: tl.constexpr,
            S: tl.constexpr, SP: tl.constexpr, BM: tl.constexpr, BT: tl.constexpr,
            HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr, SYNC: tl.constexpr):
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        for ph in range(ph_lo, ph_hi):
            layer = ph // 5
            kind = ph % 5
            do_sync = ph > ph_lo
            target = (ph - ph_lo) * nprog
            kc = kc_ptr + layer.to(tl.int64) * layer_stride
            vc = vc_ptr + layer.to(tl.int64) * layer_stride
            if layer == NUM_LAYERS:
                _phase_final(pid, do_sync, bar_ptr, target, hd_ptr, d_buf, nf_ptr, out_ptr, eps, HID, HID1, HID2, SYNC)
            elif kind == 0:
                _phase_qkv(layer, pid, nprog, do_sync, bar_ptr, target, x_ptr, ha_ptr, hd_ptr, d_buf, wqkv_ptr, bqkv_ptr,
                           n1_ptr, pos_ptr, freq_ptr, slot_ptr, q_buf, kc, vc, eps, HID, HID1, HID2,
                           HQ, HK, D // 2, RN, HAS_BIAS, SYNC)
            elif kind == 1:
                _phase_attention(pid, nprog, do_sync, bar_ptr, target, q_buf, a_buf, kc, vc, bt_ptr, kvlen_ptr,
                                 ws_acc, ws_ml, cnt_ptr, qk_scale, HQ, HK, D, PAGE, S, SP, BM, BT, DOT_F32, SYNC)
            elif kind == 2:
                _phase_linear(layer, pid, nprog, do_sync, bar_ptr, target, a_buf, wo_ptr, o_buf, HID, HQ * D,
                              AO1, AO2, BN_O, SYNC)
            elif kind == 3:
                _phase_gate_up(layer, pid, nprog, do_sync, bar_ptr, target, ha_ptr, o_buf, hd_ptr, wgu_ptr, n2_ptr,
                               act_buf, eps, I, HID, HID1, HID2, BN_GU, SYNC)
            else:
                _phase_linear(layer, pid, nprog, do_sync, bar_ptr, target, act_buf, wd_ptr, d_buf, HID, I,
                              I1, I2, BN_D, SYNC)
        if SYNC:  # the launch's last arrival resets the barrier for the next launch
            tl.debug_barrier()
            done = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
            if done == nprog - 1:
                tl.atomic_xchg(bar_ptr, 0)
                tl.atomic_xchg(bar_ptr + 1, 0)


def _pow2_split(K: int) -> tuple[int, int]:
    """K = K1 + (valid part of K2): K1 the largest power of two <= K, K2 the power of two that
    covers the rest (at least 16, masked)."""
    k1 = 1 << (K.bit_length() - 1)
    return k1, max(16, triton.next_power_of_2(K - k1))


def _tile(n: int, programs: int, lo: int = 2, hi: int = 64) -> int:
    """Rows per item so that n rows make at most ``programs`` items where possible (a power of two)."""
    return max(lo, min(hi, triton.next_power_of_2(-(-n // programs))))


@dataclass(frozen=True)
class _Plan:
    rn: int
    bn_o: int
    bn_gu: int
    bn_d: int
    splits: int


def megakernel_programs(device: torch.device, requested: int | None = None) -> int:
    """Programs per launch: one per SM (all resident at once, which the grid barrier needs), or
    ``requested`` (engine.kernels.megakernel_programs, 1..SMs) to tune. On CPU (the interpreter)
    ``requested`` or 8."""
    if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int) or requested < 1):
        raise ValueError(f"engine.kernels.megakernel_programs={requested!r}: use an integer >= 1 (at most the SMs)")
    if device.type != "cuda":
        return requested or 8
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if requested is None:
        return sms
    if requested > sms:
        raise ValueError(f"engine.kernels.megakernel_programs={requested}: use an integer in 1..{sms} (this "
                         f"device's SMs); more programs than SMs could not all be resident, and the grid barrier "
                         f"would hang")
    return requested


def _plan(w: StackWeights, programs: int, kv_splits: int) -> _Plan:
    half = w.head_dim // 2
    rn = _tile((w.num_heads + 2 * w.num_kv_heads) * half, programs, lo=2, hi=half)
    return _Plan(rn, _tile(w.hidden, programs), _tile(w.intermediate, programs), _tile(w.hidden, programs),
                 kv_splits)


_WORKSPACES: dict = {}


def _workspace(w: StackWeights, plan: _Plan, dtype: torch.dtype, device: torch.device) -> dict:
    gp = w.num_heads // w.num_kv_heads
    key = (device.type, device.index, dtype, w.hidden, w.intermediate, w.num_heads, w.num_kv_heads, w.head_dim,
           plan.splits)
    ws = _WORKSPACES.get(key)
    if ws is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the decode megakernel's workspace is created outside CUDA-graph capture: run the "
                               "step once eagerly (a warm-up) before capturing it")
        H, Hq, Hk, D = w.hidden, w.num_heads, w.num_kv_heads, w.head_dim
        e = lambda n, dt=dtype: torch.empty(n, dtype=dt, device=device)  # noqa: E731
        ws = {"ha": e(H), "hd": e(H), "q": e(Hq * D), "a": e(Hq * D), "o": e(H), "act": e(w.intermediate),
              "d": e(H), "acc": e(Hk * plan.splits * gp * D, torch.float32),
              "ml": e(Hk * plan.splits * gp * 2, torch.float32),
              "cnt": torch.zeros(Hk, dtype=torch.int32, device=device),
              "bar": torch.zeros(2, dtype=torch.int32, device=device)}
        _WORKSPACES[key] = ws
    return ws


def decode_megakernel(w: StackWeights, x: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                      block_table: torch.Tensor, kv_lens: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      *, out: torch.Tensor | None = None, programs: int | None = None, sync: bool | None = None,
                      kv_splits: int = DEFAULT_KV_SPLITS, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """``decode_stack_reference`` in one launch (``sync``, the default on CUDA) or one launch per phase.

    x [1, hidden]; positions, slot_mapping, kv_lens: one element each (device tensors: read on the
    device, so a captured graph replays with new values); block_table: the request's page ids [pages]
    (or [1, pages]); caches [L, pages, page_size, Hk, D]. Returns ``out`` [1, hidden]. ``programs``,
    ``kv_splits`` (KV chunks per kv head in attention) and ``num_warps`` are tuning knobs
    (bench/megakernel_phases.py)."""
    if triton is None:  # pragma: no cover
        raise RuntimeError("the decode megakernel needs triton")
    w.check()
    L, H, Hq, Hk, D = w.num_layers, w.hidden, w.num_heads, w.num_kv_heads, w.head_dim
    if x.dim() != 2 or x.shape[0] != 1 or x.shape[1] != H:
        raise ValueError(f"the decode megakernel runs one token: x must be [1, {H}], got {tuple(x.shape)}")
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping), ("kv_lens", kv_lens)):
        if t.numel() != 1 or t.device != x.device:
            raise ValueError(f"{name} must hold one element on {x.device}, got {tuple(t.shape)} on {t.device}")
    bt = block_table.reshape(-1)
    if bt.dim() != 1 or (block_table.dim() == 2 and block_table.shape[0] != 1) or bt.stride(0) != 1:
        raise ValueError(f"block_table must be one request's contiguous page ids, got {tuple(block_table.shape)}")
    want = (L, k_cache.shape[1], k_cache.shape[2], Hk, D)
    if k_cache.dim() != 5 or tuple(k_cache.shape) != want or tuple(v_cache.shape) != want:
        raise ValueError(f"caches must be [layers, pages, page_size, kv_heads, head_dim] = {want}, "
                         f"got {tuple(k_cache.shape)} / {tuple(v_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the decode megakernel needs contiguous caches")
    dt = x.dtype
    for name in ("qkv", "o", "gate_up", "down"):
        if getattr(w, name).dtype != dt:
            raise ValueError(f"StackWeights.{name} is {getattr(w, name).dtype}, x is {dt}")
    if k_cache.dtype != dt:
        raise ValueError(f"the cache is {k_cache.dtype}, x is {dt}")
    interp = interpreted()
    if sync is None:
        sync = x.device.type == "cuda" and not interp
    if sync and interp:
        raise ValueError("sync=True runs a grid barrier, which Triton's interpreter (programs one after another) "
                         "can never pass: use sync=False under TRITON_INTERPRET=1")
    if not 1 <= kv_splits <= 64:
        raise ValueError(f"kv_splits must be in 1..64, got {kv_splits}")
    P = megakernel_programs(x.device, programs or None)
    plan = _plan(w, P, kv_splits)
    ws = _workspace(w, plan, dt, x.device)
    if out is None:
        out = torch.empty_like(x)
    elif tuple(out.shape) != (1, H) or out.dtype != dt or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [1, {H}] {dt} tensor")
    h1, h2 = _pow2_split(H)
    i1, i2 = _pow2_split(w.intermediate)
    a1, a2 = _pow2_split(Hq * D)
    gp = triton.next_power_of_2(Hq // Hk)
    bias = w.qkv_bias if w.qkv_bias is not None else w.qkv  # (unused without HAS_BIAS)
    args = (x.reshape(-1), out, positions.reshape(-1), slot_mapping.reshape(-1), bt, kv_lens.reshape(-1),
            w.qkv, bias, w.o, w.gate_up, w.down, w.norm1, w.norm2, w.final_norm, w.inv_freq,
            k_cache, v_cache, k_cache[0].numel(),
            ws["ha"], ws["hd"], ws["q"], ws["a"], ws["o"], ws["act"], ws["d"], ws["acc"], ws["ml"], ws["cnt"],
            ws["bar"])
    meta = dict(NUM_LAYERS=L, HID=H, HID1=h1, HID2=h2, I=w.intermediate, I1=i1, I2=i2, AO1=a1, AO2=a2,
                HQ=Hq, HK=Hk, D=D, PAGE=int(k_cache.shape[2]), RN=plan.rn, BN_O=plan.bn_o, BN_GU=plan.bn_gu,
                BN_D=plan.bn_d, S=plan.splits, SP=triton.next_power_of_2(plan.splits), BM=max(16, gp), BT=ATTN_BLOCK_T,
                HAS_BIAS=w.qkv_bias is not None, DOT_F32=interp or dt == torch.float32, SYNC=bool(sync),
                num_warps=num_warps)
    scale = math.log2(math.e) / math.sqrt(D)  # softmax in exp2 units
    phases = PHASES_PER_LAYER * L + 1
    if sync:
        _decode_stack_kernel[(P,)](*args, 0, phases, float(w.eps), scale, **meta)
    else:
        for ph in range(phases):
            _decode_stack_kernel[(P,)](*args, ph, ph + 1, float(w.eps), scale, **meta)
    return out


__all__ = ["StackWeights", "random_stack_weights", "decode_stack_reference", "decode_megakernel", "megakernel_programs",
           "PHASES_PER_LAYER"]
