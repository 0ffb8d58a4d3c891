"""What a trimming arm's verification trims bought and what they cost, against an arm that verified whole blocks.

A trim sends fewer drafted cells to the target: at a given batch depth the device step gets shorter, and the
accepted drafts it left out are tokens the step did not emit, so the arm's requests need more steps. Over the
decode steps an arm's output is exactly

    emitted tokens = row-steps x tokens per row-step,   row-steps = decode steps x mean rows per step,

so with the same requests (the same output) the trim's token cost is the fall in tokens per row-step, paid as
more row-steps. The ledger sets it beside the step time the trims saved at the deepest batch bucket where one arm
timed whole-block steps and the other trimmed ones (CUDA events, ``device/<mode>_b<rows>_step_ms_median``) and
gives what the two make together where every
step ran at that depth and the device set the pace: tokens per row-step x steps per ms, trim over whole block.
Prefills run beside the decode steps (``engine.prefill_stream``) on the same device, the same work in both arms:
where they hide entirely beside the steps the change is that product; where they run beside none, each step also
carries its rows' share of the prefills' device time (``prefill_graph_replays`` x ``device/prefill_step_ms_median``
per row-step, times the rows), which dilutes it. A device-bound service lies between the two. (A prefill is timed
beside the decode steps, so its time holds what it waited for them: the serial estimate dilutes somewhat more than
serial prefills would.) The A/B's measured change also counts steps at fewer rows and host time the device waited
for.

Everything is read from the arms' engine counters summed over their timed blocks (``summary["counters"]``), so a
committed ``summary.json`` is enough: ``python bench/trim_ledger.py SUMMARY...``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

TRIMMED_MODES = ("ragged", "uniform")  # device step modes of a trimmed step (dspark.graph_decode)
_STEP = re.compile(r"^device/(?P<mode>[a-z_]+)_b(?P<rows>\d+)_step_ms_median$")


@dataclass(frozen=True)
class ArmLedger:
    """One arm's side of the ledger (counters summed over its timed blocks)."""

    arm: str
    decode_steps: float
    row_steps: float  # request_steps: one per request per decode step
    verified_per_row_step: float  # drafted cells the target verified, per row-step
    tokens_per_row_step: float  # emitted tokens (accepted drafts + the target's own token) per row-step
    device_idle: float | None  # share of the run's time the device had no work
    prefill_us_per_row_step: float | None  # the prefill graphs' device time per row-step, in us (None: not timed)


@dataclass(frozen=True)
class TrimLedger:
    """A whole-block arm (``full``) against a trimming arm (``trim``).

    At ``rows``, the deepest batch bucket where the whole-block arm timed whole-block steps and the trimming arm
    trimmed ones, ``full_step_ms`` is the former's median and ``trimmed_step_ms`` the latter's (its trimmed modes
    weighted by their steps); the trimming arm's whole-block steps there are priced at ``full_step_ms`` (the same
    work), so that medians compare with medians: its mean step at ``rows`` is :attr:`trim_step_ms`."""

    full: ArmLedger
    trim: ArmLedger
    rows: int | None  # None: no such bucket
    full_step_ms: float | None
    trimmed_step_ms: float | None
    trimmed_share_at_rows: float | None  # the trimming arm's steps at ``rows`` that were trimmed
    trimmed_share_of_steps: float  # the trimming arm's trimmed steps over its decode steps

    @property
    def trim_step_ms(self) -> float | None:
        """The trimming arm's mean device step at ``rows``: its trimmed steps' median and, for its whole-block
        steps there, the whole-block arm's."""
        if self.rows is None:
            return None
        share = self.trimmed_share_at_rows
        return share * self.trimmed_step_ms + (1.0 - share) * self.full_step_ms

    @property
    def token_cost(self) -> float:
        """The fall in tokens per row-step (0.085: the trimming arm's row-steps emitted 8.5% fewer tokens)."""
        return 1.0 - self.trim.tokens_per_row_step / self.full.tokens_per_row_step

    @property
    def step_saving(self) -> float | None:
        """How much shorter the trimming arm's mean device step was at ``rows`` (0.11: 11% shorter)."""
        return None if self.rows is None else 1.0 - self.trim_step_ms / self.full_step_ms

    @property
    def device_bound_change(self) -> float | None:
        """Trim over whole block, were every step at ``rows`` and device-bound: tokens per row-step x steps per
        ms."""
        if self.rows is None:
            return None
        tokens = self.trim.tokens_per_row_step / self.full.tokens_per_row_step
        return tokens * (self.full_step_ms / self.trim_step_ms) - 1.0

    @property
    def serial_bound_change(self) -> float | None:
        """As :attr:`device_bound_change` with each step also carrying its rows' share of the prefills' device time
        (the prefills beside no step: the change diluted by work a trim cannot shorten)."""
        f, t = self.full, self.trim
        if self.rows is None or f.prefill_us_per_row_step is None or t.prefill_us_per_row_step is None:
            return None
        f_ms = self.full_step_ms + f.prefill_us_per_row_step * self.rows / 1e3
        t_ms = self.trim_step_ms + t.prefill_us_per_row_step * self.rows / 1e3
        return (t.tokens_per_row_step / f.tokens_per_row_step) * (f_ms / t_ms) - 1.0

    @property
    def us_per_trimmed_draft(self) -> float | None:
        """Device microseconds a trimmed step saved per drafted cell it left out, at ``rows``; only where every
        step of the trimming arm was trimmed (then its cells per row-step are those of its trimmed steps)."""
        left_out = self.full.verified_per_row_step - self.trim.verified_per_row_step
        if self.rows is None or self.trimmed_share_of_steps < 0.99 or left_out <= 0:
            return None
        return (self.full_step_ms - self.trimmed_step_ms) * 1e3 / (self.rows * left_out)


