"""Replay the verify-budget planner offline on step traces of a ``verify=full`` run.

A trace (``runners.bench_decode step_trace=true``, eager arms) holds, for every decode step, each
request's fresh survival and how many of its drafts the target accepted with the whole block
verified. This script packs the traced request sequences into B lanes (a lane takes the next
request when its request ends, like a served batch), plans every step with ``plan_budget`` against
a cost table, and scores each arm on the same acceptances:

  full     every request verifies the whole block;
  ragged   the planner (global search, budget sized on survival ``lag`` steps old, windows from
           fresh survival); emitted tokens min(accepted, window) + 1 per request;
  uniform  the same planner, one window for the batch;
  oracle   ``dspark.planner.oracle_bound``: windows equal to the accepted counts.

It reports each arm's gain over full and ragged's share of the oracle's gain, for the traced head
and for synthetic heads: exactly calibrated heads whose per-position separation is set so that
their AUC takes chosen values (z = s * (2y - 1) + N(0, 1); c = P(y = 1 | z) at the traced
per-position base rate). That tells how sharp a confidence head a given share needs.

Trimming changes what a request drafts next; the replay holds each request's later steps as
traced, which is how the oracle bound is priced as well.

    python bench/planner_replay.py TRACE.npz [...] --table cost_table.json --batches 128 256 --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from dspark.acceptance_estimate import conditional_confidence, verified_outcomes
from dspark.cost_table import CostTable
from dspark.planner import PlannerConfig, oracle_bound, plan_budget
from dspark.step_trace import StepTrace, full_block_requests
from dspark.survival import neutral_survival_row


def first_requests(trace: StepTrace, n: int | None) -> StepTrace:
    """The trace of its requests with the n lowest ids (a run of the same prompts at batch n serves
    those); the whole trace for None."""
    if n is None:
        return trace
    keep = np.sort(np.unique(np.concatenate(trace.request_ids)))[:n]
    out = StepTrace(trace.block)
    logits = trace.confidence_logits or [None] * trace.num_steps
    tops = trace.draft_max_prob or [None] * trace.num_steps
    for ids, surv, win, acc, z, p in zip(trace.request_ids, trace.survival, trace.windows, trace.accepted, logits,
                                         tops):
        m = np.isin(ids, keep)
        if m.any():
            out.record(ids[m], surv[m], win[m], acc[m], None if z is None else z[m], None if p is None else p[m])
    return out


def sequences(paths: list[str], with_logits: bool = False) -> tuple[int, list[tuple]]:
    """(block, [(survival [S, G], accepted [S]) per traced request]), with the raw confidence logits
    [S, G] as a third item and the drafter's top-token probabilities [S, G] (None where the trace has
    none) as a fourth when ``with_logits``; every traced window must be the block
    (``dspark.step_trace.full_block_requests``)."""
    try:
        block, seqs = full_block_requests(paths, need_logits=with_logits)
    except ValueError as e:
        raise SystemExit(f"{e}{' (--head recalibrates the raw logits)' if with_logits else ''}") from None
    return block, [(seq["survival"].astype(np.float64), seq["accepted"].astype(np.int64))
                   + ((seq["confidence_logits"].astype(np.float64),
                       seq["draft_max_prob"].astype(np.float64) if "draft_max_prob" in seq else None)
                      if with_logits else ()) for seq in seqs]


def observed(accepted: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(mask [N, G] of positions whose conditional outcome is observed, outcome [N, G]) of whole-block
    verification: position k (1-based) is observed when every earlier one was accepted (k <= accepted + 1);
    accepted iff k <= accepted."""
    return verified_outcomes(np.full(len(accepted), block), accepted, block)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney AUC (ties count one half)."""
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2 + 1
        i = j + 1
    r = np.empty(len(s))
    r[order] = ranks
    return float((r[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def head_quality(seqs, block: int) -> dict:
    surv = np.concatenate([s for s, _ in seqs])
    acc = np.concatenate([a for _, a in seqs])
    mask, y = observed(acc, block)
    c = conditional_confidence(surv)
    per_pos = [auc(c[mask[:, k], k], y[mask[:, k], k]) for k in range(block)]
    return {"rows": int(len(acc)), "accept_length": float(acc.mean() + 1),
            "auc_conditional_all": auc(c[mask], y[mask]), "auc_conditional_per_position": per_pos,
            "mean_confidence_observed": float(c[mask].mean()), "acceptance_rate_observed": float(y[mask].mean()),
            "base_rate_per_position": [float(y[mask[:, k], k].mean()) for k in range(block)]}


def synthetic_survival(seqs, block: int, separation: float, base: list[float], rng) -> list[np.ndarray]:
    """Exactly calibrated heads: z = s (2y - 1) + noise, c = P(y = 1 | z) at the per-position base rate.
    Positions past the first rejection draw their outcome at the base rate (never observed anyway)."""
    out = []
    for surv, acc in seqs:
        mask, y = observed(acc, block)
        draw = rng.random(y.shape) < np.asarray(base)[None, :]
        y = np.where(mask, y, draw)
        z = separation * (2 * y - 1) + rng.standard_normal(y.shape)
        b = np.clip(np.asarray(base), 1e-6, 1 - 1e-6)[None, :]
        log_odds = np.log(b / (1 - b)) + 2 * separation * z  # likelihood ratio of N(+s,1) vs N(-s,1)
        c = 1 / (1 + np.exp(-np.clip(log_odds, -60, 60)))
        out.append(np.cumprod(c, axis=1))
    return out


class _ArmTally:
    """Full, ragged and uniform scored step by step on the same acceptances, and the oracle on them."""

    def __init__(self, table: CostTable, config: PlannerConfig):
        self.table, self.block = table, config.block
        self.configs = {"ragged": config, "uniform": dataclasses.replace(config, mode="uniform",
                                                                          allowed_verify_lens=None)}
        self.tok = {"full": 0.0, "ragged": 0.0, "uniform": 0.0}
        self.ms = {"full": 0.0, "ragged": 0.0, "uniform": 0.0}
        self.verified = {"full": 0, "ragged": 0, "uniform": 0}
        self.trimmed = {"ragged": 0, "uniform": 0}
        self.acc_steps: list[list[int]] = []

    def step(self, fresh: np.ndarray, sizing: np.ndarray, acc: np.ndarray) -> np.ndarray:
        """Score one step on every arm; returns the ragged arm's windows."""
        R, G, table = len(acc), self.block, self.table
        chosen = np.full(R, G)
        self.acc_steps.append(acc.tolist())
        self.tok["full"] += float((acc + 1).sum())
        self.ms["full"] += table.step_ms(R * (G + 1), R)
        self.verified["full"] += R * G
        for arm, cfg in self.configs.items():
            d = plan_budget(ranking_survival=fresh, sizing_survival=sizing, table=table, config=cfg,
                            temperature_positive=False, batch_size=R)
            w = np.asarray(d.windows if d.windows is not None else [G] * R)
            self.tok[arm] += float((np.minimum(acc, w) + 1).sum())
            self.ms[arm] += table.step_ms(int(w.sum()) + R, R, trimmed=bool((w < G).any()))
            self.verified[arm] += int(w.sum())
            self.trimmed[arm] += int(d.trimmed)
            if arm == "ragged":
                chosen = w
        return chosen

    def result(self, batch: int, lag: int) -> dict:
        n = len(self.acc_steps)
        ob = oracle_bound(self.acc_steps, [len(a) for a in self.acc_steps], self.table, block=self.block)
        full_rate = self.tok["full"] / self.ms["full"]
        oracle_gain = ob["oracle_tokens_per_ms"] / full_rate - 1
        out = {"batch": batch, "steps": n, "lag": lag, "oracle_gain": oracle_gain,
               "full_tokens_per_step": self.tok["full"] / n}
        for arm in self.configs:
            gain = self.tok[arm] / self.ms[arm] / full_rate - 1
            out.update({f"{arm}_gain": gain, f"{arm}_share": gain / oracle_gain if oracle_gain > 0 else float("nan"),
                        f"{arm}_trimmed_steps": self.trimmed[arm],
                        f"{arm}_verified_ratio": self.verified[arm] / self.verified["full"],
                        f"{arm}_emitted_ratio": self.tok[arm] / self.tok["full"]})
        return out


