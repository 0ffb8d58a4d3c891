"""Guards that make an A/B result trustworthy before anyone reads its speed-up.

Every failure mode of a verification scheduler is silent: the run finishes, prints a
number, and the number is wrong because outputs changed (one "+64%" result was output
corruption) or because the feature never ran (a planner that declines every step scores
exactly like a working one). These checks turn those cases into loud failures:

- :func:`lossless_guard`: at temperature 0 both arms must emit the same tokens.
- :func:`did_nothing_guard`: an arm configured to trim, replay graphs or speculate did.
- :func:`errors_guard`: no request errored.

Each returns a :class:`GuardResult`; :func:`raise_on_failure` raises one
:class:`ABGuardError` listing every failed guard.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

FULL_PRECISION_DTYPES = {"float32": "float32", "fp32": "float32"}
REDUCED_PRECISION_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
                            "half": "float16"}
TRIMMING_VERIFY_MODES = ("uniform", "ragged", "cap_accept")


class ABGuardError(RuntimeError):
    """One or more guards failed; the message lists all of them."""


@dataclass
class GuardResult:
    name: str
    passed: bool
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def raise_on_failure(results: Iterable[GuardResult]) -> None:
    """Raise :class:`ABGuardError` naming every failed guard; return quietly when all passed."""
    failed = [r for r in results if not r.passed]
    if failed:
        lines = "\n".join(f"- {r.name}: {r.message}" for r in failed)
        raise ABGuardError(f"{len(failed)} guard(s) failed; the A/B speed numbers are not trustworthy:\n{lines}")


MarginFn = Callable[[Hashable, list[int]], float]


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def lossless_guard(outputs_a: Mapping[Hashable, Sequence[int]], outputs_b: Mapping[Hashable, Sequence[int]], *,
                   dtype: str, margin_fn: MarginFn | None = None, near_tie_margin: float = 0.0) -> GuardResult:
    """Check that greedy (temperature 0) outputs of both arms are token-for-token identical.

    In float32 any difference fails. In bfloat16/float16 a different batch shape may
    legitimately flip an argmax whose top-2 logits are within rounding of each other,
    so at the first differing token ``margin_fn(request_id, prefix_token_ids)`` must
    return the target's top-1 minus top-2 logit at that position (``prefix_token_ids``
    = the output tokens both arms agree on; the caller prepends the prompt). A margin
    below ``near_tie_margin`` counts as a near-tie flip (reported, not a failure);
    anything else is a real divergence and fails. A length mismatch is a difference at
    the shorter length (the shorter arm stopped there), with token None. A request
    present in only one arm fails.
    """
    if dtype in FULL_PRECISION_DTYPES:
        precision, reduced = FULL_PRECISION_DTYPES[dtype], False
    elif dtype in REDUCED_PRECISION_DTYPES:
        precision, reduced = REDUCED_PRECISION_DTYPES[dtype], True
    else:
        raise ValueError(f"lossless_guard: unknown dtype {dtype!r}; use one of "
                         f"{sorted(FULL_PRECISION_DTYPES) + sorted(REDUCED_PRECISION_DTYPES)}")
    if not (isinstance(near_tie_margin, (int, float)) and near_tie_margin >= 0):
        raise ValueError(f"near_tie_margin must be a number >= 0, got {near_tie_margin!r}")

    missing_in_a = sorted(map(str, set(outputs_b) - set(outputs_a)))
    missing_in_b = sorted(map(str, set(outputs_a) - set(outputs_b)))
    differences: list[dict[str, Any]] = []
    near_ties = divergences = identical = 0
    for req_id in outputs_a:
        if req_id not in outputs_b:
            continue
        a, b = list(outputs_a[req_id]), list(outputs_b[req_id])
        idx = _first_difference(a, b)
        if idx is None:
            identical += 1
            continue
        entry: dict[str, Any] = {"request_id": str(req_id), "first_diff_index": idx,
                                 "token_a": a[idx] if idx < len(a) else None,
                                 "token_b": b[idx] if idx < len(b) else None,
                                 "len_a": len(a), "len_b": len(b), "margin": None}
        if reduced and margin_fn is not None:
            margin = float(margin_fn(req_id, a[:idx]))
            if not (math.isfinite(margin) and margin >= 0):
                raise ValueError(f"margin_fn returned {margin!r} for request {req_id!r} at index {idx}; "
                                 "it must be the finite top-1 minus top-2 logit (>= 0)")
            entry["margin"] = margin
            entry["kind"] = "near_tie" if margin < near_tie_margin else "divergence"
        else:
            entry["kind"] = "divergence"
            if reduced:
                entry["note"] = "no margin_fn given: a near-tie cannot be told apart from a real divergence"
        if entry["kind"] == "near_tie":
            near_ties += 1
        else:
            divergences += 1
        differences.append(entry)

    passed = divergences == 0 and not missing_in_a and not missing_in_b
    parts = [f"{identical}/{len(set(outputs_a) | set(outputs_b))} requests identical ({precision})"]
    if near_ties:
        parts.append(f"{near_ties} near-tie flip(s) with margin < {near_tie_margin}")
    if divergences:
        worst = [d for d in differences if d["kind"] == "divergence"][:5]
        shown = ", ".join(f"{d['request_id']}@{d['first_diff_index']} ({d['token_a']} vs {d['token_b']}"
                          + (f", margin {d['margin']:.3g})" if d["margin"] is not None else ")") for d in worst)
        parts.append(f"{divergences} real divergence(s): {shown}")
    if missing_in_a or missing_in_b:
        parts.append(f"missing in A: {missing_in_a[:10]}, missing in B: {missing_in_b[:10]}")
    return GuardResult(
        name="lossless", passed=passed, message="; ".join(parts),
        details={"dtype": precision, "near_tie_margin": near_tie_margin, "identical": identical,
                 "near_tie_flips": near_ties, "divergences": divergences, "missing_in_a": missing_in_a,
                 "missing_in_b": missing_in_b, "differences": differences},
    )


def trim_expected(verify_mode: str, force_override: bool) -> bool:
    """Whether an arm with this verify mode should trim verify windows on its own."""
    return verify_mode in TRIMMING_VERIFY_MODES and not force_override


# What each of the planner's decline reasons (counters sched/plan_reason.<reason>) means for a user.
DECLINE_HINTS = {
    "declined_no_table": "the planner has no profiled cost table for this node: profile one (runners.profile) "
                         "or point engine.cost_table at it",
    "declined_below_min_gain": "the planner predicted less than engine.min_predicted_gain from trimming: on this "
                               "node and workload a trimmed step is not predicted to pay (the drafter's confidence "
                               "keeps the tail, or shorter steps cost about as much as the full block)",
    "declined_flat_cost": "the cost table prices every verify length alike at this batch size, so trimming saves "
                          "no time on this node",
    "declined_mixed_step": "steps carried a prefill and engine.skip_mixed_trim declines those",
    "declined_snapshot_not_ready": "the survival snapshot that sizes the budget was not ready (engine.budget_lag)",
}


def _why_no_trim(counters: Mapping[str, Any]) -> str:
    """The planner's decline reasons from the counters, most frequent first, each with its meaning."""
    prefix = "sched/plan_reason."
    reasons = sorted(((k[len(prefix):], float(v)) for k, v in counters.items() if k.startswith(prefix) and float(v)),
                     key=lambda kv: -kv[1])
    if not reasons:
        return ("the engine reported no planner decisions (sched/plan_reason.*): was the arm's planner built? "
                "check engine.verify and engine.cost_table")
    total = sum(n for _, n in reasons)
    parts = [f"{name} in {n:.0f} of {total:.0f} steps" + (f" ({DECLINE_HINTS[name]})" if name in DECLINE_HINTS else "")
             for name, n in reasons]
    return "the planner's decisions: " + "; ".join(parts)


