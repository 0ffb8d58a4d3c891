"""Does the confidence head rank greedy acceptance better when it learns the greedy label? The shipped head refitted
on training-split blocks (replay_features.py of a train-split data file), once on the greedy label (the target's
top token equals the draft) and once on the analytical label it was trained on (sum_v min(p_d, p_t)), by the same
procedure: a pull towards the shipped weights (lam * |w - w0|^2 / 2) and a bias per position, over the reached
cells. Both are scored on held-out blocks (another replay_features.py file) against the greedy label, with a
by-sequence bootstrap interval.

    python fit_labels.py TRAIN_FEATURES.pt HELDOUT_FEATURES.pt
"""
import sys

import numpy as np
import torch

from dspark.models.drafter import DSparkDrafter
from dspark.models.loading import load_target_weights
from dspark.training.calibration import roc_auc
from runners.common import resolve_drafter_path


def load(path):
    d = torch.load(path)
    acc = d["acc"]
    reached = torch.cat([torch.ones(len(acc), 1), torch.cumprod(acc, 1)[:, :-1]], 1).bool()
    return d, reached


train, train_reached = load(sys.argv[1])
held, held_reached = load(sys.argv[2])
G = train["acc"].shape[1]
mcfg, _, _ = load_target_weights("smollm2")
drafter = DSparkDrafter.load(resolve_drafter_path("builtin:dspark-smollm2", key="checkpoint"), mcfg)
w0 = drafter.confidence_head.weight.detach().double().squeeze(0)
b0 = drafter.confidence_head.bias.detach().double().squeeze(0)
pos_train = torch.arange(G).expand(train["acc"].shape)[train_reached]
X = train["feats"][train_reached].double()
labels = {"greedy": train["acc"][train_reached].double(), "analytical": train["analytical"][train_reached].double()}
print(f"fit: {len(train['acc'])} blocks, {len(X)} reached cells, greedy label mean "
      f"{float(labels['greedy'].mean()):.3f}, analytical label mean {float(labels['analytical'].mean()):.3f}")
print(f"held out: {len(held['acc'])} blocks, {int(held_reached.sum())} reached cells")
rng = np.random.default_rng(0)
seq = held["seq"].numpy()
rows_of = {u: np.where(seq == u)[0] for u in np.unique(seq)}


def score_heldout(w, b, pb):
    with torch.no_grad():
        s = (held["feats"].double() @ w + b + pb[torch.arange(G)]).float()
    y, x = held["acc"][held_reached], s[held_reached]
    point = roc_auc(x.double(), y.double())
    boots = []
    keys = list(rows_of)
    for _ in range(200):
        pick = np.concatenate([rows_of[k] for k in rng.choice(keys, len(keys))])
        m = held_reached[pick]
        boots.append(roc_auc(s[pick][m].double(), held["acc"][pick][m].double()))
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return point, lo, hi


print(f"the shipped head: held-out AUC {score_heldout(w0, b0, torch.zeros(G, dtype=torch.float64))[0]:.3f}")
for lam in (1e3, 1e2, 10.0, 1.0):
    for name, y in labels.items():
        w, b = w0.clone().requires_grad_(True), b0.clone().requires_grad_(True)
        pb = torch.zeros(G, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([w, b, pb], max_iter=300, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            nll = torch.nn.functional.binary_cross_entropy_with_logits(X @ w + b + pb[pos_train], y, reduction="sum")
            loss = nll + 0.5 * lam * ((w - w0) ** 2).sum()
            loss.backward()
            return loss
        opt.step(closure)
        point, lo, hi = score_heldout(w.detach(), b.detach(), pb.detach())
        print(f"lam={lam:g} {name:10s} label: held-out AUC {point:.3f} ({lo:.3f}-{hi:.3f})")
