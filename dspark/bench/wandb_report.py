"""A W&B report of one A/B job: its verdict and statistics, per-block charts of both arms, its result files.

The report is built with wandb-workspaces (``wandb_workspaces.reports.v2``) from the job's W&B group
as the W&B server holds it, so the runs must be there first: logged online, or logged offline and
uploaded with ``wandb sync``. :func:`publish_report` either returns the report's URL or raises
:class:`ReportUnavailable` saying what is missing (the package, an API key, the server, the runs).
``python -m runners.wandb_report`` is its command line; ``wandb.report=true`` calls it when an
online A/B run ends.

What the report reads from the runs is what :class:`dspark.bench.wandb_log.WandbLogger` logs: the
summary's ``statistics`` (per metric, B vs A), ``verdict`` and ``headline_metric``, the history's
per-block metrics, the table ``statistics_table`` and the artifact of the result files
(:func:`dspark.bench.wandb_names.results_artifact_name`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from dspark.bench.wandb_names import results_artifact_name

STATISTICS_TABLE = "statistics_table"  # the W&B table of the statistics (WandbLogger.log_statistics)
COMPARED_PANEL_METRICS = ("requests_per_s", "ttft_s_p50", "tpot_s_p50", "accept_length")  # per-block history keys


class ReportUnavailable(RuntimeError):
    """A W&B report cannot be made now; the message says why and what to do."""


@dataclass
class GroupRun:
    """What the report needs of one run of the group."""

    name: str
    arm: str | None
    url: str | None
    summary: Mapping[str, Any] = field(default_factory=dict)


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{value:+.2f}%"


def _p(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def statistics_markdown(statistics: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per metric: B vs A, the CI, the Wilcoxon p-value, the minimum detectable effect, the verdict."""
    rows = ["| metric | B vs A | CI | Wilcoxon p | MDE | verdict |", "|---|---|---|---|---|---|"]
    for metric, s in statistics.items():
        level = f"{s.get('ci_level', 0):.0%} {s.get('ci_method', '')}".strip()
        ci = "n/a" if s.get("ci_low_pct") is None else f"{s['ci_low_pct']:+.2f} .. {s['ci_high_pct']:+.2f}% ({level})"
        mde = "n/a" if s.get("mde_pct") is None else f"{s['mde_pct']:.2f}%"
        rows.append(f"| {metric} | {_pct(s.get('change_pct'))} | {ci} | {_p(s.get('wilcoxon_p'))} | {mde} | "
                    f"{s.get('verdict', 'n/a')} |")
    return "\n".join(rows)


def verdict_markdown(summary: Mapping[str, Any]) -> str:
    headline = summary.get("headline_metric")
    stat = (summary.get("statistics") or {}).get(headline) or {}
    if not stat:
        return f"**Verdict: {summary.get('verdict', 'not recorded')}**"
    return (f"**Verdict on {headline}: {summary.get('verdict', stat.get('verdict'))}.** B vs A "
            f"{_pct(stat.get('change_pct'))}, Wilcoxon p = {_p(stat.get('wilcoxon_p'))}, "
            f"{stat.get('n_blocks', '?')} blocks. {stat.get('verdict_reason', '')}").strip()


