"""Out-of-sample AUC of acceptance scores on the blocks replay_features.py kept: the shipped head, the drafter's top
probability, their per-position logistic fusion (what runners.calibrate method=sts_max_prob fits), the drafter's
top logit and the gap between its two largest logits (alone and fused with the head the same way), heads refitted
on the head's own inputs (L2 logistic regression, a one-hidden-layer MLP), with and without the two scores, and the
shipped head refitted with a pull towards its own weights (lam * |w - w0|^2 / 2, and a bias per position).
Sequences are split in halves (seeded): fitted on one, reported on the other with a by-sequence bootstrap interval.

    python fit_heads.py FEATURES.pt
"""
import sys
import numpy as np
import torch
from dspark.training.calibration import reached_cells, roc_auc as _roc


def roc_auc_score(y, x):
    return _roc(torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64))

d = torch.load(sys.argv[1])
feats, conf, acc, maxp, seq = d["feats"].float(), d["conf"], d["acc"], d["maxp"], d["seq"]
M, G, D = feats.shape
reached = reached_cells(acc)
print(f"blocks {M}, reached cells {int(reached.sum())}, accept rate {float(acc[reached].mean()):.3f}, "
      f"mean accept length {float(torch.cumprod(acc, 1).sum(1).mean() + 1):.3f}")
rng = np.random.default_rng(0)
seqs = np.unique(seq.numpy())
rng.shuffle(seqs)
fit_seqs = set(seqs[: len(seqs) // 2].tolist())
is_fit = torch.tensor([int(s) in fit_seqs for s in seq.tolist()])
pos = torch.arange(G).expand(M, G)


def cells(mask_rows):
    m = reached & mask_rows[:, None]
    return m


fit_m, rep_m = cells(is_fit), cells(~is_fit)
lp = torch.logit(maxp.clamp(1e-6, 1 - 1e-6))


def auc(score, m):
    return roc_auc_score(acc[m].numpy(), score[m].numpy())


def boot(score, m, n=200):
    s = seq.numpy()
    rows = {u: np.where((s == u))[0] for u in np.unique(s[m.any(1).numpy()])}
    keys = list(rows)
    out = []
    for _ in range(n):
        pick = np.concatenate([rows[k] for k in rng.choice(keys, len(keys))])
        mm = m[pick]
        y, x = acc[pick][mm].numpy(), score[pick][mm].numpy()
        if y.min() != y.max():
            out.append(roc_auc_score(y, x))
    return np.percentile(out, [2.5, 97.5])


res = {}
res["head (shipped, raw z)"] = conf
res["draft max prob"] = maxp
onehot = torch.nn.functional.one_hot(pos, G).float()


def design(*parts):
    return torch.cat(parts, -1)


def logreg(X, C=1.0):
    Xf, yf = X[fit_m].double(), acc[fit_m].double()
    mu, sd = Xf.mean(0), Xf.std(0) + 1e-6
    Z = (Xf - mu) / sd
    w = torch.zeros(Z.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        nll = torch.nn.functional.binary_cross_entropy_with_logits(Z @ w + b, yf, reduction="sum")
        loss = nll + 0.5 / C * (w * w).sum()
        loss.backward()
        return loss
    opt.step(closure)
    with torch.no_grad():
        return (((X.double() - mu) / sd) @ w + b).float()


res["sts_max_prob-like: [z, logit p] x position"] = logreg(design(conf[..., None] * onehot, lp[..., None] * onehot,
                                                                    onehot))
top2 = d["top2_logits"]  # the drafter's two largest logits per slot: no softmax over the vocabulary needed
gap = top2[..., 0] - top2[..., 1]
res["draft top logit"] = top2[..., 0]
res["draft top-2 logit gap"] = gap
res["[z, top logit] x position"] = logreg(design(conf[..., None] * onehot, top2[..., 0, None] * onehot, onehot))
res["[z, top-2 gap] x position"] = logreg(design(conf[..., None] * onehot, gap[..., None] * onehot, onehot))
for C in (0.01, 0.1):
    res[f"linear refit on feats (C={C})"] = logreg(design(feats, onehot), C)
    res[f"linear refit on feats + z + logit p (C={C})"] = logreg(design(feats, conf[..., None], lp[..., None],
                                                                        onehot), C)


def mlp(X, hidden=128, epochs=60, wd=1e-3, seed=0):
    torch.manual_seed(seed)
    Xf, yf = X[fit_m], acc[fit_m]
    mu, sd = Xf.mean(0), Xf.std(0) + 1e-4
    net = torch.nn.Sequential(torch.nn.Linear(X.shape[-1], hidden), torch.nn.GELU(), torch.nn.Linear(hidden, 1))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=wd)
    n = len(yf)
    for ep in range(epochs):
        perm = torch.randperm(n)
        for i in range(0, n, 256):
            b = perm[i: i + 256]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(net((Xf[b] - mu) / sd).squeeze(-1), yf[b])
            opt.zero_grad(); loss.backward(); opt.step()
    with torch.no_grad():
        return net((X - mu) / sd).squeeze(-1)


for ep in (20, 60):
    res[f"MLP on feats ({ep} ep)"] = mlp(design(feats, onehot), epochs=ep)
    res[f"MLP on feats + z + logit p ({ep} ep)"] = mlp(design(feats, conf[..., None], lp[..., None], onehot), epochs=ep)
def warm_refit(lam):
    """The shipped head's weights w0, b0 refitted on the fit half, pulled towards w0, plus a bias per position."""
    from refit import anchored_refit, shipped_head

    w0, b0 = shipped_head()
    assert float(((feats.double() @ w0 + b0).float() - conf).abs().max()) < 1e-2  # the kept inputs give the head
    w, b, pb = anchored_refit(feats[fit_m].double(), acc[fit_m].double(), pos[fit_m], w0, b0, lam, G)
    return (feats.double() @ w + b + pb[pos]).float()


for lam in (1e4, 1e3, 1e2, 10.0):
    res[f"the shipped head refitted, pulled to it (lam={lam:g})"] = warm_refit(lam)
for name, s in res.items():
    lo, hi = boot(s, rep_m)
    print(f"{name:50s} fit {auc(s, fit_m):.3f}  report {auc(s, rep_m):.3f} ({lo:.3f}-{hi:.3f})")
