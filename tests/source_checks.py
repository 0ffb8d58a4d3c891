"""Checks shared by the tests of the combinatorial training-only sources (``worked_problems``,
``scenario_requests``): text shingles, overlap with the packaged arena-hard-style questions, determinism, the
2048-token context budget, and staying out of make_training_data's defaults (torch-free)."""

from __future__ import annotations

import json
import re
import string
from typing import Callable

import pytest

from workloads import DEFAULTS, WorkloadError, build_workload, make_spec, split_of
from workloads.arena_hard import PACKAGED_QUESTIONS


def outside_code(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def shingles(text: str, n: int = 8) -> set[tuple[str, ...]]:
    """The ``n``-word runs of ``text``, lowercased, punctuation stripped."""
    words = text.lower().translate(str.maketrans("", "", string.punctuation)).split()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def arena_shingles() -> set[tuple[str, ...]]:
    """The 8-word shingles of every packaged arena-hard-style question."""
    arena: set[tuple[str, ...]] = set()
    for line in PACKAGED_QUESTIONS.read_text().splitlines():
        if line.strip():
            arena |= shingles(json.loads(line)["turns"][0]["content"])
    assert len(arena) > 1000
    return arena


def prompts_sharing_shingles(pool: list, theirs: set[tuple[str, ...]],
                              text_shingles: Callable[[str], set[tuple[str, ...]]] = shingles) -> dict[str, list]:
    """The prompts of ``pool`` whose text shares a shingle with ``theirs``: id -> two of the shared shingles."""
    shared = {}
    for p in pool:
        common = text_shingles(p.text) & theirs
        if common:
            shared[p.id] = sorted(common)[:2]
    return shared


def assert_deterministic_across_loads(name: str, workload_class: type, pool: list) -> None:
    """A second load gives the same ids and messages, and a seeded draw is the same twice."""
    again = workload_class(make_spec(name, split="all", num_prompts=None)).pool()
    assert [(p.id, p.messages) for p in again] == [(p.id, p.messages) for p in pool]
    first = build_workload(make_spec(name, num_prompts=12, seed=5)).prompts()
    second = build_workload(make_spec(name, num_prompts=12, seed=5)).prompts()
    assert [p.id for p in first] == [p.id for p in second]


def assert_fits_context(name: str, pool: list, tokenizer) -> None:
    """The longest prompt plus the source's output cap fits a 2048-token context, with a margin."""
    longest = max(len(tokenizer.encode(tokenizer.apply_chat_template(p.messages))) for p in pool)
    assert longest + DEFAULTS[name]["max_tokens"] <= 2048 - 64


def assert_training_only_source(name: str) -> None:
    """make_training_data composes ``name`` on request, but it is neither a default nor a calibration source."""
    from runners import make_training_data as mtd

    items = mtd.collect_prompts([name], "train", 5, 0)
    assert len(items) == 5 and all(src == name and split_of(pid) == "train" for src, pid, _ in items)
    assert name not in mtd.DEFAULT_SOURCES and name not in mtd.CALIBRATION_EVAL_SOURCES


def assert_refuses_path(name: str) -> None:
    """A generated source takes no ``path``, and says so."""
    with pytest.raises(WorkloadError, match=f"{name} generates its prompts and takes no path"):
        build_workload(make_spec(name, path="questions.jsonl")).pool()


def assert_refuses_path_and_unknown_category(name: str, category_items) -> None:
    """A generated source takes no ``path``, and its ``category_items`` names an unknown category in its error."""
    assert_refuses_path(name)
    with pytest.raises(WorkloadError, match="unknown category 'poems'"):
        category_items("poems")
