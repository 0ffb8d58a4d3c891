"""The trim and drafting ledgers of committed A/B summaries, one markdown row per run.

The trim ledger (``dspark.bench.trim_ledger``), for each ``summary.json`` with a trimming arm and a whole-block arm:
the deepest batch bucket where one timed whole-block steps and the other trimmed ones, the drafts verified per
row-step, the tokens per row-step the trims cost, the device step they saved there (and per draft left out, where
every step was trimmed), the device-bound change those two make (the prefills' device time hidden beside the steps,
or serial with them), and the A/B's measured changes at full load and over whole blocks (trim vs whole block).
The drafting ledger (``dspark.bench.draft_ledger``), for each run of a drafting arm against a target-only arm: the
tokens per row-step, the device step at the deepest bucket both timed, the device-bound change and the measured
ones (drafting vs target-only). Runs with neither pair are listed as skipped.

    python bench/trim_ledger.py runs/*/summary.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from dspark.bench.draft_ledger import draft_ledger  # noqa: E402
from dspark.bench.report import FULL_LOAD_METRIC  # noqa: E402
from dspark.bench.trim_ledger import LEDGER_HEADERS, ledger_cells, ledger_record, measured_changes  # noqa: E402

DRAFT_HEADERS = ["rows", "tokens per row-step", "device step, drafting / target-only", "device-bound",
                 "measured: full load / whole blocks"]


def _pct(value: float | None, spec: str = "+.2f") -> str:
    return "-" if value is None else f"{format(value, spec)}%"


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    trims, drafts, skipped = [], [], []
    for path in paths:
        try:
            summary = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"cannot read A/B summary {path}: {exc}", file=sys.stderr)
            return 2
        name = Path(path).parent.name
        record, ledger = ledger_record(summary, FULL_LOAD_METRIC), draft_ledger(summary)
        if record is not None:
            trims.append([name, *ledger_cells(record)])
        if ledger is not None:
            measured = measured_changes(summary, ledger.drafting.arm, FULL_LOAD_METRIC)
            step = "-" if ledger.rows is None else f"{ledger.drafting_step_ms:.2f} / {ledger.target_step_ms:.2f} ms"
            bound = None if ledger.device_bound_change is None else 100.0 * ledger.device_bound_change
            drafts.append([name, "-" if ledger.rows is None else ledger.rows, f"{ledger.token_ratio:.2f}x", step,
                           _pct(bound, "+.1f"),
                           f"{_pct(measured['at full load'])} / {_pct(measured['over whole blocks'])}"])
        if record is None and ledger is None:
            skipped.append(name)
    if trims:
        print(pd.DataFrame(trims, columns=["run", *LEDGER_HEADERS]).to_markdown(index=False))
    if drafts:
        print(("\n" if trims else "") + pd.DataFrame(drafts, columns=["run", *DRAFT_HEADERS]).to_markdown(index=False))
    if skipped:
        print(f"\nNo trimming arm against a whole-block arm, nor drafting against target-only: {', '.join(skipped)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