def counter(counters: Mapping[str, Any], name: str) -> float | None:
    """A numeric counter as a float; None where it is absent or not a number."""
    v = counters.get(name)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def steps_by_rows(counters: Mapping[str, Any], modes: tuple[str, ...] = ("full", *TRIMMED_MODES)
                  ) -> dict[int, dict[str, tuple[float, float]]]:
    """{rows: {mode: (median device ms, steps)}} of the decode steps of ``modes``, from the per-bucket device
    counters."""
    out: dict[int, dict[str, tuple[float, float]]] = {}
    for name in counters:
        m = _STEP.match(name)
        if m is None or m["mode"] not in modes:
            continue
        ms, steps = counter(counters, name), counter(counters, f"device/{m['mode']}_b{m['rows']}_steps")
        if ms is not None and steps:
            out.setdefault(int(m["rows"]), {})[m["mode"]] = (ms, steps)
    return out


def _is_drafting(c: Mapping[str, Any]) -> bool:
    return all(counter(c, name) for name in ("request_steps", "verified_tokens", "emitted_tokens"))


def arm_ledger(arm: str, c: Mapping[str, Any]) -> ArmLedger:
    """One arm's side of a ledger from its counters (``request_steps`` must be positive)."""
    row_steps = counter(c, "request_steps")
    replays, prefill_ms = counter(c, "prefill_graph_replays"), counter(c, "device/prefill_step_ms_median")
    prefill = replays * prefill_ms * 1e3 / row_steps if replays is not None and prefill_ms is not None else None
    return ArmLedger(arm=arm, decode_steps=counter(c, "decode_steps") or 0.0, row_steps=row_steps,
                     verified_per_row_step=counter(c, "verified_tokens") / row_steps,
                     tokens_per_row_step=counter(c, "emitted_tokens") / row_steps,
                     device_idle=counter(c, "device_idle_fraction"), prefill_us_per_row_step=prefill)


def trim_ledger(summary: Mapping[str, Any]) -> TrimLedger | None:
    """The ledger of the A/B's trimming arm against its whole-block arm; None unless exactly one arm trimmed steps
    and the other drafted and trimmed none."""
    counters = summary.get("counters") or {}
    drafting = {arm: c for arm, c in counters.items() if isinstance(c, Mapping) and _is_drafting(c)}
    trims = [arm for arm, c in drafting.items() if (counter(c, "trimmed_steps") or 0) > 0]
    fulls = [arm for arm, c in drafting.items() if (counter(c, "trimmed_steps") or 0) == 0]
    if len(trims) != 1 or len(fulls) != 1:
        return None
    f, t = drafting[fulls[0]], drafting[trims[0]]
    f_steps = {r: modes["full"] for r, modes in steps_by_rows(f).items() if "full" in modes}
    t_steps = steps_by_rows(t)
    common = sorted(r for r in set(f_steps) & set(t_steps) if any(m in t_steps[r] for m in TRIMMED_MODES))
    rows = common[-1] if common else None
    full_ms = trimmed_ms = share = None
    if rows is not None:
        trimmed = [t_steps[rows][m] for m in TRIMMED_MODES if m in t_steps[rows]]
        n_trimmed = sum(n for _, n in trimmed)
        trimmed_ms = sum(ms * n for ms, n in trimmed) / n_trimmed
        share = n_trimmed / (n_trimmed + t_steps[rows].get("full", (0.0, 0.0))[1])
        full_ms = f_steps[rows][0]
    decode = counter(t, "decode_steps")
    return TrimLedger(full=arm_ledger(fulls[0], f), trim=arm_ledger(trims[0], t), rows=rows, full_step_ms=full_ms,
                      trimmed_step_ms=trimmed_ms, trimmed_share_at_rows=share,
                      trimmed_share_of_steps=(counter(t, "trimmed_steps") or 0.0) / decode if decode else 0.0)


