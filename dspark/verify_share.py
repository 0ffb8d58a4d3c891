"""A measured verify share (engine.verify_share): per batch bucket, verify the whole drafted block or a fixed share
of its cells, whichever measured faster in service.

The planner (dspark/planner.py) sizes each step's budget from a cost table and a service price it fits online;
on the H200 at concurrency 256 a trim saved on the device more than twice what the table says, and a fixed
75% of every step's cells, allocated on the device by fresh survival, ran faster than the planner's arm
(`ab=full_vs_forced_trim`; bench/README.md lists the runs). This choice needs neither: from ``engine.plan_min_rows``
rows up, each step of a bucket verifies either the whole block or ``round(share * R * G)`` cells (the cells
of highest fresh survival, picked on the device as a ragged step's are), and
:class:`dspark.measured_choice.MeasuredChoice` keeps the kind that measured the higher output rate on adjacent
steps. No planner call, no cost table: the host's work is the choice's few comparisons. The budget depends only
on committed steps, never on the survival of the block it cuts, so sampled requests keep the target's
distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

from dspark.measured_choice import MeasuredChoice

# Plan reasons (counters sched/plan_reason.<reason>): a step that verified the share, and one that verified the
# whole block (while the choice measures it, or where the share measured slower: a "no gain" decline).
SHARE_REASON = "verify_share"
SHARE_FULL_REASON = "share_choice_full_block"


def share_budget(share: float, rows: int, block: int) -> int:
    """Cells to verify in a step of ``rows`` requests drafting ``block`` tokens each when ``share`` of them are
    verified (engine.verify_share, and engine.force_budget_frac's forced share)."""
    return int(round(share * rows * block))


def check_verify_share(share: float) -> str | None:
    """Why ``share`` cannot be engine.verify_share, or None."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < float(share) < 1.0:
        return f"must be a number in (0, 1): the share of a step's drafted cells to verify, got {share!r}"
    return None


@dataclass
class VerifyShareChoice(MeasuredChoice):
    """Per batch bucket: the whole block (the usual kind) or ``share`` of its cells (the alternative)."""

    share: float = 0.75

    def __post_init__(self) -> None:
        super().__post_init__()
        problem = check_verify_share(self.share)
        if problem:
            raise ValueError(f"share {problem}")

    def summary(self) -> dict[str, float]:
        """Per bucket: the rates (tokens/ms) of whole-block and share steps and how many of each were counted."""
        return self.rate_summary("verify_share", "full", "share")


__all__ = ["SHARE_REASON", "SHARE_FULL_REASON", "VerifyShareChoice", "check_verify_share", "share_budget"]
