"""Reports of A/B experiments: one experiment's markdown + plots, a console table, sweeps.

The input is the experiment summary the A/B runner writes as ``summary.json``:

    {
      "experiment": str,
      "headline_metric": str,                 # a key of "statistics"
      "statistics": {metric: ABStatistics.to_dict(), ...},
      "guards": [GuardResult.to_dict(), ...],
      "arms": {"A": {...}, "B": {...}},       # optional: arm descriptions / configs
      "fingerprint": {...},                   # optional: node_fingerprint()
      "counters": {"A": {...}, "B": {...}},   # optional: engine counters per arm
      "sweep_params": {name: value, ...},     # optional: the sweep overrides of this job
      "wandb": {...},                         # optional: WandbLogger.status()
      "timing_health": {                      # optional (newer runs)
        "captured_in_timed_blocks": [{"block", "arm", "graphs"}, ...],
        "first_block_vs_median": {"A": ratio, "B": ratio},
        "flags": [str, ...],
      },
    }

``blocks_df`` has one row per (block, arm) with ``block``, ``arm``, ``first_arm``, the
metric columns and optionally ``per_position_acceptance`` (a list per row);
``requests_df`` is :func:`dspark.bench.metrics.requests_dataframe` output. Sections
whose data is absent say so in the report instead of disappearing.

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
import warnings
from pathlib import Path
from typing import Any, Iterable, Sequence

import matplotlib

matplotlib.use("Agg")  # reports are written on headless nodes
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

ARM_COLORS = {"A": "tab:blue", "B": "tab:orange"}
VERDICT_COLORS = {"faster": "tab:green", "slower": "tab:red", "no detectable difference": "tab:gray"}


def _fmt(value: Any, spec: str = ".3g") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        return format(value, spec)
    return str(value)


def _md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _ci_text(stat: dict[str, Any]) -> str:
    low, high = stat.get("ci_low_pct"), stat.get("ci_high_pct")
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return "n/a"
    return f"{low:+.2f} .. {high:+.2f}%"


def _require(summary: dict[str, Any], key: str) -> Any:
    if key not in summary:
        raise KeyError(f"summary lacks {key!r} (has {sorted(summary)}); it must come from the A/B runner's summary.json")
    return summary[key]


def _statistics_rows(summary: dict[str, Any]) -> list[list[str]]:
    rows = []
    headline = summary.get("headline_metric")
    for metric, s in _require(summary, "statistics").items():
        rows.append([f"**{metric}**" if metric == headline else metric, s["direction"], f"{s['change_pct']:+.2f}%",
                     _ci_text(s), _fmt(s.get("wilcoxon_p")), _fmt(s.get("mde_pct"), ".2f") + "%", str(s["n_blocks"]),
                     s["verdict"]])
    return rows


STAT_HEADERS = ["metric", "better", "B vs A", "CI", "Wilcoxon p", "MDE", "blocks", "verdict"]


def declined_arms(summary: dict[str, Any]) -> list[str]:
    """Arms whose planner declined every step as "predicted no gain" (their did_nothing guard's
    ``details["declined_all"]``): they verified the whole drafted block on every step."""
    arms = []
    for g in summary.get("guards") or []:
        name = str(g.get("name", ""))
        if name.startswith("did_nothing[") and name.endswith("]") and (g.get("details") or {}).get("declined_all"):
            arms.append(name[len("did_nothing["):-1])
    return arms


def _arm_engines(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each arm's engine config as the summary records it ({} where it records none)."""
    return {a: (d.get("engine") or {}) for a, d in (summary.get("arms") or {}).items() if isinstance(d, dict)}


