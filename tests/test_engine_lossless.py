"""Speculative decoding never changes what is emitted.

Greedy: the speculative engine's tokens equal target-only greedy decoding for any drafter
weights. Sampled: the first emitted tokens follow the target's distribution.
"""

import math

import pytest
import torch

from dspark.bench.planted_bugs import PLANTED_BUGS
from dspark.config import SamplingParams
from dspark.engine import Engine
from tiny import random_prompts as prompts_for
from tiny import tiny_drafter, tiny_engine_config, tiny_target, trained_tiny_pair


def run(target, drafter, prompts, sampling, **cfg):
    eng = Engine(target, None, tiny_engine_config(spec="dspark" if drafter is not None else "off", **cfg), drafter)
    return eng.generate(prompts, sampling)


CASES = [(0, 4, "vanilla", 8), (1, 3, "gated", 8), (2, 6, "rnn", 8), (3, 5, "vanilla", 0)]


def trained(seed, block, variant, rank):
    return trained_tiny_pair(seed, block_size=block, markov_variant=variant, markov_rank=rank)


@pytest.mark.parametrize("seed,block,variant,rank", CASES)
def test_greedy_spec_equals_target_only(seed, block, variant, rank):
    """A drafter trained on the target's greedy text: the steps reject a first draft, accept some, and accept
    whole blocks (bonus token included), and every output equals target-only greedy decoding."""
    target, drafter = trained(seed, block, variant, rank)
    prompts = prompts_for(seed, 6)
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    base = run(target, None, prompts, sp)
    spec = run(target, drafter, prompts, sp)
    for b, s in zip(base, spec):
        assert b.error is None and s.error is None
        assert len(s.token_ids) == 24
        assert s.token_ids == b.token_ids
    assert len({t for b in base for t in b.token_ids}) > 10  # the target's text varies: equality means something
    accepts = {a for s in spec for a in s.accept_lengths}
    assert 1 in accepts and max(accepts) == block + 1 and accepts - {1, block + 1}, accepts
    assert all(v == block for s in spec for v in s.verify_lens)  # verify=full: every step verified its block


@pytest.mark.parametrize("seed,block,variant,rank", CASES[:2])
def test_a_random_drafter_against_a_varied_target_is_lossless(seed, block, variant, rank):
    """The rejection path on every step: an untrained drafter against a target whose greedy text varies."""
    target = tiny_target(seed, scale=4.0)
    drafter = tiny_drafter(target, seed + 10, block_size=block, markov_variant=variant, markov_rank=rank)
    prompts = prompts_for(seed, 6)
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    base, spec = run(target, None, prompts, sp), run(target, drafter, prompts, sp)
    assert [s.token_ids for s in spec] == [b.token_ids for b in base]
    assert len({t for b in base for t in b.token_ids}) > 10


@pytest.mark.parametrize("bug", PLANTED_BUGS)
def test_these_comparisons_catch_each_planted_bug(bug):
    """The setups above are sensitive: the same comparison with a planted verification bug finds a difference
    (a setup whose outputs never depend on the context, or whose drafts are never accepted, would not)."""
    from dspark.bench.planted_bugs import plant_bug

    target, drafter = trained(*CASES[0])
    prompts = prompts_for(0, 6)
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    base = run(target, None, prompts, sp)
    eng = Engine(target, None, tiny_engine_config(spec="dspark"), drafter)
    plant_bug(eng, bug)
    assert [o.token_ids for o in eng.generate(prompts, sp)] != [b.token_ids for b in base]


