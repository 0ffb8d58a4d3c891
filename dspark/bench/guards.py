"""Guards that make an A/B result trustworthy before anyone reads its speed-up.

Every failure mode of a verification scheduler is silent: the run finishes, prints a
number, and the number is wrong because outputs changed (one "+64%" result was output
corruption) or because the feature never ran (a planner that declines every step scores
exactly like a working one). These checks turn those cases into loud failures:

- :func:`lossless_guard`: at temperature 0 both float32 arms must emit the same tokens (reduced
  precision: :func:`dspark.bench.lossless.evidence_lossless_guard`, which tells rounding flips from
  errors by re-scoring with a float32 reference).
- :func:`did_nothing_guard`: an arm configured to trim, replay graphs or speculate could run it
  (a planner that priced every step and declined them all as "no predicted gain" passes, and says so).
- :func:`errors_guard`: no request errored.

Each returns a :class:`GuardResult`; :func:`raise_on_failure` raises one
:class:`ABGuardError` listing every failed guard.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Hashable, Iterable, Mapping, Sequence

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


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def lossless_guard(outputs_a: Mapping[Hashable, Sequence[int]], outputs_b: Mapping[Hashable, Sequence[int]], *,
                   dtype: str) -> GuardResult:
    """Check that greedy (temperature 0) float32 outputs of both arms are token-for-token identical.

    Any difference fails, listed with its request, first differing index and both tokens; a length
    mismatch is a difference at the shorter length (token None); a request present in one arm only
    fails. Reduced precision is judged on evidence instead, by
    :func:`dspark.bench.lossless.evidence_lossless_guard` (a rounding flip is not an error there).
    """
    if dtype in REDUCED_PRECISION_DTYPES:
        raise ValueError(f"lossless_guard: {dtype} outputs may differ by rounding; judge them with "
                         "dspark.bench.lossless.evidence_lossless_guard")
    if dtype not in FULL_PRECISION_DTYPES:
        raise ValueError(f"lossless_guard: unknown dtype {dtype!r}; use one of "
                         f"{sorted(FULL_PRECISION_DTYPES) + sorted(REDUCED_PRECISION_DTYPES)}")
    missing_in_a = sorted(map(str, set(outputs_b) - set(outputs_a)))
    missing_in_b = sorted(map(str, set(outputs_a) - set(outputs_b)))
    differences: list[dict[str, Any]] = []
    identical = 0
    for req_id in outputs_a:
        if req_id not in outputs_b:
            continue
        a, b = list(outputs_a[req_id]), list(outputs_b[req_id])
        idx = _first_difference(a, b)
        if idx is None:
            identical += 1
            continue
        differences.append({"request_id": str(req_id), "first_diff_index": idx,
                            "token_a": a[idx] if idx < len(a) else None, "token_b": b[idx] if idx < len(b) else None,
                            "len_a": len(a), "len_b": len(b)})
    passed = not differences and not missing_in_a and not missing_in_b
    parts = [f"{identical}/{len(set(outputs_a) | set(outputs_b))} requests identical (float32)"]
    if differences:
        shown = ", ".join(f"{d['request_id']}@{d['first_diff_index']} ({d['token_a']} vs {d['token_b']})"
                          for d in differences[:5])
        parts.append(f"{len(differences)} divergence(s): {shown}")
    if missing_in_a or missing_in_b:
        parts.append(f"missing in A: {missing_in_a[:10]}, missing in B: {missing_in_b[:10]}")
    return GuardResult(
        name="lossless", passed=passed, message="; ".join(parts),
        details={"dtype": "float32", "method": "exact", "identical": identical, "divergences": len(differences),
                 "missing_in_a": missing_in_a, "missing_in_b": missing_in_b, "differences": differences},
    )


def nothing_compared_guard() -> GuardResult:
    """The lossless guard of a sampled workload without greedy replicas: it fails, as nothing was compared."""
    return GuardResult("lossless", False, "sampled workload without greedy replicas: nothing compared; set "
                       "workload.greedy_replica_count > 0", {})


def trim_expected(verify_mode: str, force_override: bool) -> bool:
    """Whether an arm with this verify mode should trim verify windows on its own (its planner decides;
    with ``force_override``, engine.force_verify_len / force_budget_frac decide instead: see
    ``did_nothing_guard(forces_trim=...)``)."""
    return verify_mode in TRIMMING_VERIFY_MODES and not force_override


# What each of the planner's decline reasons (counters sched/plan_reason.<reason>, the names of
# dspark.planner.REASONS) means for a user.
DECLINE_HINTS = {
    "declined_no_table": "the planner has no profiled cost table for this node: profile one (runners.profile) "
                         "or point engine.cost_table at it",
    "declined_below_min_gain": "the planner predicted less than engine.min_predicted_gain from trimming: on this "
                               "node and workload a trimmed step is not predicted to pay (the drafter's confidence "
                               "keeps the tail, or shorter steps cost about as much as the full block)",
    "declined_flat_cost": "the cost table prices every verify length alike at this batch size, so trimming saves "
                          "no time on this node",
    "declined_small_batch": "steps ran fewer requests than engine.plan_min_rows, below which the full block is "
                            "verified without planning",
    "declined_mixed_step": "steps carried a prefill and engine.skip_mixed_trim declines those",
    "declined_snapshot_not_ready": "the survival snapshot that sizes the budget was not ready (engine.budget_lag)",
    "skipped_plan_not_paying": "the plan gate (engine.plan_gate) skipped the planner on these steps: at their "
                               "batch size its trims saved less time than its host time cost, so they verified "
                               "the whole block",
    "share_choice_full_block": "engine.verify_share's measured choice verified the whole block on these steps: "
                               "while it measured the whole block, or where the share measured slower",
    "forced": "engine.force_verify_len / engine.force_budget_frac replaced every decision, and the forced windows "
              "never cut the block",
}
# Declines where the planner ran, priced the step and chose the full block ("predicted no gain"), where the
# configuration asks it to (engine.skip_mixed_trim), or where the plan gate measured that planning does not pay
# and ran the full block without planning (engine.plan_gate): an arm whose every step declined for one
# of these is a correct answer ("trimming does not pay here"), not a feature that failed to run.
NO_GAIN_REASONS = ("declined_below_min_gain", "declined_flat_cost", "declined_small_batch", "declined_mixed_step",
                   "skipped_plan_not_paying", "share_choice_full_block")
# The same declines in words, for the message of an arm that declined every step.
NO_GAIN_WORDS = {
    "declined_below_min_gain": "predicted gain below engine.min_predicted_gain at this batch depth on this node",
    "declined_flat_cost": "the cost table prices every verify length alike at this batch size (flat cost)",
    "declined_small_batch": "batches below engine.plan_min_rows, which verify the whole block without planning",
    "declined_mixed_step": "steps carrying a prefill, which engine.skip_mixed_trim declines",
    "skipped_plan_not_paying": "planning measured to cost more host time than its trims saved (engine.plan_gate)",
    "share_choice_full_block": "the whole block measured faster than engine.verify_share's share",
}
# Every decline reason in a few words, for the note under a verdict (dspark.bench.report.verdict_note).
DECLINE_SHORT_WORDS = {
    "declined_below_min_gain": "planner predicted no gain", "declined_flat_cost": "a flat cost table",
    "declined_no_table": "no cost table", "declined_small_batch": "fewer rows than engine.plan_min_rows",
    "skipped_plan_not_paying": "the plan gate skipped planning", "declined_mixed_step": "steps with prefills",
    "declined_snapshot_not_ready": "no survival yet", "share_choice_full_block": "the share measured slower",
}
PLAN_REASON_PREFIX = "sched/plan_reason."


def plan_reasons(counters: Mapping[str, Any]) -> dict[str, int]:
    """The planner's decisions from an arm's counters (``sched/plan_reason.<reason>``): {reason: steps},
    reasons that occurred only, most frequent first."""
    reasons = {k[len(PLAN_REASON_PREFIX):]: float(v) for k, v in counters.items()
               if k.startswith(PLAN_REASON_PREFIX) and isinstance(v, (int, float)) and math.isfinite(float(v))
               and float(v)}
    return {k: int(round(v)) for k, v in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))}


def _why_no_trim(counters: Mapping[str, Any]) -> str:
    """The planner's decline reasons from the counters, most frequent first, each with its meaning."""
    reasons = [(name, float(n)) for name, n in plan_reasons(counters).items()]
    if not reasons:
        return ("the engine reported no planner decisions (sched/plan_reason.*): was the arm's planner built? "
                "check engine.verify and engine.cost_table")
    total = sum(n for _, n in reasons)
    parts = [f"{name} in {n:.0f} of {total:.0f} steps" + (f" ({DECLINE_HINTS[name]})" if name in DECLINE_HINTS else "")
             for name, n in reasons]
    return "the planner's decisions: " + "; ".join(parts)


