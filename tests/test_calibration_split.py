"""Out-of-sample calibration: the fit/report split by sequence, the bootstrap interval of the
reported ECE, many-anchor replay with bounded memory, bad-value errors, and runners.calibrate
end to end with fit_fraction on a tiny random target (CPU, seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from dspark.config import ConfigError, SamplingParams
from dspark.engine import Engine
from dspark.training.calibration import (bootstrap_ece, calibration_report, conditional_auc, reached_cells,
                                         roc_auc, split_sequences)
from dspark.training.data import TokenDataset, make_batch
from dspark.training.trainer import dense_target_forward, replay_block_acceptance, replay_blocks, sample_anchors
from tiny import tiny_drafter, tiny_engine_config, tiny_target

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


def _blocks(n_seq: int, per_seq: int, seed: int = 0, block: int = 4):
    """Synthetic blocks: logits, sequential acceptance drawn from sigmoid(z / 1.7), and a sequence id per block."""
    g = torch.Generator().manual_seed(seed)
    m = n_seq * per_seq
    z = 2.0 * torch.randn(m, block, generator=g, dtype=torch.float64) + 1.0
    p = torch.sigmoid(z / 1.7)
    accepted = torch.zeros_like(p)
    alive = torch.ones(m, dtype=torch.bool)
    for k in range(block):
        hit = torch.rand(m, generator=g, dtype=torch.float64) < p[:, k]
        accepted[:, k] = (alive & hit).double()
        alive &= hit
    seq = torch.arange(n_seq).repeat_interleave(per_seq)
    return z, accepted, seq


# ------------------------------------------------------------------------------ split


def test_split_is_by_sequence_disjoint_covering_and_seeded():
    seq = torch.tensor([5, 5, 5, 9, 9, 2, 2, 2, 2, 7, 11, 11, 3, 3, 3, 3, 8, 8, 4, 4])
    fit, rep = split_sequences(seq, 0.5, seed=3)
    assert bool((fit ^ rep).all())  # every block on exactly one side
    fit_seqs, rep_seqs = set(seq[fit].tolist()), set(seq[rep].tolist())
    assert not fit_seqs & rep_seqs and fit_seqs | rep_seqs == set(seq.tolist())
    assert len(fit_seqs) == 4 and len(rep_seqs) == 4  # round(0.5 * 8)
    again, _ = split_sequences(seq, 0.5, seed=3)
    assert torch.equal(fit, again)
    others = {tuple(split_sequences(seq, 0.5, seed=s)[0].tolist()) for s in range(8)}
    assert len(others) > 1  # the seed matters
    fit_small, _ = split_sequences(seq, 0.3, seed=0)
    assert len(set(seq[fit_small].tolist())) == 2  # round(0.3 * 8)


@pytest.mark.parametrize("bad", [0, 1, 0.0, 1.0, -0.2, 1.5, float("nan"), True, "0.5", None])
def test_split_rejects_fractions_outside_the_open_interval(bad):
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        split_sequences(torch.arange(10), bad, seed=0)


def test_split_needs_enough_sequences_on_each_side():
    with pytest.raises(ValueError, match="each part needs at least 2"):
        split_sequences(torch.tensor([0, 0, 1, 1, 2]), 0.5, seed=0)  # 3 sequences
    with pytest.raises(ValueError, match="each part needs at least 2"):
        split_sequences(torch.arange(10), 0.9, seed=0)  # 9 / 1
    fit, rep = split_sequences(torch.arange(10), 0.8, seed=0)  # 8 / 2 is fine
    assert int(fit.sum()) == 8 and int(rep.sum()) == 2


# ------------------------------------------------------------------------------ bootstrap


def test_bootstrap_point_is_the_report_ece_and_the_interval_contains_it():
    z, a, seq = _blocks(120, 20, seed=1)  # acceptance drawn at temperature 1.7
    t = torch.ones(4, dtype=torch.float64)  # raw head: miscalibrated by several percent
    out = bootstrap_ece(z, a, t, seq, n_resamples=200, seed=5)
    assert out["point"] == pytest.approx(calibration_report(z, a, t)["ece_after"], abs=1e-12)
    assert out["point"] > 0.03
    assert out["low"] <= out["point"] <= out["high"] and out["low"] < out["high"]
    assert out["sequences"] == 120 and out["blocks"] == 2400 and out["resamples"] == 200
    assert out == bootstrap_ece(z, a, t, seq, n_resamples=200, seed=5)  # deterministic given the seed
    assert out["high"] != bootstrap_ece(z, a, t, seq, n_resamples=200, seed=6)["high"]
    # the true temperature: ECE falls to the noise floor of 2,400 blocks, and the interval says it is lower
    good = bootstrap_ece(z, a, torch.full((4,), 1.7, dtype=torch.float64), seq, n_resamples=200, seed=5)
    assert good["high"] < out["low"]
    assert good["point"] < 2.5 * good["noise_floor"] and out["point"] > 2.5 * out["noise_floor"]
    # near perfect calibration ECE is noise-dominated and the percentile interval leans upward (conservative)
    assert good["low"] >= 0.75 * good["point"]


def test_bootstrap_resample_equals_ece_of_the_drawn_blocks():
    """One resample's value is calibration_report's ECE over the blocks of the drawn sequences, duplicates kept."""
    z, a, seq = _blocks(9, 7, seed=2)
    t = torch.tensor([1.2, 0.8, 2.0, 1.0], dtype=torch.float64)
    out = bootstrap_ece(z, a, t, seq, n_resamples=1, seed=11, confidence=0.5)
    draws = torch.randint(9, (1, 9), generator=torch.Generator().manual_seed(11))[0]
    rows = torch.cat([torch.nonzero(seq == s).reshape(-1) for s in draws.tolist()])
    expected = calibration_report(z[rows], a[rows], t)["ece_after"]
    assert out["low"] == pytest.approx(expected, abs=1e-12) and out["high"] == pytest.approx(expected, abs=1e-12)


def test_bootstrap_errors():
    z, a, seq = _blocks(4, 3)
    t = torch.ones(4, dtype=torch.float64)
    with pytest.raises(ValueError, match="one per block"):
        bootstrap_ece(z, a, t, seq[:-1])
    with pytest.raises(ValueError, match="at least 2 sequences"):
        bootstrap_ece(z, a, t, torch.zeros_like(seq))
    with pytest.raises(ValueError, match="n_resamples"):
        bootstrap_ece(z, a, t, seq, n_resamples=0)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ece(z, a, t, seq, confidence=1.0)


# ------------------------------------------------------------------------------ replay with many anchors


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_target(scale=2.0)


@pytest.fixture(scope="module")
def data(target) -> TokenDataset:
    engine = Engine(target, None, tiny_engine_config(spec="off", max_num_seqs=16))
    gen = torch.Generator().manual_seed(321)
    prompts = [torch.randint(3, 97, (int(torch.randint(3, 7, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(16)]
    outs = engine.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    return TokenDataset.from_sequences([o.prompt_token_ids + o.token_ids for o in outs],
                                       [len(o.prompt_token_ids) for o in outs], ["a"] * len(outs),
                                       info={"split": "train", "exclude_prompts": [{"entry": "test"}]})


def test_sample_anchors_every_position_with_stride():
    lengths, starts = torch.tensor([20, 9, 4, 3]), torch.tensor([5, 4, 3, 3])
    anchors, valid = sample_anchors(lengths, starts, None, 4, torch.Generator(), require_full_block=False, stride=3)
    assert anchors[0][valid[0]].tolist() == [4, 7, 10, 13, 16]  # [start-1, length-2] every 3rd
    assert anchors[1][valid[1]].tolist() == [3, 6]
    assert anchors[2][valid[2]].tolist() == [2]
    assert not valid[3].any() and anchors.shape == (4, 5)  # no response position: no anchor
    # stride 1 and a count: the historical sampler (same generator draws)
    a1, v1 = sample_anchors(lengths, starts, 4, 4, torch.Generator().manual_seed(0), require_full_block=False)
    g = torch.Generator().manual_seed(0)
    assert a1[0].tolist() == (torch.randperm(15, generator=g)[:4].sort().values + 4).tolist()
    with pytest.raises(ValueError, match="stride"):
        sample_anchors(lengths, starts, None, 4, torch.Generator(), stride=0)


def two_sequences_to_replay(target):
    """(drafter, batch, anchors): a block-4 drafter and two short sequences, anchored at every response position."""
    drafter = tiny_drafter(target, block_size=4).eval()
    batch = make_batch(TokenDataset.from_sequences([list(range(3, 30)), list(range(40, 60))], [4, 5], ["a", "a"]),
                       [0, 1], 64)
    anchors, _ = sample_anchors(batch.lengths + 1, batch.response_starts, None, 4, torch.Generator(),
                                require_full_block=False)
    return drafter, batch, anchors


def test_replay_in_anchor_chunks_equals_one_pass(target):
    drafter, batch, anchors = two_sequences_to_replay(target)
    whole = replay_blocks(target, drafter, batch.input_ids, anchors)
    chunked = replay_blocks(target, drafter, batch.input_ids, anchors, anchor_chunk=5)
    assert torch.equal(whole["tokens"], chunked["tokens"]) and torch.equal(whole["accepted"], chunked["accepted"])
    torch.testing.assert_close(whole["conf_logits"], chunked["conf_logits"], rtol=1e-4, atol=1e-5)


def test_replay_keeps_the_logits_it_drafted_and_verified_with_only_when_asked(target):
    drafter, batch, anchors = two_sequences_to_replay(target)
    plain = replay_blocks(target, drafter, batch.input_ids, anchors)
    assert "draft_logits" not in plain and "target_logits" not in plain
    for chunk in (None, 5):
        kept = replay_blocks(target, drafter, batch.input_ids, anchors, anchor_chunk=chunk, keep_logits=True)
        shape = (*anchors.shape, 4, target.cfg.vocab_size)
        assert kept["draft_logits"].shape == kept["target_logits"].shape == shape
        assert kept["draft_logits"].dtype == kept["target_logits"].dtype == torch.float32
        assert torch.equal(kept["tokens"], plain["tokens"]) and torch.equal(kept["accepted"], plain["accepted"])
        assert torch.equal(kept["draft_logits"].argmax(-1), kept["tokens"])  # greedy: each slot drafts its argmax
        assert torch.equal(kept["target_logits"].argmax(-1) == kept["tokens"], kept["accepted"])


def test_replay_block_acceptance_all_anchors_names_sequences(target, data):
    drafter = tiny_drafter(target, block_size=4)
    out = replay_block_acceptance(target, drafter, data, max_len=40, anchors_per_seq=None, anchor_stride=2,
                                  anchor_chunk=4, batch_size=5)
    per_seq = torch.bincount(out["seq_index"], minlength=len(data))
    for i in range(len(data)):
        p_len, length = int(data.prompt_lens[i]), data.length(i)
        assert int(per_seq[i]) == len(range(p_len - 1, length, 2))  # anchors in [start-1, length-1], stride 2
    assert out["conf_logits"].shape == out["accepted"].shape == out["draft_max_prob"].shape == (int(per_seq.sum()), 4)
    assert out["anchor"].shape == out["seq_index"].shape
    assert bool(((out["draft_max_prob"] > 0) & (out["draft_max_prob"] <= 1)).all())


def test_conditional_auc_ranks_each_position_among_the_rows_that_reached_it():
    accepted = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1], [1, 0, 0]], dtype=torch.float64)
    scores = torch.tensor([[.9, .8, .1], [.7, .2, .9], [.3, .9, .9], [.8, .6, .7], [.6, .5, .2]], dtype=torch.float64)
    out = conditional_auc(scores, accepted)
    # position 1: rows 0, 1, 3, 4 reached it (row 2 stopped at 0); position 2: rows 0 and 3
    assert out["auc_per_position"][0] == roc_auc(scores[:, 0], accepted[:, 0])
    assert out["auc_per_position"][1] == roc_auc(scores[[0, 1, 3, 4], 1], accepted[[0, 1, 3, 4], 1]) == 1.0
    assert out["auc_per_position"][2] == roc_auc(scores[[0, 3], 2], accepted[[0, 3], 2])
    assert reached_cells(accepted).tolist() == [[True, True, True], [True, True, False], [True, False, False],
                                       [True, True, True], [True, True, False]]
    # only the order counts: the same AUCs from logits as from probabilities, as the head's report has them
    assert conditional_auc(torch.logit(scores), accepted)["auc_per_position"] == out["auc_per_position"]
    report = calibration_report(torch.logit(scores), accepted, torch.ones(3))
    assert report["auc_per_position"] == out["auc_per_position"] and report["auc_overall"] == out["auc_overall"]


def test_replay_records_the_drafters_probability_of_each_drafted_token(target, data):
    """draft_max_prob is the drafter's softmax probability of the token it drafted (its argmax), slot by slot:
    re-drafting with a sampler that reads the same logits gives the same tokens and those probabilities."""
    drafter = tiny_drafter(target, block_size=4)
    batch = make_batch(data, list(range(4)), 40, 0)
    anchors, _ = sample_anchors(batch.lengths + 1, batch.response_starts, 3, 4, torch.Generator().manual_seed(0),
                                require_full_block=False)
    out = replay_blocks(target, drafter, batch.input_ids, anchors)
    seen = []

    def keep(logits, k):
        seen.append(torch.softmax(logits.float(), -1))
        return logits.argmax(-1)

    _, captured, _ = dense_target_forward(target, batch.input_ids, drafter.cfg.target_layer_ids, return_kv=True)
    dummy = torch.zeros(*anchors.shape, 4, dtype=torch.int64)
    hidden = drafter.forward_train(captured, batch.input_ids, anchors, target.embed, target.lm_head_weight,
                                   dummy).hidden
    n, a = anchors.shape
    drafted = drafter.draft(hidden.reshape(n * a, 4, -1), batch.input_ids.gather(1, anchors).reshape(-1),
                            target.lm_head_weight, keep)
    probs = torch.stack(seen, 1)  # [n*a, 4, V]
    picked = probs.gather(-1, drafted.tokens.view(n * a, 4, 1)).squeeze(-1).view(n, a, 4)
    assert torch.equal(drafted.tokens.view(n, a, 4), out["tokens"])
    torch.testing.assert_close(out["draft_max_prob"], picked)
    torch.testing.assert_close(out["draft_max_prob"], probs.amax(-1).view(n, a, 4))


def _replay_setup(target, data, rows: int = 6):
    drafter = tiny_drafter(target, block_size=4).eval()
    with torch.no_grad():
        drafter.norm.weight.mul_(0.05)  # drafts of some spread (the top token about 0.2-0.75), not one-hot
    batch = make_batch(data, list(range(rows)), 40, 0)
    anchors, valid = sample_anchors(batch.lengths + 1, batch.response_starts, None, 4, torch.Generator(),
                                    require_full_block=False)
    return drafter, batch, anchors, valid


def test_a_sampled_replay_near_zero_temperature_is_the_greedy_replay(target, data):
    """Drawn at a temperature near 0, the drafts are the drafter's argmax and rejection sampling accepts a slot
    exactly when it is the target's argmax: the greedy replay's tokens and acceptance (a ratio written the other
    way round, q/p, would accept every draft). Seeded: the same generator state gives the same replay."""
    drafter, batch, anchors, valid = _replay_setup(target, data)
    greedy = replay_blocks(target, drafter, batch.input_ids, anchors)
    cold = replay_blocks(target, drafter, batch.input_ids, anchors, temperature=1e-4,
                         generator=torch.Generator().manual_seed(0))
    assert torch.equal(cold["tokens"][valid], greedy["tokens"][valid])
    assert torch.equal(cold["accepted"][valid], greedy["accepted"][valid])
    assert 0 < int(greedy["accepted"][valid].sum()) < greedy["accepted"][valid].numel()
    warm = [replay_blocks(target, drafter, batch.input_ids, anchors, temperature=0.9,
                          generator=torch.Generator().manual_seed(5)) for _ in range(2)]
    assert torch.equal(warm[0]["tokens"], warm[1]["tokens"]) and torch.equal(warm[0]["accepted"], warm[1]["accepted"])
    assert not torch.equal(warm[0]["tokens"][valid], greedy["tokens"][valid])  # it does sample
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        replay_blocks(target, drafter, batch.input_ids, anchors, temperature=-0.5)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
@torch.no_grad()
def test_a_sampled_replay_accepts_the_first_slot_as_often_as_rejection_sampling_does(target, data, temperature):
    """At temperature t the first slot is accepted with probability sum_v min(p(v), q(v)): the drafter's
    distribution q = softmax(logits / t) at that slot and the target's p = softmax(logits / t) at the anchor, both
    computed here on their own (the target's full forward; the drafter's first-slot logits). Over 300 replays the
    acceptance of each block's first slot averages to it within binomial noise."""
    drafter, batch, anchors, valid = _replay_setup(target, data)
    hidden_t, captured, _ = dense_target_forward(target, batch.input_ids, drafter.cfg.target_layer_ids,
                                                 return_kv=True)
    p = torch.softmax(target.compute_logits(hidden_t).float() / temperature, -1)  # [B, S, V]: a predicts slot 1
    p_first = p.gather(1, anchors[..., None].expand(-1, -1, p.shape[-1]))  # [B, A, V]
    n, a = anchors.shape
    dummy = torch.zeros(n, a, 4, dtype=torch.int64)
    hidden = drafter.forward_train(captured, batch.input_ids, anchors, target.embed, target.lm_head_weight,
                                   dummy).hidden
    first = []
    drafter.draft(hidden.reshape(n * a, 4, -1), batch.input_ids.gather(1, anchors).reshape(-1),
                  target.lm_head_weight, lambda logits, k: first.append(logits) or logits.argmax(-1))
    q_first = torch.softmax(first[0].float() / temperature, -1).view(n, a, -1)
    expected = torch.minimum(p_first, q_first).sum(-1)[valid]  # the analytical acceptance of slot 1
    gen = torch.Generator().manual_seed(11)
    runs = 300
    seen = torch.stack([replay_blocks(target, drafter, batch.input_ids, anchors, temperature=temperature,
                                      generator=gen)["accepted"][..., 0][valid].float() for _ in range(runs)])
    got, want = seen.mean(), expected.mean()
    sigma = (expected * (1 - expected)).sum().sqrt() / (expected.numel() * runs ** 0.5)
    assert 0.05 < float(want) < 0.95 and abs(float(got - want)) < 4 * float(sigma), (float(got), float(want))
    per_block = seen.mean(0)
    assert torch.corrcoef(torch.stack([per_block, expected]))[0, 1] > 0.8  # block by block too, not only on average


