"""Non-anticipation: the paper's Appendix A example, run through real rejection sampling and the planner.

Setup (one request, block 2, vocabulary {A, B}):
  target p_1 = (0.7, 0.3); drafter q_1 = (0.5, 0.5), so draft 1 is accepted with
  sum_x min(p, q) = 0.8 = c_1. The Markov confidence of position 2 reads the drafted
  x_1: c_2 = 0.9 after A, 0.0 after B. Step time T(M) = 1 / SPS(M) with SPS(1, 2, 3) =
  (1.0, 0.5, 0.45): T = (1, 2, 2.2222) ms for M = window + 1 tokens.

Global search over FRESH survival (the guard bypassed on purpose):
  x_1 = A: survival (0.8, 0.72): tau/T = 1.0, 0.9, 1.134 for windows 0, 1, 2 -> window 2
           (the full block); A is accepted with min(1, 0.7/0.5) = 1 -> output A.
  x_1 = B: survival (0.8, 0.0): tau/T = 1.0, 0.9, 0.81 -> window 0; the target samples
           p_1 directly -> A with 0.7.
  P(Y = A) = 0.5 * 1 + 0.5 * 0.7 = 0.85, not the target's 0.7.
Algorithm 1 (greedy_stop) and global search over LAGGED survival decide before reading
x_1, so the first output token keeps the target's 0.7. Every check uses a binomial
tolerance of Z = 4.5 standard errors for N samples.
"""

import math
import random

import pytest

from dspark.cost_table import CostTable
from dspark.planner import Planner, PlannerConfig, plan_budget

A, B = 0, 1
P_TARGET = [(0.7, 0.3), (0.5, 0.5), (0.6, 0.4)]  # target at positions 1, 2 and the bonus position 3
Q_DRAFT = [(0.5, 0.5), (0.5, 0.5)]
C1 = 0.8
C2_AFTER = {A: 0.9, B: 0.0}
APPENDIX_TABLE = CostTable(token_counts=(1, 2, 3), theta_ms=(1.0, 2.0, 1.0 / 0.45))
N = 20000
Z = 4.5


def sample(dist, rng):
    return A if rng.random() < dist[0] else B


def rejection_verify(drafts, window, rng):
    """Standard speculative acceptance of drafts[:window]; returns the committed tokens."""
    out = []
    for k in range(window):
        x = drafts[k]
        p, q = P_TARGET[k], Q_DRAFT[k]
        if rng.random() < min(1.0, p[x] / q[x]):
            out.append(x)
            continue
        residual = [max(p[i] - q[i], 0.0) for i in (A, B)]
        total = sum(residual)
        out.append(sample((residual[A] / total, residual[B] / total), rng))
        return out
    out.append(sample(P_TARGET[window], rng))  # bonus token from the target
    return out


def draft_block(rng):
    drafts = [sample(Q_DRAFT[0], rng), sample(Q_DRAFT[1], rng)]
    survival = [C1, C1 * C2_AFTER[drafts[0]]]
    return drafts, survival


def run_pure(config, table, rng, temperature_positive):
    """Monte Carlo with the pure planner; decisions memoised per survival (plan_budget is deterministic)."""
    cache = {}
    first_a = 0
    windows = []
    for _ in range(N):
        drafts, surv = draft_block(rng)
        key = tuple(surv)
        if key not in cache:
            cache[key] = plan_budget(ranking_survival=[surv], sizing_survival=[surv], table=table, config=config,
                                     temperature_positive=temperature_positive)
        w = cache[key].windows[0]
        windows.append(w)
        first_a += rejection_verify(drafts, w, rng)[0] == A
    return first_a / N, windows


def tol(p):
    return Z * math.sqrt(p * (1 - p) / N)


def test_global_search_over_fresh_confidence_biases_the_output():
    # temperature_positive=False here lies to the planner: it is the guard that the real config enforces.
    cfg = PlannerConfig(block=2, algorithm="global", budget_lag=0, min_verify_len=0, min_predicted_gain=0.0,
                        temperature_positive=False)
    p_a, windows = run_pure(cfg, APPENDIX_TABLE, random.Random(1), temperature_positive=False)
    assert abs(p_a - 0.85) < tol(0.85), p_a
    assert p_a - 0.7 > 10 * tol(0.7)
    assert set(windows) == {0, 2}


def test_greedy_stop_keeps_the_target_distribution():
    cfg = PlannerConfig(block=2, algorithm="greedy_stop", budget_lag=0, min_verify_len=0, min_predicted_gain=0.0,
                        temperature_positive=True)
    p_a, windows = run_pure(cfg, APPENDIX_TABLE, random.Random(2), temperature_positive=True)
    assert abs(p_a - 0.7) < tol(0.7), p_a
    assert set(windows) == {0}  # Theta_1 = 0.9 < Theta_0 = 1.0: it stops before reading c_2


def test_greedy_stop_that_verifies_drafts_is_still_lossless():
    # T(2) = 1.5, T(3) = 2.0: Theta = 1.0, 1.2, then 1.26 after A (admit) or stop after B. Draft 1 is always
    # verified, draft 2 only after A: the decision on each draft reads only the tokens before it.
    table = CostTable(token_counts=(1, 2, 3), theta_ms=(1.0, 1.5, 2.0))
    cfg = PlannerConfig(block=2, algorithm="greedy_stop", budget_lag=0, min_verify_len=0, min_predicted_gain=0.0)
    p_a, windows = run_pure(cfg, table, random.Random(3), temperature_positive=True)
    assert abs(p_a - 0.7) < tol(0.7), p_a
    assert set(windows) == {1, 2}


def test_global_search_over_lagged_confidence_keeps_the_target_distribution():
    cfg = PlannerConfig(block=2, algorithm="global", budget_lag=1, min_verify_len=0, min_predicted_gain=0.0,
                        temperature_positive=True)
    planner = Planner(cfg, APPENDIX_TABLE)
    rng = random.Random(4)
    first_a = 0
    windows = []
    for _ in range(N):
        drafts, surv = draft_block(rng)  # the previous step's block sized this step's budget
        w = planner.plan([surv], [0]).windows[0]
        windows.append(w)
        first_a += rejection_verify(drafts, w, rng)[0] == A
    p_a = first_a / N
    assert abs(p_a - 0.7) < tol(0.7), p_a
    # The lagged budget really varied (0 after a B, 2 after an A), so this is not "never drafted".
    assert windows.count(0) > N // 4 and windows.count(2) > N // 4


def test_the_biased_configuration_is_refused():
    from dspark.planner import PlannerConfigError
    with pytest.raises(PlannerConfigError, match="non-anticipation"):
        PlannerConfig(block=2, algorithm="global", budget_lag=0, min_verify_len=0, temperature_positive=True)
