"""The acceptance estimate without the confidence head (engine.acceptance_estimate=draft_max_prob): the online
calibration's counts and table, and an engine whose drafter has no head that schedules with it, losslessly."""

import numpy as np
import pytest
import torch

from dspark.acceptance_estimate import OnlineAcceptanceEstimate, estimated_confidence
from dspark.config import ConfigError
from dspark.engine import Engine
from test_engine_scheduling import scheduled_and_target_only
from tiny import tiny_drafter, tiny_engine_config, tiny_target


def test_counts_follow_each_rows_tested_and_accepted_slots():
    est = OnlineAcceptanceEstimate(block_size=4, num_bins=2, prior_weight=1.0)
    # row 0: window 4, 2 accepted -> slots 0, 1 accepted, slot 2 rejected, slot 3 untested;
    # row 1: window 1, 1 accepted (the whole window) -> slot 0 accepted, the rest untested;
    # row 2: window 3, 0 accepted -> slot 0 rejected.
    p = np.array([[0.9, 0.2, 0.7, 0.9], [0.1, 0.9, 0.9, 0.9], [0.6, 0.6, 0.6, 0.6]])
    est.update(p, windows=[4, 1, 3], accepted=[2, 1, 0])
    assert est.tested.tolist() == [[1, 2], [1, 0], [0, 1], [0, 0]]
    assert est.accepted.tolist() == [[1, 1], [1, 0], [0, 0], [0, 0]]
    table = est.table()  # (accepted + centre) / (tested + 1), centres 0.25 and 0.75
    assert table[0].tolist() == pytest.approx([(1 + 0.25) / 2, (1 + 0.75) / 3])
    assert table[3].tolist() == pytest.approx([0.25, 0.75])  # untested: the drafter taken at its word
    with pytest.raises(ValueError, match=r"\[rows, 4\]"):
        est.update(np.zeros((2, 3)), [1, 1], [0, 0])


def test_the_table_converges_to_the_observed_rate():
    rng = np.random.default_rng(0)
    est = OnlineAcceptanceEstimate(block_size=1, num_bins=4)
    p = rng.uniform(0.5, 0.75, size=(4000, 1))  # bin 2
    accepted = (rng.uniform(size=4000) < 0.3).astype(int)  # a drafter far more confident than it is right
    est.update(p, windows=[1] * 4000, accepted=accepted)
    assert est.table()[0, 2] == pytest.approx(accepted.mean(), abs=0.01)


def test_estimated_confidence_reads_each_slots_bin():
    table = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]])
    p = torch.tensor([[0.0, 1.0], [0.3, 0.55]])
    assert torch.allclose(estimated_confidence(p, table), torch.tensor([[0.1, 0.8], [0.2, 0.7]]))


@pytest.fixture(scope="module")
def headless():
    target = tiny_target(31)
    return target, tiny_drafter(target, 32, block_size=4, use_confidence_head=False)


def test_a_headless_drafter_needs_the_estimate_to_schedule(headless, tmp_path):
    target, drafter = headless
    with pytest.raises(ConfigError, match="acceptance_estimate=draft_max_prob"):
        Engine(target, None, tiny_engine_config(verify="ragged"), drafter)


@pytest.mark.parametrize("graphs", [False, True])
def test_scheduling_on_the_estimate_is_lossless_and_trims(headless, tmp_path, graphs):
    target, drafter = headless
    eng, out, base = scheduled_and_target_only(target, drafter, tmp_path, graphs, seed=33, max_tokens=24,
                                               acceptance_estimate="draft_max_prob")
    assert [o.token_ids for o in out] == [b.token_ids for b in base]
    assert eng.counters()["trimmed_steps"] > 0
    est = eng.acceptance_estimate
    assert est.tested.sum() > 0 and est.accepted.sum() <= est.tested.sum()
    # The device reads the host's latest table.
    assert torch.allclose(eng.steps.estimate_table.cpu(), torch.tensor(est.table(), dtype=torch.float32))
