"""Tool calls: drafter-training prompts from the bfcl-eval data the ``agentic`` workload does not use.

Training material only (``split="train"``, the registry default); the benchmarks' agentic
traffic stays the ``agentic`` workload, whose prompt set this source never changes. Rendering
reuses :mod:`workloads.agentic` (the tool system prompt, schema rendering, the multi-turn tool
selection and length rules). Three kinds of prompt:

- ``single``: every record of the single-turn categories ``SINGLE_TURN_CATEGORIES`` (live
  multiple/parallel calls, live relevance and irrelevance, the irrelevance questions whose tools
  cannot serve them, Java and JavaScript calls), asked in agentic's format (tools as JSON schemas,
  answer as ``[f(a=1)]``; id ``tool_calls/pylist/<bfcl id>``) and once more in one other format
  picked by a hash of the record id (``TOOL_FORMATS``): ``signatures`` (the tools as Python
  signatures with docstrings, answer as ``[f(a=1)]``) or ``json`` (tools as JSON schemas, answer
  as a JSON array of ``{"name", "arguments"}`` objects).
- ``variant``: the single-turn records of agentic's own categories, in the other format only
  (the agentic prompt already is the ``pylist`` one), for records of agentic's TRAIN split only.
- ``missing``: the multi-turn ``multi_turn_miss_func`` and ``multi_turn_miss_param``
  conversations, cut after the user turn that cannot be served (the needed function is withheld
  from the tool list, or a required value was never given), so the answer says what is missing
  or asks for it; earlier assistant turns are the ground-truth calls, as in agentic.

Left out: ``multi_turn_long_context`` (the long context is the API state in ``initial_config``,
which no prompt shows, so it would render exactly as ``multi_turn_base``), ``memory`` and
``web_search`` (the answers need a memory backend or the web; no tool schemas ship with the
questions) and ``format_sensitivity`` (a list of ids of agentic's categories, no questions).

Splits. A record's prompts share one split (a hash of ``tool_calls/<bfcl id>``, 20% eval), so a
question never sits in both splits under two formats; a record with a user turn an earlier record
already has (bfcl repeats some questions with other tools) takes that record's split, and
a prompt whose whole text an earlier one has is left out. The bfcl categories reuse questions (the
multi-turn ``miss_*`` conversations are ``multi_turn_base`` ones, some live questions recur
across categories), so a record sharing any user turn with an agentic prompt follows agentic:
it is dropped when that agentic prompt is in agentic's EVAL split, and always ``train`` otherwise.
Hence no training prompt carries a benchmark question, and the eval split (held-out loss and
calibration material) holds no question an agentic training prompt has.

Length. Multi-turn conversations drop their oldest exchanges as agentic does, and a prompt
longer than ``MAX_PROMPT_PIECES`` (:func:`prompt_pieces`, a tokenizer-free length proxy) is
left out (a few live records list dozens of large schemas or are mostly Chinese), so prompt
plus 256 output tokens fit a 2048-token context. Defaults: greedy, 256 output tokens.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from .agentic import (BFCL_FILE_TEMPLATE, SINGLE_TURN_CATEGORIES as AGENTIC_SINGLE_TURN, AgenticWorkload,
                      _user_turn, conversation_messages, package_data_dir, render_tools, tool_system_message)
from .base import Prompt, Workload, WorkloadError, WorkloadSpec, split_of
from .jsonl import read_json_lines

SINGLE_TURN_CATEGORIES = ("live_multiple", "live_parallel", "live_parallel_multiple", "live_relevance",
                          "live_irrelevance", "irrelevance", "simple_java", "simple_javascript")
MISSING_INFO_CATEGORIES = ("multi_turn_miss_func", "multi_turn_miss_param")
TOOL_FORMATS = ("pylist", "signatures", "json")
ALTERNATIVE_FORMATS = ("signatures", "json")
ID_PREFIX = "tool_calls"
# A prompt with more than this many text pieces (prompt_pieces: words, digits, punctuation marks, and
# non-ASCII characters counted three times) is left out. SmolLM2's tokenizer makes at most ~1.25 tokens of
# a piece on this data (characters do not bound tokens: some live records are mostly Chinese), so kept
# prompts stay under ~1,700 tokens and prompt + 256 output tokens fit a 2048-token context.
MAX_PROMPT_PIECES = 1350
_PIECE = re.compile(r"[A-Za-z]+|\d|[^\sA-Za-z\d]")

SIGNATURE_SYSTEM_PROMPT = (
    "You are an assistant that acts by calling functions. These Python functions are available:\n"
    "```python\n{tools}\n```\n\n"
    "Reply to each request with the function call(s) that fulfil it and nothing else, written as a "
    "Python-style list: [function_name(param1=value1, param2=value2), other_function(param=value)]. "
    "Use only the functions and parameters above, fill every parameter without a default, and keep the "
    "order in which the calls must run. If none of the functions can serve the request, reply with one "
    "short sentence that says which information or function is missing."
)
JSON_CALL_SYSTEM_PROMPT = (
    "You are an assistant that acts by calling tools. These tools are available, each described by a "
    "JSON schema:\n{tools}\n\n"
    "Reply to each request with the tool call(s) that fulfil it and nothing else, written as a JSON array "
    "of objects: [{{\"name\": \"tool_name\", \"arguments\": {{\"param1\": value1}}}}, ...]. Use only the "
    "tools and parameters listed above, fill every required parameter, and keep the order in which the "
    "calls must run. If no tool can serve the request, reply with one short sentence that says which "
    "information or tool is missing."
)
# JSON-schema type names as Python annotations (bfcl mixes JSON, Python, Java and JavaScript names).
PY_TYPES = {"string": "str", "integer": "int", "float": "float", "number": "float", "boolean": "bool",
            "array": "list", "dict": "dict", "object": "dict", "tuple": "tuple", "any": "Any"}


def _py_type(schema: dict[str, Any]) -> str:
    kind = str(schema.get("type", "any"))
    name = PY_TYPES.get(kind.lower(), kind)
    if name in ("list", "tuple") and isinstance(schema.get("items"), dict):
        return f"{name}[{_py_type(schema['items'])}]"
    return name


def render_signature(schema: dict[str, Any]) -> str:
    """One tool schema as a Python ``def`` line plus a docstring (parameters without a default first)."""
    params = schema.get("parameters") or {}
    props: dict[str, Any] = params.get("properties") or {}
    required = [n for n in props if n in set(params.get("required") or [])]
    optional = [n for n in props if n not in required]
    args = [f"{n}: {_py_type(props[n])}" for n in required]
    args += [f"{n}: {_py_type(props[n])} = {props[n].get('default')!r}" for n in optional]
    lines = [f"def {schema['name']}({', '.join(args)}):", f'    """{schema.get("description", "").strip()}']
    if props:
        lines += ["", "    Args:"]
        for n in required + optional:
            doc = str(props[n].get("description", "")).strip()
            if props[n].get("enum"):
                doc = (doc + " " if doc else "") + "One of: " + ", ".join(repr(v) for v in props[n]["enum"]) + "."
            lines.append(f"        {n}: {doc}".rstrip())
    lines.append('    """')
    return "\n".join(lines)


