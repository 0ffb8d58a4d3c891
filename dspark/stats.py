"""Engine counters for speculative decoding and confidence-scheduled verification (torch-free).

Every failure mode of confidence scheduling is silent: a run in which the planner
declined on every step scores exactly like a working one. These counters say what
happened (windows, trims, acceptance), why (planner reasons), and how (graph replay or
eager); ``assert_active`` turns "it never actually trimmed" into an error.

Definitions (per verify step, per request r with drafted block G, window w, accepted k <= w):
 - committed tokens k + 1 (accepted drafts plus the target's correction/bonus token);
 - ceiling_tokens = sum(G + 1): tokens the target would process with no trim;
 - window_tokens = sum(w): drafts sent to the target; delivered_tokens = sum(w + 1):
   tokens the target actually processed; trim_ratio = 1 - delivered / ceiling;
 - accept_length = committed tokens per verify step (bonus included), averaged over
   REQUESTS (per-request sums), so long completions do not dominate;
 - accept_rate = accepted drafts / verified drafts (bonus excluded), averaged over requests;
 - per-position acceptance at i = steps that accepted draft i / steps whose draft i was
   verified with drafts 1..i-1 accepted ("reached i");
 - block_accept_length = uncapped accepted + 1: exact when the engine verified the full
   block and only capped acceptance afterwards (cap-accept: pass ``uncapped_accepted``);
   otherwise the accepted count is a lower bound and the summary says so;
 - trim_regret_rate = trimmed requests (w < G) that accepted their whole window, over
   trimmed requests: those cuts surely cost acceptance. Exact, no model needed.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from dspark.planner import UNPLANNED_REASONS

log = logging.getLogger(__name__)


# Where a device-resident step() call's host time goes (counters ``host/<phase>_ms_per_step``, mean ms per
# call): reloading rows and reserving their pages; scheduling and issuing prefills; joining prefilled
# requests; planning (the batch bucket's graphs, the draft-free choice, the planner); issuing the step's graphs;
# waiting for the device at the commit; committing (tokens, stop checks, the planner's snapshot, statistics,
# retirements); and the caller's own work between two calls.
HOST_PHASES = ("rows", "prefill", "join", "plan", "launch", "wait", "commit", "caller")


class FeatureInactiveError(AssertionError):
    """Confidence scheduling was enabled but did not demonstrably act."""


class LayoutMismatchError(AssertionError):
    """The descriptions of this step's verify tokens disagree (windows, qo_indptr, token count, bucket)."""


def _as_list(x: Any) -> list:
    if hasattr(x, "tolist"):
        return x.tolist()
    return list(x)


_FOLD_STEPS = 64  # EngineStats folds its pending steps into the per-request sums at this many


