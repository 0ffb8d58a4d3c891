"""Replay the verify-budget planner offline on step traces (``dspark.bench.planner_replay``).

    python bench/planner_replay.py TRACE.npz [...] --table cost_table.json --batches 128 256 --out DIR
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dspark.bench.planner_replay import main  # noqa: E402

if __name__ == "__main__":
    main()