def measured_change(summary: Mapping[str, Any], metric: str | None, arm: str) -> float | None:
    """The A/B's measured change of ``metric`` (``summary["statistics"]``, B vs A) turned to ``arm`` against the
    other, in %; None where the run did not compare that metric."""
    change = (summary.get("statistics") or {}).get(metric, {}).get("change_pct") if metric else None
    if not isinstance(change, (int, float)):
        return None
    ratio = 1.0 + change / 100.0
    return 100.0 * ((ratio if arm == "B" else 1.0 / ratio) - 1.0)


def measured_changes(summary: Mapping[str, Any], arm: str, full_load_metric: str) -> dict[str, float | None]:
    """The A/B's measured changes for ``arm`` against the other, in %: {"at full load": ..., "over whole blocks": ...}
    (None where the run did not compare that metric)."""
    return {"at full load": measured_change(summary, full_load_metric, arm),
            "over whole blocks": measured_change(summary, summary.get("headline_metric"), arm)}


def measured_clause(measured: Mapping[str, float | None]) -> str:
    """". Measured in the A/B: ..." with the changes of :func:`measured_changes` ("" where none was measured)."""
    shown = [f"{v:+.2f}% {what}" for what, v in measured.items() if v is not None]
    if not shown:
        return ""
    return (f". Measured in the A/B: {', '.join(shown)}, which also count steps at fewer rows and host time the "
            "device waited for")


def ledger_record(summary: Mapping[str, Any], full_load_metric: str) -> dict[str, Any] | None:
    """The ledger as one flat record (a sweep's table, ``bench/trim_ledger.py``); percentages in %; None without a
    trimming arm against a whole-block arm."""
    ledger = trim_ledger(summary)
    if ledger is None:
        return None
    pct = lambda v: None if v is None else 100.0 * v  # noqa: E731
    measured = measured_changes(summary, ledger.trim.arm, full_load_metric)
    return {"trim_arm": ledger.trim.arm, "rows": ledger.rows,
            "verified_per_row_step_full": ledger.full.verified_per_row_step,
            "verified_per_row_step_trim": ledger.trim.verified_per_row_step,
            "token_cost_pct": pct(ledger.token_cost), "step_saving_pct": pct(ledger.step_saving),
            "us_per_trimmed_draft": ledger.us_per_trimmed_draft,
            "device_bound_pct": pct(ledger.device_bound_change), "serial_bound_pct": pct(ledger.serial_bound_change),
            "measured_full_load_pct": measured["at full load"], "measured_pct": measured["over whole blocks"]}


LEDGER_HEADERS = ["rows", "drafts verified / row-step", "token cost", "step saved", "us / draft left out",
                  "device-bound: prefills hidden / serial", "measured: full load / whole blocks"]