@dataclass
class EngineStats:
    """Counters the engine feeds once per verify step (``record_step``) and the planner per plan."""

    steps_by_mode: Counter = field(default_factory=Counter)
    verify_steps: int = 0
    ceiling_tokens: int = 0
    window_tokens: int = 0
    delivered_tokens: int = 0
    committed_tokens: int = 0
    verify_len_hist: Counter = field(default_factory=Counter)
    token_bucket_hist: Counter = field(default_factory=Counter)
    plan_reasons: Counter = field(default_factory=Counter)
    plan_ms_total: float = 0.0
    predicted_gain_sum: float = 0.0
    predicted_gain_steps: int = 0
    predicted_tokens_total: float = 0.0
    predicted_ms_total: float = 0.0
    realised_tokens_on_predicted: int = 0
    measured_ms_on_predicted: float = 0.0
    measured_steps_on_predicted: int = 0
    # over the measured priced steps: the ms the planner valued each decision at (the service price it planned
    # with, engine.service_cost; the table's price where it had none) and the table's own price
    priced_ms_on_measured: float = 0.0
    predicted_ms_on_measured: float = 0.0
    # the same measured priced steps, those that ran a trim alone: whether a trimmed step's price (the cost table's
    # trim overhead included) holds in service, apart from the steps that kept the whole block
    measured_steps_on_trimmed: int = 0
    measured_ms_on_trimmed: float = 0.0
    priced_ms_on_trimmed: float = 0.0
    trimmed_requests: int = 0
    trimmed_whole_window: int = 0
    request_steps: int = 0
    reached_at: list = field(default_factory=list)  # index i-1: drafts that reached position i
    accepted_at: list = field(default_factory=list)
    graph_replays: int = 0
    eager_steps: int = 0
    eager_reasons: Counter = field(default_factory=Counter)
    block_accept_exact: bool = True
    _per_request: dict = field(default_factory=dict)  # id -> [steps, committed, accepted, verified, block_accepted]
    # steps recorded but not yet folded into _per_request: (ids, accepted, windows, block-accepted) arrays, folded
    # every _FOLD_STEPS steps and before _per_request is read (one vector pass instead of a loop over every row)
    _pending: list = field(default_factory=list)
    _distinct_windows: set = field(default_factory=set)

    def record_plan(self, decision: Any, plan_ms: float = 0.0) -> None:
        """Count a planner decision (a ``dspark.planner.PlanDecision``) and the host ms the planner took. Its
        prediction is checked against the step that ran it when that step is recorded (``record_step``)."""
        self.plan_reasons[decision.reason] += 1
        self.plan_ms_total += plan_ms
        if decision.reason == "trimmed":
            self.predicted_gain_sum += decision.predicted_gain
            self.predicted_gain_steps += 1

    def record_step(self, *, request_ids: Sequence[Any], windows: Sequence[int], accepted: Sequence[int],
                    block: int | Sequence[int], mode: str, uncapped_accepted: Sequence[int] | None = None,
                    num_tokens: int | None = None, bucket: int | None = None, graph_replay: bool | None = None,
                    eager_reason: str | None = None, step_ms: float | None = None,
                    decision: Any = None) -> None:
        """Record one verify step. Per request: id, window w, accepted drafts k (<= w), drafted block G.

        uncapped_accepted: acceptance had the full block been verified (cap-accept mode).
        graph_replay False needs an eager_reason. decision: the planner's decision this step ran (a
        ``PlanDecision``; None without one), whose predicted tokens and step time (the table's, and the price
        it was valued at) are compared with what the step committed and its measured ``step_ms``. The caller
        passes it: with the overlap scheduler the next step is planned before this one commits.
        """
        # One vector pass per conversion, check and count (this runs on the host once per step, for every row).
        ids = list(request_ids)
        n = len(ids)
        wa, ka = (np.asarray(_as_list(v), dtype=np.int64).reshape(-1) for v in (windows, accepted))
        ga = (np.full(n, int(block), dtype=np.int64) if isinstance(block, int)
              else np.asarray(_as_list(block), dtype=np.int64).reshape(-1))
        w, k, G = wa.tolist(), ka.tolist(), ga.tolist()
        if not (len(w) == len(k) == len(G) == n):
            raise ValueError(f"record_step: {n} request ids, {len(w)} windows, {len(k)} accepted, {len(G)} blocks")
        bad = np.nonzero((wa < 0) | (wa > ga))[0]
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"record_step: request {ids[i]!r} window {w[i]} outside [0, block={G[i]}]")
        bad = np.nonzero((ka < 0) | (ka > wa))[0]
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"record_step: request {ids[i]!r} accepted {k[i]} outside [0, window={w[i]}]; "
                             "the accepted count must be clamped to the request's window")
        u = None
        if uncapped_accepted is not None:
            u = [int(v) for v in _as_list(uncapped_accepted)]
            if len(u) != n or any(not (min(k[i], w[i]) <= u[i] <= G[i]) or (k[i] < w[i] and u[i] != k[i])
                                  for i in range(n)):
                raise ValueError(f"record_step: uncapped_accepted {u} inconsistent with accepted {k}, windows {w}, "
                                 f"block {G} (it must equal accepted below the window and lie in [window, block] at it)")
        else:
            if bool(((wa < ga) & (ka == wa)).any()):
                self.block_accept_exact = False
        if graph_replay is False and not eager_reason:
            raise ValueError("record_step: an eager step needs eager_reason (say why it did not replay a graph)")

        self.verify_steps += 1
        self.steps_by_mode[mode] += 1
        window_sum = int(wa.sum())
        self.ceiling_tokens += int(ga.sum()) + n
        self.window_tokens += window_sum
        self.delivered_tokens += window_sum + n
        self.committed_tokens += int(ka.sum()) + n
        self.request_steps += n
        if n:  # the windows' histogram, by value (windows are in [0, block], checked above)
            counts = np.bincount(wa)
            seen = np.nonzero(counts)[0].tolist()
            for v, c in zip(seen, counts[seen].tolist()):
                self.verify_len_hist[v] += c
            self._distinct_windows.update(seen)
        if bucket is not None:
            self.token_bucket_hist[int(bucket)] += 1
        if graph_replay is True:
            self.graph_replays += 1
        elif graph_replay is False:
            self.eager_steps += 1
            self.eager_reasons[eager_reason] += 1
        trimmed = wa < ga
        self.trimmed_requests += int(trimmed.sum())
        self.trimmed_whole_window += int((trimmed & (ka == wa)).sum())
        if n:
            # Draft position p (1-based) is reached when drafts 1..p-1 were accepted and p is in the
            # window: by rows with min(window, accepted + 1) >= p; accepted by rows with accepted >= p.
            depth = max(int(ga.max()), len(self.reached_at))
            while len(self.reached_at) < depth:
                self.reached_at.append(0)
                self.accepted_at.append(0)
            for counts, reach in ((self.reached_at, np.minimum(wa, ka + 1)), (self.accepted_at, ka)):
                at_least = np.cumsum(np.bincount(reach, minlength=depth + 1)[::-1])[::-1]  # rows with reach >= p
                for p_ in range(1, depth + 1):
                    counts[p_ - 1] += int(at_least[p_])
        if n:
            self._pending.append((ids, ka, wa, ka if u is None else np.asarray(u, dtype=np.int64)))
            if len(self._pending) >= _FOLD_STEPS:
                self._fold_requests()
        # Steps the planner priced: not those it was never asked about (too few rows, the plan gate's skips), whose
        # survival it did not read (the head did not run there).
        if decision is not None and decision.predicted_tokens is not None and decision.predicted_ms is not None \
                and decision.reason not in UNPLANNED_REASONS:
            self.predicted_tokens_total += decision.predicted_tokens
            self.predicted_ms_total += decision.predicted_ms
            self.realised_tokens_on_predicted += int(ka.sum()) + n
            if step_ms is not None:
                self.measured_ms_on_predicted += float(step_ms)
                self.measured_steps_on_predicted += 1
                priced = decision.priced_ms if decision.priced_ms is not None else decision.predicted_ms
                self.priced_ms_on_measured += priced
                self.predicted_ms_on_measured += decision.predicted_ms
                if decision.trimmed:
                    self.measured_steps_on_trimmed += 1
                    self.measured_ms_on_trimmed += float(step_ms)
                    self.priced_ms_on_trimmed += priced

    # ---- derived --------------------------------------------------------------------------

    @property
    def trim_ratio(self) -> float:
        return 0.0 if self.ceiling_tokens == 0 else 1.0 - self.delivered_tokens / self.ceiling_tokens

    @property
    def trim_regret_rate(self) -> float | None:
        return None if self.trimmed_requests == 0 else self.trimmed_whole_window / self.trimmed_requests

    def per_position_acceptance(self) -> list[float | None]:
        return [None if r == 0 else a / r for a, r in zip(self.accepted_at, self.reached_at)]

    def _fold_requests(self) -> None:
        """Add the pending steps' rows to the per-request sums: the rows' ids numbered in order of first sight,
        one bincount per sum, then one update per distinct request."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        number: dict = {}
        inverse = np.fromiter((number.setdefault(rid, len(number)) for p in pending for rid in p[0]),
                              dtype=np.int64)
        k, w, u = (np.concatenate([p[i] for p in pending]) for i in (1, 2, 3))
        steps = np.bincount(inverse, minlength=len(number)).tolist()
        sums = [np.bincount(inverse, weights=v, minlength=len(number)).astype(np.int64).tolist() for v in (k, w, u)]
        per_request = self._per_request
        for rid, n_steps, sk, sw, su in zip(number, steps, *sums):
            per = per_request.get(rid)
            if per is None:
                per = per_request[rid] = [0, 0, 0, 0, 0]
            per[0] += n_steps
            per[1] += sk + n_steps
            per[2] += sk
            per[3] += sw
            per[4] += su + n_steps

    def _request_mean(self, num: int, den: int) -> float | None:
        self._fold_requests()
        vals = [p[num] / p[den] for p in self._per_request.values() if p[den] > 0]
        return None if not vals else sum(vals) / len(vals)

    @property
    def accept_length(self) -> float | None:
        return self._request_mean(1, 0)

    @property
    def accept_rate(self) -> float | None:
        return self._request_mean(2, 3)

    @property
    def block_accept_length(self) -> float | None:
        return self._request_mean(4, 0)

    def summary(self) -> dict[str, Any]:
        """Flat, JSON-able dict of every counter and derived metric."""
        out: dict[str, Any] = {
            "verify_steps": self.verify_steps,
            "request_steps": self.request_steps,
            "ceiling_tokens": self.ceiling_tokens,
            "window_tokens": self.window_tokens,
            "delivered_tokens": self.delivered_tokens,
            "committed_tokens": self.committed_tokens,
            "trim_ratio": self.trim_ratio,
            "accept_length": self.accept_length,
            "accept_rate": self.accept_rate,
            "block_accept_length": self.block_accept_length,
            "block_accept_length_exact": self.block_accept_exact,
            "trimmed_requests": self.trimmed_requests,
            "trim_regret_rate": self.trim_regret_rate,
            "distinct_windows": len(self._distinct_windows),
            "graph_replays": self.graph_replays,
            "eager_steps": self.eager_steps,
            "plan_ms_total": self.plan_ms_total,
            "predicted_gain_mean": (self.predicted_gain_sum / self.predicted_gain_steps
                                    if self.predicted_gain_steps else None),
            "predicted_tokens_total": self.predicted_tokens_total,
            "realised_tokens_on_predicted": self.realised_tokens_on_predicted,
            "predicted_ms_total": self.predicted_ms_total,
            "measured_ms_on_predicted": self.measured_ms_on_predicted,
            "priced_ms_on_measured": self.priced_ms_on_measured,
            "predicted_ms_on_measured": self.predicted_ms_on_measured,
            "measured_steps_on_predicted": self.measured_steps_on_predicted,
            "measured_steps_on_trimmed": self.measured_steps_on_trimmed,
            "measured_ms_on_trimmed": self.measured_ms_on_trimmed,
            "priced_ms_on_trimmed": self.priced_ms_on_trimmed,
        }
        al, bal = self.accept_length, self.block_accept_length
        out["accept_length_over_block"] = None if not al or not bal else al / bal
        for mode, c in sorted(self.steps_by_mode.items()):
            out[f"steps_mode.{mode}"] = c
        for reason, c in sorted(self.plan_reasons.items()):
            out[f"plan_reason.{reason}"] = c
        for reason, c in sorted(self.eager_reasons.items()):
            out[f"eager_reason.{reason}"] = c
        for v, c in sorted(self.verify_len_hist.items()):
            out[f"verify_len_hist.{v}"] = c
        for b, c in sorted(self.token_bucket_hist.items()):
            out[f"token_bucket_hist.{b}"] = c
        for i, p in enumerate(self.per_position_acceptance(), start=1):
            out[f"position_accept.{i}"] = p
        return out

    def assert_active(self, min_steps: int, expect_graphs: bool = False) -> str:
        """Raise FeatureInactiveError unless scheduling visibly acted; returns a status line.

        Below ``min_steps`` verify steps nothing is asserted: the returned (and logged)
        status starts with "skipped:" so a throwaway executor is told apart from a pass.
        """
        if self.verify_steps < min_steps:
            msg = f"skipped: only {self.verify_steps} verify steps < min_steps {min_steps}"
            log.warning("assert_active %s", msg)
            return msg
        problems = []
        if len(self._distinct_windows) < 2:
            problems.append(f"windows never differed (all {sorted(self._distinct_windows)})")
        if self.trimmed_requests == 0:
            problems.append("no request was ever trimmed")
        if expect_graphs and self.eager_steps > 0:
            problems.append(f"{self.eager_steps} steps ran eager (reasons {dict(self.eager_reasons)})")
        if expect_graphs and self.graph_replays == 0:
            problems.append("no step replayed a graph")
        if problems:
            raise FeatureInactiveError(
                "confidence scheduling did not act: " + "; ".join(problems)
                + f". Planner decisions: {dict(self.plan_reasons)} over {self.verify_steps} verify steps "
                "(declined_no_table/declined_flat_cost mean no usable cost table: profile one)")
        return (f"active: {self.verify_steps} steps, {len(self._distinct_windows)} distinct windows, "
                f"{self.trimmed_requests} trimmed requests, trim_ratio {self.trim_ratio:.3f}")


def check_step_consistency(windows: Sequence[int], qo_indptr: Any, num_tokens: int, bucket: int, block: int) -> None:
    """Debug check: every description of this step's verify tokens agrees.

    sum(windows + 1) == qo_indptr[-1] == num_tokens <= bucket; windows in [0, block];
    qo_indptr int32, starts at 0, and rows per request equal windows + 1 (so it is monotonic).
    """
    w = [int(v) for v in _as_list(windows)]
    dtype = getattr(qo_indptr, "dtype", None)
    if dtype is not None and str(dtype) not in ("torch.int32", "int32"):
        raise LayoutMismatchError(f"qo_indptr must be int32, got {dtype}")
    ind = [int(v) for v in _as_list(qo_indptr)]
    bad = [(i, x) for i, x in enumerate(w) if not 0 <= x <= block]
    if bad:
        raise LayoutMismatchError(f"windows outside [0, block={block}] at (request, window) {bad}")
    if len(ind) != len(w) + 1:
        raise LayoutMismatchError(f"qo_indptr has {len(ind)} entries for {len(w)} requests (needs {len(w) + 1})")
    if ind and ind[0] != 0:
        raise LayoutMismatchError(f"qo_indptr must start at 0, got {ind[0]}")
    rows = [ind[i + 1] - ind[i] for i in range(len(w))]
    wrong = [(i, rows[i], w[i] + 1) for i in range(len(w)) if rows[i] != w[i] + 1]
    if wrong:
        raise LayoutMismatchError(f"qo_indptr rows disagree with windows + 1 at (request, rows, expected) {wrong}; "
                                  f"qo_indptr={ind}, windows={w}")
    total = sum(x + 1 for x in w)
    if not (ind[-1] == total == num_tokens):
        raise LayoutMismatchError(f"token totals disagree: sum(windows+1)={total}, qo_indptr[-1]={ind[-1]}, "
                                  f"num_tokens={num_tokens}")
    if num_tokens > bucket:
        raise LayoutMismatchError(f"{num_tokens} tokens do not fit the graph bucket {bucket}")


__all__ = ["FeatureInactiveError", "LayoutMismatchError", "EngineStats", "check_step_consistency"]
