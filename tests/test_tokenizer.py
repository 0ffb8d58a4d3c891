"""Tests of dspark.models.tokenizer: encode/decode, special ids, files, chat templates vs transformers."""

from __future__ import annotations

import json

import jinja2
import pytest

from dspark.models import gguf_convert as gc
from dspark.models.tokenizer import Tokenizer, TokenizerError

TINY_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    """256 byte tokens + a few merges + 3 control tokens, spelled in the byte-level alphabet."""
    alphabet = gc._byte_alphabet()
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "Ġa n", "Ġan d", "e r"]
    tokens = [alphabet[b] for b in range(256)] + [m.replace(" ", "") for m in merges]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [gc.TOKEN_TYPE_NORMAL] * len(tokens) + [gc.TOKEN_TYPE_CONTROL] * len(specials)
    return tokens + specials, merges, types

# A template written for these tests that uses the Jinja features chat templates rely on:
# whitespace control, trim/lstrip blocks, namespace, loop variables, loop controls, raise_exception,
# tojson on tools, special-token variables and extra variables.
RICH_TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(system=none, seen=0) %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] %}
{%- endif %}
{%- if tools %}
<|im_start|>system
{{ ns.system or 'You can call tools.' }}
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
<|im_end|>
{% elif ns.system %}
<|im_start|>system
{{ ns.system | trim }}<|im_end|>
{% endif %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}{% continue %}{% endif %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception('unknown role ' + message['role']) }}
    {%- endif %}
    {%- set ns.seen = ns.seen + 1 %}
<|im_start|>{{ message['role'] }}
{% if message['role'] == 'assistant' and message.get('reasoning_content') and enable_thinking %}
<think>{{ message['reasoning_content'] }}</think>
{% endif %}
{{ message['content'] }}{% if loop.last and not add_generation_prompt %}{{ eos_token }}{% else %}<|im_end|>{% endif %}