# ------------------------------------------------------------------------------ runner


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, target):
    """A drafter whose confidence head carries signal: a tiny model trained briefly on greedy data."""
    from dspark.training.trainer import DrafterTrainer, TrainConfig

    out = tmp_path_factory.mktemp("cal")
    engine = Engine(target, None, tiny_engine_config(spec="off", max_num_seqs=16))
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 97, (4,), generator=gen).tolist() for _ in range(16)]
    outs = engine.generate(prompts, SamplingParams(max_tokens=28, ignore_eos=True))
    train = TokenDataset.from_sequences([o.prompt_token_ids + o.token_ids for o in outs],
                                        [len(o.prompt_token_ids) for o in outs], ["a"] * 16)
    drafter = tiny_drafter(target, block_size=4)
    DrafterTrainer(target, drafter, train, TrainConfig(output_dir=str(out / "run"), max_steps=20, batch_size=6,
                                                       max_len=40, anchors_per_seq=6, lr=1e-2, warmup_steps=2,
                                                       save_every=1000, log_every=5, progress=False, seed=0)).train()
    drafter.set_confidence_temperatures([1.3, 0.9, 1.1, 2.0])  # "previously shipped" temperatures
    return drafter.save(out / "final")


def _compose(*overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="calibrate", overrides=["max_len=40", "progress=false", "n_grid=40", *overrides])


