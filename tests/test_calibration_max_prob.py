"""Calibration on the head AND the drafter's top-token probability (method=sts_max_prob):
c_k = sigmoid(z_k / T_k + b_k + w_k * logit(p_k)).

The maximum-likelihood fit recovers known coefficients on the reached cells and refuses what it cannot
represent; the weights round-trip through temperatures.json and DSparkDrafter.save/load (files without
them read as before, malformed ones are refused); the drafter's, the engine's and the library's
confidence follow the formula; the engine feeds each slot's top probability to the head's calibration on
the device-resident (graph) path and the host-driven path alike, and refuses to compute it without them.
All tiny and on CPU.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dspark.config import ConfigError, SamplingParams
from dspark.engine import Engine
from dspark.graph_decode import GraphDecoder
from dspark.models.drafter import DSparkDrafter
from dspark.survival import MAX_PROB_EPS, max_prob_logit
from dspark.survival import calibrated_confidence as survival_confidence
from dspark.training.calibration import (
    STS_BIAS_METHOD,
    STS_MAX_PROB_METHOD,
    STS_METHOD,
    TEMPERATURES_FILE,
    bootstrap_ece,
    calibrated_confidence,
    calibration_report,
    conditional_auc,
    cumulative_survival,
    fit_max_prob_calibration,
    load_calibration,
    reliability_plot,
    save_temperatures,
)
from test_drafter import GAMMA, _make, _target_cfg
from test_engine_lossless import prompts_for, run
from tiny import tiny_drafter, tiny_engine_config, tiny_target

A_TRUE = [0.8, 0.5, 1.2, 0.6]  # head coefficient a_k = 1 / T_k
W_TRUE = [0.7, 1.1, 0.3, 0.9]  # weight of logit(p_k)
B_TRUE = [0.5, -0.3, 0.2, 0.4]


def _fused_blocks(n_rows: int, seed: int, a=A_TRUE, w=W_TRUE, b=B_TRUE):
    """Raw head logits z, max probabilities p (correlated with z) and acceptance drawn sequentially from
    sigmoid(a z + w logit(p) + b), stopping at each row's first rejection."""
    g = torch.Generator().manual_seed(seed)
    a, w, b = (torch.tensor(v, dtype=torch.float64) for v in (a, w, b))
    z = 2.0 * torch.randn(n_rows, len(a), generator=g, dtype=torch.float64) + 1.0
    p = torch.sigmoid(0.5 * z + 1.5 * torch.randn(n_rows, len(a), generator=g, dtype=torch.float64) + 1.0)
    c = torch.sigmoid(a * z + w * torch.logit(p) + b)
    accepted = torch.zeros_like(c)
    alive = torch.ones(n_rows, dtype=torch.bool)
    for k in range(len(a)):
        hit = torch.rand(n_rows, generator=g, dtype=torch.float64) < c[:, k]
        accepted[:, k] = (alive & hit).double()
        alive &= hit
    return z, p, accepted


@pytest.fixture(scope="module")
def fused():
    return _fused_blocks(20000, seed=0)


def _formula(z, p, t, b, w):
    """sigmoid(z / T + b + w * logit(clamp(p))), written out."""
    p = torch.as_tensor(p, dtype=torch.float64).clamp(MAX_PROB_EPS, 1.0 - MAX_PROB_EPS)
    return torch.sigmoid(torch.as_tensor(z, dtype=torch.float64) / torch.as_tensor(t, dtype=torch.float64)
                         + torch.as_tensor(b, dtype=torch.float64)
                         + torch.as_tensor(w, dtype=torch.float64) * torch.log(p / (1.0 - p)))


# ------------------------------------------------------------------------------ the fit


