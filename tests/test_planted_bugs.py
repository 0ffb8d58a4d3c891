"""The guards catch deliberately wrong engines (dspark/bench/planted_bugs.py), and pass the correct one.

CPU, float32: every planted bug in arm B fails the exact lossless guard of runners.ab. bfloat16 on CPU:
the evidence guard (float32 re-scoring, measured noise, rate test against the control) fails each
planted bug too, while the correct engine passes it."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

import runners.ab as ab
from dspark.bench.guards import ABGuardError
from dspark.bench.planted_bugs import PLANTED_BUGS, plant_bug, planted_engine_factory
from dspark.config import SamplingParams
from dspark.engine import Engine
from test_ab_runner import TINY, FakeTokenizer, tiny_factory
from test_configs import compose_ab
from tiny import tiny_drafter, tiny_engine_config, tiny_target

GREEDY_TINY = [o for o in TINY if not o.startswith(("workload.max_tokens", "workload.num_prompts", "load."))] + [
    "workload.max_tokens=24", "workload.num_prompts=6", "load.concurrency=3"]


@pytest.fixture(scope="module")
def models():
    target = tiny_target(seed=0, scale=4.0)
    return target, tiny_drafter(target, seed=1)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "device_resident"])
@pytest.mark.parametrize("bug", PLANTED_BUGS)
def test_each_planted_bug_changes_greedy_outputs(models, bug, graphs):
    """On both step paths (the device-resident one runs uncaptured on a CPU)."""
    target, drafter = models
    prompts = [[1, 5 + i, 9, 14 + i, 30] for i in range(4)]
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    good = Engine(target, None, tiny_engine_config(cuda_graphs=graphs), drafter).generate(prompts, sp)
    bad_engine = Engine(target, None, tiny_engine_config(cuda_graphs=graphs), drafter)
    plant_bug(bad_engine, bug)
    bad = bad_engine.generate(prompts, sp)
    assert [o.token_ids for o in good] != [o.token_ids for o in bad]
    assert bad_engine.planted_bug == bug


def test_plant_bug_refuses_target_only_and_unknown_names(models):
    target, _ = models
    with pytest.raises(ValueError, match="DSpark arm"):
        plant_bug(Engine(target, None, tiny_engine_config(spec="off")), "stale_kv")
    with pytest.raises(ValueError, match="unknown"):
        planted_engine_factory("off_by_two")


@pytest.mark.parametrize("bug", PLANTED_BUGS)
def test_fp32_guard_fails_each_planted_bug(tmp_path, bug):
    cfg = compose_ab(GREEDY_TINY, out_dir=tmp_path)
    with pytest.raises(ABGuardError, match="lossless"):
        ab.run(cfg, engine_factory=planted_engine_factory(bug, base=tiny_factory()))


@pytest.mark.parametrize("invariant", [True, False])
def test_fp32_guard_gives_float64_evidence_at_each_difference(tmp_path, invariant):
    """A float32 difference is reported with the two tokens' logit gap in a float64 forward of the target: with a
    rejected draft committed, the target chooses arm A's token, by far more than a rounding could part. The message
    says whether both arms ran the batch-invariant mode, where no rounding parts them."""
    cfg = compose_ab([*GREEDY_TINY, "ab.fail_on_guard=false", f"engine.batch_invariant={str(invariant).lower()}"],
                     out_dir=tmp_path)
    summary = ab.run(cfg, engine_factory=planted_engine_factory("accept_rejected", base=tiny_factory()))
    failed = [g for g in summary["guards"] if g["name"].startswith("lossless/") and not g["passed"]]
    assert failed
    for g in failed:
        diffs = g["details"]["differences"]
        assert diffs and all(d["float64_prefers"] == "A" and d["float64_gap"] > 1e-3 for d in diffs), diffs
        assert "float64 logit gap of the two tokens: " in g["message"] and "(prefers A)" in g["message"]
        assert ("both arms batch-invariant" in g["message"]) == invariant, g["message"]


def _bf16_factory(bug=None):
    base = tiny_factory()

    def factory(cfg, arm_cfgs):
        arm_cfgs = {arm: replace(c, dtype="bfloat16") for arm, c in arm_cfgs.items()}
        engines = base(cfg, arm_cfgs)
        if bug is not None:
            plant_bug(engines["B"], bug)
        return engines

    return factory


def test_bf16_evidence_guard_passes_the_correct_engine(tmp_path):
    summary = ab.run(compose_ab([*GREEDY_TINY, "engine.dtype=bfloat16"], out_dir=tmp_path),
                     engine_factory=_bf16_factory())
    g = next(g for g in summary["guards"] if g["name"] == "lossless")
    assert g["passed"], g["message"]
    assert g["details"]["method"] == "evidence" and g["details"]["control"]["running_limit"] == 1
    assert set(g["details"]["rate_tests"]) == {"A", "B"}


@pytest.mark.parametrize("bug", PLANTED_BUGS)
def test_bf16_evidence_guard_fails_each_planted_bug(tmp_path, bug):
    cfg = compose_ab([*GREEDY_TINY, "engine.dtype=bfloat16", "ab.fail_on_guard=false"], out_dir=tmp_path)
    summary = ab.run(cfg, engine_factory=_bf16_factory(bug))
    g = next(g for g in summary["guards"] if g["name"] == "lossless")
    assert not g["passed"], g["message"]
    assert g["details"]["real_divergence_count"] > 0 or not all(t["passed"] for t in g["details"]["rate_tests"].values())


def test_bf16_evidence_guard_compares_every_block_of_a_greedy_workload_with_greedy_replicas(tmp_path):
    """Poetry at T=0 keeps its greedy replica (workload.greedy_replica_count=1): every request is greedy, so the
    guard compares every block's outputs as well as the replica's, and A's control, run on the workload's
    requests, is paired with a block of them."""
    base = [o for o in GREEDY_TINY if not o.startswith(("+workload", "workload.temperature"))]
    cfg = compose_ab([*base, "+workload=poetry", "workload.temperature=0", "engine.dtype=bfloat16"], out_dir=tmp_path)
    summary = ab.run(cfg, engine_factory=_bf16_factory())
    g = next(g for g in summary["guards"] if g["name"] == "lossless")
    assert g["passed"], g["message"]
    runs = [c["runs"] for c in g["details"]["comparisons"]]
    assert runs == [["A/block0", "B/block0"], ["A/block1", "B/block1"], ["A/greedy_replicas", "B/greedy_replicas"]]
    assert [c["requests"] for c in g["details"]["comparisons"]] == [6, 6, 1]
    assert g["details"]["control"]["requests"] == 6 and set(g["details"]["rate_tests"]) == {"A", "B"}


def test_reference_scores_do_not_depend_on_packing(models):
    """Outputs scored one per forward and packed many per forward get the same reference evidence."""
    from dspark.bench.reference import ReferenceScorer

    target, _ = models
    bf16 = copy.deepcopy(target).to(torch.bfloat16)
    items = [([1, 5 + i, 9, 14 + i], [20 + i, 31, 7, 40 + i, 3]) for i in range(5)]
    one = ReferenceScorer(bf16, max_batch_tokens=1)
    many = ReferenceScorer(bf16, max_batch_tokens=10_000)
    for a, b in zip([one.score(p, o) for p, o in items], many.score_many(items)):
        assert (a.top_tokens[:, 0] == b.top_tokens[:, 0]).all()
        assert abs(a.token_logits - b.token_logits).max() < 1e-4 and abs(a.noise - b.noise).max() < 0.1
    assert (many.score(*items[0]).regret >= 0).all()


def test_sampled_workload_gets_a_distribution_verdict_per_arm(tmp_path):
    """A sampled A/B: each arm's tokens go through the randomized PIT under the target's processed
    distribution and a KS test (dspark/bench/distribution.py), beside the greedy replicas' token check."""
    cfg = compose_ab([*[o for o in TINY if not o.startswith(("+workload", "workload."))], "+workload=poetry",
                      "workload.num_prompts=4", "workload.max_tokens=32", "ab.distribution_min_tokens=100"],
                     out_dir=tmp_path)
    summary = ab.run(cfg, engine_factory=tiny_factory())
    dist = {g["name"]: g for g in summary["guards"] if g["name"].startswith("distribution")}
    assert set(dist) == {"distribution[A]", "distribution[B]"}
    for g in dist.values():
        assert g["passed"] and g["details"]["state"] == "passed", g["message"]
        assert g["details"]["n"] >= 100 and "against U(0,1)" in g["message"]
    too_few = ab.run(compose_ab([*[o for o in TINY if not o.startswith(("+workload", "workload."))],
                                 "+workload=poetry", "workload.num_prompts=2", "workload.max_tokens=8"],
                                out_dir=tmp_path / "few"), engine_factory=tiny_factory())
    states = {g["name"]: g["details"]["state"] for g in too_few["guards"] if g["name"].startswith("distribution")}
    assert states == {"distribution[A]": "insufficient", "distribution[B]": "insufficient"}


def test_packed_logits_match_one_forward_per_output(models):
    from dspark.bench.reference import ReferenceScorer

    target, _ = models
    items = [([1, 5 + i, 9], [20 + i, 31, 7, 40 + i]) for i in range(4)]
    scorer = ReferenceScorer(target, max_batch_tokens=12)  # two outputs per forward
    got = dict(scorer.iter_logits(items, reference=False))
    assert sorted(got) == [0, 1, 2, 3]
    for i, (p, o) in enumerate(items):
        assert torch.allclose(got[i], scorer.logits(p, o, reference=False), atol=1e-4)
