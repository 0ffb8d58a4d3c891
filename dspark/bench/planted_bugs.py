"""Deliberately wrong engines: proof that the A/B guards can fail.

A guard is only worth its "passed" if the same guard, on the same run, says "failed" when the
engine is wrong. :func:`plant_bug` makes one engine (one arm; the other arm and the engine
code stay correct) commit wrong tokens in one of the ways speculative decoders have gone wrong:

- ``accept_rejected``: each verify step accepts one draft past the first mismatch (the first
  rejected draft is committed as if the target agreed) whenever one was tested.
- ``shifted_bonus``: the target's own token after the accepted drafts is read one position too
  late (the prediction after a token that was never committed).
- ``stale_kv``: a verify step does not write its anchor's K/V: the cache keeps what that slot held,
  the rejected draft of the step before (or nothing), and attention reads it from then on.

Each bug is planted in the engine instance's step pipeline (``GraphDecoder._accept_greedy`` or
``_pack_rows``, which host-driven and captured steps share; before any graph is captured) and never
touches module state, so two engines in one process stay independent. Greedy requests only: sampled steps keep the correct rule.

``bench/guard_planted_bugs.py`` runs ``runners.ab`` with each bug in arm B and records whether the
guards caught it; tests/test_planted_bugs.py does the same on CPU.
"""

from __future__ import annotations

from typing import Callable

import torch

PLANTED_BUGS = ("accept_rejected", "shifted_bonus", "stale_kv")


def plant_bug(engine, bug: str) -> None:
    """Make ``engine`` (a dspark.engine.Engine, before any graph is captured) commit wrong tokens."""
    if bug not in PLANTED_BUGS:
        raise ValueError(f"planted bug {bug!r} unknown; one of {PLANTED_BUGS}")
    if engine.block_size == 0:
        raise ValueError("planted bugs live in speculative verification: plant them in a DSpark arm (spec=dspark)")
    if engine.graph is not None and getattr(engine.graph, "graphs", None):
        raise RuntimeError("plant the bug before the engine captures its CUDA graphs")
    {"accept_rejected": _accept_rejected, "shifted_bonus": _shifted_bonus, "stale_kv": _stale_kv}[bug](engine)
    engine.planted_bug = bug


def _wrong_greedy(rule: Callable) -> Callable:
    """A greedy acceptance ``(drafts, target_tokens, windows) -> (k, next)`` bent by ``rule(k, windows, M)``
    (the wrong accepted count, the position of the wrong next token)."""

    def accept(drafts: torch.Tensor, target_tokens: torch.Tensor, windows: torch.Tensor):
        from dspark.verification import accept_greedy

        k, _ = accept_greedy(drafts, target_tokens, windows)
        k_bad, at = rule(k, windows.to(torch.int64), target_tokens.shape[1])
        return k_bad, target_tokens.gather(1, at[:, None]).squeeze(1)

    return accept


def _plant_acceptance(engine, rule: Callable) -> None:
    engine.steps._accept_greedy = _wrong_greedy(rule)


def _accept_rejected(engine) -> None:
    def rule(k, windows, M):
        k = torch.where(k < windows, k + 1, k)
        return k, k

    _plant_acceptance(engine, rule)


def _shifted_bonus(engine) -> None:
    def rule(k, windows, M):
        return k, (k + 1).clamp(max=M - 1)

    _plant_acceptance(engine, rule)


def _stale_kv(engine) -> None:
    steps = engine.steps
    pack = steps._pack_rows

    def pack_rows(R, mode, rows_in):
        packed = pack(R, mode, rows_in)
        slots = packed.slot_mapping.clone()
        first = packed.indptr[:-1].long().clamp(max=slots.shape[0] - 1)
        slots.index_fill_(0, first, steps.trash_slot)  # each row's anchor: its K/V never reaches the cache
        return packed._replace(slot_mapping=slots)

    steps._pack_rows = pack_rows


def planted_engine_factory(bug: str, arm: str = "B", base: Callable | None = None) -> Callable:
    """An A/B engine factory (runners.ab.run's ``engine_factory``): ``base``'s engines, with ``bug``
    planted in ``arm``."""
    if bug not in PLANTED_BUGS:
        raise ValueError(f"planted bug {bug!r} unknown; one of {PLANTED_BUGS}")

    def factory(cfg, arm_cfgs):
        from runners.ab import default_engine_factory

        engines = (base or default_engine_factory)(cfg, arm_cfgs)
        plant_bug(engines[arm], bug)
        return engines

    factory.__qualname__ = f"planted_engine_factory({bug!r}, arm={arm!r})"
    return factory