def test_fit_recovers_known_coefficients_on_the_reached_cells(fused):
    z, p, a = fused
    cal = fit_max_prob_calibration(z, p, a)
    assert all(v.dtype == torch.float32 and v.shape == (4,) for v in cal[:3]) and cal.top_gap_weights is None
    assert (1.0 / cal.temperatures).tolist() == pytest.approx(A_TRUE, abs=0.06)
    assert cal.max_prob_weights.tolist() == pytest.approx(W_TRUE, abs=0.06)
    assert cal.biases.tolist() == pytest.approx(B_TRUE, abs=0.12)
    # the fit is the likelihood maximum over the reached cells: a nudge of any coefficient only lowers it
    reached = torch.cat([torch.ones(len(a), 1, dtype=torch.bool), torch.cumprod(a, 1)[:, :-1].bool()], 1)

    def loglik(k, a_k, w_k, b_k):
        m = reached[:, k]
        q = torch.sigmoid(a_k * z[m, k] + w_k * torch.logit(p[m, k]) + b_k)
        return float((a[m, k] * q.log() + (1 - a[m, k]) * (1 - q).log()).sum())

    for k in range(4):
        best = (1.0 / float(cal.temperatures[k]), float(cal.max_prob_weights[k]), float(cal.biases[k]))
        for i in range(3):
            for step in (-0.02, 0.02):
                moved = list(best)
                moved[i] += step
                assert loglik(k, *moved) < loglik(k, *best)
    report = calibration_report(z, a, cal.temperatures, cal.biases, max_prob=p, max_prob_weights=cal.max_prob_weights)
    assert report["method"] == STS_MAX_PROB_METHOD and report["ece_after"] < 0.015 < report["ece_before"]


def test_fused_report_names_all_three_aucs(fused):
    z, p, a = fused
    cal = fit_max_prob_calibration(z, p, a)
    report = calibration_report(z, a, cal.temperatures, cal.biases, max_prob=p, max_prob_weights=cal.max_prob_weights)
    json.dumps(report)
    fused_c = _formula(z, p, cal.temperatures, cal.biases, cal.max_prob_weights)
    assert report["auc_overall"] == pytest.approx(conditional_auc(fused_c, a)["auc_overall"], abs=1e-6)
    assert report["head_auc"] == conditional_auc(torch.sigmoid(z), a)
    assert report["auc_overall"] > report["head_auc"]["auc_overall"] + 0.02  # the second feature ranks better
    assert report["max_prob_weights"] == pytest.approx(cal.max_prob_weights.tolist())
    assert report["biases"] == pytest.approx(cal.biases.tolist())
    surv = torch.cumprod(fused_c, 1)
    assert torch.allclose(cumulative_survival(z, cal.temperatures, cal.biases, p, cal.max_prob_weights), surv,
                          atol=1e-6)
    # ece_after is the fused survival's; the bootstrap's point is the same number; the plot draws it
    seq = torch.arange(len(z)) // 50
    boot = bootstrap_ece(z, a, cal.temperatures, seq, n_resamples=20, biases=cal.biases, max_prob=p,
                         max_prob_weights=cal.max_prob_weights)
    assert boot["point"] == pytest.approx(report["ece_after"], abs=1e-12)
    without = calibration_report(z, a, cal.temperatures, cal.biases)  # the same T and b, no max probability
    assert without["method"] == STS_BIAS_METHOD and "head_auc" not in without
    assert without["ece_after"] != pytest.approx(report["ece_after"], abs=1e-3)
    with pytest.raises(ValueError, match="need max_prob"):
        calibration_report(z, a, cal.temperatures, cal.biases, max_prob_weights=cal.max_prob_weights)
    with pytest.raises(ValueError, match="max_prob shape"):
        bootstrap_ece(z, a, cal.temperatures, seq, max_prob=p[:, :3], max_prob_weights=cal.max_prob_weights)


def test_reliability_plot_of_the_fused_confidence(tmp_path, fused):
    z, p, a = fused
    cal = fit_max_prob_calibration(z[:2000], p[:2000], a[:2000])
    path = reliability_plot(z[:2000], a[:2000], cal.temperatures, tmp_path / "rel.png", biases=cal.biases,
                            max_prob=p[:2000], max_prob_weights=cal.max_prob_weights)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="need max_prob"):
        reliability_plot(z, a, cal.temperatures, tmp_path / "x.png", max_prob_weights=cal.max_prob_weights)


