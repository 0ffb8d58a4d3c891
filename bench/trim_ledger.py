"""The trim ledger (``dspark.bench.trim_ledger``) of committed A/B summaries, one markdown row per run.

For each ``summary.json`` with a trimming arm and a whole-block arm: the deepest batch bucket both timed, the
drafts verified per row-step, the tokens per row-step the trims cost, the device step they saved there (and per
draft left out, where every step was trimmed), the device-bound change those two make (the prefills' device time
hidden beside the steps, or serial with them), and the A/B's measured changes at full load and over whole blocks
(trim vs whole block). Runs without such a pair are listed as skipped.

    python bench/trim_ledger.py runs/*/summary.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from dspark.bench.report import FULL_LOAD_METRIC  # noqa: E402
from dspark.bench.trim_ledger import LEDGER_HEADERS, ledger_cells, ledger_record  # noqa: E402


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    rows, skipped = [], []
    for path in paths:
        record = ledger_record(json.loads(Path(path).read_text()), FULL_LOAD_METRIC)
        name = Path(path).parent.name
        if record is None:
            skipped.append(name)
        else:
            rows.append([name, *ledger_cells(record)])
    print(pd.DataFrame(rows, columns=["run", *LEDGER_HEADERS]).to_markdown(index=False))
    if skipped:
        print(f"\nNo trimming arm against a whole-block arm: {', '.join(skipped)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
