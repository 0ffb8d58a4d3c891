"""The figures of an A/B report and of a sweep summary, as PNG files (matplotlib, headless).

Every function takes the arms' display names (``labels``: arm key -> label) so that figures name the
arms as the report does, and saves with a tight bounding box so that no tick label is clipped.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")  # reports are written on headless nodes
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dspark.bench.metrics import pooled_itls  # noqa: E402

ARM_COLORS = {"A": "tab:blue", "B": "tab:orange"}
VERDICT_COLORS = {"faster": "tab:green", "slower": "tab:red", "no difference": "tab:gray",
                  "inconclusive": "tab:olive"}
DPI = 110
# Panels of the latency CDF figure: (requests_df column, or "itl" for the pooled chunk gaps; title).
CDF_PANELS = (("ttft_s", "TTFT (from submission)"), ("itl", "ITL (gap between chunks)"),
              ("tpot_s", "TPOT (per output token after the first)"), ("e2e_s", "E2E (from submission)"),
              ("queue_wait_s", "queue wait (submission - scheduled arrival)"))


def _save(fig: plt.Figure, path: Path) -> None:
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def plot_per_block(blocks_df: pd.DataFrame, metric: str, labels: Mapping[str, str], path: Path) -> None:
    """The metric per block for each arm (marker: which arm ran first), and the paired change per block."""
    fig, (ax_val, ax_ratio) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, group in blocks_df.groupby("arm"):
        ran_first = group["first_arm"] == arm
        color = ARM_COLORS.get(arm)
        name = labels.get(arm, arm)
        ax_val.plot(group["block"], group[metric], color=color, alpha=0.4)
        ax_val.scatter(group.loc[ran_first, "block"], group.loc[ran_first, metric], color=color, marker="o",
                       label=f"{name} (ran first)")
        ax_val.scatter(group.loc[~ran_first, "block"], group.loc[~ran_first, metric], color=color, marker="^",
                       label=f"{name} (ran second)")
    ax_val.set(xlabel="block", ylabel=metric, title=f"{metric} per block")
    ax_val.legend(fontsize=8)
    wide = blocks_df.pivot(index="block", columns="arm", values=metric).sort_index()
    first = blocks_df.drop_duplicates("block").set_index("block")["first_arm"].reindex(wide.index)
    ratio_pct = 100 * (wide["B"] / wide["A"] - 1)
    for order, marker in (("A", "o"), ("B", "^")):
        sel = first == order
        ax_ratio.scatter(wide.index[sel], ratio_pct[sel], marker=marker, label=f"{labels.get(order, order)} ran first")
    ax_ratio.axhline(0, color="black", linewidth=0.8)
    ax_ratio.set(xlabel="block", ylabel=f"{labels.get('B', 'B')} / {labels.get('A', 'A')} - 1 (%)",
                 title="paired change per block")
    ax_ratio.legend(fontsize=8)
    _save(fig, path)


def latency_samples(requests_df: pd.DataFrame) -> dict[str, dict[str, np.ndarray]]:
    """{panel column: {arm: finite values in seconds}} for the CDF panels the frame has data for (errored
    requests and requests without a value left out; ITL pools every request's chunk gaps)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for column, _ in CDF_PANELS:
        per_arm = {}
        for arm, group in requests_df.groupby("arm", sort=True):
            if column == "itl":
                if "chunk_times_s" not in group:
                    continue
                ok = group["error"].isna() if "error" in group else slice(None)
                values = pooled_itls(group.loc[ok, "chunk_times_s"])
            elif column in group:
                values = pd.to_numeric(group[column], errors="coerce").to_numpy(dtype=float)
            else:
                continue
            values = values[np.isfinite(values)]
            if values.size:
                per_arm[str(arm)] = values
        if per_arm:
            out[column] = per_arm
    return out


def plot_latency_cdfs(samples: Mapping[str, Mapping[str, np.ndarray]], labels: Mapping[str, str],
                      path: Path) -> None:
    """One panel per latency (``samples`` from :func:`latency_samples`), the empirical CDF of each arm, with
    p50 / p90 / p99 marked; a log time axis where the values span more than two decades."""
    titles = dict(CDF_PANELS)
    panels = [c for c, _ in CDF_PANELS if c in samples]
    cols = 2 if len(panels) > 1 else 1
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.6 * rows), squeeze=False)
    for ax, column in zip(axes.flat, panels):
        values_all = np.concatenate(list(samples[column].values()))
        for arm, values in samples[column].items():
            ax.ecdf(values, label=f"{labels.get(arm, arm)} (n={values.size:,})", color=ARM_COLORS.get(arm))
        positive = values_all[values_all > 0]
        if positive.size and positive.max() / positive.min() > 100:
            ax.set_xscale("log")
        for q in (0.5, 0.9, 0.99):
            ax.axhline(q, color="gray", linewidth=0.6, linestyle=":")
        ax.set(title=titles[column], xlabel="seconds", ylim=(0, 1.01),
               ylabel="share of gaps" if column == "itl" else "share of requests")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("latency CDFs per arm (dotted: p50, p90, p99)")
    fig.tight_layout()
    _save(fig, path)