def test_fit_refuses_what_it_cannot_represent():
    z, p, a = _fused_blocks(3000, seed=1)
    # a head that ranks acceptance backwards next to p: a < 0, no positive temperature
    _, _, backwards = _fused_blocks(3000, seed=1, a=[-0.8] * 4)
    with pytest.raises(ValueError, match=r"position 1: the fitted head coefficient a = -0\.\d+ is not > 0"):
        fit_max_prob_calibration(z, p, backwards)
    # a position every reached block accepted: no finite likelihood maximum
    always = a.clone()
    always[:, 0] = 1.0
    with pytest.raises(ValueError, match="position 1: 3000 blocks reached it and 3000 were accepted"):
        fit_max_prob_calibration(z, p, always)
    never = torch.zeros_like(a)
    with pytest.raises(ValueError, match="position 1: 3000 blocks reached it and 0 were accepted"):
        fit_max_prob_calibration(z, p, never)
    # outcomes the head separates perfectly
    sep = torch.stack([(z[:, 0] > 1.0).double(), torch.ones(len(z), dtype=torch.float64)], 1)
    sep[:5, 1] = 0.0
    with pytest.raises(ValueError, match="position 1: .*did not converge"):
        fit_max_prob_calibration(z[:, :2], p[:, :2], sep)
    with pytest.raises(ValueError, match="max_prob shape"):
        fit_max_prob_calibration(z, p[:, :3], a)
    with pytest.raises(ValueError, match=r"probabilities in \[0, 1\]"):
        fit_max_prob_calibration(z, p + 1.0, a)
    with pytest.raises(ValueError, match="eps"):
        fit_max_prob_calibration(z, p, a, eps=0.0)


def test_max_prob_is_clamped_before_the_logit():
    z = torch.zeros(2, 3)
    p = torch.tensor([[0.0, 1.0, 0.5], [1e-9, 1.0 - 1e-9, 0.25]])
    w = torch.tensor([1.0, 1.0, 1.0])
    c = survival_confidence(z, torch.ones(3), torch.zeros(3), p, w)
    assert bool(torch.isfinite(c).all())
    edge = float(torch.logit(torch.tensor(MAX_PROB_EPS, dtype=torch.float64)))
    assert torch.allclose(max_prob_logit(p.double()),
                          torch.tensor([[edge, -edge, 0.0], [edge, -edge, float(torch.logit(torch.tensor(0.25)))]],
                                       dtype=torch.float64), atol=1e-6)
    torch.testing.assert_close(c.double(), _formula(z, p, torch.ones(3), torch.zeros(3), w), rtol=1e-6, atol=1e-6)
    # the library's float64 formula agrees
    torch.testing.assert_close(calibrated_confidence(z.double(), torch.ones(3), torch.zeros(3), p.double(), w),
                               _formula(z, p, torch.ones(3), torch.zeros(3), w))


# ------------------------------------------------------------------------------ persistence


