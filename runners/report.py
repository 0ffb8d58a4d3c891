"""Re-render the reports of A/B runs (finished or interrupted) and sweeps (plain argparse; no Hydra, no models).

    python -m runners.report outputs/ab/2026-01-01_12-00-00        # one run folder
    python -m runners.report multirun/ab/2026-01-01_12-00-00       # a sweep folder
    python -m runners.report FOLDER --no-wandb-report

A run folder (it holds ``summary.json``) gets ``report.md``, ``report_appendix.md`` and the
plots rewritten from ``summary.json`` + ``blocks.parquet`` (runs that wrote none: ``blocks.csv``)
+ ``requests.parquet`` (optional: without it the latency CDFs are skipped, and the report says
so). List columns are read as lists, whether stored as parquet lists or, by older runs, as JSON
text. A run marked interrupted is reported with what it has: without statistics when no block ran in both
arms, without its per-block parts when no arm-block completed. A sweep folder (``*/summary.json`` below it;
those in ``unfinished-<n>/`` and ``previous-<n>/`` folders are earlier attempts of a job, not jobs) gets
``sweep_summary.md``, ``sweep_summary.csv`` and ``sweep_gain.png``, and a table on the console; a job whose
summary.json cannot be read, and one that failed without results (its job_status.json), is listed with the
reason.

A W&B report (wandb-workspaces) is made only when the runs were logged online, an API key
is configured and ``wandb_workspaces`` is installed; otherwise the command says which of
these is missing and skips it. Exit status: 0 done, 2 bad folder (or unreadable or incomplete summary.json).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from rich.console import Console
from rich.table import Table

from dspark.bench.metrics import REQUEST_LIST_COLUMNS
from dspark.bench.report import (UnreadableSummaryError, compare_runs, headline_rows, jobs_without_statistics,
                                 read_summaries, read_summary, render_console_table, require_headline_statistics,
                                 sweep_summary_paths, verdict_line, write_report, write_sweep_report)
from runners.job_status import failed_jobs

BLOCK_LIST_COLUMNS = ("per_position_acceptance",)


class ReportError(ValueError):
    """The folder is neither a run folder nor a sweep folder, or a run folder's summary or blocks are unusable."""


def folder_kind(folder: Path) -> str:
    """'run' (holds summary.json, whatever unfinished-<n>/ or previous-<n>/ folders it has) or 'sweep' (jobs'
    summary.json files below it: :func:`sweep_summary_paths`); ReportError otherwise."""
    if not folder.is_dir():
        raise ReportError(f"{folder} is not a folder; give an A/B run folder (with summary.json) or a sweep folder "
                          "(with one sub-folder per job)")
    if (folder / "summary.json").is_file():
        return "run"
    if sweep_summary_paths(folder):
        return "sweep"
    present = sorted(p.name for p in folder.iterdir())[:10]
    raise ReportError(f"{folder} holds neither an A/B run (no summary.json) nor a sweep (no */summary.json below "
                      f"it outside unfinished-<n>/ and previous-<n>/ folders); it contains {present or 'nothing'}. "
                      "A run writes summary.json when it ends, an interrupted one too (marked interrupted): a run "
                      "folder without it is a run killed before it could (SIGKILL, a crash), whose completed blocks "
                      "are in blocks.csv. An earlier attempt kept in unfinished-<n>/ or previous-<n>/ is reported by "
                      "giving that folder")


def _as_list(value: Any) -> list:
    """A list cell as a list: parquet gives arrays, older runs stored JSON text; missing is empty."""
    if isinstance(value, str):
        return json.loads(value) if value.startswith("[") else []
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    return list(value)


