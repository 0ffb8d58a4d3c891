"""runners.eval_drafter's prompt-bootstrap intervals and the paired comparison of two reports, on synthetic
engine outputs (objects with the fields acceptance_metrics reads): no engine runs. The greedy check's bf16
evidence guard re-scores hand-made outputs with a tiny CPU target (tests/tiny.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from dspark.config import SamplingParams
from runners import eval_drafter as ev

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
BLOCK = 4
FAST = dict(n_resamples=500, ci_level=0.95, seed=0)


def fake_output(lengths, error=None, prompt_len=10):
    """An engine output with these per-step accept lengths (bonus included) and full-block drafts."""
    lengths = [int(v) for v in lengths]
    return SimpleNamespace(
        error=error, accept_lengths=lengths, num_steps=len(lengths), token_ids=[0] * sum(lengths), user_id=None,
        prompt_token_ids=[1] * prompt_len,
        mean_accept_length=sum(lengths) / len(lengths) if lengths else float("nan"),
        pos_accepted=[sum(v > i + 1 for v in lengths) for i in range(BLOCK)], pos_reached=[len(lengths)] * BLOCK)


def fake_outputs(n_prompts, seed=1, scale=1.0):
    rng = np.random.default_rng(seed)
    outs = []
    for _ in range(n_prompts):
        p = rng.uniform(0.3, 0.9)  # prompts differ in how easy they are
        lengths = np.minimum(rng.geometric(1 - p, size=24), BLOCK + 1)
        outs.append(fake_output(np.maximum(1, np.round(lengths * scale))))
    return outs


def report_of(outputs, ids=None, workload="w", temperature=0.0, **kw):
    ids = ids or [f"p{i}" for i in range(len(outputs))]
    row = {"workload": workload, "temperature": temperature,
           **ev.acceptance_metrics(outputs, BLOCK, ids, **{**FAST, **kw})}
    return {"block_size": BLOCK, "results": [row], "greedy_lossless": True,
            "bootstrap": {"unit": "prompt", **FAST}}


def test_interval_contains_the_estimate_is_seeded_and_widens_with_fewer_prompts():
    outs = fake_outputs(24)
    row = ev.acceptance_metrics(outs, BLOCK, [f"p{i}" for i in range(24)], **FAST)
    ci = row["mean_accept_length_ci"]
    assert ci["method"] == "bca" and ci["n_prompts"] == 24 and ci["note"] is None
    assert ci["low"] < row["mean_accept_length"] < ci["high"]
    # the statistic is the row's: mean over prompts of each prompt's mean accept length
    assert row["mean_accept_length"] == pytest.approx(np.mean([o.mean_accept_length for o in outs]))
    p1 = row["p1_acceptance_ci"]
    assert p1["low"] < row["per_position_acceptance"][0] < p1["high"]
    again = ev.acceptance_metrics(outs, BLOCK, [f"p{i}" for i in range(24)], **FAST)
    assert again["mean_accept_length_ci"] == ci
    other_seed = ev.acceptance_metrics(outs, BLOCK, [f"p{i}" for i in range(24)], **{**FAST, "seed": 5})
    assert other_seed["mean_accept_length_ci"]["low"] != ci["low"]
    few = ev.acceptance_metrics(outs[:6], BLOCK, **FAST)["mean_accept_length_ci"]
    assert few["high"] - few["low"] > ci["high"] - ci["low"]


def test_rows_without_two_prompts_or_spread_say_why():
    one = ev.acceptance_metrics(fake_outputs(1) + [fake_output([], error="boom")], BLOCK, **FAST)
    ci = one["mean_accept_length_ci"]
    assert ci["low"] is None and ci["high"] is None and ci["method"] is None and "at least 2" in ci["note"]
    assert one["per_prompt"]["1"]["error"] == "boom" and one["per_prompt"]["1"]["mean_accept_length"] is None
    same = ev.acceptance_metrics([fake_output([2, 3]), fake_output([3, 2])], BLOCK, **FAST)["mean_accept_length_ci"]
    assert same["method"] == "zero-width" and same["low"] == same["high"] == 2.5
    rep = report_of(fake_outputs(1))
    assert "none (1 prompt)" in ev.markdown_table(rep)


def test_bca_undefined_falls_back_to_percentile_and_says_so():
    # A and B equal but varying: every resample and jackknife value is 0, so BCa's acceleration is 0/0
    ci = ev.bootstrap_interval([[1.0, 1.0, 2.0], [1.0, 1.0, 2.0]], ev._relative_change, paired=True, **FAST)
    assert ci["method"] == "percentile" and "BCa" in ci["note"] and ci["low"] == ci["high"] == 0.0


def test_markdown_table_shows_the_interval_and_its_method():
    rep = report_of(fake_outputs(12))
    row = rep["results"][0]
    table = ev.markdown_table(rep)
    ci = row["mean_accept_length_ci"]
    assert f"{row['mean_accept_length']:.3f} ({ci['low']:.3f} .. {ci['high']:.3f})" in table
    assert "| w | 0 | 12 |" in table and "| BCa |" in table and "accept length (95% CI)" in table


def test_accept_length_is_split_by_prompt_length():
    outs = ([fake_output([4] * 8, prompt_len=100) for _ in range(3)]
            + [fake_output([1, 2] * 4, prompt_len=ev.LONG_PROMPT_TOKENS + 1) for _ in range(2)])
    row = ev.acceptance_metrics(outs, BLOCK, [f"p{i}" for i in range(5)], n_resamples=200)
    split = row["accept_length_by_prompt_length"]
    assert split["short"] == {"prompts": 3, "mean_accept_length": 4.0}
    assert split["long"] == {"prompts": 2, "mean_accept_length": 1.5}
    assert row["per_prompt"]["p4"]["prompt_tokens"] == ev.LONG_PROMPT_TOKENS + 1
    table = ev.markdown_table({"block_size": BLOCK, "results": [{"workload": "agentic", "temperature": 0.0, **row}]})
    assert f"prompts <= {ev.LONG_PROMPT_TOKENS} / longer" in table and "4.000 (3) / 1.500 (2)" in table


def test_json_round_trip_keeps_per_prompt_values(tmp_path):
    outs = fake_outputs(8)
    ids = [f"agentic-{i}" for i in range(8)]
    rep = report_of(outs, ids)
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(rep))
    back = ev.load_report(tmp_path)
    pp = back["results"][0]["per_prompt"]
    assert list(pp) == ids
    assert [pp[i]["mean_accept_length"] for i in ids] == [o.mean_accept_length for o in outs]
    assert [pp[i]["pos_accepted"] for i in ids] == [o.pos_accepted for o in outs]
    # the stored intervals can be recomputed from the stored per-prompt values
    assert ev.row_intervals(pp, **FAST) == {k: rep["results"][0][k] for k in ("mean_accept_length_ci",
                                                                               "p1_acceptance_ci")}


def test_paired_comparison_of_identical_reports_is_zero():
    rep = report_of(fake_outputs(10))
    row = ev.compare_reports(rep, rep, **FAST)["rows"][0]
    assert row["change_pct"] == 0.0 and row["n_prompts"] == 10
    assert row["ci"]["low"] == row["ci"]["high"] == 0.0 and row["ci"]["method"] == "zero-width"


def test_paired_comparison_finds_a_ten_percent_gain():
    rng = np.random.default_rng(3)
    n = 16
    base = rng.uniform(1.5, 4.0, size=n)  # prompts differ a lot; B is 10% better on each, with small noise
    a = [fake_output([1]) for _ in range(n)]
    b = [fake_output([1]) for _ in range(n)]
    for o, v in zip(a, base):
        o.mean_accept_length = float(v)
    for o, v in zip(b, base * 1.10 * rng.normal(1.0, 0.02, size=n)):
        o.mean_accept_length = float(v)
    ids = [f"p{i}" for i in range(n)]
    cmp = ev.compare_reports(report_of(a, ids), report_of(b, ids), **FAST)
    row = cmp["rows"][0]
    assert row["change_pct"] == pytest.approx(10.0, abs=1.5)
    assert row["ci"]["method"] == "bca" and 0 < row["ci"]["low"] < row["change_pct"] < row["ci"]["high"] < 15
    # unpaired, the prompt-to-prompt spread would hide the gain: the paired interval is much narrower
    assert row["ci"]["high"] - row["ci"]["low"] < 5
    # prompts only one report holds are left out of the pairing and named
    cmp2 = ev.compare_reports(report_of(a[:-1], ids[:-1]), report_of(b, ids), **FAST)
    assert cmp2["rows"][0]["n_prompts"] == n - 1 and cmp2["rows"][0]["only_b"] == [ids[-1]]
    assert any("only in B" in note for note in cmp2["notes"])
    assert "+" in ev.compare_markdown(cmp) and "| w | 0 | 16 |" in ev.compare_markdown(cmp)


def test_compare_needs_per_prompt_values():
    rep = report_of(fake_outputs(4))
    del rep["results"][0]["per_prompt"]
    with pytest.raises(ValueError, match="per_prompt"):
        ev.compare_reports(rep, rep, **FAST)


def test_compare_from_the_config(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, scale in ((a, 1.0), (b, 1.2)):
        d.mkdir()
        (d / "eval.json").write_text(json.dumps(report_of(fake_outputs(8, scale=scale))))
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="eval_drafter", overrides=[
            f"compare=[{a / 'eval.json'},{b}]", f"output_dir={tmp_path / 'cmp'}", "n_resamples=300"])
    comparison = ev.run_compare(cfg)
    assert comparison["rows"][0]["change_pct"] > 0 and comparison["bootstrap"]["n_resamples"] == 300
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert saved["rows"][0]["change_pct"] == comparison["rows"][0]["change_pct"]
    assert "B vs A (95% CI)" in (tmp_path / "cmp" / "compare.md").read_text()
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_checkpoint_names_the_shipped_drafter_or_a_folder():
    """checkpoint=builtin:NAME resolves to dspark/assets/NAME; a name that is not shipped fails before any loading."""
    from dspark.config import ConfigError
    from runners.common import ASSETS, resolve_drafter_path

    assert Path(resolve_drafter_path("builtin:dspark-smollm2")) == ASSETS / "dspark-smollm2"
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="eval_drafter", overrides=["checkpoint=builtin:no-such-drafter"])
    with pytest.raises(ConfigError, match="^checkpoint: the shipped drafter 'no-such-drafter'"):
        ev.run(cfg)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="eval_drafter", overrides=["checkpoint=/no/such/folder"])
    with pytest.raises(ConfigError, match="^checkpoint: '/no/such/folder' is not a folder"):
        ev.run(cfg)


# ---- the greedy check: exact in float32, on evidence (dspark.bench.lossless) in bf16 ------------------------
class FakeEngine:
    """An engine stand-in: each generate() call returns the next of ``calls`` (one list of outputs per row)."""

    block_size = BLOCK

    def __init__(self, calls, target=None):
        self.calls, self.target, self.tokenizer = list(calls), target, None

    def reset(self):
        pass

    def generate(self, prompts, params, progress=False):
        outs = self.calls.pop(0)
        assert len(outs) == len(prompts) and all(p.temperature == 0 for p in params)
        return outs


def greedy_output(prompt, tokens, error=None):
    out = fake_output([1] * len(tokens), error=error)
    out.token_ids, out.prompt_token_ids = list(tokens), list(prompt)
    return out


def test_float32_demands_exact_equality_and_needs_no_scorer(monkeypatch):
    import torch

    import dspark.bench.reference as reference

    def no_scorer(*a, **k):
        raise AssertionError("float32 needs no reference scorer")

    monkeypatch.setattr(reference, "ReferenceScorer", no_scorer)
    import copy

    from tiny import tiny_target

    from dspark.model_runner import last_position_logits

    p = [5, 6]
    target = [greedy_output(p, [3, 4, 5]), greedy_output(p, [3, 4, 5])]
    spec = [greedy_output(p, [3, 4, 5]), greedy_output(p, [3, 9, 5])]  # one token off: a divergence in float32
    fp32_target = tiny_target(0)
    rep = ev.evaluate(FakeEngine([spec]), FakeEngine([target], fp32_target), {"w": [("a", p), ("b", p)]}, [0.0],
                      max_tokens=3, n_resamples=1000)  # dtype inferred from the target: float32
    row = rep["results"][0]
    (m,) = row["greedy_mismatches"]
    assert {k: m[k] for k in ("id", "first_difference", "spec_len", "target_len", "kind")} == {
        "id": "b", "first_difference": 1, "spec_len": 3, "target_len": 3, "kind": "divergence"}
    # the evidence: the two tokens' logits after the shared prefix, from a float64 copy of the target
    assert next(fp32_target.parameters()).dtype == torch.float32  # the check made its float64 copy
    logits = last_position_logits(copy.deepcopy(fp32_target).double(), p + [3])
    assert m["float64_gap"] == pytest.approx(abs(float(logits[9] - logits[4])), rel=1e-6)
    assert m["float64_prefers"] == ("spec" if logits[9] > logits[4] else "target")
    assert row["greedy_rounding_flips"] == 0 and not row["greedy_lossless"] and not rep["greedy_lossless"]
    assert row["greedy_evidence"] == ("float32: exact equality demanded; 1/2 identical; float64 logit gap of the two "
                                      f"tokens: b at 1: {m['float64_gap']:.2g}")
    assert "| NO (1 unexplained, 0 rounding flips) |" in ev.markdown_table(rep)
    same = ev.greedy_check(target, target, ["a", "b"], dtype="float32")
    assert same["greedy_lossless"] and same["greedy_mismatches"] == []
    failed = ev.greedy_check(target, [target[0], greedy_output(p, [], error="boom")], ["a", "b"], dtype="float32")
    assert not failed["greedy_lossless"] and failed["greedy_mismatches"] == [{"id": "b", "error": "boom"}]


def test_a_float32_mismatch_is_replayed_batch_invariant_and_still_fails():
    """engine.batch_invariant off: each float32 mismatch is generated again on batch-invariant engines (only the
    prompts that differed). Identical there: a row-count flip, named in the evidence and the table, yet the row fails
    (float32 promises equality); different there: a divergence."""
    p, q = [5, 6], [7, 8]
    target = [greedy_output(p, [3, 4, 5]), greedy_output(q, [3, 4, 5]), greedy_output(p, [1, 2])]
    spec = [greedy_output(p, [3, 9, 5]), greedy_output(q, [3, 4, 5]), greedy_output(p, [1, 7])]
    asked = []

    def replay(prompts, params):
        asked.append((list(prompts), [x.max_tokens for x in params]))
        again = [[3, 4, 5], [1, 8]]  # the first agrees with target-only when replayed, the third does not
        return ([greedy_output(x, t) for x, t in zip(prompts, again)],
                [greedy_output(x, t) for x, t in zip(prompts, [[3, 4, 5], [1, 2]])])

    rep = ev.evaluate(FakeEngine([spec]), FakeEngine([target]), {"w": [("a", p), ("b", q), ("c", p)]}, [0.0],
                      max_tokens=3, n_resamples=1000, dtype="float32", replay=replay)
    assert asked == [([p, p], [3, 3])]  # a and c alone
    row = rep["results"][0]
    a, c = row["greedy_mismatches"]
    assert (a["id"], a["kind"], a["exact_replay"]) == ("a", "row_count_flip", "identical")
    assert (c["id"], c["kind"], c["exact_replay"]) == ("c", "divergence", "differs")
    assert not row["greedy_lossless"] and row["greedy_rounding_flips"] == 0 and ev.row_count_flips(row) == 1
    assert row["greedy_evidence"].endswith("; replayed with engine.batch_invariant=true: 1/2 identical")
    assert "| NO (1 unexplained, 0 rounding flips, 1 row-count flip) |" in ev.markdown_table(rep)
    # no mismatch, no replay
    assert ev.greedy_check(target, target, ["a", "b", "c"], dtype="float32", replay=replay)["greedy_lossless"]
    assert len(asked) == 1


def test_batch_invariant_replay_builds_its_engines_once_on_first_use():
    """The replay's engines are batch-invariant copies of the run's, made when a mismatch first needs them: on a
    tiny CPU target the speculative and target-only replays agree token for token."""
    from tiny import tiny_drafter, tiny_engine_config, tiny_target

    from dspark.engine import Engine

    target = tiny_target(3)
    drafter = tiny_drafter(target)
    built = []

    def build():
        built.append(1)
        spec = Engine(target, None, tiny_engine_config(batch_invariant=True), drafter)
        plain = Engine(target, None, tiny_engine_config(batch_invariant=True, spec="off"))
        assert all("batch_invariant" in e.fingerprint()["kernels"].split("+") for e in (spec, plain))
        return spec, plain

    replay = ev.BatchInvariantReplay(build)
    assert built == []
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)] * 2
    for _ in range(2):
        spec, plain = replay(prompts, params)
        assert [o.token_ids for o in spec] == [o.token_ids for o in plain] and all(len(o.token_ids) == 12 for o in spec)
        assert any(n > 1 for o in spec for n in o.accept_lengths)  # it drafted, and some drafts were accepted
    assert built == [1]


@pytest.fixture(scope="module")
def tied_bf16_target():
    """A tiny bf16 target that repeats a prompt's last token (8 here), with token 40's embedding 8's scaled by
    1 - 0.0025: wherever 8 is the float32 reference's argmax, 40 is its runner-up ~0.1 logits below (within the
    bf16 rounding of logits near 64, one step 0.25 there), and every other token is tens of logits below."""
    import copy

    import torch
    from tiny import tiny_target

    from dspark.model_runner import last_position_logits

    target = tiny_target(0).to(torch.bfloat16)
    with torch.no_grad():
        w = target.model.embed_tokens.weight
        w[40] = (w[8].float() * (1 - 0.0025)).to(w.dtype)
    reference = copy.deepcopy(target).float()  # as ReferenceScorer makes it

    def greedy(prompt, prefix, n=12):
        out = list(prefix)
        while len(out) < n:
            out.append(int(last_position_logits(reference, prompt + out).argmax()))
        return out

    return target, greedy


def test_bf16_rounding_flip_passes_and_a_wrong_token_is_a_divergence(tied_bf16_target, monkeypatch):
    """In bf16 a mismatch whose tokens are both within the measured forward noise of the float32 reference's top
    logit is a rounding flip and the row is lossless, although its logit margin (~0.1) is above the old fixed
    0.05; a token far below the top at the first difference is a divergence; and a token beyond the noise bound
    later in an output fails the row even when the first difference is a flip. One ReferenceScorer serves every
    row."""
    import dspark.bench.reference as reference

    target, greedy = tied_bf16_target
    p = [5, 17, 33, 60, 8]
    plain = greedy(p, [])
    assert plain == [8] * 12  # the tiny target repeats the prompt's last token
    flip = greedy(p, plain[:3] + [40])  # the runner-up at position 3, then the reference's own continuation
    wrong = greedy(p, plain[:3] + [96])  # a token ~44 logits below the top
    flip_then_wrong = flip[:7] + greedy(p, flip[:7] + [96])[7:]
    made = []

    class CountingScorer(reference.ReferenceScorer):
        def __init__(self, model, **kw):
            made.append(model)
            super().__init__(model, **kw)

    monkeypatch.setattr(reference, "ReferenceScorer", CountingScorer)
    rows = {"flip": flip, "wrong": wrong, "later": flip_then_wrong}
    spec = FakeEngine([[greedy_output(p, toks), greedy_output(p, plain)] for toks in rows.values()])
    plain_engine = FakeEngine([[greedy_output(p, plain)] * 2] * len(rows), target)
    rep = ev.evaluate(spec, plain_engine, {name: [("a", p), ("b", p)] for name in rows}, [0.0], max_tokens=12,
                      dtype="bfloat16", n_resamples=50)
    assert made == [target]  # one scorer, of the target-only engine's target, for every row
    res = {r["workload"]: r for r in rep["results"]}

    row = res["flip"]
    (m,) = row["greedy_mismatches"]
    delta = m["delta"]
    assert 0.05 < m["spec_regret"] < delta and m["target_regret"] == 0.0, m  # the old fixed margin would fail it
    assert {k: m[k] for k in ("id", "first_difference", "spec_len", "target_len", "kind")} == {
        "id": "a", "first_difference": 3, "spec_len": 12, "target_len": 12, "kind": "rounding_flip"}
    assert row["greedy_lossless"] and row["greedy_rounding_flips"] == 1 and "rounding flip" in row["greedy_evidence"]
    assert delta == row["greedy_guard"]["delta"] == row["greedy_guard"]["delta_forward"] > 0

    row = res["wrong"]
    (m,) = row["greedy_mismatches"]
    assert m["kind"] == "divergence" and m["first_difference"] == 3 and m["spec_regret"] > 10 * m["delta"]
    assert not row["greedy_lossless"] and row["greedy_rounding_flips"] == 0
    assert "real divergence" in row["greedy_evidence"] and row["greedy_guard"]["real_divergence_count"] == 1

    row = res["later"]
    (m,) = row["greedy_mismatches"]
    assert m["kind"] == "rounding_flip" and m["first_difference"] == 3
    assert not row["greedy_lossless"] and row["greedy_rounding_flips"] == 1
    (bad,) = row["greedy_guard"]["real_divergences"]
    assert (bad["run"], bad["request_id"], bad["position"], bad["token"]) == ("dspark", "a", 7, 96)

    assert not rep["greedy_lossless"]
    table = ev.markdown_table(rep)
    assert "| yes (1 rounding flip) |" in table and "| NO (1 unexplained, 0 rounding flips, 1 token beyond" in table
    assert "| NO (0 unexplained, 1 rounding flip, 1 token beyond the noise bound) |" in table
    json.dumps(rep)  # eval.json can hold it


def test_reports_written_before_the_evidence_guard_still_read():
    """Old eval.json rows count near-tie flips (greedy_near_ties, kind near_tie); the table and compare read them."""
    rep = report_of(fake_outputs(6))
    old = rep["results"][0]
    old.update(greedy_lossless=True, greedy_near_ties=2, greedy_mismatches=[
        {"id": "p0", "first_difference": 4, "spec_len": 9, "target_len": 9, "margin": 0.01, "kind": "near_tie"},
        {"id": "p1", "first_difference": 2, "spec_len": 9, "target_len": 9, "margin": 0.02, "kind": "near_tie"}])
    assert ev.rounding_flips(old) == 2 and "| yes (2 near-tie flips) |" in ev.markdown_table(rep)
    old["greedy_mismatches"].append({"id": "p2", "first_difference": 1, "spec_len": 9, "target_len": 9,
                                     "margin": 0.5, "kind": "divergence"})
    old["greedy_lossless"] = False
    assert "| NO (1 unexplained, 2 near-tie flips) |" in ev.markdown_table(rep)
    del old["greedy_near_ties"]  # counted from the kinds
    assert ev.rounding_flips(old) == 2
    assert ev.compare_reports(rep, rep, **FAST)["rows"][0]["change_pct"] == 0.0
    new = {"greedy_lossless": True, "greedy_rounding_flips": 2, "greedy_mismatches": [{}, {}]}
    assert ev.greedy_cell(new) == "yes (2 rounding flips)" and ev.greedy_cell({}) == "n/a"


def test_a_row_gives_the_accept_length_of_each_source_lowest_first():
    """eval_drafter's by-source breakdown (arena-hard's categories, say): each label's request-averaged accept
    length over its prompts, lowest first, in eval.json and under the eval.md table; none with one label."""
    outs = [fake_output([1, 1, 2]), fake_output([5, 5]), fake_output([3, 1]), fake_output([4]), fake_output([2])]
    ids = ["a", "b", "c", "d", "e"]
    labels = {"a": "arena_hard:debugging", "b": "arena_hard:writing", "c": "arena_hard:debugging",
              "d": "arena_hard:math"}  # e has none
    rep = report_of(outs, ids, sources=labels)
    by = rep["results"][0]["accept_length_by_source"]
    assert list(by) == ["arena_hard:debugging", "unlabelled", "arena_hard:math", "arena_hard:writing"]
    assert by["arena_hard:debugging"] == {"prompts": 2, "mean_accept_length": pytest.approx((4 / 3 + 2) / 2)}
    assert by["arena_hard:writing"] == {"prompts": 1, "mean_accept_length": 5.0}
    assert "- w, T=0: arena_hard:debugging 1.67 (2), unlabelled 2.00 (1), arena_hard:math 4.00 (1), " \
           "arena_hard:writing 5.00 (1)" in ev.markdown_table(rep)
    one = report_of(outs, ids, sources=dict.fromkeys(ids, "poetry:sonnet"))
    assert "accept_length_by_source" not in one["results"][0]
    assert "by source" not in ev.markdown_table(one) and "by source" not in ev.markdown_table(report_of(outs, ids))


def test_eval_prompt_sets_label_every_prompt_with_its_source():
    sets, sources = ev.eval_prompt_sets(["arena_hard", "poetry"], 12, 0)
    assert set(sources) == {pid for items in sets.values() for pid, _ in items}
    assert {sources[pid].split(":")[0] for pid, _ in sets["arena_hard"]} == {"arena_hard"}
    assert len({sources[pid] for pid, _ in sets["arena_hard"]}) > 1
    assert ev.eval_prompts(["poetry"], 12, 0) == {"poetry": sets["poetry"]}


def _scaled_outputs(n, factor, seed):
    """n outputs whose mean accept lengths vary by prompt, multiplied by ``factor``."""
    rng = np.random.default_rng(seed)
    outs = [fake_output([1]) for _ in range(n)]
    for o, v in zip(outs, rng.uniform(1.5, 4.0, size=n)):
        o.mean_accept_length = float(v * factor)
    return outs


def test_comparison_by_source_shows_where_b_gains():
    """compare gives the paired change of each source label's prompts, lowest first: a 20% gain on one source
    and none on the other are told apart, and a source of too few prompts gets its change but no interval."""
    ids = [f"p{i}" for i in range(16)]
    labels = {**{i: "arena_hard:writing" for i in ids[:8]}, **{i: "arena_hard:debugging" for i in ids[8:14]},
              **{i: "arena_hard:math" for i in ids[14:]}}
    a = _scaled_outputs(16, 1.0, seed=5)
    b = _scaled_outputs(16, 1.0, seed=5)
    for o in b[:8] + b[14:]:
        o.mean_accept_length *= 1.2  # writing and math gain 20%, debugging nothing
    rep_a, rep_b = report_of(a, ids, sources=labels), report_of(b, ids, sources=labels)
    assert rep_b["results"][0]["per_prompt"]["p0"]["source"] == "arena_hard:writing"
    row = ev.compare_reports(rep_a, rep_b, **FAST)["rows"][0]
    by = {g["source"]: g for g in row["by_source"]}
    assert [g["source"] for g in row["by_source"]][0] == "arena_hard:debugging"
    assert by["arena_hard:debugging"]["change_pct"] == 0.0 and by["arena_hard:debugging"]["n_prompts"] == 6
    assert by["arena_hard:debugging"]["ci"]["method"] == "zero-width"
    assert by["arena_hard:writing"]["change_pct"] == pytest.approx(20.0)
    assert by["arena_hard:writing"]["ci"]["low"] == pytest.approx(20.0)  # every prompt of it gained 20%
    math = by["arena_hard:math"]
    assert math["n_prompts"] == 2 and math["change_pct"] == pytest.approx(20.0)
    assert math["ci"]["low"] is None and "an interval needs" in math["ci"]["note"]
    md = ev.compare_markdown(ev.compare_reports(rep_a, rep_b, **FAST))
    assert "B vs A by source, lowest first" in md
    assert "arena_hard:debugging +0.0% (+0.0 .. +0.0%; 6)" in md and "arena_hard:math +20.0% (2)" in md


def test_comparison_by_source_reads_labels_given_for_old_reports():
    """Reports written before each prompt kept its label compare by source from labels passed in (run_compare
    takes them from the workload's eval split); one label alone, or none, gives no breakdown."""
    ids = [f"p{i}" for i in range(10)]
    a, b = report_of(_scaled_outputs(10, 1.0, 2), ids), report_of(_scaled_outputs(10, 1.1, 2), ids)
    assert "source" not in a["results"][0]["per_prompt"]["p0"]
    assert ev.compare_reports(a, b, **FAST)["rows"][0]["by_source"] == []
    labels = {i: ("x" if n < 5 else "y") for n, i in enumerate(ids)}
    row = ev.compare_reports(a, b, sources=labels, **FAST)["rows"][0]
    assert [g["n_prompts"] for g in row["by_source"]] == [5, 5]
    assert all(g["change_pct"] == pytest.approx(10.0) for g in row["by_source"])
    assert ev.compare_reports(a, b, sources=dict.fromkeys(ids, "x"), **FAST)["rows"][0]["by_source"] == []


def test_compare_labels_old_reports_from_the_workload_and_says_where_it_cannot(tmp_path):
    """run_compare labels prompts of a known workload from its eval split (ids are stable) and notes a workload
    it cannot load instead of leaving the breakdown out silently."""
    sets, sources = ev.eval_prompt_sets(["arena_hard"], 12, 0)
    ids = [pid for pid, _ in sets["arena_hard"]]
    a = report_of(_scaled_outputs(12, 1.0, 4), ids, workload="arena_hard")
    b = report_of(_scaled_outputs(12, 1.05, 4), ids, workload="arena_hard")
    other = report_of(_scaled_outputs(4, 1.0, 4), workload="not_a_workload")
    a["results"] += other["results"]
    b["results"] += other["results"]
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="eval_drafter", overrides=[
            f"compare=[{tmp_path / 'a.json'},{tmp_path / 'b.json'}]", "n_resamples=300"])
    comparison = ev.run_compare(cfg)
    arena = next(r for r in comparison["rows"] if r["workload"] == "arena_hard")
    assert {g["source"] for g in arena["by_source"]} == {sources[i] for i in ids}
    assert sum(g["n_prompts"] for g in arena["by_source"]) == 12
    assert any(n.startswith("not_a_workload: no source labels") for n in comparison["notes"])