def ledger_cells(record: Mapping[str, Any]) -> list[str]:
    """A :func:`ledger_record` as the cells under LEDGER_HEADERS ("-" where a value is unknown)."""
    def num(key: str, spec: str, unit: str = "") -> str:
        v = record.get(key)
        return "-" if v is None else format(v, spec) + unit
    verified = f"{record['verified_per_row_step_full']:.2f} -> {record['verified_per_row_step_trim']:.2f}"
    return [num("rows", "d"), verified,
            num("token_cost_pct", ".1f", "%"), num("step_saving_pct", ".1f", "%"), num("us_per_trimmed_draft", ".2f"),
            f"{num('device_bound_pct', '+.1f', '%')} / {num('serial_bound_pct', '+.1f', '%')}",
            f"{num('measured_full_load_pct', '+.2f', '%')} / {num('measured_pct', '+.2f', '%')}"]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _change(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or a == 0 else f"{b / a - 1:+.1%}"


def ledger_table(ledger: TrimLedger, names: Mapping[str, str]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the ledger table: one row per quantity, the whole-block arm, the trimming arm, the
    change."""
    f, t = ledger.full, ledger.trim
    f_ms, t_ms, trimmed_ms = ledger.full_step_ms, ledger.trim_step_ms, ledger.trimmed_step_ms
    at = f"at {ledger.rows} rows" if ledger.rows is not None else "(no common bucket)"
    ms = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    rows = [
        ["drafts verified per row-step", f"{f.verified_per_row_step:.2f}", f"{t.verified_per_row_step:.2f}",
         _change(f.verified_per_row_step, t.verified_per_row_step)],
        ["tokens per row-step", f"{f.tokens_per_row_step:.3f}", f"{t.tokens_per_row_step:.3f}",
         _change(f.tokens_per_row_step, t.tokens_per_row_step)],
        ["row-steps", f"{f.row_steps:,.0f}", f"{t.row_steps:,.0f}", _change(f.row_steps, t.row_steps)],
        ["decode steps", f"{f.decode_steps:,.0f}", f"{t.decode_steps:,.0f}", _change(f.decode_steps, t.decode_steps)],
        [f"device ms {at}: a whole-block / a trimmed step", ms(f_ms), ms(trimmed_ms), _change(f_ms, trimmed_ms)],
        [f"share of the steps {at} trimmed", "0%" if ledger.rows is not None else "-",
         "-" if ledger.trimmed_share_at_rows is None else f"{ledger.trimmed_share_at_rows:.0%}", ""],
        [f"device ms per step {at}, mean", ms(f_ms), ms(t_ms), _change(f_ms, t_ms)],
        ["prefill device us per row-step",
         "-" if f.prefill_us_per_row_step is None else f"{f.prefill_us_per_row_step:.1f}",
         "-" if t.prefill_us_per_row_step is None else f"{t.prefill_us_per_row_step:.1f}",
         _change(f.prefill_us_per_row_step, t.prefill_us_per_row_step)],
        ["device idle", "-" if f.device_idle is None else f"{f.device_idle:.1%}",
         "-" if t.device_idle is None else f"{t.device_idle:.1%}", ""],
    ]
    return ["", names[f.arm], names[t.arm], f"{t.arm} vs {f.arm}"], rows


def ledger_sentence(ledger: TrimLedger, names: Mapping[str, str], measured: Mapping[str, float | None]) -> str:
    """The ledger in words: the step time saved, the tokens it cost, what the two make device-bound at the deepest
    bucket, and the A/B's measured changes (``measured``: {what: change in %, e.g. "at full load": 0.74})."""
    f, t = ledger.full, ledger.trim
    cost = (f"the accepted drafts they left out cost {ledger.token_cost:.1%} of the tokens a row-step emits "
            f"({names[t.arm]} ran {_change(f.row_steps, t.row_steps)} row-steps)")
    if ledger.step_saving is None:
        text = (f"{names[t.arm]} trimmed {ledger.trimmed_share_of_steps:.0%} of its steps; {cost}. No batch bucket "
                f"holds timed whole-block steps of {names[f.arm]} and trimmed steps of {names[t.arm]}, so the step "
                "time the trims saved is not known")
    else:
        per = ledger.us_per_trimmed_draft
        per_text = f", {per:.2f} us per draft left out" if per is not None else ""
        moved = (f"{ledger.step_saving:.1%} shorter" if ledger.step_saving >= 0
                 else f"{-ledger.step_saving:.1%} longer")
        if ledger.trimmed_share_at_rows < 1.0:
            moved += f" ({ledger.trimmed_share_at_rows:.0%} of its steps there trimmed)"
        serial = ledger.serial_bound_change
        serial_text = (f" if the prefills hid beside the steps, {_pct(serial)} if they ran beside none"
                       if serial is not None else "")
        text = (f"At {ledger.rows} rows the trims made {names[t.arm]}'s mean device step {moved}{per_text}; {cost}. "
                f"Breaking even takes a step {ledger.token_cost:.1%} shorter. Were every step at {ledger.rows} rows "
                f"and the device the bound, the two net {_pct(ledger.device_bound_change)} against {names[f.arm]} "
                f"(tokens per row-step x steps per ms){serial_text}")
    return text + measured_clause(measured) + "."
