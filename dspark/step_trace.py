"""A per-step record of what the confidence head said and what verification found.

For each decode step of a speculative run: the requests, the confidence head's raw logits, the
drafter's top-token probability per slot (``draft_max_prob``, which an sts_max_prob calibration
weighs) and the fresh (calibrated) prefix survival of the block each verified, the window each
verified and how many drafts each accepted. With the full block verified, the accepted counts are what an all-knowing
scheduler would have known, so a trace of a ``verify=full`` run lets the planner be replayed
offline against any cost table and any confidence head (``bench/planner_replay.py``).

Recorded by the eager step only: a device-resident (CUDA-graph) step returns the survival of
the block it just drafted, not of the one it verified, and pairing the two is not done here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    import torch


@dataclass
class StepTrace:
    block: int
    request_ids: list[np.ndarray] = field(default_factory=list)  # per step: int64 [R]
    survival: list[np.ndarray] = field(default_factory=list)  # per step: float32 [R, block]
    confidence_logits: list[np.ndarray] = field(default_factory=list)  # per step: float32 [R, block], raw head
    # per step: float32 [R, block], the drafter's top-token probability per slot
    draft_max_prob: list[np.ndarray] = field(default_factory=list)
    windows: list[np.ndarray] = field(default_factory=list)  # per step: int64 [R]
    accepted: list[np.ndarray] = field(default_factory=list)  # per step: int64 [R]

    def record(self, request_ids: Sequence[int], survival, windows: Sequence[int], accepted: Sequence[int],
               confidence_logits=None, draft_max_prob=None) -> None:
        """One step's rows; confidence_logits (the raw head, before calibration) and draft_max_prob
        (the drafter's top-token probability per slot) may each be left out by every step of a
        trace, not by some."""
        ids = np.asarray(request_ids, dtype=np.int64)
        surv = np.asarray(survival, dtype=np.float32)
        if (confidence_logits is None) != (not self.confidence_logits) and self.request_ids:
            raise ValueError("step trace: give confidence_logits in every step or in none")
        if (draft_max_prob is None) != (not self.draft_max_prob) and self.request_ids:
            raise ValueError("step trace: give draft_max_prob in every step or in none")
        logits = None if confidence_logits is None else np.asarray(confidence_logits, dtype=np.float32)
        top = None if draft_max_prob is None else np.asarray(draft_max_prob, dtype=np.float32)
        win = np.asarray(windows, dtype=np.int64)
        acc = np.asarray(accepted, dtype=np.int64)
        R = ids.shape[0]
        if (surv.shape != (R, self.block) or win.shape != (R,) or acc.shape != (R,)
                or (logits is not None and logits.shape != (R, self.block))
                or (top is not None and top.shape != (R, self.block))):
            raise ValueError(f"step trace: {R} requests need survival (and confidence logits, draft max probabilities) "
                             f"[{R}, {self.block}], windows and accepted [{R}]; got {surv.shape}, "
                             f"{None if logits is None else logits.shape}, {None if top is None else top.shape}, "
                             f"{win.shape}, {acc.shape}")
        if ((acc < 0) | (acc > win) | (win > self.block)).any():
            raise ValueError(f"step trace: accepted counts {acc.tolist()} must lie in [0, window] and windows "
                             f"{win.tolist()} in [0, {self.block}]")
        self.request_ids.append(ids)
        self.survival.append(surv)
        self.windows.append(win)
        self.accepted.append(acc)
        if logits is not None:
            self.confidence_logits.append(logits)
        if top is not None:
            self.draft_max_prob.append(top)

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
        if self.draft_max_prob:
            extra["draft_max_prob"] = np.concatenate(self.draft_max_prob)
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
            top = np.split(z["draft_max_prob"], cuts) if "draft_max_prob" in z.files else None
            for i, (ids, surv, win, acc) in enumerate(zip(*parts)):
                trace.record(ids, surv, win, acc, None if logits is None else logits[i],
                             None if top is None else top[i])
        return trace

    def per_request(self) -> dict[int, dict[str, np.ndarray]]:
        """request id -> {"survival" [S, block], "windows" [S], "accepted" [S] and, when traced,
        "confidence_logits" [S, block] and "draft_max_prob" [S, block]} over its steps, in step order."""
        out: dict[int, dict[str, list]] = {}
        logits = self.confidence_logits or [None] * self.num_steps
        tops = self.draft_max_prob or [None] * self.num_steps
        for ids, surv, win, acc, lg, tp in zip(self.request_ids, self.survival, self.windows, self.accepted, logits,
                                               tops):
            for i, rid in enumerate(ids.tolist()):
                rows = out.setdefault(rid, {"survival": [], "windows": [], "accepted": [], "confidence_logits": [],
                                            "draft_max_prob": []})
                rows["survival"].append(surv[i])
                rows["windows"].append(win[i])
                rows["accepted"].append(acc[i])
                if lg is not None:
                    rows["confidence_logits"].append(lg[i])
                if tp is not None:
                    rows["draft_max_prob"].append(tp[i])
        per_row = ("survival", "confidence_logits", "draft_max_prob")
        return {rid: {k: (np.stack(v) if k in per_row else np.array(v))
                      for k, v in rows.items() if v} for rid, rows in out.items()}


def full_block_requests(paths: Sequence[str | Path], need_logits: bool = False,
                        need_max_prob: bool = False) -> tuple[int, list[dict]]:
    """(block, each traced request's rows as :meth:`StepTrace.per_request` gives them, in file and id
    order) from traces of ``verify=full`` runs: the traces must share one block, every window must be
    the whole block (the acceptances are then uncapped), with ``need_logits`` the raw confidence
    logits must be there and with ``need_max_prob`` the drafter's top-token probabilities. ValueError
    says which file breaks which."""
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
        if need_max_prob and not trace.draft_max_prob:
            raise ValueError(f"{path}: the trace holds no draft_max_prob (the drafter's top-token probability per "
                             f"slot, recorded by Engine.start_step_trace); trace the run again")
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
    sequence index (one per traced request, so that fit and report parts split by request); and
    ``draft_max_prob`` where every trace holds the drafter's top-token probabilities.
    Keys and shapes as ``dspark.training.trainer.replay_block_acceptance`` returns them (accepted
    is [M, block]: 1 where the position and every one before it were accepted)."""
    import torch

    block, seqs = full_block_requests(paths, need_logits=True)
    counts = torch.from_numpy(np.concatenate([seq["accepted"] for seq in seqs]))
    seq_index = np.concatenate([np.full(len(seq["accepted"]), i, dtype=np.int64) for i, seq in enumerate(seqs)])
    # per position: accepted with every earlier one (the prefix survival the calibration fits)
    accepted_matrix = (torch.arange(1, block + 1)[None, :] <= counts[:, None]).float()
    rows = {"conf_logits": torch.from_numpy(np.concatenate([seq["confidence_logits"] for seq in seqs])).float(),
            "accepted": accepted_matrix, "seq_index": torch.from_numpy(seq_index),
            "accept_length": counts.float() + 1.0}
    if all("draft_max_prob" in seq for seq in seqs):
        rows["draft_max_prob"] = torch.from_numpy(np.concatenate([seq["draft_max_prob"] for seq in seqs])).float()
    return rows