def test_compare_refuses_what_is_not_a_report(tmp_path):
    """A missing, truncated or foreign file is named in a clear error, not a JSON traceback."""
    good = tmp_path / "good.json"
    good.write_text(json.dumps(report_of(fake_outputs(4))))
    (tmp_path / "torn.json").write_text('{"results": [')
    (tmp_path / "other.json").write_text('{"rows": []}')
    for bad, message in (("missing.json", "does not exist"), ("torn.json", "not valid JSON"),
                         ("other.json", "not an eval_drafter report")):
        with pytest.raises(ev.ConfigError, match=message):
            ev.load_report(tmp_path / bad)
    assert ev.load_report(good)["path"] == str(good)
    # a folder whose eval.json is committed xz-compressed reads the same; a torn archive is named
    import lzma

    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "eval.json.xz").write_bytes(lzma.compress(good.read_bytes()))
    assert ev.load_report(packed)["results"] == ev.load_report(good)["results"]
    assert ev.load_report(packed)["path"] == str(packed / "eval.json.xz")
    (packed / "eval.json.xz").write_bytes(lzma.compress(good.read_bytes())[:40])
    with pytest.raises(ev.ConfigError, match="not valid JSON"):
        ev.load_report(packed)
    with pytest.raises(ev.ConfigError, match=r"empty.eval\.json does not exist"):
        (tmp_path / "empty").mkdir()
        ev.load_report(tmp_path / "empty")
