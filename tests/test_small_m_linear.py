"""Small-M linear kernels (RMSNorm prologue, silu*mul epilogue) against their references.

On CPU they run under TRITON_INTERPRET=1 (set by conftest), which is slow: the interpreter's
cost is about (N / BLOCK_N) * (K / BLOCK_K) per call, so the big shapes appear sparingly.
Outputs are preallocated and NaN-poisoned so a kernel that skips a row or column cannot pass.
"""

import pytest
import torch

from kernels.rmsnorm import rmsnorm_reference
from kernels.silu_mul import silu_mul_reference
from kernels.small_m_linear import (SMALL_M_MAX, linear_reference, linear_triton, norm_linear_reference,
                                    norm_linear_triton)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-5


def _inputs(M, K, N, dtype, residual, bias, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(DEV, dtype)
    r = torch.randn(M, K, generator=g).to(DEV, dtype) if residual else None
    nw = (1 + 0.1 * torch.randn(K, generator=g)).to(DEV, dtype)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(DEV, dtype)
    b = (0.1 * torch.randn(N, generator=g)).to(DEV, dtype) if bias else None
    return x, r, nw, w, b


def _blas_sums_rows_alike() -> bool:
    """Whether numpy's matmul gives a row the same bits at every position of a 16-row tile. Under TRITON_INTERPRET
    ``tl.dot`` is numpy's matmul, and some BLAS builds (OpenBLAS on AMD EPYC, for one) sum a row in a different order
    by its position in the tile; the kernels' bitwise batch invariance is then the BLAS's to give, not theirs."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((SMALL_M_MAX, 64)).astype(np.float32)
    b = rng.standard_normal((32, 64)).astype(np.float32).T
    full = a @ b
    for i in range(SMALL_M_MAX):
        alone = np.zeros_like(a)
        alone[0] = a[i]
        if (alone @ b)[0].tobytes() != full[i].tobytes():
            return False
    return True


BITWISE_ROWS = DEV == "cuda" or _blas_sums_rows_alike()


def _same_row(one, row):
    """A row computed alone against the same row of a batch: bitwise where the dot sums every row alike (always on
    the GPU), else to fp32 rounding (the CPU interpreter on a BLAS that does not, see _blas_sums_rows_alike)."""
    if BITWISE_ROWS:
        assert torch.equal(one, row)
    else:
        torch.testing.assert_close(one, row, atol=1e-5, rtol=1e-5)


def _nan(*shape, dtype):
    return torch.full(shape, float("nan"), device=DEV, dtype=dtype)


def _close(out, ref, dtype):
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)


def _truncating_norm_linear(x, nw, eps, w, r, b, silu):
    """norm_linear_reference with every fp32 -> bf16 cast truncating, as Triton's CPU interpreter
    casts; the kernel's chain of roundings (h, n, z, silu, product) must match it to an ulp or two."""
    def t(v):
        return (v.float().contiguous().view(torch.int32) & -65536).view(torch.float32)

    h = t(x.float() + r.float()) if r is not None else x.float()
    n = t(nw.float() * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)))
    z = t(torch.nn.functional.linear(n, w.float(), None if b is None else b.float()))
    if silu:
        g, u = z.chunk(2, dim=-1)
        z = t(t(g / (1 + torch.exp(-g))) * u)
    return z.to(x.dtype)


def _check_h(h, ref_h, dtype):
    if DEV == "cuda" or dtype == torch.float32:
        assert torch.equal(h, ref_h)  # the residual stream is rounded exactly as torch rounds x + r
    else:  # Triton's CPU interpreter truncates fp32 -> bf16 instead of rounding to nearest: 1 ulp
        torch.testing.assert_close(h, ref_h, atol=0, rtol=2 ** -7)


# (M, K, N, silu_mul, residual, bias): small shapes for the M sweep, the model's shapes
# (K=576: QKV N=960, o_proj N=576, gate/up N=2*1536) sparingly.
NORM_CASES = [
    (1, 64, 48, False, False, False),
    (2, 64, 48, False, True, True),
    (5, 64, 96, True, True, True),
    (8, 576, 960, False, True, False),
    (16, 576, 576, False, False, True),
    (1, 576, 2 * 1536, True, True, False),
    (16, 64, 2 * 48, True, False, False),
]


