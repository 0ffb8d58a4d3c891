"""The gradient each term of the drafter's training objective sends to each part of a drafter. For CE, TV and the
confidence term alone (the other two weighted 0), the gradient summed over the first ``batches`` training batches,
and its L2 norm over the backbone (every weight but the two heads'), the Markov head and the confidence head; and the
cosine between the confidence term's backbone gradient and the sum of the other two's. The terms carry their
configured weights (train.ce_weight 0.1, tv_weight 0.9, conf_weight 1.0 by default). Reads a drafter, the packaged
target and a runners.make_training_data file on the CPU (fp32); writes OUT_DIR/loss_term_gradients.json and prints it.

    python bench/loss_term_gradients.py OUT_DIR data=FILE [drafter=builtin:dspark-smollm2] [batches=3]
      [batch_size=8] [max_len=512] [conf_stop_grad=false]

``conf_stop_grad=true`` runs the steps as ``train.conf_stop_grad=true`` training does: the confidence term's
backbone and Markov-head gradients are then zero.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTS = ("backbone", "markov_head", "confidence_head")
TERMS = ("ce", "tv", "conf")


def part_of(name: str) -> str:
    head = name.split(".", 1)[0]
    return head if head in PARTS else "backbone"


def term_gradients(drafter, target, dataset, batches: int = 3, batch_size: int = 8, max_len: int = 512,
                   conf_stop_grad: bool = False, **weights: float) -> dict:
    """{"norms": {term: {part: L2 norm}}, "conf_backbone_cosine": cosine of the confidence term's backbone gradient
    with the CE and TV terms' summed one (None where either is zero)}, each term's gradient summed over the first
    ``batches`` batches of a trainer seeded 0 (a weight no term reaches counts as a zero gradient). ``drafter``
    has a Markov and a confidence head."""
    from dspark.training.trainer import DrafterTrainer, TrainConfig

    grads: dict[str, dict[str, torch.Tensor]] = {}
    for term in TERMS:
        kept = {k: (weights.get(k, getattr(TrainConfig, k)) if k == f"{term}_weight" else 0.0)
                for k in ("ce_weight", "tv_weight", "conf_weight")}
        cfg = TrainConfig(max_steps=batches, batch_size=batch_size, max_len=max_len, progress=False,
                          conf_stop_grad=conf_stop_grad and term == "conf", output_dir="unused", **kept)
        trainer = DrafterTrainer(target, drafter, dataset, cfg)
        drafter.zero_grad(set_to_none=True)
        for step in range(batches):
            trainer.compute_loss(step).total.backward()
        grads[term] = {part: torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double()
                                        for n, p in drafter.named_parameters() if part_of(n) == part])
                       for part in PARTS}
        drafter.zero_grad(set_to_none=True)
    norms = {term: {part: float(g.norm()) for part, g in parts.items()} for term, parts in grads.items()}
    conf, rest = grads["conf"]["backbone"], grads["ce"]["backbone"] + grads["tv"]["backbone"]
    cosine = (float(torch.nn.functional.cosine_similarity(conf, rest, dim=0))
              if float(conf.norm()) > 0 and float(rest.norm()) > 0 else None)
    return {"norms": norms, "conf_backbone_cosine": cosine}


def main(argv: list[str]) -> dict:
    from dspark.bench.script_args import out_and_options

    out, opts = out_and_options(argv, __doc__, ("data", "drafter", "batches", "batch_size", "max_len",
                                                "conf_stop_grad"), ("data",))
    if opts.get("conf_stop_grad", "false") not in ("true", "false"):
        raise SystemExit(f"conf_stop_grad: true or false, got {opts['conf_stop_grad']!r}")
    from dspark.models.drafter import DSparkDrafter
    from dspark.models.loading import load_target
    from dspark.training.data import TokenDataset
    from runners.common import resolve_drafter_path

    dataset = TokenDataset.load_many(opts["data"])  # a missing file is named before the model loads
    target, _ = load_target("smollm2")
    path = resolve_drafter_path(opts.get("drafter", "builtin:dspark-smollm2"), key="drafter")
    drafter = DSparkDrafter.load(path, target.cfg, device="cpu", dtype=torch.float32)
    if drafter.markov_head is None or drafter.confidence_head is None:
        raise SystemExit(f"drafter={path}: no Markov or no confidence head (a DFlash-style drafter); the report "
                         f"compares the confidence term's gradient with the other two's")
    torch.manual_seed(0)
    result = term_gradients(drafter, target, dataset,
                            batches=int(opts.get("batches", 3)), batch_size=int(opts.get("batch_size", 8)),
                            max_len=int(opts.get("max_len", 512)),
                            conf_stop_grad=opts.get("conf_stop_grad") == "true")
    result.update(drafter=str(path), data=opts["data"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "loss_term_gradients.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
