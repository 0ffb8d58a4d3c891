"""runners.generate: the output is checked before the model loads, generations reach the disk as they
finish, the input is never overwritten, and errored requests make the command fail."""

import json

import pytest
from omegaconf import OmegaConf

from dspark.config import ConfigError
from dspark.engine import Engine
from runners import generate
from runners.ab import TinyCharTokenizer
from tiny import tiny_engine_config, tiny_target


def cfg_for(prompts_file, output, **sampling):
    from runners.schema import EngineSchema

    return OmegaConf.create({"prompts_file": str(prompts_file), "output": str(output), "progress": False,
                             "spec": "off", "engine": OmegaConf.structured(EngineSchema),
                             "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 5,
                                          "ignore_eos": True, "stop": [], "seed": None, **sampling}})


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    long = "x" * 60  # longer than the engine's context below: that request errors
    path.write_text('{"prompt": "hello", "id": "a"}\n{"prompt": "' + long + '", "id": "long"}\n{"prompt": "bye", "id": "b"}\n')
    return path


@pytest.fixture
def tiny_engine(monkeypatch):
    built = []

    def build(cfg, engine_cfg=None):
        target = tiny_target(2)
        eng = Engine(target, TinyCharTokenizer(target.cfg.vocab_size), tiny_engine_config(spec="off", max_model_len=24), None)
        built.append(eng)
        return eng

    monkeypatch.setattr(generate, "build_engine", build)
    return built


@pytest.mark.parametrize("bad", ["folder", "input", "under_a_file"])
def test_runners_generate_checks_output_before_generating(tmp_path, prompts, tiny_engine, bad):
    output = {"folder": tmp_path, "input": prompts, "under_a_file": prompts / "x.jsonl"}[bad]
    before = prompts.read_text()
    with pytest.raises(ConfigError, match="output"):
        generate.run(cfg_for(prompts, output))
    assert tiny_engine == []  # refused before any model loaded
    assert prompts.read_text() == before  # the input is never overwritten


@pytest.mark.parametrize("bad,message", [({"top_p": 2.0}, r"^sampling.top_p: must be in \(0, 1\]"),
                                         ({"spec": "of"}, r"^spec: ")])
def test_runners_generate_refuses_a_bad_setting_before_it_touches_the_output(tmp_path, prompts, tiny_engine, bad,
                                                                            message):
    cfg = cfg_for(prompts, tmp_path / "gen.jsonl", **{k: v for k, v in bad.items() if k != "spec"})
    if "spec" in bad:
        cfg.spec = bad["spec"]
    with pytest.raises(ConfigError, match=message):
        generate.run(cfg)
    assert tiny_engine == [] and not (tmp_path / "gen.jsonl.partial").exists()  # no empty .partial left behind


def test_runners_generate_names_a_missing_prompts_file_and_keeps_an_interrupted_runs_generations(tmp_path, prompts,
                                                                                                 tiny_engine):
    with pytest.raises(ConfigError, match=r"^prompts_file: .*nope.jsonl does not exist"):
        generate.run(cfg_for(tmp_path / "nope.jsonl", tmp_path / "gen.jsonl"))
    assert tiny_engine == [] and not (tmp_path / "gen.jsonl.partial").exists()
    kept = tmp_path / "gen.jsonl.partial"  # what an interrupted run streamed
    kept.write_text('{"index": 0, "id": "a"}\n')
    generate.run(cfg_for(prompts, tmp_path / "gen.jsonl"))
    assert (tmp_path / "gen.jsonl.partial.1").read_text() == '{"index": 0, "id": "a"}\n'
    assert not kept.exists() and (tmp_path / "gen.jsonl").is_file()


def test_runners_generate_streams_and_exits_nonzero_when_requests_errored(tmp_path, prompts, tiny_engine):
    out = tmp_path / "sub" / "gen.jsonl"
    seen = []
    real_generate = Engine.generate

    def spy(self, *args, on_finish=None, **kw):  # each finished generation is on disk before the run ends
        def check(i, o):
            on_finish(i, o)
            seen.append(len((out.parent / "gen.jsonl.partial").read_text().splitlines()))
        return real_generate(self, *args, on_finish=check, **kw)

    Engine.generate = spy
    try:
        summary = generate.run(cfg_for(prompts, out))
    finally:
        Engine.generate = real_generate
    assert seen == [1, 2, 3]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "long", "b"]  # input order
    assert rows[1]["finish_reason"] == "error" and not (out.parent / "gen.jsonl.partial").exists()
    assert summary["errors"] == 1
    with pytest.raises(generate.RequestsErrored, match="1 of 3 requests errored"):
        generate.refuse_errors(summary)


def test_runners_generate_non_utf8_prompts_file_names_file_and_line(tmp_path, tiny_engine):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b'{"prompt": "hello"}\n{"prompt": "na\xefve"}\n')  # latin-1 i-diaeresis on line 2
    with pytest.raises(ConfigError, match=r"prompts\.jsonl:2: .*not UTF-8 \(bytes ef at byte offset 34 in the file, "
                                          r"column 15 of line 2\).*iconv"):
        generate.run(cfg_for(prompts, tmp_path / "out.jsonl"))
    assert tiny_engine == []  # refused before any model loaded
