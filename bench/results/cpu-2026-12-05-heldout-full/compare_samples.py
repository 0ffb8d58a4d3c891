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

import statistics
import sys

from scipy.stats import wilcoxon

from runners.eval_drafter import compare_rows, load_report


def greedy_rows(path: str) -> dict[str, dict]:
    """workload -> its T=0 result row of one eval.json."""
    return {r["workload"]: r for r in load_report(path)["results"] if r["temperature"] == 0.0}


def main(h200_path: str, cpu_paths: list[str]) -> None:
    h200 = greedy_rows(h200_path)
    print("| workload | CPU prompts | CPU accept length (95% CI) | common prompts | H200 / CPU on them | "
          "Wilcoxon p | CPU on the rest (prompts) |")
    print("|---|---|---|---|---|---|---|")
    for path in cpu_paths:
        for name, row in greedy_rows(path).items():
            cpu = row["per_prompt"]
            ci = row["mean_accept_length_ci"]
            cells = "- | - | -"
            rest = list(cpu)
            if name in h200:  # the prompts both answered, paired as runners.eval_drafter compare pairs them
                pair = compare_rows(h200[name], row)
                ref = h200[name]["per_prompt"]
                shared = [k for k in cpu if k in ref and k not in pair["only_b"]]
                rest = pair["only_b"]
                p = (wilcoxon([ref[k]["mean_accept_length"] for k in shared],
                              [cpu[k]["mean_accept_length"] for k in shared]).pvalue if len(shared) > 5 else None)
                cells = (f"{pair['n_prompts']} | "
                         + (f"{pair['a_mean_accept_length']:.3f} / {pair['b_mean_accept_length']:.3f}"
                            if pair["n_prompts"] else "-")
                         + f" | {'-' if p is None else f'{p:.2f}'}")
            rest_mean = statistics.mean(cpu[k]["mean_accept_length"] for k in rest) if rest else None
            print(f"| {name} | {len(cpu)} | {row['mean_accept_length']:.3f} ({ci['low']:.3f} .. {ci['high']:.3f}) "
                  f"| {cells} | " + (f"{rest_mean:.3f} ({len(rest)})" if rest else "-") + " |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
