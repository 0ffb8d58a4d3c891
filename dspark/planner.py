"""Verify-budget planner for confidence-scheduled verification.

Each step every active request has a fully drafted block of G positions with prefix
survivals a_{r,1} >= ... >= a_{r,G}. Verifying the top-n (request, position) cells is
expected to commit tau(n) = R + (sum of their survivals) tokens and costs T(M(n)),
M(n) = sum_r (window_r + 1) (one anchor/bonus token per request). The planner picks
the windows; only how many drafted positions reach the target changes, never the
acceptance rule.

Algorithms:
 - "global": n* = argmax tau(n)/T(M(n)) over EVERY allowed n (the cost curve is a
   staircase, so a first-descent search stops early). The budget is SIZED from
   ``sizing_survival`` (lagged by budget_lag steps) and the cells are RANKED with fresh
   ``ranking_survival``. The full block is kept unless n* beats it by min_predicted_gain.
 - "greedy_stop": the paper's Algorithm 1 on fresh survival: admit cells in descending
   survival (ties: position, then request) and stop at the first admission that does
   not raise tau/T. The decision on draft k then never reads the drafted token x_k.

Non-anticipation: c_{k+1} depends on x_k (Markov feature), so a global search over
FRESH survival lets x_k decide whether x_k is verified, which biases sampled outputs
(paper, Appendix A). "global" with budget_lag 0 is therefore refused whenever a request
may sample (temperature > 0). For the same reason "greedy_stop" refuses
min_predicted_gain > 0 (the full-block comparison reads every drafted token) and, in
uniform mode, a ladder with gaps (one jump admits several positions at once).

``plan_budget`` is pure; ``Planner`` holds the per-slot lag buffers and records stats.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from dspark.config import ConfigError
from dspark.cost_table import CostTable
from dspark.plan_gate import SKIPPED_REASON
from dspark.service_cost import ServiceCost
from dspark.survival import check_survival, neutral_survival_row
from dspark.verify_share import SHARE_FULL_REASON, SHARE_REASON

MODES = ("uniform", "ragged")
ALGORITHMS = ("global", "greedy_stop")
BUDGET_LAGS = (0, 1, 2)
# SKIPPED_REASON: a device-resident step the plan gate ran without the planner (dspark/plan_gate.py).
# A step of fewer requests than PlannerConfig.min_rows (engine.plan_min_rows): the full block, not planned.
SMALL_BATCH_REASON = "declined_small_batch"
REASONS = ("trimmed", "declined_flat_cost", "declined_no_table", "declined_below_min_gain", SMALL_BATCH_REASON,
           "declined_mixed_step", "declined_snapshot_not_ready", "forced", SKIPPED_REASON,
           SHARE_REASON, SHARE_FULL_REASON)  # the last two: engine.verify_share's choice, not the planner's
# Steps that verified the full block without the planner's search: the plan gate learns nothing from them.
UNPLANNED_REASONS = (SMALL_BATCH_REASON, SKIPPED_REASON)


class PlannerConfigError(ConfigError):
    """A planner setting is invalid or would make sampling lossy; the message names the key and the fix."""


def _need(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise PlannerConfigError(f"planner.{key}: {msg}")


@dataclass(slots=True)
class PlannerConfig:
    """Settings of the verify-budget planner (validated on construction)."""

    block: int  # G: drafted positions per request, the no-trim window
    mode: str = "ragged"  # ragged: per-request windows | uniform: one window for the batch
    algorithm: str = "global"  # global | greedy_stop (paper's Algorithm 1)
    budget_lag: int = 2  # steps between the confidence that sizes the budget and this step (0 = fresh)
    allowed_verify_lens: tuple[int, ...] | None = None  # uniform tier ladder; None = any in [min_verify_len, block]
    # 0 is allowed: a request verifying 0 drafts still commits one target token (the paper's
    # Algorithm 1 starts every request at 0). The default 1 keeps every request drafting.
    min_verify_len: int = 1
    min_predicted_gain: float = 0.03  # relative: trim only if predicted tokens/ms beats the full block by this
    min_rows: int = 0  # steps of fewer requests verify the whole block (declined_small_batch); 0: any size
    flat_rel_tol: float = 0.02  # a table whose theta varies less than this is "flat" (trimming looks free)
    skip_mixed_trim: bool = True  # decline on steps that also carry a prefill (their cost is not the table's)
    temperature_positive: bool = True  # may any request sample? (conservative default: yes)
    force_verify_len: int | None = None  # override: every request verifies exactly this many drafts
    force_budget_frac: float | None = None  # override (ragged): budget = round(frac * R * G) cells
    force_trimmed_path: bool = False  # with a forced length: report the step as trimmed even at the full block
    extrapolate_cost: bool = False  # allow token counts beyond the table (extends the last slope)

    def __post_init__(self) -> None:
        _need(isinstance(self.block, int) and self.block >= 1, "block", f"must be an integer >= 1, got {self.block!r}")
        _need(self.mode in MODES, "mode", f"{self.mode!r} not in {list(MODES)}")
        _need(self.algorithm in ALGORITHMS, "algorithm", f"{self.algorithm!r} not in {list(ALGORITHMS)}")
        _need(self.budget_lag in BUDGET_LAGS, "budget_lag", f"must be one of {list(BUDGET_LAGS)}, got {self.budget_lag!r}")
        _need(isinstance(self.min_verify_len, int) and 0 <= self.min_verify_len <= self.block, "min_verify_len",
              f"must be an integer in [0, block={self.block}], got {self.min_verify_len!r}")
        _need(isinstance(self.min_predicted_gain, (int, float)) and math.isfinite(self.min_predicted_gain)
              and self.min_predicted_gain >= 0, "min_predicted_gain", f"must be finite and >= 0, got {self.min_predicted_gain!r}")
        _need(self.flat_rel_tol >= 0, "flat_rel_tol", f"must be >= 0, got {self.flat_rel_tol!r}")
        _need(isinstance(self.min_rows, int) and self.min_rows >= 0, "min_rows",
              f"must be an integer >= 0, got {self.min_rows!r}")
        ladder = self.allowed_verify_lens
        if ladder is not None:
            ladder = tuple(ladder)
            self.allowed_verify_lens = ladder
            _need(len(ladder) > 0 and all(isinstance(v, int) for v in ladder), "allowed_verify_lens",
                  f"must be a non-empty list of integers, got {list(ladder)}")
            _need(all(ladder[i] < ladder[i + 1] for i in range(len(ladder) - 1)), "allowed_verify_lens",
                  f"must be strictly ascending, got {list(ladder)}")
            _need(ladder[0] >= 1 and ladder[-1] <= self.block, "allowed_verify_lens",
                  f"values must lie in [1, block={self.block}], got {list(ladder)}")
            _need(ladder[-1] == self.block, "allowed_verify_lens",
                  f"must end at block={self.block} (the no-trim window every decline falls back to), got {list(ladder)}")
            _need(ladder[0] >= self.min_verify_len, "allowed_verify_lens",
                  f"{list(ladder)} has tiers below min_verify_len={self.min_verify_len}; drop them or lower min_verify_len")
            _need(self.mode == "uniform", "allowed_verify_lens",
                  "a tier ladder applies to mode=uniform; ragged windows are packed on one token axis padded to a token "
                  "bucket, so set allowed_verify_lens=null or mode=uniform")
        if self.algorithm == "greedy_stop":
            _need(self.budget_lag == 0, "budget_lag",
                  f"greedy_stop (Algorithm 1) reads fresh confidence; budget_lag={self.budget_lag} applies to "
                  "algorithm=global only. Set budget_lag=0")
            _need(self.min_predicted_gain == 0, "min_predicted_gain",
                  f"{self.min_predicted_gain} > 0 with greedy_stop compares against the full block, whose value reads "
                  "every drafted token and breaks non-anticipation; set 0 (or use algorithm=global with budget_lag>=1)")
            if self.mode == "uniform" and ladder is not None and self.temperature_positive:
                gaps = [(ladder[i], ladder[i + 1]) for i in range(len(ladder) - 1) if ladder[i + 1] - ladder[i] > 1]
                _need(not gaps, "allowed_verify_lens",
                      f"greedy_stop over a ladder with gaps {gaps} admits several positions on confidence that reads "
                      "the drafted tokens in between; use a contiguous ladder or algorithm=global with budget_lag>=1")
        if self.algorithm == "global" and self.budget_lag == 0 and self.temperature_positive:
            raise PlannerConfigError(
                "planner.algorithm: global search over FRESH confidence (budget_lag=0) at temperature > 0 violates "
                "non-anticipation (the drafted token decides its own admission) and biases the output distribution; "
                "set budget_lag>=1 or algorithm=greedy_stop")
        if self.force_verify_len is not None and self.force_budget_frac is not None:
            raise PlannerConfigError("planner.force_verify_len and planner.force_budget_frac are exclusive; set one")
        if self.force_verify_len is not None:
            v = self.force_verify_len
            _need(isinstance(v, int) and self.min_verify_len <= v <= self.block, "force_verify_len",
                  f"must be an integer in [min_verify_len={self.min_verify_len}, block={self.block}], got {v!r}")
            _need(ladder is None or v in ladder, "force_verify_len",
                  f"{v} is not on the tier ladder {list(ladder or ())}; a forced length off the ladder has no graph")
        if self.force_budget_frac is not None:
            f = self.force_budget_frac
            _need(isinstance(f, (int, float)) and 0.0 <= f <= 1.0, "force_budget_frac", f"must be in [0, 1], got {f!r}")
            _need(self.mode == "ragged", "force_budget_frac",
                  "a budget of cells applies to mode=ragged; use force_verify_len in uniform mode")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PlannerConfig":
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise PlannerConfigError(f"planner: unknown keys {sorted(unknown)}; allowed: {sorted(known)}")
        return cls(**dict(d))


@dataclass(frozen=True, slots=True)
class PlanDecision:
    """What the planner decided for one step.

    windows: per active request (drafts to verify), or None when a trimmed ragged budget is
      to be allocated on the device with ``kernels.window_allocation.allocate_windows``
      from fresh survival (``ranking_survival=None`` was passed).
    budget: cells to verify (R*G when the full block is kept).
    predicted_gain: (tau/T of the best candidate) / (tau/T of the full block) - 1; 0 without a table.
    predicted_tokens / predicted_ms: tau and T of the decision actually taken (None without a table).
    priced_ms: what the planner valued that step at: the service price of predicted_ms (predicted_ms itself
      without a service price; None without a table).
    extra_cells: ragged mode, trimmed: how many of the first ``budget`` cells (admission order
      over the sizing survival) lie at or past min_verify_len, i.e. the cells a device allocation
      adds to min_verify_len per row; None otherwise.
    """

    windows: tuple[int, ...] | None
    trimmed: bool
    reason: str
    predicted_gain: float
    predicted_tokens: float | None
    predicted_ms: float | None
    budget: int
    extra_cells: int | None = None
    priced_ms: float | None = None


def _to_rows(x: Any, name: str) -> list[list[float]]:
    if hasattr(x, "detach"):  # torch tensor: host copy (a sync if it lives on a device)
        x = x.detach().cpu().tolist()
    rows = [[float(v) for v in row] for row in x]
    return rows


def _as_matrix(x: Any, name: str, block: int) -> np.ndarray:
    """Survival rows as one float64 [R, block] array, checked (range, NaN, non-increasing).

    Tensors, arrays and lists of rows are accepted; float32 values convert exactly, so every sum
    below is the one the same rows as Python floats give. Rows of the wrong length are refused
    with the lengths found."""
    if hasattr(x, "detach"):  # torch tensor: host copy (a sync if it lives on a device)
        x = x.detach().cpu().double().numpy()
    try:
        S = np.asarray(x, dtype=np.float64)
    except (ValueError, TypeError):  # ragged rows
        S = None
    if S is not None and S.size == 0:
        return S.reshape(0, block)
    if S is None or S.ndim != 2 or S.shape[1] != block:
        lengths = sorted({len(row) for row in _to_rows(x, name)} - {block})
        raise ValueError(f"{name} rows must have block={block} positions, got lengths {lengths}")
    check_survival(S, name=name)
    return S


def _prefix_sums(S: np.ndarray) -> np.ndarray:
    """[R, G + 1]: column v holds sum(row[:v]), added left to right from 0 as Python's sum() does."""
    R, G = S.shape
    prefix = np.zeros((R, G + 1))
    prefix[:, 1:] = np.cumsum(S, axis=1)
    return prefix


