"""The A/B runner's Hydra configs: every workload and launcher composes, and every bad override
is refused with a message naming the key, before any model loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import get_class
from omegaconf import OmegaConf

import runners.ab as ab
from dspark.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
WORKLOADS = ("agentic", "poetry", "arena_hard", "custom")


def compose_ab(overrides=(), out_dir: Path | str = "/nonexistent/ab-out", hydra_config: bool = False):
    """The composed `ab` config as `python -m runners.ab OVERRIDES` sees it, writing to ``out_dir``."""
    # Cost tables profiled by a test go beside its outputs, never into the checkout.
    paths = [f"paths.root={ROOT}", f"paths.output_dir={out_dir}", f"paths.cost_tables={Path(out_dir) / 'cost_tables'}"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="ab"):
        return compose(config_name="ab", overrides=[*paths, "progress=false", *overrides],
                       return_hydra_config=hydra_config)


def full_message(exc: BaseException) -> str:
    parts = []
    while exc is not None:
        parts.append(str(exc))
        exc = exc.__cause__
    return "\n".join(parts)


class NoModels:
    """An engine factory that must never be called: config errors come first."""

    called = False

    def __call__(self, cfg, arm_cfgs):
        NoModels.called = True
        raise AssertionError("a model was requested although the config is invalid")


@pytest.mark.parametrize("launcher", [None, "local", "slurm"])
@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_workload_and_launcher_composes(workload, launcher, tmp_path):
    overrides = [f"+workload={workload}"] + ([f"hydra/launcher={launcher}"] if launcher else [])
    cfg = compose_ab(overrides, hydra_config=True)
    assert cfg.workload.name == workload
    target = cfg.hydra.launcher._target_
    expected = {None: "BasicLauncher", "local": "submitit_launcher.LocalLauncher",
                "slurm": "submitit_launcher.SlurmLauncher"}[launcher]
    assert target.endswith(expected)
    if launcher == "local":
        assert cfg.hydra.launcher.timeout_min == 120 and cfg.hydra.launcher.tasks_per_node == 1
    if launcher == "slurm":  # the partition is the user's to name; null = the cluster default
        assert cfg.hydra.launcher.partition is None
        assert cfg.hydra.launcher.gpus_per_node == 1 and cfg.hydra.launcher.timeout_min == 240
    callback = cfg.hydra.callbacks.sweep_summary._target_
    from hydra.experimental.callback import Callback
    assert issubclass(get_class(callback), Callback)

    job_cfg = compose_ab(overrides, out_dir=tmp_path)  # what the job sees
    if workload == "custom":  # no file given: refused by name before any model loads
        with pytest.raises(ConfigError, match="workload.path"):
            ab.run(job_cfg, engine_factory=NoModels())
    else:
        arm_cfgs, wl, schedule = ab.check_config(job_cfg)
        assert (arm_cfgs["A"].spec, arm_cfgs["A"].verify) == ("dspark", "full")  # default: verify-all vs ragged
        assert (arm_cfgs["B"].spec, arm_cfgs["B"].verify) == ("dspark", "ragged")
        assert [arm for _, arm in schedule] == ["A", "B", "B", "A"] * (job_cfg.ab.n_blocks // 2)


def test_slurm_launcher_settings_override():
    cfg = compose_ab(["+workload=agentic", "hydra/launcher=slurm", "hydra.launcher.partition=h200",
                      "hydra.launcher.timeout_min=30"], hydra_config=True)
    assert cfg.hydra.launcher.partition == "h200" and cfg.hydra.launcher.timeout_min == 30
    with pytest.raises(ConfigCompositionException):  # the plugin's schema types our file
        compose_ab(["+workload=agentic", "hydra/launcher=slurm", "hydra.launcher.timeout_min=soon"],
                   hydra_config=True)


@pytest.mark.parametrize("override,names", [
    ("ab.n_blokcs=3", ["ab.n_blokcs", "n_blokcs"]),
    ("ab.n_blocks=abc", ["ab.n_blocks", "abc"]),
    ("load.concurrency=many", ["load.concurrency", "many"]),
    ("engine.max_model_len=1.5", ["engine.max_model_len", "1.5"]),
    ("ab.fail_on_guard=sometimes", ["ab.fail_on_guard", "sometimes"]),
    ("engine.kernels.fused_layers=sometimes", ["engine.kernels.fused_layers", "sometimes"]),
    ("engine.kernels.pdl=true", ["engine.kernels.pdl"]),
    ("engine.kernels.l2_prefetch_programs=many", ["engine.kernels.l2_prefetch_programs", "many"]),
    # String choices are enums of the typed schema: any other value fails at composition, listing the allowed ones.
    ("ab.schedule=XYZ", ["ab.schedule", "XYZ", "ABBA", "ABAB", "random"]),
    ("load.mode=burst", ["load.mode", "burst", "closed", "poisson"]),
    ("wandb.mode=cloud", ["wandb.mode", "cloud", "offline", "online", "disabled"]),
    ("ab.gc_mode=sometimes", ["ab.gc_mode", "sometimes", "freeze", "disable", "default"]),
])
def test_unknown_key_or_wrong_type_refused_at_composition(override, names):
    with pytest.raises(ConfigCompositionException) as info:
        compose_ab(["+workload=agentic", override])
    text = full_message(info.value)
    for name in names:
        assert name in text, text


@pytest.mark.parametrize("override,names", [
    ("+engine.foo=1", ["engine.foo", "engine.dtype"]),
    ("+foo=1", ["foo", "allowed here"]),
    ("+ab.arms.B.engine.bar=1", ["ab.arms.B.engine.bar"]),
    ("+ab.nblocks=3", ["ab.nblocks", "ab.n_blocks"]),
    ("engine.dtype=float8", ["engine.dtype", "float8", "float32", "bfloat16", "float16"]),
    ("load.concurrency=0", ["load.concurrency", ">= 1"]),
    ("ab.arms.B.engine.spec=maybe", ["ab.arms.B", "engine.spec", "maybe", "off", "dspark"]),
    ("ab.n_blocks=0", ["ab.n_blocks", ">= 1"]),
    ("ab.warmup_requests=-1", ["ab.warmup_requests"]),
    ("workload.num_prompts=0", ["workload.num_prompts"]),
    ("engine.kernels.l2_prefetch_programs=0", ["engine.kernels.l2_prefetch_programs", "1 to 64"]),
    ("engine.kernels.decode_megakernel=true", ["engine.kernels.decode_megakernel", "attention_backend=triton"]),
    ("+ab.arms.B.engine.kernels.megakernel_programs=0", ["ab.arms.B", "engine.kernels.megakernel_programs"]),
    ("+ab.arms.B.engine.kernels.pdl=true", ["ab.arms.B", "engine.kernels", "pdl"]),
])
def test_bad_value_refused_before_any_model_loads(tmp_path, override, names):
    cfg = compose_ab(["+workload=agentic", override], out_dir=tmp_path / "run")
    NoModels.called = False
    with pytest.raises(ConfigError) as info:
        ab.run(cfg, engine_factory=NoModels())
    for name in names:
        assert name in str(info.value), str(info.value)
    assert not NoModels.called
    assert not (tmp_path / "run" / "summary.json").exists()


def test_kernel_switches_compose_per_engine_and_per_arm():
    """engine.kernels.* from the command line reach each arm's EngineConfig; an arm's own
    engine.kernels.* overrides go on top of the group's (the other switches stay the group's)."""
    cfg = compose_ab(["+workload=agentic", "engine.attention_backend=triton", "engine.kernels.fused_qkv_rope=false",
                      "+ab.arms.B.engine.kernels.triton_argmax=false"])
    arms = ab.arm_engine_configs(cfg)
    a, b = arms["A"].kernel_config(), arms["B"].kernel_config()
    assert a.attention_backend == b.attention_backend == "triton"
    assert not a.fused_qkv_rope and a.triton_argmax
    assert not b.fused_qkv_rope and not b.triton_argmax
    assert not a.l2_prefetch and not a.decode_megakernel  # experimental: off by default
    default = ab.arm_engine_configs(compose_ab(["+workload=agentic"]))["A"].kernel_config()
    assert default.attention_backend == "torch" and default.fused_layers


def test_missing_workload_says_how_to_choose_one(tmp_path):
    with pytest.raises(ConfigError, match=r"\+workload=poetry"):
        ab.run(compose_ab([], out_dir=tmp_path), engine_factory=NoModels())


def test_custom_workload_with_missing_file_fails_before_models(tmp_path):
    cfg = compose_ab(["+workload=custom", f"workload.path={tmp_path / 'nope.jsonl'}"], out_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match="nope.jsonl"):
        ab.run(cfg, engine_factory=NoModels())
    assert not NoModels.called


def test_cfg_job_via_compose_and_cli_agree():
    cfg = compose_ab(["+workload=poetry", "ab.n_blocks=6"])
    text = OmegaConf.to_yaml(cfg)
    assert "n_blocks: 6" in text and "name: poetry" in text
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "runners.ab", "+workload=poetry", "ab.n_blocks=6", "--cfg", "job"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    printed = OmegaConf.create(proc.stdout)
    assert printed.ab.n_blocks == 6 and printed.workload.name == "poetry"
    assert OmegaConf.to_container(printed.ab) == OmegaConf.to_container(cfg.ab)
    assert "hydra" not in printed


def test_an_engine_on_a_cuda_device_is_refused_where_there_is_none():
    """engine.device=cuda where torch sees no GPU: one message naming it, before any other check of the settings
    (on a CPU a ragged arm would otherwise be told about token buckets); a served arm's reported config is another
    machine's and is not checked here."""
    import torch

    from runners.schema import to_engine_config

    if torch.cuda.is_available():  # (on a GPU machine: the device is present, and the check lets it through)
        assert to_engine_config({"device": "cuda", "cuda_graphs": True}).device == "cuda"
    else:
        with pytest.raises(ConfigError, match=r"engine.device=cuda: torch sees no CUDA device here"):
            to_engine_config({"device": "cuda", "verify": "ragged"})
    with pytest.raises(ConfigError, match=r"engine.device=gpu: one of cpu, cuda or cuda:N"):
        to_engine_config({"device": "gpu"})
    assert to_engine_config({"device": "cuda", "cuda_graphs": True}, local=False).device == "cuda"
