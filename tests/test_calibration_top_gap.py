"""Calibration on the head AND the gap between the drafter's two largest logits (method=sts_top_gap):
c_k = sigmoid(z_k / T_k + b_k + v_k * g_k).

The maximum-likelihood fit recovers known coefficients; the weights round-trip through temperatures.json and
DSparkDrafter.save/load, a file or a drafter weighing both scores is refused; the drafter's, the kernel
reference's and the library's confidence follow the formula; the engine feeds each slot's top-2 gap to the
head's calibration on the device-resident (graph) path and the host-driven path, greedy and sampled rows alike,
stays lossless, and refuses to compute the survival without the gaps. All tiny and on CPU.
"""

from __future__ import annotations

import json

import pytest
import torch

from dspark.config import ConfigError, SamplingParams
from dspark.graph_decode import GraphDecoder
from dspark.models.drafter import DSparkDrafter
from dspark.survival import calibrated_confidence as survival_confidence
from dspark.training.calibration import (
    STS_TOP_GAP_METHOD,
    TEMPERATURES_FILE,
    bootstrap_ece,
    calibration_report,
    conditional_auc,
    fit_top_gap_calibration,
    load_calibration,
    save_temperatures,
)
from test_calibration_max_prob import head_engine, spy_draft_stage
from test_drafter import _make, _target_cfg
from test_engine_lossless import prompts_for, run
from tiny import tiny_drafter, tiny_target

A_TRUE = [0.8, 0.5, 1.2, 0.6]  # head coefficient a_k = 1 / T_k
V_TRUE = [0.4, 0.9, 0.25, 0.6]  # weight of the gap g_k
B_TRUE = [-0.5, -0.8, 0.1, -0.2]


def _gap_blocks(n_rows: int, seed: int):
    """Raw head logits z, gaps g >= 0 (correlated with z) and acceptance drawn sequentially from
    sigmoid(a z + v g + b), stopping at each row's first rejection."""
    gen = torch.Generator().manual_seed(seed)
    a, v, b = (torch.tensor(x, dtype=torch.float64) for x in (A_TRUE, V_TRUE, B_TRUE))
    z = 2.0 * torch.randn(n_rows, 4, generator=gen, dtype=torch.float64) + 1.0
    g = torch.nn.functional.softplus(0.5 * z + 1.5 * torch.randn(n_rows, 4, generator=gen, dtype=torch.float64))
    c = torch.sigmoid(a * z + v * g + b)
    accepted = torch.zeros_like(c)
    alive = torch.ones(n_rows, dtype=torch.bool)
    for k in range(4):
        hit = torch.rand(n_rows, generator=gen, dtype=torch.float64) < c[:, k]
        accepted[:, k] = (alive & hit).double()
        alive &= hit
    return z, g, accepted


def _formula(z, g, t, b, v):
    """sigmoid(z / T + b + v * g), written out."""
    f64 = lambda x: torch.as_tensor(x, dtype=torch.float64)  # noqa: E731
    return torch.sigmoid(f64(z) / f64(t) + f64(b) + f64(v) * f64(g))