def _tau(prefix: np.ndarray, windows: np.ndarray) -> float:
    """R + sum over rows of sum(row[:window]): the rows' totals added in row order from 0 (bit-equal
    to ``R + sum(sum(row[:w]) for row, w in zip(rows, windows))``)."""
    R = prefix.shape[0]
    if R == 0:
        return 0.0
    return float(R + np.cumsum(prefix[np.arange(R), windows])[-1])


def _walk_order(rows: list[list[float]]) -> list[tuple[int, int]]:
    """Cells in admission order: survival descending, then position ascending, then request ascending."""
    cells = [(-v, g, r) for r, row in enumerate(rows) for g, v in enumerate(row)]
    cells.sort()
    return [(r, g) for _, g, r in cells]


def _allocate_host(rows: Any, budget: int, min_len: int, block: int) -> list[int]:
    """Windows from the first ``budget`` cells in admission order, clamped to [min_len, block]."""
    S = np.asarray(rows, dtype=np.float64)
    R = S.shape[0]
    if R == 0:
        return []
    r_walk, _, _ = _admission_order(S)
    counts = np.bincount(r_walk[:max(0, budget)], minlength=R)
    return [int(c) for c in np.clip(counts, min_len, block)]


def _uniform_taus(rows: Any, prefix: np.ndarray | None = None) -> np.ndarray:
    """tau(rows, [v] * R) for every uniform window v = 0..G as float64 [G + 1]: R plus the rows'
    survival prefixes, summed in the order the per-row Python sums add them (bit-equal)."""
    if prefix is None:
        prefix = _prefix_sums(np.asarray(rows, dtype=np.float64))
    R = prefix.shape[0]
    # Sequential down the rows, starting from 0 as sum() does, then R added last.
    totals = np.cumsum(np.vstack((np.zeros((1, prefix.shape[1])), prefix)), axis=0)[-1]
    return R + totals