@pytest.mark.parametrize("M,K,N,silu,with_res,with_bias", NORM_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_linear_matches_reference(M, K, N, silu, with_res, with_bias, dtype):
    x, r, nw, w, b = _inputs(M, K, N, dtype, with_res, with_bias, seed=M * 1000 + K + N)
    n_out = N // 2 if silu else N
    out = _nan(M, n_out, dtype=dtype)
    h_out = _nan(M, K, dtype=dtype) if with_res else None
    y, h = norm_linear_triton(x, nw, EPS, w, r, b, silu, out=out, h_out=h_out)
    ref, ref_h = norm_linear_reference(x, nw, EPS, w, r, b, silu)
    assert y.data_ptr() == out.data_ptr() and y.shape == (M, n_out)
    if DEV == "cuda" or dtype == torch.float32:
        _close(y, ref, dtype)
    else:  # the interpreter truncates each of up to five bf16 roundings: compare with that rounding,
        emulated = _truncating_norm_linear(x, nw, EPS, w, r, b, silu)
        torch.testing.assert_close(y, emulated, atol=1e-3, rtol=2 ** -6)
        torch.testing.assert_close(y, ref, atol=8e-2, rtol=8e-2)  # and loosely with round-to-nearest
    if with_res:
        assert h.data_ptr() == h_out.data_ptr()
        _check_h(h, ref_h, dtype)
    else:
        assert h is x


@pytest.mark.parametrize("M,K,N,with_bias", [(1, 64, 48, True), (5, 1536, 576, False), (16, 576, 960, True),
                                             (2, 1536, 48, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_matches_reference(M, K, N, with_bias, dtype):
    x, _, _, w, b = _inputs(M, K, N, dtype, False, with_bias, seed=7 * M + K + N)
    out = _nan(M, N, dtype=dtype)
    y = linear_triton(x, w, b, out=out)
    assert y.data_ptr() == out.data_ptr()
    _close(y, linear_reference(x, w, b), dtype)


def test_references_are_the_unfused_path():
    x, r, nw, w, b = _inputs(3, 64, 96, torch.float32, True, True, seed=1)
    n, h = rmsnorm_reference(x, nw, EPS, r)
    y, h2 = norm_linear_reference(x, nw, EPS, w, r, b, silu_mul=True)
    torch.testing.assert_close(y, silu_mul_reference(torch.nn.functional.linear(n, w, b)))
    assert torch.equal(h2, h) and torch.equal(h, x + r)
    torch.testing.assert_close(linear_reference(x, w, b), torch.nn.functional.linear(x, w, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_are_batch_invariant(dtype):
    """Row i of an M=8 call is bitwise the row computed alone (M=1), for both kernels."""
    M, K, N = 8, 576, 2 * 48
    x, r, nw, w, b = _inputs(M, K, N, dtype, True, True, seed=11)
    y8, h8 = norm_linear_triton(x, nw, EPS, w, r, b, silu_mul=True)
    z8 = linear_triton(x, w, b)
    for i in (0, 3, 7):
        y1, h1 = norm_linear_triton(x[i:i + 1], nw, EPS, w, r[i:i + 1], b, silu_mul=True)
        _same_row(y1[0], y8[i])
        assert torch.equal(h1[0], h8[i])  # the residual sum: no dot
        _same_row(linear_triton(x[i:i + 1], w, b)[0], z8[i])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_any_m_runs_row_tiles_and_stays_batch_invariant(dtype):
    """any_m=True (the engine's batch-invariant mode) lifts the 16-row limit with a grid over row
    tiles of the same shape: 40 rows (3 tiles, the last partial) match the reference, every row
    is bitwise the row computed alone, and h is written for every tile."""
    M, K, N = 40, 64, 2 * 24
    x, r, nw, w, b = _inputs(M, K, N, dtype, True, True, seed=13)
    y_out, h_out = _nan(M, N // 2, dtype=dtype), _nan(M, K, dtype=dtype)
    y, h = norm_linear_triton(x, nw, EPS, w, r, b, silu_mul=True, out=y_out, h_out=h_out, any_m=True)
    ref, ref_h = norm_linear_reference(x, nw, EPS, w, r, b, silu_mul=True)
    if DEV == "cuda" or dtype == torch.float32:
        _close(y, ref, dtype)
    else:  # the interpreter truncates bf16 roundings (see test_norm_linear_matches_reference)
        torch.testing.assert_close(y, _truncating_norm_linear(x, nw, EPS, w, r, b, True), atol=1e-3, rtol=2 ** -6)
    _check_h(h, ref_h, dtype)
    z = linear_triton(x, w, b, out=_nan(M, N, dtype=dtype), any_m=True)
    _close(z, linear_reference(x, w, b), dtype)
    for i in (0, 17, 39):
        y1, h1 = norm_linear_triton(x[i:i + 1], nw, EPS, w, r[i:i + 1], b, silu_mul=True)
        _same_row(y1[0], y[i])
        assert torch.equal(h1[0], h[i])
        _same_row(linear_triton(x[i:i + 1], w, b)[0], z[i])


def test_leading_dims_default_outputs_and_strided_out():
    x, r, nw, w, b = _inputs(6, 64, 48, torch.float32, True, True, seed=5)
    x3, r3 = x.view(2, 3, 64), r.view(2, 3, 64)
    y, h = norm_linear_triton(x3, nw, EPS, w, r3, b)
    ref, ref_h = norm_linear_reference(x3, nw, EPS, w, r3, b)
    assert y.shape == (2, 3, 48) and h.shape == (2, 3, 64)
    _close(y, ref, torch.float32)
    assert torch.equal(h, ref_h)
    assert linear_triton(x3, w).shape == (2, 3, 48)
    # out may be a row-strided 2-D view (e.g. a column slice of a wider buffer): neighbours stay untouched.
    buf = _nan(6, 48 + 16, dtype=torch.float32)
    linear_triton(x, w, b, out=buf[:, 8:56])
    _close(buf[:, 8:56], linear_reference(x, w, b), torch.float32)
    assert torch.isnan(buf[:, :8]).all() and torch.isnan(buf[:, 56:]).all()


def test_refusals():
    x, r, nw, w, b = _inputs(SMALL_M_MAX + 1, 64, 48, torch.float32, True, True, seed=2)
    with pytest.raises(ValueError, match="cuBLAS"):
        norm_linear_triton(x, nw, EPS, w, r, b)
    with pytest.raises(ValueError, match="cuBLAS"):
        linear_triton(x, w)
    x = x[:4]
    with pytest.raises(ValueError, match=r"\(48, 32\).*\(N, 64\)"):
        linear_triton(x, w[:, :32].contiguous())
    with pytest.raises(ValueError, match=r"\(48, 32\)"):
        norm_linear_triton(x, nw, EPS, w[:, :32].contiguous())
    with pytest.raises(ValueError, match="even"):
        norm_linear_triton(x, nw, EPS, w[:47], silu_mul=True)
    with pytest.raises(ValueError, match="norm_weight"):
        norm_linear_triton(x, nw[:32], EPS, w)
    with pytest.raises(ValueError, match="bias"):
        linear_triton(x, w, b[:10])
    with pytest.raises(ValueError, match="out"):
        linear_triton(x, w, out=_nan(4, 47, dtype=torch.float32))
    with pytest.raises(ValueError, match="h_out"):
        norm_linear_triton(x, nw, EPS, w, h_out=_nan(4, 64, dtype=torch.float32))


def test_refuses_cpu_tensors_without_the_interpreter(monkeypatch):
    x, _, nw, w, _ = _inputs(2, 64, 48, torch.float32, False, False, seed=3)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="CUDA"):
        norm_linear_triton(x.cpu(), nw.cpu(), EPS, w.cpu())
    with pytest.raises(RuntimeError, match="CUDA"):
        linear_triton(x.cpu(), w.cpu())


@pytest.mark.gpu
def test_mlp_replays_in_a_cuda_graph():
    """norm + gate/up + silu*mul, then down_proj, captured once and replayed on new inputs."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    M, K, N, dtype = 8, 576, 2 * 1536, torch.bfloat16
    x, r, nw, w, _ = _inputs(M, K, N, dtype, True, False, seed=4)
    wd = (torch.randn(K, N // 2) / (N // 2) ** 0.5).to(DEV, dtype)
    sx, sr = x.clone(), r.clone()
    linear_triton(norm_linear_triton(sx, nw, EPS, w, sr, silu_mul=True)[0], wd)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gy, gh = norm_linear_triton(sx, nw, EPS, w, sr, silu_mul=True)
        gz = linear_triton(gy, wd)
    for seed in (5, 6):
        nx, nr, _, _, _ = _inputs(M, K, N, dtype, True, False, seed=seed)
        sx.copy_(nx)
        sr.copy_(nr)
        graph.replay()
        ref, ref_h = norm_linear_reference(nx, nw, EPS, w, nr, None, silu_mul=True)
        _close(gy, ref, dtype)
        assert torch.equal(gh, ref_h)
        assert torch.equal(gz, linear_triton(gy, wd))  # deterministic: replay == eager on the same input
        _close(gz, linear_reference(gy, wd), dtype)


# ---- fused QKV + rotary + paged K/V write (norm_qkv_rope_triton) ----------------------------

def _rope_case(M, H, Hk, D, dtype, residual, bias, seed, pages=6, page=4):
    from dspark.models.layers import rotary_inv_freq

    K = 64
    x, r, nw, w, b = _inputs(M, K, (H + 2 * Hk) * D, dtype, residual, bias, seed)
    g = torch.Generator().manual_seed(seed + 100)
    slots = torch.randperm(pages * page, generator=g)[:M].to(DEV)
    if M > 2:
        slots[1] = -1  # a padding token: its k and v are written nowhere
    pos = torch.randint(0, 4000, (M,), generator=g).to(DEV)
    inv = rotary_inv_freq(D, 10000.0, DEV)
    kc = _nan(pages, page, Hk, D, dtype=dtype)
    vc = _nan(pages, page, Hk, D, dtype=dtype)
    kw = dict(num_heads=H, num_kv_heads=Hk, positions=pos, inv_freq=inv, slot_mapping=slots, residual=r, bias=b)
    return x, nw, w, kc, vc, kw


@pytest.mark.parametrize("M,H,Hk,D,residual,bias", [(1, 3, 1, 32, True, False), (5, 4, 2, 32, False, True),
                                                    (16, 2, 2, 64, True, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_qkv_rope_matches_the_unfused_kernels_and_reference(M, H, Hk, D, residual, bias, dtype):
    """The fused kernel against (a) the two kernels it replaces (norm_linear_triton, then
    rotary_kv_write_triton), bitwise, and (b) the plain-PyTorch reference, to rounding; the
    cache is NaN-poisoned, so a slot the kernel skips or a stray write shows."""
    from kernels.rotary import rotary_kv_write_triton
    from kernels.small_m_linear import norm_qkv_rope_reference, norm_qkv_rope_triton

    x, nw, w, kc, vc, kw = _rope_case(M, H, Hk, D, dtype, residual, bias, seed=M + H)
    q, h = norm_qkv_rope_triton(x, nw, EPS, w, k_cache=kc, v_cache=vc, **kw)
    # (a) the unfused Triton path
    kc2, vc2 = kc.clone().fill_(float("nan")), vc.clone().fill_(float("nan"))
    qkv, h2 = norm_linear_triton(x, nw, EPS, w, kw["residual"], kw["bias"])
    qd, kd = H * D, Hk * D
    q2 = rotary_kv_write_triton(qkv[:, :qd].unflatten(-1, (H, D)), qkv[:, qd:qd + kd].unflatten(-1, (Hk, D)),
                                qkv[:, qd + kd:].unflatten(-1, (Hk, D)), kw["positions"], kw["inv_freq"], kc2, vc2,
                                kw["slot_mapping"])
    assert torch.equal(h, h2)
    assert torch.equal(kc.isnan(), kc2.isnan()) and torch.equal(vc.isnan(), vc2.isnan())
    if DEV == "cpu":  # the interpreter computes both the same way, bit for bit
        assert torch.equal(q, q2)
        assert torch.equal(kc.nan_to_num(), kc2.nan_to_num()) and torch.equal(vc.nan_to_num(), vc2.nan_to_num())
    else:  # compiled, the two kernels may contract the rotation's multiply-adds differently: an ulp
        ulp = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=1e-2, rtol=8e-3)
        torch.testing.assert_close(q, q2, **ulp)
        torch.testing.assert_close(kc.nan_to_num(), kc2.nan_to_num(), **ulp)
        torch.testing.assert_close(vc.nan_to_num(), vc2.nan_to_num(), **ulp)
    # (b) the reference
    kc3, vc3 = kc.clone().fill_(float("nan")), vc.clone().fill_(float("nan"))
    q3, h3 = norm_qkv_rope_reference(x, nw, EPS, w, k_cache=kc3, v_cache=vc3, **kw)
    _close(q, q3, dtype)
    _check_h(h, h3, dtype)
    assert torch.equal(kc.isnan(), kc3.isnan())
    written = ~kc3.isnan()
    assert int(written.sum()) == int((kw["slot_mapping"] >= 0).sum()) * Hk * D
    _close(kc[written], kc3[written], dtype)
    _close(vc[written], vc3[written], dtype)


def test_norm_qkv_rope_is_batch_invariant_and_refuses_bad_shapes():
    from kernels.small_m_linear import norm_qkv_rope_triton, rope_fusable

    x, nw, w, kc, vc, kw = _rope_case(8, 3, 1, 32, torch.bfloat16, True, False, seed=3)
    q8, _ = norm_qkv_rope_triton(x, nw, EPS, w, k_cache=kc, v_cache=vc, **kw)
    one = dict(kw, positions=kw["positions"][:1], slot_mapping=kw["slot_mapping"][:1], residual=kw["residual"][:1])
    q1, _ = norm_qkv_rope_triton(x[:1], nw, EPS, w, k_cache=kc, v_cache=vc, **one)
    assert torch.equal(q8[:1], q1)
    assert rope_fusable(64) and rope_fusable(128) and not rope_fusable(40)
    with pytest.raises(ValueError, match="rows, expected"):
        norm_qkv_rope_triton(x, nw, EPS, w[:-32], k_cache=kc, v_cache=vc, **kw)
    with pytest.raises(ValueError, match="positions"):
        norm_qkv_rope_triton(x, nw, EPS, w, k_cache=kc, v_cache=vc, **dict(kw, positions=kw["positions"][:3]))
    with pytest.raises(ValueError, match="k_cache"):
        norm_qkv_rope_triton(x, nw, EPS, w, k_cache=kc.float(), v_cache=vc, **kw)


def test_tile_table_is_read_per_shape_and_validated(tmp_path):
    """engine.kernels.small_m_tiles names a per-shape tile table (bench/small_m_sweep.py writes it),
    which the kernels take as ``tiles``: a listed shape launches with its settings, others with the
    defaults, and results do not change; a malformed table is refused with the key's name."""
    from dspark.config import KernelConfig

    import json

    import kernels.small_m_linear as sml

    x, r, nw, w, _ = _inputs(3, 64, 48, torch.float32, True, False, seed=11)
    before = norm_linear_triton(x, nw, EPS, w, r)[0]
    table = tmp_path / "small_m_tiles.json"
    table.write_text(json.dumps({"tiles": [{"N": 48, "K": 64, "silu_mul": False, "block_n": 32, "block_k": 32,
                                            "num_warps": 2, "num_stages": 2}]}))
    path = str(table)
    assert sml.tile_settings(48, 64, False, table=path) == {"block_n": 32, "block_k": 32, "num_warps": 2,
                                                            "num_stages": 2}
    assert sml.tile_settings(48, 64, True, table=path) == {} and sml.tile_settings(48, 64, False) == {}
    after = norm_linear_triton(x, nw, EPS, w, r, tiles=path)[0]
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)  # another reduction split, same function
    from dspark.models.layers import kernel_set
    with_table = KernelConfig(attention_backend="triton", small_m_tiles=path)
    assert "tiles:" in kernel_set(with_table, "cpu")
    assert "tiles:" not in kernel_set(KernelConfig(attention_backend="triton"), "cpu")
    assert kernel_set(KernelConfig(small_m_tiles=path), "cpu") == "torch"
    table.write_text(json.dumps({"tiles": [{"N": 48, "K": 64, "silu_mul": False, "block_n": 8}]}))
    with pytest.raises(ValueError, match="engine.kernels.small_m_tiles"):
        norm_linear_triton(x, nw, EPS, w, r, tiles=path)


# Split-K (programs share K; the last split to arrive sums the partials in split order) and the
# unrolled loops: (M, K, N, silu_mul, residual, block_k, split_k).
SPLIT_CASES = [
    (1, 192, 48, False, False, 64, 3),     # o_proj-like: three one-chunk shares
    (4, 256, 48, False, True, 32, 4),      # two chunks per share
    (16, 160, 2 * 32, True, True, 32, 2),  # gate/up + silu: both halves' partials; K = 5 chunks, shares of 3 and 2
    (3, 96, 48, False, True, 32, 1),       # no split, unrolled loops
]


@pytest.mark.parametrize("M,K,N,silu,with_res,block_k,split_k", SPLIT_CASES)
@pytest.mark.parametrize("unroll", [False, True])
def test_split_k_and_unroll_match_the_reference_and_reset_their_counters(M, K, N, silu, with_res, block_k, split_k,
                                                                         unroll):
    import kernels.small_m_linear as sml

    dtype = torch.float32
    tiles = dict(block_k=block_k, split_k=split_k, unroll=unroll)
    for seed in (1, 2):  # twice: the second launch only works if the first left its counters at zero
        x, r, nw, w, b = _inputs(M, K, N, dtype, with_res, True, seed=seed * 100 + M + K)
        out = _nan(M, N // 2 if silu else N, dtype=dtype)
        y, h = sml._launch("test", x, w, b, norm_weight=nw, eps=EPS, residual=r, silu_mul=silu, out=out, **tiles)
        ref, ref_h = norm_linear_reference(x, nw, EPS, w, r, b, silu_mul=silu)
        _close(y, ref, dtype)
        assert torch.equal(h, ref_h)
        z = sml._launch("test", x, w, b, out=_nan(M, N, dtype=dtype), **tiles)[0]
        _close(z, linear_reference(x, w, b), dtype)
        if split_k > 1:
            assert int(sml.split_k_counters(x.device, 1).abs().sum()) == 0
    # rows stay batch-invariant: the split depends on the weight's shape, not on M
    for i in (0, M - 1):
        one = sml._launch("test", x[i:i + 1], w, b, norm_weight=nw, eps=EPS,
                          residual=None if r is None else r[i:i + 1], silu_mul=silu, **tiles)[0]
        _same_row(one[0], y[i])


def test_split_k_is_deterministic_across_row_tiles_and_close_to_no_split():
    """any_m with split-K: 3 row tiles x 3 column tiles x 4 splits share the counters; every row
    equals the row alone, bitwise, and the result is the unsplit one to fp32 rounding."""
    import kernels.small_m_linear as sml

    M, K, N = 40, 128, 48
    x, r, nw, w, b = _inputs(M, K, N, torch.float32, True, False, seed=21)
    kw = dict(norm_weight=nw, eps=EPS, residual=r, any_m=True, block_k=32)
    y4 = sml._launch("test", x, w, b, split_k=4, **kw)[0]
    y1 = sml._launch("test", x, w, b, split_k=1, **kw)[0]
    torch.testing.assert_close(y4, y1, atol=1e-5, rtol=1e-5)
    assert torch.equal(sml._launch("test", x, w, b, split_k=4, **kw)[0], y4)
    for i in (0, 20, 39):
        one = sml._launch("test", x[i:i + 1], w, b, norm_weight=nw, eps=EPS, residual=r[i:i + 1], block_k=32,
                          split_k=4)[0]
        _same_row(one[0], y4[i])


def test_split_k_rope_epilogue_and_refusals():
    """The fused QKV + rotary epilogue runs after the split reduction; bad splits are refused."""
    import kernels.small_m_linear as sml
    from kernels.small_m_linear import norm_qkv_rope_reference

    x, nw, w, kc, vc, kw = _rope_case(3, 3, 1, 32, torch.float32, True, False, seed=4)
    rope = {"hq": 3, "hk": 1, "half": 16, "positions": kw["positions"], "inv_freq": kw["inv_freq"],
            "slot_mapping": kw["slot_mapping"], "k_cache": kc, "v_cache": vc}
    q, h = sml._launch("test", x, w, None, norm_weight=nw, eps=EPS, residual=kw["residual"], rope=rope,
                       block_k=16, split_k=4)
    kc3, vc3 = kc.clone().fill_(float("nan")), vc.clone().fill_(float("nan"))
    q3, h3 = norm_qkv_rope_reference(x, nw, EPS, w, k_cache=kc3, v_cache=vc3, **kw)
    _close(q, q3, torch.float32)
    assert torch.equal(h, h3) and torch.equal(kc.isnan(), kc3.isnan())
    written = ~kc3.isnan()
    _close(kc[written], kc3[written], torch.float32)
    _close(vc[written], vc3[written], torch.float32)
    x2, _, _, w2, _ = _inputs(2, 96, 48, torch.float32, False, False, seed=5)
    with pytest.raises(ValueError, match="split_k=4 does not cut K=96"):  # 3 chunks of 32
        sml._launch("test", x2, w2, None, block_k=32, split_k=4)
    with pytest.raises(ValueError, match="split_k=3 does not cut K=128"):  # 4 chunks: shares of 2, 2, 0
        sml._launch("test", _inputs(2, 128, 48, torch.float32, False, False, seed=5)[0],
                    _inputs(2, 128, 48, torch.float32, False, False, seed=5)[3], None, block_k=32, split_k=3)


def test_default_tiles_split_long_k_and_gate_up_but_never_in_the_batch_invariant_mode():
    """The built-in settings (no table): long-K projections and the norm + gate/up + SiLU kernel
    split K, the batch-invariant mode never does, and a default launch over a long K (4 chunks ->
    4 splits) matches the reference with rows bitwise equal at M=1 and M=16."""
    import kernels.small_m_linear as sml

    assert sml.default_tiles(576, 1536, False)["split_k"] == 6
    assert sml.default_tiles(3072, 576, True, norm=True) == {"block_n": 32, "block_k": 256, "num_warps": 4,
                                                             "num_stages": 3, "split_k": 3, "unroll": True}
    assert sml.default_tiles(576, 1536, False, any_m=True)["split_k"] == 1
    assert sml.default_tiles(3072, 576, True, norm=True, any_m=True)["split_k"] == 1
    for args, kw in (((576, 576, False), {}), ((960, 576, False), {"rope": True, "norm": True})):
        assert sml.default_tiles(*args, **kw)["split_k"] == 1  # o_proj, QKV + rotary: no gain measured
    x, _, _, w, b = _inputs(16, 1024, 64, torch.float32, False, True, seed=31)
    y = linear_triton(x, w, b)
    _close(y, linear_reference(x, w, b), torch.float32)
    assert int(sml.split_k_counters(x.device, 1).abs().sum()) == 0
    assert torch.equal(linear_triton(x[5:6], w, b)[0], y[5])


def test_split_k_lanes_keep_work_on_another_stream_off_the_decode_counters(monkeypatch):
    """Split-K launches of one lane share one counter buffer (they run one after another); a prefill forward
    on the prefill stream runs beside the decode step, so it counts arrivals in a lane of its own. The
    engine's prefill stage runs in that lane, its decode stages in the default one."""
    import dspark.graph_decode as graph_decode
    import kernels.small_m_linear as sml
    from kernels.small_m_linear import split_k_counters, split_k_lane

    dev = torch.device("cpu")
    default = split_k_counters(dev, 4)
    with split_k_lane("prefill"):
        prefill = split_k_counters(dev, 4)
        assert split_k_counters(dev, 4) is prefill  # one buffer per lane
    assert prefill.data_ptr() != default.data_ptr() and split_k_counters(dev, 4) is default
    grown = split_k_counters(dev, default.numel() + 1)  # outgrown: the old buffer stays alive for its graphs
    assert grown.numel() > default.numel() and any(b is default for b in sml._RETIRED_COUNTERS)
    lanes = []
    monkeypatch.setattr(graph_decode.GraphDecoder, "_prefill_forward", lambda self, T, P: lanes.append(sml._LANE.get()))
    graph_decode.GraphDecoder._prefill_stage(object.__new__(graph_decode.GraphDecoder), 16, 1)
    assert lanes == ["prefill"] and sml._LANE.get() is None