def system_message(schemas: list[dict[str, Any]], fmt: str) -> dict[str, str]:
    """The system turn listing ``schemas`` in tool format ``fmt`` (one of ``TOOL_FORMATS``)."""
    if fmt == "pylist":
        return tool_system_message(schemas)
    if fmt == "signatures":
        return {"role": "system",
                "content": SIGNATURE_SYSTEM_PROMPT.format(tools="\n\n".join(render_signature(s) for s in schemas))}
    if fmt == "json":
        return {"role": "system", "content": JSON_CALL_SYSTEM_PROMPT.format(tools=render_tools(schemas))}
    raise WorkloadError(f"tool_calls: unknown tool format {fmt!r}; allowed: {list(TOOL_FORMATS)}")


def alternative_format(record_id: str) -> str:
    """The second format a record is asked in (stable: a hash of its bfcl id)."""
    digest = hashlib.sha1(f"{ID_PREFIX}/{record_id}".encode("utf-8")).digest()
    return ALTERNATIVE_FORMATS[digest[0] % len(ALTERNATIVE_FORMATS)]


def prompt_pieces(messages: list[dict[str, str]]) -> int:
    """A tokenizer-free upper proxy of a prompt's length (see ``MAX_PROMPT_PIECES``)."""
    text = "\n".join(m["content"] for m in messages)
    return len(_PIECE.findall(text)) + 2 * sum(ord(c) > 127 for c in text)


