"""The lossless guard for reduced precision: is each greedy difference a rounding flip or an error?

In float32 two correct greedy engines emit the same tokens, and the guard in
dspark/bench/guards.py (:func:`~dspark.bench.guards.lossless_guard`) demands exactly that. In
bfloat16 they need not: a different batch shape or verify window changes the rounding, and
where the target's two best tokens are within that rounding of each other the argmax flips and
the outputs part for good. A fixed margin cannot tell such a flip from a bug (one bf16 step is
0.125 at logits of 16-32), so this guard decides from evidence:

1. **Reference.** Every greedy output of every run (each arm's blocks, and the control below)
   is re-scored, teacher-forced on its own prefix, by a float32 copy of the target
   (dspark/bench/reference.py). An emitted token's *regret* is the reference's top logit minus
   the token's logit: 0 for the reference's argmax.
2. **Noise, measured twice.** (a) The forward noise: at every re-scored position of arm A's and the
   control's outputs (never of the arm under test), how far the
   engine precision's logit differences between the reference's top token and its runners-up
   are from float32; its maximum over all positions. (b) The control: arm A run again, untimed,
   on the same prompts under another batch composition (another running limit, reversed
   arrival). A and the control run the same code, so every place they part is a rounding flip
   by construction; the largest regret at those places. The noise bound ``delta`` is the larger
   of the two.
3. **Per token.** Every emitted token of every run whose regret exceeds ``delta`` is a real
   divergence: no rounding this engine was measured to make explains choosing it. Each is
   listed with its prompt id, position, token, the reference's token and both logits.
4. **Rate.** A bug can also choose plausible tokens (a rejected draft is often the reference's
   runner-up). So each arm's rate of tokens off the reference argmax is compared with the
   control's by a one-sided Fisher exact test; ``p < alpha`` fails (the arm leaves the
   reference more often than rounding does). Each request weighs once per arm: its off-reference
   tokens and its tokens are averaged over the arm's runs (blocks). Counting each distinct output
   once instead would over-weight the requests whose outputs differ between blocks, which are the
   ones near a tie, whenever an arm's batch composition (and so its rounding) varies from block to
   block: a rate test against a control run once would then fail a correct arm.

Where two arms' outputs part, the first differing position is classified with the same
evidence (both tokens within ``delta`` of the reference's top logit: a flip) and reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np
from scipy import stats as sps

from dspark.bench.guards import GuardResult, _first_difference
from dspark.bench.reference import ReferenceScorer, ScoredOutput

MAX_LISTED = 50  # real divergences listed in the guard's details (all are counted)
NOISE_ARMS = ("A", "control")  # the runs whose positions measure the forward noise


@dataclass
class RunOutputs:
    """One run's greedy outputs: ``arm`` ("A", "B" or "control"), a label (e.g. "A/block0")."""

    label: str
    arm: str
    outputs: Mapping[Hashable, Sequence[int]]


def _score_runs(runs: Sequence[RunOutputs], prompts: Mapping[Hashable, Sequence[int]], scorer: ReferenceScorer,
                progress: Callable | None = None) -> dict[str, dict[Hashable, ScoredOutput]]:
    todo = [(run, rid, list(toks)) for run in runs for rid, toks in run.outputs.items() if len(toks)]
    for run, rid, _ in todo:
        if rid not in prompts:
            raise KeyError(f"lossless guard: no prompt token ids for request {rid!r} of run {run.label}")
    scores = scorer.score_many([(list(prompts[rid]), toks) for _, rid, toks in todo],
                               progress=progress(len(todo)) if progress is not None else None)
    scored: dict[str, dict[Hashable, ScoredOutput]] = {}
    for (run, rid, _), s in zip(todo, scores):
        scored.setdefault(run.label, {})[rid] = s
    return scored


def _regret_at(s: ScoredOutput | None, idx: int) -> float | None:
    if s is None or idx >= len(s.tokens):
        return None
    return float(s.regret[idx])


