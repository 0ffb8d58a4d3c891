"""Tokenizer used by the engine: encode/decode, special ids and chat-template rendering.

:class:`Tokenizer` wraps a fast :class:`tokenizers.Tokenizer` (the ``tokenizer.json`` of a Hugging Face
folder, or one rebuilt from GGUF metadata by :mod:`dspark.models.gguf_convert`) and renders chat
templates with Jinja2 configured the way ``transformers``' ``apply_chat_template`` configures it:
an immutable sandbox with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension,
``raise_exception`` / ``strftime_now`` globals, a ``tojson`` filter that does not HTML-escape, and the
named special tokens (``bos_token``, ``eos_token``, ...) as template variables. ``transformers`` is
not imported; tests check the output is identical to it.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

# Named special tokens that transformers exposes to chat templates (its SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Message keys that carry reasoning; transformers fills all of "reasoning_content"/"thinking" from any.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class TokenizerError(ValueError):
    """A tokenizer file or chat template is missing or invalid."""


def _token_text(value: Any) -> str | None:
    """A special-token entry of tokenizer_config.json: a string, an AddedToken dict, or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerError(f"special token entry {value!r} is neither a string nor an AddedToken dict with 'content'")


@lru_cache(maxsize=16)
def _compile_template(source: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise TokenizerError(f"chat template does not parse (line {exc.lineno}): {exc.message}") from exc


def _plain(value: Any) -> Any:
    """A deep copy of template inputs made of plain JSON types (what the sandbox is allowed to see)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return _plain(value.item())
    raise TokenizerError(f"chat message value of type {type(value).__name__} is not JSON-like: {value!r}")


def _with_reasoning_aliases(message: dict[str, Any]) -> dict[str, Any]:
    reasoning = next((message[k] for k in _REASONING_KEYS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


class Tokenizer:
    """Encode/decode text and render chat prompts for one model."""

    def __init__(
        self,
        backend,
        *,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str | None] | None = None,
        eos_token_ids: Iterable[int] | None = None,
        add_bos_token: bool = False,
        tokenizer_config: Mapping[str, Any] | None = None,
    ) -> None:
        """``backend``: a :class:`tokenizers.Tokenizer`. ``special_tokens``: names in
        :data:`SPECIAL_TOKEN_NAMES` -> token text. ``eos_token_ids``: every id that ends a generation;
        ``None`` means just the id of ``eos_token``."""
        self.backend = backend
        self.chat_template = chat_template
        self.special_tokens: dict[str, str] = {}
        for name, text in (special_tokens or {}).items():
            if name not in SPECIAL_TOKEN_NAMES:
                raise TokenizerError(f"unknown special token name {name!r}; allowed: {list(SPECIAL_TOKEN_NAMES)}")
            if text is None:
                continue
            if backend.token_to_id(text) is None:
                raise TokenizerError(f"{name}={text!r} is not in the vocabulary")
            self.special_tokens[name] = text
        self.add_bos_token = bool(add_bos_token)
        if eos_token_ids is None:
            eos = self.special_tokens.get("eos_token")
            eos_token_ids = () if eos is None else (backend.token_to_id(eos),)
        ids: list[int] = []
        for i in eos_token_ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise TokenizerError(f"eos token id {i} is outside the vocabulary (size {self.vocab_size})")
            if i not in ids:
                ids.append(i)
        self._eos_token_ids = tuple(ids)
        self.tokenizer_config = dict(tokenizer_config or {})

    # ----------------------------------------------------------------------------------------------
    # Ids

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(int(token_id))

    @property
    def bos_token_id(self) -> int | None:
        bos = self.special_tokens.get("bos_token")
        return None if bos is None else self.backend.token_to_id(bos)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos_token_ids

    @property
    def pad_token_id(self) -> int | None:
        pad = self.special_tokens.get("pad_token")
        return None if pad is None else self.backend.token_to_id(pad)

    # ----------------------------------------------------------------------------------------------
    # Text

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; special tokens written in the text (``<|im_start|>``) map to one id."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """Render ``messages`` ([{"role": ..., "content": ...}, ...]) with the chat template.

        Extra keyword arguments become template variables (e.g. ``enable_thinking=False``), overriding
        the special-token variables, as in transformers.
        """
        if self.chat_template is None:
            raise TokenizerError(
                "this tokenizer has no chat template; add 'chat_template' to tokenizer_config.json "
                "(or a chat_template.jinja file) or use plain-text prompts"
            )
        chat = []
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping):
                raise TokenizerError(f"message {i} is a {type(message).__name__}, expected a dict with 'role' and 'content'")
            chat.append(_with_reasoning_aliases(_plain(message)))
        variables = {**self.special_tokens, **_plain(dict(template_kwargs))}
        template = _compile_template(self.chat_template)
        return template.render(
            messages=chat, tools=variables.pop("tools", None), documents=variables.pop("documents", None),
            add_generation_prompt=add_generation_prompt, **variables,
        )

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **template_kwargs: Any) -> list[int]:
        """Token ids of the rendered chat (the template writes its own special tokens, none are added)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, **template_kwargs), add_special_tokens=False)

    # ----------------------------------------------------------------------------------------------
    # Files

    @classmethod
    def from_files(
        cls,
        tokenizer_json: str | Path,
        tokenizer_config_json: str | Path | None = None,
        eos_token_ids: Iterable[int] | None = None,
    ) -> "Tokenizer":
        """Load ``tokenizer.json`` (+ ``tokenizer_config.json``) of a Hugging Face folder.

        The chat template comes from ``tokenizer_config.json["chat_template"]`` or, when that is absent,
        from ``chat_template.jinja`` next to the config. ``eos_token_ids`` overrides the eos ids (callers
        pass the model config's eos ids here); by default only ``eos_token``'s id.
        """
        from tokenizers import Tokenizer as FastTokenizer

        tokenizer_json = Path(tokenizer_json)
        if not tokenizer_json.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {tokenizer_json}")
        try:
            backend = FastTokenizer.from_file(str(tokenizer_json))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
            raise TokenizerError(f"{tokenizer_json}: cannot be parsed as a tokenizers JSON file: {exc}") from exc
        config: dict[str, Any] = {}
        folder = tokenizer_json.parent
        if tokenizer_config_json is not None:
            tokenizer_config_json = Path(tokenizer_config_json)
            if not tokenizer_config_json.is_file():
                raise FileNotFoundError(f"tokenizer config not found: {tokenizer_config_json}")
            try:
                config = json.loads(tokenizer_config_json.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise TokenizerError(f"{tokenizer_config_json}: invalid JSON ({exc})") from exc
            folder = tokenizer_config_json.parent
        chat_template = config.get("chat_template")
        if isinstance(chat_template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in chat_template if isinstance(t, Mapping)}
            if "default" not in named:
                raise TokenizerError(f"chat_template list has no 'default' entry (names: {sorted(map(str, named))})")
            chat_template = named["default"]
        if chat_template is None and (folder / "chat_template.jinja").is_file():
            chat_template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        special = {name: _token_text(config.get(name)) for name in SPECIAL_TOKEN_NAMES if name in config}
        return cls(
            backend,
            chat_template=chat_template,
            special_tokens=special,
            eos_token_ids=eos_token_ids,
            add_bos_token=bool(config.get("add_bos_token", False)),
            tokenizer_config=config,
        )

    def save(self, directory: str | Path) -> Path:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat template) into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(directory / "tokenizer.json"))
        config = dict(self.tokenizer_config)
        config.update(self.special_tokens)
        config["add_bos_token"] = self.add_bos_token
        config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        else:
            config.pop("chat_template", None)
        (directory / "tokenizer_config.json").write_text(
            json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        return directory

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, bos_token_id={self.bos_token_id}, "
                f"eos_token_ids={self.eos_token_ids}, chat_template={'yes' if self.chat_template else 'no'})")


__all__ = ["Tokenizer", "TokenizerError", "SPECIAL_TOKEN_NAMES"]
