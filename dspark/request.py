"""A request's state inside the engine and what it returns to the caller."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import numpy as np

from dspark.config import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


def _steps_above(values: np.ndarray, block: int) -> list[int]:
    """[#(values > p) for p in 0..block-1]."""
    if not block:
        return []
    counts = np.bincount(np.clip(values, 0, block), minlength=block + 1)  # counts[v]: steps with value v
    above = counts[::-1].cumsum()[::-1]  # above[v]: steps with value >= v
    return [int(x) for x in above[1: block + 1]]


@dataclass(eq=False)  # a request is itself: list membership and removal by identity, not by comparing every field
class Request:
    req_id: int
    prompt_ids: list[int]
    params: SamplingParams
    block_size: int  # drafted positions per step (0 in target-only mode)
    user_id: str | None = None
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    num_computed: int = 0  # positions 0..num_computed-1 are in the target (and drafter context) cache
    finish_reason: str | None = None
    error: str | None = None
    text: str = ""
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # one timestamp per step that emitted tokens
    chunk_sizes: list[int] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)  # tokens committed per decode step, bonus included
    verify_lens: list[int] = field(default_factory=list)  # verified drafts per decode step
    num_preemptions: int = 0
    seed: int = 0  # keys the request's counter-based uniforms (dspark.uniforms)

    def __post_init__(self) -> None:
        seed = self.params.seed if self.params.seed is not None else self.req_id
        self.seed = int(seed) & 0x7FFF_FFFF_FFFF_FFFF

    @property
    def pos_reached(self) -> list[int]:
        """Per draft position p (0-based): steps whose verification reached it (p < window and drafts
        0..p-1 accepted). Derived from the per-step record, so the commit loop does no per-position work."""
        reach = np.minimum(np.asarray(self.accept_lengths, dtype=np.int64), np.asarray(self.verify_lens, dtype=np.int64))
        return _steps_above(reach, self.block_size)

    @property
    def pos_accepted(self) -> list[int]:
        """Per draft position p (0-based): steps that accepted it."""
        return _steps_above(np.asarray(self.accept_lengths, dtype=np.int64) - 1, self.block_size)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefill_target(self) -> int:
        """Positions the cache must hold before decoding: every committed token but the anchor."""
        return self.num_tokens - 1

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prefill_target

    @property
    def anchor(self) -> int:
        return self.all_ids[-1]

    @property
    def anchor_position(self) -> int:
        return self.num_tokens - 1


@dataclass
class RequestOutput:
    req_id: int
    user_id: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    error: str | None
    num_steps: int
    accept_lengths: list[int]
    verify_lens: list[int]
    pos_accepted: list[int]
    pos_reached: list[int]
    arrival_time: float
    first_token_time: float | None
    finish_time: float | None
    chunk_times: list[float]
    chunk_sizes: list[int]
    num_preemptions: int

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else float("nan")

    def to_dict(self) -> dict:
        return {
            "id": self.user_id if self.user_id is not None else self.req_id,
            "text": self.text,
            "prompt_token_ids": self.prompt_token_ids,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "error": self.error,
            "num_steps": self.num_steps,
            "accept_lengths": self.accept_lengths,
            "mean_accept_length": self.mean_accept_length if self.accept_lengths else None,
            "verify_lens": self.verify_lens,
            "pos_accepted": self.pos_accepted,
            "pos_reached": self.pos_reached,
            "num_preemptions": self.num_preemptions,
            "arrival_time": self.arrival_time,
            "first_token_time": self.first_token_time,
            "finish_time": self.finish_time,
        }

    @classmethod
    def from_request(cls, r: Request) -> "RequestOutput":
        return cls(req_id=r.req_id, user_id=r.user_id, prompt_token_ids=list(r.prompt_ids),
                   token_ids=list(r.output_ids), text=r.text, finish_reason=r.finish_reason, error=r.error,
                   num_steps=len(r.accept_lengths), accept_lengths=list(r.accept_lengths),
                   verify_lens=list(r.verify_lens), pos_accepted=list(r.pos_accepted),
                   pos_reached=list(r.pos_reached), arrival_time=r.arrival_time,
                   first_token_time=r.first_token_time, finish_time=r.finish_time,
                   chunk_times=list(r.chunk_times), chunk_sizes=list(r.chunk_sizes),
                   num_preemptions=r.num_preemptions)
