"""Continuous batching: which requests run this step, and how much of each.

Decoding requests go first (each needs its anchor plus the drafted block verified),
then unfinished prefills continue, then waiting requests are admitted, all under one
token budget per step and the page pool. When the pool runs dry a decoding request
preempts the newest running request, which frees its pages and later recomputes its
prefix (all committed tokens but the anchor). No torch in this module.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from dspark.kv_cache import BlockManager
from dspark.request import Request, Status


@dataclass
class PrefillChunk:
    req: Request
    start: int
    length: int


@dataclass
class StepPlan:
    prefills: list[PrefillChunk] = field(default_factory=list)
    decodes: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    failed: list[tuple[Request, str]] = field(default_factory=list)
    admitted_ready: list[Request] = field(default_factory=list)  # admitted with nothing to prefill (one-token prompts)

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes

    @property
    def is_mixed(self) -> bool:
        return bool(self.prefills) and bool(self.decodes)


class Scheduler:
    def __init__(self, blocks: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int, block_size: int):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.block_size = block_size  # drafted positions per step; 0 in target-only mode
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Running requests admitted with a prefill to do, in admission order (a subset of ``running``
        # that may still hold requests whose prefill completed: _schedule_prefills drops those), so that
        # a step does not scan every decoding request for unfinished prefills.
        self._prefilling: list[Request] = []

    @property
    def decode_tokens(self) -> int:
        return self.block_size + 1

    def add(self, req: Request) -> None:
        req.status = Status.WAITING
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def clear(self) -> None:
        """Drop every request, running or waiting, and free their pages."""
        for r in list(self.running) + list(self.waiting):
            self.blocks.free(r.req_id)
        self.running.clear()
        self.waiting.clear()
        self._prefilling.clear()

    def finish(self, req: Request) -> None:
        req.status = Status.FINISHED
        self.blocks.free(req.req_id)
        if req in self.running:
            self.running.remove(req)
        if req in self._prefilling:
            self._prefilling.remove(req)

    def _preempt(self, victim: Request, plan: StepPlan) -> None:
        self.blocks.free(victim.req_id)
        self.running.remove(victim)
        if victim in self._prefilling:
            self._prefilling.remove(victim)
        victim.num_computed = 0
        victim.num_preemptions += 1
        victim.status = Status.WAITING
        self.waiting.appendleft(victim)
        plan.preempted.append(victim)

    def _capacity_for_decode(self, req: Request) -> int:
        # Verify writes positions n-1 .. n-1+G and the drafter's block n-1 .. n+G-2.
        return req.num_tokens + self.block_size

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        # 1. Decodes, oldest first; preempt the newest to make room.
        for req in list(self.running):
            if req not in self.running or req.in_prefill:
                continue
            if budget < self.decode_tokens:
                break
            need = self._capacity_for_decode(req)
            while not self.blocks.can_reserve(req.req_id, need):
                victims = [r for r in self.running if r is not req and r not in plan.decodes]
                if not victims:
                    break
                self._preempt(victims[-1], plan)
            if not self.blocks.can_reserve(req.req_id, need):
                if len(self.running) == 1 or all(r is req or r in plan.decodes for r in self.running):
                    if not plan.decodes:
                        plan.failed.append((req, f"KV cache too small: request needs {need} token slots, "
                                                 f"the pool has {self.blocks.num_pages * self.blocks.page_size}; "
                                                 f"raise engine.num_kv_blocks or lower max_tokens"))
                continue
            self.blocks.reserve(req.req_id, need)
            plan.decodes.append(req)
            budget -= self.decode_tokens
        self._schedule_prefills(plan, budget)
        return plan

    def schedule_prefills(self, budget: int, max_chunks: int | None = None) -> StepPlan:
        """Prefill work only: continue unfinished prefills, then admit waiting requests, under
        ``budget`` tokens and at most ``max_chunks`` chunks. Decoding requests are left alone: the
        device-resident path runs them itself (dspark.engine.Engine._graph_step) and has reserved
        their pages already."""
        plan = StepPlan()
        if budget > 0:
            self._schedule_prefills(plan, budget, max_chunks)
        return plan

    def _schedule_prefills(self, plan: StepPlan, budget: int, max_chunks: int | None = None) -> None:
        room = (lambda: True) if max_chunks is None else (lambda: len(plan.prefills) < max_chunks)  # noqa: E731
        # Unfinished prefills of running requests.
        self._prefilling = [r for r in self._prefilling if r.in_prefill]
        for req in self._prefilling:
            if budget <= 0 or not room():
                break
            chunk = self._reserve_chunk(req, budget)
            if chunk:
                plan.prefills.append(chunk)
                budget -= chunk.length
        # Admission of waiting requests.
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.in_prefill:
                if not room():
                    break
                chunk = self._reserve_chunk(req, budget)
                if chunk is None:
                    if not self.running:
                        plan.failed.append((self.waiting.popleft(), "KV cache too small for this prompt: raise "
                                                                    "engine.num_kv_blocks or shorten the prompt"))
                        continue
                    break
                plan.prefills.append(chunk)
                budget -= chunk.length
            else:
                plan.admitted_ready.append(req)
            self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            if req.in_prefill:
                self._prefilling.append(req)

    def _reserve_chunk(self, req: Request, budget: int) -> PrefillChunk | None:
        length = min(req.prefill_target - req.num_computed, budget)
        end = req.num_computed + length
        if not self.blocks.can_reserve(req.req_id, end):
            # Take what fits in the pages this request already has plus the free ones.
            room = self.blocks.capacity(req.req_id) + self.blocks.num_free * self.blocks.page_size - req.num_computed
            length = min(length, room)
            if length <= 0:
                return None
            end = req.num_computed + length
        self.blocks.reserve(req.req_id, end)
        return PrefillChunk(req, req.num_computed, length)