def test_accept_lengths_and_per_position_counts_agree():
    """Each step's accept length is its accepted drafts + 1 (the target's own token), from 1 to block + 1, and
    the per-position counts follow from them: position i is reached by the steps that accepted i drafts or more
    and accepted by those that accepted more than i."""
    target, drafter = trained(*CASES[0])
    out = run(target, drafter, prompts_for(4, 3), SamplingParams(max_tokens=20, ignore_eos=True))
    seen = set()
    for o in out:
        a = o.accept_lengths
        seen |= set(a)
        assert all(1 <= x <= 5 for x in a)
        assert sum(a) >= 20  # the last step may overshoot max_tokens and is truncated
        assert o.pos_reached == [sum(x >= i + 1 for x in a) for i in range(4)], (a, o.pos_reached)
        assert o.pos_accepted == [sum(x >= i + 2 for x in a) for i in range(4)], (a, o.pos_accepted)
    assert 5 in seen and 1 in seen, seen


@pytest.mark.parametrize("pair", ["trained", "random drafter"])
def test_batch_invariance_and_preemption(pair):
    if pair == "trained":
        target, drafter = trained(*CASES[0])
    else:
        target = tiny_target(7, scale=4.0)
        drafter = tiny_drafter(target, 8, block_size=4)
    prompts = prompts_for(7, 5, lo=2, hi=40)
    sp = SamplingParams(max_tokens=30, ignore_eos=True)
    alone = [run(target, drafter, [p], sp)[0].token_ids for p in prompts]
    # a tight page pool forces preemption and recompute
    batch = run(target, drafter, prompts, sp, num_kv_blocks=16, kv_block_size=8, max_num_batched_tokens=64)
    assert any(o.num_preemptions > 0 for o in batch), "the small pool should have forced a preemption"
    for a, b in zip(alone, batch):
        assert b.token_ids == a
    assert len({t for a in alone for t in a}) > 10


def test_bad_requests_get_errors_and_others_are_served():
    target = tiny_target(9)
    drafter = tiny_drafter(target, 10)
    good = [5, 6, 7]
    prompts = [good, [], [5, 500], list(range(3, 90)) * 4, good]
    out = run(target, drafter, prompts, SamplingParams(max_tokens=8, ignore_eos=True), max_model_len=128)
    assert out[0].error is None and len(out[0].token_ids) == 8
    assert "empty prompt" in out[1].error
    assert "unknown token ids" in out[2].error
    assert "context holds" in out[3].error
    assert out[4].token_ids == out[0].token_ids
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)


def emitted(target, drafter, n, temperature, seed0=0, prompt=(5, 17, 33), return_outputs=False):
    """The first two emitted tokens of n independent requests with the same prompt."""
    sps = [SamplingParams(temperature=temperature, max_tokens=2, ignore_eos=True, seed=seed0 + i) for i in range(n)]
    out = run(target, drafter, [list(prompt)] * n, sps, max_num_seqs=1024, max_num_batched_tokens=8192,
              num_kv_blocks=2 * n + 8)
    toks = torch.tensor([o.token_ids[:2] for o in out])
    return (toks, out) if return_outputs else toks


def exact_marginals(target, temperature, prompt=(5, 17, 33)):
    """p(t1) and p(t2) = sum_t1 p(t1) p(t2 | t1), by enumeration with the paged reference driver."""
    from tiny import paged_logits  # checked against transformers in test_llama.py

    V = target.cfg.vocab_size
    p1 = torch.softmax(paged_logits(target, [list(prompt)], chunk=64)[0][-1] / temperature, -1)
    nxt = paged_logits(target, [list(prompt) + [t] for t in range(V)], chunk=64)
    p2_given = torch.stack([torch.softmax(l[-1] / temperature, -1) for l in nxt])
    return p1, p1 @ p2_given


def tv_and_bound(samples, p):
    n = samples.numel()
    emp = torch.bincount(samples, minlength=p.numel()).double() / n
    tv = 0.5 * (emp - p.double()).abs().sum().item()
    # E[TV] of an empirical distribution ~ sum_i sqrt(p_i (1 - p_i) / (2 pi n)); allow 3x that.
    bound = 3 * sum(math.sqrt(float(q * (1 - q)) / (2 * math.pi * n)) for q in p)
    return tv, bound