class _LagRows:
    """Each request's survival rows in step order: the budget row ``lag`` steps back (neutral before
    that; the fresh row itself at lag 0), as the engine's per-slot lag buffers give it."""

    def __init__(self, block: int, lag: int):
        self.neutral = np.asarray(neutral_survival_row(block))
        self.lag = lag
        self.history: dict[int, list[np.ndarray]] = {}

    def sizing(self, ids, fresh: np.ndarray) -> np.ndarray:
        rows = [self.history.setdefault(int(r), []) for r in ids]
        lag = self.lag
        out = np.stack([fresh[i] if lag == 0 else (h[-lag] if len(h) >= lag else self.neutral)
                        for i, h in enumerate(rows)])
        for h, row in zip(rows, fresh):
            h.append(row)
        return out


def shifted_survival(survival: np.ndarray, shift) -> np.ndarray:
    """Prefix survival [..., G] whose conditional confidences are moved by ``shift`` in logit space (a scalar or
    one value per position): a head made over-confident (shift > 0) or under-confident (shift < 0)."""
    c = np.clip(conditional_confidence(np.atleast_2d(survival)), 1e-9, 1 - 1e-9)
    moved = 1.0 / (1.0 + np.exp(-(np.log(c / (1 - c)) + shift)))
    return np.cumprod(moved, axis=-1).reshape(np.shape(survival))


