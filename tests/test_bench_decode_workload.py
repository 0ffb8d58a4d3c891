"""runners.bench_decode takes the A/B's workload config group (+workload=NAME): its prompts, refusals, defaults."""

import json

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from dspark.config import ConfigError
from test_configs import CONF, ROOT, compose_ab
from workloads import build_workload, make_spec

BENCH_CONFIGS = ("bench_decode", "bench_graphs", "bench_sched_graphs", "bench_scheduling")


def compose_bench(overrides=(), config_name="bench_decode", out_dir="/nonexistent/bench-out"):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="bench_decode"):
        return compose(config_name=config_name, overrides=[
            f"paths.root={ROOT}", f"paths.output_dir={out_dir}", f"output_dir={out_dir}", "progress=false",
            f"paths.cost_tables={out_dir}/cost_tables", *overrides])


def _ids(prompts):
    return [json.dumps(p, sort_keys=True) for p in prompts]


def _texts(workload):
    return _ids([p.messages if p.messages is not None else p.prompt for p in workload.prompts()])


@pytest.mark.parametrize("config_name", BENCH_CONFIGS)
def test_no_group_keeps_the_old_default_poetry_eval_prompts(config_name):
    from runners.bench_decode import bench_prompts

    cfg = compose_bench(config_name=config_name)
    assert cfg.workload is None and cfg.workload_split is None and cfg.repeat_prompts is False
    _, prompts, info = bench_prompts(cfg, 20)
    old = build_workload(make_spec("poetry", num_prompts=20, seed=0, greedy_replica_count=0, split="eval"))
    assert _ids(prompts) == _texts(old)
    assert info["name"] == "poetry" and info["group"] is False and info["used"] == 20 and not info["repeated"]


def test_workload_split_still_picks_the_default_split():
    from runners.bench_decode import bench_prompts

    _, prompts, info = bench_prompts(compose_bench(["workload_split=train"]), 12)
    train = build_workload(make_spec("poetry", num_prompts=12, seed=0, greedy_replica_count=0, split="train"))
    assert _ids(prompts) == _texts(train) and info["spec"]["split"] == "train"
    with pytest.raises(ConfigError, match="workload.split"):
        bench_prompts(compose_bench(["workload_split=test"]), 12)


@pytest.mark.parametrize("config_name", BENCH_CONFIGS)
def test_a_group_gives_exactly_the_ab_prompts(config_name, tmp_path):
    from runners.ab import workload_from
    from runners.bench_decode import bench_prompts

    overrides = ["+workload=mixed_chat", "workload.num_prompts=40", "workload.seed=2"]
    _, prompts, info = bench_prompts(compose_bench(overrides, config_name=config_name), 40)
    ab_workload = workload_from(compose_ab(overrides, out_dir=tmp_path))
    assert _ids(prompts) == _texts(ab_workload)
    assert info["name"] == "mixed_chat" and info["group"] is True and info["selected"] == 40
    assert {i.split("/")[0] for i in info["first_ids"]} == {"agentic", "arena_hard", "poetry"}


def test_custom_jsonl_and_split_override(tmp_path):
    from runners.bench_decode import bench_prompts

    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Count to {i}."}) + "\n" for i in range(6)))
    cfg = compose_bench(["+workload=custom", f"workload.path={path}"])
    _, prompts, info = bench_prompts(cfg, 4)
    assert sorted(prompts) == sorted(f"Count to {i}." for i in range(6)) and info["used"] == 4
    # workload_split replaces the group's split (custom's default is all)
    _, evals, info = bench_prompts(compose_bench(["+workload=custom", f"workload.path={path}", "workload_split=eval"]),
                                   1)
    assert info["spec"]["split"] == "eval" and len(evals) == info["selected"] < 6


def test_too_few_prompts_are_refused_unless_repeated():
    from runners.bench_decode import bench_prompts

    cfg = compose_bench(["+workload=poetry"])  # the group's CPU default: one prompt
    with pytest.raises(ConfigError, match=r"selects 1 prompt\(s\).*needs 64 distinct.*workload.num_prompts=64.*"
                                          r"repeat_prompts=true"):
        bench_prompts(cfg, 64)
    _, prompts, info = bench_prompts(compose_bench(["+workload=poetry", "repeat_prompts=true"]), 64)
    assert len(prompts) == 1 and info["repeated"] and info["used"] == 1


def test_old_string_form_and_missing_path_say_what_to_do():
    with pytest.raises(ConfigCompositionException, match=r"\+workload=poetry"):
        compose_bench(["workload=poetry"])
    from runners.bench_decode import bench_prompts

    with pytest.raises(ConfigError, match="workload.path"):
        bench_prompts(compose_bench(["+workload=custom"]), 4)


@pytest.mark.smollm2
def test_bench_decode_runs_a_custom_jsonl(tmp_path):
    from runners import bench_decode

    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"Name {i} fruits."}]})
                            + "\n" for i in range(3)))
    cfg = compose_bench(["+workload=custom", f"workload.path={path}", "~arms.dspark_full", "batch_sizes=[2]",
                         "new_tokens=5", "warmup_steps=0", "min_requests=2"], out_dir=str(tmp_path))
    doc = bench_decode.run(cfg)
    assert doc["workload"]["name"] == "custom" and doc["workload"]["used"] == 2
    (row,) = doc["results"]
    assert row["requests"] == 2 and row["output_tokens_total"] == 10  # ignore_eos: new_tokens each
    md = (tmp_path / "bench_decode.md").read_text()
    assert md.startswith("Prompts: workload custom (all split, seed 0), 2 distinct prompt(s) of 3 selected")
