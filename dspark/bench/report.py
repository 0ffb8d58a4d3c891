"""Reports of A/B experiments: one experiment's markdown report, its appendix and plots, a console
table, sweeps.

The input is the experiment summary the A/B runner writes as ``summary.json``:

    {
      "experiment": str,
      "headline_metric": str,                 # a key of "statistics"
      "statistics": {metric: ABStatistics.to_dict(), ...},
      "guards": [GuardResult.to_dict(), ...],
      "arms": {"A": {...}, "B": {...}},       # optional: arm descriptions ("label", "engine", ...)
      "fingerprint": {...},                   # optional: node_fingerprint()
      "counters": {"A": {...}, "B": {...}},   # optional: engine counters per arm
      "sweep_params": {name: value, ...},     # optional: the sweep overrides of this job
      "sweep_job": str,                       # optional: a multirun job's name (runners.sweep_dirs)
      "wandb": {...},                         # optional: WandbLogger.status()
      "timing_health": {                      # optional (newer runs)
        "captured_in_timed_blocks": [{"block", "arm", "graphs"}, ...],
        "first_block_vs_median": {"A": ratio, "B": ratio},
        "flags": [str, ...],
      },
    }

``blocks_df`` has one row per (block, arm) with ``block``, ``arm``, ``first_arm``, the
metric columns (:func:`dspark.bench.metrics.aggregate_block`) and optionally
``per_position_acceptance`` (a list per row); ``requests_df`` is
:func:`dspark.bench.metrics.requests_dataframe` output. Sections whose data is absent say so
in the report instead of disappearing.

``report.md`` opens with the verdict as a sentence, then the arms' throughput and latency
percentiles with their intervals over blocks, the settings in which the arms differ and the
latency CDFs; statistics, guards, planner, "Where the time went", a few key counters and the
other plots follow. A run marked ``interrupted`` says so under the verdict; one interrupted before a block
ran in both arms has no statistics and says that in place of the verdict. ``report_appendix.md``
beside it holds what is long: every arm setting, every engine counter, the token-bucket and verify-length
histograms and the node fingerprint. Arms are named by their labels (``summary["arms"][arm]["label"]``) with
their key. Verdicts are worded from the stored statistics by :func:`dspark.bench.statistics.reassess`, so a
run recorded under older rules is worded by the current ones when its report is rendered again.

"Where the time went" (:func:`time_breakdown`) reads the engine's step-path counters from
``blocks_df`` (``counter/decode_steps``, ``counter/device_resident_share``,
``counter/eager_steps``, ``counter/eager_reason/<why>``, ``counter/host_ms_per_graph_step_median``,
``counter/device_idle_fraction``, ``counter/mean_running_batch``, ``counter/graphs_captured``,
``counter/prefill_graph_replays``, ``counter/prefill_eager_steps``,
``counter/kv_pool_tokens``); a counter an older run did not record leaves its cell "-".
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table
from scipy import stats as sps

from dspark.bench import report_plots
from dspark.bench.draft_ledger import draft_ledger, draft_ledger_sentence, draft_ledger_table
from dspark.bench.statistics import reassess, verdict_sentence
from dspark.bench.trim_ledger import (LEDGER_HEADERS, ledger_cells, ledger_record, ledger_sentence, ledger_table,
                                      measured_changes, trim_ledger)
from dspark.stats import HOST_PHASES

APPENDIX = "report_appendix.md"
# Counters shown in the report itself; all of them are in the appendix.
KEY_COUNTERS = ("decode_steps", "drafted_tokens", "accepted_tokens", "accept_rate", "trimmed_steps", "trim_ratio",
                "draft_free_steps", "depth_zero_rows", "mean_running_batch", "preemptions", "eager_steps")
# Counter families drawn as histograms in the appendix: counter name prefix -> (title, what a bucket is).
HISTOGRAMS = {"sched/token_bucket_hist.": ("Token buckets", "tokens per step, padded to the bucket"),
              "sched/verify_len_hist.": ("Verify lengths", "drafted tokens verified per request and step")}
# Rows of the per-arm results table: (blocks_df column prefix or column, name, kind).
THROUGHPUT_ROWS = (("output_tokens_per_s", "output tokens/s", "rate"),
                   ("steady_output_tokens_per_s", "output tokens/s at full load", "rate"),
                   ("steady_share", "full-load share of the block", "share"),
                   ("requests_per_s", "requests/s", "rate"))
# With a service level (load.sla_ttft_ms / sla_tpot_ms): goodput and the share of requests that met it.
GOODPUT_ROWS = (("goodput_tokens_per_s", "goodput tokens/s", "rate"), ("goodput_requests_per_s", "goodput requests/s", "rate"),
                ("sla_attainment", "requests within the SLA", "share"))
LATENCY_ROWS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"),
                ("queue_wait_s", "queue wait"))
PERCENTILES = (50, 90, 99)
INTERVAL_LEVEL = 0.95


def _fmt(value: Any, spec: str = ".3g") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        return format(value, spec)
    return str(value)


def _markdown(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown (pipe) table; cells are written as given (no number parsing), pipes and newlines escaped."""
    cells = [[str(v).replace("|", "\\|").replace("\n", " ") for v in row] for row in rows]
    return pd.DataFrame(cells, columns=list(headers)).to_markdown(index=False, tablefmt="pipe",
                                                                   disable_numparse=True)


def _ci_text(stat: Mapping[str, Any]) -> str:
    low, high = stat.get("ci_low_pct"), stat.get("ci_high_pct")
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return "n/a"
    return f"{low:+.2f} .. {high:+.2f}%"


def _require(summary: Mapping[str, Any], key: str) -> Any:
    if key not in summary:
        raise KeyError(f"summary lacks {key!r} (has {sorted(summary)}); it must come from the A/B runner's "
                       "summary.json")
    return summary[key]


def statistics_of(summary: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``summary["statistics"]`` with every verdict worded by the current rules (:func:`reassess`)."""
    return {metric: reassess(s) for metric, s in (_require(summary, "statistics") or {}).items()}


class UnreadableSummaryError(ValueError):
    """A summary.json that cannot be read as a JSON object; ``path`` is the file, ``reason`` why."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"cannot read A/B summary {path}: {reason}; the A/B runner writes it whole when a run ends "
                         "(interrupted runs too): copy it again from where the run wrote it, or measure the run again")
        self.path, self.reason = path, reason


