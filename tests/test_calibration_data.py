"""Held-out calibration data is disjoint from the drafter's training prompts and from every
workload's evaluation prompts.

- The shipped drafter's prompt record (dspark/assets/dspark-smollm2/training_prompts.json.xz)
  covers every prompt it trained on: replaying its from-scratch data run's recipe (sources, seed,
  samples per prompt, two shards, each shard's admitted count from its log) gives ids inside it,
  and so does every train-split prompt of the seven sources its continuation runs drew from.
- The shipped drafter trained on the whole train split, so its calibration prompts are the eval
  split of the training-only sources (hard_questions, stdlib_prose): never in the record (the
  split is a hash of the id), and never drawn by a benchmark workload or by eval_drafter.
- For a drafter trained on part of the train split, calibration prompts (split=train minus its
  record) never meet the record, nor any eval-split prompt.
- make_training_data writes a prompt record beside every output, and exclude_prompts= honours it.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from dspark.config import ConfigError
from runners import make_training_data as mtd
from workloads.base import split_of
from workloads.registry import DEFAULTS, build_workload, make_spec

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = str(ROOT / "conf")
SOURCES = ["agentic", "poetry", "arena_hard", "stdlib_prose", "hard_questions"]
# bench/results/h200-2026-11-30-drafter4: data_{0,1}.log ("prompts" minus "not_admitted") and
# data_summary.txt ("per_source"), the run that made the shipped drafter's training data: every
# train-split prompt, several samples of the small sources.
SHIPPED_ADMITTED = [34672, 34672]
SHIPPED_PER_SOURCE = {"agentic": 21088, "arena_hard": 240, "hard_questions": 24770, "poetry": 19678,
                      "stdlib_prose": 3568}
# The sixth continuation's data (G): sequences per source in data_summary of
# bench/results/h100-2026-12-06-drafter17-greedy-stage (every request admitted).
DATA_G_PER_SOURCE = {"agentic": 2636, "arena_hard": 360, "chat_followups": 1562, "hard_questions": 4954,
                     "poetry": 19678, "stdlib_prose": 446, "tool_calls": 4365, "worked_problems": 4070}
# The seventh and eighth continuations' data (H, I): admitted requests per part and sequences per source in
# data_0p{0,1}.log of bench/results/h100-2026-12-07-drafter19-scenario-stages (a time budget admitted part of each
# part's requests).
DATA_H_ADMITTED = [9967, 10105]
DATA_H_PER_SOURCE = {"agentic": 1120, "arena_hard": 140, "chat_followups": 645, "hard_questions": 2095,
                     "poetry": 8374, "scenario_requests": 3923, "stdlib_prose": 195, "tool_calls": 1855,
                     "worked_problems": 1725}
DATA_I_ADMITTED = [11191, 10884]
DATA_I_PER_SOURCE = {"agentic": 1239, "arena_hard": 161, "chat_followups": 724, "hard_questions": 2336,
                     "poetry": 9195, "scenario_requests": 4344, "stdlib_prose": 203, "tool_calls": 1993,
                     "worked_problems": 1880}
# The ninth continuation's data (J: I's recipe, seed 11, scenario_requests grown to 8,916 prompts): data_0p{0,1}.log
# of bench/results/h100-2026-12-07-drafter20-longer-stage.
DATA_J_ADMITTED = [18159, 17994]
DATA_J_REQUESTS = 59380
SCENARIO_TRAIN_PROMPTS_AT_J = 7103  # scenario_requests' train split when data J was made (three requests each)
DATA_J_PER_SOURCE = {"agentic": 1618, "arena_hard": 213, "chat_followups": 963, "hard_questions": 2972,
                     "poetry": 11971, "scenario_requests": 13039, "stdlib_prose": 280, "tool_calls": 2634,
                     "worked_problems": 2463}
# The tenth continuation's data (M: J's recipe, seed 14, scenario_requests at 13,296 prompts, 10,665 of them in the
# train split): data_0p{0,1}.log of bench/results/h100-2026-12-07-drafter21-long-stage-again.
DATA_M_ADMITTED = [18160, 18055]
DATA_M_REQUESTS = 70066
DATA_M_PER_SOURCE = {"agentic": 1357, "arena_hard": 172, "chat_followups": 792, "hard_questions": 2595,
                     "poetry": 10257, "scenario_requests": 16463, "stdlib_prose": 231, "tool_calls": 2308,
                     "worked_problems": 2040}
# The eleventh continuation's data (N: M's recipe with seed 15 and code_debugging, one greedy answer per prompt, at
# 12,705 prompts, 10,192 of them in the train split): data_0p{0,1}.log of
# bench/results/h200-2026-12-07-drafter22-code-debugging.
DATA_N_ADMITTED = [19290, 18982]
DATA_N_REQUESTS = 80258
CODE_DEBUGGING_TRAIN_PROMPTS_AT_N = 10192
DATA_N_PER_SOURCE = {"agentic": 1256, "arena_hard": 178, "chat_followups": 790, "code_debugging": 4869,
                     "hard_questions": 2369, "poetry": 9386, "scenario_requests": 15298, "stdlib_prose": 203,
                     "tool_calls": 2045, "worked_problems": 1878}
# The third run's record (data_shard{0,1}.log in ../h200-2026-11-30-drafter3): a time budget cut it.
DRAFTER3_ADMITTED = [17143 - 14113, 17142 - 13949]
DRAFTER3_SAMPLES = {"agentic": 4, "stdlib_prose": 4, "arena_hard": 8, "hard_questions": 3}


@pytest.fixture(scope="module")
def shipped():
    return mtd.load_prompt_record("builtin:dspark-smollm2")


def test_shipped_record_covers_the_drafters_lineage(shipped):
    """The shipped drafter was trained from scratch (the drafter4 data), then continued on two data runs of
    seven sources (A, then B: prefixes of the same seeded train-split order), then on a third (C: the same
    sources and seed, other samples per prompt, each prompt's first sample greedy), then on a fourth (D: worked
    problems added, at most 2,500 prompts per source, greedy first), then on a fifth (E: D's sources, seed 5, at
    most 5,000 prompts per source, every request admitted), then on a sixth (G: every train-split prompt of eight
    sources, seed 7, greedy first, every request admitted, in two parts), then on a seventh (H: G's sources and
    scenario_requests, seed 9, greedy first, a time budget admitting part of each part's requests), then on an
    eighth (I: H's recipe with seed 10), then on a ninth (J: I's recipe with seed 11, scenario_requests grown), then
    on a tenth (M: J's recipe with seed 14, scenario_requests grown again), then on an eleventh (N: M's recipe with
    seed 15 and code_debugging). Its record is a superset of all twelve: the from-scratch record, E and G replay
    exactly, J's, M's and N's requests replay but for the two sources read from the standard library, B's to N's ids
    are the records their machines wrote, and every train-split prompt of the seven sources is in it (A's own ids were
    never written back)."""
    logs = ROOT / "bench/results/h200-2026-11-30-drafter4"
    if logs.is_dir():  # the numbers above are the logs'
        summary = json.loads((logs / "data_summary.txt").read_text())
        assert summary["per_source"] == SHIPPED_PER_SOURCE and summary["sequences"] == sum(SHIPPED_ADMITTED)
        assert [p["not_admitted"] for p in summary["info"]["parts"]] == [0, 0]
    lineage = shipped["recipe"]["lineage"]
    scratch, data_a, data_b, data_c, data_d, data_e, data_g, data_h, data_i, data_j, data_m, data_n = lineage
    recipe = scratch["recipe"]
    assert recipe["split"] == "train" and recipe["seed"] == 0 and recipe["num_prompts_per_source"] is None
    assert [s["admitted"] for s in recipe["shards"]] == SHIPPED_ADMITTED
    chosen, requests = mtd.admitted_prompts(recipe["sources"], "train", None, 0, recipe["samples_per_prompt"],
                                            SHIPPED_ADMITTED)
    assert requests == SHIPPED_ADMITTED  # the prompt pools still replay the run's order (all admitted)
    assert dict(collections.Counter(src for src, _ in chosen)) == SHIPPED_PER_SOURCE
    trained = set(shipped["prompt_ids"])
    assert {pid for _, pid in chosen} <= trained
    # A and B: the same recipe, B admitted fewer requests of the same order (so B's prompts are A's first ones)
    (shard_b,) = data_b["recipe"]["shards"][0]["shards"]
    assert data_a["seed"] == data_b["recipe"]["shards"][0]["seed"] == 0
    assert data_a["samples_per_prompt"] == data_b["recipe"]["shards"][0]["samples_per_prompt"]
    assert shard_b["admitted"] < data_a["shards"][0]["admitted"]
    (recipe_c,) = data_c["recipe"]["shards"]
    assert recipe_c["split"] == "train" and recipe_c["seed"] == 0 and set(recipe_c["sources"]) == set(data_a["sources"])
    sources = data_a["sources"]
    assert set(sources) == set(SOURCES) | {"tool_calls", "chat_followups"}
    assert {pid for _, pid, _ in mtd.collect_prompts(sources, "train", None, 0)} <= trained
    _assert_never_evaluated(trained, [s for s in sources if s != "chat_followups"])
    (recipe_d,) = data_d["recipe"]["shards"]
    assert recipe_d["split"] == "train" and recipe_d["seed"] == 0 and "worked_problems" in recipe_d["sources"]
    worked = {pid for pid in trained if pid.startswith("worked_problems/")}
    assert worked and all(split_of(pid) == "train" for pid in worked)
    _assert_never_evaluated(trained, ["worked_problems"])
    (recipe_e,) = data_e["recipe"]["shards"]
    assert recipe_e["seed"] == 5 and recipe_e["sources"] == recipe_d["sources"]
    assert [s["admitted"] for s in recipe_e["shards"]] == [s["requests"] for s in recipe_e["shards"]]  # all of them
    replayed = mtd.collect_prompts(recipe_e["sources"], "train", recipe_e["num_prompts_per_source"], 5)
    assert {pid for _, pid, _ in replayed} <= trained
    assert sum(recipe_e["samples_per_prompt"][src] for src, _, _ in replayed) == recipe_e["shards"][0]["requests"]
    parts_g = data_g["recipe"]["shards"]  # one shard answered by two processes (part=j/2), each a record
    assert [p["shards"][0]["part"] for p in parts_g] == ["0/2", "1/2"]
    recipe_g = parts_g[0]
    assert recipe_g["seed"] == 7 and recipe_g["num_prompts_per_source"] is None and all(
        p["seed"] == 7 and p["samples_per_prompt"] == recipe_g["samples_per_prompt"] for p in parts_g)
    assert set(recipe_g["sources"]) == set(sources) | {"worked_problems"}
    assert all(p["shards"][0]["admitted"] == p["shards"][0]["requests"] for p in parts_g)  # all of them
    assert sum(p["shards"][0]["requests"] for p in parts_g) == sum(DATA_G_PER_SOURCE.values())
    replayed = mtd.collect_prompts(recipe_g["sources"], "train", None, 7)
    assert {pid for _, pid, _ in replayed} <= trained
    requests = collections.Counter()
    for src, _, _ in replayed:
        requests[src] += recipe_g["samples_per_prompt"][src]
    # chat_followups' pool is read from this Python's standard library (G's machine ran 3.12): the others replay
    assert {k: v for k, v in requests.items() if k != "chat_followups"} == {
        k: v for k, v in DATA_G_PER_SOURCE.items() if k != "chat_followups"}
    # chat_followups puts a stdlib object in train when its docstring appears in a train-split stdlib_prose
    # prompt, and docstrings differ between Python versions: B's machine (Python 3.12) saw a few stdlib items as
    # train that another Python may see as eval. No benchmark draws from that source, and calibration excludes the
    # record (h200_calibration.sh EXCLUDE), so those few never reach it; the shift is stdlib items only.
    followups = build_workload(make_spec("chat_followups", split="eval", num_prompts=None))
    shifted = trained & {p.id for p in followups.available("eval")}
    assert len(shifted) <= 6 and all(pid.startswith("chat_followups/stdlib/") for pid in shifted)
    calibration = mtd.collect_prompts(["chat_followups"], "eval", None, 4, exclude=trained)
    assert calibration and not {pid for _, pid, _ in calibration} & shifted
    # H and I: G's recipe with scenario_requests, seeds 9 and 10, each cut by 100 s of admission
    for entry, seed, admitted, per_source in ((data_h, 9, DATA_H_ADMITTED, DATA_H_PER_SOURCE),
                                              (data_i, 10, DATA_I_ADMITTED, DATA_I_PER_SOURCE)):
        parts = entry["recipe"]["shards"]
        assert [p["shards"][0]["part"] for p in parts] == ["0/2", "1/2"]
        assert all(p["seed"] == seed and p["num_prompts_per_source"] is None for p in parts)
        assert all(p["sources"] == recipe_g["sources"] + ["scenario_requests"] for p in parts)
        assert all(p["samples_per_prompt"] == {**recipe_g["samples_per_prompt"], "scenario_requests": 3} for p in parts)
        assert [p["shards"][0]["admitted"] for p in parts] == admitted
        assert sum(admitted) == sum(per_source.values())  # one sequence per admitted request
        assert all(p["shards"][0]["admitted"] < p["shards"][0]["requests"] for p in parts)  # the budget cut each
    # J: I's recipe with seed 11, made when scenario_requests held 8,916 prompts (7,103 in the train split; the source
    # has grown since, keeping every id); the other pools replay its requests but for chat_followups' and
    # stdlib_prose's, read from this Python's standard library
    recipe_i = data_i["recipe"]["shards"][0]
    _, requests_j = _two_budgeted_parts(data_j, 11, recipe_i, DATA_J_ADMITTED, DATA_J_REQUESTS, DATA_J_PER_SOURCE)
    assert requests_j["scenario_requests"] >= 3 * SCENARIO_TRAIN_PROMPTS_AT_J
    not_replayed = ("chat_followups", "stdlib_prose", "scenario_requests")
    assert sum(v for k, v in requests_j.items() if k not in not_replayed) == DATA_J_REQUESTS - sum(
        v for k, v in DATA_G_PER_SOURCE.items() if k in not_replayed[:2]) - 3 * SCENARIO_TRAIN_PROMPTS_AT_J
    # M: J's recipe with seed 14, made when scenario_requests held 13,296 prompts (10,665 in the train split, as now):
    # every request replays but for chat_followups' and stdlib_prose's (G's counts: both read the same Python)
    replayed_m, requests_m = _two_budgeted_parts(data_m, 14, recipe_i, DATA_M_ADMITTED, DATA_M_REQUESTS,
                                                 DATA_M_PER_SOURCE)
    from_stdlib = ("chat_followups", "stdlib_prose")
    assert sum(v for k, v in requests_m.items() if k not in from_stdlib) == DATA_M_REQUESTS - sum(
        DATA_G_PER_SOURCE[k] for k in from_stdlib)
    scenarios = {pid for pid in trained if pid.startswith("scenario_requests/")}
    assert scenarios and all(split_of(pid) == "train" for pid in scenarios)
    assert scenarios <= {pid for src, pid, _ in replayed_m if src == "scenario_requests"}
    _assert_never_evaluated(trained, ["scenario_requests"])
    # N: M's recipe with seed 15 and code_debugging (one request a prompt), made when code_debugging held 12,705
    # prompts (10,192 in the train split, as now): every request replays but for the two read from the stdlib
    recipe_n = {"sources": recipe_i["sources"] + ["code_debugging"],
                "samples_per_prompt": {**recipe_i["samples_per_prompt"], "code_debugging": 1}}
    replayed_n, requests_n = _two_budgeted_parts(data_n, 15, recipe_n, DATA_N_ADMITTED, DATA_N_REQUESTS,
                                                 DATA_N_PER_SOURCE)
    assert requests_n["code_debugging"] == CODE_DEBUGGING_TRAIN_PROMPTS_AT_N
    assert sum(v for k, v in requests_n.items() if k not in from_stdlib) == DATA_N_REQUESTS - sum(
        DATA_G_PER_SOURCE[k] for k in from_stdlib)
    fixes = {pid for pid in trained if pid.startswith("code_debugging/")}
    assert len(fixes) == DATA_N_PER_SOURCE["code_debugging"] and all(split_of(pid) == "train" for pid in fixes)
    assert fixes <= {pid for src, pid, _ in replayed_n if src == "code_debugging"}
    _assert_never_evaluated(trained, ["code_debugging"])
    # scenario_requests: none before H; code_debugging: none before N
    assert shipped["admitted_requests_per_source"]["scenario_requests"] == sum(d["scenario_requests"] for d in (
        DATA_H_PER_SOURCE, DATA_I_PER_SOURCE, DATA_J_PER_SOURCE, DATA_M_PER_SOURCE, DATA_N_PER_SOURCE))
    assert shipped["admitted_requests_per_source"]["code_debugging"] == DATA_N_PER_SOURCE["code_debugging"]


def _two_budgeted_parts(entry: dict, seed: int, recipe: dict, admitted: list[int], requests: int,
                        per_source: dict[str, int]) -> tuple[list, collections.Counter]:
    """A lineage entry answered by two processes (part=j/2) on ``recipe``'s sources and samples with ``seed``, each
    cut by a time budget: its records hold the admitted requests per part and the requests of its logs. Returns
    its train-split prompts replayed in this checkout and the requests per source they make."""
    parts = entry["recipe"]["shards"]
    assert [p["shards"][0]["part"] for p in parts] == ["0/2", "1/2"]
    assert all(p["seed"] == seed and p["num_prompts_per_source"] is None for p in parts)
    assert all(p["sources"] == recipe["sources"] and p["samples_per_prompt"] == recipe["samples_per_prompt"]
               for p in parts)
    assert [p["shards"][0]["admitted"] for p in parts] == admitted
    assert sum(p["shards"][0]["requests"] for p in parts) == requests
    assert sum(admitted) == sum(per_source.values())  # one sequence per admitted request
    replayed = mtd.collect_prompts(recipe["sources"], "train", None, seed)
    counts: collections.Counter = collections.Counter()
    for src, _, _ in replayed:
        counts[src] += recipe["samples_per_prompt"][src]
    return replayed, counts


def _assert_never_evaluated(ids: set[str], sources: list[str]) -> None:
    for name in sources:  # the whole eval split of each benchmark source, which benchmarks and eval_drafter draw from
        workload = build_workload(make_spec(name, split="eval", num_prompts=None))
        assert not ids & {p.id for p in workload.available("eval")}
    for name in ("agentic", "poetry", "arena_hard"):  # the benchmark defaults, drawn as the benchmarks do
        assert DEFAULTS[name]["split"] == "eval"
        assert not ids & {p.id for p in build_workload(make_spec(name)).prompts()}


def test_shipped_drafter_calibrates_on_eval_split_of_training_only_sources(shipped):
    trained = set(shipped["prompt_ids"])
    # the whole train split is trained on: nothing is left there, and make_training_data says where to look
    assert mtd.collect_prompts(SOURCES, "train", None, 1, exclude=trained) == []
    items = mtd.collect_prompts(mtd.CALIBRATION_EVAL_SOURCES, "eval", None, 4, exclude=trained)
    ids = {pid for _, pid, _ in items}
    assert len(ids) > 600 and not ids & trained
    # each in its source's eval split (a hash of the id; tool_calls and chat_followups hash an item key, see
    # their modules)
    for name in mtd.CALIBRATION_EVAL_SOURCES:
        workload = build_workload(make_spec(name, split="eval", num_prompts=None))
        held_out = {p.id for p in workload.available("eval")}
        assert {pid for src, pid, _ in items if src == name} <= held_out
        if name in ("hard_questions", "stdlib_prose"):
            assert all(split_of(pid) == "eval" for pid in held_out)
    # training-only: no benchmark workload config and no eval_drafter default names them
    benchmark = {p.stem for p in (ROOT / "conf" / "workload").glob("*.yaml")}
    from omegaconf import OmegaConf

    evaluated = set(OmegaConf.load(ROOT / "conf" / "eval_drafter.yaml").workloads)
    assert evaluated == {"agentic", "poetry", "arena_hard"}
    assert not set(mtd.CALIBRATION_EVAL_SOURCES) & (benchmark | evaluated)
    _assert_never_evaluated(ids, ["agentic", "poetry", "arena_hard"])
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="make_training_data", overrides=["exclude_prompts=[builtin:dspark-smollm2]",
                                                                   f"sources=[{','.join(SOURCES)}]"])  # its sources
    with pytest.raises(ConfigError, match="split=eval sources=.*hard_questions"):
        mtd.run(cfg, target=object(), tokenizer=object())


def test_calibration_prompts_are_disjoint_from_a_partial_record():
    # the third run's record (a time budget cut it): train split minus it is held-out calibration material
    chosen, _ = mtd.admitted_prompts(SOURCES, "train", None, 0, DRAFTER3_SAMPLES, DRAFTER3_ADMITTED)
    trained = {pid for _, pid in chosen}
    assert len(trained) == 5694
    items = mtd.collect_prompts(SOURCES, "train", None, 1, exclude=trained)
    ids = {pid for _, pid, _ in items}
    assert len(ids) > 2000 and not ids & trained
    assert all(split_of(pid) == "train" for pid in ids)  # hence never an eval-split prompt
    per_source = collections.Counter(src for src, _, _ in items)
    assert all(per_source[s] > 0 for s in SOURCES if s != "arena_hard")
    _assert_never_evaluated(ids, SOURCES)
    # num_prompts_per_source counts after the exclusion: a source still gives what it has left
    capped = mtd.collect_prompts(["poetry", "agentic"], "train", 50, 1, exclude=trained)
    assert collections.Counter(src for src, _, _ in capped) == {"poetry": 50, "agentic": 50}
    assert not {pid for _, pid, _ in capped} & trained


def test_prompt_record_checks_itself(tmp_path):
    rec = mtd.write_prompt_record(tmp_path / "x.prompts.json", ["b", "a", "a"], {"split": "train"})
    loaded = mtd.load_prompt_record(str(rec))
    assert loaded["prompt_ids"] == ["a", "b"] and loaded["count"] == 2
    assert mtd.prompt_record_path(tmp_path / "x.safetensors") == rec
    assert mtd.load_prompt_record(str(tmp_path / "x.safetensors"))["count"] == 2  # a data file -> its record
    payload = json.loads(rec.read_text())
    payload["prompt_ids"].append("c")
    rec.write_text(json.dumps(payload))
    with pytest.raises(ConfigError, match="sha256"):
        mtd.load_prompt_record(str(rec))
    with pytest.raises(ConfigError, match="does not exist"):
        mtd.load_prompt_record(str(tmp_path / "missing.json"))
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a prompt record"):
        mtd.load_prompt_record(str(tmp_path / "other.json"))


def test_make_training_data_records_prompts_and_excludes_them(tmp_path):
    import torch

    from test_train_drafter import CharTokenizer
    from tiny import tiny_target

    torch.set_num_threads(1)
    target = tiny_target(scale=2.0)

    def cfg(out, *extra):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return compose(config_name="make_training_data", overrides=[
                "sources=[stdlib_prose,poetry]", "num_prompts_per_source=3", "max_tokens=4", f"output={out}",
                "engine.max_model_len=64", "engine.kv_block_size=8", "engine.max_num_batched_tokens=64",
                "progress=false", "++samples_per_prompt={stdlib_prose: 2}", *extra])

    first = mtd.run(cfg(tmp_path / "train.safetensors"), target=target, tokenizer=CharTokenizer())
    record = mtd.load_prompt_record(first["prompt_record"])
    assert record["count"] == 6 and record["admitted_requests_per_source"] == {"poetry": 3, "stdlib_prose": 6}
    assert all("#" not in pid for pid in record["prompt_ids"])  # base ids, sample suffixes stripped
    second = mtd.run(cfg(tmp_path / "calib.safetensors", f"exclude_prompts=[{tmp_path / 'train.safetensors'}]"),
                     target=target, tokenizer=CharTokenizer())
    again = mtd.load_prompt_record(second["prompt_record"])
    assert second["excluded_prompt_ids"] == 6 and again["count"] == 6
    assert not set(again["prompt_ids"]) & set(record["prompt_ids"])
    from dspark.training.data import TokenDataset

    info = TokenDataset.load(tmp_path / "calib.safetensors").info
    assert info["exclude_prompts"][0]["count"] == 6 and info["split"] == "train"


def test_a_compressed_prompt_record_is_read_and_a_damaged_one_named(tmp_path):
    """A record kept as <record>.xz (as the shipped drafter's is) is found under its plain name and read; a
    truncated one is refused with a message naming the file, not a traceback from lzma."""
    import lzma

    packed = mtd.resolve_prompt_record("builtin:dspark-smollm2")
    assert packed.name == "training_prompts.json.xz"
    folder = tmp_path / "drafter"
    folder.mkdir()
    (folder / "training_prompts.json.xz").write_bytes(packed.read_bytes())
    record = mtd.load_prompt_record(str(folder))  # a drafter folder: its training_prompts.json(.xz)
    assert record["sha256"] == json.loads(lzma.decompress(packed.read_bytes()))["sha256"] and record["count"] > 0
    (folder / "training_prompts.json.xz").write_bytes(packed.read_bytes()[:1000])
    with pytest.raises(ConfigError, match=r"training_prompts\.json\.xz is not a readable xz file .*truncated or corrupt"):
        mtd.load_prompt_record(str(folder))
