"""Draft-block rows, verify-step row packing and state commit: torch references vs per-token Python oracles,
and the Triton kernels (CPU interpreter) vs the references, bitwise, over random device states; the
decoder's fused metadata path end to end. On CUDA see tests/test_kernels_gpu.py."""

import random

import pytest
import torch  # does not import triton

from interpreter_only import interpreter_module  # noqa: E402  (tests/interpreter_only.py)

interpreter_module()

from kernels.verify_packing import (DraftRows, PackedRows, accept_commit_greedy_triton,  # noqa: E402
                                    commit_state_reference, commit_state_triton, draft_rows_reference,
                                    draft_rows_triton, pack_verify_rows_reference, pack_verify_rows_triton,
                                    triton_runnable)

POISON = -7


def random_state(gen: random.Random, R: int, G: int, page: int, p_active: float = 0.75):
    """Rows as a decoder holds them: active rows with committed lengths near page boundaries (so the
    verified positions cross into the next page), shuffled page tables, ragged windows 0..G;
    inactive (padding) rows anywhere, with stale lengths and windows that must be ignored."""
    act = [gen.random() < p_active for _ in range(R)]
    n = []
    for a in act:
        if a:
            pages_before = gen.randint(0, 5)
            n.append(max(1, pages_before * page + gen.randint(-G - 1, 2)))
        else:
            n.append(gen.choice([0, 1, gen.randint(0, 6 * page)]))
    P = 7 + (G + page) // page
    pool = list(range(R * P + 3))
    gen.shuffle(pool)
    tables = torch.tensor(pool[: R * P], dtype=torch.int32).view(R, P)
    raw_w = [gen.randint(0, G) for _ in range(R)]
    return dict(
        active=torch.tensor(act), seq_len=torch.tensor(n, dtype=torch.int64),
        anchor=torch.tensor([gen.randint(0, 50000) for _ in range(R)], dtype=torch.int64),
        drafts=torch.tensor([[gen.randint(0, 50000) for _ in range(G)] for _ in range(R)],
                            dtype=torch.int64).view(R, G),
        tables=tables, page_size=page,
    ), torch.tensor(raw_w, dtype=torch.int64)


def poisoned(R: int, T: int, M: int) -> PackedRows:
    full = lambda shape, dt: torch.full(shape, POISON, dtype=dt)  # noqa: E731
    return PackedRows(indptr=full((R + 1,), torch.int32), windows=full((R,), torch.int64),
                      kv_lens=full((R,), torch.int32), ids=full((T,), torch.int64), pos=full((T,), torch.int64),
                      slot_mapping=full((T,), torch.int64), rows_at=full((R, M), torch.int64))


def assert_same(got: PackedRows, want: PackedRows, ctx) -> None:
    for name in PackedRows._fields:
        g, w = getattr(got, name), getattr(want, name)
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, w.dtype, g.shape, w.shape, ctx)
        assert torch.equal(g, w), (name, g, w, ctx)