def _runner_setup(tmp_path, data, checkpoint) -> tuple[Path, Path, list[str]]:
    """A copy of the drafter to calibrate, the replay cache path, and the overrides every run on the saved data
    shares (split in half, every anchor, a small bootstrap, the cache)."""
    import shutil

    ckpt = Path(shutil.copytree(checkpoint, tmp_path / "drafter"))
    path = data.save(tmp_path / "calib.safetensors")
    cache = tmp_path / "replay.pt"
    return ckpt, cache, [f"data={path}", "fit_fraction=0.5", "anchors_per_seq=null", "anchor_chunk=8",
                         "bootstrap_resamples=20", f"replay_cache={cache}", f"plot={tmp_path / 'rel.png'}"]


def _redraw_acceptance(cache: Path, confidence) -> tuple[dict, torch.Tensor]:
    """Rewrite the cached replay's acceptance as drawn (seed 0) from ``confidence(replay)`` [blocks, G], the
    conditional acceptance of each slot, under the same key (the same data, anchors and drafter): the replay and
    the drawn acceptance."""
    stored = torch.load(cache, weights_only=True)
    replay = stored["replay"]
    c = confidence(replay)
    gen = torch.Generator().manual_seed(0)
    accepted = torch.cumprod((torch.rand(c.shape, generator=gen, dtype=torch.float64) < c).double(), 1)
    replay.update(accepted=accepted.float(), accept_length=accepted.sum(1).float() + 1.0)
    torch.save(stored, cache)
    return replay, accepted


