"""Does the confidence head rank acceptance better than the drafter's own max probability, and both together?

Reads a greedy replay cached by ``runners.calibrate ... replay_cache=PATH`` (a replay written with
``draft_max_prob``), takes the same reported half of the sequences as that run (``--fit-fraction``,
``--split-seed``: runners.calibrate's ``fit_fraction`` and ``seed``), and prints, as JSON, the pooled
conditional AUC (``dspark.training.calibration.conditional_auc``) of the head and of the max probability,
their difference, and 95% percentile intervals from a bootstrap over sequences (each resample draws
sequences with replacement and keeps all of their blocks).

    python bench/auc_head_vs_max_prob.py /tmp/replay.pt --fit-fraction 0.5 --split-seed 0 > out.json

``--fused`` also fits the ``sts_max_prob`` calibration (the head's logit and the max probability's logit per
position, ``dspark.training.calibration.fit_max_prob_calibration``) on the fit half and reports its AUC, its
differences to both and its out-of-sample ECE the same way; ``--write-calibration DIR`` saves that fit as
``DIR/temperatures.json``, which ``engine.confidence_calibration=DIR`` loads.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from dspark.survival import calibrated_confidence
from dspark.training.calibration import (calibration_report, conditional_auc, fit_max_prob_calibration,
                                         save_temperatures, split_sequences)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("replay", help="runners.calibrate replay_cache file")
    ap.add_argument("--fit-fraction", type=float, default=0.5)
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fused", action="store_true", help="also fit and judge the sts_max_prob calibration")
    ap.add_argument("--write-calibration", metavar="DIR", help="with --fused: write DIR/temperatures.json")
    args = ap.parse_args()
    try:
        replay = torch.load(args.replay, map_location="cpu", weights_only=True)["replay"]
    except (OSError, RuntimeError, KeyError, TypeError) as e:
        raise SystemExit(f"{args.replay}: not a runners.calibrate replay_cache file ({type(e).__name__}: {e})")
    if "draft_max_prob" not in replay:
        raise SystemExit(f"{args.replay}: this replay has no draft_max_prob (written before runners.calibrate "
                         f"recorded it); run the calibration again with a new replay_cache path")
    fit, rep = split_sequences(replay["seq_index"], args.fit_fraction, args.split_seed)
    head = torch.sigmoid(replay["conf_logits"].double()[rep])
    max_prob = replay["draft_max_prob"].double()[rep]
    accepted = replay["accepted"].double()[rep]
    seq = replay["seq_index"][rep]
    scores = [head, max_prob]
    extra = {}
    if args.fused:
        z, p, acc = replay["conf_logits"].float(), replay["draft_max_prob"].float(), replay["accepted"].float()
        try:
            cal = fit_max_prob_calibration(z[fit], p[fit], acc[fit])
        except ValueError as e:
            raise SystemExit(f"{args.replay}: the sts_max_prob fit failed on the fit half: {e}")
        fused = calibrated_confidence(z[rep], cal.temperatures, cal.biases, max_prob=p[rep],
                                      max_prob_weights=cal.max_prob_weights)
        scores.append(fused.double())
        report = calibration_report(z[rep], acc[rep], cal.temperatures, cal.biases, max_prob=p[rep],
                                    max_prob_weights=cal.max_prob_weights)
        extra = {"fused_ece_before": report["ece_before"], "fused_ece_after": report["ece_after"],
                 "fused_coefficients": {"head_scale": [1 / float(t) for t in cal.temperatures],
                                        "bias": [float(b) for b in cal.biases],
                                        "max_prob_weight": [float(w) for w in cal.max_prob_weights]}}
        if args.write_calibration:
            extra["calibration_file"] = str(save_temperatures(
                args.write_calibration, cal.temperatures, ece_before=report["ece_before"],
                ece_after=report["ece_after"], biases=cal.biases, max_prob_weights=cal.max_prob_weights))
    elif args.write_calibration:
        raise SystemExit("--write-calibration needs --fused")

    def aucs(rows: torch.Tensor | slice) -> tuple[float, ...]:
        return tuple(conditional_auc(s[rows], accepted[rows])["auc_overall"] for s in scores)

    ids = torch.unique(seq)
    blocks_of = [torch.nonzero(seq == i).flatten() for i in ids]
    rng = np.random.default_rng(args.seed)
    boot = np.array([aucs(torch.cat([blocks_of[j] for j in rng.integers(0, len(ids), len(ids))]))
                     for _ in range(args.resamples)])
    point = aucs(slice(None))
    h, m = point[:2]
    ci = lambda x: [float(np.percentile(x, 2.5)), float(np.percentile(x, 97.5))]  # noqa: E731
    out = {"sequences": len(ids), "blocks": int(rep.sum()), "head_auc": h, "head_ci": ci(boot[:, 0]),
           "max_prob_auc": m, "max_prob_ci": ci(boot[:, 1]), "difference": m - h,
           "difference_ci": ci(boot[:, 1] - boot[:, 0]), "resamples": args.resamples,
           "bootstrap": "by sequence, percentile"}
    if args.fused:
        f = point[2]
        out.update({"fused_auc": f, "fused_ci": ci(boot[:, 2]), "fused_minus_head": f - h,
                    "fused_minus_head_ci": ci(boot[:, 2] - boot[:, 0]), "fused_minus_max_prob": f - m,
                    "fused_minus_max_prob_ci": ci(boot[:, 2] - boot[:, 1]), **extra})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
