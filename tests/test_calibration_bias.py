"""Calibration with a per-position bias (method=sts_bias): c_k = sigmoid(z_k / T_k + b_k).

The bias method recovers known (T, b) where STS cannot (biased logits); biases round-trip through
temperatures.json and DSparkDrafter.save/load and change calibrated_confidence exactly as the formula
says; malformed biases are refused; files without biases (STS, older files) read as zero biases.
All tiny and on CPU.
"""

from __future__ import annotations

import json

import pytest
import torch

from dspark.config import ConfigError
from dspark.models.drafter import DSparkDrafter
from dspark.survival import calibrated_confidence as survival_confidence
from dspark.training.calibration import (
    STS_BIAS_METHOD,
    STS_METHOD,
    TEMPERATURES_FILE,
    bias_grid,
    bootstrap_ece,
    calibration_report,
    cumulative_survival,
    fit_sequential_temperatures,
    fit_sequential_temperatures_biases,
    load_calibration,
    load_temperatures,
    save_temperatures,
)
from test_drafter import GAMMA, _make, _target_cfg

T_TRUE = [0.7, 1.5, 2.0, 0.9]
B_TRUE = [-1.5, 1.0, -0.8, 1.2]


def _biased_blocks(n_rows, temperatures, biases, seed):
    """Raw logits and sequentially sampled acceptance from sigmoid(z / T + b) (stop at the first rejection)."""
    from test_calibration import _synthetic_blocks

    return _synthetic_blocks(n_rows, temperatures, seed, biases=biases, scale=2.5, shift=1.0)


@pytest.fixture(scope="module")
def biased():
    return _biased_blocks(20000, T_TRUE, B_TRUE, seed=0)


def _fit(z, a, **kw):
    return fit_sequential_temperatures_biases(z, a, n_grid=30, n_bias=25, b_max=3.0, refine=7, **kw)


def test_bias_method_recovers_known_temperatures_and_biases(biased):
    z, a = biased
    temps, biases = _fit(z, a)
    assert temps.dtype == biases.dtype == torch.float32 and temps.shape == biases.shape == (4,)
    # first positions see the most rows; later ones fewer (a cumulative product), so looser there
    for k, (t_true, b_true) in enumerate(zip(T_TRUE, B_TRUE)):
        assert float(temps[k]) == pytest.approx(t_true, rel=0.25 + 0.1 * k), (k, temps.tolist())
        assert float(biases[k]) == pytest.approx(b_true, abs=0.3 + 0.1 * k), (k, biases.tolist())
    # out of sample on fresh draws from the same law: near the truth's own ECE, well below STS's
    z2, a2 = _biased_blocks(20000, T_TRUE, B_TRUE, seed=1)
    truth = calibration_report(z2, a2, torch.tensor(T_TRUE), torch.tensor(B_TRUE))["ece_after"]
    with_bias = calibration_report(z2, a2, temps, biases)["ece_after"]
    sts_only = calibration_report(z2, a2, fit_sequential_temperatures(z, a, n_grid=30))["ece_after"]
    assert with_bias < truth + 0.006
    assert sts_only > 3 * with_bias and sts_only > 0.03  # a pure scale cannot undo a bias


def test_pure_ece_argmin_flattens_a_late_position_the_guard_does_not(biased):
    """Why the sharpness guard: with a free bias, c_k = constant at the base rate is calibrated, so a pure
    ECE argmin may flatten a late position (huge T) on sampling noise; the Brier tie-break keeps the head."""
    # a seed where the pure argmin does flatten (it did on 4 of seeds 0..11 at this size; the guard on none)
    z, a = _biased_blocks(10000, T_TRUE, B_TRUE, seed=1)
    pure_t, pure_b = _fit(z, a, ece_tolerance=0.0)
    guarded_t, guarded_b = _fit(z, a)
    assert float(pure_t[3]) > 4.0  # flattened: the position's logits barely matter any more
    assert float(guarded_t[3]) == pytest.approx(T_TRUE[3], rel=0.3)
    pure = calibration_report(z, a, pure_t, pure_b)
    guarded = calibration_report(z, a, guarded_t, guarded_b)
    assert guarded["brier_after_per_position"][3] < pure["brier_after_per_position"][3]
    assert guarded["ece_after_per_position"][3] < 0.01  # still calibrated (the tolerance bounds it per step)
    assert guarded["survival_auc_after_per_position"][3] > pure["survival_auc_after_per_position"][3]
    with pytest.raises(ValueError, match="ece_tolerance"):
        fit_sequential_temperatures_biases(z[:10], a[:10], ece_tolerance=-0.1)


def test_bias_method_on_unbiased_data_keeps_biases_small():
    z, a = _biased_blocks(20000, T_TRUE, [0.0] * 4, seed=2)
    temps, biases = _fit(z, a)
    assert biases.abs().max() < 0.35
    assert temps[0] == pytest.approx(T_TRUE[0], rel=0.2)


