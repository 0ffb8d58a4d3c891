"""The shipped drafter's held-out accept length (T=0) on larger prompt samples than the model card's 24, and on
the card's 24 prompts on both machines.

    python bench/results/cpu-2026-12-05-heldout-full/compare_samples.py H200_EVAL_JSON CPU_EVAL_JSON...

H200_EVAL_JSON: a runners.eval_drafter eval.json of the shipped drafter on the H200 (bf16, 24 prompts per
workload); CPU_EVAL_JSON: eval.json files of the same drafter on the CPU (fp32), one workload each or several.
Prints one markdown table: per workload, the whole CPU sample's mean and interval, then the prompts both runs
answered (their means on each machine and a Wilcoxon signed-rank p of the per-prompt differences), then the CPU
sample's prompts the H200 run did not answer.
"""

from __future__ import annotations

import json
import statistics
import sys

from scipy.stats import wilcoxon


def greedy_rows(path: str) -> dict[str, dict]:
    """workload -> its T=0 result row of one eval.json."""
    with open(path) as f:
        results = json.load(f)["results"]
    return {r["workload"]: r for r in results if r["temperature"] == 0.0}


def main(h200_path: str, cpu_paths: list[str]) -> None:
    h200 = greedy_rows(h200_path)
    print("| workload | CPU prompts | CPU accept length (95% CI) | common prompts | H200 / CPU on them | "
          "Wilcoxon p | CPU on the rest (prompts) |")
    print("|---|---|---|---|---|---|---|")
    for path in cpu_paths:
        for name, row in greedy_rows(path).items():
            cpu = {k: v["mean_accept_length"] for k, v in row["per_prompt"].items()}
            ref = {k: v["mean_accept_length"] for k, v in h200[name]["per_prompt"].items()} if name in h200 else {}
            common = [k for k in ref if k in cpu]
            rest = [cpu[k] for k in cpu if k not in ref]
            ci = row["mean_accept_length_ci"]
            p = wilcoxon([ref[k] for k in common], [cpu[k] for k in common]).pvalue if len(common) > 5 else None
            print(f"| {name} | {len(cpu)} | {row['mean_accept_length']:.3f} ({ci['low']:.3f} .. {ci['high']:.3f}) "
                  f"| {len(common)} | "
                  + (f"{statistics.mean(ref[k] for k in common):.3f} / {statistics.mean(cpu[k] for k in common):.3f}"
                     if common else "-")
                  + f" | {'-' if p is None else f'{p:.2f}'} | "
                  + (f"{statistics.mean(rest):.3f} ({len(rest)})" if rest else "-") + " |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