def split_key(prompt_id: str) -> str:
    """What a prompt's split hashes: ``tool_calls/<bfcl id>``, shared by the record's formats."""
    parts = prompt_id.split("/", 2)
    return f"{ID_PREFIX}/{parts[2]}" if len(parts) == 3 else prompt_id


def user_texts(messages: list[dict[str, str]]) -> set[str]:
    return {m["content"] for m in messages if m["role"] == "user"}


def agentic_user_turn_splits() -> dict[str, set[str]]:
    """Every user turn of the agentic pool -> the agentic splits of the prompts that hold it."""
    agentic = AgenticWorkload(WorkloadSpec(name="agentic", split="all", num_prompts=None))
    found: dict[str, set[str]] = {}
    for p in agentic.pool():
        split = agentic.split_of(p)
        for text in user_texts(p.messages or []):
            found.setdefault(text, set()).add(split)
    return found


class ToolCallsWorkload(Workload):
    """bfcl-eval categories agentic leaves out, and tool-call formats it does not ask (training use)."""

    NAME = "tool_calls"

    def __init__(self, spec: WorkloadSpec) -> None:
        super().__init__(spec)
        self._forced_train: set[str] = set()  # prompt ids sharing a user turn with an agentic train prompt
        self._key: dict[str, str] = {}  # prompt id -> its split key, where an earlier record asked the question

    def split_of(self, prompt: Prompt) -> str:
        self.pool()
        if prompt.id in self._forced_train:
            return "train"
        return split_of(self._key.get(prompt.id, split_key(prompt.id)), self.EVAL_PERCENT)

    def load_pool(self) -> list[Prompt]:
        if self.spec.path is not None:
            raise WorkloadError(f"workload.path: tool_calls reads the bfcl-eval package data and takes no path "
                                f"(got {self.spec.path!r})")
        bfcl_dir = package_data_dir("bfcl_eval", "data")
        agentic_turns = agentic_user_turn_splits()
        records: list[tuple[str, list[Prompt]]] = []  # (bfcl id, its prompts)
        for category in SINGLE_TURN_CATEGORIES:
            for rid, schemas, messages in self._single_turn_records(bfcl_dir, category):
                formats = ("pylist", alternative_format(rid))
                records.append((rid, self._formatted(rid, schemas, messages, formats, f"tool_calls:{category}")))
        for category in AGENTIC_SINGLE_TURN:
            for rid, schemas, messages in self._single_turn_records(bfcl_dir, category):
                records.append((rid, self._formatted(rid, schemas, messages, (alternative_format(rid),),
                                                     "tool_calls:variant")))
        for category in MISSING_INFO_CATEGORIES:
            records.extend(self._missing_info(bfcl_dir, category))
        pool: list[Prompt] = []
        texts: set[str] = set()
        owners: dict[str, tuple[str, bool]] = {}  # user turn -> (first record asking it, forced train)
        for rid, prompts in records:
            prompts = [p for p in prompts if prompt_pieces(p.messages) <= MAX_PROMPT_PIECES and p.text not in texts]
            if not prompts:
                continue
            shared: set[str] = set()
            for p in prompts:
                for text in user_texts(p.messages):
                    shared |= agentic_turns.get(text, set())
            if "eval" in shared:  # a benchmark question: never training material here
                continue
            # bfcl repeats some questions across records (with other tools): they follow the first record
            turns = sorted(user_texts(prompts[0].messages))
            owner, forced = next((owners[t] for t in turns if t in owners), (rid, "train" in shared))
            for t in turns:
                owners.setdefault(t, (owner, forced))
            if forced or "train" in shared:
                self._forced_train.update(p.id for p in prompts)
            if owner != rid:
                self._key.update((p.id, f"{ID_PREFIX}/{owner}") for p in prompts)
            texts.update(p.text for p in prompts)
            pool.extend(prompts)
        return pool

    @staticmethod
    def _formatted(rid: str, schemas: list[dict[str, Any]], messages: list[dict[str, str]],
                   formats: tuple[str, ...], source: str) -> list[Prompt]:
        return [Prompt(id=f"{ID_PREFIX}/{fmt}/{rid}", messages=[system_message(schemas, fmt)] + messages,
                       prompt=None, max_tokens=None, source=source if fmt == "pylist" else f"{source}:{fmt}")
                for fmt in formats]

    @staticmethod
    def _single_turn_records(bfcl_dir: Path, category: str):
        path = AgenticWorkload._category_file(bfcl_dir, BFCL_FILE_TEMPLATE.format(category=category))
        for record in read_json_lines(path):
            where = f"{path} id {record.get('id')!r}"
            turns = record.get("question")
            if not isinstance(turns, list) or len(turns) != 1 or not isinstance(record.get("function"), list):
                raise WorkloadError(f"{where}: expected one question turn and a 'function' list of tool schemas")
            messages = _user_turn(turns[0], where)
            # a few live records list no tool, end on an assistant message or hold an empty message: not a request
            if record["function"] and messages[-1]["role"] == "user" and all(
                    isinstance(m["content"], str) and m["content"].strip() for m in messages):
                yield record["id"], record["function"], messages

    def _missing_info(self, bfcl_dir: Path, category: str) -> list[tuple[str, list[Prompt]]]:
        """Conversations cut after the turn that cannot be served (see the module docstring)."""
        path = AgenticWorkload._category_file(bfcl_dir, BFCL_FILE_TEMPLATE.format(category=category))
        answer_path = AgenticWorkload._category_file(bfcl_dir, "possible_answer",
                                                     BFCL_FILE_TEMPLATE.format(category=category))
        answers = {r["id"]: r["ground_truth"] for r in read_json_lines(answer_path)}
        helper = AgenticWorkload(WorkloadSpec(name="agentic", split="all", num_prompts=None))
        class_docs: dict[str, list[dict[str, Any]]] = {}
        out = []
        for record in read_json_lines(path):
            rid = record.get("id")
            where = f"{path} id {rid!r}"
            turns, truth = record.get("question"), answers.get(rid)
            if not isinstance(turns, list) or truth is None or len(truth) != len(turns):
                raise WorkloadError(f"{where}: expected a 'question' list and a ground truth with one entry per turn")
            missed = record.get("missed_function") or {}
            if missed:  # the function is withheld until the (empty) turn that adds it back
                last = min(int(k) for k in missed) - 1
                withheld = {name for names in missed.values() for name in names}
            else:  # the last turn without a call before the end: a required value was not given
                last = max((i for i, calls in enumerate(truth[:-1]) if not calls), default=-1)
                withheld = set()
            if last < 0 or not turns[last]:
                continue
            cut = dict(record, excluded_function=list(record.get("excluded_function") or []) + sorted(withheld),
                       path=[p for p in record.get("path") or [] if p.split(".")[-1] not in withheld])
            kept_truth = [[c for c in calls if c.split("(", 1)[0].strip() not in withheld] for calls in truth[:last]]
            schemas = helper._multi_turn_tools(bfcl_dir, cut, kept_truth, class_docs, where)
            messages = conversation_messages(turns, truth, schemas, where, last=last, skip_empty=True)
            out.append((rid, [Prompt(id=f"{ID_PREFIX}/pylist/{rid}", messages=messages,
                                     prompt=None, max_tokens=None, source=f"tool_calls:{category}")]))
        return out


__all__ = ["ALTERNATIVE_FORMATS", "MAX_PROMPT_PIECES", "MISSING_INFO_CATEGORIES", "SINGLE_TURN_CATEGORIES",
           "TOOL_FORMATS", "ToolCallsWorkload", "alternative_format", "render_signature", "prompt_pieces", "split_key",
           "system_message"]
