"""What drafting bought and what it cost, against an arm that decodes target-only.

A speculative step is longer than a target-only step of the same rows (the draft stage, and the target verifying
the drafted block), and each of its row-steps (one request in one decode step) emits the accepted drafts and the
target's token instead of one token. With the same requests (the same output), drafting pays where its row-steps'
tokens outgrow its steps' length: tokens per row-step x steps per ms, drafting over target-only, were every step at
one batch depth and the device the bound. The ledger reads that at the deepest batch bucket both arms timed
(``device/<mode>_b<rows>_step_ms_median``; the drafting arm's steps of every mode there, each mode's median weighted
by its steps), the prefills hidden beside the steps. Unlike the trim ledger (:mod:`dspark.bench.trim_ledger`) it
gives no serial bound: a prefill is timed beside the decode steps, and beside the drafting arm's longer steps it
reads longer for the same prompts, which a serial estimate would count against drafting. The A/B's measured change
also counts steps at fewer rows and host time the device waited for (a target-only step of a few milliseconds is
often host-bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from dspark.bench.trim_ledger import TRIMMED_MODES, ArmLedger, arm_ledger, counter, measured_clause, steps_by_rows

DRAFTING_MODES = ("full", *TRIMMED_MODES, "draft_free")  # a drafting arm's decode steps (draft_free: none drafted)


@dataclass(frozen=True)
class DraftLedger:
    """A target-only arm against a drafting arm; step times at ``rows`` (None: no bucket both timed)."""

    target_only: ArmLedger
    drafting: ArmLedger
    rows: int | None
    target_step_ms: float | None  # the target-only arm's median step at ``rows``
    drafting_step_ms: float | None  # the drafting arm's mean step at ``rows`` (its modes' medians by their steps)

    @property
    def token_ratio(self) -> float:
        """Tokens per row-step, drafting over target-only (3.0: each row-step emitted three times the tokens)."""
        return self.drafting.tokens_per_row_step / self.target_only.tokens_per_row_step

    @property
    def step_ratio(self) -> float | None:
        """The drafting arm's device step over the target-only arm's at ``rows``."""
        return None if self.rows is None else self.drafting_step_ms / self.target_step_ms

    @property
    def device_bound_change(self) -> float | None:
        """Drafting over target-only, were every step at ``rows`` and the device the bound, the prefills hidden
        beside the steps."""
        return None if self.rows is None else self.token_ratio / self.step_ratio - 1.0



def _is_target_only(c: Mapping[str, Any]) -> bool:
    decoded = bool(counter(c, "request_steps")) and bool(counter(c, "emitted_tokens"))
    return decoded and not counter(c, "verified_tokens")


def draft_ledger(summary: Mapping[str, Any]) -> DraftLedger | None:
    """The ledger of the A/B's drafting arm against its target-only arm; None unless one arm decoded target-only
    and the other drafted."""
    counters = {arm: c for arm, c in (summary.get("counters") or {}).items() if isinstance(c, Mapping)}
    plain = [arm for arm, c in counters.items() if _is_target_only(c)]
    drafting = [arm for arm, c in counters.items() if counter(c, "request_steps") and counter(c, "verified_tokens")]
    if len(plain) != 1 or len(drafting) != 1:
        return None
    t, d = counters[plain[0]], counters[drafting[0]]
    t_steps = {r: modes["full"] for r, modes in steps_by_rows(t).items() if "full" in modes}
    d_steps = steps_by_rows(d, DRAFTING_MODES)
    common = sorted(set(t_steps) & set(d_steps))
    rows = common[-1] if common else None
    t_ms = d_ms = None
    if rows is not None:
        t_ms = t_steps[rows][0]
        modes = d_steps[rows].values()
        d_ms = sum(ms * n for ms, n in modes) / sum(n for _, n in modes)
    return DraftLedger(target_only=arm_ledger(plain[0], t), drafting=arm_ledger(drafting[0], d), rows=rows,
                       target_step_ms=t_ms, drafting_step_ms=d_ms)


def _change(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or a == 0 else f"{b / a - 1:+.1%}"


def draft_ledger_table(ledger: DraftLedger, names: Mapping[str, str]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the ledger table: the target-only arm, the drafting arm, the change."""
    t, d = ledger.target_only, ledger.drafting
    at = f"at {ledger.rows} rows" if ledger.rows is not None else "(no common bucket)"
    ms = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    rows = [
        ["tokens per row-step", f"{t.tokens_per_row_step:.3f}", f"{d.tokens_per_row_step:.3f}",
         _change(t.tokens_per_row_step, d.tokens_per_row_step)],
        ["row-steps", f"{t.row_steps:,.0f}", f"{d.row_steps:,.0f}", _change(t.row_steps, d.row_steps)],
        ["decode steps", f"{t.decode_steps:,.0f}", f"{d.decode_steps:,.0f}", _change(t.decode_steps, d.decode_steps)],
        [f"device ms per step {at}", ms(ledger.target_step_ms), ms(ledger.drafting_step_ms),
         _change(ledger.target_step_ms, ledger.drafting_step_ms)],
        ["device idle", "-" if t.device_idle is None else f"{t.device_idle:.1%}",
         "-" if d.device_idle is None else f"{d.device_idle:.1%}", ""],
    ]
    return ["", names[t.arm], names[d.arm], f"{d.arm} vs {t.arm}"], rows


def draft_ledger_sentence(ledger: DraftLedger, names: Mapping[str, str], measured: Mapping[str, float | None]) -> str:
    """The ledger in words, with the A/B's measured changes (``measured``: {what: drafting vs target-only in %})."""
    t, d = names[ledger.target_only.arm], names[ledger.drafting.arm]
    tokens = (f"{d}'s row-steps emitted {ledger.drafting.tokens_per_row_step:.2f} tokens against "
              f"{ledger.target_only.tokens_per_row_step:.2f}")
    if ledger.rows is None:
        text = f"{tokens}; no batch bucket was timed in both arms, so the steps' lengths are not compared"
    else:
        text = (f"At {ledger.rows} rows {d}'s device step took {ledger.step_ratio:.2f}x {t}'s and {tokens}: drafting "
                f"pays while its step is under {ledger.token_ratio:.2f}x as long. Were every step at {ledger.rows} "
                f"rows and the device the bound, it nets {ledger.device_bound_change:+.1%}")
    return text + measured_clause(measured) + "."