def replay(seqs, survivals, block: int, table: CostTable, batch: int, steps: int, lag: int,
           config: PlannerConfig, seed: int, shift: float = 0.0, online: bool = False) -> dict:
    """Lanes of `batch` requests stepped together; each arm scored on the same acceptances. ``shift``: every
    conditional confidence moved by this much in logit space (a miscalibrated head); ``online``: the engine's
    online calibration (dspark/online_calibration.py) learns logit offsets from the ragged arm's tested drafts
    and every later step's survival carries them (the lagged sizing rows as they were when fresh)."""
    from dspark.online_calibration import OnlineHeadCalibration

    calibration = OnlineHeadCalibration(block) if online else None
    offsets = np.zeros(block)
    history: dict[tuple[int, int], np.ndarray] = {}
    rng = np.random.default_rng(seed)
    queue: list[int] = []

    def next_request() -> int:
        if not queue:
            queue.extend(rng.permutation(len(seqs)).tolist())
        return queue.pop()

    lane_req = [next_request() for _ in range(batch)]
    # start lanes at random points of their first request, as a batch in steady state would be
    lane_t = [int(rng.integers(len(seqs[r][1]))) for r in lane_req]
    neutral = np.asarray(neutral_survival_row(block))
    tally = _ArmTally(table, config)
    adjusted = bool(shift) or online
    for _ in range(steps):
        fresh = np.stack([survivals[r][t] for r, t in zip(lane_req, lane_t)])
        if adjusted:
            fresh = shifted_survival(fresh, shift + offsets)
            history.update(((r, t), row) for r, t, row in zip(lane_req, lane_t, fresh))
            # a lane that starts inside a request has no history before its start: its row as traced, adjusted now
            sizing = np.stack([(history[(r, t - lag)] if (r, t - lag) in history
                                else shifted_survival(survivals[r][t - lag], shift + offsets)) if t >= lag else neutral
                               for r, t in zip(lane_req, lane_t)])
        else:
            sizing = np.stack([survivals[r][t - lag] if t >= lag else neutral for r, t in zip(lane_req, lane_t)])
        acc = np.array([seqs[r][1][t] for r, t in zip(lane_req, lane_t)])
        windows = tally.step(fresh, sizing, acc)
        if calibration is not None and calibration.update(fresh, windows, np.minimum(acc, windows)):
            offsets = calibration.offsets.copy()
        for i in range(batch):  # advance; a finished request hands its lane to the next one
            lane_t[i] += 1
            if lane_t[i] >= len(seqs[lane_req[i]][1]):
                lane_req[i], lane_t[i] = next_request(), 0
    return tally.result(batch, lag)


def replay_as_traced(trace: StepTrace, survival: list[np.ndarray], table: CostTable, lag: int,
                     config: PlannerConfig, warmup: int = 3) -> dict:
    """The traced steps as they ran (their rows, their order), each arm planned and scored on them.

    Scored, as ``runners.bench_decode`` times a run: the steps that hold the run's full batch
    (no request finished yet), after the first ``warmup`` of them; a request's budget row is its
    survival ``lag`` steps before (neutral before that), as the engine's per-slot lag buffers give.
    The oracle is priced on the same scored steps, so the share compares like with like.
    """
    full_batch = max(len(ids) for ids in trace.request_ids)
    rows = _LagRows(trace.block, lag)
    tally = _ArmTally(table, config)
    seen_full = 0
    for ids, fresh, acc in zip(trace.request_ids, survival, trace.accepted):
        fresh = np.asarray(fresh, dtype=np.float64)
        sizing = rows.sizing(ids, fresh)
        if len(ids) < full_batch:
            continue
        seen_full += 1
        if seen_full > warmup:
            tally.step(fresh, sizing, acc)
    if not tally.acc_steps:
        raise SystemExit(f"no step of the trace holds the full batch ({full_batch} rows) after {warmup} warm-up steps")
    return tally.result(full_batch, lag)