def test_calibrate_runner_fit_report_split_and_bootstrap(tmp_path, target, data, checkpoint):
    from runners import calibrate

    path = data.save(tmp_path / "calib.safetensors")
    out_json = tmp_path / "cal.json"
    cfg = _compose(f"checkpoint={checkpoint}", f"data={path}", "fit_fraction=0.5", "anchors_per_seq=null",
                   "anchor_stride=1", "anchor_chunk=8", "bootstrap_resamples=50", f"output_json={out_json}",
                   f"plot={tmp_path / 'rel.png'}")
    report = calibrate.run(cfg, target=target)
    saved = json.loads(out_json.read_text())
    split = saved["split"]
    assert split["by"] == "sequence" and split["sequences"] == {"fit": 8, "report": 8}
    assert split["blocks"]["fit"] + split["blocks"]["report"] == saved["blocks"]
    assert saved["reported_on"] == "report" and saved["temperatures_fitted_on"] == "fit"
    assert saved["in_sample"]["part"] == "fit" and saved["out_of_sample"]["part"] == "report"
    assert saved["in_sample"]["num_rows"] == split["blocks"]["fit"]
    assert saved["out_of_sample"]["num_rows"] == split["blocks"]["report"] == saved["num_rows"]
    assert saved["ece_after"] == saved["out_of_sample"]["ece_after"]  # top level = out of sample
    b = saved["bootstrap"]["ece_after"]
    assert b["sequences"] == 8 and b["point"] == pytest.approx(saved["ece_after"], abs=1e-12)
    assert b["low"] <= b["high"] and saved["target_ece"] == 0.02
    verdict = saved["target_ece_verdict"]  # judged on the interval saved beside it (each branch: the test below)
    assert f"{100 * b['high']:.2f}%" in verdict or f"{100 * b['low']:.2f}%" in verdict, (verdict, b)
    assert saved["previous_temperatures"]["temperatures"] == pytest.approx([1.3, 0.9, 1.1, 2.0])
    temps = json.loads((checkpoint / "temperatures.json").read_text())
    assert temps["temperatures"] == saved["temperatures"] and temps["ece_after"] == saved["ece_after"]
    assert (tmp_path / "rel.png").stat().st_size > 1000
    # the head-free estimate, ranked on the same reported blocks as the head's AUC
    free = saved["draft_max_prob_auc"]
    assert set(free) == {"auc_per_position", "auc_overall"} and len(free["auc_per_position"]) == 4
    assert free["auc_overall"] is not None and 0 <= free["auc_overall"] <= 1
    assert free["auc_overall"] != saved["auc_overall"]  # another score, not the head's AUC copied
    # deterministic: the same run gives the same report
    again = calibrate.run(cfg, target=target)
    assert again["temperatures"] == report["temperatures"] and again["bootstrap"] == report["bootstrap"]