def test_save_and_load_round_trip_and_old_files_unchanged(tmp_path):
    path = save_temperatures(tmp_path / "f", [0.5, 1.25, 2.0], biases=[-0.5, 0.0, 1.5],
                             max_prob_weights=[0.75, -0.25, 1.0], ece_before=0.1, ece_after=0.01)
    assert json.loads(path.read_text()) == {"temperatures": [0.5, 1.25, 2.0], "biases": [-0.5, 0.0, 1.5],
                                            "max_prob_weights": [0.75, -0.25, 1.0], "method": STS_MAX_PROB_METHOD,
                                            "ece_before": 0.1, "ece_after": 0.01}
    cal = load_calibration(tmp_path / "f", 3)
    assert cal.temperatures.tolist() == [0.5, 1.25, 2.0] and cal.biases.tolist() == [-0.5, 0.0, 1.5]
    assert cal.max_prob_weights.dtype == torch.float32 and cal.max_prob_weights.tolist() == [0.75, -0.25, 1.0]
    # weights alone: zero biases written with them (the method names both)
    alone = json.loads(save_temperatures(tmp_path / "w", [1.0, 1.0, 1.0], max_prob_weights=[1.0, 2.0, 3.0])
                       .read_text())
    assert alone["biases"] == [0.0, 0.0, 0.0] and alone["method"] == STS_MAX_PROB_METHOD
    # STS and sts_bias files are written and read exactly as before: no key, no weights
    sts = json.loads(save_temperatures(tmp_path / "s", [0.5, 1.25, 2.0]).read_text())
    assert sts == {"temperatures": [0.5, 1.25, 2.0], "method": STS_METHOD, "ece_before": None, "ece_after": None}
    assert load_calibration(tmp_path / "s", 3).max_prob_weights is None
    bias = json.loads(save_temperatures(tmp_path / "b", [0.5, 1.25, 2.0], biases=[1.0, 0.0, 0.0]).read_text())
    assert "max_prob_weights" not in bias and bias["method"] == STS_BIAS_METHOD
    assert load_calibration(tmp_path / "b", 3).max_prob_weights is None
    with pytest.raises(ValueError, match="2 max_prob_weights for a block of 3"):
        save_temperatures(tmp_path / "bad", [1.0] * 3, max_prob_weights=[0.0, 0.0])
    with pytest.raises(ValueError, match="non-finite"):
        save_temperatures(tmp_path / "bad", [1.0] * 3, max_prob_weights=[0.0, float("inf"), 0.0])


def _write(directory, payload):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / TEMPERATURES_FILE).write_text(json.dumps(payload))


@pytest.mark.parametrize("payload,match", [
    ({"max_prob_weights": [0.0] * 3}, "holds 3 max prob weights but the drafter block size is 4"),
    ({"max_prob_weights": [0.0, float("nan"), 0.0, 0.0]}, "max_prob_weights must be finite"),
    ({"max_prob_weights": [0.0, float("inf"), 0.0, 0.0]}, "max_prob_weights must be finite"),
    ({"max_prob_weights": "0.5"}, "'max_prob_weights' must be a list of 4 finite numbers"),
    ({"max_prob_weights": [0.0, "x", 0.0, 0.0]}, "'max_prob_weights' must be a list of 4 finite numbers"),
    ({"max_prob_weights": [0.0, True, 0.0, 0.0]}, "'max_prob_weights' must be a list of 4 finite numbers"),
    ({}, "has no 'max_prob_weights' list"),  # the method says weights, the file has none
    ({"max_prob_weights": [0.0] * 4, "method": STS_BIAS_METHOD}, "takes no 'max_prob_weights'"),
])
def test_bad_weights_are_refused(tmp_path, payload, match):
    cfg = _target_cfg()
    _make(cfg).save(tmp_path)
    _write(tmp_path, {"temperatures": [1.0] * GAMMA, "biases": [0.0] * GAMMA, "method": STS_MAX_PROB_METHOD,
                      "ece_before": None, "ece_after": None, **payload})
    with pytest.raises(ValueError, match=match):
        load_calibration(tmp_path, GAMMA)
    with pytest.raises(ConfigError, match=match):
        DSparkDrafter.load(tmp_path, cfg)