def verdict_note(summary: dict[str, Any]) -> str | None:
    """What the verdict means when a trimming arm declined every step (None otherwise): the statistics
    stand, but they compare the same work, so they say nothing about trimming."""
    declined = declined_arms(summary)
    if not declined:
        return None
    engines = _arm_engines(summary)
    spec = engines.get(declined[0], {}).get("spec")
    others = [a for a in engines if a not in declined]
    who = " and ".join(declined)
    head = f"{who} declined every step (planner predicted no gain)"
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
    """"Truncated outputs: A 12/64 (max_tokens 12), B ..." from ``summary["truncated"]`` and
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
        why = ", ".join(f"{k} {n}" for k, n in cut.items())
        parts.append(f"{arm} {sum(cut.values())}/{sum(reasons[arm].values())}" + (f" ({why})" if why else ""))
    return "Truncated outputs (finish_reason length): " + ", ".join(parts)


def render_console_table(summary: dict[str, Any], console: Console | None = None) -> Table:
    """Print the verdict table of one experiment with rich and return it; below it, what the verdict
    means when an arm declined every step, what each planner decided and why, and truncated outputs."""
    table = Table(title=f"A/B {summary.get('experiment', '')}: B vs A".strip())
    for header in STAT_HEADERS:
        table.add_column(header, justify="left" if header in ("metric", "verdict") else "right",
                         no_wrap=header in ("metric", "CI"))
    for row in _statistics_rows(summary):
        verdict = row[-1]
        style = {"faster": "green", "slower": "red"}.get(verdict, "")
        table.add_row(*[c.replace("**", "") for c in row[:-1]], f"[{style}]{verdict}[/{style}]" if style else verdict)
    guards = summary.get("guards", [])
    failed = [g["name"] for g in guards if not g["passed"]]
    table.caption = (f"guards: {len(guards) - len(failed)}/{len(guards)} passed"
                     + (f" -- FAILED: {', '.join(failed)}" if failed else ""))
    console = console or Console()
    console.print(table)
    note = summary.get("verdict_note") or verdict_note(summary)
    if note:
        console.print(f"[bold]Verdict: {note}.[/bold]", highlight=False)
    for line in planner_lines(summary):
        console.print(line, highlight=False, markup=False)
    truncated = truncation_line(summary)
    if truncated:
        console.print(truncated, highlight=False, markup=False)
    return table


def _plot_per_block(blocks_df: pd.DataFrame, metric: str, path: Path) -> None:
    fig, (ax_val, ax_ratio) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, group in blocks_df.groupby("arm"):
        ran_first = group["first_arm"] == arm
        color = ARM_COLORS.get(arm, None)
        ax_val.plot(group["block"], group[metric], color=color, alpha=0.4)
        ax_val.scatter(group.loc[ran_first, "block"], group.loc[ran_first, metric], color=color, marker="o",
                       label=f"{arm} (ran first)")
        ax_val.scatter(group.loc[~ran_first, "block"], group.loc[~ran_first, metric], color=color, marker="^",
                       label=f"{arm} (ran second)")
    ax_val.set(xlabel="block", ylabel=metric, title=f"{metric} per block")
    ax_val.legend(fontsize=8)
    wide = blocks_df.pivot(index="block", columns="arm", values=metric).sort_index()
    first = blocks_df.drop_duplicates("block").set_index("block")["first_arm"].reindex(wide.index)
    ratio_pct = 100 * (wide["B"] / wide["A"] - 1)
    for order, marker in (("A", "o"), ("B", "^")):
        sel = first == order
        ax_ratio.scatter(wide.index[sel], ratio_pct[sel], marker=marker, label=f"{order} ran first")
    ax_ratio.axhline(0, color="black", linewidth=0.8)
    ax_ratio.set(xlabel="block", ylabel="B / A - 1 (%)", title="paired change per block")
    ax_ratio.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_distributions(requests_df: pd.DataFrame, columns: list[str], path: Path) -> None:
    fig, axes = plt.subplots(1, len(columns), figsize=(5 * len(columns), 4), squeeze=False)
    for ax, column in zip(axes[0], columns):
        arms = sorted(requests_df["arm"].unique())
        data = [requests_df.loc[requests_df["arm"] == arm, column].dropna().to_numpy() for arm in arms]
        ax.boxplot(data, tick_labels=arms, showfliers=True)
        ax.set(title=f"{column} by arm", ylabel=column)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_acceptance(blocks_df: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, group in blocks_df.groupby("arm"):
        curves = [np.asarray(c, dtype=float) for c in group["per_position_acceptance"] if len(c)]
        if not curves:  # an arm that never drafted (target-only) has no acceptance curve
            continue
        depth = max(len(c) for c in curves)
        padded = np.full((len(curves), depth), np.nan)
        for i, c in enumerate(curves):
            padded[i, : len(c)] = c
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a position no draft reached stays NaN (a gap)
            mean_curve = np.nanmean(padded, axis=0)
        ax.plot(np.arange(1, depth + 1), mean_curve, marker="o", color=ARM_COLORS.get(arm),
                label=arm)
    ax.set(xlabel="draft position", ylabel="acceptance (accepted / reached)", ylim=(0, 1.05),
           title="per-position acceptance (mean over blocks)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_cost_tables(summary: dict[str, Any], path: Path) -> tuple[Path | None, str]:
    """Plot the cost table(s) of ``summary["cost_tables"]`` (predicted step ms against M, one line per batch
    size) to ``path``; (path, "") or (None, why not)."""
    from dspark.cost_table import CostTable

    used = {}
    for arm, entry in (summary.get("cost_tables") or {}).items():
        table_path = entry.get("path") if isinstance(entry, dict) else None
        if table_path:
            used.setdefault(str(table_path), []).append(str(arm))
    if not used:
        return None, "no arm used a cost table"
    tables = {}
    for table_path, arms in used.items():
        try:
            tables[table_path] = (arms, CostTable.load(table_path))
        except (OSError, ValueError) as exc:
            return None, f"{table_path} could not be read ({type(exc).__name__}: {exc})"
    fig, axes = plt.subplots(1, len(tables), figsize=(7 * len(tables), 4.5), squeeze=False)
    for ax, (table_path, (arms, table)) in zip(axes[0], tables.items()):
        for b in table.batch_sizes or (1,):
            ms = [m for m in table.token_counts if m >= b]
            if not ms:
                continue
            (line,) = ax.plot(ms, [table.step_ms(m, b) for m in ms], marker="o", markersize=3, label=f"batch {b}")
            if table.trim_overhead(b):
                ax.plot(ms, [table.step_ms(m, b, trimmed=True) for m in ms], linestyle="--", color=line.get_color(),
                        label=f"batch {b}, trimmed step")
        ax.set(xlabel="tokens sent to the target per step (M, bonus included)", ylabel="predicted step ms",
               title=f"cost table of arm {', '.join(sorted(arms))}: {Path(table_path).name}"[:90])
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, ""


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


def arm_labels(summary: dict[str, Any], arms: Iterable[str]) -> dict[str, str]:
    """Arm key -> its label (``summary["arms"][arm]["label"]``), the key where there is none; a label two arms
    share gets its key appended."""
    described = summary.get("arms") or {}
    labels = {}
    for arm in arms:
        entry = described.get(arm)
        label = entry.get("label") if isinstance(entry, dict) else None
        labels[arm] = str(label) if label else str(arm)
    counts = pd.Series(list(labels.values())).value_counts()
    return {arm: (f"{label} ({arm})" if counts[label] > 1 else label) for arm, label in labels.items()}


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
        })
    return rows


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
        return lines + ["No blocks recorded.", ""]
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
    lines.append(_md_table(BREAKDOWN_HEADERS, table))
    lines += ["", "Device-resident: share of decode steps run device-resident (CUDA graph replays, or uncaptured "
              "on a CPU). Host ms/step: host-side time per step() call without the wait for the device, median over "
              "blocks. Device idle: median over blocks. Mean batch: decoding requests per decode step. Graphs "
              "captured (timed): captures during the measured blocks, which should be 0. First / median block: the "
              f"arm's first block's {summary.get('headline_metric') or 'headline metric'} over its median block's."]
    kv = [f"{r['label']} {r['kv_pool_tokens']:,.0f}" for r in rows if r["kv_pool_tokens"] is not None]
    if kv:
        lines += ["", f"KV pool (tokens): {', '.join(kv)}."]
    flags = (summary.get("timing_health") or {}).get("flags") or []
    if flags:
        lines += ["", *[f"- ⚠ {flag}" for flag in flags]]
    return lines + [""]


def write_report(out_dir: str | Path, summary: dict[str, Any], blocks_df: pd.DataFrame,
                 requests_df: pd.DataFrame | None) -> dict[str, Path]:
    """Write ``report.md`` and its PNG plots under ``out_dir``; return their paths by name."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    headline = _require(summary, "headline_metric")
    statistics = _require(summary, "statistics")
    if headline not in statistics:
        raise KeyError(f"headline_metric {headline!r} has no entry in statistics ({sorted(statistics)})")
    paths: dict[str, Path] = {}
    skipped: list[str] = []

    if {"block", "arm", "first_arm", headline} <= set(blocks_df.columns):
        paths["per_block_plot"] = out / "per_block.png"
        _plot_per_block(blocks_df, headline, paths["per_block_plot"])
    else:
        skipped.append(f"per-block plot: blocks table lacks block/arm/first_arm/{headline}")
    dist_cols = [c for c in ("tpot_s", "e2e_s") if requests_df is not None and c in requests_df
                 and requests_df[c].notna().any()]
    if dist_cols:
        paths["distributions_plot"] = out / "distributions.png"
        _plot_distributions(requests_df, dist_cols, paths["distributions_plot"])
    else:
        skipped.append("latency distributions: no per-request tpot_s/e2e_s values")
    if "per_position_acceptance" in blocks_df and any(len(c) for c in blocks_df["per_position_acceptance"]):
        paths["acceptance_plot"] = out / "acceptance.png"
        _plot_acceptance(blocks_df, paths["acceptance_plot"])
    else:
        skipped.append("per-position acceptance: no acceptance recorded (target-only arms?)")
    cost_plot, cost_why = _plot_cost_tables(summary, out / "cost_table.png")
    if cost_plot is not None:
        paths["cost_table_plot"] = cost_plot
    else:
        skipped.append(f"cost table: {cost_why}")

    hs = statistics[headline]
    lines = [f"# A/B report: {summary.get('experiment', 'experiment')}", "",
             f"**Verdict on {headline}: {hs['verdict']}** -- B vs A {hs['change_pct']:+.2f}% "
             f"({_ci_text(hs)}, {hs['ci_level']:.0%} {hs['ci_method']} CI). {hs['verdict_reason']}.", ""]
    note = summary.get("verdict_note") or verdict_note(summary)
    if note:
        lines += [f"**{note}.**", ""]
    truncated = truncation_line(summary, requests_df)
    if truncated:
        lines += [f"{truncated}.", ""]
    flags = (summary.get("timing_health") or {}).get("flags") or []
    if flags:
        lines += [f"⚠ {len(flags)} timing warning(s): see \"Where the time went\".", ""]
    arms = summary.get("arms")
    if arms:
        lines += ["## Arms", "", _md_table(["arm", "description"],
                                           [[a, json.dumps(d, sort_keys=True, default=str)] for a, d in arms.items()]), ""]
    lines += ["## Statistics", "", _md_table(STAT_HEADERS, _statistics_rows(summary)), ""]
    for metric, s in statistics.items():
        order = (f"order effect {_fmt(s.get('order_effect_pct'), '+.2f')}% (p={_fmt(s.get('order_effect_p'))}, "
                 f"{s['order_effect_test']})" + (" **FLAGGED**" if s.get("order_effect_flagged") else ""))
        notes = "; ".join(s.get("notes", []))
        lines.append(f"- {metric}: {s['verdict_reason']}. {order}. {notes}")
    lines += ["", "## Guards", ""]
    guards = summary.get("guards")
    if guards:
        lines.append(_md_table(["guard", "passed", "message"],
                               [[g["name"], "yes" if g["passed"] else "**NO**", g["message"]] for g in guards]))
    else:
        lines.append("No guards recorded: the speed numbers are unchecked.")
    lines += ["", "## Planner", ""]
    planned = planner_lines(summary, hints=False)
    lines += [f"- {line}" for line in planned] or ["No arm reported planner decisions (no trimming arm)."]
    from dspark.bench.guards import DECLINE_HINTS

    meanings = dict.fromkeys(k for r in planner_rows(summary) for k in r["reasons"] if k in DECLINE_HINTS)
    if meanings:
        lines += ["", *[f"- `{k}`: {DECLINE_HINTS[k]}" for k in meanings]]
    for arm, h in (summary.get("prediction_health") or {}).items():
        ms = h.get("step_ms_measured_over_predicted")
        lines += ["", f"- arm {arm}, the cost table's predictions against its planned steps: tokens per step "
                  f"{h['tokens_realised_over_predicted']:.2f}x predicted, step time "
                  + (f"{ms:.2f}x predicted" if ms is not None else "not measured")
                  + (" **FLAGGED** (beyond +/-{:.0%})".format(h["tolerance"]) if h.get("flags") else
                     " (within +/-{:.0%})".format(h["tolerance"]))]
    if "cost_table_plot" in paths:
        lines += ["", "The cost table the planner priced each step with (predicted step time against the tokens "
                  "a step sends to the target, per batch size): trimming pays only where the curve rises.", "",
                  f"![cost table]({paths['cost_table_plot'].name})"]
    lines += ["", *where_time_went(summary, blocks_df)]
    counters = summary.get("counters")
    lines += ["## Engine counters", ""]
    if counters:
        names = sorted({k for c in counters.values() for k in c})
        arm_names = list(counters)
        lines.append(_md_table(["counter", *arm_names],
                               [[n, *[_fmt(counters[a].get(n)) for a in arm_names]] for n in names]))
    else:
        lines.append("No engine counters recorded.")
    lines += ["", "## Plots", ""]
    lines += [f"![{name}]({p.name})" for name, p in paths.items() if name != "cost_table_plot"]
    lines += [f"- not drawn: {s}" for s in skipped]
    fingerprint = summary.get("fingerprint")
    lines += ["", "## Node fingerprint", ""]
    lines.append("```json\n" + json.dumps(fingerprint, indent=2, sort_keys=True, default=str) + "\n```"
                 if fingerprint else "No fingerprint recorded: this result cannot be tied to a node or commit.")
    if summary.get("wandb"):
        w = summary["wandb"]
        lines += ["", "## W&B", "", f"mode {w.get('mode')}, runs {w.get('run_dirs')}, "
                  f"{len(w.get('failures', []))} failure(s): {w.get('failures', [])}"]
    paths["report"] = out / "report.md"
    paths["report"].write_text("\n".join(lines) + "\n")
    return paths