def test_bias_fit_is_sequential_and_ties_keep_identity():
    z, a = _biased_blocks(3000, T_TRUE, B_TRUE, seed=3)
    full = _fit(z, a)
    first_two = _fit(z[:, :2], a[:, :2])  # later positions never change earlier ones
    assert full[0][:2].tolist() == first_two[0].tolist() and full[1][:2].tolist() == first_two[1].tolist()
    # a position whose logits are all 0 and that is always accepted: every candidate predicts a constant;
    # among the ECE minimisers the smallest change wins, and sigmoid(b) -> 1 needs the largest b...
    zero = torch.zeros(50, 1, dtype=torch.float64)
    half = torch.tensor([[1.0], [0.0]] * 25, dtype=torch.float64)  # ...so use a 50% position instead
    t, b = fit_sequential_temperatures_biases(zero, half, n_grid=11, n_bias=9, b_max=2.0, refine=0)
    assert b.tolist() == [0.0]  # sigmoid(0) = 0.5 is exact; T is irrelevant: the grid point closest to 1
    grid_t = torch.logspace(torch.log10(torch.tensor(0.2)), 1.0, 11, dtype=torch.float64)
    assert float(t[0]) == pytest.approx(float(grid_t[grid_t.log().abs().argmin()]), rel=1e-6)


def test_bias_grid_and_bad_options():
    g = bias_grid(5, 2.0)
    assert g.tolist() == [-2.0, -1.0, 0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="odd"):
        bias_grid(4, 2.0)
    with pytest.raises(ValueError, match="b_max"):
        bias_grid(5, 0.0)
    z, a = _biased_blocks(100, T_TRUE, B_TRUE, seed=4)
    with pytest.raises(ValueError, match="refine"):
        fit_sequential_temperatures_biases(z, a, refine=-1)
    with pytest.raises(ValueError, match="0/1"):
        fit_sequential_temperatures_biases(torch.zeros(3, 2), torch.full((3, 2), 0.5))


def test_report_and_bootstrap_without_biases_are_the_sts_ones(biased):
    z, a = biased
    t = torch.tensor(T_TRUE)
    plain = calibration_report(z, a, t)
    zero = calibration_report(z, a, t, torch.zeros(4))
    assert plain["method"] == STS_METHOD and "biases" not in plain
    assert zero["method"] == STS_BIAS_METHOD and zero["biases"] == [0.0] * 4
    for key in ("ece_before", "ece_after", "ece_after_per_position", "auc_per_position", "brier_after_per_position"):
        assert plain[key] == zero[key]
    seq = torch.arange(len(z)) // 100
    assert bootstrap_ece(z, a, t, seq, n_resamples=20) == bootstrap_ece(z, a, t, seq, n_resamples=20,
                                                                          biases=torch.zeros(4))
    b = torch.tensor(B_TRUE)
    biased_report = calibration_report(z, a, t, b)
    surv = cumulative_survival(z, t, b)
    assert torch.allclose(surv, torch.cumprod(torch.sigmoid(z / t.double() + b.double()), 1))
    assert bootstrap_ece(z, a, t, seq, n_resamples=20, biases=b)["point"] == pytest.approx(
        biased_report["ece_after"], abs=1e-12)
    with pytest.raises(ValueError, match="3 biases for a block of 4"):
        calibration_report(z, a, t, torch.zeros(3))


# ------------------------------------------------------------------------------ persistence


def test_save_and_load_biases(tmp_path):
    path = save_temperatures(tmp_path / "d", [0.5, 1.25, 2.0], biases=[-0.5, 0.0, 1.5], ece_after=0.01)
    payload = json.loads(path.read_text())
    assert payload["biases"] == [-0.5, 0.0, 1.5] and payload["method"] == STS_BIAS_METHOD
    temps, biases, weights, gap_weights = load_calibration(tmp_path / "d", 3)
    assert temps.tolist() == [0.5, 1.25, 2.0] and biases.tolist() == [-0.5, 0.0, 1.5]
    assert biases.dtype == torch.float32 and weights is None and gap_weights is None  # no score weights: sts_bias
    assert load_temperatures(tmp_path / "d", 3).tolist() == [0.5, 1.25, 2.0]
    # an STS file (and every file written before biases existed): no key, zero biases
    sts = save_temperatures(tmp_path / "s", [0.5, 1.25, 2.0])
    assert "biases" not in json.loads(sts.read_text())
    assert load_calibration(tmp_path / "s", 3)[1].tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="2 biases for a block of 3"):
        save_temperatures(tmp_path / "bad", [1.0, 1.0, 1.0], biases=[0.0, 0.0])
    with pytest.raises(ValueError, match="non-finite"):
        save_temperatures(tmp_path / "bad", [1.0, 1.0, 1.0], biases=[0.0, float("nan"), 0.0])


def _write(directory, payload):
    (directory / TEMPERATURES_FILE).write_text(json.dumps(payload))


