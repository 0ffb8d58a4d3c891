"""Does the previous block's accept length (known to the engine before it drafts) add ranking power to the head?
Per-position logistic fusion fitted on half of the sequences, reported on the other half (conditional AUC over
reached cells), with a by-sequence bootstrap interval.

    python fit_context.py FEATURES.pt      # FEATURES.pt: replay_features.py with replay_features.diff applied
"""
import sys
import numpy as np
import torch
from scipy.optimize import minimize
from scipy.special import expit
from dspark.training.calibration import reached_cells, roc_auc

d = torch.load(sys.argv[1])
conf, acc, maxp = d["conf"].double(), d["acc"].double(), d["maxp"].double()
seq, anchor, top2 = d["seq"], d["anchor"], d["top2_logits"].double()
M, G = conf.shape
reached = reached_cells(acc.bool() if acc.dtype == torch.bool else acc)
lead = torch.cumprod(acc, 1).sum(1)  # leading accepted slots of each block
prev = torch.full((M,), float("nan"), dtype=torch.float64)
same = (seq[1:] == seq[:-1]) & (anchor[1:] > anchor[:-1])
prev[1:][same] = lead[:-1][same]
has_prev = ~torch.isnan(prev)
print(f"blocks {M}, with a previous block {int(has_prev.sum())}, reached cells {int(reached.sum())}, "
      f"accept rate {float(acc[reached].mean()):.3f}, mean accept length {float(lead.mean() + 1):.3f}")
prev_f = torch.where(has_prev, prev, lead.mean())  # the first block of a sequence: the mean
gap = top2[..., 0] - top2[..., 1]
rng = np.random.default_rng(0)
seqs = np.unique(seq.numpy()); rng.shuffle(seqs)
fit_set = set(seqs[: len(seqs) // 2].tolist())
is_fit = torch.tensor([int(s) in fit_set for s in seq.tolist()])
fit_m, rep_m = reached & is_fit[:, None], reached & ~is_fit[:, None]


def fuse(*feats):
    """per position: logistic regression on the features (each [M, G]) by maximum likelihood (scipy's L-BFGS-B);
    returns the fitted logit [M, G]."""
    out = torch.zeros(M, G, dtype=torch.float64)
    for k in range(G):
        X = torch.stack([f[:, k] for f in feats], -1).numpy()
        m = fit_m[:, k].numpy()
        Z = np.column_stack([(X - X[m].mean(0)) / (X[m].std(0) + 1e-9), np.ones(M)])  # standardised, intercept
        Zf, y = Z[m], acc[:, k].numpy()[m]

        def nll(theta):
            t = Zf @ theta
            return float(np.sum(np.logaddexp(0.0, t) - y * t)), Zf.T @ (expit(t) - y)
        theta = minimize(nll, np.zeros(Z.shape[1]), jac=True, method="L-BFGS-B").x
        out[:, k] = torch.from_numpy(Z @ theta)
    return out


def auc(score, m, a=None):
    a = acc if a is None else a
    return float(roc_auc(score[m], a[m]))


def boot(score, m, n=300):
    s = seq.numpy(); keys = np.unique(s[m.any(1).numpy()])
    rows = {u: np.where(s == u)[0] for u in keys}
    out = []
    for _ in range(n):
        pick = np.concatenate([rows[k] for k in rng.choice(keys, len(keys))])
        out.append(auc(score[pick], m[pick], acc[pick]))
    return np.percentile(out, [2.5, 97.5])


P = prev_f[:, None].expand(M, G)
scores = {
    "head (raw)": conf,
    "head, per-position calibration": fuse(conf),
    "previous block's accept length alone": fuse(P),
    "head + previous accept length": fuse(conf, P),
    "head + top-2 logit gap": fuse(conf, gap),
    "head + top-2 gap + previous accept length": fuse(conf, gap, P),
    "head + max prob (sts_max_prob's terms)": fuse(conf, torch.logit(maxp.clamp(1e-6, 1 - 1e-6))),
    "head + max prob + previous accept length": fuse(conf, torch.logit(maxp.clamp(1e-6, 1 - 1e-6)), P),
}
print(f"{'score':45} {'fit half':>8} {'report half':>11}  95% CI")
for name, s in scores.items():
    lo, hi = boot(s, rep_m)
    print(f"{name:45} {auc(s, fit_m):8.3f} {auc(s, rep_m):11.3f}  {lo:.3f}-{hi:.3f}")
