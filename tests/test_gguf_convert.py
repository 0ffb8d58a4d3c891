"""Tests of dspark.models.gguf_convert: names, Q/K un-permutation, metadata, tokenizer, real SmolLM2."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dspark.config import ModelConfig
from dspark.models import gguf_convert as gc
from dspark.models.gguf_convert import GGUFError

SMOLLM2_CACHE = "dspark-smollm2-cache"  # shared by test modules through pytest's session base temp dir


# ------------------------------------------------------------------------------------------------
# A tiny synthetic GGUF (fast; no real model needed)


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    """256 byte tokens + a few merges + 3 control tokens, spelled in the byte-level alphabet."""
    alphabet = gc._byte_alphabet()
    tokens = [alphabet[b] for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "Ġa n", "Ġan d", "e r"]
    for m in merges:
        tokens.append(m.replace(" ", ""))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [gc.TOKEN_TYPE_NORMAL] * len(tokens) + [gc.TOKEN_TYPE_CONTROL] * len(specials)
    return tokens + specials, merges, types


def tiny_config(vocab_size: int) -> ModelConfig:
    return ModelConfig(
        arch="llama", vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=500000.0,
        max_position_embeddings=256, tie_word_embeddings=True,
        bos_token_id=vocab_size - 2, eos_token_ids=(vocab_size - 1,),
    )


TINY_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def write_tiny_gguf(path, quantization="Q8_0", seed=0, untied=False):
    """Write a tiny llama GGUF; return (path, cfg, original HF-order state dict)."""
    tokens, merges, types = tiny_vocab()
    cfg = tiny_config(len(tokens))
    cfg.tie_word_embeddings = not untied
    gen = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(shape, generator=gen) for k, shape in gc.expected_shapes(cfg).items()}
    gc.write_llama_gguf(path, cfg, state, tokens=tokens, merges=merges, token_types=types,
                        chat_template=TINY_TEMPLATE, pad_token_id=len(tokens) - 1, quantization=quantization)
    return path, cfg, state


# ------------------------------------------------------------------------------------------------
# Names and permutation


@pytest.mark.parametrize("gguf_name,hf_name", [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
    ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("blk.7.attn_k.weight", "model.layers.7.self_attn.k_proj.weight"),
    ("blk.7.attn_v.weight", "model.layers.7.self_attn.v_proj.weight"),
    ("blk.12.attn_output.weight", "model.layers.12.self_attn.o_proj.weight"),
    ("blk.3.ffn_gate.weight", "model.layers.3.mlp.gate_proj.weight"),
    ("blk.3.ffn_up.weight", "model.layers.3.mlp.up_proj.weight"),
    ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"),
    ("blk.29.attn_norm.weight", "model.layers.29.input_layernorm.weight"),
    ("blk.29.ffn_norm.weight", "model.layers.29.post_attention_layernorm.weight"),
])
def test_tensor_name_mapping_both_ways(gguf_name, hf_name):
    assert gc.hf_tensor_name(gguf_name) == hf_name
    assert gc.gguf_tensor_name(hf_name) == gguf_name


@pytest.mark.parametrize("bad", ["rope_freqs.weight", "blk.0.attn_qkv.weight", "blk.x.attn_q.weight", "token_embd"])
def test_unknown_tensor_name_is_refused(bad):
    with pytest.raises(GGUFError, match="tensor"):
        gc.hf_tensor_name(bad)


def test_permute_follows_llama_cpp_rule_on_a_hand_example():
    # one head of dim 4: HF rows [a0, a1, b0, b1] -> GGUF rows [a0, b0, a1, b1]
    hf = np.array([[0.0], [1.0], [2.0], [3.0]])
    assert gc.permute_qk_rows(hf, 1)[:, 0].tolist() == [0.0, 2.0, 1.0, 3.0]
    # two heads of dim 4: each head is interleaved on its own
    hf2 = np.arange(8, dtype=np.float64)[:, None]
    assert gc.permute_qk_rows(hf2, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


@pytest.mark.parametrize("heads,head_dim,cols", [(1, 2, 3), (4, 16, 8), (3, 64, 5), (9, 64, 2)])
def test_unpermute_inverts_permute_on_random_data(heads, head_dim, cols):
    rng = np.random.default_rng(heads * 100 + head_dim)
    w = rng.standard_normal((heads * head_dim, cols)).astype(np.float32)
    permuted = gc.permute_qk_rows(w, heads)
    assert not np.array_equal(permuted, w) or head_dim == 2
    np.testing.assert_array_equal(gc.unpermute_qk_rows(permuted, heads), w)


def test_unpermute_rejects_rows_not_divisible_by_heads():
    with pytest.raises(GGUFError, match="rows"):
        gc.unpermute_qk_rows(np.zeros((10, 4)), 3)


# ------------------------------------------------------------------------------------------------
# Whole-file conversion on the tiny GGUF


@pytest.mark.parametrize("quantization,atol", [("F32", 0.0), ("Q8_0", 0.05)])
def test_convert_tiny_gguf_restores_hf_tensors(tmp_path, quantization, atol):
    path, cfg, state = write_tiny_gguf(tmp_path / "tiny.gguf", quantization=quantization)
    converted = gc.convert_gguf(path)
    assert converted.model_config == cfg
    assert set(converted.state_dict) == set(state)
    for name, ref in state.items():
        got = converted.state_dict[name]
        assert got.dtype == torch.float32 and got.shape == ref.shape, name
        torch.testing.assert_close(got, ref, atol=atol * float(ref.abs().max()), rtol=0, msg=name)
    # the permutation was undone: Q rows are far from the permuted (GGUF-order) rows
    q = state["model.layers.0.self_attn.q_proj.weight"].numpy()
    q_gguf_order = torch.from_numpy(gc.permute_qk_rows(q, cfg.num_heads))
    assert (converted.state_dict["model.layers.0.self_attn.q_proj.weight"] - q_gguf_order).abs().max() > 0.5


def test_convert_untied_keeps_lm_head_and_bf16_option(tmp_path):
    path, cfg, state = write_tiny_gguf(tmp_path / "tiny.gguf", quantization="F32", untied=True)
    converted = gc.convert_gguf(path, dtype="bfloat16")
    assert converted.model_config.tie_word_embeddings is False
    assert converted.hf_config["tie_word_embeddings"] is False
    assert converted.state_dict["lm_head.weight"].dtype == torch.bfloat16
    torch.testing.assert_close(converted.state_dict["lm_head.weight"].float(), state["lm_head.weight"], atol=0.02, rtol=0.01)


def test_convert_rejects_unknown_dtype(tmp_path):
    path, _, _ = write_tiny_gguf(tmp_path / "tiny.gguf", quantization="F32")
    with pytest.raises(GGUFError, match="float64"):
        gc.convert_gguf(path, dtype="float64")


def test_tiny_metadata_config_and_tokenizer(tmp_path):
    path, cfg, _ = write_tiny_gguf(tmp_path / "tiny.gguf", quantization="F32")
    meta = gc.read_metadata(gc.open_gguf(path))
    assert gc.model_config_from_metadata(meta).rope_theta == 500000.0
    tok = gc.build_tokenizer(meta)
    assert tok.get_vocab_size(with_added_tokens=True) == cfg.vocab_size
    ids = tok.encode("<|im_start|>the and<|im_end|>").ids
    vocab = tok.get_vocab()
    assert ids == [vocab["<|im_start|>"], vocab["t"], vocab["he"], vocab["Ġand"], vocab["<|im_end|>"]]
    assert tok.decode(ids, skip_special_tokens=True) == "the and"
    tok_cfg = gc.tokenizer_config_dict(meta)
    assert tok_cfg["chat_template"] == TINY_TEMPLATE
    assert tok_cfg["bos_token"] == "<|im_start|>" and tok_cfg["eos_token"] == "<|im_end|>"


def test_metadata_errors_name_the_key():
    base = {"general.architecture": "llama", "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.model": "gpt2"}
    with pytest.raises(GGUFError, match="general.architecture='gemma'.*supported"):
        gc.model_config_from_metadata({**base, "general.architecture": "gemma"})
    with pytest.raises(GGUFError, match="llama.embedding_length"):
        gc.model_config_from_metadata(base)
    with pytest.raises(GGUFError, match="tokenizer.ggml.model='llama'"):
        gc.build_tokenizer({**base, "tokenizer.ggml.model": "llama"})
    with pytest.raises(GGUFError, match="tokenizer.ggml.pre='qwen2'"):
        gc.build_tokenizer({**base, "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.merges": []})


def test_float32_metadata_value_is_rounded_to_its_decimal():
    assert gc._float32_value(9.999999747378752e-06) == 1e-05
    assert gc._float32_value(100000.0) == 100000.0


def test_truncated_and_garbage_files_give_clear_errors(tmp_path):
    path, _, _ = write_tiny_gguf(tmp_path / "tiny.gguf", quantization="F32")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(GGUFError, match=r"cut\.gguf.*truncated or corrupt"):
        gc.convert_gguf(cut)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(GGUFError, match="junk.gguf"):
        gc.open_gguf(junk)
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        gc.open_gguf(tmp_path / "missing.gguf")


# ------------------------------------------------------------------------------------------------
# The real SmolLM2 file


@pytest.fixture(scope="module")
def smollm2_folder(tmp_path_factory):
    from dspark.models.loading import prepare_smollm2

    return prepare_smollm2(tmp_path_factory.getbasetemp() / SMOLLM2_CACHE)


@pytest.mark.slow
@pytest.mark.smollm2
def test_smollm2_tensors_equal_transformers_gguf_loader(smollm2_folder, monkeypatch):
    """Our dequantized, renamed, un-permuted tensors equal transformers' own GGUF loading."""
    gguf_loader = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    import gguf
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from dspark.models.loading import smollm2_gguf_path

    # transformers reads the file twice below (its config, then its tensors), each time parsing all of its
    # metadata (seconds: the 49k-token vocabulary) with gguf's read-only GGUFReader: one parse serves both.
    readers: dict = {}
    real_reader = gguf.GGUFReader

    def parsed_once(file, mode="r"):
        if (str(file), mode) not in readers:
            readers[str(file), mode] = real_reader(file, mode)
        return readers[str(file), mode]

    monkeypatch.setattr(gguf, "GGUFReader", parsed_once)
    path = str(smollm2_gguf_path())
    parsed = gguf_loader.load_gguf_checkpoint(path, return_tensors=False)
    hf_cfg = LlamaConfig(**{k: v for k, v in parsed["config"].items() if k != "model_type"})
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(hf_cfg)
    reference = gguf_loader.load_gguf_checkpoint(path, return_tensors=True, model_to_load=skeleton)["tensors"]
    assert len(readers) == 1
    ours = load_file(str(smollm2_folder / "model.safetensors"))
    assert set(ours) == set(reference)
    for name, ref in reference.items():
        assert torch.equal(ours[name], ref.to(torch.float32)), name


@pytest.mark.smollm2
def test_smollm2_config_and_transformers_can_load_the_folder(smollm2_folder):
    """transformers loads the converted folder without missing keys and the model answers sensibly
    (a wrong Q/K row order would destroy attention and the answer)."""
    from transformers import AutoModelForCausalLM

    from dspark.models.loading import load_hf_folder

    cfg, _, tok = load_hf_folder(smollm2_folder)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 576, 9, 3, 64)
    assert (cfg.vocab_size, cfg.intermediate_size, cfg.rope_theta, cfg.rms_norm_eps) == (49152, 1536, 100000.0, 1e-5)
    assert cfg.tie_word_embeddings and cfg.bos_token_id == 1 and cfg.eos_token_ids == (2,)
    model, info = AutoModelForCausalLM.from_pretrained(smollm2_folder, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    answer = tok.decode(out[0, len(ids):].tolist())
    assert "Paris" in answer, answer
