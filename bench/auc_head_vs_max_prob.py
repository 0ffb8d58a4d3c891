"""Does the confidence head rank acceptance better than the drafter's own max probability?

Reads a greedy replay cached by ``runners.calibrate ... replay_cache=PATH`` (a replay written with
``draft_max_prob``), takes the same reported half of the sequences as that run (``--fit-fraction``,
``--split-seed``: runners.calibrate's ``fit_fraction`` and ``seed``), and prints, as JSON, the pooled
conditional AUC (``dspark.training.calibration.conditional_auc``) of the head and of the max probability,
their difference, and 95% percentile intervals from a bootstrap over sequences (each resample draws
sequences with replacement and keeps all of their blocks).

    python bench/auc_head_vs_max_prob.py /tmp/replay.pt --fit-fraction 0.5 --split-seed 0 > out.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from dspark.training.calibration import conditional_auc, split_sequences


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("replay", help="runners.calibrate replay_cache file")
    ap.add_argument("--fit-fraction", type=float, default=0.5)
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        replay = torch.load(args.replay, map_location="cpu", weights_only=True)["replay"]
    except (OSError, RuntimeError, KeyError, TypeError) as e:
        raise SystemExit(f"{args.replay}: not a runners.calibrate replay_cache file ({type(e).__name__}: {e})")
    if "draft_max_prob" not in replay:
        raise SystemExit(f"{args.replay}: this replay has no draft_max_prob (written before runners.calibrate "
                         f"recorded it); run the calibration again with a new replay_cache path")
    _, rep = split_sequences(replay["seq_index"], args.fit_fraction, args.split_seed)
    head = torch.sigmoid(replay["conf_logits"].double()[rep])
    max_prob = replay["draft_max_prob"].double()[rep]
    accepted = replay["accepted"].double()[rep]
    seq = replay["seq_index"][rep]

    def aucs(rows: torch.Tensor | slice) -> tuple[float, float]:
        return (conditional_auc(head[rows], accepted[rows])["auc_overall"],
                conditional_auc(max_prob[rows], accepted[rows])["auc_overall"])

    ids = torch.unique(seq)
    blocks_of = [torch.nonzero(seq == i).flatten() for i in ids]
    rng = np.random.default_rng(args.seed)
    boot = np.array([aucs(torch.cat([blocks_of[j] for j in rng.integers(0, len(ids), len(ids))]))
                     for _ in range(args.resamples)])
    h, m = aucs(slice(None))
    ci = lambda x: [float(np.percentile(x, 2.5)), float(np.percentile(x, 97.5))]  # noqa: E731
    print(json.dumps({"sequences": len(ids), "blocks": int(rep.sum()), "head_auc": h, "head_ci": ci(boot[:, 0]),
                      "max_prob_auc": m, "max_prob_ci": ci(boot[:, 1]), "difference": m - h,
                      "difference_ci": ci(boot[:, 1] - boot[:, 0]), "resamples": args.resamples,
                      "bootstrap": "by sequence, percentile"}, indent=1))


if __name__ == "__main__":
    main()
