"""Runners refuse an output they could not write, and values they could not use, before any model loads: a bad
path found after the work would cost the work (runners.common.writable_folder and each runner's early checks)."""

from __future__ import annotations

import importlib

import pytest
from hydra import compose, initialize_config_dir

from dspark.config import ConfigError
from runners.common import writable_folder
from test_configs import CONF


def composed(runner: str, overrides: list[str]):
    importlib.import_module(f"runners.{runner}")  # registers the config's schema
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name=runner):
        return compose(config_name=runner, overrides=overrides)


@pytest.fixture
def blocked(tmp_path):
    """A path no folder can be made at: under a regular file."""
    (tmp_path / "file").write_text("")
    return tmp_path / "file" / "out"


def test_writable_folder_creates_a_folder_or_names_the_key(tmp_path, blocked):
    assert writable_folder(tmp_path / "a" / "b", "output_dir").is_dir()
    assert [p.name for p in (tmp_path / "a" / "b").iterdir()] == []  # the write check leaves nothing behind
    with pytest.raises(ConfigError, match=r"^output_dir: cannot write into .*file/out"):
        writable_folder(blocked, "output_dir")
    # Checked without creating anything: a missing folder under a writable one passes, one under a file does not.
    assert writable_folder(tmp_path / "c" / "d", "out", create=False) == tmp_path / "c" / "d"
    assert not (tmp_path / "c").exists()
    with pytest.raises(ConfigError, match=r"^out: cannot write into .*file/out .*is not a folder"):
        writable_folder(blocked, "out", create=False)


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: the refusals below come before one."""
    import runners.common
    import runners.train_drafter

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad setting was refused")

    monkeypatch.setattr(runners.common, "build_engine", load)
    monkeypatch.setattr(runners.train_drafter, "load_target_and_tokenizer", load)


@pytest.mark.parametrize("runner,overrides,message", [
    ("bench_decode", ["output_dir={blocked}"], r"output_dir: cannot write into"),
    ("bench_decode", ["output_dir={tmp}/out", "new_tokens=0"], r"^new_tokens: must be >= 1, got 0"),
    ("profile", ["out={blocked}/table.json"], r"out: cannot write into"),
    ("make_training_data", ["output={tmp}/train.txt"], r"output: .*train.txt must be a .safetensors file"),
    ("make_training_data", ["output={blocked}/train.safetensors"], r"output: cannot write into"),
    ("eval_drafter", ["checkpoint=builtin:dspark-smollm2", "ci_level=1.5"], r"ci_level: .* must lie in \(0, 1\)"),
    ("eval_drafter", ["checkpoint=builtin:dspark-smollm2", "output_dir={blocked}"], r"output_dir: cannot write into"),
    ("eval_drafter", ["checkpoint=builtin:dspark-smollm2", "top_p=1.5"], r"^top_p: must be in \(0, 1\], got 1.5"),
    ("eval_drafter", ["checkpoint=builtin:dspark-smollm2", "max_tokens=0"], r"^max_tokens: must be >= 1"),
    ("calibrate", ["checkpoint=builtin:dspark-smollm2"], r"checkpoint: builtin:dspark-smollm2 is the drafter the "
                                                          r"package ships"),
    ("train_drafter", ["data={tmp}/train.safetensors", "train.output_dir={tmp}/run", "stop_at_step=-2"],
     r"stop_at_step: .* >= 1"),
    ("train_drafter", ["data={tmp}/train.safetensors", "train.output_dir={blocked}"],
     r"train.output_dir: cannot write into"),
    ("train_drafter", ["data={tmp}/train.safetensors", "train.output_dir={tmp}/run", "train.device=gpu"],
     r"train.device=gpu: one of cpu, cuda or cuda:N"),
    ("calibrate", ["checkpoint={tmp}", "device=gpu"], r"device=gpu: one of cpu, cuda or cuda:N"),
])
def test_a_bad_output_or_value_is_refused_before_any_model_loads(runner, overrides, message, tmp_path, blocked,
                                                                 no_model):
    module = importlib.import_module(f"runners.{runner}")
    cfg = composed(runner, [o.format(blocked=blocked, tmp=tmp_path) for o in overrides])
    with pytest.raises(ConfigError, match=message):
        module.run(cfg)
