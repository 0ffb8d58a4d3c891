"""Block schedules: arm order per kind, balance, determinism and validation."""

import pytest

from dspark.bench.schedule import build_schedule, first_arm_by_block, position_in_block


def arms(schedule):
    return "".join(arm for _, arm in schedule)


def test_abba_alternates_block_order_so_linear_drift_cancels():
    schedule = build_schedule("ABBA", 4, seed=0)
    assert arms(schedule) == "ABBAABBA"
    assert [b for b, _ in schedule] == [0, 0, 1, 1, 2, 2, 3, 3]
    # a linear drift t -> t adds the same total to both arms over the run
    slot_sum = {"A": 0, "B": 0}
    for slot, (_, arm) in enumerate(schedule):
        slot_sum[arm] += slot
    assert slot_sum["A"] == slot_sum["B"]


def test_abab_always_runs_a_first():
    assert arms(build_schedule("ABAB", 3, seed=0)) == "ABABAB"
    assert set(first_arm_by_block(build_schedule("ABAB", 3, seed=0)).values()) == {"A"}


def test_random_is_seeded_and_has_both_arms_in_every_block():
    first = build_schedule("random", 40, seed=7)
    assert first == build_schedule("random", 40, seed=7)
    assert first != build_schedule("random", 40, seed=8)
    orders = first_arm_by_block(first)
    assert len(orders) == 40
    assert 5 < sum(o == "A" for o in orders.values()) < 35  # a fair coin, not a constant


def test_position_in_block():
    positions = position_in_block(build_schedule("ABBA", 2, seed=0))
    assert positions == {(0, "A"): 0, (0, "B"): 1, (1, "B"): 0, (1, "A"): 1}


@pytest.mark.parametrize("kind,n_blocks,seed", [("AABB", 4, 0), ("ABBA", 0, 0), ("ABBA", 2.0, 0), ("random", 4, "x")])
def test_invalid_arguments_are_named(kind, n_blocks, seed):
    with pytest.raises(ValueError) as err:
        build_schedule(kind, n_blocks, seed)
    assert repr(kind) in str(err.value) or repr(n_blocks) in str(err.value) or repr(seed) in str(err.value)


def test_malformed_schedule_rejected():
    with pytest.raises(ValueError, match="block 0"):
        first_arm_by_block([(0, "A"), (0, "A")])
