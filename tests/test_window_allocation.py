"""Window allocation: torch reference and Triton kernel against a brute-force Python ranking."""

import random

import pytest
import torch

from kernels.window_allocation import allocate_windows, allocate_windows_reference, allocate_windows_triton

POISON = -7


def brute_force(survival, budget, min_len, block, active=None):
    """Rank every cell by (value desc, position asc, request asc) in plain Python; count the top-n per request."""
    B, G = len(survival), len(survival[0]) if survival else 0
    active = [True] * B if active is None else active
    cells = [(-survival[r][g], g, r) for r in range(B) for g in range(G) if active[r]]
    cells.sort()
    counts = [0] * B
    for _, _, r in cells[:budget]:
        counts[r] += 1
    return [min(max(c, min_len), block) if active[r] else 0 for r, c in enumerate(counts)]


def tied_survival(B, G, gen):
    """Cumulative products of confidences drawn from a few dyadic values: many exact ties, zeros included."""
    conf = torch.tensor([[gen.choice([1.0, 0.5, 0.75, 0.25, 0.0, 1.0]) for _ in range(G)] for _ in range(B)])
    return torch.cumprod(conf, dim=1)


def smooth_survival(B, G, gen):
    conf = torch.tensor([[gen.uniform(0.3, 1.0) for _ in range(G)] for _ in range(B)], dtype=torch.float32)
    return torch.cumprod(conf, dim=1)


@pytest.mark.parametrize("seed", range(6))
def test_reference_matches_brute_force_with_ties(seed):
    gen = random.Random(seed)
    B, G = gen.randint(1, 12), gen.randint(1, 8)
    surv = tied_survival(B, G, gen) if seed % 2 == 0 else smooth_survival(B, G, gen)
    active = [gen.random() < 0.8 for _ in range(B)]
    for budget in sorted({0, 1, gen.randint(0, B * G), B * G - 1, B * G, B * G + 5}):
        for min_len in (0, 1, min(2, G)):
            for act in (None, active):
                got = allocate_windows_reference(survival=surv, budget=budget, min_verify_len=min_len, block=G,
                                                 active=None if act is None else torch.tensor(act))
                want = brute_force(surv.tolist(), max(budget, 0), min_len, G, act)
                assert got.dtype == torch.int32
                assert got.tolist() == want, (surv, budget, min_len, act)


def test_selected_cells_form_a_prefix_and_budget_is_exact():
    gen = random.Random(11)
    surv = tied_survival(9, 6, gen)
    for budget in range(0, 9 * 6 + 1):
        w = allocate_windows_reference(survival=surv, budget=budget, min_verify_len=0, block=6)
        assert int(w.sum()) == budget  # no clamp: exactly the budget's cells, each request a prefix of them
        for r in range(9):
            # Every cell inside the window ranks at least as high as every cell outside it.
            inside = surv[r, : w[r]]
            outside = surv[r, w[r]:]
            if len(inside) and len(outside):
                assert float(inside.min()) >= float(outside.max())


def test_tie_order_is_position_then_request():
    surv = torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]])
    # budget 3: (pos0,r0), (pos0,r1), (pos1,r0)
    assert allocate_windows_reference(survival=surv, budget=3, min_verify_len=0, block=3).tolist() == [2, 1]
    assert allocate_windows_reference(survival=surv, budget=1, min_verify_len=0, block=3).tolist() == [1, 0]


def test_budget_edges_and_clamp():
    surv = torch.tensor([[0.9, 0.8, 0.1], [0.95, 0.2, 0.1]])
    assert allocate_windows_reference(survival=surv, budget=0, min_verify_len=0, block=3).tolist() == [0, 0]
    assert allocate_windows_reference(survival=surv, budget=0, min_verify_len=1, block=3).tolist() == [1, 1]
    assert allocate_windows_reference(survival=surv, budget=100, min_verify_len=1, block=3).tolist() == [3, 3]
    # block below G caps the count
    assert allocate_windows_reference(survival=surv, budget=100, min_verify_len=0, block=2).tolist() == [2, 2]
    # 0-d tensor budget (device path) agrees with the int
    assert allocate_windows_reference(survival=surv, budget=torch.tensor(3), min_verify_len=0, block=3).tolist() == [2, 1]
    # inactive rows get 0 and do not consume budget
    act = torch.tensor([False, True])
    assert allocate_windows_reference(survival=surv, budget=2, min_verify_len=1, block=3, active=act).tolist() == [0, 2]


def test_bad_arguments_are_refused():
    surv = torch.ones(2, 3)
    with pytest.raises(ValueError, match="min_verify_len"):
        allocate_windows_reference(survival=surv, budget=1, min_verify_len=4, block=3)
    with pytest.raises(ValueError, match="budget"):
        allocate_windows_reference(survival=surv, budget=-1, min_verify_len=0, block=3)
    with pytest.raises(ValueError, match="0-d"):
        allocate_windows_reference(survival=surv, budget=torch.tensor([1]), min_verify_len=0, block=3)
    with pytest.raises(ValueError, match="impl"):
        allocate_windows(survival=surv, budget=1, min_verify_len=0, block=3, impl="cuda")


@pytest.mark.parametrize("B,G", [(1, 1), (1, 8), (5, 3), (17, 7), (64, 8)])
def test_triton_matches_reference(B, G):
    # The interpreter costs ~1 s per call at 64 x 8, so each shape runs a short list of awkward cases.
    gen = random.Random(B * 100 + G)
    active = torch.tensor([gen.random() < 0.75 for _ in range(B)])
    cases = [("tied", 0, None, False), ("tied", (B * G) // 3, active, True), ("tied", B * G + 2, None, True),
             ("smooth", max(1, (B * G) // 2), active, False)]
    for kind, budget, act, as_tensor in cases:
        surv = tied_survival(B, G, gen) if kind == "tied" else smooth_survival(B, G, gen)
        want = allocate_windows_reference(survival=surv, budget=budget, min_verify_len=1, block=G, active=act)
        out = torch.full((B,), POISON, dtype=torch.int32)
        b = torch.tensor(budget) if as_tensor else budget
        got = allocate_windows_triton(survival=surv, budget=b, min_verify_len=1, block=G, active=act, out=out)
        assert got is out
        assert got.tolist() == want.tolist(), (kind, surv, budget, act)
        assert got.tolist() == brute_force(surv.tolist(), budget, 1, G, None if act is None else act.tolist())


def test_triton_handles_strided_and_float64_input():
    gen = random.Random(5)
    base = tied_survival(6, 10, gen).double()
    surv = base[:, :5]  # non-contiguous rows
    want = allocate_windows_reference(survival=surv, budget=9, min_verify_len=0, block=5)
    out = torch.full((6,), POISON, dtype=torch.int32)
    assert allocate_windows_triton(survival=surv, budget=9, min_verify_len=0, block=5, out=out).tolist() == want.tolist()
    assert allocate_windows(survival=surv, budget=9, min_verify_len=0, block=5, impl="triton").tolist() == want.tolist()
