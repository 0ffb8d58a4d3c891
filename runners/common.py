"""What every runner does the same way: turn a composed config into an engine.

Test hook: with the environment variable ``DSPARK_TEST_TINY_MODELS=1`` (:data:`TINY_MODELS_ENV`) runners.ab and
runners.serve build the tiny random models of ``tests/tiny.py`` with a character tokenizer
(:func:`tiny_models`) instead of the configured ones, so that whole runs (subprocesses included: a served arm
of an A/B) finish in seconds in the test suite. Their speed numbers mean nothing; never set it for a real
measurement.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import torch

from dspark.config import ConfigError, DrafterConfig, EngineConfig
from runners.schema import to_engine_config

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "dspark" / "assets"
TINY_MODELS_ENV = "DSPARK_TEST_TINY_MODELS"


def resolve_drafter_path(path: str | None, key: str = "drafter.path") -> str | None:
    """'builtin:NAME' -> the checkpoint shipped in dspark/assets/NAME; other values are paths.

    ``key`` is the setting that named it (drafter.path, eval_drafter's checkpoint, train_drafter's init_from):
    errors name it. Only drafter.path accepts ``random`` (returned as is).
    """
    if path is None or (path == "random" and key == "drafter.path"):
        return path
    if path.startswith("builtin:"):
        name = path.split(":", 1)[1]
        folder = ASSETS / name
        if not (folder / "config.json").exists():
            others = (", use drafter.path=random (lossless checks only), or run spec=off" if key == "drafter.path"
                      else "")
            raise ConfigError(f"{key}: the shipped drafter {name!r} is not in {ASSETS}; train one with "
                              f"`python -m runners.train_drafter`, point {key} at a checkpoint folder{others}")
        return str(folder)
    if not Path(path).is_dir():
        raise ConfigError(f"{key}: {path!r} is not a folder holding a drafter checkpoint (config.json + safetensors)")
    return path


# The engine settings that name a confidence calibration: resolved (builtin:NAME/SUB), read and owner-checked alike.
ENGINE_CALIBRATION_KEYS = ("confidence_calibration", "greedy_confidence_calibration")


def resolve_calibration_path(path: str | None, key: str = "engine.confidence_calibration") -> str | None:
    """'builtin:NAME/SUB' -> a calibration shipped beside the drafter NAME (dspark/assets/NAME/SUB, e.g.
    ``builtin:dspark-smollm2/sts_top_gap``); 'builtin:NAME' -> that drafter's own calibration;
    other values are paths (checked where they are read)."""
    if path is None or not str(path).startswith("builtin:"):
        return path
    name = str(path).split(":", 1)[1]
    folder = ASSETS / name
    if not (folder / "temperatures.json").is_file():
        shipped = sorted(str(p.parent.relative_to(ASSETS)) for p in ASSETS.glob("*/**/temperatures.json"))
        raise ConfigError(f"{key}: {path} is not a calibration the package ships (no {folder}/temperatures.json); "
                          f"the shipped ones: {', '.join('builtin:' + s for s in shipped) or 'none'}")
    return str(folder)


def check_calibration_owner(calibration: str | None, drafter_path: str | None,
                            key: str = "engine.confidence_calibration") -> None:
    """A calibration shipped in dspark/assets/NAME/ was fitted for the drafter NAME: refuse it for another drafter,
    whose head it would mis-scale without a sign. ``drafter.path=random`` (random weights, lossless checks only)
    has no head a calibration could fit, and is not checked."""
    if calibration is None or drafter_path in (None, "random"):
        return
    where = Path(calibration).resolve()
    owner = next((ASSETS / p.name for p in ASSETS.iterdir() if p.is_dir() and where.is_relative_to(p.resolve())),
                 None)
    if owner is not None and Path(drafter_path).resolve() != owner.resolve():
        raise ConfigError(f"{key}: {calibration} was fitted for the shipped drafter builtin:{owner.name}, and this "
                          f"engine runs the drafter in {drafter_path}; calibrate that drafter (`python -m "
                          f"runners.calibrate checkpoint=COPY method=sts_bias ...`) and give its temperatures.json")


def build_engine(cfg: Any, engine_cfg: EngineConfig | None = None, seed: int = 0):
    """Engine from a composed config with model/drafter/engine groups (and optional top-level spec)."""
    from dspark.engine import Engine
    from dspark.model_runner import DTYPES
    from dspark.models.drafter import DSparkDrafter
    from dspark.models.llama import TargetModel
    from dspark.models.loading import load_hf_folder, target_folder
    from dspark.models.provenance import target_record

    if engine_cfg is None:
        engine_cfg = to_engine_config(cfg.engine, spec=cfg.get("spec"))
    drafter_path = resolve_drafter_path(cfg.drafter.path) if engine_cfg.spec == "dspark" else None
    if engine_cfg.spec == "dspark" and drafter_path is None:
        raise ConfigError("spec=dspark needs a drafter: choose drafter=dspark_smollm2 or set drafter.path, "
                          "or run spec=off")
    for key in ENGINE_CALIBRATION_KEYS:
        check_calibration_owner(getattr(engine_cfg, key), drafter_path, f"engine.{key}")
    folder = target_folder(cfg.model.source, cache_dir=cfg.model.cache_dir)
    mcfg, state, tokenizer = load_hf_folder(folder)
    target = TargetModel(mcfg)
    target.load_hf_state_dict(state)
    target.origin = target_record(folder)
    drafter = None
    if drafter_path == "random":
        torch.manual_seed(seed)
        n = mcfg.num_layers
        drafter = DSparkDrafter(mcfg, DrafterConfig(target_layer_ids=(1, n // 2, n - 2)))
    elif drafter_path is not None:
        drafter = DSparkDrafter.load(drafter_path, mcfg, device=engine_cfg.device, dtype=DTYPES[engine_cfg.dtype])
    return Engine(target, tokenizer, engine_cfg, drafter)


def writable_folder(path: str | Path, key: str, create: bool = True) -> Path:
    """``path`` as a folder results can be written into (created when missing), or a ConfigError naming ``key``:
    called before a model loads, so that a bad output path does not cost the work it was to hold. ``create``
    False: nothing is created; the folder, or its nearest existing parent, must be a folder this process may
    write into (for an output that a refused run must not leave behind, such as the cost-table folder)."""
    import tempfile

    folder = Path(path)
    if not create:
        existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError(f"{key}: cannot write into {folder} ({existing} is not a folder this process may write "
                              "into); choose another path")
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as e:
        raise ConfigError(f"{key}: cannot write into {folder} ({e.strerror or e}); choose another path") from None
    return folder


def check_sampling(keys: dict[str, str], **values: Any) -> None:
    """Check sampling values a runner takes under its own keys (``keys``: SamplingParams field -> the runner's
    key) before any model loads, with SamplingParams' own rules: a bad value is a ConfigError that names the key
    the user wrote, not ``sampling.<field>`` of a request built later."""
    from dspark.config import SamplingParams

    try:
        SamplingParams(**values)
    except ConfigError as e:
        raise under_own_key(e, {f"sampling.{field}": key for field, key in keys.items()}) from None


def under_own_key(error: ConfigError, keys: dict[str, str]) -> ConfigError:
    """``error`` naming the key the user wrote where it names the key a check read it as (``keys``: the checked
    key -> the user's key, e.g. ``engine.spec`` -> ``spec``); ``error`` itself where neither applies."""
    message = str(error)
    for checked, own in keys.items():
        if message.startswith(checked + ":"):
            return ConfigError(own + message[len(checked):])
    return error


# ---- the tiny-model test hook --------------------------------------------------------------------------
def tiny_models_requested() -> bool:
    return os.environ.get(TINY_MODELS_ENV, "") not in ("", "0")


class TinyCharTokenizer:
    """Test hook tokenizer for the tiny models: characters -> ids 3..vocab-1 (1 = bos, 2 = eos).

    Only the last ``keep`` characters of a prompt are encoded, so every prompt is short.
    """

    def __init__(self, vocab_size: int, keep: int = 40):
        self.vocab_size, self.keep = vocab_size, keep
        self.bos_token_id, self.eos_token_ids = 1, (2,)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1] + [3 + ord(c) % (self.vocab_size - 3) for c in text[-self.keep:]]

    def encode_chat(self, messages, add_generation_prompt: bool = True, **_: Any) -> list[int]:
        return self.encode("".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>")

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(32 + (i - 3) % 94) for i in ids if i > 2)


def tiny_models():
    """The test hook's models: (target, drafter, tokenizer), the same in every process that builds them."""
    path = ROOT / "tests" / "tiny.py"
    if not path.exists():
        raise ConfigError(f"{TINY_MODELS_ENV}=1 needs the test helpers at {path} (a source checkout); "
                          f"unset {TINY_MODELS_ENV} to load the configured models")
    spec = importlib.util.spec_from_file_location("_dspark_tests_tiny", path)
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    target = tiny.tiny_target(seed=0, scale=4.0)  # at scale 1 it only repeats its last input token
    drafter = tiny.tiny_drafter(target, seed=1)
    return target, drafter, TinyCharTokenizer(target.cfg.vocab_size)
