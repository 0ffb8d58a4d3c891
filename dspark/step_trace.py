"""A per-step record of what the confidence head said and what verification found.

For each decode step of a speculative run: the requests, the confidence head's raw logits
and the fresh (calibrated) prefix survival of the block each verified, the window each
verified and how many drafts each accepted. With the full block verified, the accepted counts are what an all-knowing
scheduler would have known, so a trace of a ``verify=full`` run lets the planner be replayed
offline against any cost table and any confidence head (``bench/planner_replay.py``).

Recorded by the eager step only: a device-resident (CUDA-graph) step returns the survival of
the block it just drafted, not of the one it verified, and pairing the two is not done here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np


@dataclass
class StepTrace:
    block: int
    request_ids: list[np.ndarray] = field(default_factory=list)  # per step: int64 [R]
    survival: list[np.ndarray] = field(default_factory=list)  # per step: float32 [R, block]
    confidence_logits: list[np.ndarray] = field(default_factory=list)  # per step: float32 [R, block], raw head
    windows: list[np.ndarray] = field(default_factory=list)  # per step: int64 [R]
    accepted: list[np.ndarray] = field(default_factory=list)  # per step: int64 [R]

    def record(self, request_ids: Sequence[int], survival, windows: Sequence[int], accepted: Sequence[int],
               confidence_logits=None) -> None:
        """One step's rows; confidence_logits (the raw head, before calibration) may be left out
        by every step of a trace, not by some."""
        ids = np.asarray(request_ids, dtype=np.int64)
        surv = np.asarray(survival, dtype=np.float32)
        if (confidence_logits is None) != (not self.confidence_logits) and self.request_ids:
            raise ValueError("step trace: give confidence_logits in every step or in none")
        logits = None if confidence_logits is None else np.asarray(confidence_logits, dtype=np.float32)
        win = np.asarray(windows, dtype=np.int64)
        acc = np.asarray(accepted, dtype=np.int64)
        R = ids.shape[0]
        if (surv.shape != (R, self.block) or win.shape != (R,) or acc.shape != (R,)
                or (logits is not None and logits.shape != (R, self.block))):
            raise ValueError(f"step trace: {R} requests need survival (and confidence logits) [{R}, {self.block}], "
                             f"windows and accepted [{R}]; got {surv.shape}, "
                             f"{None if logits is None else logits.shape}, {win.shape}, {acc.shape}")
        if ((acc < 0) | (acc > win) | (win > self.block)).any():
            raise ValueError(f"step trace: accepted counts {acc.tolist()} must lie in [0, window] and windows "
                             f"{win.tolist()} in [0, {self.block}]")
        self.request_ids.append(ids)
        self.survival.append(surv)
        self.windows.append(win)
        self.accepted.append(acc)
        if logits is not None:
            self.confidence_logits.append(logits)

    @property
    def num_steps(self) -> int:
        return len(self.request_ids)

    def rows(self) -> int:
        return int(sum(len(x) for x in self.request_ids))

    def save(self, path: str | Path) -> Path:
        """One .npz: the steps' rows concatenated, with each step's row count."""
        if not self.request_ids:
            raise ValueError("step trace: no step was recorded (was the run speculative, and eager?)")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        extra = {"confidence_logits": np.concatenate(self.confidence_logits)} if self.confidence_logits else {}
        np.savez_compressed(path, block=np.int64(self.block), **extra,
                            rows_per_step=np.array([len(x) for x in self.request_ids], dtype=np.int64),
                            request_ids=np.concatenate(self.request_ids), survival=np.concatenate(self.survival),
                            windows=np.concatenate(self.windows), accepted=np.concatenate(self.accepted))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "StepTrace":
        with np.load(Path(path)) as z:
            missing = {"block", "rows_per_step", "request_ids", "survival", "windows", "accepted"} - set(z.files)
            if missing:
                raise ValueError(f"{path}: not a step trace (missing {sorted(missing)})")
            trace = cls(int(z["block"]))
            cuts = np.cumsum(z["rows_per_step"])[:-1]
            parts = [np.split(z[k], cuts) for k in ("request_ids", "survival", "windows", "accepted")]
            logits = np.split(z["confidence_logits"], cuts) if "confidence_logits" in z.files else None
            for i, (ids, surv, win, acc) in enumerate(zip(*parts)):
                trace.record(ids, surv, win, acc, None if logits is None else logits[i])
        return trace

    def per_request(self) -> dict[int, dict[str, np.ndarray]]:
        """request id -> {"survival" [S, block], "windows" [S], "accepted" [S] and, when traced,
        "confidence_logits" [S, block]} over its steps, in step order."""
        out: dict[int, dict[str, list]] = {}
        logits = self.confidence_logits or [None] * self.num_steps
        for ids, surv, win, acc, lg in zip(self.request_ids, self.survival, self.windows, self.accepted, logits):
            for i, rid in enumerate(ids.tolist()):
                rows = out.setdefault(rid, {"survival": [], "windows": [], "accepted": [], "confidence_logits": []})
                rows["survival"].append(surv[i])
                rows["windows"].append(win[i])
                rows["accepted"].append(acc[i])
                if lg is not None:
                    rows["confidence_logits"].append(lg[i])
        return {rid: {k: (np.stack(v) if k in ("survival", "confidence_logits") else np.array(v))
                      for k, v in rows.items() if v} for rid, rows in out.items()}


def full_block_requests(paths: Sequence[str | Path], need_logits: bool = False) -> tuple[int, list[dict]]:
    """(block, each traced request's rows as :meth:`StepTrace.per_request` gives them, in file and id
    order) from traces of ``verify=full`` runs: the traces must share one block, every window must be
    the whole block (the acceptances are then uncapped), and with ``need_logits`` the raw confidence
    logits must be there. ValueError says which file breaks which."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    block, out = None, []
    for path in paths:
        trace = StepTrace.load(path)
        if block is not None and trace.block != block:
            raise ValueError(f"{path}: block {trace.block}, the traces before it have {block}")
        block = trace.block
        if need_logits and not trace.confidence_logits:
            raise ValueError(f"{path}: the trace holds no raw confidence logits (written before they were "
                             f"recorded); trace the run again")
        for rid, seq in sorted(trace.per_request().items()):
            if (seq["windows"] != block).any():
                raise ValueError(f"{path}: request {rid} verified windows {sorted(set(seq['windows'].tolist()))}, "
                                 f"not the whole block {block}; trace a verify=full run (uncapped acceptances)")
            out.append(seq)
    if not out:
        raise ValueError("no traced request in " + ", ".join(str(p) for p in paths))
    return block, out


def calibration_rows(paths: Sequence[str | Path]) -> dict[str, "torch.Tensor"]:
    """The rows a confidence calibration fits on, from traces of ``verify=full`` runs: each traced
    block's raw confidence logits, its greedy acceptance with the whole block verified, and a
    sequence index (one per traced request, so that fit and report parts split by request).
    Keys and shapes as ``dspark.training.trainer.greedy_block_acceptance`` returns them (accepted
    is [M, block]: 1 where the position and every one before it were accepted)."""
    import torch

    block, seqs = full_block_requests(paths, need_logits=True)
    counts = torch.from_numpy(np.concatenate([seq["accepted"] for seq in seqs]))
    seq_index = np.concatenate([np.full(len(seq["accepted"]), i, dtype=np.int64) for i, seq in enumerate(seqs)])
    # per position: accepted with every earlier one (the prefix survival the calibration fits)
    accepted_matrix = (torch.arange(1, block + 1)[None, :] <= counts[:, None]).float()
    return {"conf_logits": torch.from_numpy(np.concatenate([seq["confidence_logits"] for seq in seqs])).float(),
            "accepted": accepted_matrix, "seq_index": torch.from_numpy(seq_index),
            "accept_length": counts.float() + 1.0}