def oracle(state, windows, T):
    """Per-token Python packing: rows in order, each [anchor, d_1..d_w], cut at T."""
    act, n, anchor = state["active"].tolist(), state["seq_len"].tolist(), state["anchor"].tolist()
    drafts, tables, page = state["drafts"].tolist(), state["tables"].tolist(), state["page_size"]
    R, G = len(act), state["drafts"].shape[1]
    ids, pos, slots, indptr, wins, kv = [0] * T, [0] * T, [-1] * T, [0], [], []
    t = 0
    for r in range(R):
        q = windows[r] + 1 if act[r] else 0
        start = t
        for j in range(q):
            if t >= T:
                break
            p = n[r] - 1 + j
            ids[t] = anchor[r] if j == 0 else drafts[r][j - 1]
            pos[t] = p
            slots[t] = tables[r][p // page] * page + p % page
            t += 1
        indptr.append(t)
        wins.append(max(t - start - 1, 0))
        kv.append(n[r] - 1 + (t - start) if act[r] else 1)
    rows_at = [[min(indptr[r] + j, T - 1) for j in range(G + 1)] for r in range(R)]
    return dict(indptr=indptr, windows=wins, kv_lens=kv, ids=ids, pos=pos, slot_mapping=slots, rows_at=rows_at)


@pytest.mark.parametrize("seed", range(8))
def test_reference_matches_a_per_token_oracle(seed):
    gen = random.Random(seed)
    G = [0, 1, 3, 7][seed % 4]
    R = gen.randint(1, 9)
    state, raw = random_state(gen, R, G, page=[4, 16][seed % 2])
    w = torch.where(state["active"], raw, 0)
    total = int(torch.where(state["active"], w + 1, 0).sum())
    for T in sorted({1, max(1, total - 3), max(1, total), total + 5}):
        got = pack_verify_rows_reference(windows=w, num_tokens=T, **state)
        want = oracle(state, w.tolist(), T)
        for name, value in want.items():
            assert getattr(got, name).tolist() == value, (name, T, state, w)


def draft_oracle(state, G):
    """Per-position Python placement of each row's draft block (the module docstring's rule)."""
    act, n, tables, page = state["active"].tolist(), state["seq_len"].tolist(), state["tables"].tolist(), \
        state["page_size"]
    pos, slots, kv = [], [], []
    for r in range(len(act)):
        start = n[r] - 1 if act[r] else 0
        kv.append(start + G if act[r] else 1)
        for j in range(G):
            pos.append(start + j)
            slots.append(tables[r][(start + j) // page] * page + (start + j) % page if act[r] else -1)
    return dict(positions=pos, kv_lens=kv, slot_mapping=slots)


@pytest.mark.parametrize("G", [1, 4, 7, 15])
@pytest.mark.parametrize("page", [4, 16])
def test_draft_rows_reference_and_triton_match_a_per_position_oracle(G, page):
    """Active rows' blocks cross page boundaries; inactive rows (stale lengths, 0 included) get the 0-based block,
    KV length 1 and no slot; the kernel writes what the reference computes, bitwise, dtypes and shapes included."""
    gen = random.Random(G * 10 + page)
    for case in range(6):
        R = [1, 2, gen.randint(3, 20), gen.randint(65, 130), 64, gen.randint(1, 64)][case]
        p_active = [1.0, 0.5, 0.75, 0.9, 0.0, 0.3][case]
        state, _ = random_state(gen, R, G, page, p_active=p_active)
        rows_in = dict(active=state["active"], seq_len=state["seq_len"], tables=state["tables"], block=G,
                       page_size=page)
        want = draft_rows_reference(**rows_in)
        for name, value in draft_oracle(state, G).items():
            assert getattr(want, name).tolist() == value, (name, G, page, case)
        got = draft_rows_triton(**rows_in)
        for name in DraftRows._fields:
            g, w = getattr(got, name), getattr(want, name)
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), (name, g, w, G, page, case)


def test_draft_rows_refuse_bad_inputs():
    gen = random.Random(1)
    state, _ = random_state(gen, 4, 3, 16)
    rows_in = dict(active=state["active"], seq_len=state["seq_len"], tables=state["tables"], block=3, page_size=16)
    for fn in (draft_rows_reference, draft_rows_triton):
        with pytest.raises(ValueError, match="tables must be int32"):
            fn(**{**rows_in, "tables": state["tables"].long()})
        with pytest.raises(ValueError, match="seq_len must be int64"):
            fn(**{**rows_in, "seq_len": state["seq_len"].int()})
        with pytest.raises(ValueError, match="block >= 1"):
            fn(**{**rows_in, "block": 0})
        with pytest.raises(ValueError, match="active must be bool"):
            fn(**{**rows_in, "active": state["active"].long()})


def _buckets(gen, R, total):
    """Bucket sizes around the packed total: padding past it, an exact fit, and cuts (incl. T < R)."""
    return sorted({total + gen.randint(1, 40), max(total, 1), max(1, total - gen.randint(1, 6)),
                   max(1, gen.randint(1, max(1, total // 2))), max(1, R // 2)})


@pytest.mark.parametrize("G", [0, 1, 7, 15])
@pytest.mark.parametrize("page", [16, 32])
def test_triton_matches_reference_on_random_states(G, page):
    gen = random.Random(G * 100 + page)
    for case in range(8):
        R = [1, 2, gen.randint(3, 20), gen.randint(21, 64), 64, 1, gen.randint(1, 64), gen.randint(1, 64)][case]
        p_active = [1.0, 0.75, 0.5, 0.9, 0.0, 0.0, 0.2, 0.95][case]
        state, raw = random_state(gen, R, G, page, p_active=p_active)
        w = torch.where(state["active"], raw, 0)
        total = int(torch.where(state["active"], w + 1, 0).sum())
        for T in _buckets(gen, R, total):
            want = pack_verify_rows_reference(windows=w, num_tokens=T, **state)
            out = poisoned(R, T, G + 1)
            got = pack_verify_rows_triton(windows=w, num_tokens=T, out=out, **state)
            assert all(a is b for a, b in zip(got, out))
            assert_same(got, want, (G, page, R, T, case))


def test_triton_accepts_the_decoders_window_forms():
    """The decoder hands the kernel its windows as they come: one int (full), a stride-0 expand of the
    tier (uniform), int32 allocations plus min_verify_len (ragged); inactive rows may say anything."""
    gen = random.Random(3)
    G, R, page = 7, 37, 16
    state, raw = random_state(gen, R, G, page, p_active=0.7)
    act = state["active"]
    total_full = int(act.sum()) * (G + 1)
    tier = torch.tensor([3], dtype=torch.int64)
    alloc = torch.randint(0, G, (R,), dtype=torch.int32)  # garbage on inactive rows on purpose
    forms = [(G, 0, torch.full((R,), G)), (tier.expand(R), 0, tier.expand(R).clone()),
             (alloc, 1, 1 + alloc.long()), (raw, 0, raw)]
    for src, offset, dense in forms:
        w = torch.where(act, dense, 0)
        for T in (total_full + 9, max(1, total_full // 3)):
            want = pack_verify_rows_reference(windows=w, num_tokens=T, **state)
            got = pack_verify_rows_triton(windows=src, window_offset=offset, num_tokens=T, **state)
            assert_same(got, want, (type(src), offset, T))


@pytest.mark.parametrize("R,G,T", [(1500, 1, 2900), (700, 15, 16384), (2048, 7, 2048)])
def test_triton_large_batches_and_buckets(R, G, T):
    """Many row programs and several row chunks per program; padding spread over many programs."""
    gen = random.Random(R + G)
    state, raw = random_state(gen, R, G, page=16, p_active=0.8)
    w = torch.where(state["active"], raw, 0)
    want = pack_verify_rows_reference(windows=w, num_tokens=T, **state)
    assert_same(pack_verify_rows_triton(windows=w, num_tokens=T, out=poisoned(R, T, G + 1), **state), want, (R, G, T))


def _commit_case(gen, R, G):
    act = torch.tensor([gen.random() < 0.7 for _ in range(R)])
    w = torch.tensor([gen.randint(0, G) if a else 0 for a in act.tolist()], dtype=torch.int64)
    # k = 0, k = w and in between, on active and inactive rows alike
    k = torch.tensor([gen.choice([0, wi, gen.randint(0, wi)]) for wi in w.tolist()], dtype=torch.int64)
    return dict(accepted=k, next_token=torch.randint(0, 50000, (R,)), windows=w, active=act,
                drafts=torch.randint(0, 50000, (R, G)))


@pytest.mark.parametrize("G", [0, 1, 7, 15])
def test_commit_triton_matches_reference(G):
    gen = random.Random(G)
    for R in (1, 5, 64, 300):
        case = _commit_case(gen, R, G)
        S = R + 3  # the decoder's buffers are longer than the step's rows
        seq = torch.randint(1, 5000, (S,))
        anchor = torch.randint(0, 50000, (S,))
        bufs = {}
        for impl, fn in (("torch", commit_state_reference), ("triton", commit_state_triton)):
            b = dict(seq_len=seq.clone(), anchor=anchor.clone(), out=torch.full((S, G + 3), POISON, dtype=torch.int64))
            fn(**case, seq_len=b["seq_len"][:R], anchor=b["anchor"][:R], out=b["out"][:R])
            bufs[impl] = b
        for name in ("seq_len", "anchor", "out"):
            assert torch.equal(bufs["triton"][name], bufs["torch"][name]), (name, G, R, case)
        ref = bufs["torch"]
        act, k = case["active"], case["accepted"]
        assert torch.equal(ref["seq_len"][:R], seq[:R] + torch.where(act, k + 1, 0))
        assert torch.equal(ref["out"][:R, 2:].gather(1, k[:, None]).squeeze(1), case["next_token"])
        assert (ref["out"][R:] == POISON).all() and torch.equal(ref["seq_len"][R:], seq[R:])


@pytest.mark.parametrize("G", [0, 1, 7, 15])
def test_accept_commit_greedy_matches_accept_greedy_then_commit(G):
    """The fused greedy kernel writes what dspark.verification.accept_greedy followed by commit_state_reference
    write: target tokens read through rows_at (packed rows, padding after them), drafts that match a prefix of
    any length (0, inside the window, the whole window, past it), inactive rows left as they are."""
    from dspark.verification import accept_greedy

    gen = random.Random(100 + G)
    seen = []
    for R in (1, 5, 64, 300):
        case = _commit_case(gen, R, G)
        act, w, drafts = case["active"], case["windows"], case["drafts"]
        M, T = G + 1, R * (G + 1) + 9
        rows_at = (torch.arange(R)[:, None] * M + torch.arange(M)[None, :]).clamp(max=T - 1)
        tokens = torch.randint(0, 50000, (T,))
        for r in range(R):  # the target agrees with a prefix of the drafts of random length (up to all G)
            agree = gen.randint(0, G)
            tokens[rows_at[r, :agree]] = drafts[r, :agree]
        S = R + 3
        seq, anchor = torch.randint(1, 5000, (S,)), torch.randint(0, 50000, (S,))
        bufs = {}
        for impl in ("torch", "triton"):
            b = dict(seq_len=seq.clone(), anchor=anchor.clone(), out=torch.full((S, G + 3), POISON, dtype=torch.int64))
            kw = dict(windows=w, active=act, drafts=drafts, seq_len=b["seq_len"][:R], anchor=b["anchor"][:R],
                      out=b["out"][:R])
            if impl == "torch":
                k, nxt = accept_greedy(drafts, tokens[rows_at], w)
                commit_state_reference(accepted=k, next_token=nxt, **kw)
            else:
                accept_commit_greedy_triton(tokens=tokens, rows_at=rows_at, **kw)
            bufs[impl] = b
        for name in ("seq_len", "anchor", "out"):
            assert torch.equal(bufs["triton"][name], bufs["torch"][name]), (name, G, R)
        seen.append((bufs["torch"]["out"][:R, 0], w))
    k, w = torch.cat([a for a, _ in seen]), torch.cat([b for _, b in seen])
    if G:  # the cases happened: a partial prefix (G > 1), a whole window accepted
        assert bool(((k == w) & (w > 0)).any()) and (G == 1 or bool(((k > 0) & (k < w)).any())), (k, w)


def test_accept_commit_greedy_refuses_bad_inputs():
    gen = random.Random(3)
    case = _commit_case(gen, 4, 3)
    kw = dict(windows=case["windows"], active=case["active"], drafts=case["drafts"],
              seq_len=torch.ones(4, dtype=torch.int64), anchor=torch.zeros(4, dtype=torch.int64),
              out=torch.zeros((4, 6), dtype=torch.int64))
    rows_at = torch.arange(16).view(4, 4)
    with pytest.raises(ValueError, match="rows_at must be int64"):
        accept_commit_greedy_triton(tokens=torch.zeros(16, dtype=torch.int64), rows_at=rows_at[:, :3], **kw)
    with pytest.raises(ValueError, match="tokens must be an integer tensor"):
        accept_commit_greedy_triton(tokens=torch.zeros(16), rows_at=rows_at, **kw)
    with pytest.raises(ValueError, match="out must be int64"):
        accept_commit_greedy_triton(tokens=torch.zeros(16, dtype=torch.int64), rows_at=rows_at,
                                    **{**kw, "out": torch.zeros((4, 5), dtype=torch.int64)})


def test_refusals_say_what_to_change(monkeypatch):
    gen = random.Random(0)
    state, raw = random_state(gen, 4, 3, 16)
    with pytest.raises(ValueError, match="num_tokens"):
        pack_verify_rows_triton(windows=raw, num_tokens=0, **state)
    with pytest.raises(ValueError, match="windows must be an integer tensor"):
        pack_verify_rows_triton(windows=raw.float(), num_tokens=8, **state)
    with pytest.raises(ValueError, match="out.ids"):
        pack_verify_rows_triton(windows=raw, num_tokens=8, out=poisoned(4, 9, 4), **state)
    with pytest.raises(ValueError, match="tables must be int32"):
        pack_verify_rows_reference(windows=raw, num_tokens=8, **{**state, "tables": state["tables"].long()})
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1.*engine.kernels.fused_step_metadata=false"):
        triton_runnable("cpu")
    with pytest.raises(RuntimeError, match="CUDA tensors"):
        pack_verify_rows_triton(windows=raw, num_tokens=8, **state)


def test_graph_decoder_fused_metadata_emits_what_the_eager_engine_emits(tmp_path, monkeypatch):
    """The decoder with metadata_impl="triton" (full and ragged steps) emits the eager engine's tokens,
    and its draft and verify steps ran the kernels, not the torch ops."""
    import kernels.verify_packing as vp
    from dspark.config import SamplingParams
    from dspark.engine import Engine
    from test_engine_scheduling import steep_table
    from tiny import tiny_drafter, tiny_engine_config, tiny_target

    target = tiny_target(6)
    drafter = tiny_drafter(target, 11, block_size=4)
    table = steep_table(Engine(target, None, tiny_engine_config(cuda_graphs=True, budget_lag=1), drafter),
                        tmp_path / "t.json")
    prompts = [[3 + (7 * i + j) % 90 for j in range(5 + 3 * i)] for i in range(5)]
    params = [SamplingParams(max_tokens=10 + 3 * (i % 2), ignore_eos=True) for i in range(5)]
    base = [o.token_ids for o in Engine(target, None, tiny_engine_config(), drafter).generate(prompts, params)]
    calls = {"pack": 0, "commit": 0, "draft": 0, "accept_commit": 0}

    def counted(name, fn):
        def wrapper(**kw):
            calls[name] += 1
            return fn(**kw)
        return wrapper

    monkeypatch.setattr(vp, "pack_verify_rows_triton", counted("pack", vp.pack_verify_rows_triton))
    monkeypatch.setattr(vp, "commit_state_triton", counted("commit", vp.commit_state_triton))
    monkeypatch.setattr(vp, "draft_rows_triton", counted("draft", vp.draft_rows_triton))
    monkeypatch.setattr(vp, "accept_commit_greedy_triton", counted("accept_commit", vp.accept_commit_greedy_triton))
    for name in ("pack_verify_rows_reference", "commit_state_reference", "draft_rows_reference"):
        monkeypatch.setattr(vp, name, lambda **kw: pytest.fail("the torch metadata path ran"))
    for verify in ("full", "ragged"):
        kw = dict(verify=verify, cost_table=table, budget_lag=1) if verify != "full" else {}
        eng = Engine(target, None, tiny_engine_config(cuda_graphs=True, max_num_seqs=4, **kw), drafter)
        assert eng.graph.metadata_impl == "torch"  # the CPU engine's default
        eng.graph.metadata_impl = "triton"
        outs = [o.token_ids for o in eng.generate(prompts, params)]
        assert outs == base, verify
        c = eng.counters()
        # greedy rows: acceptance and commit in one launch; every step drafted (no draft-free steps here)
        assert c["graph_eager_steps"] > 0 and calls["pack"] == calls["accept_commit"] == c["graph_eager_steps"]
        assert calls["draft"] == c["graph_eager_steps"] and calls["commit"] == 0
        calls.update(pack=0, commit=0, draft=0, accept_commit=0)
        if verify == "ragged":
            assert c["trimmed_steps"] > 0


def test_engine_picks_the_fused_metadata_on_the_triton_backend():
    """engine.attention_backend=triton runs the fused kernels; engine.kernels.fused_step_metadata=false
    turns them off."""
    from dspark.engine import Engine
    from tiny import tiny_engine_config, tiny_target

    target = tiny_target(0)
    for on, backend, want in ((True, "triton", "triton"), (False, "triton", "torch"), (True, "torch", "torch")):
        eng = Engine(target, None, tiny_engine_config(spec="off", cuda_graphs=True, attention_backend=backend,
                                                      kernels={"fused_step_metadata": on}))
        assert eng.graph.metadata_impl == want, (on, backend)


def test_graph_decoder_refuses_an_unknown_or_unrunnable_metadata_impl(monkeypatch):
    from dspark.engine import Engine
    from dspark.graph_decode import GraphDecoder
    from tiny import tiny_engine_config, tiny_target

    eng = Engine(tiny_target(0), None, tiny_engine_config(spec="off", cuda_graphs=True), None)
    args = (eng.runner, 2, 4, (2,), False)
    with pytest.raises(ValueError, match="metadata_impl"):
        GraphDecoder(*args, metadata_impl="cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="engine.kernels.fused_step_metadata=false"):
        GraphDecoder(*args, metadata_impl="triton")