def plot_acceptance(blocks_df: pd.DataFrame, labels: Mapping[str, str], path: Path) -> None:
    """Per-position acceptance, the mean over each arm's blocks (positions no draft reached are gaps)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, group in blocks_df.groupby("arm"):
        curves = [np.asarray(c, dtype=float) for c in group["per_position_acceptance"] if len(c)]
        if not curves:  # an arm that never drafted (target-only) has no acceptance curve
            continue
        mean_curve = pd.DataFrame(curves).mean(axis=0, skipna=True)  # ragged curves padded with NaN
        ax.plot(np.arange(1, len(mean_curve) + 1), mean_curve.to_numpy(), marker="o", color=ARM_COLORS.get(arm),
                label=labels.get(arm, arm))
    ax.set(xlabel="draft position", ylabel="acceptance (accepted / reached)", ylim=(0, 1.05),
           title="per-position acceptance (mean over blocks)")
    ax.legend()
    _save(fig, path)


def plot_cost_tables(summary: Mapping[str, Any], path: Path) -> tuple[Path | None, str]:
    """Plot the cost table(s) of ``summary["cost_tables"]`` (predicted step ms against M, one line per batch
    size) to ``path``; (path, "") or (None, why not)."""
    from dspark.cost_table import CostTable

    used: dict[str, list[str]] = {}
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
    _save(fig, path)
    return path, ""


def _tick_label(job: str, width: int = 28) -> str:
    """A sweep job's label wrapped after its commas (``a=1,b=2``: overrides kept whole, several to a line while
    they fit in ``width`` characters)."""
    return "\n".join(textwrap.wrap(job.replace(",", ", "), width=width, break_long_words=False)) or job


def plot_sweep_gain(headline: pd.DataFrame, path: Path) -> None:
    """B vs A on the headline metric per job (``compare_runs`` rows) with its CI, coloured by verdict; job labels
    wrapped and turned so that they stay readable and inside the image."""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(headline) + 2), 4.5))
    x = np.arange(len(headline))
    for i, row in enumerate(headline.to_dict("records")):
        has_ci = row["ci_low_pct"] is not None and not pd.isna(row["ci_low_pct"])
        err = ([[row["change_pct"] - row["ci_low_pct"]], [row["ci_high_pct"] - row["change_pct"]]] if has_ci else None)
        ax.errorbar(x[i], row["change_pct"], yerr=err, fmt="o", capsize=4,
                    color=VERDICT_COLORS.get(row["verdict"], "black"))
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x, [_tick_label(str(j)) for j in headline["job"]], rotation=35, ha="right",
                  rotation_mode="anchor", fontsize=8)
    ax.set_xlim(-0.6, len(headline) - 0.4)
    metric_names = sorted(headline["metric"].unique())
    ax.set(ylabel=f"B vs A (%) on {', '.join(metric_names)}",
           title="gain per job with CI (green faster, red slower, gray no difference, olive inconclusive)")
    ax.grid(True, axis="y", alpha=0.3)
    _save(fig, path)


def plot_frontier(frontier: pd.DataFrame, path: Path) -> None:
    """Output tokens/s against tokens/s per user, one point per (job, arm) with its block intervals, each arm's
    points joined in order of per-user speed and labelled with their job (:func:`report.frontier_table` rows)."""
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    for (label, rows), colour in zip(frontier.groupby("label", sort=False), ("#8c8c8c", "#1f77b4", "#2ca02c", "#d62728")):
        rows = rows.sort_values("per_user_tokens_per_s")
        x, y = rows["per_user_tokens_per_s"].to_numpy(float), rows["tokens_per_s"].to_numpy(float)

        def spread(centre, low, high):
            lo = np.where(pd.isna(low), centre, low).astype(float)
            hi = np.where(pd.isna(high), centre, high).astype(float)
            return [centre - lo, hi - centre]
        ax.errorbar(x, y, xerr=spread(x, rows["per_user_low"], rows["per_user_high"]),
                    yerr=spread(y, rows["tokens_per_s_low"], rows["tokens_per_s_high"]), fmt="o-", capsize=3,
                    color=colour, label=label)
        for xi, yi, job in zip(x, y, rows["job"]):
            ax.annotate(_tick_label(str(job), 20), (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set(xlabel="tokens/s per user (1 / TPOT p50)", ylabel="output tokens/s",
           title="throughput against per-user speed (each point: a job of the sweep)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