def replan_agreement(trace: StepTrace, table: CostTable, config: PlannerConfig, lag: int) -> tuple[int, int]:
    """(steps whose recorded windows ``plan_budget`` reproduces from the trace's own survival, steps):
    on a trace of a trimming run this checks that the replay plans as the engine did."""
    rows = _LagRows(trace.block, lag)
    same = 0
    for ids, fresh, win in zip(trace.request_ids, trace.survival, trace.windows):
        fresh = np.asarray(fresh, dtype=np.float64)
        d = plan_budget(ranking_survival=fresh, sizing_survival=rows.sizing(ids, fresh), table=table, config=config,
                        temperature_positive=False, batch_size=len(ids))
        planned = np.asarray(d.windows if d.windows is not None else [trace.block] * len(ids))
        same += int((planned == win).all())
    return same, trace.num_steps


def score_trace(trace: StepTrace, table: CostTable, warmup: int = 3) -> dict:
    """A trace's own timed window (its full-batch steps after ``warmup``), priced by ``table``:
    tokens, verified drafts and table ms per step, as they happened (any verify mode)."""
    full_batch = max(len(ids) for ids in trace.request_ids)
    tok = verified = ms = 0.0
    steps = seen = 0
    for win, acc in zip(trace.windows, trace.accepted):
        R = len(win)
        if R < full_batch:
            continue
        seen += 1
        if seen <= warmup:
            continue
        steps += 1
        tok += float((acc + 1).sum())
        verified += float(win.sum())
        ms += table.step_ms(int(win.sum()) + R, R, trimmed=bool((win < trace.block).any()))
    if not steps:
        raise SystemExit(f"no step of the trace holds the full batch ({full_batch} rows) after {warmup} warm-up steps")
    return {"batch": full_batch, "steps": steps, "tokens_per_step": tok / steps, "verified_per_step": verified / steps,
            "table_ms_per_step": ms / steps, "tokens_per_table_ms": tok / ms}


def recalibrated_survival(logits: list[np.ndarray], folder: str, block: int,
                          max_probs: list[np.ndarray | None] | None = None) -> list[np.ndarray]:
    """Each request's survival under the calibration in ``folder`` (temperatures.json), from its raw logits
    and, for an sts_max_prob calibration, the drafter's top-token probabilities ``max_probs`` (one array per
    item of ``logits``, as traced; SystemExit when the calibration needs them and the traces lack them)."""
    import torch

    from dspark.survival import calibrated_confidence
    from dspark.training.calibration import load_calibration

    cal = load_calibration(folder, block)
    if cal.top_gap_weights is not None:
        raise SystemExit(f"{folder}: its calibration (sts_top_gap) weighs the gap between the drafter's two largest "
                         f"logits, which step traces do not hold; replay with another calibration")
    temps, biases, weights = cal.temperatures, cal.biases, cal.max_prob_weights
    if weights is None:  # the max probabilities are not read
        max_probs = [None] * len(logits)
    elif max_probs is None or len(max_probs) != len(logits) or any(p is None for p in max_probs):
        raise SystemExit(f"{folder}: its calibration (sts_max_prob) weighs the drafter's top-token probability, "
                         f"which the traces do not hold (draft_max_prob); trace the run again")
    return [torch.cumprod(calibrated_confidence(torch.from_numpy(z), temps, biases,
                                                None if p is None else torch.from_numpy(p), weights),
                          1).double().numpy() for z, p in zip(logits, max_probs)]


def separation_for_auc(target: float) -> float:
    """AUC of N(+s,1) against N(-s,1) is Phi(s * sqrt 2): s = Phi^-1(AUC) / sqrt 2."""
    lo, hi = -10.0, 10.0
    for _ in range(100):  # invert the normal CDF by bisection
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < target:
            lo = mid
        else:
            hi = mid
    return lo / math.sqrt(2)


