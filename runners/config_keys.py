"""The keys a typed config schema (:mod:`runners.schema`) declares: their dotted names and descriptions,
the keys closest to a mistyped one, and the ``--help`` listing of every key with its value.

A field's description is its comment in the schema's source, the one place it is written: the
comment lines directly above the field (no blank line between) followed by the comment at the end
of its line. A :class:`runners.schema.Choice` field adds its allowed values.

``--help`` prints the listing through the ``config_keys`` resolver, which the ``hydra/help``
option ``config_keys`` (conf/hydra/help/config_keys.yaml) puts in Hydra's help template; the
resolver reads the composed config, so the values shown are those the command line would run with.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import io
import textwrap
import tokenize
import typing
from enum import Enum
from pathlib import Path
from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"  # the runners' config folder (runners.hydra_main)
# The widest `key=value` column of the listing; a longer one pushes its description to the right.
KEY_VALUE_WIDTH = 44


@functools.lru_cache(maxsize=None)
def field_descriptions(schema: type) -> dict[str, str]:
    """``{field name: description}`` of a schema dataclass, from the comments of its source; a field it
    inherits is described in the source of the base class that declares it (a redeclaration with its
    own comment replaces that description)."""
    out: dict[str, str] = {}
    for cls in reversed(schema.__mro__):
        if dataclasses.is_dataclass(cls):
            out.update(_own_field_descriptions(cls))
    return out


def _own_field_descriptions(schema: type) -> dict[str, str]:
    """``{field name: description}`` of the fields declared in ``schema``'s own source."""
    try:
        lines, _ = inspect.getsourcelines(schema)
    except (OSError, TypeError):  # no source (an interactive definition): no descriptions
        return {}
    source = textwrap.dedent("".join(lines))
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, whether the line holds only the comment)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = (tok.string.lstrip("#").strip(), tok.line.strip().startswith("#"))
    cls = ast.parse(source).body[0]
    out = {}
    for node in getattr(cls, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, line = [], node.lineno - 1
        while line in comments and comments[line][1]:
            above.insert(0, comments[line][0])
            line -= 1
        trailing = [comments[n][0] for n in range(node.lineno, node.end_lineno + 1)
                    if n in comments and not comments[n][1]]
        text = " ".join(part for part in [*above, *trailing] if part)
        if text:
            out[node.target.id] = text
    return out


def _fields(schema: type) -> dict[str, Any]:
    hints = typing.get_type_hints(schema)
    return {f.name: hints[f.name] for f in dataclasses.fields(schema)}


def nested_schema(tp: Any) -> type | None:
    """The dataclass a field holds (``X`` or ``Optional[X]``), else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _choice(tp: Any) -> type[Enum] | None:
    """The Enum a field holds (``E`` or ``Optional[E]``), else None."""
    for t in (tp, *typing.get_args(tp)):
        if isinstance(t, type) and issubclass(t, Enum):
            return t
    return None


def description(schema: type, name: str) -> str:
    """A field's description, its allowed values added when it is a choice."""
    text = field_descriptions(schema).get(name, "")
    choice = _choice(_fields(schema)[name])
    if choice is not None:
        text = (text + " " if text else "") + "[" + " | ".join(str(m.value) for m in choice) + "]"
    return text


def schema_keys(schema: type, prefix: str = "") -> Iterator[tuple[str, type, str]]:
    """``(dotted key, the schema declaring it, field name)`` of every key under ``schema``, a nested
    schema's own key before its keys."""
    for name, tp in _fields(schema).items():
        yield f"{prefix}{name}", schema, name
        sub = nested_schema(tp)
        if sub is not None:
            yield from schema_keys(sub, f"{prefix}{name}.")


def close_keys(key: str, schema: type, prefix: str = "", n: int = 3) -> list[str]:
    """The keys under ``schema`` (named from ``prefix``) closest to the mistyped ``key``: by its last part, first
    among the keys next to it (``ab.n_block`` finds ``ab.n_blocks``), then among the keys below
    (``n_blocks`` finds ``ab.n_blocks``), at most ``n``."""
    name = key.rsplit(".", 1)[-1]
    here = list(_fields(schema))
    found = [prefix + k for k in difflib.get_close_matches(name, here, n=n, cutoff=0.6)]
    below: dict[str, list[str]] = {}
    for k, _, field_name in schema_keys(schema, prefix):
        if k.count(".") > prefix.count("."):
            below.setdefault(field_name, []).append(k)
    for match in difflib.get_close_matches(name, list(below), n=n, cutoff=0.8):
        found += [k for k in below[match] if k not in found]
    return found[:n]


def unknown_keys(node: Any, schema: type, prefix: str = "") -> list[str]:
    """Keys of ``node`` (a config mapping) that ``schema`` (a dataclass) does not declare, recursively into its
    nested schemas (a free-form ``Dict`` field is not looked into). Hydra refuses ``ab.n_blokcs=3`` by itself, but
    ``+engine.foo=1`` or ``+foo=1`` adds a key even to a typed config: this finds those."""
    fields = _fields(schema)
    bad = []
    for key in node:
        path = f"{prefix}{key}"
        if key not in fields:
            bad.append(path)
            continue
        sub = nested_schema(fields[key])
        value = node[key]
        if sub is not None and isinstance(value, (dict, DictConfig)):
            bad += unknown_keys(value, sub, prefix=f"{path}.")
    return bad


def schema_at(root: type, path: str) -> type | None:
    """The nested schema that declares the keys under the dotted ``path`` of ``root`` ("" is ``root``), or None."""
    schema: type | None = root
    for part in [p for p in path.split(".") if p]:
        if schema is None:
            return None
        schema = nested_schema(_fields(schema).get(part))
    return schema


def unknown_keys_message(bad: list[str], find_schema: Any) -> str:
    """The error for the unknown keys ``bad``: each with the closest declared keys and those allowed beside it
    (``find_schema(parent path)``: the schema declaring the keys under a parent, or None)."""
    lines = []
    for path in bad:
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        prefix = f"{parent}." if parent else ""
        schema = find_schema(parent)
        if schema is None:
            lines.append(path)
            continue
        close = close_keys(path, schema, prefix)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        lines.append(f"{path} ({hint}allowed here: {', '.join(sorted(allowed_keys(schema, prefix)))})")
    return "unknown config key(s): " + "; ".join(lines)


def refuse_unknown_keys(cfg: DictConfig) -> None:
    """A ConfigError naming every key of ``cfg`` its typed schema does not declare (nothing for an untyped
    config): what every runner checks before it works (runners.hydra_main)."""
    from dspark.config import ConfigError

    schema = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(schema):
        return
    bad = unknown_keys(OmegaConf.to_container(cfg, resolve=False), schema)  # (no interpolation resolved)
    if bad:
        raise ConfigError(unknown_keys_message(bad, lambda parent: schema_at(schema, parent)))


def allowed_keys(schema: type, prefix: str = "") -> list[str]:
    """The keys ``schema`` declares at its own level, named from ``prefix``."""
    return [f"{prefix}{name}" for name in _fields(schema)]


def _render(value: Any) -> str:
    """A value as it is written on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_render(v)}" for k, v in value.items()) + "}"
    return str(value)


def _rows(schema: type, node: Any, prefix: str) -> Iterator[tuple[str, str]]:
    """``(key=value, description)`` of every key under ``schema``; ``node`` holds the composed values
    (None where no group filled a nested schema: its keys are listed without values)."""
    values = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else {}
    for name, tp in _fields(schema).items():
        key, text = f"{prefix}{name}", description(schema, name)
        sub = nested_schema(tp)
        value = values.get(name) if isinstance(values, dict) else None
        if sub is not None:
            if value is None:
                yield f"{key}=null", text
            elif text:
                yield key, text
            yield from _rows(sub, node.get(name) if value is not None else None, f"{key}.")
        elif node is None:
            yield key, text
        else:
            yield f"{key}={_render(value)}", text


def help_listing(cfg: DictConfig) -> str:
    """Every key of ``cfg``'s typed schema, one line each: ``key=value`` and its description."""
    schema = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(schema):
        return "(this config has no typed schema: `--cfg job` prints its keys)"
    rows = list(_rows(schema, cfg, ""))
    width = min(KEY_VALUE_WIDTH, max(len(k) for k, _ in rows))
    return "\n".join(f"  {k:<{width}}  {text}".rstrip() if text else f"  {k}" for k, text in rows)


def group_package(group_dir: Path) -> str:
    """The config package a group's options write into: a ``# @package X`` header of its first option (the
    options of a group share one here), else the group's name."""
    for option in sorted(group_dir.glob("*.yaml")):
        for line in option.read_text().splitlines():
            if line.startswith("# @package "):
                return line[len("# @package "):].strip()
        break
    return group_dir.name


def group_listing(cfg: DictConfig, conf_dir: Path = CONF_DIR) -> str:
    """The config groups of ``conf_dir`` whose package is a top-level key of ``cfg``'s schema (the groups this
    runner reads), one line each with its options: what ``--help`` lists instead of every group of every
    runner."""
    schema = OmegaConf.get_type(cfg)
    keys = set(_fields(schema)) if dataclasses.is_dataclass(schema) else set(cfg.keys())
    lines = []
    for group_dir in sorted(p for p in conf_dir.iterdir() if p.is_dir() and p.name != "hydra"):
        if group_package(group_dir).split(".")[0] in keys:
            options = sorted(p.stem for p in group_dir.glob("*.yaml"))
            lines.append(f"{group_dir.name}: {', '.join(options)}")
    return "\n".join(lines) if lines else "(none: set keys directly)"


def _config_groups_resolver(*, _root_: DictConfig) -> str:
    return group_listing(_root_).replace("$", "$$")


def _config_keys_resolver(*, _root_: DictConfig) -> str:
    # Hydra fills the help template with string.Template: a `$` of a value (an interpolation) is doubled.
    return help_listing(_root_).replace("$", "$$")


if not OmegaConf.has_resolver("config_keys"):
    OmegaConf.register_new_resolver("config_keys", _config_keys_resolver)
if not OmegaConf.has_resolver("config_groups"):
    OmegaConf.register_new_resolver("config_groups", _config_groups_resolver)
