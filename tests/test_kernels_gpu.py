"""GPU checks of the Triton kernels (paged attention, acceptance) on realistic shapes in bf16.

Run on the H200: ``pytest tests/test_kernels_gpu.py``. Every test is marked ``gpu`` and skipped without
CUDA. The kernels' device times are a benchmark, not a test: bench/kernel_timings.py writes them to a file.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kernels.acceptance import accept_reference, accept_triton
from kernels.paged_attention import default_num_splits, paged_attention, paged_attention_reference

pytestmark = pytest.mark.gpu

DEV = "cuda"


def _paged_case(q_lens, kv_lens, *, page, hq, hkv, d, dtype, seed, pad_rows=3):
    """Random packed queries and a paged cache whose pages are shuffled across requests."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    B = len(q_lens)
    pages_per_req = [max(1, math.ceil(n / page)) for n in kv_lens]
    max_pages = max(pages_per_req) + 1
    num_pages = sum(pages_per_req) + 5
    perm = torch.randperm(num_pages, generator=g)
    block_tables = torch.full((B, max_pages), -1, dtype=torch.int32)  # unused entries must never be read
    used = 0
    for b, n in enumerate(pages_per_req):
        block_tables[b, :n] = perm[used:used + n].int()
        used += n
    k_cache = torch.randn(num_pages, page, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(num_pages, page, hkv, d, generator=g).to(dtype)
    indptr = torch.zeros(B + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(q_lens).cumsum(0)
    T = int(indptr[-1]) + pad_rows
    q = torch.randn(T, hq, d, generator=g).to(dtype)
    t = dict(q=q, k_cache=k_cache, v_cache=v_cache, qo_indptr=indptr,
             kv_lens=torch.tensor(kv_lens, dtype=torch.int32), block_tables=block_tables)
    return {k: v.to(DEV) for k, v in t.items()}


def _dense_sdpa(case, scale, causal):
    """Per-request dense attention with torch SDPA in fp32: an independent oracle."""
    q, kc, vc = case["q"], case["k_cache"], case["v_cache"]
    indptr, lens, bt = case["qo_indptr"].tolist(), case["kv_lens"].tolist(), case["block_tables"]
    page, hkv = kc.shape[1], kc.shape[2]
    group = q.shape[1] // hkv
    out = torch.zeros(q.shape, dtype=torch.float32, device=DEV)
    for b, L in enumerate(lens):
        s, e = indptr[b], indptr[b + 1]
        if e == s:
            continue
        pos = torch.arange(L, device=DEV)
        slots = bt[b, pos // page].long() * page + pos % page
        k = kc.reshape(-1, hkv, kc.shape[-1])[slots].float().repeat_interleave(group, 1).transpose(0, 1)
        v = vc.reshape(-1, hkv, kc.shape[-1])[slots].float().repeat_interleave(group, 1).transpose(0, 1)
        qb = q[s:e].float().transpose(0, 1)  # [Hq, n, D]
        n = e - s
        vis = (L - n + torch.arange(n, device=DEV) + 1)[:, None] if causal else torch.full((n, 1), L, device=DEV)
        mask = pos[None, :] < vis
        ob = F.scaled_dot_product_attention(qb[None], k[None], v[None], attn_mask=mask[None, None], scale=scale)[0]
        out[s:e] = ob.transpose(0, 1)
    return out


def _run(case, scale, causal, max_q_len=None, num_splits=None):
    return paged_attention(case["q"], case["k_cache"], case["v_cache"], qo_indptr=case["qo_indptr"],
                           kv_lens=case["kv_lens"], block_tables=case["block_tables"], scale=scale,
                           causal=causal, max_q_len=max_q_len, num_splits=num_splits)


def _reference(case, scale, causal):
    return paged_attention_reference(case["q"], case["k_cache"], case["v_cache"], qo_indptr=case["qo_indptr"],
                                     kv_lens=case["kv_lens"], block_tables=case["block_tables"], scale=scale,
                                     causal=causal)


def _rng_lens(n, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (n,), generator=g).tolist()


# bf16 tolerance: P is rounded to bf16 before the PV product and the output is bf16.
BF16_ATOL, BF16_RTOL = 2e-2, 2e-2

PARITY_CASES = [
    # name, q_lens, kv_lens, page, hq, hkv, d, causal
    ("decode_b256", [1] * 256, _rng_lens(256, 1, 1024, 1), 16, 32, 8, 128, True),
    ("verify_b64_kv4096", _rng_lens(64, 1, 8, 2), _rng_lens(64, 8, 4096, 3), 64, 16, 2, 128, True),
    ("drafter_block_noncausal", [8] * 32, _rng_lens(32, 8, 2048, 4), 16, 32, 8, 128, False),
    ("mixed_prefill_verify", [1500, 1, 4, 8, 2, 1, 7, 3, 5], [1500, 37, 250, 4096, 17, 1, 640, 64, 129],
     16, 32, 8, 128, True),
    ("mha_d64_page64", _rng_lens(48, 1, 8, 5), _rng_lens(48, 8, 3000, 6), 64, 8, 8, 64, True),
    ("head_dim_96", _rng_lens(16, 1, 8, 7), _rng_lens(16, 8, 700, 8), 16, 12, 4, 96, True),
]


@pytest.mark.parametrize("name,q_lens,kv_lens,page,hq,hkv,d,causal", PARITY_CASES, ids=[c[0] for c in PARITY_CASES])
def test_paged_attention_matches_reference_bf16(name, q_lens, kv_lens, page, hq, hkv, d, causal):
    kv_lens = [max(k, q) for q, k in zip(q_lens, kv_lens)]  # this step's rows are in the cache
    case = _paged_case(q_lens, kv_lens, page=page, hq=hq, hkv=hkv, d=d, dtype=torch.bfloat16, seed=len(name))
    scale = d ** -0.5
    out = _run(case, scale, causal)
    ref = _reference(case, scale, causal)
    n = int(case["qo_indptr"][-1])
    assert out.dtype == torch.bfloat16 and out.shape == case["q"].shape
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:n].float(), ref[:n].float(), atol=BF16_ATOL, rtol=BF16_RTOL)
    assert (out[n:] == 0).all(), "padding rows must be zero"
    if len(q_lens) <= 64:
        dense = _dense_sdpa(case, scale, causal)
        torch.testing.assert_close(out[:n].float(), dense[:n], atol=BF16_ATOL, rtol=BF16_RTOL)


def test_paged_attention_fp32_tight():
    q_lens, kv_lens = [1, 8, 3, 300], [900, 64, 2000, 300]
    case = _paged_case(q_lens, kv_lens, page=16, hq=8, hkv=2, d=128, dtype=torch.float32, seed=11)
    for causal in (True, False):
        out = _run(case, 0.088, causal)
        torch.testing.assert_close(out, _reference(case, 0.088, causal), atol=1e-4, rtol=1e-4)


def test_paged_attention_graph_capture_replays_new_lengths():
    """With max_q_len given the wrapper reads nothing on the host, so it can be captured."""
    q_lens, kv_lens = [4] * 16, _rng_lens(16, 8, 1000, 12)
    case = _paged_case(q_lens, [1100] * 16, page=16, hq=16, hkv=4, d=128, dtype=torch.bfloat16, seed=12)
    case["kv_lens"].copy_(torch.tensor(kv_lens, dtype=torch.int32))
    scale = 128 ** -0.5
    _run(case, scale, True, max_q_len=4)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _run(case, scale, True, max_q_len=4)
    for seed in (13, 14):
        case["kv_lens"].copy_(torch.tensor(_rng_lens(16, 4, 1100, seed), dtype=torch.int32, device=DEV))
        case["q"].normal_()
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.float(), _reference(case, scale, True).float(), atol=BF16_ATOL, rtol=BF16_RTOL)