def _lists_decoded(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    for col in columns:
        if col in frame:
            frame[col] = frame[col].map(_as_list)
    return frame


def read_blocks(folder: Path) -> pd.DataFrame | None:
    """The per-block table as the runner held it in memory: blocks.parquet, or blocks.csv (whose list cells
    older runs wrote as JSON text) where a run wrote no parquet; None when there is neither."""
    parquet, csv = folder / "blocks.parquet", folder / "blocks.csv"
    if parquet.is_file():
        frame = pd.read_parquet(parquet)
    elif csv.is_file():
        frame = pd.read_csv(csv)
    else:
        return None
    return _lists_decoded(frame, BLOCK_LIST_COLUMNS)


def read_run_summary(folder: Path) -> dict:
    """The run folder's summary.json, checked to be reportable: readable, and with statistics on its headline
    metric unless it is marked interrupted; ReportError naming the file otherwise."""
    path = folder / "summary.json"
    try:
        summary = read_summary(path)
        require_headline_statistics(summary)
    except UnreadableSummaryError as exc:
        raise ReportError(str(exc)) from exc
    except KeyError as exc:
        raise ReportError(f"{path}: {exc.args[0]}") from exc
    return summary


def run_blocks(folder: Path, summary: dict, console: Console) -> pd.DataFrame:
    """The run's per-block table (:func:`read_blocks`); an empty one, said on the console, for an interrupted
    run that left none; ReportError for any other run without one."""
    blocks = read_blocks(folder)
    if blocks is not None:
        return blocks
    missing = f"{folder / 'blocks.csv'} is missing (and blocks.parquet too)"
    if not summary.get("interrupted"):
        raise ReportError(f"{missing}: the run folder has summary.json but no per-block table; the report cannot "
                          "be drawn without it")
    console.print(f"[yellow]{missing}: the run was interrupted before an arm-block completed; the report leaves "
                  "out the per-block results and plots[/yellow]")
    return pd.DataFrame()


def read_requests(path: Path) -> pd.DataFrame | None:
    """requests.parquet with its list columns as lists (None when the file is missing)."""
    if not path.is_file():
        return None
    return _lists_decoded(pd.read_parquet(path), REQUEST_LIST_COLUMNS)


def render_run(folder: Path, console: Console) -> tuple[dict[str, Path], list[dict]]:
    """The run's report, tables and plots; (their paths, [the summary])."""
    summary = read_run_summary(folder)
    blocks = run_blocks(folder, summary, console)
    requests_path = folder / "requests.parquet"
    requests = read_requests(requests_path)
    if requests is None:
        console.print(f"[yellow]{requests_path} is missing: per-request plots are skipped[/yellow]")
    paths = write_report(folder, summary, blocks, requests)
    render_console_table(summary, console=console)
    console.print(f"report: {paths['report']} (appendix: {paths['appendix'].name})")
    return paths, [summary]


def render_sweep(folder: Path, console: Console) -> tuple[dict[str, Path], list[dict]]:
    """The sweep's summary, tables and plots; (their paths, the readable job summaries), each summary read once."""
    readable, unreadable = read_summaries(sweep_summary_paths(folder))
    paths = write_sweep_report(folder, failed_jobs=failed_jobs(folder), read=(readable, unreadable))
    headline = headline_rows(compare_runs(readable))
    out = Table(title=f"sweep {folder}: B vs A on the headline metric")
    for col in ("job", "metric", "B vs A", "CI", "verdict", "guards"):
        out.add_column(col, justify="right" if col in ("B vs A", "CI") else "left")
    for r in headline.to_dict("records"):
        ci = ("n/a" if r["ci_low_pct"] is None or pd.isna(r["ci_low_pct"])
              else f"{r['ci_low_pct']:+.2f} .. {r['ci_high_pct']:+.2f}%")
        guards = {True: "pass", False: "[red]FAIL[/red]"}.get(r["guards_passed"], "none recorded")
        out.add_row(str(r["job"]), str(r["metric"]), f"{r['change_pct']:+.2f}%", ci, str(r["verdict"]), guards)
    console.print(out)
    for r in headline.to_dict("records"):
        console.print(f"{r['job']}: {r['verdict_sentence']}", highlight=False, markup=False)
    for job, verdict in jobs_without_statistics(readable).items():
        console.print(f"[yellow]{job}: left out, no statistics ({verdict})[/yellow]", highlight=False)
    for path, reason in unreadable.items():
        console.print(f"[yellow]{path}: left out, unreadable: {reason}[/yellow]", highlight=False)
    console.print(f"sweep summary: {paths['markdown']} (all metrics: {paths['csv'].name}, plot: {paths['plot'].name})")
    return paths, list(readable.values())


def wandb_report_blocker(summaries: Sequence[dict]) -> str | None:
    """Why a W&B report cannot be made for these summaries, or None when it can."""
    modes = sorted({(s.get("wandb") or {}).get("mode", "not recorded") for s in summaries})
    if modes != ["online"]:
        return f"the runs were logged with W&B mode {modes}, not online: there is no W&B project to report on " \
               "(`wandb sync` the offline run folders first, then report from the W&B UI)"
    if importlib.util.find_spec("wandb_workspaces") is None:
        return "wandb-workspaces is not installed (`pip install wandb-workspaces`)"
    from dspark.bench.wandb_log import _has_api_key

    if not _has_api_key():
        return "no W&B API key is configured (WANDB_API_KEY or `wandb login`)"
    return None


def make_wandb_report(folder: Path, summaries: Sequence[dict]) -> str:
    """A W&B report of the runs' groups with the headline metric per block; returns its URL."""
    import wandb
    import wandb_workspaces.reports.v2 as wr

    project = summaries[0]["wandb"]["project"]
    entity = wandb.Api().default_entity
    headline = summaries[0]["headline_metric"]
    lines = []
    for s in summaries:
        lines.append(f"- {s['experiment']} {s.get('sweep_params') or ''}: {verdict_line(s)}; guards "
                     f"{'passed' if s.get('guards_passed') else 'FAILED'}")
    groups = sorted({s["wandb"].get("group") for s in summaries if s["wandb"].get("group")})
    report = wr.Report(entity=entity, project=project, title=f"DSpark A/B: {folder.name}",
                       description=f"{len(summaries)} A/B experiment(s) from {folder}")
    report.blocks = [
        wr.H1(f"A/B results: {folder.name}"),
        wr.MarkdownBlock(text="\n".join(lines)),
        wr.PanelGrid(runsets=[wr.Runset(entity=entity, project=project, name=g, groupby=["job_type"])
                              for g in groups] or [wr.Runset(entity=entity, project=project)],
                     panels=[wr.LinePlot(x="block", y=[headline])]),
    ]
    report.save()
    return report.url


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="an A/B run folder (summary.json) or a sweep folder")
    parser.add_argument("--no-wandb-report", action="store_true", help="never try to make a W&B report")
    args = parser.parse_args(argv)
    console = Console(soft_wrap=True)  # paths in messages stay on one line (greppable)
    try:
        render = render_run if folder_kind(args.folder) == "run" else render_sweep
        _, summaries = render(args.folder, console)  # what the W&B report covers: the run's, or the sweep's readable
    except (ReportError, UnreadableSummaryError) as exc:
        parser.error(str(exc))
    if args.no_wandb_report:
        console.print("W&B report skipped: --no-wandb-report")
        return 0
    blocker = wandb_report_blocker(summaries)
    if blocker is not None:
        console.print(f"W&B report skipped: {blocker}")
    else:
        console.print(f"W&B report: {make_wandb_report(args.folder, summaries)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