def _summary(row: dict) -> str:
    return (f"oracle {row['oracle_gain']:+.2%}  ragged {row['ragged_gain']:+.2%} (share {row['ragged_share']:.0%}, "
            f"verified {row['ragged_verified_ratio']:.2f}, emitted {row['ragged_emitted_ratio']:.3f})")


def _pct(v, spec: str) -> str:
    return "-" if v is None or v != v else format(v, spec)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--table", required=True)
    ap.add_argument("--batches", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lags", type=int, nargs="+", default=[2, 0])
    ap.add_argument("--head", action="append", default=[], metavar="NAME=DIR",
                    help="also replay the traced head under the calibration (temperatures.json) in DIR")
    ap.add_argument("--aucs", type=float, nargs="*", default=[],
                    help="synthetic heads of these per-position AUCs (independent noise per cell: they have "
                         "none of a real head's persistence from step to step, so a lagged budget fares "
                         "worse with them than with a real head of the same AUC)")
    ap.add_argument("--as-traced", action="store_true",
                    help="also replay each trace's own steps as they ran (its batch, its order), scored on its "
                         "full-batch steps after --warmup, as runners.bench_decode times a run")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--shifts", type=float, nargs="+", default=[0.0],
                    help="replay each head with its conditional confidences moved by these logits (over-confident "
                         "> 0, under-confident < 0): what a miscalibrated head costs the planner")
    ap.add_argument("--online-calibration", action="store_true",
                    help="also replay each (shifted) head with engine.online_calibration's offsets learnt as the "
                         "lanes run (dspark/online_calibration.py)")
    ap.add_argument("--first-requests", type=int, nargs="*", default=[None],
                    help="--as-traced on the requests with the N lowest ids only (what a verify=full run of the "
                         "same prompts at batch N serves); several values: one replay each")
    ap.add_argument("--measured", nargs="*", default=[], metavar="TRACE",
                    help="traces of trimming runs (e.g. an eager ragged run on the same prompts): their own timed "
                         "window priced by the table, against the first positional trace's (verify=full) — what "
                         "the planner did in closed loop, beside what the replay predicts")
    ap.add_argument("--min-gain", type=float, default=0.02)
    ap.add_argument("--min-verify-lens", type=int, nargs="+", default=[1],
                    help="engine.min_verify_len values to replay (--as-traced); the first also drives the lanes")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    block, seqs = sequences(args.traces, with_logits=bool(args.head))
    table = CostTable.load(args.table)
    config = PlannerConfig(block=block, mode="ragged", algorithm="global", budget_lag=2,
                           min_predicted_gain=args.min_gain, temperature_positive=False,
                           min_verify_len=args.min_verify_lens[0])
    heads = {"traced": [s[0] for s in seqs]}
    for spec in args.head:
        name, _, folder = spec.partition("=")
        if not folder:
            raise SystemExit(f"--head {spec!r}: give NAME=DIR (a folder holding temperatures.json)")
        heads[name] = recalibrated_survival([s[2] for s in seqs], folder, block, [s[3] for s in seqs])
    seqs = [(s[0], s[1]) for s in seqs]
    quality = head_quality(seqs, block)
    rng = np.random.default_rng(0)
    for a in args.aucs:
        heads[f"calibrated_auc_{a:g}"] = synthetic_survival(seqs, block, separation_for_auc(a),
                                                            quality["base_rate_per_position"], rng)
    rows = []
    for name, survivals in heads.items():
        q = head_quality(list(zip(survivals, [a for _, a in seqs])), block)
        per_pos = [v for v in q["auc_conditional_per_position"] if v == v]
        variants = [(shift, online) for shift in args.shifts for online in (False, True)
                    if args.online_calibration or not online]
        for batch, lag, (shift, online) in ((b, lg, v) for b in args.batches for lg in args.lags for v in variants):
            runs = [replay(seqs, survivals, block, table, batch, args.steps, lag, config, seed, shift=shift,
                           online=online) for seed in range(args.seeds)]
            label = name + (f" shifted {shift:+g}" if shift else "") + (" + online calibration" if online else "")
            row = {"head": label, **{k: (float(np.median([r[k] for r in runs])) if isinstance(runs[0][k], float)
                                         else runs[0][k]) for k in runs[0]}}
            row["head_auc_pooled"] = q["auc_conditional_all"]
            row["head_auc_per_position_mean"] = float(np.mean(per_pos))
            row.update(shift=shift, online_calibration=online)
            rows.append(row)
            print(f"{label:>22} b{batch:<4} lag {lag}: {_summary(row)}  uniform {row['uniform_gain']:+.2%} "
                  f"(share {row['uniform_share']:.0%})", flush=True)
    if args.as_traced:
        for path, n in ((p, n) for p in args.traces for n in args.first_requests):
            trace = first_requests(StepTrace.load(path), n)
            per_step = {"traced": trace.survival}
            for spec in args.head:
                name, _, folder = spec.partition("=")
                per_step[name] = recalibrated_survival(trace.confidence_logits, folder, block,
                                                       trace.draft_max_prob or None)
            for name, survival, lag, min_len in ((h, sv, lg, m) for h, sv in per_step.items() for lg in args.lags
                                                 for m in args.min_verify_lens):
                cfg = dataclasses.replace(config, min_verify_len=min_len)
                row = {"head": name, "mode": f"as traced ({Path(path).name}), min_verify_len {min_len}",
                       **replay_as_traced(trace, survival, table, lag, cfg, args.warmup)}
                rows.append(row)
                print(f"{name:>22} as traced b{row['batch']:<4} lag {lag} min_len {min_len} ({row['steps']} steps, "
                      f"{row['full_tokens_per_step']:.0f} tokens/step): {_summary(row)}", flush=True)
    if args.measured:
        for path in args.measured:
            measured = StepTrace.load(path)
            own = score_trace(measured, table, args.warmup)
            # the verify=full trace over the same requests (a trimming run's decisions depend on its batch,
            # so the measured trace is scored whole)
            n = len(np.unique(np.concatenate(measured.request_ids)))
            reference = score_trace(first_requests(StepTrace.load(args.traces[0]), n), table, args.warmup)
            row = {"head": "measured", "mode": f"closed loop ({Path(path).name})", "lag": None,
                   "batch": own["batch"], "steps": own["steps"], "oracle_gain": float("nan"),
                   "ragged_gain": own["tokens_per_table_ms"] / reference["tokens_per_table_ms"] - 1,
                   "ragged_share": float("nan"),
                   "ragged_verified_ratio": own["verified_per_step"] / reference["verified_per_step"],
                   "ragged_emitted_ratio": own["tokens_per_step"] / reference["tokens_per_step"],
                   "uniform_gain": float("nan"), "uniform_share": float("nan"), "measured": own,
                   "reference": reference}
            rows.append(row)
            print(f"{'measured':>22} closed loop b{own['batch']:<4} ({own['steps']} steps, {Path(path).name}): "
                  f"table-priced gain {row['ragged_gain']:+.2%} (verified {row['ragged_verified_ratio']:.2f}, "
                  f"emitted {row['ragged_emitted_ratio']:.3f})", flush=True)
    doc = {"traces": args.traces, "table": args.table, "block": block, "head_quality": quality,
           "settings": {k: v for k, v in vars(args).items() if k not in ("traces", "table", "out")}, "rows": rows}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "planner_replay.json").write_text(json.dumps(doc, indent=2))
        lines = ["| head | replay | AUC per position (mean) / pooled | batch | lag | oracle gain | ragged gain | ragged share | ragged verified / "
                 "emitted | uniform gain | uniform share |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            auc_text = (f"{r['head_auc_per_position_mean']:.3f} / {r['head_auc_pooled']:.3f}"
                        if "head_auc_pooled" in r else "-")
            lines.append(f"| {r['head']} | {r.get('mode', 'lanes')} | {auc_text} | {r['batch']} | "
                         f"{'-' if r['lag'] is None else r['lag']} | {_pct(r['oracle_gain'], '+.2%')} | "
                         f"{_pct(r['ragged_gain'], '+.2%')} | {_pct(r['ragged_share'], '.0%')} | "
                         f"{r['ragged_verified_ratio']:.2f} / {r['ragged_emitted_ratio']:.3f} | "
                         f"{_pct(r['uniform_gain'], '+.2%')} | {_pct(r['uniform_share'], '.0%')} |")
        (out / "planner_replay.md").write_text("\n".join(lines) + "\n")
    return doc