{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

CONVERSATIONS = {
    "single": [{"role": "user", "content": "Hello there!"}],
    "system": [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Why is the sky blue?"}],
    "multi": [
        {"role": "user", "content": "Write a haiku."},
        {"role": "assistant", "content": "Leaves fall\nquietly\u2014autumn.", "reasoning_content": "5-7-5"},
        {"role": "user", "content": "Now one about \"code\" & <tags>."},
    ],
    "unicode": [{"role": "user", "content": "caf\u00e9 \u4e2d\u6587 \U0001F680 \t tabs  and  spaces"}],
}


def tiny_backend():
    tokens, merges, types = tiny_vocab()
    meta = {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt2",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges, "tokenizer.ggml.token_type": types}
    return gc.build_tokenizer(meta)


def tiny_tokenizer(template=TINY_TEMPLATE, **kwargs):
    special = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>", "pad_token": "<|im_end|>"}
    return Tokenizer(tiny_backend(), chat_template=template, special_tokens=special, **kwargs)


def transformers_twin(tok: Tokenizer):
    """A transformers fast tokenizer around the same backend and special tokens."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok.backend, chat_template=tok.chat_template, **tok.special_tokens)


# ------------------------------------------------------------------------------------------------
# Tiny tokenizer (fast)


def test_ids_and_special_tokens():
    tok = tiny_tokenizer()
    vocab = tok.backend.get_vocab()
    assert tok.vocab_size == len(tiny_vocab()[0])
    assert tok.bos_token_id == vocab["<|im_start|>"]
    assert tok.eos_token_ids == (vocab["<|im_end|>"],)
    assert tok.pad_token_id == vocab["<|im_end|>"]
    assert tok.encode("<|im_end|>") == [vocab["<|im_end|>"]]
    assert tok.encode("x <|im_end|>", add_special_tokens=True) == tok.encode("x <|im_end|>")
    ids = tok.encode("<|im_start|>the and<|im_end|>")
    assert tok.decode(ids) == "the and"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>the and<|im_end|>"


def test_explicit_eos_ids_are_kept_in_order_without_duplicates():
    tok = tiny_tokenizer(eos_token_ids=[5, 3, 5])
    assert tok.eos_token_ids == (5, 3)
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tiny_tokenizer(eos_token_ids=[10**6])


def test_bad_special_tokens_are_refused():
    with pytest.raises(TokenizerError, match="not in the vocabulary"):
        Tokenizer(tiny_backend(), special_tokens={"eos_token": "</s>"})
    with pytest.raises(TokenizerError, match="unknown special token name"):
        Tokenizer(tiny_backend(), special_tokens={"eot_token": "<|im_end|>"})


def test_encode_requires_text():
    with pytest.raises(TypeError, match="str"):
        tiny_tokenizer().encode([1, 2])


def test_save_and_from_files_round_trip(tmp_path):
    tok = tiny_tokenizer(template=RICH_TEMPLATE)
    tok.save(tmp_path)
    loaded = Tokenizer.from_files(tmp_path / "tokenizer.json", tmp_path / "tokenizer_config.json")
    assert loaded.chat_template == RICH_TEMPLATE
    assert loaded.special_tokens == tok.special_tokens
    assert loaded.eos_token_ids == tok.eos_token_ids and loaded.bos_token_id == tok.bos_token_id
    text = "the and <|im_start|> in  her"
    assert loaded.encode(text) == tok.encode(text)
    msgs = CONVERSATIONS["multi"]
    assert loaded.apply_chat_template(msgs) == tok.apply_chat_template(msgs)


def test_from_files_reads_chat_template_jinja_and_addedtoken_dicts(tmp_path):
    tiny_backend().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": {"content": "<|im_end|>", "special": True}, "bos_token": None,
    }))
    (tmp_path / "chat_template.jinja").write_text(TINY_TEMPLATE)
    tok = Tokenizer.from_files(tmp_path / "tokenizer.json", tmp_path / "tokenizer_config.json")
    assert tok.chat_template == TINY_TEMPLATE
    assert tok.special_tokens == {"eos_token": "<|im_end|>"}
    assert tok.bos_token_id is None


def test_from_files_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_files(tmp_path / "tokenizer.json")
    tiny_backend().save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(FileNotFoundError, match="tokenizer_config.json"):
        Tokenizer.from_files(tmp_path / "tokenizer.json", tmp_path / "tokenizer_config.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="bad.json"):
        Tokenizer.from_files(tmp_path / "bad.json")


def test_template_errors_are_clear():
    with pytest.raises(TokenizerError, match="no chat template"):
        tiny_tokenizer(template=None).apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(jinja2.exceptions.TemplateError, match="unknown role tool"):
        tiny_tokenizer(template=RICH_TEMPLATE).apply_chat_template([{"role": "tool", "content": "x"}])
    with pytest.raises(TokenizerError, match="does not parse"):
        tiny_tokenizer(template="{% for m in messages %}").apply_chat_template([])


def test_template_sandbox_blocks_attribute_escapes():
    for evil in ("{{ messages.__class__.__mro__ }}", "{{ ''.__class__.__mro__[1].__subclasses__() }}"):
        with pytest.raises(jinja2.exceptions.SecurityError):
            tiny_tokenizer(template=evil).apply_chat_template([])
    with pytest.raises(jinja2.exceptions.SecurityError):  # immutable sandbox: no in-place edits
        tiny_tokenizer(template="{{ messages.append(1) }}").apply_chat_template([])


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("template", ["tiny", "rich"])
def test_chat_template_matches_transformers(name, add_generation_prompt, template):
    tok = tiny_tokenizer(template=TINY_TEMPLATE if template == "tiny" else RICH_TEMPLATE)
    twin = transformers_twin(tok)
    msgs = CONVERSATIONS[name]
    ours = tok.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt)
    theirs = twin.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours == theirs
    assert tok.encode_chat(msgs, add_generation_prompt) == tok.encode(theirs)


def test_chat_template_extra_variables_and_tools_match_transformers():
    tok = tiny_tokenizer(template=RICH_TEMPLATE)
    twin = transformers_twin(tok)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Wetter f\u00fcr <city>",
                                                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    msgs = CONVERSATIONS["multi"]
    ours = tok.apply_chat_template(msgs, enable_thinking=True, tools=tools)
    theirs = twin.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=True, tools=tools)
    assert ours == theirs
    assert "<think>5-7-5</think>" in ours and "f\u00fcr <city>" in ours


# ------------------------------------------------------------------------------------------------
# The real SmolLM2 tokenizer vs transformers' GGUF tokenizer

TEXTS = [
    "",
    "Hello world",
    "  leading spaces and trailing   ",
    "Tabs\tand\nnew\n\nlines\r\n and \u00a0nbsp",
    "def f(x):\n    return x ** 2  # square\n\n\tif x != 0: pass",
    "Numbers 1234567 3.14159 -42 1e10 2024-06-01",
    "Contractions: don't, I'M, we'll, they've, she'd",
    "Unicode: caf\u00e9 na\u00efve \u00fcber \u4e2d\u6587\u5b57 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4 \u0645\u0631\u062d\u0628\u0627 \U0001F680\U0001F44D\U0001F3FD e\u0301",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><repo_name>x<file_sep>y<filename>z.py",
    "<|im_start|>not<|im_end|>closed <|im_end",
    "     \n\n\n     ",
    "URLs https://example.com/a?b=c&d=e#frag and emails a.b@c.org",
    "{\"json\": [1, 2, {\"k\": null}]}",
]


@pytest.fixture(scope="module")
def smollm2_tokenizers(tmp_path_factory):
    """(ours built from GGUF metadata, ours reloaded from saved files, transformers' GGUF tokenizer)."""
    from transformers import AutoTokenizer

    from dspark.models.loading import smollm2_gguf_path

    path = smollm2_gguf_path()
    meta = gc.read_metadata(gc.open_gguf(path))
    tok_cfg = gc.tokenizer_config_dict(meta)
    ours = Tokenizer(gc.build_tokenizer(meta), chat_template=tok_cfg["chat_template"],
                     special_tokens={k: tok_cfg[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")},
                     tokenizer_config=tok_cfg)
    folder = ours.save(tmp_path_factory.mktemp("smollm2_tok"))
    reloaded = Tokenizer.from_files(folder / "tokenizer.json", folder / "tokenizer_config.json")
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return ours, reloaded, theirs


@pytest.mark.smollm2
def test_smollm2_encodings_match_transformers(smollm2_tokenizers):
    ours, reloaded, theirs = smollm2_tokenizers
    for text in TEXTS:
        expected = theirs.encode(text, add_special_tokens=False)
        assert ours.encode(text) == expected, text
        assert reloaded.encode(text) == expected, text
        assert ours.decode(expected, skip_special_tokens=False) == text, text
        assert ours.decode(expected) == theirs.decode(expected, skip_special_tokens=True), text


@pytest.mark.smollm2
def test_smollm2_special_ids(smollm2_tokenizers):
    ours, reloaded, _ = smollm2_tokenizers
    for tok in (ours, reloaded):
        assert tok.vocab_size == 49152
        assert tok.bos_token_id == 1 and tok.eos_token_ids == (2,)
        assert tok.encode("<|im_start|>") == [1] and tok.encode("<|im_end|>") == [2]
        assert tok.encode("<|endoftext|>") == [0]


@pytest.mark.smollm2
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_smollm2_chat_template_matches_transformers(smollm2_tokenizers, name):
    ours, reloaded, theirs = smollm2_tokenizers
    msgs = [{k: v for k, v in m.items() if k in ("role", "content")} for m in CONVERSATIONS[name]]
    for add_generation_prompt in (True, False):
        expected = theirs.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert ours.apply_chat_template(msgs, add_generation_prompt) == expected
        assert reloaded.apply_chat_template(msgs, add_generation_prompt) == expected
    expected_ids = theirs.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert ours.encode_chat(msgs) == list(expected_ids)