def test_drafter_weights_round_trip_and_formula(tmp_path):
    cfg = _target_cfg()
    drafter = _make(cfg)
    assert not drafter.confidence_uses_max_prob and drafter.confidence_calibration_method == "none"
    temps, biases, weights = [0.5, 1.0, 2.0, 4.0], [-1.0, 0.25, 0.0, 2.0], [1.5, -0.5, 0.0, 0.75]
    buffers = (drafter.confidence_temperatures, drafter.confidence_biases, drafter.confidence_max_prob_weights)
    drafter.set_confidence_temperatures(temps, biases, weights)
    assert drafter.confidence_max_prob_weights is buffers[2]  # in place: a captured graph sees the values
    assert drafter.confidence_uses_max_prob and drafter.confidence_calibration_method == "sts_max_prob"
    z = torch.tensor([[1.0, -2.0, 3.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
    p = torch.tensor([[0.9, 0.3, 1.0, 0.55], [0.25, 0.999, 0.5, 0.0]])
    expected = _formula(z, p, temps, biases, weights).float()
    torch.testing.assert_close(drafter.calibrated_confidence(z, p), expected)
    torch.testing.assert_close(drafter.calibrated_confidence(z[None], p[None]), expected[None])
    torch.testing.assert_close(survival_confidence(z, torch.tensor(temps), torch.tensor(biases), p,
                                                   torch.tensor(weights)), expected)
    # the weights move the confidence: without them the same T and b give another answer
    assert not torch.allclose(survival_confidence(z, torch.tensor(temps), torch.tensor(biases)), expected)
    # the max probability is required, never silently left out
    with pytest.raises(ValueError, match="sts_max_prob.*pass max_prob"):
        drafter.calibrated_confidence(z)
    with pytest.raises(ValueError, match="pass max_prob"):
        survival_confidence(z, torch.tensor(temps), torch.tensor(biases), None, torch.tensor(weights))
    with pytest.raises(ValueError, match=r"max_prob must be \[B, G\]"):
        survival_confidence(z, torch.tensor(temps), None, p[:, :3], torch.tensor(weights))
    drafter.save(tmp_path)
    payload = json.loads((tmp_path / TEMPERATURES_FILE).read_text())
    assert payload["max_prob_weights"] == weights and payload["method"] == STS_MAX_PROB_METHOD
    loaded = DSparkDrafter.load(tmp_path, cfg)
    assert loaded.confidence_uses_max_prob and loaded.confidence_max_prob_weights.tolist() == weights
    assert "confidence_max_prob_weights" not in loaded.state_dict()
    torch.testing.assert_close(loaded.calibrated_confidence(z, p), expected)
    half = loaded.to(torch.bfloat16)  # the engine casts the whole drafter; the weights stay float32
    assert half.confidence_max_prob_weights.dtype == torch.float32
    assert half.confidence_max_prob_weights.tolist() == weights
    # a twin with its own calibration; the original keeps its weights
    twin = loaded.with_calibration(temps, biases)
    assert not twin.confidence_uses_max_prob and loaded.confidence_uses_max_prob
    assert twin.confidence_calibration_method == "sts_bias" and loaded.calibration_values()[2] == weights
    # setting a calibration without weights drops them, and the file written is sts_bias again
    loaded.set_confidence_temperatures(temps, biases)
    assert not loaded.confidence_uses_max_prob and loaded.calibration_values()[2] is None
    loaded.save(tmp_path / "bias")
    assert "max_prob_weights" not in json.loads((tmp_path / "bias" / TEMPERATURES_FILE).read_text())
    with pytest.raises(ConfigError, match="max_prob_weights must be finite"):
        drafter.set_confidence_temperatures(temps, biases, [0.0, float("nan"), 0.0, 0.0])
    with pytest.raises(ConfigError, match="got 3 values, need one per slot"):
        drafter.set_confidence_temperatures(temps, biases, [0.0] * 3)


# ------------------------------------------------------------------------------ the engine

T_ENGINE, B_ENGINE, W_ENGINE = [0.8, 1.5, 1.0, 0.6], [0.3, -0.4, 0.2, 0.1], [1.5, -0.7, 0.9, 2.0]


@pytest.fixture(scope="module")
def models():
    target = tiny_target(21)
    drafter = tiny_drafter(target, 22, block_size=4)
    drafter.set_confidence_temperatures(T_ENGINE, B_ENGINE, W_ENGINE)
    return target, drafter


def _softmax_max(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.float(), -1).amax(-1)


def spy_draft_stage(monkeypatch, score: str = "max_prob", independent=_softmax_max):
    """Record, per draft stage: the live rows' request ids, survival, raw confidence logits and ``score``
    (``GraphDecoder``'s buffer of that name: max_prob, top_gap) as the stage left them in its buffers, and, as
    "independent", ``independent`` of every slot's logits as the drafter handed them to the sampler (computed here
    independently: the softmax max for max_prob)."""
    seen, values = [], []
    real_stage, real_draft = GraphDecoder._draft_stage, DSparkDrafter.draft

    def draft(self, hidden, anchor_ids, lm_head_weight, sample_fn, *args, **kw):
        def watch(logits, k):
            values.append(independent(logits))
            return sample_fn(logits, k)
        return real_draft(self, hidden, anchor_ids, lm_head_weight, watch, *args, **kw)

    def stage(self, R, host_driven=False):
        values.clear()
        real_stage(self, R, host_driven)
        live = self.active[:R].clone()
        ids = [rid for rid, on in zip(self.req_ids, live.tolist()) if on]
        seen.append({"ids": ids, "survival": self.survival[:R][live].clone(),
                     "logits": self.confidence_logits[:R][live].clone(), score: getattr(self, score)[:R][live].clone(),
                     "independent": torch.stack(values, 1)[live]})

    monkeypatch.setattr(GraphDecoder, "_draft_stage", stage)
    monkeypatch.setattr(DSparkDrafter, "draft", draft)
    return seen


def head_engine(target, drafter, **kw) -> Engine:
    """An engine whose draft stage runs the confidence head and writes survival, as a planning engine's does
    (GraphDecoder.confidence), without the cost table a planner needs: the draft stage is what these tests check."""
    eng = Engine(target, None, tiny_engine_config(**kw), drafter)
    eng.steps.confidence = True
    return eng


def _per_request(seen) -> dict[int, list[torch.Tensor]]:
    out: dict[int, list[torch.Tensor]] = {}
    for step in seen:
        for i, rid in enumerate(step["ids"]):
            out.setdefault(rid, []).append(step["survival"][i])
    return out


@pytest.mark.parametrize("sampled", [False, True])
def test_graph_and_host_paths_feed_the_max_probability_and_agree(models, monkeypatch, sampled):
    """The device-resident (captured on a GPU) step and the host-driven step both collect each slot's
    top probability, greedy and sampled rows alike, and compute the same fused survival per request."""
    target, drafter = models
    prompts = prompts_for(41, 4)
    params = [SamplingParams(max_tokens=14, ignore_eos=True, **({"temperature": 0.8, "seed": 7 + i} if sampled
                                                               else {})) for i in range(len(prompts))]
    per_path = {}
    for graphs in (False, True):
        seen = spy_draft_stage(monkeypatch)
        eng = head_engine(target, drafter, cuda_graphs=graphs, max_num_seqs=4)
        outs = eng.generate(prompts, params)
        assert eng.steps.keeps_max_prob()
        c = eng.counters()
        assert c["confidence_calibration/sts_max_prob_steps"] == c["decode_steps"] > 0
        if graphs:
            assert c["device_resident_share"] == 1.0 and c["eager_steps"] == 0
        else:
            assert c["eager_steps"] > 0 and "device_resident_share" not in c
        for step in seen:
            # the max probability kept is the drafter's softmax max at each slot ...
            torch.testing.assert_close(step["max_prob"], step["independent"], rtol=1e-5, atol=1e-6)
            # ... and the survival is the fused formula on it
            want = torch.cumprod(_formula(step["logits"], step["max_prob"], T_ENGINE, B_ENGINE, W_ENGINE), 1)
            torch.testing.assert_close(step["survival"].double(), want, rtol=1e-5, atol=1e-6)
        per_path[graphs] = (_per_request(seen), [o.token_ids for o in outs])
        monkeypatch.undo()
    (host, host_tokens), (graph, graph_tokens) = per_path[False], per_path[True]
    assert host_tokens == graph_tokens
    assert sorted(host) == sorted(graph) and len(host) == len(prompts)
    for rid in host:
        assert len(host[rid]) == len(graph[rid])
        torch.testing.assert_close(torch.stack(graph[rid]), torch.stack(host[rid]), rtol=1e-5, atol=1e-6)
    # the weights matter here: the head's own calibration would have given another survival
    some = seen[0]
    head_only = torch.cumprod(torch.sigmoid(some["logits"] / torch.tensor(T_ENGINE) + torch.tensor(B_ENGINE)), 1)
    assert (head_only - some["survival"]).abs().max() > 0.05


@pytest.mark.parametrize("graphs", [False, True])
def test_the_draft_stage_refuses_to_drop_the_max_probability(models, monkeypatch, graphs):
    target, drafter = models
    monkeypatch.setattr(GraphDecoder, "keeps_max_prob", lambda self, rows=None: False)
    eng = head_engine(target, drafter, cuda_graphs=graphs)
    with pytest.raises(ValueError, match="sts_max_prob.*pass max_prob"):
        eng.generate(prompts_for(3, 2), SamplingParams(max_tokens=8, ignore_eos=True))


def test_step_trace_records_the_max_probability_and_the_fused_survival(models, tmp_path):
    from dspark.bench.planner_replay import recalibrated_survival
    from dspark.step_trace import StepTrace, calibration_rows

    target, drafter = models
    eng = Engine(target, None, tiny_engine_config(), drafter)
    trace = eng.start_step_trace()
    eng.generate(prompts_for(5, 3), SamplingParams(max_tokens=12, ignore_eos=True))
    z, p = np.concatenate(trace.confidence_logits), np.concatenate(trace.draft_max_prob)
    assert ((p > 0) & (p <= 1)).all() and p.std() > 0
    want = torch.cumprod(_formula(z, p, T_ENGINE, B_ENGINE, W_ENGINE), 1).numpy()
    np.testing.assert_allclose(np.concatenate(trace.survival), want, rtol=1e-5, atol=1e-6)
    back = StepTrace.load(trace.save(tmp_path / "t.npz"))
    np.testing.assert_array_equal(np.concatenate(back.draft_max_prob), p)
    rows = calibration_rows([tmp_path / "t.npz"])
    assert rows["draft_max_prob"].shape == rows["conf_logits"].shape
    # the planner replay recalibrates a traced head with the weights, and refuses to without max probabilities
    drafter.save(tmp_path / "cal")
    again = recalibrated_survival(back.confidence_logits, str(tmp_path / "cal"), 4, back.draft_max_prob)
    np.testing.assert_allclose(np.concatenate(again), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(SystemExit, match="sts_max_prob"):
        recalibrated_survival(back.confidence_logits, str(tmp_path / "cal"), 4, None)
    eng.reset()
    assert not eng.steps.trace_max_prob
    with pytest.raises(ValueError, match="draft_max_prob in every step or in none"):
        back.record([1], [[0.5, 0.2, 0.1, 0.0]], [4], [1], confidence_logits=[[0.0] * 4])


def test_an_engine_calibration_file_with_weights_is_what_the_planner_reads(models, tmp_path):
    """engine.confidence_calibration=DIR holding an sts_max_prob file: the engine's drafter weighs the max
    probability (the shared drafter keeps its own calibration), the counters name the method, outputs stay
    lossless; an engine on the draft_max_prob estimate names no head calibration."""
    target, _ = models
    plain = tiny_drafter(target, 22, block_size=4)
    save_temperatures(tmp_path, T_ENGINE, biases=B_ENGINE, max_prob_weights=W_ENGINE)
    prompts = prompts_for(23, 3)
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    base = run(target, None, prompts, sp)
    eng = head_engine(target, plain, confidence_calibration=str(tmp_path))
    assert eng.drafter.confidence_uses_max_prob and not plain.confidence_uses_max_prob
    assert eng.drafter.confidence_max_prob_weights.tolist() == pytest.approx(W_ENGINE)
    assert [o.token_ids for o in eng.generate(prompts, sp)] == [b.token_ids for b in base]
    counters = eng.counters()
    assert counters["confidence_calibration/sts_max_prob_steps"] == counters["decode_steps"] > 0
    assert not any(k.startswith("confidence_calibration/") and k != "confidence_calibration/sts_max_prob_steps"
                   for k in counters)
    assert head_engine(target, plain).counters()["confidence_calibration/none_steps"] == 0
    # a verify-all engine reads no survival: its steps skip the head, and it names no calibration
    assert not any(k.startswith("confidence_calibration/") for k in Engine(target, None, tiny_engine_config(),
                                                                           plain).counters())
    by_prob = Engine(target, None, tiny_engine_config(acceptance_estimate="draft_max_prob"), plain).counters()
    assert not any(k.startswith("confidence_calibration/") for k in by_prob)


def test_the_shipped_calibrations_load_for_the_shipped_drafter():
    """dspark/assets/dspark-smollm2/sts_max_prob/ and sts_top_gap/ (the options the model card and runners.ab's
    scheduled_vs_max_prob_calibration and scheduled_vs_top_gap_calibration name) are files of their methods and of
    the shipped drafter's block size, given as a folder or as the file; the drafter's own calibration is the head's
    alone (sts_bias)."""
    from pathlib import Path

    from dspark.training.calibration import calibration_method_of, load_calibration

    asset = Path(__file__).resolve().parents[1] / "dspark" / "assets" / "dspark-smollm2"
    block = json.loads((asset / "config.json").read_text())["drafter"]["block_size"]
    cal = load_calibration(asset / "sts_max_prob", block)
    assert cal.max_prob_weights is not None and cal.method == "sts_max_prob"
    assert calibration_method_of(asset / "sts_max_prob" / "temperatures.json") == "sts_max_prob"
    assert calibration_method_of(asset / "sts_top_gap") == "sts_top_gap"
    assert load_calibration(asset / "sts_top_gap", block).top_gap_weights.shape == (block,)
    assert calibration_method_of(asset) == "sts_bias"  # the drafter's own calibration


def test_shipped_calibrations_are_named_builtin_and_kept_to_their_drafter(tmp_path):
    """engine.confidence_calibration=builtin:NAME/SUB names a calibration shipped beside the drafter NAME (an
    unknown one is refused with the list of those shipped); one is refused for any other drafter, in the A/B's
    config check and where an engine is built. scheduled_vs_top_gap_calibration compares, as shipped, the drafter's
    own calibration (the head alone) against its shipped sts_top_gap calibration."""
    from dspark.training.calibration import calibration_method_of
    from runners import ab
    from runners.common import ASSETS, check_calibration_owner, resolve_calibration_path
    from test_configs import compose_ab

    asset = ASSETS / "dspark-smollm2"
    assert resolve_calibration_path("builtin:dspark-smollm2/sts_top_gap") == str(asset / "sts_top_gap")
    assert resolve_calibration_path("builtin:dspark-smollm2") == str(asset)
    assert resolve_calibration_path("/elsewhere/temperatures.json") == "/elsewhere/temperatures.json"
    with pytest.raises(ConfigError, match="not a calibration the package ships.*builtin:dspark-smollm2/sts_top_gap"):
        resolve_calibration_path("builtin:dspark-smollm2/sts_nothing")
    other = tmp_path / "my_drafter"
    other.mkdir()
    check_calibration_owner(str(asset / "sts_top_gap"), str(asset))  # its own drafter
    check_calibration_owner(str(tmp_path / "my_cal"), str(other))  # a calibration of one's own
    with pytest.raises(ConfigError, match="fitted for the shipped drafter builtin:dspark-smollm2"):
        check_calibration_owner(str(asset / "sts_max_prob" / "temperatures.json"), str(other))

    cfg = compose_ab(["ab=scheduled_vs_top_gap_calibration", "+workload=agentic"], out_dir=tmp_path / "ab")
    arms = ab.arm_engine_configs(cfg)
    assert arms["A"].confidence_calibration is None  # the drafter's own (sts_bias for the shipped one)
    assert calibration_method_of(arms["B"].confidence_calibration) == "sts_top_gap"
    ab.check_config(cfg)
    cfg = compose_ab(["ab=scheduled_vs_top_gap_calibration", "+workload=agentic", f"drafter.path={other}"],
                     out_dir=tmp_path / "ab2")
    with pytest.raises(ConfigError, match=r"ab.arms.B.engine.confidence_calibration: .*fitted for the shipped"):
        ab.check_config(cfg)