def test_calibrate_runner_sts_bias_writes_biases_the_drafter_loads(tmp_path, target, data, checkpoint):
    import shutil

    from dspark.models.drafter import DSparkDrafter
    from runners import calibrate

    ckpt = Path(shutil.copytree(checkpoint, tmp_path / "drafter"))
    path = data.save(tmp_path / "calib.safetensors")
    cache = tmp_path / "replay.pt"
    common = [f"data={path}", "fit_fraction=0.5", "anchors_per_seq=null", "anchor_chunk=8",
              "bootstrap_resamples=20", f"replay_cache={cache}", "n_bias=21", "refine=5"]
    sts = calibrate.run(_compose(f"checkpoint={ckpt}", *common, f"output_json={tmp_path / 'sts.json'}",
                                 f"plot={tmp_path / 'sts.png'}"), target=target)
    assert cache.is_file() and sts["method"] == "sequential_temperature_scaling" and "biases" not in sts
    report = calibrate.run(_compose(f"checkpoint={ckpt}", *common, "method=sts_bias",
                                    f"output_json={tmp_path / 'bias.json'}", f"plot={tmp_path / 'bias.png'}"),
                           target=target)
    saved = json.loads((tmp_path / "bias.json").read_text())
    assert saved["method"] == "sequential_temperature_bias_scaling" and saved["method_option"] == "sts_bias"
    assert saved["blocks"] == sts["blocks"]  # the cached replay: the same blocks
    assert len(saved["biases"]) == 4 and saved["out_of_sample"]["biases"] == saved["biases"]
    # at position 1 (same prefix for both) the bias grid holds every STS candidate (b = 0), so in sample the
    # bias fit is never worse there than STS, up to the sharpness tolerance
    assert (saved["in_sample"]["ece_after_per_position"][0]
            <= sts["in_sample"]["ece_after_per_position"][0] + 0.002 + 1e-9)
    written = json.loads((ckpt / "temperatures.json").read_text())
    assert written["biases"] == saved["biases"] and written["temperatures"] == saved["temperatures"]
    loaded = DSparkDrafter.load(ckpt, target.cfg)
    assert loaded.confidence_biases.tolist() == pytest.approx(saved["biases"])
    z = torch.randn(3, 4)
    expected = torch.sigmoid(z / torch.tensor(saved["temperatures"]) + torch.tensor(saved["biases"]))
    torch.testing.assert_close(loaded.calibrated_confidence(z), expected)
    # the STS temperatures the checkpoint held before are judged as before (no biases)
    assert saved["previous_temperatures"]["temperatures"] == pytest.approx(sts["temperatures"])
    assert "biases" not in saved["previous_temperatures"]
    assert report["bootstrap"]["ece_after"]["point"] == pytest.approx(saved["ece_after"], abs=1e-12)
    # a cache made for other anchors is refused, not silently reused
    with pytest.raises(ConfigError, match="replay_cache"):
        calibrate.run(_compose(f"checkpoint={ckpt}", *common, "anchor_stride=2"), target=target)


def test_calibrate_runner_sts_max_prob_fits_the_head_and_the_max_probability(tmp_path, target, data, checkpoint):
    """method=sts_max_prob end to end. On the tiny drafter's own replay the fit is refused, naming the position
    (its head carries no signal the max probability lacks); on the same replayed blocks (the drafter's head
    logits and max probabilities) with acceptance drawn from known coefficients it fits by maximum likelihood on
    the fit part, reports the fused, head-alone and max-probability AUCs, and writes weights the drafter loads."""
    from dspark.models.drafter import DSparkDrafter
    from dspark.training.calibration import STS_MAX_PROB_METHOD, fit_max_prob_calibration, reached_cells
    from runners import calibrate

    ckpt, cache, common = _runner_setup(tmp_path, data, checkpoint)
    shipped = (ckpt / "temperatures.json").read_text()
    with pytest.raises(ConfigError, match=r"method=sts_max_prob: position \d"):
        calibrate.run(_compose(f"checkpoint={ckpt}", *common, "method=sts_max_prob"), target=target)
    assert (ckpt / "temperatures.json").read_text() == shipped  # a refused fit writes nothing
    # c_k = sigmoid(z + 0.5 logit(p) + b_k): slot 1's max probability is near 1 (logit ~13), hence its own bias
    b_true = torch.tensor([-6.0, -1.5, -1.5, -1.5], dtype=torch.float64)
    replay, accepted = _redraw_acceptance(cache, lambda r: torch.sigmoid(
        r["conf_logits"].double() + 0.5 * torch.logit(r["draft_max_prob"].double().clamp(1e-6, 1 - 1e-6)) + b_true))
    z, p = replay["conf_logits"].double(), replay["draft_max_prob"].double()
    out_json = tmp_path / "fused.json"
    report = calibrate.run(_compose(f"checkpoint={ckpt}", *common, "method=sts_max_prob",
                                    f"output_json={out_json}"), target=target)
    saved = json.loads(out_json.read_text())
    assert saved["method"] == STS_MAX_PROB_METHOD and saved["method_option"] == "sts_max_prob"
    fit, rep = split_sequences(replay["seq_index"], 0.5, 0)
    want = fit_max_prob_calibration(z[fit], p[fit], accepted[fit])
    assert saved["temperatures"] == pytest.approx(want.temperatures.tolist())
    assert saved["biases"] == pytest.approx(want.biases.tolist())
    assert saved["max_prob_weights"] == pytest.approx(want.max_prob_weights.tolist())
    # the three AUCs on the reported blocks: the fused confidence's, the head's alone, the max probability's alone
    fused_c = torch.sigmoid(z[rep] / torch.tensor(saved["temperatures"], dtype=torch.float64)
                            + torch.tensor(saved["biases"], dtype=torch.float64)
                            + torch.tensor(saved["max_prob_weights"], dtype=torch.float64)
                            * torch.logit(p[rep].clamp(1e-6, 1 - 1e-6)))
    assert saved["auc_overall"] == pytest.approx(conditional_auc(fused_c, accepted[rep])["auc_overall"], abs=1e-6)
    assert saved["head_auc"] == conditional_auc(torch.sigmoid(z[rep]), accepted[rep])
    assert saved["draft_max_prob_auc"] == conditional_auc(p[rep], accepted[rep])
    # the gap between the two largest logits, kept by the same replay, ranked on the same blocks
    gap = replay["draft_top_gap"].double()
    assert bool((gap >= 0).all()) and saved["draft_top_gap_auc"] == conditional_auc(gap[rep], accepted[rep])
    three = (saved["auc_overall"], saved["head_auc"]["auc_overall"], saved["draft_max_prob_auc"]["auc_overall"])
    assert len(set(three)) == 3
    assert saved["out_of_sample"]["max_prob_weights"] == saved["max_prob_weights"]
    assert saved["in_sample"]["reached_per_position"] == reached_cells(accepted[fit]).sum(0).tolist()
    assert report["bootstrap"]["ece_after"]["point"] == pytest.approx(saved["ece_after"], abs=1e-12)
    written = json.loads((ckpt / "temperatures.json").read_text())
    assert written["max_prob_weights"] == saved["max_prob_weights"] and written["method"] == STS_MAX_PROB_METHOD
    loaded = DSparkDrafter.load(ckpt, target.cfg)
    assert loaded.confidence_uses_max_prob
    zz, pp = torch.randn(3, 4), torch.rand(3, 4)
    expected = torch.sigmoid(zz / torch.tensor(saved["temperatures"]) + torch.tensor(saved["biases"])
                             + torch.tensor(saved["max_prob_weights"]) * torch.logit(pp))
    torch.testing.assert_close(loaded.calibrated_confidence(zz, pp), expected)
    # refitting with another method judges the fused calibration the checkpoint held on the same blocks
    again = calibrate.run(_compose(f"checkpoint={ckpt}", *common, "method=sts",
                                   f"output_json={tmp_path / 'sts.json'}"), target=target)
    before = again["previous_temperatures"]
    assert before["max_prob_weights"] == pytest.approx(saved["max_prob_weights"])
    assert before["ece_after"] == pytest.approx(saved["ece_after"], abs=1e-6)
    assert "max_prob_weights" not in json.loads((ckpt / "temperatures.json").read_text())
    # a replay without the max probabilities is refused with the way out
    stored = torch.load(cache, weights_only=True)
    del stored["replay"]["draft_max_prob"]
    torch.save(stored, cache)
    with pytest.raises(ConfigError, match="holds no draft_max_prob.*delete replay_cache"):
        calibrate.run(_compose(f"checkpoint={ckpt}", *common, "method=sts_max_prob"), target=target)