def _job_label(summary: dict[str, Any], path: Path) -> str:
    params = summary.get("sweep_params")
    if params:
        return ",".join(f"{k}={v}" for k, v in sorted(params.items()))
    return summary.get("experiment") or path.parent.name


def compare_runs(paths: Sequence[str | Path]) -> pd.DataFrame:
    """One row per (job, metric) from several ``summary.json`` files, e.g. a sweep's jobs."""
    if not paths:
        raise ValueError("compare_runs got no summary.json paths")
    rows = []
    for p in map(Path, paths):
        try:
            summary = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read A/B summary {p}: {exc}") from exc
        guards = summary.get("guards", [])
        for metric, s in _require(summary, "statistics").items():
            row = {"job": _job_label(summary, p), "experiment": summary.get("experiment"), "summary_path": str(p),
                   "metric": metric, "is_headline": metric == summary.get("headline_metric"),
                   "guards_passed": all(g["passed"] for g in guards) if guards else None,
                   "declined_all": ",".join(declined_arms(summary))}  # arms that declined every step
            for key in ("direction", "n_blocks", "change_pct", "ci_low_pct", "ci_high_pct", "wilcoxon_p", "mde_pct",
                        "order_effect_flagged", "verdict"):
                row[key] = s.get(key)
            for name, value in (summary.get("sweep_params") or {}).items():
                row[f"param/{name}"] = value
            rows.append(row)
    return pd.DataFrame(rows)


