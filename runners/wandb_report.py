"""Make the W&B report of an A/B job whose runs are on the W&B server (logged online, or offline and synced).

    python -m runners.wandb_report outputs/ab/2026-01-01_12-00-00     # a run folder: its summary.json names the group
    python -m runners.wandb_report ENTITY/PROJECT GROUP
    python -m runners.wandb_report PROJECT GROUP                       # the API key's default entity

An offline A/B run ends with both commands in its summary.json (``wandb.sync_command``, then
``wandb.report_command``): upload with the first, then make the report with the second. The report
is built by :mod:`dspark.bench.wandb_report`. Exit status: 0 the report was saved (its URL is
printed), 1 it could not be made (the reason is printed: wandb-workspaces missing, no API key, the
server out of reach, no runs in the group), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from dspark.bench.wandb_report import ReportUnavailable, publish_report


def target_from_folder(folder: Path) -> tuple[str | None, str, str]:
    """(entity, project, group) of the A/B run in ``folder``, from its summary.json."""
    path = folder / "summary.json"
    try:
        wandb_status = json.loads(path.read_text()).get("wandb") or {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read ({exc}): give ENTITY/PROJECT GROUP instead") from exc
    if not wandb_status.get("group") or not wandb_status.get("project"):
        raise ValueError(f"{path} names no W&B group (the run was logged with W&B mode "
                         f"{wandb_status.get('mode', 'not recorded')!r}): give ENTITY/PROJECT GROUP instead")
    return wandb_status.get("entity"), wandb_status["project"], wandb_status["group"]


def target_from_path(path: str, group: str) -> tuple[str | None, str, str]:
    """(entity, project, group) from ``ENTITY/PROJECT`` (or ``PROJECT``) and ``GROUP``."""
    entity, _, project = path.rpartition("/")
    if not project or "/" in entity:
        raise ValueError(f"{path!r} is not ENTITY/PROJECT or PROJECT")
    return entity or None, project, group


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.wandb_report", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="an A/B run folder (its summary.json names the W&B group), or ENTITY/PROJECT "
                                       "(or PROJECT: the API key's default entity)")
    parser.add_argument("group", nargs="?", help="the W&B group (with ENTITY/PROJECT)")
    args = parser.parse_args(argv)
    try:
        if args.group is None:
            if not Path(args.target).is_dir():
                raise ValueError(f"{args.target} is not a run folder; give ENTITY/PROJECT GROUP")
            entity, project, group = target_from_folder(Path(args.target))
        else:
            entity, project, group = target_from_path(args.target, args.group)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        url = publish_report(project, group, entity=entity)
    except ReportUnavailable as exc:
        print(f"W&B report not made: {exc}", file=sys.stderr)
        return 1
    print(f"W&B report: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