def build_report(wr: Any, expr: Any, entity: str, project: str, group: str, runs: Sequence[GroupRun]) -> Any:
    """The report (not saved) of ``group``'s ``runs``. ``wr``: ``wandb_workspaces.reports.v2``; ``expr``:
    ``wandb_workspaces.expr`` (passed in, so that the construction is testable without the server)."""
    if not runs:
        raise ReportUnavailable(f"no runs in the W&B group {group!r} of {entity}/{project}")
    with_statistics = [r for r in runs if r.summary.get("statistics")]
    summary = with_statistics[0].summary if with_statistics else runs[0].summary
    headline = summary.get("headline_metric") or "output_tokens_per_s"
    arms = "\n".join(f"- arm {r.arm or '?'}: [{r.name}]({r.url})" if r.url else f"- arm {r.arm or '?'}: {r.name}"
                     for r in sorted(runs, key=lambda r: (r.arm or "", r.name)))
    runset = wr.Runset(entity=entity, project=project, name=group, filters=expr.And(expr.Metric("Group") == group))
    per_block = [wr.LinePlot(title=f"{headline} per block", y=[headline])]
    per_block += [wr.LinePlot(title=f"{m} per block", y=[m]) for m in COMPARED_PANEL_METRICS]
    blocks = [
        wr.H1(f"A/B {group}"),
        wr.MarkdownBlock(text=verdict_markdown(summary)),
        wr.H2("Statistics (B vs A, per metric)"),
        wr.MarkdownBlock(text=statistics_markdown(summary.get("statistics") or {})
                         if with_statistics else "No statistics were logged (the run ended before a block ran in "
                                                 "both arms)."),
        wr.H2("Arms"),
        wr.MarkdownBlock(text=arms),
        wr.PanelGrid(runsets=[runset], panels=[
            *per_block,
            wr.BarPlot(title=f"{headline} (last block)", metrics=[headline]),
            wr.WeavePanelSummaryTable(table_name=STATISTICS_TABLE),
            wr.RunComparer(diff_only="split"),
        ]),
        wr.H2("Report and plots"),
        wr.WeaveBlockArtifactVersionedFile(entity=entity, project=project, artifact=results_artifact_name(group),
                                           version="latest", file="report.md"),
    ]
    return wr.Report(entity=entity, project=project, title=f"A/B {group}",
                     description=f"{summary.get('verdict', 'no verdict')} ({headline}, B vs A)", blocks=blocks)


def check_requirements() -> None:
    """Raise ReportUnavailable when wandb-workspaces is missing or wandb finds no API key."""
    if importlib.util.find_spec("wandb_workspaces") is None:
        raise ReportUnavailable("wandb-workspaces is not installed (`pip install wandb-workspaces`)")
    from dspark.bench.wandb_log import _has_api_key

    if not _has_api_key():
        raise ReportUnavailable("no W&B API key is configured (set WANDB_API_KEY or run `wandb login`)")


def fetch_group(api: Any, entity: str, project: str, group: str) -> list[GroupRun]:
    """The runs of ``group`` on the server, read into plain data."""
    return [GroupRun(name=r.name, arm=(r.config or {}).get("arm"), url=getattr(r, "url", None),
                     summary=dict(r.summary_metrics or {}))
            for r in api.runs(f"{entity}/{project}", filters={"group": group})]


def publish_report(project: str, group: str, entity: str | None = None, api: Any = None) -> str:
    """Build and save the report of ``group``; return its URL. Raises ReportUnavailable (never anything
    else for a missing requirement, an unreachable server or an empty group)."""
    check_requirements()
    import wandb
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    try:
        api = api if api is not None else wandb.Api()
        entity = entity or api.default_entity
        runs = fetch_group(api, entity, project, group)
    except ReportUnavailable:
        raise
    except Exception as exc:  # the server is out of reach, or refuses: say so, with its own words
        raise ReportUnavailable(f"could not read the W&B group {group!r} of {entity or '<default entity>'}/{project} "
                                f"from the W&B server ({type(exc).__name__}: {exc}); a report needs the server: run "
                                "this where it can be reached, after `wandb sync` of offline runs") from exc
    if not runs:
        raise ReportUnavailable(f"the W&B group {group!r} of {entity}/{project} has no runs: offline runs must be "
                                "uploaded first (`wandb sync <run folders>`; an A/B summary.json lists them under "
                                "wandb.sync_command)")
    report = build_report(wr, expr, entity, project, group, runs)
    try:
        report.save()
        return report.url
    except Exception as exc:
        raise ReportUnavailable(f"the W&B server did not save the report of {group!r} "
                                f"({type(exc).__name__}: {exc})") from exc
