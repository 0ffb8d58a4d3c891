"""The paired comparison of two drafters (``runners.eval_drafter compare``) as a figure.

One panel per (workload, temperature): the change in accept length over all shared prompts, then each source
label's, with their paired prompt-bootstrap intervals; a hollow marker is a change without an interval (a source
of too few prompts). Drawn on its own ``Figure`` (no pyplot state), so that it is safe beside other figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 110


def _entries(row: Mapping[str, Any]) -> list[tuple[str, int, float, Mapping[str, Any]]]:
    """(label, prompts, change %, interval) of the whole row, then of each source, lowest change first."""
    out = [("all prompts", int(row["n_prompts"]), float(row["change_pct"]), row["ci"])]
    out += [(g["source"], int(g["n_prompts"]), float(g["change_pct"]), g["ci"]) for g in row.get("by_source") or []]
    return out


def plot_comparison(comparison: Mapping[str, Any], path: str | Path) -> Path | None:
    """Write the figure of ``comparison`` (:func:`runners.eval_drafter.compare_reports`) to ``path``; None (and
    no file) when no row has shared prompts."""
    rows = [r for r in comparison["rows"] if r.get("change_pct") is not None]
    if not rows:
        return None
    heights = [len(_entries(r)) for r in rows]
    fig = Figure(figsize=(8.0, 1.2 + 0.3 * sum(heights) + 0.5 * len(rows)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(rows), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    for ax, row in zip(axes, rows):
        entries = _entries(row)
        ys = np.arange(len(entries))[::-1]
        for y, (name, _, change, ci) in zip(ys, entries):
            color = "black" if name == "all prompts" else "tab:blue"
            if ci.get("low") is not None and ci.get("high") is not None:
                ax.errorbar([change], [y], xerr=[[change - ci["low"]], [ci["high"] - change]], fmt="o", color=color,
                            capsize=3, markersize=5)
            else:
                ax.plot([change], [y], marker="o", markerfacecolor="white", color=color, linestyle="none")
        ax.set_yticks(ys, [f"{name} ({n})" for name, n, _, _ in entries], fontsize=8)
        ax.set_ylim(-0.7, len(entries) - 0.3)
        ax.axvline(0.0, color="gray", linewidth=0.8)
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(f"{row['workload']}, T={row['temperature']:g}", fontsize=9, loc="left")
    level = comparison.get("bootstrap", {}).get("ci_level", 0.95)
    axes[-1].set_xlabel("B vs A: change in accept length (%); (n) prompts")
    fig.suptitle(f"A: {comparison['a'].get('path')}\nB: {comparison['b'].get('path')}\n{level:.0%} paired "
                 "prompt-bootstrap intervals; hollow: too few prompts for one", fontsize=8)
    path = Path(path)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path