def test_fit_recovers_known_coefficients_and_reports_the_fused_ranking(tmp_path):
    z, g, accepted = _gap_blocks(20000, seed=0)
    cal = fit_top_gap_calibration(z, g, accepted)
    assert cal.max_prob_weights is None and cal.method == "sts_top_gap"
    assert all(x.dtype == torch.float32 and x.shape == (4,) for x in (cal.temperatures, cal.biases,
                                                                       cal.top_gap_weights))
    torch.testing.assert_close(1.0 / cal.temperatures.double(), torch.tensor(A_TRUE, dtype=torch.float64),
                               atol=0.12, rtol=0)
    torch.testing.assert_close(cal.top_gap_weights.double(), torch.tensor(V_TRUE, dtype=torch.float64),
                               atol=0.12, rtol=0)
    torch.testing.assert_close(cal.biases.double(), torch.tensor(B_TRUE, dtype=torch.float64), atol=0.15, rtol=0)
    report = calibration_report(z, accepted, cal.temperatures, cal.biases, top_gap=g,
                                top_gap_weights=cal.top_gap_weights)
    assert report["method"] == STS_TOP_GAP_METHOD and report["top_gap_weights"] == pytest.approx(
        cal.top_gap_weights.tolist())
    fused = _formula(z, g, cal.temperatures, cal.biases, cal.top_gap_weights)
    assert report["auc_overall"] == pytest.approx(conditional_auc(fused, accepted)["auc_overall"], abs=1e-9)
    assert report["head_auc"] == conditional_auc(torch.sigmoid(z), accepted)
    assert report["auc_overall"] > report["head_auc"]["auc_overall"] + 0.01  # the gap carries information
    assert report["ece_after"] < 0.02
    boot = bootstrap_ece(z, accepted, cal.temperatures, torch.arange(z.shape[0]) // 10, biases=cal.biases,
                         top_gap=g, top_gap_weights=cal.top_gap_weights, n_resamples=20)
    assert boot["point"] == pytest.approx(report["ece_after"], abs=1e-12)
    # the fit and the report refuse what is not a gap, or a calibration weighing both scores
    with pytest.raises(ValueError, match="top_gap must be >= 0"):
        fit_top_gap_calibration(z, -g, accepted)
    with pytest.raises(ValueError, match="need top_gap"):
        calibration_report(z, accepted, cal.temperatures, cal.biases, top_gap_weights=cal.top_gap_weights)
    with pytest.raises(ValueError, match="one drafter score at most"):
        calibration_report(z, accepted, cal.temperatures, cal.biases, max_prob=torch.rand_like(z),
                           max_prob_weights=[0.0] * 4, top_gap=g, top_gap_weights=cal.top_gap_weights)
    # round trip through temperatures.json
    path = save_temperatures(tmp_path, cal.temperatures, biases=cal.biases, top_gap_weights=cal.top_gap_weights)
    payload = json.loads(path.read_text())
    assert payload["method"] == STS_TOP_GAP_METHOD and "max_prob_weights" not in payload
    back = load_calibration(tmp_path, 4)
    assert back.method == "sts_top_gap" and back.max_prob_weights is None
    assert back.top_gap_weights.tolist() == pytest.approx(cal.top_gap_weights.tolist())
    with pytest.raises(ValueError, match="one drafter score at most"):
        save_temperatures(tmp_path / "both", [1.0] * 4, max_prob_weights=[0.0] * 4, top_gap_weights=[0.0] * 4)


@pytest.mark.parametrize("payload, match", [
    ({"method": STS_TOP_GAP_METHOD}, "has no 'top_gap_weights' list"),
    ({"method": "sequential_temperature_bias_scaling", "top_gap_weights": [0.0] * 4}, "takes no 'top_gap_weights'"),
    ({"method": STS_TOP_GAP_METHOD, "top_gap_weights": [0.0, 1.0]}, "holds 2 top gap weights"),
    ({"method": STS_TOP_GAP_METHOD, "top_gap_weights": [0.0, "x", 0.0, 0.0]}, "must be a list of 4 finite"),
])
def test_malformed_top_gap_files_are_refused(tmp_path, payload, match):
    (tmp_path / TEMPERATURES_FILE).write_text(json.dumps({"temperatures": [1.0] * 4, "biases": [0.0] * 4,
                                                          **payload}))
    with pytest.raises(ValueError, match=match):
        load_calibration(tmp_path, 4)


