"""Workload registry: names -> classes, per-workload default settings, and spec building.

``build_workload(spec)`` returns the workload named by ``spec.name``. ``DEFAULTS`` gives,
per name, the spec values a benchmark should use unless it overrides them;
``make_spec(name, **overrides)`` applies them (runners pass their Hydra group here).
"""

from __future__ import annotations

from typing import Any

from .agentic import AgenticWorkload
from .arena_hard import ArenaHardWorkload
from .base import Workload, WorkloadError, WorkloadSpec
from .chat_followups import ChatFollowupsWorkload
from .code_debugging import CodeDebuggingWorkload
from .custom import CustomWorkload
from .hard_questions import HardQuestionsWorkload
from .mixed_chat import MixedChatWorkload
from .poetry import PoetryWorkload
from .scenario_requests import ScenarioRequestsWorkload
from .stdlib_prose import StdlibProseWorkload
from .tool_calls import ToolCallsWorkload
from .worked_problems import WorkedProblemsWorkload

WORKLOADS: dict[str, type[Workload]] = {
    cls.NAME: cls
    for cls in (AgenticWorkload, PoetryWorkload, ArenaHardWorkload, CustomWorkload, StdlibProseWorkload,
                HardQuestionsWorkload, MixedChatWorkload, ToolCallsWorkload,
                ChatFollowupsWorkload, WorkedProblemsWorkload, ScenarioRequestsWorkload, CodeDebuggingWorkload)
}

DEFAULTS: dict[str, dict[str, Any]] = {
    # Function calling and code: greedy, short structured answers.
    "agentic": {"num_prompts": 64, "seed": 0, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 256,
                "split": "eval", "path": None, "greedy_replica_count": 0, "repeat": 1},
    # Creative text, sampled; the 768-token cap is required. 4 greedy replicas check losslessness.
    "poetry": {"num_prompts": 64, "seed": 0, "temperature": 0.7, "top_p": 1.0, "top_k": 0, "max_tokens": 768,
               "split": "eval", "path": None, "greedy_replica_count": 4, "repeat": 1},
    # Hard questions, greedy, long answers.
    "arena_hard": {"num_prompts": 48, "seed": 0, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 512,
                   "split": "eval", "path": None, "greedy_replica_count": 0, "repeat": 1},
    # agentic + arena_hard + poetry interleaved by seed, all greedy with one 256-token cap; every prompt of
    # the split by default (eval: 304 agentic + 57 arena_hard + 4962 poetry = 5323; see workloads/mixed_chat.py).
    "mixed_chat": {"num_prompts": None, "seed": 0, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 256,
                   "split": "eval", "path": None, "greedy_replica_count": 0, "repeat": 1},
    # A user's file is run whole by default; path must be given.
    "custom": {"num_prompts": None, "seed": 0, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 256,
               "split": "all", "path": None, "greedy_replica_count": 0, "repeat": 1},
    # Drafter-training material only.
    "stdlib_prose": {"num_prompts": None, "seed": 0, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                     "max_tokens": 256, "split": "train", "path": None, "greedy_replica_count": 0, "repeat": 1},
    # Drafter-training material only: arena-hard-style questions built combinatorially.
    "hard_questions": {"num_prompts": None, "seed": 0, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                       "max_tokens": 512, "split": "train", "path": None, "greedy_replica_count": 0, "repeat": 1},
    # Drafter-training material only: the bfcl-eval categories and tool-call formats agentic does not use.
    "tool_calls": {"num_prompts": None, "seed": 0, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                   "max_tokens": 256, "split": "train", "path": None, "greedy_replica_count": 0, "repeat": 1},
    # Drafter-training material only: question, existing answer, follow-up request (path: optional answers JSONL).
    "chat_followups": {"num_prompts": None, "seed": 0, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                       "max_tokens": 256, "split": "train", "path": None, "greedy_replica_count": 0, "repeat": 1},
    # Drafter-training material only: debugging snippets, math word problems and reasoning puzzles, worked step by
    # step (long answers, as hard_questions).
    "worked_problems": {"num_prompts": None, "seed": 0, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                        "max_tokens": 512, "split": "train", "path": None, "greedy_replica_count": 0, "repeat": 1},
    # Drafter-training material only: concrete scenarios (incidents, decisions, quantities, documents with their
    # facts, specified code, systems at a scale) with several explicit asks, as arena-hard-style users write them.
    "scenario_requests": {"num_prompts": None, "seed": 0, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                          "max_tokens": 512, "split": "train", "path": None, "greedy_replica_count": 0,
                          "repeat": 1},
    # Drafter-training material only: buggy snippets beyond worked_problems' own, asked in more ways (long answers).
    "code_debugging": {"num_prompts": None, "seed": 0, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                       "max_tokens": 512, "split": "train", "path": None, "greedy_replica_count": 0, "repeat": 1},
}


def _check_name(name: Any) -> None:
    if name not in WORKLOADS:
        raise WorkloadError(f"workload.name: unknown workload {name!r}; allowed: {sorted(WORKLOADS)}")


def make_spec(name: str, **overrides: Any) -> WorkloadSpec:
    """A spec for ``name`` from ``DEFAULTS[name]`` with ``overrides`` applied (unknown keys rejected)."""
    _check_name(name)
    allowed = set(DEFAULTS[name])
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise WorkloadError(f"workload {name!r}: unknown settings {unknown}; allowed: {sorted(allowed)}")
    return WorkloadSpec(name=name, **{**DEFAULTS[name], **overrides})


def build_workload(spec: WorkloadSpec) -> Workload:
    """The workload serving ``spec.name`` (prompts load lazily on first use)."""
    if not isinstance(spec, WorkloadSpec):
        raise WorkloadError(f"build_workload expects a WorkloadSpec, got {type(spec).__name__}; "
                            "build one with workloads.registry.make_spec(name, **overrides)")
    _check_name(spec.name)
    return WORKLOADS[spec.name](spec)


__all__ = ["DEFAULTS", "WORKLOADS", "build_workload", "make_spec"]
