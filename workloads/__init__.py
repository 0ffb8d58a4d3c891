"""Prompt sources for benchmarks and drafter training (torch-free, no Hydra).

``make_spec(name, **overrides)`` + ``build_workload(spec)`` give a :class:`Workload`
whose ``prompts()`` are drawn deterministically from the seed, within the
``"eval"``/``"train"``/``"all"`` split fixed by a hash of each prompt id. Sources:
``agentic`` (bfcl-eval function calling + HumanEval), ``poetry``, ``arena_hard``,
``custom`` (a JSONL file), ``mixed_chat`` (agentic + arena_hard + poetry, greedy) and the
training-only ``stdlib_prose``, ``hard_questions``, ``tool_calls``, ``chat_followups``,
``worked_problems``, ``scenario_requests`` and ``code_debugging``.
"""

from .base import Prompt, Workload, WorkloadError, WorkloadSpec, split_of
from .registry import DEFAULTS, WORKLOADS, build_workload, make_spec

__all__ = ["DEFAULTS", "Prompt", "WORKLOADS", "Workload", "WorkloadError", "WorkloadSpec", "build_workload",
           "make_spec", "split_of"]