def _admission_order(S: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(request, position, survival) of every cell of S [R, G] in admission order: survival
    descending, then position, then request (the order of :func:`_walk_order`)."""
    R, G = S.shape
    # Position-major flat index g*R + r is the tie order; a stable sort on -survival keeps it.
    flat = S.T.reshape(-1)
    order = np.argsort(-flat, kind="stable")
    return order % R, order // R, flat[order]


def cells_past_min_len(rows: Any, budget: int, min_len: int) -> int:
    """How many of the first ``budget`` cells in admission order lie at or past ``min_len``:
    the ragged allocation's extra cells (the device adds them to min_len per row)."""
    S = np.asarray(rows, dtype=np.float64)
    if S.size == 0 or budget <= 0:
        return 0
    _, g_walk, _ = _admission_order(S)
    return int((g_walk[:budget] >= min_len).sum())


def _global_ragged_walk(rows: Any, table: CostTable, bs: int, config: "PlannerConfig",
                        taus: np.ndarray | None = None, service: ServiceCost | None = None
                        ) -> tuple[float, int, tuple[int, ...]]:
    """The global ragged search, vectorised: walk the cells in admission order (survival
    descending, position, request), value every prefix as tau/T, keep the last best.

    Returns (best value, cells walked to reach it, windows at that prefix). The same numbers
    as walking the cells one by one (float64 running
    sums in the same order; tests/test_planner.py holds that walk), in numpy: this runs on the
    host every step, for R x G cells.
    """
    S = np.asarray(rows, dtype=np.float64)  # [R, G]
    R = S.shape[0]
    min_len = config.min_verify_len
    r_walk, g_walk, a_walk = _admission_order(S)
    counted = g_walk >= min_len  # cells below min_len are verified anyway: walked, not valued
    # (taus: _uniform_taus(S), when the caller has it already)
    tau0 = float((_uniform_taus(S) if taus is None else taus)[min_len])  # bit-equal to the walk's Python sums
    m0 = R * (min_len + 1)
    m_full = R * (config.block + 1)
    # Every prefix but the whole block is a trimmed step: it pays the table's trim overhead.
    price = (service or ServiceCost.none()).price
    value0 = tau0 / price(float(table.step_ms(m0, bs, extrapolate=config.extrapolate_cost, trimmed=m0 < m_full)))
    a = a_walk[counted]
    if a.size == 0:
        return value0, 0, tuple([min_len] * R)
    tau = np.cumsum(np.concatenate(([tau0], a)))[1:]  # running sum from tau0, as the walk adds
    m = m0 + np.arange(1, a.size + 1)
    values = tau / price(table.step_ms_many(m, bs, extrapolate=config.extrapolate_cost)
                         + np.where(m < m_full, table.trim_overhead(bs), 0.0))
    top = max(value0, float(values.max()))
    hits = np.nonzero(values >= top)[0]
    if hits.size == 0:
        return value0, 0, tuple([min_len] * R)
    k = int(hits[-1])  # the last prefix reaching the best value (ties go to the longer windows)
    walked = np.nonzero(counted)[0]
    best_n = int(walked[k]) + 1
    windows = np.full(R, min_len, dtype=np.int64)
    sel_r, sel_g = r_walk[:best_n][counted[:best_n]], g_walk[:best_n][counted[:best_n]]
    np.maximum.at(windows, sel_r, sel_g + 1)
    return float(values[k]), best_n, tuple(windows.tolist())


def plan_budget(*, ranking_survival: Any, sizing_survival: Any, table: CostTable | None, config: PlannerConfig,
                temperature_positive: bool, is_mixed_step: bool = False, snapshot_ready: bool = True,
                batch_size: int | None = None, service: ServiceCost | None = None) -> PlanDecision:
    """Pure planner step over R active requests.

    ranking_survival: fresh survival [R, G] (host rows or a tensor), or None to leave a
      trimmed ragged allocation to the device (then ``windows`` is None and ``budget`` is final).
    sizing_survival: survival that sizes the budget: lagged by config.budget_lag steps
      (per slot, neutral for new requests), or the fresh one when budget_lag == 0.
    batch_size: for the cost table's batch-overhead staircase; default R.
    service: what a service step costs beyond the table (dspark.service_cost): every option is valued at
      its service price; the decision's ``predicted_ms`` stays the table's price, ``priced_ms`` is its service
      price (the prediction check compares the measured step with both).
    """
    G = config.block
    price = (service or ServiceCost.none()).price
    if config.algorithm == "global" and config.budget_lag == 0 and temperature_positive:
        raise PlannerConfigError(
            "planner.algorithm: this step samples at temperature > 0, and global search over fresh confidence "
            "(budget_lag=0) would bias it; set budget_lag>=1 or algorithm=greedy_stop")
    sizing = _as_matrix(sizing_survival, "sizing_survival", G)
    ranking = None if ranking_survival is None else _as_matrix(ranking_survival, "ranking_survival", G)
    R = sizing.shape[0]
    if ranking is not None and ranking.shape[0] != R:
        raise ValueError(f"ranking_survival has {ranking.shape[0]} rows but sizing_survival has {R}; "
                         "both are [R active, G]")
    if config.algorithm == "greedy_stop" and ranking is None:
        raise ValueError("greedy_stop decides from fresh survival on the host; pass ranking_survival")
    bs = R if batch_size is None else batch_size
    full = tuple([G] * R)
    if R == 0:
        return PlanDecision((), False, "declined_below_min_gain", 0.0, 0.0 if table else None, None, 0)
    sizing_prefix = _prefix_sums(sizing)
    ranking_prefix = None if ranking is None else _prefix_sums(ranking)

    def table_cost(windows: Sequence[int]) -> float:
        w = np.asarray(windows)
        return table.step_ms(int(w.sum()) + R, bs, extrapolate=config.extrapolate_cost, trimmed=bool((w < G).any()))

    def cost(windows: Sequence[int]) -> float:
        return price(table_cost(windows))

    def tau(prefix: np.ndarray, windows: Sequence[int]) -> float:
        return _tau(prefix, np.asarray(windows, dtype=np.int64))

    def decline(reason: str, gain: float = 0.0) -> PlanDecision:
        tok = ms = None
        if table is not None:
            tok, ms = tau(sizing_prefix, full), table_cost(full)
        return PlanDecision(full, False, reason, gain, tok, ms, R * G, priced_ms=None if ms is None else price(ms))

    # Overrides replace only the decision.
    if config.force_verify_len is not None or config.force_budget_frac is not None:
        if config.force_verify_len is not None:
            windows: tuple[int, ...] | None = tuple([config.force_verify_len] * R)
            budget = R * config.force_verify_len
        else:
            budget = int(round(config.force_budget_frac * R * G))
            windows = None if ranking is None else tuple(_allocate_host(ranking, budget, config.min_verify_len, G))
        tok = ms = None
        if table is not None and windows is not None:
            tok, ms = tau(ranking_prefix if ranking is not None else sizing_prefix, windows), table_cost(windows)
        trimmed = windows is None or any(w < G for w in windows) or config.force_trimmed_path
        extra = cells_past_min_len(sizing, budget, config.min_verify_len) if config.mode == "ragged" else None
        return PlanDecision(windows, trimmed, "forced", 0.0, tok, ms, budget, extra,
                            priced_ms=None if ms is None else price(ms))

    if table is None:
        return decline("declined_no_table")
    if table.is_flat(config.flat_rel_tol):
        return decline("declined_flat_cost")
    if R < config.min_rows:
        return decline(SMALL_BATCH_REASON)
    if is_mixed_step and config.skip_mixed_trim:
        return decline("declined_mixed_step")
    if not snapshot_ready:
        return decline("declined_snapshot_not_ready")

    sizing_taus = _uniform_taus(sizing, sizing_prefix)
    full_value = float(sizing_taus[G]) / cost(full)
    if config.mode == "uniform":
        if config.allowed_verify_lens is not None:
            candidates = list(config.allowed_verify_lens)
        else:
            candidates = list(range(config.min_verify_len, G + 1))
        taus = _uniform_taus(ranking, ranking_prefix) if config.algorithm == "greedy_stop" else sizing_taus
        best_v, best_value = None, -math.inf
        for v in candidates:
            value = float(taus[v]) / cost([v] * R)
            if config.algorithm == "greedy_stop":
                if best_v is not None and value <= best_value:
                    break
                best_v, best_value = v, value
            elif value >= best_value:  # ties go to the longer window: same predicted rate, less acceptance cut
                best_v, best_value = v, value
        best_windows: tuple[int, ...] = tuple([best_v] * R)
        best_budget = R * best_v
    elif config.algorithm == "global":
        best_value, best_budget, best_windows = _global_ragged_walk(sizing, table, bs, config, sizing_taus, service)
    else:  # greedy_stop (Algorithm 1) on fresh survival: stops at the first prefix that does not gain
        rows = ranking.tolist()
        min_len = config.min_verify_len
        windows_now = [min_len] * R
        tau_now = tau(ranking_prefix, windows_now)
        m_now = R * (min_len + 1)
        m_full = R * (G + 1)
        best_value = tau_now / price(table.step_ms(m_now, bs, extrapolate=config.extrapolate_cost,
                                                   trimmed=m_now < m_full))
        best_n, n = 0, 0
        best_windows = tuple(windows_now)
        for r, g in _walk_order(rows):
            n += 1
            a = rows[r][g]
            if g < min_len:
                continue  # already verified by the min_verify_len clamp
            if a <= 0.0:
                break  # Algorithm 1's candidate set holds only cells with survival > 0
            windows_now[r] = g + 1
            tau_now += a
            m_now += 1
            value = tau_now / price(table.step_ms(m_now, bs, extrapolate=config.extrapolate_cost,
                                                  trimmed=m_now < m_full))
            if value <= best_value:
                break
            best_value, best_n, best_windows = value, n, tuple(windows_now)
        best_budget = best_n  # cells walked, clamped ones included: what the device allocation counts
    gain = best_value / full_value - 1.0
    keeps_full = all(w == G for w in best_windows)
    if config.algorithm == "global" and (keeps_full or best_value <= full_value * (1.0 + config.min_predicted_gain)):
        return decline("declined_below_min_gain", gain)
    if config.algorithm == "greedy_stop" and keeps_full:
        return decline("declined_below_min_gain", gain)
    extra = None
    if config.mode == "ragged" and config.algorithm == "global":
        # Sized on lagged survival, ranked on fresh: the windows come from the fresh order.
        windows = None if ranking is None else tuple(_allocate_host(ranking, best_budget, config.min_verify_len, G))
        extra = sum(best_windows) - R * config.min_verify_len  # each row's walked cells past min_len
    else:
        windows = best_windows
        if config.mode == "ragged":
            extra = cells_past_min_len(sizing, best_budget, config.min_verify_len)
    ms = table_cost(best_windows)
    return PlanDecision(windows, True, "trimmed", gain, tau(sizing_prefix, best_windows), ms, best_budget, extra,
                        priced_ms=price(ms))


PENDING_SNAPSHOTS = 16  # Planner writes its queued snapshot pushes and resets to the rings at this many


class Planner:
    """Stateful wrapper: per-slot lag buffers of survival, recycled-slot reset, stats recording.

    Slots are the engine's request slots (the index of a request's row in slot-indexed
    buffers), not batch positions: batches reshuffle between steps.
    """

    def __init__(self, config: PlannerConfig, table: CostTable | None, *, stats: Any = None,
                 clock: Callable[[], float] = time.perf_counter, neutral_prior: Sequence[float] | None = None):
        self.config = config
        self.table = table
        self.stats = stats
        self.clock = clock
        self.service: ServiceCost | None = None  # the price of a service step beyond the table (engine.service_cost)
        self._neutral = neutral_survival_row(config.block, neutral_prior)
        self._neutral_row = np.asarray(self._neutral, dtype=np.float64)
        # Lag buffers, one ring of budget_lag rows per slot ([slots, lag, G], grown on demand), and how
        # many rows each slot has had pushed since its last reset (0: the slot reads neutral).
        self._rings = np.zeros((0, max(config.budget_lag, 1), config.block))
        self._pushed = np.zeros(0, dtype=np.int64)
        # Events not yet written to the rings, in order: (slots, rows) of push_checked_snapshot, (slot, None) of a
        # reset_slot that followed one. Written together (_write_pending) before anything reads or checks the rings.
        self._pending: list[tuple[Any, np.ndarray | None]] = []

    def _ensure_slots(self, slots: np.ndarray) -> None:
        """Grow the rings to hold every slot in ``slots`` (refusing negative ones)."""
        if not slots.size:
            return
        if int(slots.min()) < 0:
            raise ValueError(f"slots must be >= 0, got {int(slots.min())}")
        need = int(slots.max()) + 1
        have = self._pushed.shape[0]
        if need <= have:
            return
        n = max(need, 2 * have, 8)
        rings = np.zeros((n,) + self._rings.shape[1:])
        rings[:have] = self._rings
        pushed = np.zeros(n, dtype=np.int64)
        pushed[:have] = self._pushed
        self._rings, self._pushed = rings, pushed

    def reset_slot(self, slot: int) -> None:
        """A new request took ``slot``: forget the predecessor's survivals (the slot reads neutral until refilled)."""
        if self._pending:
            if slot >= 0:
                self._queue((int(slot), None))
        elif 0 <= slot < self._pushed.shape[0]:
            self._pushed[slot] = 0

    def catch_up(self) -> int:
        """Write the queued pushes and resets to the rings now (as the next read would) and return how many were
        queued: the snapshots of the steps since the rings were last written (a plan gate's skipped steps)."""
        queued = len(self._pending)
        self._write_pending()
        return queued

    def _write_pending(self) -> None:
        """Write the pending pushes and resets to the rings, with the state applying them one by one in order
        would leave: a reset sets its slot's count to 0; each later push of a slot writes ring position
        (count % lag) and counts one. Only a slot's last ``lag`` pushes are written (the earlier ones' positions
        are written again by them). A few vector operations however many steps are pending."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        lag = self.config.budget_lag
        if len(pending) == 1 and pending[0][1] is not None:  # one push (a gate that plans every step): direct
            slots = np.asarray(pending[0][0], dtype=np.int64)
            self._ensure_slots(slots)
            self._write_rows(slots, pending[0][1])
            return
        sizes = [1 if r is None else len(s) for s, r in pending]
        slots = np.fromiter(itertools.chain.from_iterable((s,) if r is None else s for s, r in pending), np.int64,
                            sum(sizes))
        event = np.repeat(np.arange(len(pending)), sizes)
        reset = np.repeat(np.fromiter((r is None for _, r in pending), bool, len(pending)), sizes)
        self._ensure_slots(slots)
        n = self._pushed.shape[0]
        last_reset = np.full(n, -1, dtype=np.int64)
        np.maximum.at(last_reset, slots[reset], event[reset])
        pushes = ~reset
        rows = (np.concatenate([r for _, r in pending if r is not None]) if pushes.any()
                else np.zeros((0, self.config.block)))
        live = event[pushes] > last_reset[slots[pushes]]  # pushes after their slot's last reset, if any
        live_slots, live_rows = slots[pushes][live], rows[live]
        order = np.argsort(live_slots, kind="stable")  # by slot, each slot's pushes in event order
        by_slot = live_slots[order]
        counts = np.bincount(live_slots, minlength=n)
        ordinal = np.arange(by_slot.size) - (np.cumsum(counts) - counts)[by_slot]  # the push's place in its slot
        base = np.where(last_reset >= 0, 0, self._pushed)  # each slot's count before these pushes
        keep = ordinal >= counts[by_slot] - lag
        kept = by_slot[keep]
        self._rings[kept, (base[kept] + ordinal[keep]) % lag] = live_rows[order][keep]
        self._pushed = base + counts

    def sizing_row(self, slot: int, fresh_row: Sequence[float]) -> list[float]:
        if self.config.budget_lag == 0:
            return [float(v) for v in fresh_row]
        return self.lagged_row(slot, newest_age=1)

    def lagged_rows(self, slots: Sequence[int], newest_age: int) -> np.ndarray:
        """[len(slots), G] float64: each slot's survival ``budget_lag`` steps old, when the newest
        snapshot pushed is ``newest_age`` steps old (1 when planning right after a step; 2 when a step
        is still in flight, as with the overlap scheduler). Neutral where that snapshot does not exist."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        out = np.tile(self._neutral_row, (slots.size, 1))
        lag = self.config.budget_lag
        back = lag - newest_age
        if back < 0 or slots.size == 0:
            return out
        self._write_pending()
        self._ensure_slots(slots)
        pushed = self._pushed[slots]
        ok = pushed > back
        if ok.any():
            out[ok] = self._rings[slots[ok], (pushed[ok] - 1 - back) % lag]
        return out

    def lagged_row(self, slot: int, newest_age: int) -> list[float]:
        """One slot's row of :meth:`lagged_rows`."""
        return self.lagged_rows([slot], newest_age)[0].tolist()

    def push_snapshot(self, slots: Sequence[int], rows: Any) -> None:
        """Record one step's survival per slot (for engines whose snapshot lands after planning)."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        arr = _as_matrix(rows, "survival snapshot", self.config.block) if len(rows) else \
            np.zeros((0, self.config.block))
        if arr.shape[0] != slots.size:
            raise ValueError(f"{arr.shape[0]} survival rows for {slots.size} slots")
        if self.config.budget_lag == 0 or slots.size == 0:
            return
        self._write_pending()
        self._ensure_slots(slots)  # (refuses negative slots)
        if int(np.bincount(slots).max()) > 1:
            raise ValueError(f"push_snapshot: duplicate slots in {slots.tolist()}")
        self._write_rows(slots, arr)

    def _write_rows(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Write one push of ``rows`` to the rings of the distinct ``slots`` (grown already): each at ring position
        (its count % lag), its count then one more."""
        pushed = self._pushed[slots]
        self._rings[slots, pushed % self.config.budget_lag] = rows
        self._pushed[slots] = pushed + 1

    def push_checked_snapshot(self, slots: Sequence[int], rows: np.ndarray) -> None:
        """:meth:`push_snapshot` for a caller that holds its inputs checked, without checking them again, at O(1)
        host cost: ``slots`` distinct and >= 0 (ints or an int64 array), ``rows`` a float array [len(slots),
        block] with every value in [0, 1] that nothing writes afterwards (the engine's device-resident commit: its
        slot map gives distinct slots, its one range test the rows, each launch its own host copy). The push is
        queued and written, with the ones after it, when the rings are next read (:meth:`lagged_rows`) or
        ``PENDING_SNAPSHOTS`` pushes and resets are queued: a step the plan gate skips does not pay for the
        write. The planner checks the rows it plans on (:func:`plan_budget`) in any case."""
        if self.config.budget_lag == 0 or not len(slots):
            return
        self._queue((slots, rows))

    def _queue(self, event: tuple[Any, np.ndarray | None]) -> None:
        """Queue a push or reset (see ``_pending``), writing the queue once it holds ``PENDING_SNAPSHOTS``."""
        self._pending.append(event)
        if len(self._pending) >= PENDING_SNAPSHOTS:
            self._write_pending()

    def plan(self, fresh_survival: Any, active_slots: Sequence[int], *, temperature_positive: bool | None = None,
             is_mixed_step: bool = False, snapshot_ready: bool = True, push_history: bool = True) -> PlanDecision:
        """Plan one step. fresh_survival: [R, G] for the requests in ``active_slots`` (same order)."""
        start = self.clock()
        fresh = _to_rows(fresh_survival, "fresh_survival")
        slots = list(active_slots)
        if len(slots) != len(fresh):
            raise ValueError(f"{len(fresh)} survival rows for {len(slots)} active slots")
        if len(set(slots)) != len(slots):
            raise ValueError(f"active_slots has duplicates: {slots}")
        sizing = [self.sizing_row(s, row) for s, row in zip(slots, fresh)]
        temp = self.config.temperature_positive if temperature_positive is None else temperature_positive
        decision = plan_budget(ranking_survival=fresh, sizing_survival=sizing, table=self.table, config=self.config,
                               temperature_positive=temp, is_mixed_step=is_mixed_step, snapshot_ready=snapshot_ready,
                               service=self.service)
        if push_history:
            self.push_snapshot(slots, fresh)
        if self.stats is not None:
            self.stats.record_plan(decision, plan_ms=(self.clock() - start) * 1e3)
        return decision


def oracle_bound(accepted_per_step: Sequence[Sequence[int]], batch_sizes: Sequence[int], table: CostTable, *,
                 block: int, measured_ms: Sequence[float] | None = None, include_rejected_draft: bool = False,
                 extrapolate: bool = False) -> dict[str, float]:
    """Throughput an all-knowing scheduler would reach on the same acceptances, costed by ``table``.

    accepted_per_step[s][r]: drafts request r accepted at step s with the FULL block
    verified (uncapped; e.g. a cap-accept run). The oracle verifies exactly the accepted
    drafts (window = accepted: accepted + 1 tokens per request, anchor included), or with
    include_rejected_draft the first rejected draft too (window = min(accepted + 1, block)),
    paying the table's trim overhead, or keeps the full block on a step where that is cheaper.
    It commits the same accepted + 1 tokens per request as the full block.
    Returns tokens, full-block and oracle ms and tokens/ms, and headroom = oracle/full - 1
    (plus the same against ``measured_ms`` when given). With ``measured_ms`` (the steps' measured times, in service
    longer than the table's steady-decode prices) also ``headroom_in_service``: measured / (measured - (full -
    oracle)) - 1, the gain if each trim saved the milliseconds the table says it saves and nothing else moved.
    """
    if len(accepted_per_step) != len(batch_sizes):
        raise ValueError(f"{len(accepted_per_step)} steps of acceptances but {len(batch_sizes)} batch sizes")
    if measured_ms is not None and len(measured_ms) != len(accepted_per_step):
        raise ValueError(f"{len(measured_ms)} measured step times for {len(accepted_per_step)} steps")
    if not accepted_per_step:
        raise ValueError("oracle_bound needs at least one step")
    tokens = full_ms = oracle_ms = 0.0
    for s, (acc, bs) in enumerate(zip(accepted_per_step, batch_sizes)):
        if len(acc) != bs:
            raise ValueError(f"step {s}: batch size {bs} but {len(acc)} acceptances {list(acc)}")
        bad = [k for k in acc if not (isinstance(k, int) and 0 <= k <= block)]
        if bad:
            raise ValueError(f"step {s}: accepted counts must be integers in [0, block={block}], got {bad}")
        windows = [min(k + 1, block) if include_rejected_draft else k for k in acc]
        tokens += sum(k + 1 for k in acc)
        full = table.step_ms(bs * (block + 1), bs, extrapolate=extrapolate)
        full_ms += full
        # A trimmed step pays the trim overhead; the oracle keeps the full block when that is cheaper.
        trimmed = any(w < block for w in windows)
        oracle_ms += min(full, table.step_ms(sum(w + 1 for w in windows), bs, extrapolate=extrapolate, trimmed=trimmed))
    out = {
        "steps": float(len(accepted_per_step)),
        "tokens": tokens,
        "full_block_ms": full_ms,
        "oracle_ms": oracle_ms,
        "full_block_tokens_per_ms": tokens / full_ms,
        "oracle_tokens_per_ms": tokens / oracle_ms,
        "headroom_vs_full_block": full_ms / oracle_ms - 1.0,
    }
    if measured_ms is not None:
        meas = float(sum(measured_ms))
        out["measured_ms"] = meas
        out["measured_tokens_per_ms"] = tokens / meas
        out["headroom_vs_measured"] = meas / oracle_ms - 1.0
        saved = full_ms - oracle_ms
        if meas > saved:
            out["headroom_in_service"] = meas / (meas - saved) - 1.0
    return out


__all__ = ["MODES", "ALGORITHMS", "BUDGET_LAGS", "REASONS", "SMALL_BATCH_REASON", "UNPLANNED_REASONS",
           "PlannerConfigError", "PlannerConfig", "PlanDecision", "plan_budget", "Planner", "oracle_bound"]
