"""An MLP confidence head on the head's inputs [h_k; W1 x_(k-1)] plus the position, trained on the training-split
reached cells (greedy or analytical label), scored on the held-out reached cells against the greedy label.

    python fit_mlp_labels.py TRAIN_FEATURES.pt HELDOUT_FEATURES.pt
"""
import sys

import torch

from dspark.training.calibration import reached_cells, roc_auc

G = 7


def load(path):
    d = torch.load(path)
    acc = d["acc"]
    reached = reached_cells(acc)
    pos = torch.nn.functional.one_hot(torch.arange(G).expand(acc.shape), G).float()
    return d, reached, torch.cat([d["feats"].float(), pos], -1)[reached]


train, train_reached, Xt = load(sys.argv[1])
held, held_reached, Xh = load(sys.argv[2])
mu, sd = Xt.mean(0), Xt.std(0) + 1e-4
Xt, Xh = (Xt - mu) / sd, (Xh - mu) / sd
yh = held["acc"][held_reached]
for label in ("greedy", "analytical"):
    yt = (train["acc"] if label == "greedy" else train["analytical"])[train_reached]
    for hidden, wd, epochs in ((64, 1e-2, 8), (256, 1e-2, 8), (256, 1e-1, 15)):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(Xt.shape[1], hidden), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                  torch.nn.Linear(hidden, 1))
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=wd)
        for ep in range(epochs):
            net.train()
            perm = torch.randperm(len(yt))
            for i in range(0, len(yt), 512):
                b = perm[i:i + 512]
                loss = torch.nn.functional.binary_cross_entropy_with_logits(net(Xt[b]).squeeze(-1), yt[b])
                opt.zero_grad()
                loss.backward()
                opt.step()
            if ep in (epochs // 2, epochs - 1):
                net.eval()
                with torch.no_grad():
                    held_auc = roc_auc(net(Xh).squeeze(-1).double(), yh.double())
                print(f"{label:10s} label, MLP {hidden} hidden, weight decay {wd:g}, epoch {ep + 1}: "
                      f"held-out AUC {held_auc:.3f}", flush=True)