def test_drafter_top_gap_weights_round_trip_and_formula(tmp_path):
    cfg = _target_cfg()
    drafter = _make(cfg)
    temps, biases, weights = [0.5, 1.0, 2.0, 4.0], [-1.0, 0.25, 0.0, 2.0], [0.5, -0.25, 0.0, 0.75]
    buffer = drafter.confidence_top_gap_weights
    drafter.set_confidence_temperatures(temps, biases, None, weights)
    assert drafter.confidence_top_gap_weights is buffer  # in place: a captured graph sees the values
    assert drafter.confidence_uses_top_gap and not drafter.confidence_uses_max_prob
    assert drafter.confidence_calibration_method == "sts_top_gap"
    z = torch.tensor([[1.0, -2.0, 3.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
    g = torch.tensor([[0.0, 3.5, 10.0, 0.25], [1.0, 0.5, 2.0, 7.0]])
    expected = _formula(z, g, temps, biases, weights).float()
    torch.testing.assert_close(drafter.calibrated_confidence(z, top_gap=g), expected)
    torch.testing.assert_close(survival_confidence(z, torch.tensor(temps), torch.tensor(biases), top_gap=g,
                                                   top_gap_weights=torch.tensor(weights)), expected)
    assert not torch.allclose(survival_confidence(z, torch.tensor(temps), torch.tensor(biases)), expected)
    with pytest.raises(ValueError, match="sts_top_gap.*pass top_gap"):
        drafter.calibrated_confidence(z, torch.rand(2, 4))  # a max probability is not the gap
    with pytest.raises(ValueError, match=r"top_gap must be \[B, G\]"):
        survival_confidence(z, torch.tensor(temps), None, top_gap=g[:, :3], top_gap_weights=torch.tensor(weights))
    drafter.save(tmp_path)
    payload = json.loads((tmp_path / TEMPERATURES_FILE).read_text())
    assert payload["top_gap_weights"] == weights and payload["method"] == STS_TOP_GAP_METHOD
    loaded = DSparkDrafter.load(tmp_path, cfg).to(torch.bfloat16)
    assert loaded.confidence_uses_top_gap and loaded.confidence_top_gap_weights.dtype == torch.float32
    assert loaded.calibration_values() == (temps, biases, None, weights)
    twin = loaded.with_calibration(temps, biases)
    assert not twin.confidence_uses_top_gap and loaded.confidence_uses_top_gap
    with pytest.raises(ConfigError, match="one drafter score at most"):
        drafter.set_confidence_temperatures(temps, biases, weights, weights)
    with pytest.raises(ConfigError, match="top_gap_weights must be finite"):
        drafter.set_confidence_temperatures(temps, biases, None, [0.0, float("inf"), 0.0, 0.0])


# ------------------------------------------------------------------------------ the engine

T_ENGINE, B_ENGINE, V_ENGINE = [0.8, 1.5, 1.0, 0.6], [0.3, -0.4, 0.2, 0.1], [0.9, -0.6, 0.7, 1.2]


@pytest.fixture(scope="module")
def models():
    target = tiny_target(21)
    drafter = tiny_drafter(target, 22, block_size=4)
    drafter.set_confidence_temperatures(T_ENGINE, B_ENGINE, None, V_ENGINE)
    return target, drafter


def _sorted_gap(logits: torch.Tensor) -> torch.Tensor:
    """The largest logit minus the second largest, from a full sort (not the engine's topk or kernel)."""
    top = logits.float().sort(-1, descending=True).values
    return top[:, 0] - top[:, 1]


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("graphs", [False, True])
def test_the_draft_stage_feeds_the_top_gap_to_the_calibration_losslessly(models, monkeypatch, sampled, graphs):
    target, drafter = models
    prompts = prompts_for(41, 4)
    params = [SamplingParams(max_tokens=14, ignore_eos=True, **({"temperature": 0.8, "seed": 7 + i} if sampled
                                                               else {})) for i in range(len(prompts))]
    base = run(target, None, prompts, params)
    seen = spy_draft_stage(monkeypatch, "top_gap", _sorted_gap)
    eng = head_engine(target, drafter, cuda_graphs=graphs, max_num_seqs=4)
    outs = eng.generate(prompts, params)
    monkeypatch.undo()
    if not sampled:
        assert [o.token_ids for o in outs] == [b.token_ids for b in base]
    assert eng.steps.keeps_top_gap() and not eng.steps.keeps_max_prob()
    c = eng.counters()
    assert c["confidence_calibration/sts_top_gap_steps"] == c["decode_steps"] > 0
    assert seen
    for step in seen:
        torch.testing.assert_close(step["top_gap"], step["independent"], rtol=0, atol=0)
        want = torch.cumprod(_formula(step["logits"], step["top_gap"], T_ENGINE, B_ENGINE, V_ENGINE), 1)
        torch.testing.assert_close(step["survival"].double(), want, rtol=1e-5, atol=1e-6)
    gaps = torch.cat([s["top_gap"] for s in seen])
    assert bool((gaps >= 0).all()) and gaps.std() > 0
    # the weights matter here: the head's own calibration would have given another survival
    some = seen[0]
    head_only = torch.cumprod(torch.sigmoid(some["logits"] / torch.tensor(T_ENGINE) + torch.tensor(B_ENGINE)), 1)
    assert (head_only - some["survival"]).abs().max() > 0.05


@pytest.mark.parametrize("graphs", [False, True])
def test_the_draft_stage_refuses_to_drop_the_top_gap(models, monkeypatch, graphs):
    target, drafter = models
    monkeypatch.setattr(GraphDecoder, "keeps_top_gap", lambda self, rows=None: False)
    eng = head_engine(target, drafter, cuda_graphs=graphs)
    with pytest.raises(ValueError, match="sts_top_gap.*pass top_gap"):
        eng.generate(prompts_for(3, 2), SamplingParams(max_tokens=8, ignore_eos=True))


def test_an_engine_calibration_file_with_top_gap_weights_steers_the_engine(models, tmp_path):
    """engine.confidence_calibration=DIR holding an sts_top_gap file: the engine's drafter weighs the gap (the
    shared drafter keeps its own calibration), the counters name the method, a step trace's survival is the
    fused formula, and the planner replay refuses the file (traces keep no gaps)."""
    from dspark.bench.planner_replay import recalibrated_survival

    target, _ = models
    plain = tiny_drafter(target, 22, block_size=4)
    save_temperatures(tmp_path, T_ENGINE, biases=B_ENGINE, top_gap_weights=V_ENGINE)
    eng = head_engine(target, plain, confidence_calibration=str(tmp_path))
    assert eng.drafter.confidence_uses_top_gap and not plain.confidence_uses_top_gap
    trace = eng.start_step_trace()
    eng.generate(prompts_for(23, 3), SamplingParams(max_tokens=12, ignore_eos=True))
    counters = eng.counters()
    assert counters["confidence_calibration/sts_top_gap_steps"] == counters["decode_steps"] > 0
    assert len(trace.survival) > 0
    with pytest.raises(SystemExit, match="sts_top_gap"):
        recalibrated_survival(trace.confidence_logits, str(tmp_path), 4, trace.draft_max_prob)


def test_a_stage_that_skips_the_head_computes_no_gaps(models, monkeypatch):
    """A device-resident draft stage of fewer rows than confidence_min_rows skips the head (the engine plans no
    such step), and with it the gaps only the head's calibration reads: its argmax gets no gap_out. A
    host-driven stage of the same rows runs both."""
    import dspark.sampling

    target, drafter = models
    asked: list[bool] = []
    real = dspark.sampling.greedy_argmax

    def spy(logits, kernels=None, top_out=None, gap_out=None):
        asked.append(gap_out is not None)
        return real(logits, kernels, top_out, gap_out)

    monkeypatch.setattr(dspark.sampling, "greedy_argmax", spy)
    for graphs in (True, False):
        asked.clear()
        eng = head_engine(target, drafter, cuda_graphs=graphs, max_num_seqs=4)
        eng.steps.confidence_min_rows = 8
        eng.generate(prompts_for(7, 2), SamplingParams(max_tokens=10, ignore_eos=True))
        assert any(asked) != graphs, (graphs, asked)  # (the target's own greedy choices ask for none either)
        assert not eng.steps.keeps_top_gap(2) and eng.steps.keeps_top_gap(8) and eng.steps.keeps_top_gap()


T_OWN, B_OWN = [1.2, 0.9, 1.1, 0.7], [0.2, 0.1, -0.3, 0.4]  # the drafter's own calibration (sts_bias) below


@pytest.mark.parametrize("graphs", [False, True])
def test_a_greedy_calibration_steers_the_all_greedy_steps_and_no_others(models, tmp_path, monkeypatch, graphs):
    """engine.greedy_confidence_calibration: a step whose rows all decode greedily reads that calibration (here
    sts_top_gap, with the gaps it weighs), a step with a sampled row reads the drafter's own (sts_bias), and the
    counters say which read what; greedy outputs stay the target's."""
    target, _ = models
    plain = tiny_drafter(target, 22, block_size=4)
    plain.set_confidence_temperatures(T_OWN, B_OWN)
    save_temperatures(tmp_path, T_ENGINE, biases=B_ENGINE, top_gap_weights=V_ENGINE)
    prompts = prompts_for(41, 4)
    greedy = [SamplingParams(max_tokens=14, ignore_eos=True) for _ in prompts]
    sampled = [SamplingParams(max_tokens=14, ignore_eos=True, temperature=0.8, seed=7 + i) for i in range(4)]
    mixed = [*greedy[:2], *sampled[2:]]
    base = run(target, None, prompts, greedy)
    for params, reads_gap in ((greedy, True), (sampled, False), (mixed, False)):
        seen = spy_draft_stage(monkeypatch, "top_gap", _sorted_gap)
        eng = head_engine(target, plain, cuda_graphs=graphs, max_num_seqs=4,
                          greedy_confidence_calibration=str(tmp_path))
        outs = eng.generate(prompts, params)
        monkeypatch.undo()
        assert eng.drafter is plain and eng.steps.greedy_drafter.fc.weight.data_ptr() == plain.fc.weight.data_ptr()
        if params is greedy:
            assert [o.token_ids for o in outs] == [b.token_ids for b in base]
        c = eng.counters()
        steps = c["decode_steps"]
        # the last steps of a mixed run may hold its greedy rows alone: count the stages each calibration served
        assert c["confidence_calibration/greedy_sts_top_gap_steps"] + c["confidence_calibration/sts_bias_steps"] \
            == c["confidence_head_steps"] == steps > 0
        if params is not mixed:
            assert c["confidence_calibration/greedy_sts_top_gap_steps"] == (steps if reads_gap else 0)
        assert seen
        for step in seen if params is not mixed else seen[:1]:  # a mixed run's first stage holds every row
            if reads_gap:
                torch.testing.assert_close(step["top_gap"], step["independent"], rtol=0, atol=0)
                want = _formula(step["logits"], step["top_gap"], T_ENGINE, B_ENGINE, V_ENGINE)
            else:
                want = _formula(step["logits"], 0.0, T_OWN, B_OWN, 0.0)
            torch.testing.assert_close(step["survival"].double(), torch.cumprod(want, 1), rtol=1e-5, atol=1e-6)
    if not graphs:  # a step trace (eager steps) records the survival the step read
        eng = head_engine(target, plain, greedy_confidence_calibration=str(tmp_path))
        trace = eng.start_step_trace()
        eng.generate(prompts, greedy)
        assert eng.steps.keeps_top_gap() and len(trace.survival) > 0
        z = torch.from_numpy(trace.confidence_logits[0]).double()
        own = torch.cumprod(_formula(z, 0.0, T_OWN, B_OWN, 0.0), 1)
        assert (torch.from_numpy(trace.survival[0]).double() - own).abs().max() > 0.01  # not the drafter's own


def test_a_greedy_calibration_is_refused_where_it_cannot_steer(models, tmp_path):
    from tiny import tiny_engine_config

    target, drafter = models
    save_temperatures(tmp_path, T_ENGINE, biases=B_ENGINE, top_gap_weights=V_ENGINE)
    where = str(tmp_path)
    for kw, match in (({"spec": "off"}, "spec=dspark"), ({"acceptance_estimate": "draft_max_prob"}, "estimate=head"),
                      ({"online_calibration": True, "verify": "ragged"}, "online_calibration=false")):
        with pytest.raises(ConfigError, match=f"greedy_confidence_calibration.*{match}"):
            tiny_engine_config(greedy_confidence_calibration=where, **kw)
    with pytest.raises(ConfigError, match="engine.greedy_confidence_calibration: .*not found"):
        head_engine(target, drafter, greedy_confidence_calibration=str(tmp_path / "none"))
