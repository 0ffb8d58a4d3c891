"""Paged attention: the Triton kernel (interpreted on CPU) against the reference and a dense oracle."""

import pytest
import torch  # does not import triton

from interpreter_only import interpreter_module  # noqa: E402  (tests/interpreter_only.py)

interpreter_module()

import math  # noqa: E402

import torch.nn.functional as F  # noqa: E402

from kernels.paged_attention import (  # noqa: E402
    DEFAULT_NUM_SMS, KEYS_PER_SPLIT, MAX_NUM_SPLITS, default_num_splits, paged_attention, paged_attention_reference,
    write_kv_reference,
)

# The split path's combine kernel reads unwritten workspace for padding rows (its loads do not
# wait for the row lookup) and discards the result with tl.where; numpy, under the interpreter,
# warns about the NaN/inf arithmetic on that garbage.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning",
                                        "ignore:All-NaN slice encountered:RuntimeWarning")

SPLITS = [1, 2, 4, 8]


def make_case(q_lens, kv_lens, *, page=16, hq=6, hkv=2, d=16, dtype=torch.float32, seed=0, pad_rows=2):
    """Packed queries plus a cache whose pages are shuffled across requests; unused block
    table entries are -1 so a read past a request's pages would fault or poison the result."""
    g = torch.Generator().manual_seed(seed)
    B = len(q_lens)
    pages_per_req = [max(1, math.ceil(n / page)) for n in kv_lens]
    num_pages = sum(pages_per_req) + 3
    perm = torch.randperm(num_pages, generator=g)
    block_tables = torch.full((B, max(pages_per_req) + 1), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages_per_req):
        block_tables[b, :n] = perm[used:used + n].int()
        used += n
    indptr = torch.zeros(B + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(q_lens, dtype=torch.int64).cumsum(0)
    return dict(
        q=torch.randn(int(indptr[-1]) + pad_rows, hq, d, generator=g).to(dtype),
        k_cache=torch.randn(num_pages, page, hkv, d, generator=g).to(dtype),
        v_cache=torch.randn(num_pages, page, hkv, d, generator=g).to(dtype),
        qo_indptr=indptr, kv_lens=torch.tensor(kv_lens, dtype=torch.int32), block_tables=block_tables,
    )


def dense_oracle(case, scale, causal):
    """Per request: gather K/V page by page and call torch SDPA with an explicit mask."""
    q, kc, vc = case["q"], case["k_cache"], case["v_cache"]
    indptr, lens = case["qo_indptr"].tolist(), case["kv_lens"].tolist()
    page, hkv, d = kc.shape[1], kc.shape[2], kc.shape[3]
    group = q.shape[1] // hkv
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b, L in enumerate(lens):
        s, e = indptr[b], indptr[b + 1]
        if e == s:
            continue
        k = torch.cat([kc[case["block_tables"][b, i]] for i in range(math.ceil(L / page))])[:L]  # [L, Hkv, D]
        v = torch.cat([vc[case["block_tables"][b, i]] for i in range(math.ceil(L / page))])[:L]
        k = k.double().repeat_interleave(group, 1).transpose(0, 1)
        v = v.double().repeat_interleave(group, 1).transpose(0, 1)
        n = e - s
        vis = torch.arange(n)[:, None] + (L - n + 1) if causal else torch.full((n, 1), L)
        mask = torch.arange(L)[None, :] < vis
        out[s:e] = F.scaled_dot_product_attention(q[s:e].double().transpose(0, 1), k, v, attn_mask=mask,
                                                  scale=scale).transpose(0, 1)
    return out


def run_kernel(case, scale, causal, **kw):
    return paged_attention(case["q"], case["k_cache"], case["v_cache"], qo_indptr=case["qo_indptr"],
                           kv_lens=case["kv_lens"], block_tables=case["block_tables"], scale=scale,
                           causal=causal, **kw)


def run_reference(case, scale, causal):
    return paged_attention_reference(case["q"], case["k_cache"], case["v_cache"], qo_indptr=case["qo_indptr"],
                                     kv_lens=case["kv_lens"], block_tables=case["block_tables"], scale=scale,
                                     causal=causal)


def poisoned_run(case, scale, causal, monkeypatch, **kw):
    """Run the kernel with every buffer the wrapper allocates pre-filled with NaN, so a row the
    kernel forgets to write (or a workspace entry the combine reads unwritten) shows up as NaN.
    The single-kernel path zero-fills its output by design, so there only the padding rows
    come back zero; the split path's torch.empty output and workspace are NaN throughout."""
    import kernels.paged_attention as pa

    n = int(case["qo_indptr"][-1])
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def nan_except_padding(t, **kwargs):
        out = torch.full_like(t, float("nan"), **kwargs)
        out[n:] = 0
        return out

    def nan_filled(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    with monkeypatch.context() as m:
        m.setattr(pa.torch, "zeros_like", nan_except_padding)
        m.setattr(pa.torch, "empty_like", lambda *a, **k: nan_filled(real_empty_like(*a, **k)))
        m.setattr(pa.torch, "empty", lambda *a, **k: nan_filled(real_empty(*a, **k)))
        return run_kernel(case, scale, causal, **kw)


def poison_unused_cache(case):
    """Fill every cache slot that is not a valid key of some request with NaN (tails of last
    pages, unused pages) and the padding query rows too; returns the number of poisoned slots."""
    kc, vc = case["k_cache"], case["v_cache"]
    num_pages, page = kc.shape[:2]
    valid = torch.zeros(num_pages * page, dtype=torch.bool)
    for b, L in enumerate(case["kv_lens"].tolist()):
        pos = torch.arange(L)
        valid[case["block_tables"][b, pos // page].long() * page + pos % page] = True
    kc.view(num_pages * page, -1)[~valid] = float("nan")
    vc.view(num_pages * page, -1)[~valid] = float("nan")
    case["q"][int(case["qo_indptr"][-1]):] = float("nan")
    return int((~valid).sum())


# (q_lens, kv_lens, hq, hkv): ragged verification rows, decode rows, a ~40-row prefill chunk,
# KV lengths on and across page boundaries (page 16), GQA group 3 and 1.
CASES = [
    ([1], [1], 3, 1),
    ([1, 3, 8, 2], [16, 17, 33, 2], 6, 2),
    ([5, 40, 1, 8, 2, 7, 1, 4, 3], [21, 40, 64, 15, 80, 7, 1, 16, 48], 6, 2),
    ([8, 1, 6], [72, 31, 6], 4, 4),
]


@pytest.mark.parametrize("num_splits", SPLITS, ids=[f"s{s}" for s in SPLITS])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("q_lens,kv_lens,hq,hkv", CASES, ids=[f"B{len(c[0])}_g{c[2] // c[3]}" for c in CASES])
def test_triton_matches_reference_and_dense(q_lens, kv_lens, hq, hkv, causal, num_splits, monkeypatch):
    # With 64-key blocks most of these KV lengths are shorter than num_splits * 64, so the
    # later splits of a request are empty; kv_len == q_len occurs in three of the cases.
    case = make_case(q_lens, kv_lens, hq=hq, hkv=hkv, seed=len(q_lens) + hq)
    scale = 0.3
    out = poisoned_run(case, scale, causal, monkeypatch, num_splits=num_splits)
    ref = run_reference(case, scale, causal)
    dense = dense_oracle(case, scale, causal)
    n = int(case["qo_indptr"][-1])
    assert not torch.isnan(out).any(), "some row was never written"
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)  # fp32 vs fp32, different summation order
    torch.testing.assert_close(out[:n].double(), dense[:n], atol=1e-4, rtol=1e-4)
    assert (out[n:] == 0).all()


@pytest.mark.parametrize("num_splits", [1, 3])
def test_head_dim_not_power_of_two_and_page_32(num_splits):
    # 3 splits: not a power of two (the combine masks its split axis).
    case = make_case([3, 1, 20], [40, 70, 20], page=32, hq=4, hkv=2, d=24, seed=5)
    out = run_kernel(case, 0.2, True, num_splits=num_splits)
    torch.testing.assert_close(out, run_reference(case, 0.2, True), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_rows_that_see_nothing_are_zero(num_splits, monkeypatch):
    # kv_len < q_len: the first causal rows see <= 0 keys; kv_len 0 sees nothing at all.
    case = make_case([4, 2], [2, 0], seed=6)
    out = poisoned_run(case, 0.5, True, monkeypatch, num_splits=num_splits)
    ref = run_reference(case, 0.5, True)
    assert (out[:2] == 0).all() and (out[4:] == 0).all()
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_half_precision_inputs(num_splits):
    # fp16 here: Triton 3.9's interpreter mishandles bf16 (numpy has no bfloat16), so the bf16
    # path is checked on the GPU in tests/test_kernels_gpu.py.
    case = make_case([1, 6, 3], [40, 17, 3], dtype=torch.float16, seed=7)
    out = run_kernel(case, 0.25, True, num_splits=num_splits)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), run_reference(case, 0.25, True).float(), atol=5e-3, rtol=5e-3)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_max_q_len_bounds_the_grid(num_splits):
    case = make_case([2, 5, 1], [20, 30, 9], seed=8)
    ref = run_reference(case, 0.3, True)
    for max_q_len in (5, 9):
        out = run_kernel(case, 0.3, True, max_q_len=max_q_len, num_splits=num_splits)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_too_small_max_q_len_leaves_the_same_rows_zero_on_both_paths(monkeypatch):
    # max_q_len=1 with group 3: one 16-row tile reaches rows 0..4 of each request (tile row
    # o * 3 + g < 16), part of row 5; everything past it is left zero, split path included.
    case = make_case([2, 7, 1], [20, 30, 9], seed=8)
    single = run_kernel(case, 0.3, True, max_q_len=1, num_splits=1)
    split = poisoned_run(case, 0.3, True, monkeypatch, max_q_len=1, num_splits=4)
    assert not torch.isnan(split).any()
    torch.testing.assert_close(split, single, atol=1e-4, rtol=1e-4)
    row5 = single[2 + 5]  # request 1, row 5: only group slot 0 (heads 0 and 3) is reached
    assert (row5[[0, 3]] != 0).all() and (row5[[1, 2, 4, 5]] == 0).all()
    assert (single[2 + 6] == 0).all() and (single[9] != 0).all()


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_nan_outside_the_valid_keys_never_leaks(num_splits, causal, monkeypatch):
    """Every cache slot that is no request's valid key (and every padding query row) is NaN:
    the output must equal the reference on the clean cache. KV lengths 130 and 70 put a
    partial block inside a split, 5 and 1 leave most splits empty, 3 == its q_len."""
    case = make_case([1, 3, 8, 1, 3], [5, 70, 130, 1, 3], hq=6, hkv=2, seed=21, pad_rows=3)
    ref = run_reference(case, 0.3, causal)
    assert poison_unused_cache(case) > 0
    out = poisoned_run(case, 0.3, causal, monkeypatch, num_splits=num_splits)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    assert (out[int(case["qo_indptr"][-1]):] == 0).all()


def test_default_num_splits_heuristic():
    # Batch-1 decode of SmolLM2 (3 kv heads, one query tile): 3 programs -> split.
    assert default_num_splits(1 * 3 * 1) == MAX_NUM_SPLITS
    assert default_num_splits(1 * 8 * 1) == 64 // 2  # ceil(264 / 8) = 33 -> 64, clamped to 32
    assert default_num_splits(4 * 3 * 1) == 32 and default_num_splits(16 * 8) == 4
    # Large batches already fill the GPU: the single kernel.
    assert default_num_splits(64 * 8 * 1) == 1 and default_num_splits(2 * DEFAULT_NUM_SMS) == 1
    assert default_num_splits(256 * 3 * 1, num_sms=132) == 1
    assert default_num_splits(0) == 1
    # A block table that reaches far: the longest possible request gets a split per KEYS_PER_SPLIT keys,
    # even where the grid alone fills the GPU (a mixed batch waits for its longest request).
    assert default_num_splits(128 * 3, max_kv_len=2048) == 4 == default_num_splits(128 * 3, max_kv_len=1600)
    assert default_num_splits(128 * 3, max_kv_len=KEYS_PER_SPLIT) == 1
    assert default_num_splits(1 * 3, max_kv_len=2048) == MAX_NUM_SPLITS  # the grid's aim, when larger
    assert default_num_splits(128 * 3, max_kv_len=10 ** 6) == MAX_NUM_SPLITS
    prev = MAX_NUM_SPLITS
    for base in range(1, 600):
        n = default_num_splits(base)
        assert 1 <= n <= prev and n & (n - 1) == 0  # powers of two, non-increasing in the grid
        prev = n


def test_default_path_splits_batch_one_and_not_large_batches(monkeypatch):
    import kernels.paged_attention as pa

    calls = []
    real = pa._paged_attention_split

    def spy(*args):
        calls.append(args[-1])  # num_splits
        return real(*args)

    monkeypatch.setattr(pa, "_paged_attention_split", spy)
    case = make_case([1], [40], hq=3, hkv=1, seed=22, pad_rows=1)
    torch.testing.assert_close(run_kernel(case, 0.3, True), run_reference(case, 0.3, True), atol=1e-4, rtol=1e-4)
    assert calls == [MAX_NUM_SPLITS]
    # 132 requests x 2 kv heads = 264 = 2 * 132 programs: the single kernel (launch stubbed out,
    # the interpreter would take seconds over 264 programs).
    launches = []

    class StubKernel:
        def __getitem__(self, grid):
            launches.append(grid)
            return lambda *args, **kwargs: None

    monkeypatch.setattr(pa, "_paged_attention_kernel", StubKernel())
    big = make_case([1] * 132, [3] * 132, hq=4, hkv=2, seed=23)
    run_kernel(big, 0.3, True)
    assert calls == [MAX_NUM_SPLITS] and launches == [(132, 2, 1)]
    # The same batch with block tables that reach 2,048 keys (a graph step's width, max_model_len): four
    # splits, so a long request in a batch of short ones is not read by one program.
    monkeypatch.setattr(pa, "_paged_attention_split", lambda *args: calls.append(args[-1]))
    wide = torch.full((132, 2048 // 16), -1, dtype=torch.int32)
    wide[:, : big["block_tables"].shape[1]] = big["block_tables"]
    run_kernel({**big, "block_tables": wide}, 0.3, True)
    assert calls == [MAX_NUM_SPLITS, 4] and launches == [(132, 2, 1)]


def test_write_then_attend_roundtrip():
    """Write a step's K/V through write_kv_reference, then attend over it: the last row of a
    request must attend to its own freshly written key."""
    case = make_case([3], [10], seed=9, pad_rows=0)
    page = case["k_cache"].shape[1]
    k_new = torch.randn(3, 2, 16)
    v_new = torch.randn(3, 2, 16)
    pos = torch.arange(7, 10)
    slots = case["block_tables"][0, pos // page].long() * page + pos % page
    write_kv_reference(case["k_cache"], case["v_cache"], k_new, v_new, slots)
    out = run_kernel(case, 0.3, True)
    torch.testing.assert_close(out, run_reference(case, 0.3, True), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.double(), dense_oracle(case, 0.3, True), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("bad,match", [
    (dict(page=8), "power of two >= 16"),
    (dict(page=24), "power of two >= 16"),
    (dict(hq=5, hkv=2), "multiple of kv heads"),
])
def test_rejects_bad_geometry(bad, match):
    case = make_case([1], [4], **bad)
    with pytest.raises(ValueError, match=match):
        run_kernel(case, 1.0, True)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_rejects_bad_num_splits(bad):
    case = make_case([1], [4])
    with pytest.raises(ValueError, match="num_splits"):
        run_kernel(case, 1.0, True, num_splits=bad)


def test_rejects_bad_index_dtype_and_shapes():
    case = make_case([1, 2], [4, 5])
    case["kv_lens"] = case["kv_lens"].long()
    with pytest.raises(TypeError, match="kv_lens must be int32"):
        run_kernel(case, 1.0, True)
    case = make_case([1, 2], [4, 5])
    case["qo_indptr"] = case["qo_indptr"][:2]
    with pytest.raises(ValueError, match="batch mismatch"):
        run_kernel(case, 1.0, True)
    case = make_case([1, 2], [4, 5])
    case["k_cache"] = case["k_cache"].double()
    with pytest.raises(TypeError, match="dtypes must match"):
        run_kernel(case, 1.0, True)