def did_nothing_guard(arm_name: str, arm_config: Mapping[str, Any], counters: Mapping[str, Any], *,
                      expects_trim: bool, expects_graphs: bool, expects_speculation: bool) -> GuardResult:
    """Fail when an arm's feature never engaged, according to the engine's counters.

    Counters read: ``trimmed_steps`` and ``trim_ratio`` (when ``expects_trim``),
    ``graph_replays`` (when ``expects_graphs``), ``drafted_tokens`` (when
    ``expects_speculation``), and ``decode_steps`` if reported. A counter the check
    needs but the engine did not report is itself a failure: absence of evidence is
    not evidence that the feature ran.
    """
    problems: list[str] = []

    def need(key: str) -> float | None:
        if key not in counters:
            problems.append(f"counter {key!r} missing (engine reported {sorted(counters)}); cannot prove the "
                            "feature ran")
            return None
        return float(counters[key])

    if "decode_steps" in counters and float(counters["decode_steps"]) == 0:
        problems.append("decode_steps == 0: the engine never ran a decode step in this arm")
    if expects_trim:
        trimmed, ratio = need("trimmed_steps"), need("trim_ratio")
        if trimmed == 0 or ratio == 0:
            problems.append(f"configured to trim but never did (trimmed_steps={trimmed}, trim_ratio={ratio}); "
                            + _why_no_trim(counters))
    if expects_graphs:
        replays = need("graph_replays")
        if replays == 0:
            problems.append("CUDA graphs enabled but graph_replays == 0: every step ran eager")
    if expects_speculation:
        drafted = need("drafted_tokens")
        if drafted == 0:
            problems.append("speculation enabled but drafted_tokens == 0: the drafter never proposed a token")

    expectations = {"expects_trim": expects_trim, "expects_graphs": expects_graphs,
                    "expects_speculation": expects_speculation}
    expected = [k.removeprefix("expects_") for k, v in expectations.items() if v]
    if problems:
        message = f"arm {arm_name}: " + "; ".join(problems)
    elif expected:
        message = f"arm {arm_name}: every configured feature engaged ({', '.join(expected)})"
    else:
        message = f"arm {arm_name}: no feature expected to engage (baseline arm)"
    return GuardResult(name=f"did_nothing[{arm_name}]", passed=not problems, message=message,
                       details={"arm_config": dict(arm_config), "counters": dict(counters), **expectations,
                                "problems": problems})


def errors_guard(records: Iterable[Any]) -> GuardResult:
    """Fail if any request (anything with ``request_id``, ``arm``, ``block``, ``error``) errored."""
    records = list(records)
    errored = [{"request_id": r.request_id, "arm": r.arm, "block": r.block, "error": r.error}
               for r in records if r.error is not None]
    if errored:
        shown = "; ".join(f"{e['request_id']} (arm {e['arm']}, block {e['block']}): {e['error']}" for e in errored[:5])
        message = f"{len(errored)}/{len(records)} request(s) errored: {shown}"
    else:
        message = f"all {len(records)} requests completed"
    return GuardResult(name="errors", passed=not errored, message=message, details={"errors": errored})