def did_nothing_guard(arm_name: str, arm_config: Mapping[str, Any], counters: Mapping[str, Any], *,
                      expects_trim: bool, expects_graphs: bool, expects_speculation: bool,
                      forces_trim: bool = False, expects_draft_free: bool = False,
                      expects_service_cost: bool = False, expects_online_calibration: bool = False,
                      expects_calibration: str | None = None,
                      expects_greedy_calibration: str | None = None) -> GuardResult:
    """Fail when an arm's configured feature could not run, according to the engine's counters.

    Counters read: ``trimmed_steps``, ``trim_ratio`` and the planner's decisions
    ``sched/plan_reason.<reason>`` (when ``expects_trim``: the planner decides),
    ``trimmed_steps`` (when ``forces_trim``: engine.force_verify_len / force_budget_frac
    decide), ``graph_replays`` (when ``expects_graphs``), ``drafted_tokens`` (when
    ``expects_speculation``), ``draft_free_steps`` and the per-bucket choice counts ``draft_free/b<n>/*``
    (when ``expects_draft_free``: the choice must have been made; choosing to draft every step is an
    answer), ``service_cost/extra_steps`` and ``service_cost/floor_steps`` (when ``expects_service_cost``:
    some step must have been measured), ``online_calibration/refits`` (when ``expects_online_calibration``: the
    offsets must have been refitted at least once), ``confidence_calibration/<method>_steps`` (when
    ``expects_calibration`` names the method of the arm's engine.confidence_calibration: some drafted step's
    survival must have come from it), ``confidence_calibration/greedy_<method>_steps`` (when
    ``expects_greedy_calibration`` names the method of its engine.greedy_confidence_calibration: some all-greedy
    drafted step's survival must have come from it), and ``decode_steps`` if reported. A counter the check
    needs but the engine did not report is itself a failure: absence of evidence is
    not evidence that the feature ran.

    An arm that never trimmed passes when the planner ran and declined every step because
    it predicted no gain (:data:`NO_GAIN_REASONS`: below engine.min_predicted_gain, a flat
    cost table, or a mixed step engine.skip_mixed_trim declines): "trimming does not pay
    here" is an answer, and the arm did the same work as a verify-all arm. Then
    ``details["declined_all"]`` is True and ``details["plan_reasons"]`` holds the counts.
    It fails when any step declined because the planner could not decide (no cost table,
    no survival snapshot, an override), when it reported no decision at all, and when a
    forced trim never trimmed.
    """
    problems: list[str] = []
    declined_all = False
    declined_note = ""

    def need(key: str) -> float | None:
        if key not in counters:
            problems.append(f"counter {key!r} missing (engine reported {sorted(counters)}); cannot prove the "
                            "feature ran")
            return None
        return float(counters[key])

    reasons = plan_reasons(counters)
    # Every step draft-free (engine.draft_free_steps chose it on measured rates): no drafting, no planning, the
    # work of target-only decoding. An answer ("drafting does not pay here"), like a planner declining every step,
    # when the choice measured drafting first.
    draft_free_all = bool(expects_draft_free and float(counters.get("decode_steps", 0) or 0) > 0
                          and float(counters.get("draft_free_steps", 0) or 0) == float(counters["decode_steps"]))
    # Drafting measured: drafting steps counted in this run, or a comparison of the two kinds on adjacent steps,
    # which the choice keeps across an engine's reset (an A/B's warm-up measures it; its timed blocks count anew).
    measured_drafting = sum(float(v) for k, v in counters.items()
                            if str(k).startswith("draft_free/b") and str(k).endswith("/draft_steps")) \
        + sum(1 for k in counters if str(k).startswith("draft_free/b") and str(k).endswith("/free_vs_draft_pct"))
    if draft_free_all:
        expects_trim = expects_speculation = expects_online_calibration = False
        expects_calibration = expects_greedy_calibration = None
        if measured_drafting == 0:
            problems.append("every step ran draft-free, but the choice never measured a drafting step")
    if "decode_steps" in counters and float(counters["decode_steps"]) == 0:
        problems.append("decode_steps == 0: the engine never ran a decode step in this arm")
    if expects_trim:
        trimmed, ratio = need("trimmed_steps"), need("trim_ratio")
        if trimmed is not None and ratio is not None and not (trimmed > 0 and ratio > 0):
            could_not = {k: n for k, n in reasons.items() if k not in NO_GAIN_REASONS and k != "trimmed"}
            head = f"configured to trim but never did (trimmed_steps={trimmed:g}, trim_ratio={ratio:g}); "
            if trimmed > 0:  # trimmed steps that verified as many tokens as the full block
                problems.append(head + "the steps marked trimmed verified the whole block; " + _why_no_trim(counters))
            elif not reasons:
                problems.append(head + _why_no_trim(counters))
            elif could_not:
                total = sum(reasons.values())
                named = ", ".join(f"{k} in {n} of {total} steps" for k, n in could_not.items())
                problems.append(head + f"the planner could not decide ({named}); " + _why_no_trim(counters))
            else:
                declined_all = True
                total = sum(reasons.values())
                words = "; ".join(f"{NO_GAIN_WORDS.get(k, k)} ({k}, {n} steps)" if len(reasons) > 1
                                  else f"{NO_GAIN_WORDS.get(k, k)} ({k})" for k, n in reasons.items())
                declined_note = (f"declined all {total} steps: {words}; it verified the whole drafted block every "
                                 "step, the same work as a verify-all arm (trimming was not predicted to pay: an "
                                 "answer, not a failure)")
    if forces_trim:
        trimmed = need("trimmed_steps")
        if trimmed == 0:
            problems.append("a forced trim (engine.force_verify_len / engine.force_budget_frac) never trimmed "
                            "(trimmed_steps=0): the forced windows never cut the block (a forced length equal to "
                            "the block needs engine.force_trimmed_path=true); " + _why_no_trim(counters))
    if expects_graphs:
        replays = need("graph_replays")
        if replays == 0:
            problems.append("CUDA graphs enabled but graph_replays == 0: every step ran eager")
    if expects_speculation:
        drafted = need("drafted_tokens")
        if drafted == 0:
            problems.append("speculation enabled but drafted_tokens == 0: the drafter never proposed a token")

    if expects_draft_free:
        need("draft_free_steps")
        if not any(str(k).startswith("draft_free/b") for k in counters):
            problems.append("draft-free steps enabled but the engine never chose between drafting and a draft-free "
                            "step (no draft_free/b<bucket>/* counters)")
    if expects_service_cost:
        measured = [need("service_cost/extra_steps"), need("service_cost/floor_steps")]
        if all(m is not None for m in measured) and not any(measured):
            problems.append("engine.service_cost enabled but no committed step was measured for it")
    if expects_online_calibration:
        refits = need("online_calibration/refits")
        if refits == 0:
            problems.append("engine.online_calibration enabled but its offsets were never refitted (fewer verified "
                            "steps than one refit needs)")

    if expects_calibration is not None:
        read = need(f"confidence_calibration/{expects_calibration}_steps")
        if read == 0:
            small = float(counters.get(PLAN_REASON_PREFIX + "declined_small_batch", 0) or 0)
            why = (" (every step ran fewer requests than engine.plan_min_rows, which run no confidence head: lower it "
                   "or raise the concurrency)" if small and small == float(counters.get("decode_steps", -1)) else "")
            problems.append(f"engine.confidence_calibration ({expects_calibration}) configured but no drafted step's "
                            "survival came from it" + why)
    if expects_greedy_calibration is not None:
        read = need(f"confidence_calibration/greedy_{expects_greedy_calibration}_steps")
        if read == 0:
            problems.append(f"engine.greedy_confidence_calibration ({expects_greedy_calibration}) configured but no "
                            "drafted step whose rows all decode greedily had its survival from it (a sampled "
                            "workload runs none)")
    expectations = {"expects_trim": expects_trim, "expects_graphs": expects_graphs,
                    "expects_speculation": expects_speculation, "forces_trim": forces_trim,
                    "expects_draft_free": expects_draft_free, "expects_service_cost": expects_service_cost,
                    "expects_online_calibration": expects_online_calibration,
                    "expects_calibration": expects_calibration,
                    "expects_greedy_calibration": expects_greedy_calibration}
    expected = [k.removeprefix("expects_") for k, v in expectations.items() if v and k.startswith("expects_")]
    if forces_trim:
        expected.append("forced trim")
    named = {"calibration": f"calibration {expects_calibration}",
             "greedy_calibration": f"greedy calibration {expects_greedy_calibration}"}
    expected = [named.get(e, e) for e in expected]
    if problems:
        message = f"arm {arm_name}: " + "; ".join(problems)
    elif draft_free_all:
        message = (f"{arm_name} ran all {float(counters['decode_steps']):g} decode steps draft-free: drafting measured "
                   "slower at its batch sizes (draft_free/b<bucket>/* counters), so it did the work of target-only "
                   "decoding (an answer, not a failure)")
    elif declined_all:
        others = [e for e in expected if e != "trim"]
        message = f"{arm_name} {declined_note}" + (f"; engaged: {', '.join(others)}" if others else "")
    elif expected:
        message = f"arm {arm_name}: every configured feature engaged ({', '.join(expected)})"
    else:
        message = f"arm {arm_name}: no feature expected to engage (baseline arm)"
    return GuardResult(name=f"did_nothing[{arm_name}]", passed=not problems, message=message,
                       details={"arm_config": dict(arm_config), "counters": dict(counters), **expectations,
                                "declined_all": declined_all, "draft_free_all": draft_free_all,
                                "plan_reasons": reasons, "problems": problems})


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
