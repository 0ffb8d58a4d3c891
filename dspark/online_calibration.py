"""The confidence head's calibration corrected in service (``engine.online_calibration``).

The head's calibration (a temperature and a bias per block position, ``temperatures.json``) is fitted offline on
held-out text of a few sources. On other traffic it can be over- or under-confident: on agentic requests the
shipped head's survival predicted about 10% more accepted tokens than the rows accepted. The planner then values
the tail of a block too highly (or too little) and trims less (or more) than the acceptances ask for.

This estimate adds one logit offset per block position, ``c_k = sigmoid(z_k / T_k + b_k + offset_k)``, learnt from
the acceptances the engine observes. A committed step gives, for each verified row, the conditional confidence
``c_k = S_k / S_{k-1}`` its survival ``S`` held (offsets included) and the outcome of each position the
verification tested: position k (1-based) is tested when k <= the row's window and every earlier draft was
accepted (k <= accepted + 1), and accepted when k <= accepted. Untested positions count for nothing, so trimming
does not bias the estimate. Over ``refit_every`` steps the gradient ``sum(y - c)`` and curvature
``sum(c (1 - c))`` of the tested positions' log-likelihood in the offset are summed, and each position's offset
takes one Newton step (at most ``max_step`` in logit, the offset within ``+-max_offset``).

Only the planner's windows read the survival, never the tokens, so the correction cannot change an output; and a
step's offsets come from earlier steps' acceptances only, so a sampled request's window never depends on its own
verification (the non-anticipation guarantee). The counts live on the host (one engine's); the offsets are a
device buffer the draft stage reads, so a captured step picks up each refit at its next replay.
"""

from __future__ import annotations

import numpy as np

from dspark.acceptance_estimate import conditional_confidence, verified_outcomes


class OnlineHeadCalibration:
    """Per-position logit offsets on the head's calibrated confidence, refitted from observed acceptance.

    A step's rows are queued (a copy of the survival, windows and accepted counts: a few microseconds on the
    host's commit) and counted together when a refit or the counters need them."""

    def __init__(self, block_size: int, refit_every: int = 16, max_step: float = 0.5, max_offset: float = 3.0):
        if block_size < 1 or refit_every < 1 or max_step <= 0 or max_offset <= 0:
            raise ValueError(f"block_size {block_size} and refit_every {refit_every} must be >= 1, max_step "
                             f"{max_step} and max_offset {max_offset} positive")
        self.block_size = int(block_size)
        self.refit_every = int(refit_every)
        self.max_step = float(max_step)
        self.max_offset = float(max_offset)
        self.offsets = np.zeros(self.block_size)
        self._grad = np.zeros(self.block_size)
        self._curv = np.zeros(self.block_size)
        self._steps = 0  # steps counted since the last refit
        self._queued: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.refits = 0
        self._tested = np.zeros(self.block_size, dtype=np.int64)  # tested positions counted since reset_counts
        self._accepted = np.zeros(self.block_size, dtype=np.int64)
        self._predicted = np.zeros(self.block_size)  # their summed conditional confidence, as the steps saw it

    def reset_counts(self) -> None:
        """Start the counts the counters report (refits, tested positions); the offsets and the sums towards the
        next refit stay (an engine's reset between a run's blocks)."""
        self._count_queued()
        self.refits = 0
        self._tested[:] = 0
        self._accepted[:] = 0
        self._predicted[:] = 0.0

    @property
    def tested(self) -> np.ndarray:
        """Tested positions per block position since :meth:`reset_counts`."""
        self._count_queued()
        return self._tested

    @property
    def accepted(self) -> np.ndarray:
        """Accepted tested positions per block position since :meth:`reset_counts`."""
        self._count_queued()
        return self._accepted

    @property
    def predicted(self) -> np.ndarray:
        """The tested positions' summed conditional confidence per block position since :meth:`reset_counts`."""
        self._count_queued()
        return self._predicted

    def update(self, survival: np.ndarray, windows, accepted) -> bool:
        """Count one committed step: ``survival`` [rows, G] (the prefix survival each verified row's window was
        planned on; copied, so the caller may reuse its buffer), its ``windows`` and ``accepted`` drafts per row.
        Returns True when this step completed a refit and :attr:`offsets` changed."""
        G = self.block_size
        shape = np.shape(survival)
        if len(shape) != 2 or shape[1] != G or shape[0] != len(windows) or len(windows) != len(accepted):
            raise ValueError(f"survival must be [rows, {G}] with one window and one accepted count per row, got "
                             f"{shape}, {len(windows)} windows, {len(accepted)} accepted")
        if shape[0]:
            self._queued.append((np.array(survival, dtype=np.float32), np.asarray(windows, dtype=np.int64),
                                 np.asarray(accepted, dtype=np.int64)))
        self._steps += 1
        if self._steps < self.refit_every:
            return False
        self._count_queued()
        moved = self._refit()
        self._grad[:] = 0.0
        self._curv[:] = 0.0
        self._steps = 0
        return moved

    def _count_queued(self) -> None:
        """Add the queued steps' tested positions to the refit's sums and to the counts."""
        if not self._queued:
            return
        queued, self._queued = self._queued, []
        surv = np.concatenate([q[0] for q in queued]).astype(np.float64)
        tested, hit = verified_outcomes(np.concatenate([q[1] for q in queued]), np.concatenate([q[2] for q in queued]),
                                        self.block_size)
        # tested positions whose conditional is defined (a survival of 0 before them says nothing)
        tested &= np.concatenate([np.ones((surv.shape[0], 1), dtype=bool), surv[:, :-1] > 0], axis=1)
        y = hit & tested
        c = np.where(tested, np.clip(conditional_confidence(surv), 0.0, 1.0), 0.0)
        self._grad += y.sum(axis=0) - c.sum(axis=0)
        self._curv += (c * (1.0 - c)).sum(axis=0)
        self._tested += tested.sum(axis=0)
        self._accepted += y.sum(axis=0)
        self._predicted += c.sum(axis=0)

    def _refit(self) -> bool:
        """One Newton step per position with curvature (no tested rows: that position's offset stays)."""
        has = self._curv > 1e-9
        if not has.any():
            return False
        step = np.zeros(self.block_size)
        step[has] = np.clip(self._grad[has] / self._curv[has], -self.max_step, self.max_step)
        self.offsets = np.clip(self.offsets + step, -self.max_offset, self.max_offset)
        self.refits += 1
        return True

    def counters(self) -> dict[str, float]:
        """``online_calibration/*`` since :meth:`reset_counts`: refits, tested positions, and per position the offset
        now and the observed over predicted acceptance of the tested positions (1 when calibrated)."""
        out: dict[str, float] = {"online_calibration/refits": self.refits,
                                 "online_calibration/tested": int(self.tested.sum())}
        for j in range(self.block_size):
            out[f"online_calibration/offset.{j + 1}"] = float(self.offsets[j])
            if self.predicted[j] > 0:
                ratio = float(self.accepted[j] / self.predicted[j])
                out[f"online_calibration/observed_over_predicted.{j + 1}"] = ratio
        return out
