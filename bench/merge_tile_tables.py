"""Merge small_m_tiles.json files (bench/small_m_sweep.py, one per lane of shapes) into one table.

    python bench/merge_tile_tables.py OUT.json IN.json [IN.json ...]

Entries are keyed by weight shape (N, K, silu_mul, rope); two inputs naming the same shape are refused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(out: str, inputs: list[str]) -> None:
    if not inputs:
        raise SystemExit(__doc__)
    tiles, seen, device = [], {}, None
    for path in inputs:
        doc = json.loads(Path(path).read_text())
        device = device or doc.get("device")
        for e in doc["tiles"]:
            key = (e["N"], e["K"], e["silu_mul"], e.get("rope", False))
            if key in seen:
                raise SystemExit(f"{path} and {seen[key]} both set shape {key}")
            seen[key] = path
            tiles.append(e)
    Path(out).write_text(json.dumps({"device": device, "merged_from": inputs, "tiles": tiles}, indent=1) + "\n")
    print(f"{len(tiles)} entries -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