def test_sampled_spec_follows_target_distribution_and_broken_rule_is_caught(monkeypatch):
    target = tiny_target(11, scale=2.0)
    drafter = tiny_drafter(target, 12, block_size=3)
    T = 1.0
    p1, p2 = exact_marginals(target, T)
    n = 4000
    toks = emitted(target, drafter, n, T)
    for pos, p in ((0, p1), (1, p2)):
        tv, bound = tv_and_bound(toks[:, pos], p)
        assert tv < bound, (pos, tv, bound)

    # A deliberately broken acceptance (always accept the drafts) must fail the same check.
    import kernels.acceptance as acc

    real = acc._IMPLS["torch"]

    def always_accept(**kw):
        res = real(**kw)
        return res._replace(num_accepted=kw["windows"].clone(),
                            next_token=torch.argmax(kw["target_probs"][:, -1], -1))

    monkeypatch.setitem(acc._IMPLS, "torch", always_accept)
    broken = emitted(target, drafter, n, T, seed0=10_000)
    tv_b, bound = tv_and_bound(broken[:, 0], p1)
    assert tv_b > bound, (tv_b, bound)


class CharTokenizer:
    """ids 3..96 <-> printable characters, enough to test text-level stop strings."""

    def encode(self, text, add_special_tokens=False):
        return [3 + (ord(c) - 32) % 94 for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(32 + (i - 3) % 94) for i in ids if i > 2)


def test_stop_strings_and_eos_end_requests():
    target = tiny_target(13, scale=4.0)
    drafter = tiny_drafter(target, 14)
    prompts = prompts_for(13, 3)
    free = run(target, drafter, prompts, SamplingParams(max_tokens=30, ignore_eos=True))
    eng = Engine(target, CharTokenizer(), tiny_engine_config(), drafter)
    for p, f in zip(prompts, free):
        text = CharTokenizer().decode(f.token_ids)
        stop = text[10:12]  # a string the free-running output produces after its 10th character
        cut = text.find(stop)
        out = eng.generate([p], SamplingParams(max_tokens=30, ignore_eos=True, stop=(stop,)))[0]
        assert out.finish_reason == "stop"
        assert out.text == text[:cut]
        assert out.token_ids == f.token_ids[: len(out.token_ids)] and len(out.token_ids) < 30
    # EOS: make the free-running output's 6th token the EOS id; generation must end right after it.
    eos = free[0].token_ids[5]
    target.cfg.eos_token_ids = (eos,)
    try:
        out = run(target, drafter, [prompts[0]], SamplingParams(max_tokens=30))[0]
    finally:
        target.cfg.eos_token_ids = (2,)
    first = free[0].token_ids.index(eos)
    assert out.finish_reason == "stop" and out.token_ids == free[0].token_ids[: first + 1]


class LetterTokenizer:
    """Token id -> one letter: enough for stop strings (the engine only decodes outputs)."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


@pytest.mark.parametrize("graphs", [False, True])
def test_stop_strings_break_no_token_identity(graphs):
    """A stop string completed inside an accepted block cuts the block after the token that completes
    it, as one-token-per-step decoding stops: speculative token ids equal target-only's."""
    target = tiny_target(4)
    drafter = tiny_drafter(target, 14, block_size=5)
    prompts = prompts_for(4, 6)
    tok = LetterTokenizer()
    plain = SamplingParams(max_tokens=30, ignore_eos=True)
    free = Engine(target, tok, tiny_engine_config(spec="off"), None).generate(prompts, plain)
    texts = [tok.decode(o.token_ids) for o in free]
    stops = (texts[0][9:11], texts[3][14:16])  # two-letter strings each completed mid-output
    sp = SamplingParams(max_tokens=30, ignore_eos=True, stop=stops)
    kw = dict(cuda_graphs=True, overlap=True) if graphs else {}
    base = Engine(target, tok, tiny_engine_config(spec="off", **kw), None).generate(prompts, sp)
    spec = Engine(target, tok, tiny_engine_config(**kw), drafter).generate(prompts, sp)
    assert [o.token_ids for o in spec] == [o.token_ids for o in base]
    assert [o.finish_reason for o in spec] == [o.finish_reason for o in base]
    stopped = [o for o in base if o.finish_reason == "stop"]
    assert len(stopped) >= 2 and all(len(o.token_ids) < 30 for o in stopped)
    for o in stopped:  # the text ends where the first stop string completes, and no token later
        full = tok.decode(o.token_ids)
        assert any(full.endswith(s) for s in stops) and not any(s in full[:-1] for s in stops)


