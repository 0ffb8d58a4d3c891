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

from dspark.training.calibration import reached_cells, roc_auc
from refit import anchored_refit, shipped_head


def load(path):
    d = torch.load(path)
    return d, reached_cells(d["acc"])


train, train_reached = load(sys.argv[1])
held, held_reached = load(sys.argv[2])
G = train["acc"].shape[1]
w0, b0 = shipped_head()
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
        point, lo, hi = score_heldout(*anchored_refit(X, y, pos_train, w0, b0, lam, G))
        print(f"lam={lam:g} {name:10s} label: held-out AUC {point:.3f} ({lo:.3f}-{hi:.3f})")
