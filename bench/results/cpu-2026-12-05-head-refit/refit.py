"""What fit_heads.py and fit_labels.py share: the shipped confidence head's weights, and its refit pulled towards
them (lam * |w - w0|^2 / 2) with a bias per block position, by L-BFGS on the summed logistic loss."""
import torch

from dspark.models.drafter import DSparkDrafter
from dspark.models.loading import load_target_weights
from runners.common import resolve_drafter_path


def shipped_head():
    """(w0, b0) of the shipped drafter's confidence head, float64."""
    mcfg, _, _ = load_target_weights("smollm2")
    drafter = DSparkDrafter.load(resolve_drafter_path("builtin:dspark-smollm2", key="checkpoint"), mcfg)
    return (drafter.confidence_head.weight.detach().double().squeeze(0),
            drafter.confidence_head.bias.detach().double().squeeze(0))


def anchored_refit(X, y, pos, w0, b0, lam, G):
    """(w, b, pb) minimising the logistic loss of X @ w + b + pb[pos] against y plus lam * |w - w0|^2 / 2; X [N, D]
    and y [N] float64, pos [N] the cells' block positions (0..G-1). Starts from (w0, b0, 0)."""
    w, b = w0.clone().requires_grad_(True), b0.clone().requires_grad_(True)
    pb = torch.zeros(G, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b, pb], max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        nll = torch.nn.functional.binary_cross_entropy_with_logits(X @ w + b + pb[pos], y, reduction="sum")
        loss = nll + 0.5 * lam * ((w - w0) ** 2).sum()
        loss.backward()
        return loss
    opt.step(closure)
    return w.detach(), b.detach(), pb.detach()