def test_a_prompt_longer_than_the_kv_pool_is_refused_not_waited_on():
    """It used to be admitted as a partial prefill chunk that nothing ever failed: the engine spun."""
    from dspark.engine import RequestError

    target = tiny_target(5)
    eng = Engine(target, None, tiny_engine_config(spec="off", num_kv_blocks=2, kv_block_size=8), None)
    with pytest.raises(RequestError, match="whole KV pool holds 16"):
        eng.add_request(list(range(3, 33)), SamplingParams(max_tokens=4))
    out = eng.generate([list(range(3, 33)), [5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert out[0].finish_reason == "error" and "KV pool" in out[0].error
    assert out[1].error is None and len(out[1].token_ids) == 4


@pytest.mark.parametrize("override,message", [
    ("engine.num_kv_blocks=2", r"KV pool holds 32 token slots \(engine.num_kv_blocks=2 .*engine.max_model_len=2048"),
    ("engine.kv_cache_tokens=1000", r"KV pool holds 1000 .*engine.kv_cache_tokens=1000.*engine.max_model_len=2048"),
    ("engine.kv_cache_tokens=0", r"engine.kv_cache_tokens: must be >= 1")])
def test_kv_pool_smaller_than_one_max_model_len_refused_by_the_config_check(tmp_path, override, message):
    """`runners.ab engine.kv_cache_tokens=0` (or a 2-page pool) used to pass the config check; now it is refused
    before any model loads, naming the setting (max_model_len is 2048 in conf/ab.yaml)."""
    from dspark.config import ConfigError
    from runners.ab import check_config
    from test_configs import compose_ab

    with pytest.raises(ConfigError, match=message):
        check_config(compose_ab(["+workload=agentic", override], out_dir=tmp_path))


@pytest.mark.parametrize("graphs", [False, True])
def test_abort_frees_the_request_and_leaves_the_others_unchanged(graphs):
    """A request stopped mid-decode (a client went away) finishes with reason 'abort', frees its pages
    and device row, and every other request's tokens equal a run without it."""
    target = tiny_target(6)
    drafter = tiny_drafter(target, 16, block_size=4)
    prompts = prompts_for(5, 6)
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    kw = dict(cuda_graphs=True, overlap=True) if graphs else {}
    alone = Engine(target, None, tiny_engine_config(**kw), drafter).generate(prompts[1:], sp)
    eng = Engine(target, None, tiny_engine_config(**kw), drafter)
    ids = [eng.add_request(p, sp) for p in prompts]
    outs = {}
    while eng.has_unfinished():
        for o in eng.step():
            outs[o.req_id] = o
        so_far = eng.output_ids(ids[0])
        if so_far is not None and len(so_far) >= 3:
            stopped = eng.abort(ids[0])
            assert stopped.finish_reason == "abort" and stopped.token_ids == so_far
            assert eng.abort(ids[0]) is None and eng.output_ids(ids[0]) is None
    assert ids[0] not in outs
    assert [outs[i].token_ids for i in ids[1:]] == [o.token_ids for o in alone]
    assert eng.blocks.num_free == eng.blocks.num_pages  # every page back in the pool
