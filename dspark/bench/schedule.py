"""Block schedules for paired A/B runs.

A run is split into blocks; every block runs both arms once, back to back, over the
same requests. The order inside each block decides how slow machine drift (thermal,
clock boost, a noisy neighbour) lands on the two arms:

- ``ABBA``: blocks alternate AB, BA, AB, BA, ... so the arm sequence is
  A B B A A B B A ...; a linear drift cancels exactly over every pair of blocks
  (so over the run when ``n_blocks`` is even).
- ``ABAB``: every block is AB. Any drift or warm-up advantage always favours the
  same arm; kept for comparison and for deliberately measuring order effects.
- ``random``: a seeded fair coin per block picks AB or BA.
"""

from __future__ import annotations

import numpy as np

ARMS = ("A", "B")
SCHEDULE_KINDS = ("ABBA", "ABAB", "random")


def build_schedule(kind: str, n_blocks: int, seed: int = 0) -> list[tuple[int, str]]:
    """Return the run order as ``[(block_index, arm), ...]``, two entries per block.

    ``seed`` only matters for ``kind="random"``; the same seed gives the same order.
    """
    if kind not in SCHEDULE_KINDS:
        raise ValueError(f"schedule kind {kind!r} is not supported; use one of {list(SCHEDULE_KINDS)}")
    if isinstance(n_blocks, bool) or not isinstance(n_blocks, (int, np.integer)) or n_blocks < 1:
        raise ValueError(f"n_blocks must be an integer >= 1, got {n_blocks!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")

    if kind == "ABBA":
        a_first = [block % 2 == 0 for block in range(n_blocks)]
    elif kind == "ABAB":
        a_first = [True] * n_blocks
    else:
        coins = np.random.default_rng(int(seed)).integers(0, 2, size=n_blocks)
        a_first = [bool(c == 0) for c in coins]

    schedule: list[tuple[int, str]] = []
    for block, first_is_a in enumerate(a_first):
        order = ("A", "B") if first_is_a else ("B", "A")
        schedule.extend((block, arm) for arm in order)
    return schedule


def first_arm_by_block(schedule: list[tuple[int, str]]) -> dict[int, str]:
    """Map each block index to the arm that ran first in it.

    Also checks that the schedule is well formed: every block holds each arm exactly once.
    """
    arms_by_block: dict[int, list[str]] = {}
    for block, arm in schedule:
        if arm not in ARMS:
            raise ValueError(f"schedule entry ({block}, {arm!r}): arm must be one of {list(ARMS)}")
        arms_by_block.setdefault(int(block), []).append(arm)
    for block, arms in arms_by_block.items():
        if sorted(arms) != ["A", "B"]:
            raise ValueError(f"block {block} runs arms {arms}; every block must run A and B exactly once")
    return {block: arms[0] for block, arms in sorted(arms_by_block.items())}


def position_in_block(schedule: list[tuple[int, str]]) -> dict[tuple[int, str], int]:
    """Map ``(block, arm)`` to its position inside the block: 0 = ran first, 1 = ran second."""
    first = first_arm_by_block(schedule)
    return {(block, arm): (0 if first[block] == arm else 1) for block, arm in schedule}