def test_calibrate_runner_sts_top_gap_fits_the_head_and_the_gap(tmp_path, target, data, checkpoint):
    """method=sts_top_gap end to end on the replayed blocks (the drafter's head logits and top-2 gaps) with
    acceptance drawn from known coefficients: it fits on the fit part, reports the fused and head-alone AUCs,
    writes weights the drafter loads, and a later refit judges the gap calibration the checkpoint held."""
    from dspark.models.drafter import DSparkDrafter
    from dspark.training.calibration import STS_TOP_GAP_METHOD, fit_top_gap_calibration
    from runners import calibrate

    ckpt, cache, common = _runner_setup(tmp_path, data, checkpoint)
    calibrate.run(_compose(f"checkpoint={ckpt}", *common, "method=sts", f"output_json={tmp_path / 'a.json'}"),
                  target=target)  # writes the replay cache
    # slot 1's gap runs about five times the others' in this tiny drafter, hence its own bias
    b_true = torch.tensor([-7.5, -2.5, -2.5, -2.5], dtype=torch.float64)
    replay, accepted = _redraw_acceptance(cache, lambda r: torch.sigmoid(
        r["conf_logits"].double() + 0.3 * r["draft_top_gap"].double() + b_true))
    z, gap = replay["conf_logits"].double(), replay["draft_top_gap"].double()
    out_json = tmp_path / "gap.json"
    calibrate.run(_compose(f"checkpoint={ckpt}", *common, "method=sts_top_gap", f"output_json={out_json}"),
                  target=target)
    saved = json.loads(out_json.read_text())
    assert saved["method"] == STS_TOP_GAP_METHOD and saved["method_option"] == "sts_top_gap"
    fit, rep = split_sequences(replay["seq_index"], 0.5, 0)
    want = fit_top_gap_calibration(z[fit], gap[fit], accepted[fit])
    assert saved["top_gap_weights"] == pytest.approx(want.top_gap_weights.tolist())
    assert saved["temperatures"] == pytest.approx(want.temperatures.tolist())
    fused_c = torch.sigmoid(z[rep] / torch.tensor(saved["temperatures"], dtype=torch.float64)
                            + torch.tensor(saved["biases"], dtype=torch.float64)
                            + torch.tensor(saved["top_gap_weights"], dtype=torch.float64) * gap[rep])
    assert saved["auc_overall"] == pytest.approx(conditional_auc(fused_c, accepted[rep])["auc_overall"], abs=1e-6)
    assert saved["head_auc"] == conditional_auc(torch.sigmoid(z[rep]), accepted[rep])
    assert saved["draft_top_gap_auc"] == conditional_auc(gap[rep], accepted[rep])
    assert saved["auc_overall"] > saved["head_auc"]["auc_overall"]
    loaded = DSparkDrafter.load(ckpt, target.cfg)
    assert loaded.confidence_uses_top_gap and not loaded.confidence_uses_max_prob
    again = calibrate.run(_compose(f"checkpoint={ckpt}", *common, "method=sts",
                                   f"output_json={tmp_path / 'sts.json'}"), target=target)
    assert again["previous_temperatures"]["top_gap_weights"] == pytest.approx(saved["top_gap_weights"])
    assert again["previous_temperatures"]["ece_after"] == pytest.approx(saved["ece_after"], abs=1e-6)