# Split-KV path: batch-1/small-batch shapes where the base grid is a few programs.
SPLIT_CASES = [
    # name, q_lens, kv_lens, page, hq, hkv, d, causal
    ("smollm2_decode_b1", [1], [1000], 16, 9, 3, 64, True),
    ("smollm2_verify_b2", [5, 8], [700, 33], 16, 9, 3, 64, True),
    ("decode_b4_short_kv", [1] * 4, [1, 17, 64, 65], 16, 32, 8, 128, True),
    ("drafter_block_noncausal_b1", [8], [513], 16, 32, 8, 128, False),
    ("prefill_chunk_and_decode", [300, 1], [300, 2100], 64, 9, 3, 64, True),
]


def _poison_unused_cache(case):
    """NaN into every cache slot that is no request's valid key."""
    kc, vc = case["k_cache"], case["v_cache"]
    num_pages, page = kc.shape[:2]
    valid = torch.zeros(num_pages * page, dtype=torch.bool, device=DEV)
    for b, L in enumerate(case["kv_lens"].tolist()):
        pos = torch.arange(L, device=DEV)
        valid[case["block_tables"][b, pos // page].long() * page + pos % page] = True
    kc.view(num_pages * page, -1)[~valid] = float("nan")
    vc.view(num_pages * page, -1)[~valid] = float("nan")


@pytest.mark.parametrize("num_splits", [1, 2, 4, 8, 32, None], ids=lambda s: f"s{s}")
@pytest.mark.parametrize("name,q_lens,kv_lens,page,hq,hkv,d,causal", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_paged_attention_split_kv_matches_reference(name, q_lens, kv_lens, page, hq, hkv, d, causal, num_splits):
    case = _paged_case(q_lens, kv_lens, page=page, hq=hq, hkv=hkv, d=d, dtype=torch.bfloat16, seed=len(name))
    scale = d ** -0.5
    ref = _reference(case, scale, causal)
    _poison_unused_cache(case)  # a masked p = 0 times a NaN V row would leak NaN
    n = int(case["qo_indptr"][-1])
    torch.empty(1 << 24, device=DEV).fill_(float("nan"))  # leave NaN in the allocator's free blocks
    out = _run(case, scale, causal, num_splits=num_splits)
    assert torch.isfinite(out).all()
    assert (out[n:] == 0).all(), "padding rows must be zero"
    torch.testing.assert_close(out[:n].float(), ref[:n].float(), atol=BF16_ATOL, rtol=BF16_RTOL)


def test_paged_attention_split_kv_fp32_tight():
    case = _paged_case([1, 4], [1500, 77], page=16, hq=9, hkv=3, d=64, dtype=torch.float32, seed=15)
    for causal in (True, False):
        ref = _reference(case, 0.125, causal)
        for num_splits in (1, 3, 8, 32):
            torch.testing.assert_close(_run(case, 0.125, causal, num_splits=num_splits), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_splits", [8, None], ids=["s8", "default"])
@pytest.mark.parametrize("q_len,B", [(1, 1), (4, 3)], ids=["decode_b1", "verify_b3"])
def test_paged_attention_split_graph_capture_replays_new_lengths(q_len, B, num_splits):
    """The split path reads nothing on the host either (the chunk size comes from kv_lens on the
    device): a graph captured once replays correctly with new lengths, short ones included
    (most splits empty), and its torch.empty output keeps zero padding rows."""
    hq, hkv, d = 9, 3, 64  # SmolLM2
    if num_splits is None:
        assert default_num_splits(B * hkv * 1, torch.cuda.get_device_properties(0).multi_processor_count) > 1
    case = _paged_case([q_len] * B, [1100] * B, page=16, hq=hq, hkv=hkv, d=d, dtype=torch.bfloat16, seed=16)
    scale = d ** -0.5
    n = q_len * B
    _run(case, scale, True, max_q_len=q_len, num_splits=num_splits)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _run(case, scale, True, max_q_len=q_len, num_splits=num_splits)
    for lens in ([q_len] * B, [1100] * B, _rng_lens(B, q_len, 1100, 17), [max(q_len, 65)] * B, [64] * B):
        case["kv_lens"].copy_(torch.tensor(lens, dtype=torch.int32, device=DEV))
        case["q"].normal_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(out).all() and (out[n:] == 0).all()
        torch.testing.assert_close(out.float(), _reference(case, scale, True).float(), atol=BF16_ATOL, rtol=BF16_RTOL)


# --------------------------------------------------------------------------------------
# Acceptance
# --------------------------------------------------------------------------------------

def _accept_case(B, G, V, seed, greedy_frac=0.5):
    g = torch.Generator(device="cpu").manual_seed(seed)
    tp = torch.softmax(torch.randn(B, G + 1, V, generator=g) * 3, -1)
    dp = torch.softmax(torch.log(tp[:, :G]) + torch.randn(B, G, V, generator=g), -1)
    dt = torch.multinomial(dp.reshape(-1, V), 1, generator=g).view(B, G)
    dt = torch.where(torch.rand(B, G, generator=g) < 0.5, tp[:, :G].argmax(-1), dt)
    windows = torch.randint(0, G + 1, (B,), generator=g, dtype=torch.int32)
    t = dict(draft_tokens=dt, windows=windows, target_probs=tp.float(), draft_probs=dp.float(),
             greedy=torch.rand(B, generator=g) < greedy_frac, accept_uniforms=torch.rand(B, G, generator=g),
             sample_uniforms=torch.rand(B, generator=g))
    return {k: v.to(DEV) for k, v in t.items()}


@pytest.mark.parametrize("B,G,V", [(256, 8, 49152), (64, 4, 151936), (7, 1, 1000), (33, 8, 32000)])
def test_accept_triton_matches_reference_cuda(B, G, V):
    case = _accept_case(B, G, V, seed=B + G)
    ref = accept_reference(**case)
    out = accept_triton(**case)
    assert torch.equal(out.num_accepted, ref.num_accepted)
    assert torch.equal(out.next_token, ref.next_token)


def test_accept_triton_graph_capture():
    case = _accept_case(64, 8, 49152, seed=3)
    accept_triton(**case)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = accept_triton(**case)
    fresh = _accept_case(64, 8, 49152, seed=4)
    for k, v in fresh.items():
        case[k].copy_(v)
    graph.replay()
    torch.cuda.synchronize()
    ref = accept_reference(**case)
    assert torch.equal(out.num_accepted, ref.num_accepted) and torch.equal(out.next_token, ref.next_token)


def test_accept_triton_sampled_rule_is_lossless():
    """First emitted token ~ p_0 and, given d_1 accepted, second token ~ p_1 (chi-square)."""
    from scipy.stats import chi2

    N, V = 200_000, 5
    p0, q0 = torch.tensor([0.05, 0.40, 0.10, 0.25, 0.20]), torch.tensor([0.30, 0.10, 0.35, 0.05, 0.20])
    p1, q1 = torch.tensor([0.50, 0.05, 0.15, 0.10, 0.20]), torch.tensor([0.10, 0.40, 0.15, 0.15, 0.20])
    g = torch.Generator().manual_seed(0)
    d = torch.stack([torch.multinomial(q0, N, True, generator=g), torch.multinomial(q1, N, True, generator=g)], 1)
    case = dict(draft_tokens=d, windows=torch.full((N,), 2, dtype=torch.int32),
                target_probs=torch.stack([p0, p1, p0])[None].expand(N, 3, V).contiguous(),
                draft_probs=torch.stack([q0, q1])[None].expand(N, 2, V).contiguous(),
                greedy=torch.zeros(N, dtype=torch.bool), accept_uniforms=torch.rand(N, 2, generator=g),
                sample_uniforms=torch.rand(N, generator=g))
    case = {k: v.to(DEV) for k, v in case.items()}
    res = accept_triton(**case)
    n, d = res.num_accepted.long().cpu(), case["draft_tokens"].cpu()
    nxt = res.next_token.cpu()
    first = torch.where(n >= 1, d[:, 0], nxt)
    second = torch.where(n >= 2, d[:, 1], nxt)[n >= 1]
    for tokens, p in ((first, p0), (second, p1)):
        counts = torch.bincount(tokens, minlength=V).double()
        expected = p.double() * len(tokens)
        stat = float(((counts - expected) ** 2 / expected).sum())
        assert stat < chi2.ppf(1 - 1e-6, V - 1), f"chi2 = {stat:.1f}"


class TestVerifyPackingCuda:
    """kernels/verify_packing.py on CUDA: the verify step's row packing and state commit kernels give
    the torch reference's integers exactly, and replay from a CUDA graph on new device state."""

    @staticmethod
    def _state(R, G, page, seed, p_active=0.8):
        """Active rows with lengths near page boundaries, shuffled tables, ragged windows; padding rows
        anywhere with stale lengths. Returns (inputs on CUDA, windows zeroed on inactive rows)."""
        g = torch.Generator().manual_seed(seed)
        act = torch.rand(R, generator=g) < p_active
        n = (torch.randint(0, 40, (R,), generator=g) * page + torch.randint(-G - 1, 3, (R,), generator=g)).clamp(min=1)
        n = torch.where(act, n, torch.randint(0, 5 * page, (R,), generator=g))
        P = 50 + (G + page) // page  # room for ~100 committed steps (the timing replays advance seq_len)
        tables = torch.randperm(R * P + 7, generator=g)[: R * P].view(R, P).to(torch.int32)
        w = torch.where(act, torch.randint(0, G + 1, (R,), generator=g), 0)
        state = dict(active=act, seq_len=n, anchor=torch.randint(0, 150000, (R,), generator=g),
                     drafts=torch.randint(0, 150000, (R, G), generator=g), tables=tables)
        return {k: v.to(DEV) for k, v in state.items()}, w.to(DEV)

    @staticmethod
    def _assert_same(got, want, ctx):
        for name, g, w in zip(want._fields, got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, (name, ctx)
            assert torch.equal(g, w), (name, ctx, (g != w).nonzero()[:5].tolist())

    @pytest.mark.parametrize("G", [0, 1, 7, 15])
    @pytest.mark.parametrize("page", [16, 32])
    def test_pack_matches_reference(self, G, page):
        from kernels.verify_packing import pack_verify_rows_reference, pack_verify_rows_triton

        for i, R in enumerate((1, 3, 64, 255, 512)):
            state, w = self._state(R, G, page, seed=1000 * G + 10 * page + i, p_active=(0.8, 1.0)[i % 2])
            total = int(torch.where(state["active"], w + 1, 0).sum())
            for T in sorted({min(4096, total + 37), min(4096, max(total, 1)), max(1, total // 2), max(1, R // 3)}):
                want = pack_verify_rows_reference(windows=w, num_tokens=T, page_size=page, **state)
                got = pack_verify_rows_triton(windows=w, num_tokens=T, page_size=page, **state)
                self._assert_same(got, want, (G, page, R, T))

    @pytest.mark.parametrize("G", [1, 7, 15])
    @pytest.mark.parametrize("page", [16, 32])
    def test_draft_rows_match_reference(self, G, page):
        from kernels.verify_packing import draft_rows_reference, draft_rows_triton

        for i, R in enumerate((1, 3, 64, 255, 512)):
            state, _ = self._state(R, G, page, seed=7000 + 1000 * G + 10 * page + i, p_active=(0.8, 1.0)[i % 2])
            rows_in = dict(active=state["active"], seq_len=state["seq_len"], tables=state["tables"], block=G,
                           page_size=page)
            self._assert_same(draft_rows_triton(**rows_in), draft_rows_reference(**rows_in), (G, page, R))

    @pytest.mark.parametrize("G", [0, 7, 15])
    def test_commit_matches_reference(self, G):
        from kernels.verify_packing import commit_state_reference, commit_state_triton

        g = torch.Generator().manual_seed(G)
        for R in (1, 100, 512):
            act = torch.rand(R, generator=g) < 0.8
            w = torch.where(act, torch.randint(0, G + 1, (R,), generator=g), 0)
            k = torch.minimum(torch.randint(0, G + 2, (R,), generator=g), w)  # k = w often, k = 0 too
            case = {name: t.to(DEV) for name, t in dict(
                accepted=k, next_token=torch.randint(0, 150000, (R,), generator=g), windows=w, active=act,
                drafts=torch.randint(0, 150000, (R, G), generator=g)).items()}
            seq, anchor = torch.randint(1, 9000, (R + 4,), device=DEV), torch.randint(0, 150000, (R + 4,), device=DEV)
            res = []
            for fn in (commit_state_reference, commit_state_triton):
                b = (seq.clone(), anchor.clone(), torch.full((R + 4, G + 3), -7, dtype=torch.int64, device=DEV))
                fn(**case, seq_len=b[0][:R], anchor=b[1][:R], out=b[2][:R])
                res.append(b)
            for name, a, b in zip(("seq_len", "anchor", "out"), *res):
                assert torch.equal(a, b), (name, G, R)

    @pytest.mark.parametrize("G", [0, 7, 15])
    def test_accept_commit_greedy_matches_accept_then_commit(self, G):
        from dspark.verification import accept_greedy
        from kernels.verify_packing import accept_commit_greedy_triton, commit_state_reference

        g = torch.Generator().manual_seed(50 + G)
        M = G + 1
        for R in (1, 100, 512):
            act = torch.rand(R, generator=g) < 0.8
            w = torch.where(act, torch.randint(0, G + 1, (R,), generator=g), 0)
            drafts = torch.randint(0, 150000, (R, G), generator=g)
            T = R * M + 5
            rows_at = (torch.arange(R)[:, None] * M + torch.arange(M)[None, :]).clamp(max=T - 1)
            tokens = torch.randint(0, 150000, (T,), generator=g)
            agree = torch.randint(0, G + 1, (R,), generator=g)
            for r in range(R):  # the target's tokens agree with a prefix of each row's drafts
                tokens[rows_at[r, : agree[r]]] = drafts[r, : agree[r]]
            tokens, rows_at, w, act, drafts = (t.to(DEV) for t in (tokens, rows_at, w, act, drafts))
            seq, anchor = torch.randint(1, 9000, (R + 4,), device=DEV), torch.randint(0, 150000, (R + 4,), device=DEV)
            res = []
            for fused in (False, True):
                b = (seq.clone(), anchor.clone(), torch.full((R + 4, G + 3), -7, dtype=torch.int64, device=DEV))
                kw = dict(windows=w, active=act, drafts=drafts, seq_len=b[0][:R], anchor=b[1][:R], out=b[2][:R])
                if fused:
                    accept_commit_greedy_triton(tokens=tokens, rows_at=rows_at, **kw)
                else:
                    k, nxt = accept_greedy(drafts, tokens[rows_at], w)
                    commit_state_reference(accepted=k, next_token=nxt, **kw)
                res.append(b)
            for name, a, b in zip(("seq_len", "anchor", "out"), *res):
                assert torch.equal(a, b), (name, G, R)

    def test_graph_capture_replays_new_state(self):
        """Pack + commit captured once over persistent buffers (as GraphDecoder's verify stage does),
        replayed on fresh states, ragged windows and a cut, each equal to the reference."""
        from kernels.verify_packing import (PackedRows, commit_state_reference, commit_state_triton,
                                            pack_verify_rows_reference, pack_verify_rows_triton)

        R, G, page, T = 512, 7, 16, 3000  # 512 * 8 = 4096 tokens at most: the full blocks get cut
        state, w = self._state(R, G, page, seed=0)
        bufs = {k: v.clone() for k, v in state.items()}
        win = w.to(torch.int32).clone()
        k_buf = torch.zeros(R, dtype=torch.int64, device=DEV)
        nxt_buf = torch.zeros(R, dtype=torch.int64, device=DEV)
        out = PackedRows(*(t.clone() for t in pack_verify_rows_reference(windows=w, num_tokens=T, page_size=page,
                                                                         **state)))
        commit_out = torch.zeros((R, G + 3), dtype=torch.int64, device=DEV)

        def step():
            packed = pack_verify_rows_triton(windows=win, num_tokens=T, page_size=page, out=out, **bufs)
            commit_state_triton(accepted=k_buf, next_token=nxt_buf, windows=packed.windows, active=bufs["active"],
                                drafts=bufs["drafts"], anchor=bufs["anchor"], seq_len=bufs["seq_len"], out=commit_out)

        step()  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        for seed in range(1, 6):
            fresh, fw = self._state(R, G, page, seed=seed, p_active=(0.5, 0.9, 1.0)[seed % 3])
            for key, v in fresh.items():
                bufs[key].copy_(v)
            win.copy_(fw)
            k_buf.copy_(torch.minimum(torch.randint(0, G + 1, (R,), device=DEV), fw))
            nxt_buf.copy_(torch.randint(0, 150000, (R,), device=DEV))
            want = pack_verify_rows_reference(windows=fw, num_tokens=T, page_size=page, **fresh)
            ref_state = {key: fresh[key].clone() for key in ("seq_len", "anchor")}
            ref_out = torch.zeros_like(commit_out)
            commit_state_reference(accepted=k_buf, next_token=nxt_buf, windows=want.windows, active=fresh["active"],
                                   drafts=fresh["drafts"], anchor=ref_state["anchor"], seq_len=ref_state["seq_len"],
                                   out=ref_out)
            out.ids.fill_(-7)
            out.slot_mapping.fill_(-7)
            graph.replay()
            torch.cuda.synchronize()
            self._assert_same(out, want, seed)
            assert torch.equal(commit_out, ref_out)
            for key in ("seq_len", "anchor"):
                assert torch.equal(bufs[key], ref_state[key]), (key, seed)


# --------------------------------------------------------------------------------------
# Greedy argmax (kernels/argmax.py): index-exact against torch.argmax on CUDA
# --------------------------------------------------------------------------------------

class TestArgmaxTriton:
    V = 49152

    @staticmethod
    def _logits(T, V, dtype, seed):
        g = torch.Generator(device=DEV).manual_seed(seed)
        x = (torch.randn(T, V, device=DEV, generator=g) * 4).to(dtype)
        if T > 2:  # forced ties: equal maxima in distant chunks, and repeated inside one chunk
            x[0, [V * 4 // 5, min(7, V - 1), V * 3 // 5]] = 50.0
            x[1, [V // 2, min(V // 2 + 1, V - 1), min(V // 2 + 23, V - 1)]] = 50.0
            x[2, :] = -3.0
        return x

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    @pytest.mark.parametrize("T", [1, 2, 3, 7, 16, 33, 128, 300])
    def test_matches_torch_argmax(self, T, dtype):
        from kernels.argmax import argmax_triton

        for seed in range(3):
            x = self._logits(T, self.V, dtype, seed=T * 10 + seed)
            assert torch.equal(argmax_triton(x), torch.argmax(x, dim=-1))

    @pytest.mark.parametrize("T,V", [(1, 1), (5, 1000), (3, 1025), (9, 32000), (2, 151936), (4096, 49152)])
    def test_other_vocabularies_and_row_counts(self, T, V):
        from kernels.argmax import argmax_triton

        for dtype in (torch.bfloat16, torch.float32, torch.float16):
            x = self._logits(T, V, dtype, seed=V + T)
            assert torch.equal(argmax_triton(x), torch.argmax(x, dim=-1))

    def test_special_values_and_strides(self):
        from kernels.argmax import argmax_triton

        nan, inf = float("nan"), float("inf")
        wide = torch.randn(8, self.V + 64, device=DEV)
        x = wide[:, 32:32 + self.V]  # row stride != V
        x[0, [45000, 20000]] = nan
        x[1, 3] = inf
        x[1, 40000] = nan
        x[2] = -inf
        x[3] = -1.0
        x[3, [30000, 40000]] = torch.tensor([-0.0, 0.0], device=DEV)
        x[4] = nan
        x[5, 100] = -nan
        out = torch.full((8,), -5, dtype=torch.int64, device=DEV)
        for dtype in (torch.float32, torch.bfloat16):
            xs = wide.to(dtype)[:, 32:32 + self.V]
            assert argmax_triton(xs, out=out) is out
            assert out.cpu().tolist()[:6] == [20000, 40000, 0, 30000, 0, 100]
            # rows 6, 7 are random: compare per dtype (rounding to bf16 can create ties)
            assert torch.equal(out.cpu(), torch.argmax(xs.cpu(), dim=-1))
            assert torch.equal(out, torch.argmax(xs, dim=-1))

    def test_graph_capture_replays_new_data(self):
        """Seven calls per graph (one per drafted position), new logits before every replay."""
        from kernels.argmax import argmax_triton

        for T, dtype in ((1, torch.bfloat16), (16, torch.bfloat16), (300, torch.float32)):
            xs = [self._logits(T, self.V, dtype, seed=k) for k in range(7)]
            outs = [argmax_triton(x) for x in xs]  # warm-up: compile, workspace
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = [argmax_triton(x) for x in xs]
            for replay in range(3):
                for k, x in enumerate(xs):
                    x.copy_(self._logits(T, self.V, dtype, seed=1000 * (replay + 1) + k))
                graph.replay()
                torch.cuda.synchronize()
                for x, out in zip(xs, outs):
                    assert torch.equal(out, torch.argmax(x, dim=-1)), (T, dtype, replay)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    @pytest.mark.parametrize("T", [1, 7, 256, 300])
    def test_top_probability_in_the_same_pass(self, T, dtype):
        """top_out: the index as torch.argmax and top_probability_reference's value (rtol 1e-5), special rows
        included, into one column of a [T, 7] buffer."""
        from kernels.argmax import argmax_triton
        from kernels.top_probability import top_probability_reference

        for seed in range(2):
            x = self._logits(T, self.V, dtype, seed=T * 10 + seed) * (1 + 4 * seed)
            if T >= 7:
                x[3, 20000] = float("inf")
                x[4, 45000] = float("nan")
                x[5] = -float("inf")
                x[6, :30000] = -float("inf")
            buffer = torch.full((T, 7), -1.0, device=DEV)
            idx = argmax_triton(x, top_out=buffer[:, 2])
            assert torch.equal(idx, torch.argmax(x, dim=-1))
            torch.testing.assert_close(buffer[:, 2], top_probability_reference(x), rtol=1e-5, atol=0.0,
                                       equal_nan=True)
            assert (buffer[:, [0, 1, 3, 4, 5, 6]] == -1.0).all()

    def test_top_probability_graph_replays_new_data(self):
        """The greedy draft's seven slots through the engine's dispatcher (greedy_argmax with top_out), in a
        captured graph, new logits before every replay."""
        from dspark.config import KernelConfig
        from dspark.sampling import greedy_argmax
        from kernels.top_probability import top_probability_reference

        kernels = KernelConfig(attention_backend="triton", triton_argmax=True, triton_top_probability=True)
        for T, dtype in ((1, torch.float32), (16, torch.bfloat16), (256, torch.float32)):
            xs = [self._logits(T, self.V, dtype, seed=k) for k in range(7)]
            buffer = torch.zeros(T, 7, device=DEV)
            outs = [greedy_argmax(x, kernels, top_out=buffer[:, k]) for k, x in enumerate(xs)]  # warm-up
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = [greedy_argmax(x, kernels, top_out=buffer[:, k]) for k, x in enumerate(xs)]
            for replay in range(3):
                for k, x in enumerate(xs):
                    x.copy_(self._logits(T, self.V, dtype, seed=1000 * (replay + 1) + k) * (1 + replay))
                buffer.zero_()
                graph.replay()
                torch.cuda.synchronize()
                for x, out in zip(xs, outs):
                    assert torch.equal(out, torch.argmax(x, dim=-1)), (T, dtype, replay)
                want = torch.stack([top_probability_reference(x) for x in xs], 1)
                torch.testing.assert_close(buffer, want, rtol=1e-5, atol=0.0,
                                           msg=lambda m: f"T={T} {dtype} replay {replay}: {m}")

    @staticmethod
    def _same_gap(got, want, msg=""):
        """Bitwise equal float32 gaps, NaN where the reference is NaN, a zero gap of either sign."""
        assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape, msg
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan), msg
        assert torch.equal((got[~nan] + 0.0).view(torch.int32), (want[~nan] + 0.0).view(torch.int32)), msg

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
    @pytest.mark.parametrize("T", [1, 7, 16, 256, 300])
    def test_top_gap_in_the_same_pass(self, T, dtype):
        """gap_out: the index as torch.argmax and top_gap_reference's gap bitwise, special rows included, alone
        and beside top_out, into columns of a [T, 7] buffer, over many chunks per row and over one."""
        from kernels.argmax import argmax_triton, top_gap_reference
        from kernels.top_probability import top_probability_reference

        nan, inf = float("nan"), float("inf")
        for seed in range(2):
            x = self._logits(T, self.V, dtype, seed=T * 10 + seed + 5) * (1 + 4 * seed)  # rows 0-2: ties (gap 0)
            if T >= 7:
                x[3, 20000] = inf  # a finite runner-up: +inf
                x[4, 45000] = nan
                x[5] = -inf  # -inf - -inf: NaN
                x[6] = -inf
                x[6, 30000] = -2.0  # a finite maximum over -inf: +inf
            if T >= 16:
                x[7, [100, 40000]] = inf  # inf - inf: NaN
                x[8:10].clamp_(-4.0, 4.0)  # small values: top_probability_reference's logsumexp stays precise
                x[8, [3, 49151]] = torch.tensor([7.5, 8.0], device=DEV, dtype=dtype)  # first and last chunk
                x[9, [0, 49151]] = 8.0  # a tie across the first and last chunk
                x[10, 7] = -nan
            want = top_gap_reference(x)
            self._same_gap(want, top_gap_reference(x.cpu()).to(DEV))
            for kw in ({}, {"tiles": 64}):  # the default tiling, and one chunk per row
                buffer = torch.full((T, 7), -1.0, device=DEV)
                idx = argmax_triton(x, gap_out=buffer[:, 2], **kw)
                assert torch.equal(idx, torch.argmax(x, dim=-1))
                self._same_gap(buffer[:, 2], want, (T, dtype, seed, kw))
                assert (buffer[:, [0, 1, 3, 4, 5, 6]] == -1.0).all()
                idx = argmax_triton(x, top_out=buffer[:, 5], gap_out=buffer[:, 4], **kw)
                assert torch.equal(idx, torch.argmax(x, dim=-1))
                self._same_gap(buffer[:, 4], want, (T, dtype, seed, kw, "with top_out"))
                torch.testing.assert_close(buffer[:, 5], top_probability_reference(x), rtol=1e-5, atol=0.0,
                                           equal_nan=True)
                assert (buffer[:, [0, 1, 3, 6]] == -1.0).all()
            if T >= 16:
                assert want[:3].tolist() == [0.0] * 3 and want[[3, 6]].tolist() == [inf, inf]
                assert want[[4, 5, 7, 10]].isnan().all() and want[8].item() == 0.5 and want[9].item() == 0.0

    def test_top_gap_alone_is_the_one_pass_kernel_in_graphs(self):
        """dspark.sampling.top_gap on CUDA with triton_argmax on (the sampled draft's slots): the argmax kernel's
        own pass, bitwise the reference, written into a slot's column of a [rows, slots] buffer, in a captured
        graph with new logits before every replay; with triton_argmax off, the reference."""
        from dspark.config import KernelConfig
        from dspark.sampling import top_gap
        from kernels.argmax import top_gap_reference

        on = KernelConfig(attention_backend="triton", triton_argmax=True)
        off = KernelConfig(attention_backend="triton", triton_argmax=False)
        for T, dtype in ((1, torch.float32), (256, torch.bfloat16)):
            x = self._logits(T, self.V, dtype, seed=3)
            self._same_gap(top_gap(x, off)[:, None], top_gap_reference(x)[:, None], (T, dtype, "off"))
            gaps = torch.zeros(T, 3, device=DEV)
            top_gap(x, on, out=gaps[:, 1])  # warm-up: compile, workspace
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                top_gap(x, on, out=gaps[:, 1])
            for replay in range(2):
                x.copy_(self._logits(T, self.V, dtype, seed=50 + replay) * (1 + replay))
                gaps.zero_()
                graph.replay()
                torch.cuda.synchronize()
                self._same_gap(gaps[:, 1:2], top_gap_reference(x)[:, None], (T, dtype, replay))
                assert (gaps[:, 0] == 0).all() and (gaps[:, 2] == 0).all()

    @pytest.mark.parametrize("with_top", [False, True])
    def test_top_gap_graph_replays_new_data(self, with_top):
        """The greedy draft's seven slots through the engine's dispatcher (greedy_argmax with gap_out, and top_out
        where triton_top_probability is on), in a captured graph, new logits before every replay."""
        from dspark.config import KernelConfig
        from dspark.sampling import greedy_argmax
        from kernels.argmax import top_gap_reference
        from kernels.top_probability import top_probability_reference

        kernels = KernelConfig(attention_backend="triton", triton_argmax=True, triton_top_probability=with_top)
        for T, dtype in ((1, torch.float32), (16, torch.bfloat16), (256, torch.float32)):
            xs = [self._logits(T, self.V, dtype, seed=k) for k in range(7)]
            gaps, tops = torch.zeros(T, 7, device=DEV), torch.zeros(T, 7, device=DEV)

            def slots():
                return [greedy_argmax(x, kernels, top_out=tops[:, k] if with_top else None, gap_out=gaps[:, k])
                        for k, x in enumerate(xs)]

            outs = slots()  # warm-up: compile, workspace
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = slots()
            for replay in range(3):
                for k, x in enumerate(xs):
                    x.copy_(self._logits(T, self.V, dtype, seed=1000 * (replay + 1) + k) * (1 + replay))
                    if T >= 16 and replay == 1:
                        x[3, 5 + k] = float("nan")
                        x[4] = -float("inf")
                gaps.zero_()
                tops.zero_()
                graph.replay()
                torch.cuda.synchronize()
                for x, out in zip(xs, outs):
                    assert torch.equal(out, torch.argmax(x, dim=-1)), (T, dtype, replay)
                self._same_gap(gaps, torch.stack([top_gap_reference(x) for x in xs], 1), (T, dtype, replay))
                if with_top:
                    want = torch.stack([top_probability_reference(x) for x in xs], 1)
                    torch.testing.assert_close(tops, want, rtol=1e-5, atol=0.0, equal_nan=True,
                                               msg=lambda m: f"T={T} {dtype} replay {replay}: {m}")
                else:
                    assert (tops == 0).all()

    def test_capture_without_workspace_raises(self):
        from kernels import argmax as argmax_mod

        rows = argmax_mod._workspace(torch.device(DEV), 1).rows + 1
        x = torch.randn(rows, self.V, device=DEV, dtype=torch.bfloat16)
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="before capturing"):
            with torch.cuda.graph(graph):
                argmax_mod.argmax_triton(x)


# --------------------------------------------------------------------------------------
# Top-token probability (kernels/top_probability.py): the reference's values on CUDA, inside a graph too
# --------------------------------------------------------------------------------------

class TestTopProbabilityCuda:
    V = 49152

    @staticmethod
    def _logits(T, V, dtype, seed):
        g = torch.Generator(device=DEV).manual_seed(seed)
        scale = torch.rand(T, 1, device=DEV, generator=g) * 20  # flat to very peaked rows
        x = (torch.randn(T, V, device=DEV, generator=g) * scale).to(dtype)
        if T > 2:
            x[0, [V // 3, V - 1]] = 40.0  # a tie between distant tiles
            x[1] = -2.0  # flat: 1 / V
        return x

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
    @pytest.mark.parametrize("T", [1, 7, 256, 300])
    def test_matches_the_reference(self, T, dtype):
        from kernels.top_probability import top_probability_reference, top_probability_triton

        for seed in range(2):
            x = self._logits(T, self.V, dtype, seed=T * 10 + seed)
            torch.testing.assert_close(top_probability_triton(x), top_probability_reference(x), rtol=1e-5, atol=0.0)

    def test_special_rows_strides_and_out(self):
        from kernels.top_probability import top_probability_reference, top_probability_triton

        nan, inf = float("nan"), float("inf")
        wide = torch.randn(8, self.V + 64, device=DEV) * 3
        x = wide[:, 32:32 + self.V]  # row stride != V
        x[0, 20000] = inf
        x[1, 45000] = nan
        x[2] = -inf
        x[3] = -inf
        x[3, [100, 40000]] = 1.0  # 1/2
        x[4, :30000] = -inf
        x[5, 7] = -nan
        buffer = torch.full((8, 7), -1.0, device=DEV)
        for dtype in (torch.float32, torch.bfloat16):
            xs = wide.to(dtype)[:, 32:32 + self.V]
            got = top_probability_triton(xs, out=buffer[:, 3])
            assert got.data_ptr() == buffer[:, 3].data_ptr()
            want = top_probability_reference(xs)
            torch.testing.assert_close(buffer[:, 3], want, rtol=1e-5, atol=0.0, equal_nan=True)
            assert buffer[[0, 1, 2, 5], 3].isnan().all() and buffer[3, 3].item() == 0.5
            assert (buffer[:, [0, 1, 2, 4, 5, 6]] == -1.0).all()

    def test_graph_capture_replays_new_data(self):
        """Seven slots per graph written into the columns of a [T, 7] buffer, through the engine's dispatcher,
        new logits before every replay."""
        from dspark.config import KernelConfig
        from dspark.sampling import top_probability, triton_top_probability_enabled
        from kernels.top_probability import top_probability_reference

        kernels = KernelConfig(attention_backend="triton", triton_top_probability=True)
        assert triton_top_probability_enabled(kernels, DEV)
        for T, dtype in ((1, torch.float32), (256, torch.float32), (16, torch.bfloat16)):
            xs = [self._logits(T, self.V, dtype, seed=k) for k in range(7)]
            buffer = torch.zeros(T, 7, device=DEV)
            for k, x in enumerate(xs):  # warm-up: compile
                top_probability(x, kernels, out=buffer[:, k])
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for k, x in enumerate(xs):
                    top_probability(x, kernels, out=buffer[:, k])
            for replay in range(3):
                for k, x in enumerate(xs):
                    x.copy_(self._logits(T, self.V, dtype, seed=1000 * (replay + 1) + k))
                buffer.zero_()
                graph.replay()
                torch.cuda.synchronize()
                want = torch.stack([top_probability_reference(x) for x in xs], 1)
                torch.testing.assert_close(buffer, want, rtol=1e-5, atol=0.0,
                                           msg=lambda m: f"T={T} {dtype} replay {replay}: {m}")


# --------------------------------------------------------------------------------------
# L2 weight prefetch (kernels/l2_prefetch.py)
# --------------------------------------------------------------------------------------

class TestDraftLogitsCuda:
    """kernels/draft_logits.py on CUDA: the reference's bits at SmolLM2's vocabulary, and a drafter's draft (tokens,
    confidence, sampled probabilities) unchanged by engine.kernels.fused_draft_logits."""

    @pytest.mark.parametrize("M", [1, 7, 256])
    def test_same_bits_as_the_reference(self, M):
        from kernels.draft_logits import draft_slot_logits_reference, draft_slot_logits_triton

        g = torch.Generator(device=DEV).manual_seed(M)
        block = (torch.randn(M, 7, 49152, device=DEV, generator=g) * 4).to(torch.bfloat16)
        bias = torch.randn(M, 49152, device=DEV, generator=g).to(torch.bfloat16)
        gate = torch.rand(M, 1, device=DEV, generator=g)
        for k in (0, 3, 6):
            for gt in (None, gate):
                want = draft_slot_logits_reference(block[:, k], bias, gt)
                got = draft_slot_logits_triton(block[:, k], bias, gt)
                assert torch.equal(got.view(torch.int32), want.view(torch.int32))

    @pytest.mark.parametrize("variant", ["vanilla", "gated", "rnn"])
    def test_draft_is_unchanged_by_the_fused_logits(self, variant):
        from dspark.config import DrafterConfig, KernelConfig, ModelConfig
        from dspark.models.drafter import DSparkDrafter
        from dspark.sampling import RowSampling, greedy_argmax, sample_rows

        cfg = ModelConfig(arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=4,
                          num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=1e5)
        torch.manual_seed(0)
        drafter = DSparkDrafter(cfg, DrafterConfig(block_size=7, num_layers=1, target_layer_ids=(0, 1, 3),
                                                   markov_rank=32, markov_variant=variant)).to(DEV, torch.bfloat16)
        with torch.no_grad():
            for p in drafter.markov_head.parameters():
                p.mul_(20.0)  # a bias that changes the drawn tokens
        B = 64
        hidden = torch.randn(B, 7, 576, device=DEV).to(torch.bfloat16)
        lm_head = (torch.randn(49152, 576, device=DEV) * 0.05).to(torch.bfloat16)
        anchor = torch.randint(3, 49000, (B,), device=DEV)
        temperature = torch.where(torch.arange(B, device=DEV) % 2 == 0, 0.0, 0.8)
        rows = RowSampling.from_tensors(temperature, torch.zeros(B, dtype=torch.int64, device=DEV),
                                        torch.ones(B, device=DEV), all_greedy=False, needs_k=False, needs_p=False)
        uni = torch.rand(B, 7, device=DEV)
        runs = {}
        for fused in (False, True):
            kernels = KernelConfig(attention_backend="triton", fused_draft_logits=fused)
            probs = []

            def sampled(logits, k):
                tokens, p = sample_rows(logits, rows, uni[:, k])
                probs.append(p)
                return tokens

            with torch.inference_mode():
                greedy = drafter.draft(hidden, anchor, lm_head, lambda lg, k: greedy_argmax(lg, kernels),
                                       keep_logits=True, kernels=kernels)
                drawn = drafter.draft(hidden, anchor, lm_head, sampled, keep_logits=False, kernels=kernels)
            runs[fused] = (greedy, drawn, torch.stack(probs, 1))
        (g0, s0, p0), (g1, s1, p1) = runs[False], runs[True]
        assert torch.equal(g0.tokens, g1.tokens) and torch.equal(g0.logits, g1.logits)
        assert torch.equal(g0.confidence_logits, g1.confidence_logits)
        assert torch.equal(s0.tokens, s1.tokens) and torch.equal(p0, p1)
        assert len(set(g0.tokens[:, 1:].flatten().tolist())) > 20  # real draws, not one repeated token


class TestConfidenceSurvivalCuda:
    """kernels/confidence_survival.py on CUDA at the shipped drafter's shapes (d 576, Markov rank 32, block 7,
    bf16): the head's logits are the layer's value reduced in fp32 and rounded once to bf16 (one unit away at
    most, where the order of the reduction rounds apart), within cuBLAS's bf16 rounding of its bf16 layer, and the
    survival is the calibration's prefix product of them (sts_bias, sts_max_prob with the slots' top
    probabilities, sts_top_gap with their top-2 gaps); inside a CUDA graph too."""

    @pytest.mark.parametrize("score", [None, "max_prob", "top_gap"])
    def test_matches_the_reference_at_the_drafters_shapes(self, score):
        from kernels.confidence_survival import (BlockConfidence, confidence_survival_reference,
                                                 confidence_survival_triton)

        g = torch.Generator().manual_seed(5)
        G, d, rank, V = 7, 576, 32, 49152
        weights = dict(embedding=(torch.randn(V, rank, generator=g) * 0.3).to(DEV, torch.bfloat16),
                       head_weight=(torch.randn(1, d + rank, generator=g) * 0.05).to(DEV, torch.bfloat16),
                       head_bias=torch.tensor([0.2]).to(DEV, torch.bfloat16),
                       temperatures=(torch.rand(G, generator=g) + 0.6).to(DEV),
                       biases=(torch.randn(G, generator=g) * 0.2).to(DEV), offsets=None)
        same = total = 0
        for R in (1, 64, 256):
            case = dict(hidden=torch.randn(R, G, d, generator=g).to(DEV, torch.bfloat16),
                        anchor=torch.randint(0, V, (R,), generator=g).to(DEV),
                        tokens=torch.randint(0, V, (R, G), generator=g).to(DEV),
                        active=(torch.rand(R, generator=g) < 0.8).to(DEV), **weights)
            if score is not None:  # top probabilities in [0, 1), or gaps in [0, 6)
                case.update({score: (torch.rand(R, G, generator=g) * (1.0 if score == "max_prob" else 6.0)).to(DEV),
                             f"{score}_weights": (torch.randn(G, generator=g) * 0.4).to(DEV)})
            want = confidence_survival_reference(**case)
            out = BlockConfidence(torch.zeros(R, G, device=DEV), torch.zeros(R, G, device=DEV))
            graph = torch.cuda.CUDAGraph()
            confidence_survival_triton(**case, out=out)  # compile outside the capture
            with torch.cuda.graph(graph):
                confidence_survival_triton(**case, out=out)
            out.logits.zero_()
            graph.replay()
            torch.cuda.synchronize()
            # The layer's value with an fp32 reduction, rounded once to bf16 (cuBLAS may reduce in bf16:
            # torch's allow_bf16_reduced_precision_reduction), is what the kernel computes, up to its order.
            G_ = torch.arange(G, device=DEV)
            before = torch.where(G_ == 0, case["anchor"][:, None], case["tokens"][:, (G_ - 1).clamp(min=0)])
            feats = torch.cat((case["hidden"], F.embedding(before, case["embedding"])), -1).float()
            exact = F.linear(feats, case["head_weight"].float(), case["head_bias"].float()).squeeze(-1)
            exact = exact.to(torch.bfloat16).float()
            ulp = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(1e-3))) - 7)
            assert ((out.logits - exact).abs() <= ulp).all(), (R, (out.logits - exact).abs().max())
            # cuBLAS's layer, reduced in bf16, errs by up to bf16's unit roundoff on the sum of the terms'
            # magnitudes (not on the result's): a wrong input slot or token would miss by far more
            terms = (feats.abs() * case["head_weight"].float().abs()).sum(-1) + case["head_bias"].float().abs()
            assert ((out.logits - want.logits).abs() <= ulp + 2.0 ** -8 * terms).all(), (
                R, (out.logits - want.logits).abs().max())
            same += int((out.logits == exact).sum())
            total += exact.numel()
            x = out.logits / case["temperatures"] + case["biases"]
            if score == "max_prob":
                from dspark.survival import max_prob_logit

                x = x + case["max_prob_weights"] * max_prob_logit(case["max_prob"])
            if score == "top_gap":
                x = x + case["top_gap_weights"] * case["top_gap"]
            from_logits = torch.where(case["active"][:, None], torch.cumprod(torch.sigmoid(x), 1), 0.0)
            torch.testing.assert_close(out.survival, from_logits, rtol=1e-5, atol=1e-6)
        assert same >= 0.9 * total, (same, total)


class TestDraftSamplingCuda:
    """kernels/draft_sampling.py on CUDA at SmolLM2's vocabulary: the reference's tokens (a neighbour only where
    the uniform falls within rounding of a boundary) and probabilities, written into a slot of a [R, G, V]
    buffer, inside a captured graph too."""

    def test_matches_the_reference_at_256_rows(self):
        from kernels.draft_sampling import sample_slot_reference, sample_slot_triton

        g = torch.Generator(device=DEV).manual_seed(5)
        M, V = 256, 49152
        logits = torch.randn(M, V, device=DEV, generator=g) * 4
        temperature = torch.where(torch.arange(M, device=DEV) % 3 == 0, 0.0, 0.7)
        u = torch.rand(M, device=DEV, generator=g)
        buffer = torch.zeros(M, 7, V, device=DEV)
        want_t, want_p = sample_slot_reference(logits, temperature, u)
        got_t, _ = sample_slot_triton(logits, temperature, u, probs_out=buffer[:, 3])
        torch.testing.assert_close(buffer[:, 3], want_p, rtol=1e-4, atol=1e-7)
        cdf = torch.cumsum(want_p.double(), 1)
        for r in torch.nonzero(got_t != want_t).flatten().tolist():
            assert temperature[r] > 0, r  # greedy rows: the same first index of the maximum
            lo = min(int(got_t[r]), int(want_t[r]))
            assert abs(cdf[r, lo].item() - u[r].item() * cdf[r, -1].item()) < 1e-5, r
        assert (got_t != want_t).sum().item() <= 2
        graph = torch.cuda.CUDAGraph()
        out = torch.zeros(M, V, device=DEV)
        sample_slot_triton(logits, temperature, u, probs_out=out)  # compile outside the capture
        with torch.cuda.graph(graph):
            replay_t, _ = sample_slot_triton(logits, temperature, u, probs_out=out)
        u.copy_(torch.rand(M, device=DEV, generator=g))
        graph.replay()
        fresh_t, _ = sample_slot_triton(logits, temperature, u)
        assert torch.equal(replay_t, fresh_t)

    def test_the_gap_at_256_rows_equals_the_reference_in_a_graph_too(self):
        """gap_out: each row's top-2 logit gap, top_gap_reference bitwise (ties and special rows included), into a
        slot's column of a [R, G] buffer, the draw unchanged; and replayed from a captured graph."""
        from kernels.argmax import top_gap_reference
        from kernels.draft_sampling import sample_slot_triton

        g = torch.Generator(device=DEV).manual_seed(9)
        M, V = 256, 49152
        logits = torch.randn(M, V, device=DEV, generator=g) * 4
        logits[1, [7, 40000]] = 30.0  # a tie across tiles
        logits[2, [7, 9]] = 30.0  # within a tile
        logits[3, 100] = float("nan")
        logits[4, [5, 6000]] = float("inf")
        logits[5] = -float("inf")
        logits[5, 3] = 0.5
        temperature = torch.where(torch.arange(M, device=DEV) % 3 == 0, 0.0, 0.7)
        u = torch.rand(M, device=DEV, generator=g)
        gaps = torch.full((M, 7), -1.0, device=DEV)
        tokens, _ = sample_slot_triton(logits, temperature, u, gap_out=gaps[:, 2])
        torch.testing.assert_close(gaps[:, 2], top_gap_reference(logits), rtol=0, atol=0, equal_nan=True)
        assert gaps[1, 2] == 0 and gaps[2, 2] == 0 and gaps[3, 2].isnan() and gaps[4, 2].isnan()
        assert gaps[5, 2] == float("inf") and (gaps[:, [0, 1, 3, 4, 5, 6]] == -1.0).all()
        keep = torch.ones(M, dtype=torch.bool, device=DEV)
        keep[[3, 4]] = False  # the draw of a row with a NaN or two infinities is not specified
        assert torch.equal(tokens[keep], sample_slot_triton(logits, temperature, u)[0][keep])
        graph, out = torch.cuda.CUDAGraph(), torch.zeros(M, device=DEV)
        sample_slot_triton(logits, temperature, u, gap_out=out)  # compile outside the capture (a unit stride)
        with torch.cuda.graph(graph):
            sample_slot_triton(logits, temperature, u, gap_out=out)
        logits.copy_(torch.randn(M, V, device=DEV, generator=g))
        graph.replay()
        torch.testing.assert_close(out, top_gap_reference(logits), rtol=0, atol=0)


class TestL2PrefetchCuda:
    def test_sums_match_the_reference(self):
        from kernels.l2_prefetch import l2_prefetch, l2_prefetch_reference

        g = torch.Generator(device=DEV).manual_seed(5)
        tensors = [torch.randint(-8, 9, (n,), device=DEV, generator=g).to(torch.bfloat16)
                   for n in (576 * 960, 576 * 576, 3072 * 576, 7)]
        got = l2_prefetch(tensors).clone()
        assert torch.equal(got.cpu(), l2_prefetch_reference(tensors))


class TestDecodeMegakernelCuda:
    """kernels/decode_megakernel.py compiled: the one-launch form (grid barrier) against the
    one-launch-per-phase form (the same code and reductions, so bitwise equal: a barrier that let a
    phase start early would show), both against the reference; graph replays with new lengths."""

    @staticmethod
    def _stack(dtype, L=30, bias=False, seed=0):  # SmolLM2-135M's shape
        from kernels.decode_megakernel import random_stack_weights

        return random_stack_weights(layers=L, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536,
                                    dtype=dtype, device=DEV, bias=bias, seed=seed, scale=0.05, theta=100000.0)

    @staticmethod
    def _case(w, kv_len, dtype, page=16, pages=160, seed=1):
        g = torch.Generator(device=DEV).manual_seed(seed)
        shape = (w.num_layers, pages, page, w.num_kv_heads, w.head_dim)
        kc = torch.randn(shape, generator=g, device=DEV).to(dtype)
        vc = torch.randn(shape, generator=g, device=DEV).to(dtype)
        table = torch.randperm(pages - 1, generator=g, device=DEV)[: -(-kv_len // page)].to(torch.int32)
        pos = kv_len - 1
        slot = int(table[pos // page]) * page + pos % page
        x = torch.randn(1, w.hidden, generator=g, device=DEV).to(dtype)
        dev = lambda v, dt=torch.int64: torch.tensor([v], device=DEV, dtype=dt)  # noqa: E731
        return x, dev(pos), dev(slot), table, dev(kv_len, torch.int32), kc, vc

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    @pytest.mark.parametrize("kv_len", [1, 17, 512, 1000, 2047])
    def test_one_launch_equals_phase_launches_and_the_reference(self, dtype, kv_len):
        from kernels.decode_megakernel import decode_megakernel, decode_stack_reference

        w = self._stack(dtype, L=30 if dtype == torch.bfloat16 else 6, bias=kv_len == 17)
        x, pos, slot, table, kvl, kc, vc = self._case(w, kv_len, dtype)
        kr, vr = kc.clone(), vc.clone()
        want = decode_stack_reference(w, x, pos, slot, table, kvl, kr, vr)
        outs = []
        for sync in (False, True, True):
            k, v = kc.clone(), vc.clone()
            k.flatten(1, 2)[:, int(slot)] = float("nan")
            v.flatten(1, 2)[:, int(slot)] = float("nan")
            out = torch.full_like(x, float("nan"))
            decode_megakernel(w, x, pos, slot, table, kvl, k, v, out=out, sync=sync)
            outs.append((out, k, v))
        for out, k, v in outs[1:]:  # the grid barrier changes nothing, launch after launch
            assert torch.equal(out, outs[0][0]) and torch.equal(k, outs[0][1]) and torch.equal(v, outs[0][2])
        out, k, v = outs[0]
        if dtype == torch.float32:
            torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(k, kr, rtol=1e-4, atol=1e-4)
        else:  # bf16: rounding points are the reference's; summation orders differ
            assert (out.float() - want.float()).abs().max().item() < 0.05 * want.float().abs().max().item()
            assert (k.float() - kr.float()).abs().max().item() < 0.05 * kr.float().abs().max().item()

    @pytest.mark.parametrize("programs", [None, 32, 7])
    def test_graph_replays_follow_new_positions(self, programs):
        from kernels.decode_megakernel import decode_megakernel

        dtype = torch.bfloat16
        w = self._stack(dtype, L=8, seed=3)
        x, pos, slot, table, kvl, kc, vc = self._case(w, 300, dtype, seed=4)
        out = torch.empty_like(x)
        # warm-up: compile, workspace
        decode_megakernel(w, x, pos, slot, table, kvl, kc, vc, out=out, programs=programs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # (capture runs nothing)
            decode_megakernel(w, x, pos, slot, table, kvl, kc, vc, out=out, programs=programs)
        ke, ve = kc.clone(), vc.clone()  # the eager twin's caches, from the same state
        for n in (301, 302, 304, 1):  # (the table holds 19 pages: 304 positions)
            p = n - 1
            s = int(table[p // 16]) * 16 + p % 16
            pos.fill_(p)
            slot.fill_(s)
            kvl.fill_(n)
            x.copy_(torch.randn_like(x))
            graph.replay()
            want = decode_megakernel(w, x, pos, slot, table, kvl, ke, ve, sync=False, programs=programs)
            torch.cuda.synchronize()
            assert torch.equal(out, want), n
        assert torch.equal(kc, ke) and torch.equal(vc, ve)

    def test_refuses_more_programs_than_sms(self):
        from kernels.decode_megakernel import megakernel_programs

        sms = torch.cuda.get_device_properties(0).multi_processor_count
        assert megakernel_programs(torch.device(DEV)) == sms
        assert megakernel_programs(torch.device(DEV), 7) == 7
        with pytest.raises(ValueError, match="resident"):
            megakernel_programs(torch.device(DEV), sms + 1)
