"""Two drafters' acceptance on the same replayed blocks, paired: a low-noise read of a change in sampled acceptance.

A held-out evaluation at T=0.7 samples each answer once, so two drafters meet different continuations and the
paired interval on 96 prompts is 10-20 points wide. ``runners.calibrate replay_temperature=0.7 ... replay_cache=PATH``
instead replays every block of fixed target answers (the same anchors for every drafter): each draft slot drawn from
the drafter at that temperature and accepted by rejection sampling against the target. Given two such caches of the
same data and anchors, this prints, as JSON, each drafter's mean accept length per block (accepted drafts plus the
target's token) and its acceptance at each block position where the position is reached, and B's change over A with
a 95% interval from a bootstrap over sequences (``runners.eval_drafter.bootstrap_interval``, paired: a resample keeps
a sequence's blocks together for both drafters; BCa, or percentile where BCa's bounds are undefined).

    python bench/compare_replays.py A.pt B.pt > compare.json

The caches must hold the same blocks (sequence and anchor of every block); otherwise nothing is compared.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from dspark.training.calibration import acceptance_per_position
from runners.eval_drafter import bootstrap_interval


def load_replay(path: str | Path) -> dict[str, torch.Tensor]:
    """The replay a ``runners.calibrate ... replay_cache=PATH`` file holds."""
    payload = torch.load(path, map_location="cpu", weights_only=False)
    replay = payload.get("replay") if isinstance(payload, dict) else None
    if not isinstance(replay, dict) or not {"accept_length", "accepted", "seq_index", "anchor"} <= set(replay):
        raise ValueError(f"{path}: not a runners.calibrate replay cache (no replay with accept_length, accepted, "
                         f"seq_index and anchor)")
    return replay


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], resamples: int = 2000,
            seed: int = 0) -> dict[str, object]:
    """B against A on the same blocks: means, per-position acceptance, and the paired change by sequence."""
    for key in ("seq_index", "anchor"):
        if not torch.equal(a[key], b[key]):
            raise ValueError(f"the two replays hold different blocks ({key} differs): replay the same data with the "
                             f"same anchors (anchor_stride, anchors_per_seq, seed, max_len, max_sequences)")
    seq = a["seq_index"].numpy()
    la, lb = a["accept_length"].double().numpy(), b["accept_length"].double().numpy()
    sequences, inverse = np.unique(seq, return_inverse=True)
    sum_a = np.bincount(inverse, weights=la)
    sum_b = np.bincount(inverse, weights=lb)

    def change(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return y.sum(axis=axis) / x.sum(axis=axis) - 1.0

    out: dict[str, object] = {"blocks": int(len(la)), "sequences": int(len(sequences)),
                              "accept_length": {"A": float(la.mean()), "B": float(lb.mean())},
                              "position_acceptance": {"A": acceptance_per_position(a["accepted"].double()),
                                                      "B": acceptance_per_position(b["accepted"].double())},
                              "change": float(change(sum_a, sum_b))}
    if np.allclose(sum_b, sum_a * (1.0 + out["change"]), rtol=0.0, atol=1e-9):
        # every sequence changed by the same ratio: every resample reads the change itself (BCa is undefined there)
        out["change_ci95"] = [out["change"], out["change"]]
        out["ci_method"] = "none needed: every sequence changed by the same ratio"
    elif len(sequences) >= 2:
        ci = bootstrap_interval([sum_a, sum_b], change, paired=True, n_resamples=resamples, seed=seed)
        out["change_ci95"] = [ci["low"], ci["high"]]
        out["ci_method"] = ("BCa" if ci["method"] == "bca" else ci["method"]) + " bootstrap over sequences, paired" + (
            f" ({ci['note']})" if ci["note"] else "")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="replay cache of drafter A (the baseline)")
    ap.add_argument("b", help="replay cache of drafter B, on the same data and anchors")
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        result = compare(load_replay(args.a), load_replay(args.b), args.resamples, args.seed)
    except (OSError, ValueError) as exc:
        print(f"compare_replays: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
