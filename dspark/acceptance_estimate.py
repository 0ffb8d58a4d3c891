"""An acceptance estimate without the confidence head: the drafter's own top-token probability at each
block slot, calibrated online against the acceptances the engine observes.

``engine.acceptance_estimate=draft_max_prob`` replaces the confidence head's conditional acceptance
c_k with ``table[k, bin(p_k)]``, where p_k is the largest probability of the drafter's processed
distribution at slot k (the probability of the token it drafts when greedy) and ``bin`` splits [0, 1]
into equal bins. The table starts at each bin's centre (the drafter taken at its word) and moves to
the observed rate: after every committed step, each tested slot j of a row counts as accepted (j < k,
the row's accepted drafts) or rejected (j == k < window); slots past the window are untested and
count for nothing. Each cell is a beta-binomial mean with ``prior_weight`` pseudo-observations at the
bin centre, so a cell with few observations stays near the drafter's word.

The survival the planner reads is the product of these estimates over the slots, like the head's. The
counts live on the host (one engine's, never shared); the table is a device buffer the step reads, so
a captured step picks up each update at its next replay. An A/B of ``head`` against ``draft_max_prob``
answers whether the trained head earns its place.
"""

from __future__ import annotations

import numpy as np
import torch

ESTIMATES = ("head", "draft_max_prob")


def verified_outcomes(windows, accepted, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(tested, hit), bool [rows, block_size], of verified rows with these ``windows`` and ``accepted`` drafts: slot
    j (0-based) is tested when every earlier draft was accepted and j is inside the window (j < min(accepted + 1,
    window)), and a hit when it was accepted (j < accepted). Slots past the window, or after a rejection, are
    untested."""
    w = np.asarray(windows, dtype=np.int64)[:, None]
    k = np.asarray(accepted, dtype=np.int64)[:, None]
    slot = np.arange(block_size)[None, :]
    return slot < np.minimum(k + 1, w), slot < k


def conditional_confidence(survival: np.ndarray) -> np.ndarray:
    """Per-position conditional confidence c_k = S_k / S_{k-1} from prefix survival S [rows, G] (S_0 = 1); 0 where
    S_{k-1} is 0."""
    survival = np.asarray(survival, dtype=np.float64)
    prev = np.concatenate([np.ones((survival.shape[0], 1)), survival[:, :-1]], axis=1)
    return np.divide(survival, prev, out=np.zeros_like(survival), where=prev > 0)


class OnlineAcceptanceEstimate:
    """Per (block slot, max-probability bin) counts of tested and accepted drafts, and the table of
    conditional acceptance estimates they give."""

    def __init__(self, block_size: int, num_bins: int = 10, prior_weight: float = 4.0):
        if block_size < 1 or num_bins < 1 or prior_weight <= 0:
            raise ValueError(f"block_size {block_size}, num_bins {num_bins} and prior_weight {prior_weight} "
                             "must be positive")
        self.block_size = int(block_size)
        self.num_bins = int(num_bins)
        self.prior_weight = float(prior_weight)
        self.centres = (np.arange(self.num_bins) + 0.5) / self.num_bins
        self.tested = np.zeros((self.block_size, self.num_bins))
        self.accepted = np.zeros((self.block_size, self.num_bins))

    def bins(self, max_prob: np.ndarray) -> np.ndarray:
        """The bin of each probability (the last bin closed at 1)."""
        return np.clip((np.asarray(max_prob, dtype=np.float64) * self.num_bins).astype(np.int64), 0, self.num_bins - 1)

    def update(self, max_prob: np.ndarray, windows, accepted) -> None:
        """Count one step's rows: ``max_prob`` [rows, G] of the block each row verified, its window and its
        accepted drafts."""
        max_prob = np.asarray(max_prob, dtype=np.float64)
        if max_prob.ndim != 2 or max_prob.shape[1] != self.block_size:
            raise ValueError(f"max_prob must be [rows, {self.block_size}], got {max_prob.shape}")
        tested, hit = verified_outcomes(windows, accepted, self.block_size)
        b = self.bins(max_prob)
        rows_slots = np.broadcast_to(np.arange(self.block_size)[None, :], b.shape)
        np.add.at(self.tested, (rows_slots[tested], b[tested]), 1.0)
        np.add.at(self.accepted, (rows_slots[hit], b[hit]), 1.0)

    def table(self) -> np.ndarray:
        """[G, bins] conditional acceptance estimates: (accepted + a * centre) / (tested + a)."""
        a = self.prior_weight
        return (self.accepted + a * self.centres[None, :]) / (self.tested + a)

    def reset(self) -> None:
        self.tested[:] = 0.0
        self.accepted[:] = 0.0


def estimated_confidence(max_prob: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Conditional acceptance per slot from the drafter's top probabilities [R, G] and the table [G, bins]
    (device tensors; capture-safe: no host read)."""
    G, nb = table.shape
    b = (max_prob.float() * nb).long().clamp(0, nb - 1)  # [R, G]
    return table.gather(1, b.t()).t() if b.shape[0] else max_prob.float()