@pytest.mark.parametrize("biases,match", [
    ([0.0, 0.0, 0.0], "holds 3 biases but the drafter block size is 4"),
    ([0.0, float("nan"), 0.0, 0.0], "biases must be finite"),
    ([0.0, float("inf"), 0.0, 0.0], "biases must be finite"),
    ("0.5", "'biases' must be a list of 4 finite numbers"),
    ([0.0, "x", 0.0, 0.0], "'biases' must be a list of 4 finite numbers"),
    ([0.0, True, 0.0, 0.0], "'biases' must be a list of 4 finite numbers"),
    ({"a": 1}, "'biases' must be a list of 4 finite numbers"),
])
def test_drafter_load_refuses_malformed_biases(tmp_path, biases, match):
    cfg = _target_cfg()
    drafter = _make(cfg)
    drafter.save(tmp_path)
    _write(tmp_path, {"temperatures": [1.0] * GAMMA, "biases": biases, "method": STS_BIAS_METHOD,
                      "ece_before": None, "ece_after": None})
    with pytest.raises(ConfigError, match=match):
        DSparkDrafter.load(tmp_path, cfg)


def test_drafter_biases_round_trip_and_formula(tmp_path):
    cfg = _target_cfg()
    drafter = _make(cfg)
    assert torch.equal(drafter.confidence_biases, torch.zeros(GAMMA))
    temps, biases = [0.5, 1.0, 2.0, 4.0], [-1.0, 0.25, 0.0, 2.0]
    drafter.set_confidence_temperatures(temps, biases)
    z = torch.tensor([[1.0, -2.0, 3.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
    expected = torch.sigmoid(z / torch.tensor(temps) + torch.tensor(biases))
    assert torch.equal(drafter.calibrated_confidence(z), expected)
    assert torch.equal(drafter.calibrated_confidence(z[None]), expected[None])  # [..., gamma] reshaped back
    drafter.save(tmp_path)
    payload = json.loads((tmp_path / TEMPERATURES_FILE).read_text())
    assert payload["temperatures"] == temps and payload["biases"] == biases
    loaded = DSparkDrafter.load(tmp_path, cfg)
    assert loaded.confidence_biases.tolist() == biases and loaded.confidence_temperatures.tolist() == temps
    assert "confidence_biases" not in loaded.state_dict()
    assert torch.equal(loaded.calibrated_confidence(z), expected)
    half = loaded.to(torch.bfloat16)  # the engine casts the whole drafter; biases stay float32 and exact
    assert half.confidence_biases.dtype == torch.float32 and half.confidence_biases.tolist() == biases
    # the biases move the confidence: without them the same temperatures give another answer
    assert not torch.equal(torch.sigmoid(z / torch.tensor(temps)), expected)
    # survival.calibrated_confidence (used by engine and graph path via the drafter) applies the same formula
    assert torch.equal(survival_confidence(z, torch.tensor(temps), torch.tensor(biases)), expected)
    with pytest.raises(ValueError, match=r"biases must be \[G=4\]"):
        survival_confidence(z, torch.tensor(temps), torch.tensor(biases[:3]))
    # setting temperatures alone (STS) resets the biases; an all-zero drafter writes an STS file
    loaded.set_confidence_temperatures(temps)
    assert loaded.confidence_biases.tolist() == [0.0] * GAMMA
    loaded.save(tmp_path / "sts")
    payload = json.loads((tmp_path / "sts" / TEMPERATURES_FILE).read_text())
    assert "biases" not in payload and payload["method"] == STS_METHOD


def test_set_calibration_in_place_and_checks():
    drafter = _make(_target_cfg())
    buf_t, buf_b = drafter.confidence_temperatures, drafter.confidence_biases
    drafter.set_confidence_temperatures([1.0] * GAMMA, [0.5] * GAMMA)
    # written into the same buffers, so a CUDA graph captured before sees the new values
    assert drafter.confidence_biases is buf_b and drafter.confidence_temperatures is buf_t
    assert buf_b.tolist() == [0.5] * GAMMA
    with pytest.raises(ConfigError, match="biases must be finite"):
        drafter.set_confidence_temperatures([1.0] * GAMMA, [0.0, float("inf"), 0.0, 0.0])
    with pytest.raises(ConfigError, match="got 3 values, need one per slot"):
        drafter.set_confidence_temperatures([1.0] * GAMMA, [0.0] * 3)
    with pytest.raises(ConfigError, match="list of 4 finite numbers"):
        drafter.set_confidence_temperatures([1.0] * GAMMA, ["a", 0, 0, 0])


def test_old_temperatures_file_keeps_working(tmp_path):
    cfg = _target_cfg()
    _make(cfg).save(tmp_path)
    _write(tmp_path, {"temperatures": [0.5, 1.0, 2.0, 4.0], "method": STS_METHOD, "ece_before": None,
                      "ece_after": None})
    loaded = DSparkDrafter.load(tmp_path, cfg)
    assert loaded.confidence_biases.tolist() == [0.0] * GAMMA
    z = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    assert torch.equal(loaded.calibrated_confidence(z), torch.sigmoid(torch.tensor([[2.0, 1.0, 0.5, 0.25]])))