def write_sweep_report(sweep_dir: str | Path) -> dict[str, Path]:
    """Collect every ``summary.json`` under ``sweep_dir``; write sweep_summary.{md,csv} and a gain plot."""
    root = Path(sweep_dir)
    summaries = sorted(root.rglob("summary.json"))
    if not summaries:
        raise FileNotFoundError(f"no summary.json under {root}; point at the sweep's output folder "
                                "(the one holding one sub-folder per job)")
    table = compare_runs(summaries)
    paths = {"csv": root / "sweep_summary.csv", "markdown": root / "sweep_summary.md", "plot": root / "sweep_gain.png"}
    table.to_csv(paths["csv"], index=False)

    headline = table[table["is_headline"]].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(headline) + 2), 4))
    x = np.arange(len(headline))
    for i, row in headline.iterrows():
        has_ci = row["ci_low_pct"] is not None and not pd.isna(row["ci_low_pct"])
        err = ([[row["change_pct"] - row["ci_low_pct"]], [row["ci_high_pct"] - row["change_pct"]]] if has_ci else None)
        ax.errorbar(x[i], row["change_pct"], yerr=err, fmt="o", capsize=4,
                    color=VERDICT_COLORS.get(row["verdict"], "black"))
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x, headline["job"], rotation=30, ha="right", fontsize=8)
    metric_names = sorted(headline["metric"].unique())
    ax.set(ylabel=f"B vs A (%) on {', '.join(metric_names)}", title="gain per job with CI (green faster, red slower)")
    fig.tight_layout()
    fig.savefig(paths["plot"], dpi=110)
    plt.close(fig)

    md_rows = [[r["job"], r["metric"], f"{r['change_pct']:+.2f}%", _ci_text(r), _fmt(r["wilcoxon_p"]),
                _fmt(r["mde_pct"], ".2f") + "%", r["n_blocks"],
                r["verdict"] + (f" ({r['declined_all']} declined every step: no trimming measured)" if r["declined_all"] else ""),
                {True: "pass", False: "**FAIL**", None: "none recorded"}[r["guards_passed"]]]
               for r in headline.to_dict("records")]
    text = [f"# Sweep summary: {root}", "", f"{len(summaries)} job(s); headline metric per job.", "",
            _md_table(["job", "metric", "B vs A", "CI", "Wilcoxon p", "MDE", "blocks", "verdict", "guards"], md_rows),
            "", f"![gain per job]({paths['plot'].name})", "",
            f"All metrics of all jobs: `{paths['csv'].name}`."]
    paths["markdown"].write_text("\n".join(text) + "\n")
    return paths
