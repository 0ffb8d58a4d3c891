"""The confidence head's calibration corrected in service (engine.online_calibration): which positions a step
tests, the Newton refit of the logit offsets, the offsets in the drafter's confidence, and an engine that learns
them while scheduling, losslessly, with the device reading the host's latest offsets."""

import numpy as np
import pytest
import torch

from dspark.bench.guards import did_nothing_guard
from dspark.config import ConfigError, SamplingParams
from dspark.engine import Engine
from dspark.online_calibration import OnlineHeadCalibration
from dspark.survival import calibrated_confidence
from test_engine_lossless import prompts_for
from test_engine_scheduling import scheduled_and_target_only
from tiny import tiny_drafter, tiny_engine_config, tiny_target


def test_only_tested_positions_count():
    cal = OnlineHeadCalibration(block_size=4, refit_every=100)
    surv = np.cumprod(np.full((3, 4), 0.5), axis=1)  # every conditional 0.5
    # row 0: window 4, 2 accepted -> positions 1, 2 accepted, 3 rejected, 4 untested;
    # row 1: window 1, 1 accepted (the whole window) -> position 1 accepted, the rest untested (trimmed);
    # row 2: window 3, 0 accepted -> position 1 rejected.
    assert not cal.update(surv, windows=[4, 1, 3], accepted=[2, 1, 0])
    assert cal.tested.tolist() == [3, 1, 1, 0]
    assert cal.accepted.tolist() == [2, 1, 0, 0]
    assert cal.predicted.tolist() == pytest.approx([1.5, 0.5, 0.5, 0.0])
    counters = cal.counters()
    assert counters["online_calibration/observed_over_predicted.1"] == pytest.approx(2 / 1.5)
    assert "online_calibration/observed_over_predicted.4" not in counters  # never tested
    with pytest.raises(ValueError, match=r"\[rows, 4\]"):
        cal.update(np.zeros((2, 3)), [1, 1], [0, 0])


def test_a_refit_moves_each_offset_towards_the_observed_rate_and_stays_in_bounds():
    rng = np.random.default_rng(0)
    G, rows = 3, 256
    cal = OnlineHeadCalibration(block_size=G, refit_every=4, max_step=0.5, max_offset=3.0)
    true_rate = np.array([0.8, 0.6, 0.4])  # what the rows accept, per position given the earlier ones
    predicted = np.array([0.9, 0.9, 0.9])  # an over-confident head, before offsets

    def logit(p):
        return np.log(p / (1 - p))

    moved = 0
    for _ in range(200):
        cond = 1 / (1 + np.exp(-(logit(predicted) + cal.offsets)))
        surv = np.tile(np.cumprod(cond), (rows, 1))
        ok = rng.uniform(size=(rows, G)) < true_rate
        accepted = np.where(ok.all(axis=1), G, np.argmin(ok, axis=1))  # drafts accepted before the first rejection
        moved += cal.update(surv, [G] * rows, accepted)
    assert moved == 200 // 4 and cal.counters()["online_calibration/refits"] == moved
    learnt = 1 / (1 + np.exp(-(logit(predicted) + cal.offsets)))
    np.testing.assert_allclose(learnt, true_rate, atol=0.03)
    # A head far more confident than any offset may correct: the offset stops at its bound.
    stuck = OnlineHeadCalibration(block_size=1, refit_every=1, max_step=0.5, max_offset=1.0)
    for _ in range(10):
        stuck.update(np.full((64, 1), 0.999), [1] * 64, [0] * 64)
    assert stuck.offsets[0] == pytest.approx(-1.0)


def test_reset_counts_keeps_the_offsets():
    cal = OnlineHeadCalibration(block_size=1, refit_every=1)
    cal.update(np.full((8, 1), 0.5), [1] * 8, [1] * 8)
    offsets = cal.offsets.copy()
    assert offsets[0] > 0 and cal.refits == 1
    cal.reset_counts()
    assert cal.refits == 0 and cal.tested.sum() == 0
    np.testing.assert_array_equal(cal.offsets, offsets)


def test_offsets_add_in_logit_space():
    z = torch.tensor([[0.0, 1.0]])
    t = torch.tensor([1.0, 2.0])
    b = torch.tensor([0.5, -0.5])
    o = torch.tensor([-1.0, 2.0])
    expected = torch.sigmoid(z / t + b + o)
    assert torch.allclose(calibrated_confidence(z, t, b, offsets=o), expected)
    assert torch.allclose(calibrated_confidence(z, t, b), torch.sigmoid(z / t + b))
    with pytest.raises(ValueError, match="offsets must be"):
        calibrated_confidence(z, t, b, offsets=torch.zeros(3))