def read_summary(path: str | Path) -> dict[str, Any]:
    """A ``summary.json`` as a dict; :class:`UnreadableSummaryError` when it is missing, empty, truncated or not a
    JSON object."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UnreadableSummaryError(path, str(exc)) from exc
    if not text.strip():
        raise UnreadableSummaryError(path, "the file is empty")
    try:
        summary = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UnreadableSummaryError(path, f"not valid JSON, truncated? ({exc})") from exc
    if not isinstance(summary, dict):
        raise UnreadableSummaryError(path, f"it holds a JSON {type(summary).__name__}, not an object")
    return summary


def read_summaries(paths: Iterable[str | Path]) -> tuple[dict[Path, dict[str, Any]], dict[Path, str]]:
    """(readable, unreadable): the summaries that :func:`read_summary` reads, by path, and the reason each other
    one cannot be read, by path."""
    readable, unreadable = {}, {}
    for path in map(Path, paths):
        try:
            readable[path] = read_summary(path)
        except UnreadableSummaryError as exc:
            unreadable[path] = exc.reason
    return readable, unreadable


def has_headline_statistics(summary: Mapping[str, Any]) -> bool:
    """Whether ``summary["statistics"]`` has an entry for the headline metric."""
    return _require(summary, "headline_metric") in (_require(summary, "statistics") or {})


def require_headline_statistics(summary: Mapping[str, Any]) -> None:
    """KeyError unless the summary has statistics on its headline metric or is marked ``interrupted``: a run
    interrupted before a block ran in both arms has none, any other run must."""
    if has_headline_statistics(summary) or summary.get("interrupted"):
        return
    raise KeyError(f"headline_metric {summary['headline_metric']!r} has no entry in statistics "
                   f"({sorted(summary['statistics'] or {})}) and the run is not marked interrupted: the summary is "
                   "incomplete; it must come whole from the A/B runner (measure the run again)")


def arm_labels(summary: Mapping[str, Any], arms: Iterable[str]) -> dict[str, str]:
    """Arm key -> its label (``summary["arms"][arm]["label"]``), the key where there is none; a label two arms
    share gets its key appended."""
    described = summary.get("arms") or {}
    labels = {}
    for arm in arms:
        entry = described.get(arm)
        label = entry.get("label") if isinstance(entry, dict) else None
        labels[arm] = str(label) if label else str(arm)
    counts = pd.Series(list(labels.values()), dtype=object).value_counts()
    return {arm: (f"{label} ({arm})" if counts[label] > 1 else label) for arm, label in labels.items()}


def arm_names(summary: Mapping[str, Any], arms: Iterable[str] = ("A", "B")) -> dict[str, str]:
    """Arm key -> how the report names it in sentences and column headers: "label (A)", or the key alone
    where the arm has no label."""
    labels = arm_labels(summary, arms)
    return {arm: label if label == arm or label.endswith(f"({arm})") else f"{label} ({arm})"
            for arm, label in labels.items()}


def verdict_line(summary: Mapping[str, Any]) -> str:
    """"Verdict on <headline metric>: <sentence>" with the arms named by their labels; for a run interrupted before
    a block ran in both arms, "No verdict on <headline metric>: no statistics (<the summary's verdict>)"."""
    headline = _require(summary, "headline_metric")
    require_headline_statistics(summary)
    if not has_headline_statistics(summary):
        return f"No verdict on {headline}: no statistics ({summary.get('verdict') or 'none recorded'})"
    names = arm_names(summary)
    return f"Verdict on {headline}: {verdict_sentence(statistics_of(summary)[headline], names['A'], names['B'])}"


def interrupted_line(summary: Mapping[str, Any]) -> str | None:
    """"Interrupted: <what the statistics and guards cover>" for a run marked ``interrupted`` (the message of its
    ``interrupted`` guard, else the record's signal, phase and arm-blocks), None for a run that was not."""
    record = summary.get("interrupted")
    if not record:
        return None
    guard = next((g for g in summary.get("guards") or [] if g.get("name") == "interrupted" and g.get("message")), None)
    if guard is not None:
        what = guard["message"]
    else:
        fields = record if isinstance(record, Mapping) else {}
        what = (f"{fields.get('signal', 'a signal')} during the {fields.get('phase', 'run')}, after "
                f"{fields.get('completed_arm_blocks', '?')} of {fields.get('scheduled_arm_blocks', '?')} arm-blocks")
    return (f"Interrupted: {what}; the same command measures the run again, keeping this attempt's files in "
            "unfinished-<n>/")


def no_blocks_text(summary: Mapping[str, Any], blocks_df: pd.DataFrame) -> str:
    """What a section drawn from the blocks says when there are none: that none completed, for an interrupted run
    without blocks, else that none were recorded."""
    if blocks_df.empty and summary.get("interrupted"):
        return "no block completed: the run was interrupted before its first arm-block ended"
    return "no blocks recorded"


FULL_LOAD_METRIC = "steady_output_tokens_per_s"


def full_load_verdict_line(summary: Mapping[str, Any]) -> str | None:
    """"At full load (the blocks' drains left out): <sentence>" where the run compared the full-load throughput
    (:func:`full_load_sentence`), None otherwise."""
    stats = statistics_of(summary)
    if FULL_LOAD_METRIC not in stats or summary.get("headline_metric") == FULL_LOAD_METRIC:
        return None
    names = arm_names(summary)
    return (f"At full load, the blocks' drains left out ({FULL_LOAD_METRIC}): "
            f"{verdict_sentence(stats[FULL_LOAD_METRIC], names['A'], names['B'])}")


def _statistics_rows(summary: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    headline = summary.get("headline_metric")
    for metric, s in statistics_of(summary).items():
        rows.append([f"**{metric}**" if metric == headline else metric, s["direction"], f"{s['change_pct']:+.2f}%",
                     _ci_text(s), _fmt(s.get("wilcoxon_p")), _fmt(s.get("mde_pct"), ".2f") + "%", str(s["n_blocks"]),
                     s["verdict"]])
    return rows


STAT_HEADERS = ["metric", "better", "B vs A", "CI", "Wilcoxon p", "MDE", "blocks", "verdict"]


def declined_arms(summary: Mapping[str, Any]) -> list[str]:
    """Arms whose planner declined every step as "predicted no gain", the plan gate's skips included (their
    did_nothing guard's ``details["declined_all"]``): they verified the whole drafted block on every step."""
    arms = []
    for g in summary.get("guards") or []:
        name = str(g.get("name", ""))
        if name.startswith("did_nothing[") and name.endswith("]") and (g.get("details") or {}).get("declined_all"):
            arms.append(name[len("did_nothing["):-1])
    return arms


def _arm_engines(summary: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each arm's engine config as the summary records it ({} where it records none)."""
    return {a: (d.get("engine") or {}) for a, d in (summary.get("arms") or {}).items() if isinstance(d, dict)}


def draft_free_arms(summary: Mapping[str, Any]) -> list[str]:
    """Arms that ran every decode step draft-free (their did_nothing guard's ``details["draft_free_all"]``)."""
    return [str(g["name"])[len("did_nothing["):-1] for g in summary.get("guards") or []
            if str(g.get("name", "")).startswith("did_nothing[") and (g.get("details") or {}).get("draft_free_all")]


def _declined_why(summary: Mapping[str, Any], arms: list[str]) -> str:
    """The reasons the declining ``arms`` gave, most frequent first (planner predicted no gain where the summary
    records none)."""
    from dspark.bench.guards import DECLINE_SHORT_WORDS, plan_reasons

    counters = summary.get("counters") or {}
    reasons: dict[str, int] = {}
    for arm in arms:
        for reason, steps in plan_reasons(counters.get(arm) or {}).items():
            if reason != "trimmed":
                reasons[reason] = reasons.get(reason, 0) + steps
    ordered = sorted(reasons, key=lambda r: -reasons[r])
    return ", ".join(DECLINE_SHORT_WORDS.get(r, r) for r in ordered) or "planner predicted no gain"


def verdict_note(summary: dict[str, Any]) -> str | None:
    """What the verdict means when a trimming arm declined every step, or a speculative arm ran every step
    draft-free (None otherwise): the statistics stand, but they say nothing about trimming or drafting."""
    free = draft_free_arms(summary)
    if free:
        who = " and ".join(free)
        return (f"{who} ran every step draft-free (drafting measured slower at its batch sizes): {who} did the work "
                "of target-only decoding; the measured difference is not an effect of speculation")
    declined = declined_arms(summary)
    if not declined:
        return None
    engines = _arm_engines(summary)
    spec = engines.get(declined[0], {}).get("spec")
    others = [a for a in engines if a not in declined]
    who = " and ".join(declined)
    head = f"{who} declined every step ({_declined_why(summary, declined)})"
    if engines and all(engines[o].get("verify") == "full" and engines[o].get("spec") == spec for o in others):
        both = " and ".join(engines)
        return f"{head}: {both} ran the same work; the measured difference is noise, not an effect of trimming"
    return (f"{head}: {who} verified the whole drafted block on every step; the measured difference is not an "
            "effect of trimming")


def planner_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per arm whose engine reported planner decisions (counters ``sched/plan_reason.<reason>``): arm, label,
    reasons ({reason: steps}, most first), decisions (their sum), trimmed_steps, trim_ratio."""
    from dspark.bench.guards import plan_reasons

    counters = summary.get("counters") or {}
    labels = arm_labels(summary, counters)
    rows = []
    for arm, c in counters.items():
        reasons = plan_reasons(c or {})
        if reasons:
            rows.append({"arm": arm, "label": labels[arm], "reasons": reasons, "decisions": sum(reasons.values()),
                         "trimmed_steps": c.get("trimmed_steps"), "trim_ratio": c.get("trim_ratio")})
    return rows


def planner_lines(summary: dict[str, Any], hints: bool = True) -> list[str]:
    """What each arm's planner decided and why, as plain lines ("Planner B (ragged): ..."), then (``hints``)
    what each reason means. Empty when no arm reported planner decisions."""
    from dspark.bench.guards import DECLINE_HINTS

    rows = planner_rows(summary)
    lines = []
    for r in rows:
        decided = ", ".join(f"{k} {n:,}" for k, n in r["reasons"].items())
        name = r["arm"] if r["label"] == r["arm"] else f"{r['arm']} ({r['label']})"
        lines.append(f"Planner {name}: {r['decisions']:,} decisions: {decided}; trimmed steps "
                     f"{_fmt(r['trimmed_steps'], ',.0f')}, trim_ratio {_fmt(r['trim_ratio'], '.3f')}")
    if hints:
        seen = dict.fromkeys(k for r in rows for k in r["reasons"] if k in DECLINE_HINTS)
        lines += [f"  {k}: {DECLINE_HINTS[k]}" for k in seen]
    return lines


def truncation_line(summary: dict[str, Any], requests_df: pd.DataFrame | None = None) -> str | None:
    """"Truncated outputs: A 12/64 (12 at max_tokens), B ..." from ``summary["truncated"]`` and
    ``summary["finish_reasons"]`` (else from ``requests_df``'s finish_reason column); None when the run
    recorded no finish reasons."""
    from dspark.bench.metrics import finish_reason_counts, truncation_counts

    reasons, truncated = summary.get("finish_reasons"), summary.get("truncated")
    if not reasons or truncated is None:
        if requests_df is None:
            return None
        engines = _arm_engines(summary)
        reasons = finish_reason_counts(requests_df)
        truncated = truncation_counts(requests_df, {a: e.get("max_model_len") for a, e in engines.items()})
        if not reasons:
            return None
    parts = []
    for arm in reasons:
        cut = {k: int(v) for k, v in (truncated.get(arm) or {}).items() if v}
        why = ", ".join(f"{n} at {k}" for k, n in cut.items())
        parts.append(f"{arm} {sum(cut.values())}/{sum(reasons[arm].values())}" + (f" ({why})" if why else ""))
    return "Truncated outputs (finish_reason length): " + ", ".join(parts)


def render_console_table(summary: dict[str, Any], console: Console | None = None) -> Table:
    """Print the verdict table of one experiment with rich and return it; below it, the verdict as a sentence,
    what the statistics cover when the run was interrupted, what it means when an arm declined every step, what
    each planner decided and why, and truncated outputs."""
    names = arm_names(summary)
    table = Table(title=f"A/B {summary.get('experiment', '')}: {names['B']} vs {names['A']}".strip())
    for header in STAT_HEADERS:
        table.add_column(header, justify="left" if header in ("metric", "verdict") else "right",
                         no_wrap=header in ("metric", "CI"))
    for row in _statistics_rows(summary):
        verdict = row[-1]
        style = {"faster": "green", "slower": "red", "inconclusive": "yellow"}.get(verdict, "")
        table.add_row(*[c.replace("**", "") for c in row[:-1]], f"[{style}]{verdict}[/{style}]" if style else verdict)
    guards = summary.get("guards", [])
    failed = [g["name"] for g in guards if not g["passed"]]
    table.caption = (f"guards: {len(guards) - len(failed)}/{len(guards)} passed"
                     + (f" -- FAILED: {', '.join(failed)}" if failed else ""))
    console = console or Console()
    console.print(table)
    console.print(f"{verdict_line(summary)}.", highlight=False, markup=False)
    interrupted = interrupted_line(summary)
    if interrupted:
        console.print(f"{interrupted}.", style="bold", highlight=False, markup=False)
    note = summary.get("verdict_note") or verdict_note(summary)
    if note:
        console.print(f"[bold]Verdict: {note}.[/bold]", highlight=False)
    for line in planner_lines(summary):
        console.print(line, highlight=False, markup=False)
    truncated = truncation_line(summary)
    if truncated:
        console.print(truncated, highlight=False, markup=False)
    return table


# ---- the arms side by side -------------------------------------------------------------------
def block_interval(values: Sequence[float], level: float = INTERVAL_LEVEL) -> tuple[float, float | None, float | None]:
    """(centre, low, high) of per-block values: where every value is positive, the geometric mean over blocks
    and its ``level`` t-interval computed on the logs (n - 1 degrees of freedom; the same multiplicative view
    as the B vs A statistics, and never below 0); otherwise the mean and its t-interval, cut at 0. No
    interval from one block; NaN values are left out."""
    x = pd.Series(values, dtype=float).dropna().to_numpy()
    if x.size == 0:
        return float("nan"), None, None
    positive = bool((x > 0).all())
    y = np.log(x) if positive else x
    centre = float(y.mean())
    if x.size < 2 or float(np.ptp(y)) == 0:
        low = high = None if x.size < 2 else centre
    else:
        low, high = (float(v) for v in sps.t.interval(level, y.size - 1, loc=centre, scale=float(sps.sem(y))))
    if positive:
        return math.exp(centre), *(None if v is None else math.exp(v) for v in (low, high))
    return centre, None if low is None else max(low, 0.0), high


def paired_change_pct(blocks_df: pd.DataFrame, column: str) -> float | None:
    """B vs A on ``column`` as a % change: the geometric mean of B/A over the blocks where both arms have a
    positive value (the statistics' estimator); None without such a block."""
    if not {"block", "arm", column} <= set(blocks_df.columns):
        return None
    wide = blocks_df.pivot_table(index="block", columns="arm", values=column, aggfunc="first")
    if not {"A", "B"} <= set(wide.columns):
        return None
    pairs = wide[["A", "B"]].apply(pd.to_numeric, errors="coerce")
    pairs = pairs[(pairs > 0).all(axis=1)]
    if pairs.empty:
        return None
    return 100.0 * math.expm1(float(np.log(pairs["B"] / pairs["A"]).mean()))


def _duration_unit(seconds: float) -> tuple[float, str]:
    return (1.0, "s") if abs(seconds) >= 1 else (1e3, "ms")


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _cell(centre: float, low: float | None, high: float | None, kind: str) -> str:
    if not math.isfinite(centre):
        return "n/a"
    if kind == "share":
        return f"{centre:.1%}" + ("" if low is None or high is None else f" ({low:.1%} .. {high:.1%})")
    scale, unit = _duration_unit(centre) if kind == "duration" else (1.0, "")
    text = _number(centre * scale) + (f" {unit}" if unit else "")
    if low is None or high is None:
        return text
    return f"{text} ({_number(low * scale)} .. {_number(high * scale)})"


def arm_results(summary: Mapping[str, Any], blocks_df: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of the per-arm results table: throughput, then TTFT, TPOT, ITL, E2E and queue wait at p50 / p90 /
    p99, each with {arm: (mean over blocks, low, high)} and B vs A (:func:`paired_change_pct`). Rows the blocks
    have no value for are left out (queue wait: runs that did not record scheduled arrivals)."""
    if "arm" not in blocks_df:
        return []
    arms = [a for a in ("A", "B") if a in set(blocks_df["arm"])]
    specs = list(THROUGHPUT_ROWS)
    specs += list(GOODPUT_ROWS)
    specs += [(f"{prefix}_p{q}", f"{name} p{q}", "duration") for prefix, name in LATENCY_ROWS for q in PERCENTILES]
    rows = []
    for column, name, kind in specs:
        if column not in blocks_df:
            continue
        values = {arm: block_interval(pd.to_numeric(blocks_df.loc[blocks_df["arm"] == arm, column], errors="coerce"))
                  for arm in arms}
        if not any(math.isfinite(v[0]) for v in values.values()):
            continue
        rows.append({"column": column, "name": name, "kind": kind, "arms": values,
                     "change_pct": paired_change_pct(blocks_df, column)})
    return rows


def results_section(summary: Mapping[str, Any], blocks_df: pd.DataFrame) -> list[str]:
    """"Results per arm" as markdown lines."""
    rows = arm_results(summary, blocks_df)
    lines = ["## Results per arm", ""]
    if not rows:
        return lines + [f"{no_blocks_text(summary, blocks_df).capitalize()}.", ""]
    arms = list(rows[0]["arms"])
    names = arm_names(summary, arms)
    table = [[r["name"], *[_cell(*r["arms"][a], r["kind"]) for a in arms],
              "n/a" if r["change_pct"] is None else f"{r['change_pct']:+.1f}%"] for r in rows]
    n_blocks = blocks_df.groupby("arm")["block"].nunique() if "block" in blocks_df else None
    counts = ", ".join(f"{names[a]} {int(n_blocks[a])}" for a in arms) if n_blocks is not None else "?"
    lines.append(_markdown(["metric", *[names[a] for a in arms], "B vs A"], table))
    lines += ["", f"Each cell: the geometric mean over the arm's blocks ({counts}) of the block's value, with its "
              f"{INTERVAL_LEVEL:.0%} t-interval over blocks in brackets (none from one block). Percentiles are taken "
              "within a block over its requests (ITL over every gap between two chunks of a request). TTFT and E2E "
              "count from the request's submission to the engine; queue wait is the time from its scheduled arrival "
              "to its submission (closed loop: waiting for a free concurrency slot). B vs A: the geometric mean of "
              "the paired per-block ratios." + full_load_sentence(blocks_df) + sla_sentence(summary), ""]
    return lines


def full_load_sentence(blocks_df: pd.DataFrame) -> str:
    """" Output tokens/s at full load counts ..." for blocks that have the full-load throughput."""
    if FULL_LOAD_METRIC not in blocks_df:
        return ""
    return (" Output tokens/s at full load counts only the span in which the load kept every request it allows in "
            "flight (closed loop: from the moment the concurrency was reached to the first finish with no request "
            "left to send; Poisson: from the first arrival to the last), leaving out the block's drain, when the "
            "engine finishes its last requests at ever smaller batches: what a service under that load sustains. "
            "Output tokens/s counts the whole block, drain included.")


def sla_sentence(summary: Mapping[str, Any]) -> str:
    """" Goodput counts the requests with TTFT <= x ms and TPOT <= y ms ..." for a run with a service level."""
    sla = summary.get("sla") or {}
    limits = [f"{name} <= {sla[key]:g} ms" for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"))
              if sla.get(key) is not None]
    if not limits:
        return ""
    return (f" Goodput counts the requests with {' and '.join(limits)} (the service level, load.sla_*): their "
            "output tokens and their number per second of the block.")


def flat_settings(description: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """An arm description (``summary["arms"][arm]``) as {"engine.verify": "ragged", ...}, nested mappings
    joined with dots; the label is left out (it names the arm)."""
    out: dict[str, Any] = {}
    for key, value in description.items():
        if not prefix and key == "label":
            continue
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out |= flat_settings(value, f"{name}.")
        else:
            out[name] = value
    return out


def _setting_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


MISSING = "-"


def settings_table(summary: Mapping[str, Any], only_differing: bool = True) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the arms' settings, one row per setting ("-" where an arm does not record it); with
    ``only_differing`` the settings whose values differ between the arms."""
    described = {a: d for a, d in (summary.get("arms") or {}).items() if isinstance(d, Mapping)}
    names = arm_names(summary, described)
    flat = {arm: flat_settings(d) for arm, d in described.items()}
    keys = sorted({k for f in flat.values() for k in f})
    rows = []
    for key in keys:
        values = [_setting_text(flat[a][key]) if key in flat[a] else MISSING for a in flat]
        if not only_differing or len(set(values)) > 1:
            rows.append([key, *values])
    return ["setting", *[names[a] for a in flat]], rows


def settings_section(summary: Mapping[str, Any]) -> list[str]:
    lines = ["## Settings that differ between arms", ""]
    if not summary.get("arms"):
        return lines + ["No arm descriptions recorded.", ""]
    headers, rows = settings_table(summary)
    if rows:
        lines.append(_markdown(headers, rows))
    else:
        lines.append("None: the arms ran the same settings (their labels aside).")
    return lines + ["", f"Every setting of both arms: [{APPENDIX}]({APPENDIX}#arm-settings).", ""]


# ---- the appendix ------------------------------------------------------------------------------
def _histogram_bucket(name: str, prefix: str) -> float:
    try:
        return float(name[len(prefix):])
    except ValueError:
        return math.inf


def appendix_text(summary: Mapping[str, Any]) -> str:
    """``report_appendix.md``: every arm setting, every engine counter (histogram counters as their own
    tables) and the node fingerprint."""
    lines = [f"# Appendix to the A/B report: {summary.get('experiment', 'experiment')}", "",
             "The long tables behind [report.md](report.md).", "", "## Arm settings", ""]
    if summary.get("arms"):
        headers, rows = settings_table(summary, only_differing=False)
        lines.append(_markdown(headers, rows) if rows else "No settings recorded.")
    else:
        lines.append("No arm descriptions recorded.")
    counters = summary.get("counters") or {}
    names = arm_names(summary, counters)
    lines += ["", "## Engine counters", ""]
    histogram_keys = {k for c in counters.values() for k in c if k.startswith(tuple(HISTOGRAMS))}
    plain = sorted({k for c in counters.values() for k in c} - histogram_keys)
    if plain:
        lines.append(_markdown(["counter", *[names[a] for a in counters]],
                               [[n, *[_fmt(counters[a].get(n)) for a in counters]] for n in plain]))
    else:
        lines.append("No engine counters recorded.")
    for prefix, (title, what) in HISTOGRAMS.items():
        keys = sorted((k for k in histogram_keys if k.startswith(prefix)), key=lambda k: _histogram_bucket(k, prefix))
        if not keys:
            continue
        lines += ["", f"## {title} histogram", "", f"Steps per bucket ({what}; counters `{prefix}<bucket>`).", "",
                  _markdown(["bucket", *[names[a] for a in counters]],
                            [[k[len(prefix):], *[_fmt(counters[a].get(k), ",.0f") if counters[a].get(k) is not None
                                                 else "0" for a in counters]] for k in keys])]
    fingerprint = summary.get("fingerprint")
    lines += ["", "## Node fingerprint", ""]
    lines.append("```json\n" + json.dumps(fingerprint, indent=2, sort_keys=True, default=str) + "\n```"
                 if fingerprint else "No fingerprint recorded: this result cannot be tied to a node or commit.")
    return "\n".join(lines) + "\n"


def fingerprint_line(fingerprint: Mapping[str, Any] | None) -> str:
    """The node fingerprint in one line: host, device, git commit, config hash."""
    if not fingerprint:
        return "No fingerprint recorded: this result cannot be tied to a node or commit."
    git = fingerprint.get("git") or {}
    parts = [f"host {fingerprint.get('hostname', '?')}",
             f"device {fingerprint.get('device_name') or fingerprint.get('device', '?')}"]
    if fingerprint.get("cpu_model"):
        parts.append(f"CPU {fingerprint['cpu_model']}")
    if git.get("sha"):
        parts.append(f"git {str(git['sha'])[:12]}" + (" (dirty)" if git.get("dirty") else ""))
    if fingerprint.get("config_hash"):
        parts.append(f"config hash {str(fingerprint['config_hash'])[:12]}")
    return ", ".join(parts) + f"; the full fingerprint is in [{APPENDIX}]({APPENDIX}#node-fingerprint)."


# ---- where the time went ---------------------------------------------------------------------
COUNTER = "counter/"
EAGER_REASON = "counter/eager_reason/"
BREAKDOWN_HEADERS = ["arm", "decode steps", "device-resident", "eager steps (by reason)", "prefill device / eager",
                     "host ms/step", "device idle", "mean batch", "graphs captured (timed)", "first / median block"]


def _column(group: pd.DataFrame, name: str) -> pd.Series | None:
    """The numeric values of ``counter/<name>`` in ``group`` (NaN where absent), or None without the column."""
    column = COUNTER + name
    if column not in group:
        return None
    return pd.to_numeric(group[column], errors="coerce")


def _finite(values: pd.Series | None) -> pd.Series | None:
    if values is None:
        return None
    values = values[np.isfinite(values.to_numpy(dtype=float))]
    return values if len(values) else None


def _weighted_mean(values: pd.Series | None, weights: pd.Series | None) -> float | None:
    """Mean of ``values`` over the blocks that have them, weighted by ``weights`` (decode steps) when all of
    those blocks have a positive weight, else plain."""
    values = _finite(values)
    if values is None:
        return None
    if weights is not None:
        w = weights.reindex(values.index)
        if np.isfinite(w.to_numpy(dtype=float)).all() and (w > 0).all():
            return float((values * w).sum() / w.sum())
    return float(values.mean())


def _sum(values: pd.Series | None) -> float | None:
    values = _finite(values)
    return None if values is None else float(values.sum())


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)


def _median(values: pd.Series | None) -> float | None:
    values = _finite(values)
    return None if values is None else float(values.median())


def time_breakdown(summary: dict[str, Any], blocks_df: pd.DataFrame) -> list[dict[str, Any]]:
    """Per arm (in ``summary["arms"]`` order, then the blocks' order): where its decode steps ran and what
    they cost, summed or averaged over its blocks. Values are None where the run recorded no such counter.

    Keys: arm, label, blocks, decode_steps (sum), device_resident_share (weighted by decode steps),
    eager_steps (sum), eager_reasons ({why: steps}, only reasons that occurred, most first),
    prefill_graph_replays / prefill_eager_steps (sums), host_ms_per_step (median over blocks),
    device_idle_fraction (median over the blocks that measured it), mean_running_batch (weighted by
    decode steps), graphs_captured_timed (sum; else from timing_health), kv_pool_tokens (max),
    first_block_vs_median (timing_health's, else the headline metric's first block over its median).
    """
    if "arm" not in blocks_df:
        return []
    health = summary.get("timing_health") or {}
    headline = summary.get("headline_metric")
    order = [a for a in (summary.get("arms") or {}) if a in set(blocks_df["arm"])]
    order += [a for a in dict.fromkeys(blocks_df["arm"]) if a not in order]
    labels = arm_labels(summary, order)
    captured_health: dict[str, float] = {}
    for item in health.get("captured_in_timed_blocks") or []:
        captured_health[item.get("arm")] = captured_health.get(item.get("arm"), 0) + float(item.get("graphs") or 0)
    ratios = health.get("first_block_vs_median") or {}
    rows = []
    for arm in order:
        group = blocks_df[blocks_df["arm"] == arm]
        if "block" in group:
            group = group.sort_values("block")
        steps = _column(group, "decode_steps")
        reasons = {}
        for column in (c for c in blocks_df.columns if str(c).startswith(EAGER_REASON)):
            total = _sum(pd.to_numeric(group[column], errors="coerce"))
            if total:
                reasons[str(column)[len(EAGER_REASON):]] = total
        captured = _sum(_column(group, "graphs_captured"))
        if captured is None and health:
            captured = captured_health.get(arm, 0.0) if "captured_in_timed_blocks" in health else None
        ratio = ratios.get(arm)
        if ratio is None and headline in group and len(group) > 0:
            values = pd.to_numeric(group[headline], errors="coerce")
            median = float(values.median())
            first = float(values.iloc[0])
            ratio = first / median if np.isfinite(first) and np.isfinite(median) and median > 0 else None
        kv = _finite(_column(group, "kv_pool_tokens"))
        rows.append({
            "arm": arm, "label": labels[arm], "blocks": len(group),
            "decode_steps": _sum(steps),
            "device_resident_share": _weighted_mean(_column(group, "device_resident_share"), steps),
            "eager_steps": _sum(_column(group, "eager_steps")),
            "eager_reasons": dict(sorted(reasons.items(), key=lambda kv_: (-kv_[1], kv_[0]))),
            # Prefill forwards on the device-resident path: graph replays, or (CPU) the same forward uncaptured.
            "prefill_graph_replays": _add(_sum(_column(group, "prefill_graph_replays")),
                                          _sum(_column(group, "prefill_uncaptured"))),
            "prefill_eager_steps": _sum(_column(group, "prefill_eager_steps")),
            "host_ms_per_step": _median(_column(group, "host_ms_per_graph_step_median")),
            "device_idle_fraction": _median(_column(group, "device_idle_fraction")),
            "mean_running_batch": _weighted_mean(_column(group, "mean_running_batch"), steps),
            "graphs_captured_timed": captured,
            "kv_pool_tokens": None if kv is None else float(kv.max()),
            "first_block_vs_median": None if ratio is None else float(ratio),
            # Host ms per step() call by phase (dspark.stats.HOST_PHASES), median over blocks; absent phases left out.
            "host_phases": {k: v for k in HOST_PHASES
                            if (v := _median(_column(group, f"host/{k}_ms_per_step"))) is not None},
            # Device ms per step by (step mode, batch bucket rows), median over blocks, from the engine's
            # device/<mode>_b<rows>_step_ms_median counters (device-resident steps timed with CUDA events).
            "device_step_ms": _device_step_ms(group),
        })
    return rows


_DEVICE_STEP = re.compile(r"^device/(?P<mode>[a-z_]+)_b(?P<rows>\d+)_step_ms_median$")


def _device_step_ms(group: pd.DataFrame) -> dict[tuple[str, int], float]:
    out = {}
    for column in group.columns:
        match = _DEVICE_STEP.match(str(column)[len(COUNTER):]) if str(column).startswith(COUNTER) else None
        if match and (v := _median(pd.to_numeric(group[column], errors="coerce"))) is not None:
            out[(match["mode"], int(match["rows"]))] = v
    return out


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _share(value: float | None, spec: str = ".0%") -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def _eager_cell(row: dict[str, Any], limit: int = 3) -> str:
    if row["eager_steps"] is None and not row["eager_reasons"]:
        return "-"
    total = row["eager_steps"] if row["eager_steps"] is not None else sum(row["eager_reasons"].values())
    if not row["eager_reasons"]:
        return _count(total)
    items = list(row["eager_reasons"].items())
    parts = [f"{why} {n:,.0f}" for why, n in items[:limit]]
    if len(items) > limit:
        parts.append(f"+{len(items) - limit} more {sum(n for _, n in items[limit:]):,.0f}")
    return f"{_count(total)}: {', '.join(parts)}"


def where_time_went(summary: dict[str, Any], blocks_df: pd.DataFrame) -> list[str]:
    """The report's "Where the time went" section as markdown lines: one row per arm, then the timing flags."""
    rows = time_breakdown(summary, blocks_df)
    lines = ["## Where the time went", ""]
    if not rows:
        return lines + [f"{no_blocks_text(summary, blocks_df).capitalize()}.", ""]
    table = []
    for r in rows:
        prefill = ("-" if r["prefill_graph_replays"] is None and r["prefill_eager_steps"] is None
                   else f"{_count(r['prefill_graph_replays'])} / {_count(r['prefill_eager_steps'])}")
        captured = _count(r["graphs_captured_timed"])
        if r["graphs_captured_timed"]:
            captured = f"**{captured}** ⚠"
        table.append([r["label"], _count(r["decode_steps"]), _share(r["device_resident_share"]), _eager_cell(r),
                      prefill, "-" if r["host_ms_per_step"] is None else f"{r['host_ms_per_step']:.2f}",
                      _share(r["device_idle_fraction"], ".1%"),
                      "-" if r["mean_running_batch"] is None else f"{r['mean_running_batch']:.1f}", captured,
                      "-" if r["first_block_vs_median"] is None else f"{r['first_block_vs_median']:.2f}x"])
    lines.append(_markdown(BREAKDOWN_HEADERS, table))
    lines += ["", "Device-resident: share of decode steps run device-resident (CUDA graph replays, or uncaptured "
              "on a CPU). Host ms/step: host-side time per step() call without the wait for the device, median over "
              "blocks. Device idle: median over blocks. Mean batch: decoding requests per decode step. Graphs "
              "captured (timed): captures during the measured blocks, which should be 0. First / median block: the "
              f"arm's first block's {summary.get('headline_metric') or 'headline metric'} over its median block's."]
    phased = [r for r in rows if r["host_phases"]]
    if phased:
        names = [k for k in HOST_PHASES if any(k in r["host_phases"] for r in phased)]
        lines += ["", _markdown(["arm", *names, "cycle"],
                                [[r["label"],
                                  *("-" if k not in r["host_phases"] else f"{r['host_phases'][k]:.2f}" for k in names),
                                  f"{sum(r['host_phases'].values()):.2f}"] for r in phased]),
                  "", "Host ms per device-resident step() call by phase (mean per call, median over blocks): rows "
                  "(reload and page reservation), prefill (scheduling and issuing prefills), join, plan (graphs, "
                  "draft-free choice, planner), launch (issuing the step's graphs), wait (for the device, at the "
                  "commit), commit (tokens, stops, statistics, retirements), caller (the runner's work between "
                  "calls). Cycle: their sum, the mean period of a call; the device bounds it where wait > 0."]
    lines += _device_step_table(rows)
    lines += draft_ledger_lines(summary)
    kv = [f"{r['label']} {r['kv_pool_tokens']:,.0f}" for r in rows if r["kv_pool_tokens"] is not None]
    if kv:
        lines += ["", f"KV pool (tokens): {', '.join(kv)}."]
    flags = (summary.get("timing_health") or {}).get("flags") or []
    if flags:
        lines += ["", *[f"- ⚠ {flag}" for flag in flags]]
    return lines + [""]


def _device_step_table(rows: list[dict[str, Any]]) -> list[str]:
    """Device ms per step, one row per batch bucket, one column per (arm, step mode): a trimmed step beside a
    whole-block step of the same rows. Empty without device timings."""
    columns = [(r["label"], mode) for r in rows for mode in sorted({m for m, _ in r.get("device_step_ms") or {}},
                                                                    key=lambda m: (m != "full", m))]
    if not columns:
        return []
    by_label = {r["label"]: r.get("device_step_ms") or {} for r in rows}
    buckets = sorted({b for r in rows for _, b in (r.get("device_step_ms") or {})})
    table = [[str(b), *("-" if (v := by_label[label].get((mode, b))) is None else f"{v:.2f}"
                        for label, mode in columns)] for b in buckets]
    return ["", _markdown(["batch rows", *(f"{label}: {mode}" for label, mode in columns)], table),
            "", "Device ms per decode step by batch bucket (CUDA events around the step's graphs; median per block "
            "over buckets with 10 steps or more, median over blocks). In one arm, `full` steps verify the whole "
            "drafted block and `ragged` / `uniform` steps were trimmed: at the same rows a trim pays on the device "
            "only where its column is lower."]


# ---- the report ------------------------------------------------------------------------------
def _statistics_section(summary: Mapping[str, Any]) -> list[str]:
    if not statistics_of(summary):
        return ["## Statistics", "", f"None: {summary.get('verdict') or 'no statistics recorded'}.", ""]
    lines = ["## Statistics", "", _markdown(STAT_HEADERS, _statistics_rows(summary)), ""]
    for metric, s in statistics_of(summary).items():
        order = (f"order effect {_fmt(s.get('order_effect_pct'), '+.2f')}% (p={_fmt(s.get('order_effect_p'))}, "
                 f"{s['order_effect_test']})" + (" **FLAGGED**" if s.get("order_effect_flagged") else ""))
        notes = "; ".join(s.get("notes", []))
        lines.append(f"- {metric}: {s['verdict_reason']}. {order}. {notes}")
    for metric, why in (summary.get("statistics_left_out") or {}).items():
        lines.append(f"- {metric}: not compared ({why}).")
    return lines + ["", "MDE: the smallest change the blocks detect with the stated power at the measured noise "
                    "(t distribution, blocks - 1 degrees of freedom).", ""]


PLAN_GATE_FIELDS = ("planned_steps", "skipped_steps", "probe_steps", "charged_costs", "benefit_ms_estimate",
                    "cost_ms_estimate")


def plan_gate_rows(summary: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per arm with a plan gate, its per-bucket counters (``plan_gate/b<bucket>/<field>``) as rows by bucket."""
    out: dict[str, list[dict[str, Any]]] = {}
    for arm, counters in (summary.get("counters") or {}).items():
        buckets: dict[int, dict[str, Any]] = {}
        for key, value in counters.items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "plan_gate" and parts[1][:1] == "b" and parts[1][1:].isdigit() \
                    and parts[2] in PLAN_GATE_FIELDS:
                buckets.setdefault(int(parts[1][1:]), {"bucket": int(parts[1][1:])})[parts[2]] = value
        rows = [{f: row.get(f) for f in ("bucket", *PLAN_GATE_FIELDS)} for _, row in sorted(buckets.items())]
        if rows:
            out[arm] = rows
    return out


def online_calibration_rows(summary: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per arm with engine.online_calibration, per block position its offset (``online_calibration/offset.<k>``)
    and observed over predicted acceptance (``online_calibration/observed_over_predicted.<k>``) as rows."""
    out: dict[str, list[dict[str, Any]]] = {}
    for arm, counters in (summary.get("counters") or {}).items():
        positions: dict[int, dict[str, Any]] = {}
        for key, value in counters.items():
            name, _, k = key.removeprefix("online_calibration/").rpartition(".")
            if key.startswith("online_calibration/") and name in ("offset", "observed_over_predicted") and k.isdigit():
                positions.setdefault(int(k), {"position": int(k), "offset": None, "observed_over_predicted": None})[
                    name] = value
        if positions:
            out[arm] = [row for _, row in sorted(positions.items())]
    return out


# The measured choices' counters (dspark/measured_choice.py): prefix -> (usual kind, alternative kind, what it is)
MEASURED_CHOICES = {"verify_share": ("full", "share", "engine.verify_share: the whole block or the share of its cells"),
                    "draft_free": ("draft", "free", "engine.draft_free_steps: drafting or a target-only step")}


def measured_choice_rows(summary: Mapping[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Per (arm, choice prefix) with a measured choice, its per-bucket counters (``<prefix>/b<bucket>/...``) as rows:
    steps of each kind, adjacent-step comparisons, the median comparison (%) and each kind's recent rate."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for arm, counters in (summary.get("counters") or {}).items():
        for prefix, (usual, alt, _) in MEASURED_CHOICES.items():
            buckets: dict[int, dict[str, Any]] = {}
            for key, value in counters.items():
                parts = key.split("/")
                if len(parts) == 3 and parts[0] == prefix and parts[1][:1] == "b" and parts[1][1:].isdigit():
                    buckets.setdefault(int(parts[1][1:]), {"bucket": int(parts[1][1:])})[parts[2]] = value
            rows = [{"bucket": b, "usual_steps": r.get(f"{usual}_steps"), "alternative_steps": r.get(f"{alt}_steps"),
                     "pairs": r.get("pairs"), "change_pct": r.get(f"{alt}_vs_{usual}_pct"),
                     "usual_rate": r.get(f"{usual}_tok_per_ms"), "alternative_rate": r.get(f"{alt}_tok_per_ms")}
                    for b, r in sorted(buckets.items())]
            if rows:
                out[(arm, prefix)] = rows
    return out


def trimmed_price_text(health: Mapping[str, Any]) -> str:
    """The prediction-health line's part on trims: the measured time over the price the planner valued them at, on
    the steps that ran a trim and on the priced steps that kept the whole block; empty without trimmed steps."""
    trimmed, others = (health.get(f"{k}_step_ms_measured_over_price") for k in ("trimmed", "untrimmed"))
    if trimmed is None:
        return ""
    rest = (f"its {health['untrimmed_steps']} other priced steps {others:.2f}x" if others is not None
            else "it priced no other step")
    return f"; at the price it valued them at, its {health['trimmed_steps']} trimmed steps took {trimmed:.2f}x, {rest}"


def _planner_section(summary: Mapping[str, Any], paths: Mapping[str, Path]) -> list[str]:
    from dspark.bench.guards import DECLINE_HINTS

    lines = ["## Planner", ""]
    planned = planner_lines(summary, hints=False)
    lines += [f"- {line}" for line in planned] or ["No arm reported planner decisions (no trimming arm)."]
    meanings = dict.fromkeys(k for r in planner_rows(summary) for k in r["reasons"] if k in DECLINE_HINTS)
    if meanings:
        lines += ["", *[f"- `{k}`: {DECLINE_HINTS[k]}" for k in meanings]]
    for arm, t in (summary.get("cost_tables") or {}).items():
        if isinstance(t, Mapping) and t.get("path"):
            fit = f"; fit {t['fit_summary']}" if t.get("fit_summary") else ""
            fp = f", fingerprint {t['fingerprint']}" if t.get("fingerprint") else ""
            lines += ["", f"- arm {arm} priced its steps with `{t['path']}` ({t.get('how', 'how not recorded')}{fp}{fit})"]
    for arm, h in (summary.get("prediction_health") or {}).items():
        ms, service = h.get("step_ms_measured_over_predicted"), h.get("step_ms_measured_over_service_price")
        lines += ["", f"- arm {arm}, the cost table's predictions against its planned steps: tokens per step "
                  f"{h['tokens_realised_over_predicted']:.2f}x predicted, step time "
                  + (f"{ms:.2f}x predicted" if ms is not None else "not measured")
                  + (f"; at the service price it planned with, step time {service:.2f}x"
                     if service is not None else "")
                  + trimmed_price_text(h)
                  + (" **FLAGGED** (beyond +/-{:.0%}): {}".format(h["tolerance"], "; ".join(h["flags"]))
                     if h.get("flags") else " (within +/-{:.0%})".format(h["tolerance"]))]
    for arm, c in (summary.get("counters") or {}).items():
        table_headroom, service = c.get("oracle/headroom_vs_full_block"), c.get("oracle/headroom_in_service")
        if isinstance(table_headroom, (int, float)):
            lines += ["", f"- arm {arm}, the oracle bound over its full-block steps (a trim to exactly the drafts each "
                      f"request accepted, on the same acceptances): {table_headroom:+.1%} at the cost table's prices"
                      + (f"; {service:+.1%} of the steps' measured time, if each trim saved in service the "
                         "milliseconds the table says it saves" if isinstance(service, (int, float)) else "")]
    lines += trim_ledger_lines(summary)
    for arm, rows in plan_gate_rows(summary).items():
        lines += ["", f"- arm {arm}, the plan gate per batch bucket (engine.plan_gate: it plans where the benefit "
                  "estimate covers the cost estimate; a charged cost is a planner call whose host time set the "
                  "step's period):", "",
                  _markdown(["bucket", "planned", "skipped", "probes", "charged costs", "benefit ms/step",
                             "cost ms/step"],
                            [[r["bucket"], *("-" if r[f] is None else r[f] for f in PLAN_GATE_FIELDS[:4]),
                              _fmt(r["benefit_ms_estimate"]), _fmt(r["cost_ms_estimate"])] for r in rows])]
    for (arm, prefix), rows in measured_choice_rows(summary).items():
        usual, alt, what = MEASURED_CHOICES[prefix]
        lines += ["", f"- arm {arm}, the measured choice per batch bucket ({what}): its steps of each kind, the "
                  "comparisons of adjacent steps of different kinds, and their median (the choice takes the "
                  f"{alt} kind while it is above 0); each kind's recent output rate for reference (tokens/ms, "
                  "rates of different moments of the load):", "",
                  _markdown(["bucket", f"{usual} steps", f"{alt} steps", "comparisons", f"{alt} vs {usual}",
                             f"{usual} tok/ms", f"{alt} tok/ms"],
                            [[r["bucket"], _count(r["usual_steps"]), _count(r["alternative_steps"]),
                              _count(r["pairs"]), "-" if r["change_pct"] is None else f"{r['change_pct']:+.1f}%",
                              _fmt(r["usual_rate"]), _fmt(r["alternative_rate"])] for r in rows])]
    for arm, rows in online_calibration_rows(summary).items():
        c = summary["counters"][arm]
        lines += ["", f"- arm {arm}, the head's calibration corrected in service (engine.online_calibration): "
                  f"{_fmt(c.get('online_calibration/refits'))} refits over {_fmt(c.get('online_calibration/tested'))} "
                  "tested drafts; per block position the logit offset it ended with and the tested drafts' observed "
                  "over predicted acceptance (1: calibrated as the steps saw it):", "",
                  _markdown(["position", "offset", "observed / predicted"],
                            [[r["position"], _fmt(r["offset"]), _fmt(r["observed_over_predicted"])] for r in rows])]
    if "cost_table_plot" in paths:
        lines += ["", "The cost table the planner priced each step with (predicted step time against the tokens "
                  "a step sends to the target, per batch size): trimming pays only where the curve rises.", "",
                  f"![cost table]({paths['cost_table_plot'].name})"]
    return lines + [""]


LEDGER_NOTE = "engine counters over the timed blocks; a row-step is one request in one decode step"


def trim_ledger_lines(summary: Mapping[str, Any]) -> list[str]:
    """The trimming arm's ledger against the whole-block arm (:mod:`dspark.bench.trim_ledger`) as markdown lines
    of the Planner section: its table and a sentence with the A/B's measured changes; [] without such a pair."""
    ledger = trim_ledger(summary)
    if ledger is None:
        return []
    names = arm_names(summary, (ledger.full.arm, ledger.trim.arm))
    headers, rows = ledger_table(ledger, names)
    return ["", f"- What {names[ledger.trim.arm]}'s trims bought and cost against {names[ledger.full.arm]} "
            f"({LEDGER_NOTE}):", "", _markdown(headers, rows), "",
            ledger_sentence(ledger, names, measured_changes(summary, ledger.trim.arm, FULL_LOAD_METRIC))]


def draft_ledger_lines(summary: Mapping[str, Any]) -> list[str]:
    """The drafting arm's ledger against the target-only arm (:mod:`dspark.bench.draft_ledger`) as markdown lines
    of "Where the time went"; [] without such a pair."""
    ledger = draft_ledger(summary)
    if ledger is None:
        return []
    names = arm_names(summary, (ledger.target_only.arm, ledger.drafting.arm))
    headers, rows = draft_ledger_table(ledger, names)
    return ["", f"What drafting bought and cost: {names[ledger.drafting.arm]} against {names[ledger.target_only.arm]} "
            f"({LEDGER_NOTE}):", "", _markdown(headers, rows), "",
            draft_ledger_sentence(ledger, names, measured_changes(summary, ledger.drafting.arm, FULL_LOAD_METRIC))]


def _key_counters_section(summary: Mapping[str, Any]) -> list[str]:
    counters = summary.get("counters") or {}
    lines = ["## Engine counters", ""]
    if not counters:
        return lines + ["No engine counters recorded.", ""]
    names = arm_names(summary, counters)
    shown = [n for n in KEY_COUNTERS if any(n in c for c in counters.values())]
    if shown:
        lines += [_markdown(["counter", *[names[a] for a in counters]],
                            [[n, *[_fmt(counters[a].get(n)) for a in counters]] for n in shown]), ""]
    total = max(len(c) for c in counters.values())
    return lines + [f"All {total} counters per arm, with the token-bucket and verify-length histograms: "
                    f"[{APPENDIX}]({APPENDIX}#engine-counters).", ""]


def per_block_plot_blocker(summary: Mapping[str, Any], blocks_df: pd.DataFrame) -> str | None:
    """Why the per-block plot of the headline metric cannot be drawn from ``blocks_df``, None when it can."""
    headline = summary["headline_metric"]
    if blocks_df.empty:
        return no_blocks_text(summary, blocks_df)
    if not {"block", "arm", "first_arm", headline} <= set(blocks_df.columns):
        return f"blocks table lacks block/arm/first_arm/{headline}"
    arms = set(blocks_df["arm"])
    if not {"A", "B"} <= arms:
        return f"blocks of arm {', '.join(sorted(map(str, arms)))} only: no block ran in both arms"
    return None


def write_report(out_dir: str | Path, summary: dict[str, Any], blocks_df: pd.DataFrame,
                 requests_df: pd.DataFrame | None) -> dict[str, Path]:
    """Write ``report.md``, ``report_appendix.md`` and the PNG plots under ``out_dir``; return their paths by
    name ("report", "appendix", and "<name>_plot" for each plot drawn). The summary must have statistics on its
    headline metric unless it is marked interrupted (:func:`require_headline_statistics`); ``blocks_df`` is empty
    for a run interrupted before an arm-block completed."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    headline = _require(summary, "headline_metric")
    require_headline_statistics(summary)
    labels = arm_names(summary)
    paths: dict[str, Path] = {}
    skipped: list[str] = []

    per_block_blocker = per_block_plot_blocker(summary, blocks_df)
    if per_block_blocker is None:
        paths["per_block_plot"] = out / "per_block.png"
        report_plots.plot_per_block(blocks_df, headline, labels, paths["per_block_plot"])
    else:
        skipped.append(f"per-block plot: {per_block_blocker}")
    samples = report_plots.latency_samples(requests_df) if requests_df is not None and "arm" in requests_df else {}
    if samples:
        paths["latency_cdf_plot"] = out / "latency_cdf.png"
        report_plots.plot_latency_cdfs(samples, labels, paths["latency_cdf_plot"])
    else:
        skipped.append("latency CDFs: no per-request latencies (requests.parquet)")
    if "per_position_acceptance" in blocks_df and any(len(c) for c in blocks_df["per_position_acceptance"]):
        paths["acceptance_plot"] = out / "acceptance.png"
        report_plots.plot_acceptance(blocks_df, labels, paths["acceptance_plot"])
    elif blocks_df.empty:
        skipped.append(f"per-position acceptance: {no_blocks_text(summary, blocks_df)}")
    else:
        skipped.append("per-position acceptance: no acceptance recorded (target-only arms?)")
    cost_plot, cost_why = report_plots.plot_cost_tables(summary, out / "cost_table.png")
    if cost_plot is not None:
        paths["cost_table_plot"] = cost_plot
    else:
        skipped.append(f"cost table: {cost_why}")

    lines = [f"# A/B report: {summary.get('experiment', 'experiment')}", "", f"**{verdict_line(summary)}.**", ""]
    interrupted = interrupted_line(summary)
    if interrupted:
        lines += [f"**{interrupted}.**", ""]
    full_load = full_load_verdict_line(summary)
    if full_load:
        lines += [f"{full_load}.", ""]
    note = summary.get("verdict_note") or verdict_note(summary)
    if note:
        lines += [f"**{note}.**", ""]
    truncated = truncation_line(summary, requests_df)
    if truncated:
        lines += [f"{truncated}.", ""]
    flags = (summary.get("timing_health") or {}).get("flags") or []
    if flags:
        lines += [f"⚠ {len(flags)} timing warning(s): see \"Where the time went\".", ""]
    lines += results_section(summary, blocks_df)
    lines += settings_section(summary)
    lines += ["## Latency CDFs", ""]
    if "latency_cdf_plot" in paths:
        lines += [f"![latency CDFs]({paths['latency_cdf_plot'].name})", ""]
    else:
        lines += ["Not drawn: no per-request latencies (requests.parquet).", ""]
    lines += _statistics_section(summary)
    lines += ["## Guards", ""]
    guards = summary.get("guards")
    if guards:
        lines.append(_markdown(["guard", "passed", "message"],
                               [[g["name"], "yes" if g["passed"] else "**NO**", g["message"]] for g in guards]))
    else:
        lines.append("No guards recorded: the speed numbers are unchecked.")
    lines += ["", *_planner_section(summary, paths)]
    lines += where_time_went(summary, blocks_df)
    lines += _key_counters_section(summary)
    lines += ["## Plots", ""]
    lines += [f"![{name}]({p.name})" for name, p in paths.items()
              if name not in ("cost_table_plot", "latency_cdf_plot")]
    lines += [f"- not drawn: {s}" for s in skipped]
    lines += ["", "## Node fingerprint", "", fingerprint_line(summary.get("fingerprint"))]
    if summary.get("wandb"):
        w = summary["wandb"]
        lines += ["", "## W&B", "", f"mode {w.get('mode')}, runs {w.get('run_dirs')}, "
                  f"{len(w.get('failures', []))} failure(s): {w.get('failures', [])}"]
    lines += ["", f"Appendix (every arm setting, every engine counter, histograms, the node fingerprint): "
              f"[{APPENDIX}]({APPENDIX})."]
    paths["appendix"] = out / APPENDIX
    paths["appendix"].write_text(appendix_text(summary))
    paths["report"] = out / "report.md"
    paths["report"].write_text("\n".join(lines) + "\n")
    return paths


# ---- sweeps ------------------------------------------------------------------------------------
def job_overrides(summary: Mapping[str, Any]) -> list[str]:
    """A job's command-line overrides (``key=value``, in their order), from its ``sweep_params``."""
    return [f"{k}={v}" for k, v in (summary.get("sweep_params") or {}).items()]


def job_labels(summaries: Sequence[Mapping[str, Any]], paths: Sequence[Path]) -> list[str]:
    """Each job's short name in a sweep table, the name its folder has after the job number
    (:mod:`runners.sweep_dirs`): the ``sweep_job`` its summary records, or for a summary without one,
    the same kind of name from its overrides: those that differ between ``summaries`` (every override
    when none differs). A summary without overrides is named by its experiment; jobs that would share
    a name, or whose overrides Hydra cannot parse, are named by their folders."""
    from runners.sweep_dirs import job_name, varying_keys  # the naming of the sweep's job folders

    unrecorded = [(i, job_overrides(s)) for i, s in enumerate(summaries)
                  if not s.get("sweep_job") and s.get("sweep_params")]
    try:
        varying = varying_keys([overrides for _, overrides in unrecorded])
        from_overrides = {i: job_name(overrides, swept=varying) for i, overrides in unrecorded}
    except Exception:  # noqa: BLE001  (overrides written by hand or another tool: the folders name the jobs)
        from_overrides = {i: paths[i].parent.name for i, _ in unrecorded}
    labels = []
    for i, (summary, path) in enumerate(zip(summaries, paths)):
        if summary.get("sweep_job"):
            labels.append(str(summary["sweep_job"]))
        elif i in from_overrides:
            labels.append(from_overrides[i])
        else:
            labels.append(summary.get("experiment") or path.parent.name)
    shared = {label for label in labels if labels.count(label) > 1}
    return [path.parent.name if label in shared else label for label, path in zip(labels, paths)]


KEPT_RUN_PREFIXES = ("unfinished", "previous")  # <run folder>/<prefix>-<n>/: an earlier attempt's files, kept
KEPT_RUN_FOLDER = re.compile(rf"({'|'.join(KEPT_RUN_PREFIXES)})-\d+")


def sweep_summary_paths(sweep_dir: str | Path) -> list[Path]:
    """The ``summary.json`` of each job under ``sweep_dir``, sorted. Those below a folder named ``unfinished-<n>``
    or ``previous-<n>`` are left out: there the A/B runner keeps an earlier attempt of the run it measures again in
    the folder above, unfinished or replaced (``runners.ab.keep_earlier_run``), which is not a job of the
    sweep."""
    root = Path(sweep_dir)
    return sorted(p for p in root.rglob("summary.json")
                  if not any(KEPT_RUN_FOLDER.fullmatch(part) for part in p.relative_to(root).parts[:-1]))


# compare_runs' columns from each metric's statistics.
COMPARED_STATISTICS = ("direction", "n_blocks", "change_pct", "ci_low_pct", "ci_high_pct", "wilcoxon_p", "mde_pct",
                       "order_effect_flagged", "verdict")
COMPARISON_COLUMNS = ("job", "overrides", "experiment", "summary_path", "metric", "is_headline", "guards_passed",
                      "declined_all", *COMPARED_STATISTICS, "verdict_sentence")


SummarySource = Union[Sequence[Union[str, Path]], Mapping[Path, Mapping[str, Any]]]


def _paths_and_summaries(runs: SummarySource) -> tuple[list[Path], list[Mapping[str, Any]]]:
    """The summary paths and their summaries: read from the paths, or as already read (``{path: summary}``,
    :func:`read_summaries`' readable part)."""
    if isinstance(runs, Mapping):
        return [Path(p) for p in runs], list(runs.values())
    paths = [Path(p) for p in runs]
    return paths, [read_summary(p) for p in paths]


def compare_runs(runs: SummarySource) -> pd.DataFrame:
    """One row per (job, metric) from several ``summary.json`` files, e.g. a sweep's jobs: ``job`` is the
    job's short name (:func:`job_labels`), ``overrides`` all of its command-line overrides. A job without
    statistics (interrupted before a block ran in both arms) has no row; with no row at all the table has
    :data:`COMPARISON_COLUMNS`. ``runs``: the summary paths, or ``{path: summary}`` already read.
    :class:`UnreadableSummaryError` names a file that cannot be read."""
    if not runs:
        raise ValueError("compare_runs got no summary.json paths")
    paths, summaries = _paths_and_summaries(runs)
    rows = []
    for summary, p, job in zip(summaries, paths, job_labels(summaries, paths)):
        guards = summary.get("guards", [])
        names = arm_names(summary)
        for metric, s in statistics_of(summary).items():
            row = {"job": job, "overrides": " ".join(job_overrides(summary)), "experiment": summary.get("experiment"),
                   "summary_path": str(p), "metric": metric, "is_headline": metric == summary.get("headline_metric"),
                   "guards_passed": all(g["passed"] for g in guards) if guards else None,
                   "declined_all": ",".join(declined_arms(summary))}  # arms that declined every step
            for key in COMPARED_STATISTICS:
                row[key] = s.get(key)
            row["verdict_sentence"] = verdict_sentence(s, names["A"], names["B"])
            for name, value in (summary.get("sweep_params") or {}).items():
                row[f"param/{name}"] = value
            row.update({f"trim_ledger/{k}": v for k, v in (ledger_record(summary, FULL_LOAD_METRIC) or {}).items()})
            rows.append(row)
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(COMPARISON_COLUMNS))


def headline_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a :func:`compare_runs` table on each job's headline metric, renumbered from 0."""
    return table[table["is_headline"].astype(bool)].reset_index(drop=True)


def jobs_without_statistics(summaries: Mapping[Path, Mapping[str, Any]]) -> dict[str, str]:
    """Job name (:func:`job_labels`) -> its summary's verdict, for the jobs whose summaries have no statistics on
    their headline metric (runs interrupted before a block ran in both arms)."""
    labels = job_labels(list(summaries.values()), list(summaries))
    return {label: str(summary.get("verdict") or "no statistics recorded")
            for label, summary in zip(labels, summaries.values()) if not has_headline_statistics(summary)}


def frontier_table(runs: SummarySource) -> pd.DataFrame:
    """The throughput against per-user speed frontier of a sweep: one row per (job, arm) with the arm's output
    tokens/s and its tokens/s per user (1 / TPOT p50) as geometric means over its blocks with t-intervals
    (:func:`block_interval`), and goodput where the runs had a service level. Read from each job's blocks.csv
    (beside its summary.json); jobs without one are left out. ``runs`` as :func:`compare_runs` takes them."""
    paths, summaries = _paths_and_summaries(runs)
    rows = []
    for summary, path, job in zip(summaries, paths, job_labels(summaries, paths)):
        blocks_path = path.with_name("blocks.csv")
        if not blocks_path.is_file():
            continue
        blocks = pd.read_csv(blocks_path)
        labels = arm_labels(summary, ("A", "B"))
        for arm in ("A", "B"):
            mine = blocks[blocks["arm"] == arm]
            if mine.empty or "tpot_s_p50" not in mine:
                continue
            tput = block_interval(pd.to_numeric(mine["output_tokens_per_s"], errors="coerce"))
            per_user = block_interval(1.0 / pd.to_numeric(mine["tpot_s_p50"], errors="coerce"))
            row = {"job": job, "arm": arm, "label": labels[arm], "blocks": int(mine["block"].nunique()),
                   "tokens_per_s": tput[0], "tokens_per_s_low": tput[1], "tokens_per_s_high": tput[2],
                   "per_user_tokens_per_s": per_user[0], "per_user_low": per_user[1], "per_user_high": per_user[2]}
            if "goodput_tokens_per_s" in mine:
                good = block_interval(pd.to_numeric(mine["goodput_tokens_per_s"], errors="coerce"))
                row.update(goodput_tokens_per_s=good[0], goodput_low=good[1], goodput_high=good[2])
            rows.append(row)
    return pd.DataFrame(rows)


def _sweep_ledger_lines(headline: pd.DataFrame) -> list[str]:
    """The trim ledger of each job with a trimming arm against a whole-block arm, one row per job; [] if none."""
    prefix = "trim_ledger/"
    columns = [c for c in headline.columns if c.startswith(prefix)]
    if not columns:
        return []
    rows = []
    for r in headline.to_dict("records"):
        record = {c[len(prefix):]: (None if isinstance(r[c], float) and math.isnan(r[c]) else r[c]) for c in columns}
        if record.get("trim_arm") is not None:
            record["rows"] = None if record.get("rows") is None else int(record["rows"])
            rows.append([r["job"], record["trim_arm"], *ledger_cells(record)])
    return ["", "## What the trims bought and cost", "",
            _markdown(["job", "trimming arm", *LEDGER_HEADERS], rows), "",
            "Per job, the trimming arm against the whole-block arm (each report's Planner section): at the deepest "
            "batch bucket where one timed whole-block steps and the other trimmed ones, the device step the trims "
            "saved against the tokens a row-step lost; "
            "device-bound, the two together with the prefills' device time hidden beside the steps or serial with "
            "them; measured, the A/B's change (trim vs whole block)."]


def _left_out_lines(unreadable: Mapping[Path, str], without_statistics: Mapping[str, str],
                    failed: Mapping[str, str]) -> list[str]:
    """The sweep summary's list of the jobs its tables leave out, and why; [] when none is."""
    lines = [f"- {job}: **FAIL**, no results: {error}" for job, error in failed.items()]
    lines += [f"- {job}: no statistics ({verdict})" for job, verdict in without_statistics.items()]
    lines += [f"- `{path}`: unreadable: {reason}" for path, reason in unreadable.items()]
    return ["Left out of the tables:", "", *lines, ""] if lines else []


def write_sweep_report(sweep_dir: str | Path, failed_jobs: Mapping[str, str] | None = None,
                       read: tuple[Mapping[Path, Mapping[str, Any]], Mapping[Path, str]] | None = None
                       ) -> dict[str, Path]:
    """Collect the jobs' ``summary.json`` under ``sweep_dir`` (:func:`sweep_summary_paths`); write
    sweep_summary.{md,csv} and a gain plot. A job whose summary cannot be read, or has no statistics, is listed as
    left out, and so is each job of ``failed_jobs`` ({job folder: error}, the sweep's recorded job statuses) that
    wrote no summary (one that could not run with its settings); :class:`UnreadableSummaryError` when no job's
    summary can be read. ``read``: :func:`read_summaries` of those paths, where the caller has read them."""
    root = Path(sweep_dir)
    summary_paths = sweep_summary_paths(root) if read is None else [*read[0], *read[1]]
    with_summary = {p.relative_to(root).parts[0] for p in summary_paths}
    failed = {job: error for job, error in (failed_jobs or {}).items() if job not in with_summary}
    if not summary_paths:
        raise FileNotFoundError(f"no summary.json under {root}; point at the sweep's output folder "
                                "(the one holding one sub-folder per job)")
    readable, unreadable = read_summaries(summary_paths) if read is None else read
    if not readable:
        reasons = "; ".join(f"{path}: {reason}" for path, reason in unreadable.items())
        raise UnreadableSummaryError(root, f"no job's summary.json can be read ({reasons})")
    table = compare_runs(readable)
    paths = {"csv": root / "sweep_summary.csv", "markdown": root / "sweep_summary.md", "plot": root / "sweep_gain.png"}
    table.to_csv(paths["csv"], index=False)

    headline = headline_rows(table)
    report_plots.plot_sweep_gain(headline, paths["plot"])
    frontier = frontier_table(readable)
    frontier_lines: list[str] = []
    if not frontier.empty:
        paths["frontier_csv"] = root / "sweep_frontier.csv"
        paths["frontier_plot"] = root / "sweep_frontier.png"
        frontier.to_csv(paths["frontier_csv"], index=False)
        report_plots.plot_frontier(frontier, paths["frontier_plot"])

        def cell(row, key, low, high):
            return _cell(row[key], row.get(low), row.get(high), "rate") if key in row else "n/a"
        f_rows = [[r["job"], r["label"], cell(r, "tokens_per_s", "tokens_per_s_low", "tokens_per_s_high"),
                   cell(r, "per_user_tokens_per_s", "per_user_low", "per_user_high"),
                   cell(r, "goodput_tokens_per_s", "goodput_low", "goodput_high")]
                  for r in frontier.to_dict("records")]
        frontier_lines = ["", "## Throughput against per-user speed", "",
                          _markdown(["job", "arm", "output tokens/s", "tokens/s per user (1 / TPOT p50)",
                                     "goodput tokens/s"], f_rows), "",
                          "Geometric means over each arm's blocks with 95% t-intervals. Across a sweep of "
                          "concurrencies the points of an arm trace its frontier: how much total throughput it "
                          "buys with how much of each user's speed.", "",
                          f"![frontier]({paths['frontier_plot'].name})"]

    md_rows = [[r["job"], r["metric"], f"{r['change_pct']:+.2f}%", _ci_text(r), _fmt(r["wilcoxon_p"]),
                _fmt(r["mde_pct"], ".2f") + "%", r["n_blocks"],
                r["verdict"] + (f" ({r['declined_all']} declined every step: no trimming measured)"
                                if r["declined_all"] else ""),
                {True: "pass", False: "**FAIL**", None: "none recorded"}[r["guards_passed"]]]
               for r in headline.to_dict("records")]
    text = [f"# Sweep summary: {root}", "", f"{len(summary_paths) + len(failed)} job(s); headline metric per job.", "",
            *_left_out_lines(unreadable, jobs_without_statistics(readable), failed),
            _markdown(["job", "metric", "B vs A", "CI", "Wilcoxon p", "MDE", "blocks", "verdict", "guards"], md_rows),
            "", *[f"- {r['job']}: {r['verdict_sentence']}." for r in headline.to_dict("records")],
            "", f"![gain per job]({paths['plot'].name})", *frontier_lines, *_sweep_ledger_lines(headline), "",
            f"All metrics of all jobs, with each job's overrides: `{paths['csv'].name}`."]
    paths["markdown"].write_text("\n".join(text) + "\n")
    return paths
