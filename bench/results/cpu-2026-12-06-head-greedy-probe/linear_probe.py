"""Linear probe of the DSpark drafter's confidence head on the greedy acceptance label (T=0).

Two steps:

    python linear_probe.py replay DATA.safetensors OUT.pt [max_sequences] [anchor_stride]
    python linear_probe.py fit OUT.pt [RESULTS.json]

replay: the greedy replay of runners.calibrate (replay_block_acceptance's loop: batch_size 8, max_len 1024,
anchors_per_seq=null (every stride-th response position), anchor_chunk 32, seed 0), target SmolLM2-135M and the
shipped drafter builtin:dspark-smollm2 loaded as runners.calibrate loads them (cpu, float32, temperatures reset to
1), keeping per slot the confidence head's input feats = [h_k; W1 x_{k-1}] (608 floats, captured by a pre-hook
on confidence_head while drafter.draft runs), the replay's conf_logits / accepted / draft_max_prob /
draft_top_gap, seq_index and anchor.

fit: split by sequence as runners.calibrate does (split_sequences(seq_index, 0.5, seed 0)), fit L2 logistic
regressions on the fit half's reached cells (label = the slot's greedy accepted indicator, the cells
calibration.reached_cells / conditional_auc use), report conditional_auc(...)["auc_overall"] on the report half,
with a by-sequence bootstrap (200 resamples) of the report half.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch


def replay(data_path: str, out: str, max_sequences: int | None, stride: int) -> None:
    from omegaconf import OmegaConf
    from dspark.models.drafter import DSparkDrafter
    from dspark.training.data import TokenDataset, make_batch
    from dspark.training.trainer import replay_blocks, sample_anchors, step_generator
    from runners.common import resolve_drafter_path
    from runners.train_drafter import load_target_and_tokenizer

    torch.manual_seed(0)
    t_start = time.time()
    # as runners.calibrate.run: target from cfg.model (source smollm2), drafter from the checkpoint, cpu fp32
    cfg = OmegaConf.create({"model": {"source": "smollm2", "cache_dir": None}})
    target, _ = load_target_and_tokenizer(cfg)
    target = target.to(device="cpu", dtype=torch.float32).eval()
    checkpoint = resolve_drafter_path("builtin:dspark-smollm2", key="checkpoint")
    drafter = DSparkDrafter.load(checkpoint, target.cfg, device="cpu", dtype=torch.float32).eval()
    drafter.set_confidence_temperatures([1.0] * drafter.block_size)  # raw head, as calibrate fits from
    gamma = drafter.block_size
    head_w = drafter.confidence_head.weight.detach().clone()
    head_b = drafter.confidence_head.bias.detach().clone()

    ds = TokenDataset.load_many(data_path)
    if max_sequences is not None:
        ds = ds.subset(range(min(int(max_sequences), len(ds))))
    print(f"data {data_path}: {len(ds)} sequences, {ds.num_response_tokens()} response tokens; load "
          f"{time.time() - t_start:.0f}s", flush=True)

    # capture the head's input only inside drafter.draft (forward_train also calls confidence_logits)
    store: list[torch.Tensor] = []
    state = {"in_draft": False}

    def pre_hook(module, args):
        if state["in_draft"]:
            store.append(args[0].detach().float().clone())

    drafter.confidence_head.register_forward_pre_hook(pre_hook)
    orig_draft = drafter.draft

    def draft(*args, **kwargs):
        state["in_draft"] = True
        try:
            return orig_draft(*args, **kwargs)
        finally:
            state["in_draft"] = False

    drafter.draft = draft

    batch_size, max_len, seed, chunk = 8, 1024, 0, 32
    keys = ("conf_logits", "accepted", "draft_max_prob", "draft_top_gap")
    acc = {k: [] for k in keys}
    feats_all, seq_all, anchor_all = [], [], []
    t0 = time.time()
    starts = list(range(0, len(ds), batch_size))
    with torch.no_grad():
        for i, start in enumerate(starts):
            rows = list(range(start, min(start + batch_size, len(ds))))
            batch = make_batch(ds, rows, max_len, 0)
            anchors, valid = sample_anchors(batch.lengths + 1, batch.response_starts, None, gamma,
                                            step_generator(seed, i, salt=1), require_full_block=False,
                                            stride=stride)
            if not bool(valid.any()):
                continue
            store.clear()
            o = replay_blocks(target, drafter, batch.input_ids, anchors, anchor_chunk=chunk, temperature=0.0)
            n, a = anchors.shape
            # one captured tensor per anchor chunk, [n * a_chunk, gamma, d + r], in chunk order
            parts, j = [], 0
            for f in store:
                a_c = f.shape[0] // n
                parts.append(f.view(n, a_c, gamma, -1))
                j += a_c
            assert j == a, (j, a)
            f = torch.cat(parts, dim=1)
            feats_all.append(f[valid].clone())
            for k in keys:
                acc[k].append(o[k][valid].float())
            seq_all.append(torch.tensor(rows, dtype=torch.int64)[:, None].expand(valid.shape)[valid])
            anchor_all.append(anchors[valid])
            done = sum(x.shape[0] for x in seq_all)
            print(f"batch {i + 1}/{len(starts)}: {done} blocks, {time.time() - t0:.0f}s", flush=True)
    result = {k: torch.cat(v) for k, v in acc.items()}
    result.update(feats=torch.cat(feats_all), seq_index=torch.cat(seq_all), anchor=torch.cat(anchor_all),
                  head_weight=head_w, head_bias=head_b)
    # sanity: the shipped head on the captured features reproduces the replay's conf_logits
    recomputed = (result["feats"] @ head_w.T).squeeze(-1) + head_b
    diff = (recomputed - result["conf_logits"]).abs().max().item()
    result["meta"] = json.dumps({"data": data_path, "sequences": len(ds), "anchor_stride": stride,
                                 "batch_size": batch_size, "max_len": max_len, "anchor_chunk": chunk, "seed": seed,
                                 "replay_wall_s": time.time() - t0, "total_wall_s": time.time() - t_start,
                                 "sanity_max_abs_diff": diff, "torch_threads": torch.get_num_threads()})
    print(result["meta"], flush=True)
    torch.save(result, out)


# ---------------------------------------------------------------------------------------------------- fit

def logistic_l2(x: np.ndarray, y: np.ndarray, lam: float, w0: np.ndarray | None = None,
                center: np.ndarray | None = None, free: int = 1) -> np.ndarray:
    """argmin mean logloss(sigmoid(x @ w), y) + lam/2 |w - center|^2 over all but the last ``free`` columns
    (intercept and per-position biases unpenalised); center None: 0 (plain L2). Damped Newton (d ~ 610: the
    Hessian is one x^T W x per step), to |grad| < 1e-8."""
    from scipy.special import expit

    x = np.ascontiguousarray(x, dtype=np.float64)
    n, d = x.shape
    pen = np.ones(d)
    pen[d - free:] = 0.0
    c = np.zeros(d) if center is None else np.asarray(center, dtype=np.float64)
    w = (c.copy() if w0 is None else np.asarray(w0, dtype=np.float64).copy())

    def obj(w):
        s = x @ w
        dw = pen * (w - c)
        return (np.logaddexp(0.0, s) - y * s).mean() + 0.5 * lam * (dw * dw).sum(), s

    f, s = obj(w)
    for _ in range(100):
        q = expit(s)
        grad = x.T @ (q - y) / n + lam * pen * (w - c)
        if np.abs(grad).max() < 1e-8:
            break
        h = (x * (q * (1 - q))[:, None]).T @ x / n
        h[np.diag_indices(d)] += lam * pen + 1e-10
        step = np.linalg.solve(h, grad)
        t = 1.0
        while True:  # backtracking (Armijo)
            f_new, s_new = obj(w - t * step)
            if f_new <= f - 1e-4 * t * (grad @ step) or t < 1e-8:
                break
            t *= 0.5
        w, f, s = w - t * step, f_new, s_new
        if t * np.abs(step).max() < 1e-10:
            break
    return w


def fit(path: str, out_json: str | None) -> None:
    from dspark.training.calibration import conditional_auc, reached_cells, split_sequences

    t0 = time.time()
    r = torch.load(path, map_location="cpu", weights_only=True)
    meta = json.loads(r["meta"])
    feats, z = r["feats"].double(), r["conf_logits"].double()
    a, seq = r["accepted"].double(), r["seq_index"]
    maxp, gap = r["draft_max_prob"].double(), r["draft_top_gap"].double()
    m, g, d = feats.shape
    fit_m, rep_m = split_sequences(seq, 0.5, 0)  # runners.calibrate: fit_fraction=0.5, split_seed = seed = 0
    reached = reached_cells(a)

    # design matrices: standardised features (fit-half reached cells' mean/std), intercept last
    fr = fit_m[:, None] & reached
    mu = feats[fr].mean(0)
    sd = feats[fr].std(0).clamp_min(1e-6)
    xs = (feats - mu) / sd
    pos_onehot = torch.eye(g, dtype=torch.float64).expand(m, g, g)
    gap_mu, gap_sd = gap[fr].mean(), gap[fr].std()
    gs = ((gap - gap_mu) / gap_sd)[..., None]
    ones = torch.ones(m, g, 1, dtype=torch.float64)
    # the shipped head in these coordinates: z = (w_s * sd) . xs + (w_s . mu + b_s)
    w_s, b_s = r["head_weight"].double().reshape(-1), float(r["head_bias"].double().reshape(-1)[0])
    ship_feat = (w_s * sd).numpy()
    ship_int = float(w_s @ mu) + b_s
    zero = np.zeros
    # name: (design [M, G, p], number of unpenalised trailing columns, L2 centre or None, lambda grid)
    plain = [3.0, 1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001]   # descending: each fit warm-starts from the previous
    anch = [100.0, 10.0, 1.0, 0.1, 0.01]
    # the gap, the per-position biases and the intercept are trailing columns and go unpenalised
    designs = {
        "refit": (torch.cat([xs, ones], -1), 1, None, plain),
        "refit+pos": (torch.cat([xs, pos_onehot[..., 1:], ones], -1), g, None, plain),
        "refit+gap": (torch.cat([xs, gs, ones], -1), 2, None, plain),
        "refit+gap+pos": (torch.cat([xs, gs, pos_onehot[..., 1:], ones], -1), g + 1, None, plain),
        # pulled towards the shipped head's weights instead of towards 0 (lam -> inf: shipped head + pos bias)
        "anchored+pos": (torch.cat([xs, pos_onehot[..., 1:], ones], -1), g,
                         np.concatenate([ship_feat, zero(g - 1), [ship_int]]), anch),
        "anchored+gap+pos": (torch.cat([xs, gs, pos_onehot[..., 1:], ones], -1), g + 1,
                             np.concatenate([ship_feat, [0.0], zero(g - 1), [ship_int]]), anch),
    }

    def score_of(design: torch.Tensor, w: np.ndarray) -> torch.Tensor:
        return design @ torch.as_tensor(w)

    # lam chosen by 2-fold by-sequence CV inside the fit half (pooled reached-cell AUC, as auc_overall), then the
    # chosen lam refitted on the whole fit half; the report half is touched only for the final numbers
    fit_seqs = torch.unique(seq[fit_m])
    folds = fit_seqs[torch.randperm(fit_seqs.numel(), generator=torch.Generator().manual_seed(1))].chunk(2)
    cv, fitted = {}, {}
    for name, (X, free, center, lams) in designs.items():
        cv[name] = {}
        warm = {}
        for lam in lams:
            aucs = []
            for fi, fold in enumerate(folds):
                val = torch.isin(seq, fold)
                cells = (fit_m & ~val)[:, None] & reached
                w = logistic_l2(X[cells].numpy(), a[cells].numpy(), lam, w0=warm.get(fi), center=center, free=free)
                warm[fi] = w
                aucs.append(conditional_auc(score_of(X[val], w), a[val])["auc_overall"])
            cv[name][lam] = float(np.mean(aucs))
            print(f"cv {name} lam={lam:g}: {cv[name][lam]:.4f} ({time.time() - t0:.0f}s)", flush=True)
        best = max(cv[name], key=cv[name].get)
        cells = fit_m[:, None] & reached
        w = logistic_l2(X[cells].numpy(), a[cells].numpy(), best, center=center, free=free)
        fitted[name] = {"lam": best, "w": w, "score": score_of(X, w)}

    # the shipped head with a per-position bias (and scale) only: a 1-D recalibration, pooled AUC can change
    cells = fit_m[:, None] & reached
    zpos = torch.cat([z[..., None], pos_onehot[..., 1:], ones], -1)
    wz = logistic_l2(zpos[cells].numpy(), a[cells].numpy(), 0.0, free=zpos.shape[-1])
    # shipped head + gap + per-position bias (pooled analogue of sts_top_gap, which fits per position)
    zgap = torch.cat([z[..., None], gs, pos_onehot[..., 1:], ones], -1)
    wzg = logistic_l2(zgap[cells].numpy(), a[cells].numpy(), 0.0, free=zgap.shape[-1])

    # optimistic ceiling of a linear head: fitted on the report half itself and scored there (in sample)
    ceiling = {}
    rep_cells_ = rep_m[:, None] & reached
    for name, lam in (("refit+pos", 1e-3), ("refit+gap+pos", 1e-3)):
        X, free, center, _ = designs[name]
        w = logistic_l2(X[rep_cells_].numpy(), a[rep_cells_].numpy(), lam, center=center, free=free)
        ceiling[name] = conditional_auc(score_of(X[rep_m], w), a[rep_m])["auc_overall"]
        print(f"ceiling (in-sample on report half) {name} lam={lam:g}: {ceiling[name]:.4f}", flush=True)

    scores = {
        "shipped head (raw logit z)": z,
        "shipped head, scale + per-position bias": score_of(zpos, wz),
        "drafter max prob": maxp,
        "drafter top-2 gap": gap,
        "shipped head + gap + pos bias": score_of(zgap, wzg),
        "(a) refit linear head, L2": fitted["refit"]["score"],
        "(b) refit linear head + pos bias, L2": fitted["refit+pos"]["score"],
        "refit head + gap, L2": fitted["refit+gap"]["score"],
        "refit head + gap + pos bias, L2": fitted["refit+gap+pos"]["score"],
        "refit head + pos bias, pulled to shipped": fitted["anchored+pos"]["score"],
        "refit head + gap + pos bias, pulled to shipped": fitted["anchored+gap+pos"]["score"],
    }
    rep_seqs = torch.unique(seq[rep_m])
    table = {}
    for name, s in scores.items():
        table[name] = {"out_of_sample": conditional_auc(s[rep_m], a[rep_m])["auc_overall"],
                       "in_sample": conditional_auc(s[fit_m], a[fit_m])["auc_overall"]}

    # by-sequence bootstrap of the report half: resample sequences with replacement, weight cells by multiplicity
    rep_cells = rep_m[:, None] & reached
    cell_seq = seq[:, None].expand(m, g)[rep_cells].numpy()
    cell_y = a[rep_cells].numpy()
    seq_pos = {int(s): k for k, s in enumerate(rep_seqs)}
    cell_k = np.array([seq_pos[int(s)] for s in cell_seq])
    cell_scores = {name: s[rep_cells].numpy() for name, s in scores.items()}

    def tie_groups(s: np.ndarray):
        order = np.argsort(s, kind="mergesort")
        _, idx = np.unique(s[order], return_index=True)
        return order, idx

    groups = {name: tie_groups(cs) for name, cs in cell_scores.items()}

    def weighted_auc(name: str, y: np.ndarray, wts: np.ndarray) -> float:
        """Mann-Whitney AUC with cell weights (a resampled sequence's cells count as often as it was drawn);
        ties count one half, as roc_auc's average ranks do."""
        order, idx = groups[name]
        yy, ww = y[order], wts[order]
        wp = np.add.reduceat(ww * yy, idx)
        wn = np.add.reduceat(ww * (1 - yy), idx)
        neg_below = np.cumsum(wn) - wn
        return float((wp * (neg_below + 0.5 * wn)).sum() / (wp.sum() * wn.sum()))

    rng = np.random.default_rng(0)
    n_rep = rep_seqs.numel()
    boot = {name: [] for name in scores}
    for _ in range(200):
        mult = np.bincount(rng.integers(0, n_rep, n_rep), minlength=n_rep).astype(np.float64)
        wts = mult[cell_k]
        for name in scores:
            boot[name].append(weighted_auc(name, cell_y, wts))
    for name in scores:
        b = np.array(boot[name])
        table[name]["ci95"] = [float(np.percentile(b, 2.5)), float(np.percentile(b, 97.5))]
        # check: weighted AUC with unit weights equals conditional_auc's
        table[name]["check_unit_weights"] = weighted_auc(name, cell_y, np.ones_like(cell_y))
        d_ = b - np.array(boot["shipped head (raw logit z)"])
        table[name]["diff_vs_shipped"] = table[name]["out_of_sample"] - table["shipped head (raw logit z)"][
            "out_of_sample"]
        table[name]["diff_ci95"] = [float(np.percentile(d_, 2.5)), float(np.percentile(d_, 97.5))]

    sizes = {
        "sequences": int(torch.unique(seq).numel()), "fit_sequences": int(torch.unique(seq[fit_m]).numel()),
        "report_sequences": int(n_rep), "blocks": m, "fit_blocks": int(fit_m.sum()), "report_blocks": int(rep_m.sum()),
        "slots": m * g, "reached_cells": int(reached.sum()), "fit_reached_cells": int((fit_m[:, None] & reached).sum()),
        "report_reached_cells": int(rep_cells.sum()),
        "accept_rate_all_slots": float(a.mean()), "accept_rate_reached_cells": float(a[reached].mean()),
        "mean_accept_length": float((torch.cumprod(a, -1).sum(-1) + 1).mean()),
        "acceptance_per_position_reached": [float(a[reached[:, k], k].mean()) for k in range(g)],
    }
    report = {"meta": meta, "sizes": sizes, "table": table, "cv_auc": {k: {str(l): v for l, v in d_.items()}
                                                                        for k, d_ in cv.items()},
              "chosen_lam": {k: v["lam"] for k, v in fitted.items()},
              "ceiling_in_sample_on_report_half": ceiling, "fit_wall_s": time.time() - t0}
    print(json.dumps(report, indent=1))
    if out_json:
        with open(out_json, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "replay":
        replay(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] != "all" else None,
               int(sys.argv[5]) if len(sys.argv) > 5 else 2)
    elif sys.argv[1] == "fit":
        fit(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        raise SystemExit(__doc__)