def test_the_config_needs_a_scheduling_arm_on_the_head():
    with pytest.raises(ConfigError, match="engine.online_calibration"):
        tiny_engine_config(verify="full", online_calibration=True)
    with pytest.raises(ConfigError, match="engine.online_calibration"):
        tiny_engine_config(verify="ragged", acceptance_estimate="draft_max_prob", online_calibration=True)


def test_the_guard_fails_an_arm_that_never_refitted():
    kw = dict(expects_trim=False, expects_graphs=False, expects_speculation=False)
    never = did_nothing_guard("B", {}, {"decode_steps": 40, "online_calibration/refits": 0},
                              expects_online_calibration=True, **kw)
    assert not never.passed and "never refitted" in never.message
    missing = did_nothing_guard("B", {}, {"decode_steps": 40}, expects_online_calibration=True, **kw)
    assert not missing.passed and "online_calibration/refits" in missing.message
    ok = did_nothing_guard("B", {}, {"decode_steps": 40, "online_calibration/refits": 2},
                           expects_online_calibration=True, **kw)
    assert ok.passed and "online_calibration" in ok.message


@pytest.fixture(scope="module")
def models():
    target = tiny_target(41)
    return target, tiny_drafter(target, 42, block_size=4)


@pytest.mark.parametrize("graphs", [False, True])
def test_an_engine_learns_offsets_while_scheduling_losslessly(models, tmp_path, graphs, monkeypatch):
    """Greedy outputs equal target-only; the offsets were refitted and the device's buffer holds the host's latest;
    every draft stage computed the survival with that buffer."""
    target, drafter = models
    given = []
    plain_confidence = drafter.calibrated_confidence

    def spy(z, max_prob=None, offsets=None, top_gap=None):
        given.append(offsets)
        return plain_confidence(z, max_prob, offsets, top_gap)

    monkeypatch.setattr(drafter, "calibrated_confidence", spy)
    eng, out, base = scheduled_and_target_only(target, drafter, tmp_path, graphs, seed=43, max_tokens=40,
                                               online_calibration=True)
    assert [o.token_ids for o in out] == [b.token_ids for b in base]
    c = eng.counters()
    assert c["online_calibration/refits"] > 0 and c["online_calibration/tested"] > 0
    cal = eng.online_calibration
    assert np.abs(cal.offsets).max() > 0  # a tiny random head is far from calibrated
    assert torch.allclose(eng.steps.confidence_offsets.cpu(), torch.tensor(cal.offsets, dtype=torch.float32))
    offsets = eng.steps.confidence_offsets
    assert given and all(o is offsets for o in given)  # (the table's probe and target-only draft nothing)
    # Without the option the decoder keeps no offsets and the engine reports no such counters.
    plain = Engine(target, None, tiny_engine_config(verify="ragged"), drafter)
    assert plain.steps.confidence_offsets is None and plain.online_calibration is None
    assert not any(k.startswith("online_calibration/") for k in plain.counters())


def test_a_step_trace_records_the_survival_with_the_offsets_it_drafted_with(models, tmp_path):
    """An eager engine with the correction on traces, at every step, the survival its planner read: the head's
    calibrated confidence with the offsets of that step (the last step's rows are still in the decoder's buffer)."""
    target, drafter = models
    eng, _, _ = scheduled_and_target_only(target, drafter, tmp_path, False, seed=44, max_tokens=4,
                                          online_calibration=True)
    eng.online_calibration.offsets[:] = [0.5, -0.5, 1.0, -1.0]
    eng.steps.set_confidence_offsets(eng.online_calibration.offsets)
    eng.online_calibration.refit_every = 10 ** 6  # the offsets stay as set for the traced steps
    trace = eng.start_step_trace()
    eng.generate(prompts_for(45, 3), SamplingParams(max_tokens=12, ignore_eos=True))
    last = trace.survival[-1]
    rows = len(last)
    np.testing.assert_allclose(last, eng.steps.survival[:rows].cpu().numpy(), atol=1e-6)
    plain = np.cumprod(drafter.calibrated_confidence(torch.from_numpy(trace.confidence_logits[-1])).numpy(), axis=-1)
    assert np.abs(plain - last).max() > 1e-3  # the offsets moved it