def test_calibrate_runner_replays_sampled_traffic(tmp_path, target, data, checkpoint):
    """replay_temperature=T: the blocks are drafted at T and verified by rejection sampling at T (the replay
    replay_block_acceptance gives with that temperature and the run's seed), the fit and the report are of them,
    the report and the replay cache say so (a greedy cache is not reused for it), and the checkpoint's previous
    calibration is judged on those sampled blocks. Traces, the engine's own blocks, take no temperature."""
    from dspark.models.drafter import DSparkDrafter
    from runners import calibrate

    ckpt, cache, common = _runner_setup(tmp_path, data, checkpoint)
    greedy = calibrate.run(_compose(f"checkpoint={ckpt}", *common, "method=sts_bias",
                                    f"output_json={tmp_path / 'g.json'}"), target=target)
    assert greedy["replay_temperature"] == 0.0
    with pytest.raises(ConfigError, match="replay_cache: .* was written for other data"):
        calibrate.run(_compose(f"checkpoint={ckpt}", *common, "replay_temperature=0.8"), target=target)
    common = [c for c in common if not c.startswith("replay_cache=")]
    sampled = calibrate.run(_compose(f"checkpoint={ckpt}", *common, "method=sts_bias", "replay_temperature=0.8",
                                     f"replay_cache={tmp_path / 'sampled.pt'}", f"output_json={tmp_path / 's.json'}"),
                            target=target)
    assert sampled["replay_temperature"] == 0.8
    assert json.loads((tmp_path / "s.json").read_text())["replay_temperature"] == 0.8
    drafter = DSparkDrafter.load(ckpt, target.cfg).eval()
    want = replay_block_acceptance(target, drafter, data, max_len=1024, anchors_per_seq=None, batch_size=8,
                                   seed=0, anchor_chunk=8, temperature=0.8)
    stored = torch.load(tmp_path / "sampled.pt", weights_only=True)["replay"]
    assert torch.equal(stored["accepted"], want["accepted"]) and sampled["blocks"] == int(want["accepted"].shape[0])
    # the previous calibration (the greedy fit) judged on the sampled blocks
    assert sampled["previous_temperatures"]["temperatures"] == pytest.approx(greedy["temperatures"])
    assert sampled["greedy_mean_accept_length"] != greedy["greedy_mean_accept_length"]
    with pytest.raises(ConfigError, match="replay_temperature: traces"):
        calibrate.run(_compose(f"checkpoint={ckpt}", f"traces=[{tmp_path / 'x.npz'}]", "replay_temperature=0.5"))


@pytest.mark.parametrize("method, score", [("sts_max_prob", "draft_max_prob"), ("sts_top_gap", "draft_top_gap")])
def test_calibrate_runner_scored_methods_on_traces_need_their_scores(tmp_path, target, checkpoint, method, score):
    """Traces without a method's score (here none; step traces never keep the gap) are refused, naming it."""
    from dspark.step_trace import StepTrace
    from runners import calibrate

    trace = StepTrace(4)
    for step in range(6):
        trace.record([0, 1, 2, 3], torch.rand(4, 4).sort(1, descending=True).values.numpy(), [4] * 4,
                     [step % 5, 1, 4, 0], confidence_logits=torch.randn(4, 4).numpy())
    path = trace.save(tmp_path / "old.npz")
    with pytest.raises(ConfigError, match=f"traces hold no {score}"):
        calibrate.run(_compose(f"checkpoint={checkpoint}", f"traces=[{path}]", f"method={method}"))


@pytest.mark.parametrize("override,match", [
    ("method=platt", "method"), ("method=sts_max_probability", "sts_max_prob"),
    ("method=sts_bias n_bias=4", "n_bias"), ("method=sts_bias b_max=0", "b_max"),
    ("method=sts_bias refine=-1", "refine"), ("method=sts_bias ece_tolerance=-0.1", "ece_tolerance"),
    ("fit_fraction=0", "fit_fraction"), ("fit_fraction=1.0", "fit_fraction"), ("fit_fraction=1.5", "fit_fraction"),
    ("anchors_per_seq=0", "anchors_per_seq"), ("anchor_stride=0", "anchor_stride"),
    ("anchor_chunk=0", "anchor_chunk"), ("bootstrap_resamples=-1", "bootstrap_resamples"),
    ("confidence=1.0", "confidence"), ("target_ece=0", "target_ece"), ("batch_size=0", "batch_size"),
    ("replay_temperature=-0.7", "replay_temperature"),
])
def test_calibrate_runner_rejects_bad_values(tmp_path, override, match, checkpoint):
    from runners import calibrate

    with pytest.raises(ConfigError, match=match):
        calibrate.run(_compose(f"checkpoint={checkpoint}", f"data={tmp_path / 'none.safetensors'}",
                               *override.split()), target=object())


def test_calibrate_runner_too_few_sequences_for_a_split(tmp_path, target, data, checkpoint):
    from runners import calibrate

    path = data.subset(range(3)).save(tmp_path / "small.safetensors")
    with pytest.raises(ConfigError, match="cannot be split"):
        calibrate.run(_compose(f"checkpoint={checkpoint}", f"data={path}", "fit_fraction=0.5"), target=target)
    path5 = data.subset(range(5)).save(tmp_path / "five.safetensors")
    with pytest.raises(ConfigError, match="each part needs at least 2"):
        calibrate.run(_compose(f"checkpoint={checkpoint}", f"data={path5}", "fit_fraction=0.9",
                               f"output_json={tmp_path / 'x.json'}"), target=target)


def test_calibrate_runner_fits_on_step_traces_of_the_engine(tmp_path, target, checkpoint):
    """traces=: the blocks a verify=full engine run drafted and verified, split by request; no target is loaded."""
    import shutil

    from dspark.models.drafter import DSparkDrafter
    from runners import calibrate

    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint, ckpt)
    drafter = DSparkDrafter.load(ckpt, target.cfg)
    engine = Engine(target, None, tiny_engine_config(max_num_seqs=16), drafter)
    trace = engine.start_step_trace()
    gen = torch.Generator().manual_seed(9)
    engine.generate([torch.randint(3, 97, (4,), generator=gen).tolist() for _ in range(16)],
                    SamplingParams(max_tokens=24, ignore_eos=True))
    path = trace.save(tmp_path / "trace.npz")
    report = calibrate.run(_compose(f"checkpoint={ckpt}", f"traces=[{path}]", "method=sts_bias",
                                    "fit_fraction=0.5", "bootstrap_resamples=20", "n_bias=21", "refine=5"))
    assert report["blocks"] == trace.rows() and report["sequences"] == 16
    assert report["split"]["sequences"] == {"fit": 8, "report": 8}
    assert report["data_info"] == {"traces": [str(path)]}
    # the traced blocks' acceptance is the run's: accept length = mean accepted + 1
    accepted = torch.cat([torch.from_numpy(a) for a in trace.accepted]).double()
    assert report["greedy_mean_accept_length"] == pytest.approx(float(accepted.mean() + 1))
    saved = json.loads((ckpt / "temperatures.json").read_text())
    assert saved["temperatures"] == pytest.approx(report["temperatures"]) and len(saved["biases"]) == 4
    with pytest.raises(ConfigError, match="not both"):
        calibrate.run(_compose(f"checkpoint={ckpt}", f"traces=[{path}]", f"data={path}"))
    with pytest.raises(ConfigError, match="not found"):
        calibrate.run(_compose(f"checkpoint={ckpt}", f"traces=[{tmp_path / 'none.npz'}]"))
    trimmed = Engine(target, None, tiny_engine_config(verify="ragged", force_budget_frac=0.5), drafter)
    t2 = trimmed.start_step_trace()
    trimmed.generate([[5, 6, 7, 8]] * 4, SamplingParams(max_tokens=16, ignore_eos=True))
    with pytest.raises(ConfigError, match="verify=full"):
        calibrate.run(_compose(f"checkpoint={ckpt}", f"traces=[{t2.save(tmp_path / 'ragged.npz')}]"))


