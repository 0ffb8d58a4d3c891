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
    }

``blocks_df`` has one row per (block, arm) with ``block``, ``arm``, ``first_arm``, the
metric columns and optionally ``per_position_acceptance`` (a list per row);
``requests_df`` is :func:`dspark.bench.metrics.requests_dataframe` output. Sections
whose data is absent say so in the report instead of disappearing.
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


def render_console_table(summary: dict[str, Any], console: Console | None = None) -> Table:
    """Print the verdict table of one experiment with rich and return it."""
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
    (console or Console()).print(table)
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

    hs = statistics[headline]
    lines = [f"# A/B report: {summary.get('experiment', 'experiment')}", "",
             f"**Verdict on {headline}: {hs['verdict']}** -- B vs A {hs['change_pct']:+.2f}% "
             f"({_ci_text(hs)}, {hs['ci_level']:.0%} {hs['ci_method']} CI). {hs['verdict_reason']}.", ""]
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
    counters = summary.get("counters")
    lines += ["", "## Engine counters", ""]
    if counters:
        names = sorted({k for c in counters.values() for k in c})
        arm_names = list(counters)
        lines.append(_md_table(["counter", *arm_names],
                               [[n, *[_fmt(counters[a].get(n)) for a in arm_names]] for n in names]))
    else:
        lines.append("No engine counters recorded.")
    lines += ["", "## Plots", ""]
    lines += [f"![{name}]({p.name})" for name, p in paths.items()]
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
                   "guards_passed": all(g["passed"] for g in guards) if guards else None}
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
                _fmt(r["mde_pct"], ".2f") + "%", r["n_blocks"], r["verdict"],
                {True: "pass", False: "**FAIL**", None: "none recorded"}[r["guards_passed"]]]
               for r in headline.to_dict("records")]
    text = [f"# Sweep summary: {root}", "", f"{len(summaries)} job(s); headline metric per job.", "",
            _md_table(["job", "metric", "B vs A", "CI", "Wilcoxon p", "MDE", "blocks", "verdict", "guards"], md_rows),
            "", f"![gain per job]({paths['plot'].name})", "",
            f"All metrics of all jobs: `{paths['csv'].name}`."]
    paths["markdown"].write_text("\n".join(text) + "\n")
    return paths
