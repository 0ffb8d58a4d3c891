"""The mixed_chat workload: agentic + arena_hard + poetry prompts, interleaved by seed, greedy (torch-free, fast)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from workloads import DEFAULTS, WorkloadError, build_workload, make_spec, split_of
from workloads.mixed_chat import SOURCES, MixedChatWorkload

from test_configs import compose_ab


@pytest.fixture(scope="module")
def source_pools():
    return {name: build_workload(make_spec(name, split="all", num_prompts=None)).pool() for name in SOURCES}


def mixed(source_pools, **overrides) -> MixedChatWorkload:
    """A mixed_chat workload whose sources reuse the already loaded pools."""
    w = build_workload(make_spec("mixed_chat", **overrides))
    for name, source in w.sources.items():
        source._pool = source_pools[name]
    return w


def workload_of(prompt) -> str:
    return prompt.id.split("/", 1)[0]


def test_defaults_are_greedy_256_all_of_the_eval_split(source_pools):
    spec = make_spec("mixed_chat")
    assert (spec.num_prompts, spec.temperature, spec.max_tokens, spec.split, spec.greedy_replica_count) == \
        (None, 0.0, 256, "eval", 0)
    assert DEFAULTS["mixed_chat"]["num_prompts"] is None
    w = mixed(source_pools)
    chosen = w.prompts()
    evals = {name: build_workload(make_spec(name, num_prompts=None, split="eval")) for name in SOURCES}
    for name, source in evals.items():
        source._pool = source_pools[name]
    assert len(chosen) == sum(len(s.available("eval")) for s in evals.values()) >= 400
    for p in chosen[:50] + chosen[-50:]:
        sp = w.sampling_for(p)
        assert sp.temperature == 0.0 and sp.max_tokens == 256 and sp.seed is None  # greedy, one cap (not poetry's 768)
        assert p.messages is not None  # a chat workload


def test_ids_keep_their_source_and_are_unique(source_pools):
    w = mixed(source_pools, split="all")
    chosen = w.prompts()
    assert len({p.id for p in chosen}) == len(chosen) == sum(len(v) for v in source_pools.values())
    originals = {name: {p.id: p for p in pool} for name, pool in source_pools.items()}
    for p in chosen[::97]:
        name, _, original_id = p.id.partition("/")
        assert name in SOURCES and p.source.startswith(name + "/")
        assert originals[name][original_id].messages == p.messages
    assert {workload_of(p) for p in chosen} == set(SOURCES)


def test_deterministic_for_a_seed_and_interleaved_in_rounds(source_pools):
    first = [p.id for p in mixed(source_pools, seed=3).prompts()]
    again = [p.id for p in mixed(source_pools, seed=3).prompts()]
    other = [p.id for p in mixed(source_pools, seed=4).prompts()]
    assert first == again and first != other and sorted(first) == sorted(other)
    # Every round of three holds one prompt of each source while all three have prompts left ...
    arena = sum(1 for i in first if i.startswith("arena_hard/"))
    for k in range(arena):
        assert {i.split("/", 1)[0] for i in first[3 * k:3 * k + 3]} == set(SOURCES)
    # ... and the round order is shuffled (not one fixed rotation).
    assert len({tuple(i.split("/", 1)[0] for i in first[3 * k:3 * k + 3]) for k in range(arena)}) > 1
    # num_prompts=N is the first N of the full order, so a small draw is balanced.
    head = mixed(source_pools, seed=3, num_prompts=30).prompts()
    assert [p.id for p in head] == first[:30]
    assert Counter(workload_of(p) for p in head) == {name: 10 for name in SOURCES}


def test_each_source_keeps_its_own_order_and_split(source_pools):
    w = mixed(source_pools, seed=5)
    chosen = w.prompts()
    for name in SOURCES:
        source = build_workload(make_spec(name, num_prompts=None, seed=5, split="eval"))
        source._pool = source_pools[name]
        assert [p.id.split("/", 1)[1] for p in chosen if workload_of(p) == name] == [p.id for p in source.prompts()]


@pytest.mark.parametrize("split", ["eval", "train"])
def test_split_is_the_sources_split(source_pools, split):
    w = mixed(source_pools, split=split)
    for p in w.prompts():
        name, _, original_id = p.id.partition("/")
        percent = type(w.sources[name]).EVAL_PERCENT
        assert split_of(original_id, percent) == split == w.split_of(p)


def test_train_and_eval_are_disjoint(source_pools):
    w = mixed(source_pools, split="all")
    train, evaluation = w.available("train"), w.available("eval")
    assert train and evaluation
    assert not {p.id for p in train} & {p.id for p in evaluation}
    assert not {p.text for p in train} & {p.text for p in evaluation}
    assert len(train) + len(evaluation) == len(w.pool())
    drawn = mixed(source_pools, split="eval", num_prompts=60).prompts()
    assert {p.id for p in drawn} <= {p.id for p in evaluation}
    # arena_hard keeps its 80% eval share inside the mix (its own EVAL_PERCENT, not the prefixed id's hash)
    arena_eval = [p for p in evaluation if workload_of(p) == "arena_hard"]
    assert len(arena_eval) == sum(split_of(p.id, 80) == "eval" for p in source_pools["arena_hard"])


def test_errors_name_the_setting(source_pools):
    with pytest.raises(WorkloadError, match="workload.path: the mixed_chat workload"):
        build_workload(make_spec("mixed_chat", path="x.jsonl")).prompts()
    w = mixed(source_pools, split="eval")
    total = len(w.prompts())
    with pytest.raises(WorkloadError, match=rf"num_prompts={total + 1} requested but split 'eval' has only {total} "
                                            r"prompts available \(agentic \d+, arena_hard \d+, poetry \d+\)"):
        mixed(source_pools, split="eval", num_prompts=total + 1).prompts()
    with pytest.raises(WorkloadError, match="not a mixed_chat prompt"):
        w.split_of(source_pools["poetry"][0])


def test_describe_and_length_stats(source_pools):
    w = mixed(source_pools, num_prompts=12)
    d = w.describe()
    json.dumps(d)
    assert d["name"] == "mixed_chat" and d["num_selected"] == 12
    assert d["selected_by_workload"] == {name: 4 for name in SOURCES}
    assert d["eval_percent"] == {"agentic": 20, "arena_hard": 80, "poetry": 20}
    assert d["available"]["eval"] == sum(s["eval"] for s in d["sources"].values())
    stats = w.length_stats(lambda p: len(p.text.split()))
    assert stats["count"] == 12 and stats["output_cap"]["max"] == 256.0


def test_the_ab_config_group_composes(tmp_path):
    from runners.ab import workload_from

    cfg = compose_ab(["+workload=mixed_chat", "workload.num_prompts=9"], out_dir=tmp_path)
    w = workload_from(cfg)
    assert isinstance(w, MixedChatWorkload) and w.spec.num_prompts == 9 and w.spec.temperature == 0.0
    assert w.sampling().max_tokens == 256
    # The group's one difference from the registry's defaults: a balanced 424-prompt mix, not all 5,323.
    assert build_workload(make_spec("mixed_chat", num_prompts=424)).spec == \
        workload_from(compose_ab(["+workload=mixed_chat"], out_dir=tmp_path)).spec