def test_auc_head_vs_max_prob_script(tmp_path, capsys, monkeypatch):
    """bench/auc_head_vs_max_prob.py on a replay where the max probability ranks acceptance perfectly and the
    head at random: the difference is positive and its interval excludes 0; a replay without max_prob is refused."""
    import runpy

    gen = torch.Generator().manual_seed(0)
    rows, g = 400, 3
    accepted = (torch.rand(rows, g, generator=gen) < 0.6).float()
    replay = {"conf_logits": torch.randn(rows, g, generator=gen), "accepted": accepted,
              "draft_max_prob": 0.2 + 0.6 * accepted + 0.01 * torch.rand(rows, g, generator=gen),
              "seq_index": torch.arange(rows) // 10}
    path = tmp_path / "replay.pt"
    torch.save({"key": "{}", "replay": replay}, path)
    script = str(Path(__file__).resolve().parents[1] / "bench" / "auc_head_vs_max_prob.py")
    monkeypatch.setattr("sys.argv", [script, str(path), "--resamples", "50"])
    runpy.run_path(script, run_name="__main__")
    out = json.loads(capsys.readouterr().out)
    assert out["max_prob_auc"] == 1.0 and abs(out["head_auc"] - 0.5) < 0.1
    assert out["difference_ci"][0] > 0 and out["sequences"] == 20
    del replay["draft_max_prob"]
    torch.save({"key": "{}", "replay": replay}, path)
    with pytest.raises(SystemExit, match="no draft_max_prob"):
        runpy.run_path(script, run_name="__main__")
    monkeypatch.setattr("sys.argv", [script, str(tmp_path / "missing.pt")])
    with pytest.raises(SystemExit, match="missing.pt: not a runners.calibrate replay_cache file"):
        runpy.run_path(script, run_name="__main__")


def test_auc_head_vs_max_prob_script_fuses_both(tmp_path, capsys, monkeypatch):
    """--fused: on a replay whose acceptance follows both the head's logit and the max probability, the fitted
    sts_max_prob confidence out-ranks each alone out of sample, and --write-calibration writes a file that
    load_calibration reads back with its max-probability weights."""
    import runpy

    from dspark.training.calibration import load_calibration

    gen = torch.Generator().manual_seed(1)
    rows, g = 3000, 3
    z = torch.randn(rows, g, generator=gen)
    p = torch.rand(rows, g, generator=gen) * 0.98 + 0.01
    accepted = (torch.rand(rows, g, generator=gen) < torch.sigmoid(1.5 * z + 1.5 * torch.logit(p))).float()
    replay = {"conf_logits": z, "accepted": accepted, "draft_max_prob": p, "seq_index": torch.arange(rows) // 10}
    path = tmp_path / "replay.pt"
    torch.save({"key": "{}", "replay": replay}, path)
    script = str(Path(__file__).resolve().parents[1] / "bench" / "auc_head_vs_max_prob.py")
    monkeypatch.setattr("sys.argv", [script, str(path), "--resamples", "50", "--fused",
                                     "--write-calibration", str(tmp_path / "cal")])
    runpy.run_path(script, run_name="__main__")
    out = json.loads(capsys.readouterr().out)
    assert out["fused_minus_head_ci"][0] > 0 and out["fused_minus_max_prob_ci"][0] > 0
    assert all(abs(w - 1.5) < 0.4 for w in out["fused_coefficients"]["max_prob_weight"])
    cal = load_calibration(tmp_path / "cal", g)
    assert cal.max_prob_weights is not None and cal.max_prob_weights.shape == (g,)
    monkeypatch.setattr("sys.argv", [script, str(path), "--write-calibration", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="needs --fused"):
        runpy.run_path(script, run_name="__main__")


def test_the_ece_verdict_is_unresolvable_when_every_reported_draft_is_rejected_or_every_one_accepted():
    """A drafter that never drafts an accepted token scores a perfect ECE with a survival of 0: no verdict."""
    from runners.calibrate import _verdict

    interval = {"confidence": 0.95, "low": 0.0, "high": 0.001, "blocks": 40, "noise_floor": 0.0}
    assert _verdict(interval, 0.02, torch.zeros(40, 4)).startswith("unresolvable: the 40 reported blocks hold no "
                                                                   "accepted draft")
    assert "no rejected draft" in _verdict(interval, 0.02, torch.ones(40, 4))
    mixed = torch.zeros(40, 4)
    mixed[:10, 0] = 1
    assert _verdict(interval, 0.02, mixed) == "met: the 95% interval's upper end 0.10% is <= 2.00%"
    assert _verdict({**interval, "low": 0.03, "high": 0.05}, 0.02, mixed).startswith("not met: the 95% interval's "
                                                                                    "lower end 3.00% is > 2.00%")
    assert _verdict({**interval, "low": 0.01, "high": 0.05}, 0.02, mixed).startswith(
        "undecided: the 95% interval [1.00%, 5.00%] straddles 2.00%")
    assert _verdict({**interval, "low": 0.01, "high": 0.05, "noise_floor": 0.025}, 0.02, mixed).startswith(
        "unresolvable: a perfectly calibrated predictor would score 2.50% on these 40 blocks")
    # above the noise floor as well as the target: miscalibrated however few the blocks
    assert _verdict({**interval, "low": 0.17, "high": 0.24, "noise_floor": 0.043}, 0.02, mixed).startswith(
        "not met: the 95% interval's lower end 17.00% is > 2.00%")