def evidence_lossless_guard(runs: Sequence[RunOutputs], pairs: Sequence[tuple[str, str]],
                            prompts: Mapping[Hashable, Sequence[int]], scorer: ReferenceScorer, *,
                            control_pair: tuple[str, str] | None, alpha: float, dtype: str,
                            decode: Callable[[list[int]], str] | None = None, name: str = "lossless",
                            progress: Callable | None = None) -> GuardResult:
    """The guard above over ``runs``; ``pairs`` are (label, label) of runs whose outputs should match
    (each block's A and B); ``control_pair`` is (A's run, the control's run) or None (no control:
    the noise bound is the forward noise alone and there is no rate test)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    by_label = {r.label: r for r in runs}
    for a, b in [*pairs, *([control_pair] if control_pair else [])]:
        if a not in by_label or b not in by_label:
            raise KeyError(f"lossless guard: pair ({a}, {b}) names a run not given ({sorted(by_label)})")
    if control_pair is not None and not set(by_label[control_pair[0]].outputs) & set(by_label[control_pair[1]].outputs):
        # a control on other requests than its pair's would find no flips and leave the bound at the forward noise
        raise ValueError(f"lossless guard: the control {control_pair[1]!r} shares no request with "
                         f"{control_pair[0]!r}: it must run on the requests that run compares")
    scored = _score_runs(runs, prompts, scorer, progress)

    # Forward noise over arm A's and the control's outputs only: an arm under test must not widen the bound
    # with the contexts its own errors produced.
    noise = np.concatenate([s.noise for run in runs if run.arm in NOISE_ARMS
                            for s in scored.get(run.label, {}).values() if s.noise is not None]
                           or [np.zeros(0, np.float32)])
    delta_forward = float(noise.max()) if noise.size else 0.0
    control_flips: list[dict] = []
    if control_pair is not None:
        ra, rc = control_pair
        for rid, a in by_label[ra].outputs.items():
            c = by_label[rc].outputs.get(rid)
            if c is None:
                continue
            idx = _first_difference(list(a), list(c))
            if idx is None:
                continue
            ga, gc = _regret_at(scored[ra].get(rid), idx), _regret_at(scored[rc].get(rid), idx)
            if ga is not None and gc is not None:
                control_flips.append({"request_id": str(rid), "position": idx, "regret": max(ga, gc)})
    delta_control = max((f["regret"] for f in control_flips), default=0.0)
    delta = max(delta_forward, delta_control)

    def text(tok: int) -> str | None:
        if decode is None:
            return None
        try:
            return decode([int(tok)])
        except Exception:  # a token id the tokenizer cannot render is still reported by id
            return None

    # Per token: every emitted token with a regret beyond the noise bound.
    real: list[dict] = []
    per_request: dict[str, dict[Hashable, list[tuple[int, int]]]] = {}  # arm -> request -> (off, tokens) per run
    for run in runs:
        for rid, s in scored.get(run.label, {}).items():
            per_request.setdefault(run.arm, {}).setdefault(rid, []).append((int(s.off_reference.sum()), len(s.tokens)))
            for pos in np.nonzero(s.regret > delta)[0]:
                pos = int(pos)
                real.append({"run": run.label, "request_id": str(rid), "position": pos,
                             "token": int(s.tokens[pos]), "token_text": text(s.tokens[pos]),
                             "reference_token": int(s.top_tokens[pos, 0]),
                             "reference_token_text": text(s.top_tokens[pos, 0]),
                             "reference_logit": float(s.top_logits[pos, 0]), "token_logit": float(s.token_logits[pos]),
                             "regret": float(s.regret[pos]), "delta": delta})

    # Rate: tokens off the reference argmax against the control's, each request once per arm (its counts
    # averaged over the arm's runs; see the module docstring).
    rates = {arm: (round(sum(np.mean([k for k, _ in v]) for v in outs.values())),
                   round(sum(np.mean([n for _, n in v]) for v in outs.values())))
             for arm, outs in per_request.items()}
    rate_tests: dict[str, dict] = {}
    if control_pair is not None and "control" in rates:
        kc, nc = rates["control"]
        for arm, (k, n) in rates.items():
            if arm == "control" or n == 0 or nc == 0:
                continue
            p = float(sps.fisher_exact([[k, n - k], [kc, nc - kc]], alternative="greater").pvalue)
            rate_tests[arm] = {"off_reference": k, "tokens": n, "rate": k / n, "control_rate": kc / nc,
                               "p_value": p, "passed": p >= alpha}

    # The runs that should match: identical, flips explained by the noise bound, or not.
    comparisons = []
    missing: list[str] = []
    for a, b in pairs:
        oa, ob = by_label[a].outputs, by_label[b].outputs
        missing += [f"{rid} (only in {a})" for rid in oa if rid not in ob]
        missing += [f"{rid} (only in {b})" for rid in ob if rid not in oa]
        identical = flips = unexplained = 0
        for rid in oa:
            if rid not in ob:
                continue
            idx = _first_difference(list(oa[rid]), list(ob[rid]))
            if idx is None:
                identical += 1
                continue
            ga, gb = _regret_at(scored[a].get(rid), idx), _regret_at(scored[b].get(rid), idx)
            if ga is not None and gb is not None and max(ga, gb) <= delta:
                flips += 1
            else:
                unexplained += 1
        comparisons.append({"runs": [a, b], "requests": len(set(oa) | set(ob)), "identical": identical,
                            "rounding_flips": flips, "unexplained": unexplained})

    unexplained = [c for c in comparisons if c["unexplained"]]
    failed_rates = [arm for arm, t in rate_tests.items() if not t["passed"]]
    passed = not real and not failed_rates and not missing and not unexplained

    parts = []
    for c in comparisons:
        parts.append(f"{c['runs'][0]} vs {c['runs'][1]}: {c['identical']}/{c['requests']} identical, "
                     f"{c['rounding_flips']} rounding flip(s)" + (f", {c['unexplained']} unexplained" if c["unexplained"]
                                                                 else ""))
    summary_line = "; ".join(parts[:4]) + (f"; ... ({len(parts)} comparisons)" if len(parts) > 4 else "")
    evidence = (f"{dtype}; noise bound delta={delta:.4g} (forward noise max {delta_forward:.4g} over {noise.size} "
                f"positions; control: {len(control_flips)} flip(s), max regret {delta_control:.4g})")
    msg = [evidence, summary_line]
    if rate_tests:
        msg.append("off-reference token rate " + ", ".join(
            f"{arm} {t['rate']:.3%} (control {t['control_rate']:.3%}, Fisher p={t['p_value']:.3g})"
            for arm, t in sorted(rate_tests.items())))
    elif control_pair is None:
        msg.append("no control run: no rate test")
    if real:
        shown = ", ".join(f"{d['run']} {d['request_id']}@{d['position']} ({d['token']} vs reference "
                          f"{d['reference_token']}, regret {d['regret']:.3g})" for d in real[:5])
        msg.append(f"{len(real)} real divergence(s) beyond the noise bound: {shown}")
    if failed_rates:
        msg.append(f"arm(s) {', '.join(failed_rates)} leave the reference argmax more often than rounding does "
                   f"(p < alpha={alpha})")
    if unexplained:
        msg.append("first differences the noise bound does not explain (a token beyond it, or one run stopping "
                   "where the other goes on with the same prefix)")
    if missing:
        msg.append(f"requests missing in one run: {missing[:10]}")
    return GuardResult(
        name=name, passed=passed, message="; ".join(msg),
        details={"dtype": dtype, "method": "evidence", "delta": delta, "delta_forward": delta_forward,
                 "delta_control": delta_control, "alpha": alpha,
                 "forward_noise_quantiles": ({q: float(np.quantile(noise, q)) for q in (0.5, 0.99, 0.999)}
                                             if noise.size else {}),
                 "control_flips": control_flips[:MAX_LISTED], "control_flip_count": len(control_flips),
                 "rate_tests": rate_tests, "comparisons": comparisons, "real_divergences": real[:MAX_LISTED],
                 "real_divergence_count": len(real), "missing": missing},
    )
