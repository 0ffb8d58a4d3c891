"""Draft-free steps: a speculative engine decodes a step target-only when drafting measured slower (engine.draft_free_steps).

Drafting pays when the tokens it adds outweigh its cost: the drafter's forward and the verified drafts. At a
deep batch with low acceptance it does not (on the H200 at concurrency 256 on agentic prompts, DSpark
verifying every drafted block ran slower than target-only). A draft-free step runs only the verify stage with
no drafts: every row commits the target's next token, as a target-only engine would, and the drafter's
context is still written, so the next drafting step has it.

:class:`DraftFreeChoice` decides per step from what the engine measured, per batch bucket (the device's
step shape): an exponential average of the output tokens per millisecond of drafting steps and of draft-free
steps. It drafts until a bucket has ``min_steps`` drafting steps, then runs ``min_steps`` draft-free steps,
then takes the kind with the higher rate, and every ``explore_every`` steps of the bucket runs the other kind
once so that the averages follow the load. The choice reads only past steps, never the drafts it would make,
so sampled requests keep the target's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Rates:
    """Exponential averages of output tokens per ms, and step counts, of one batch bucket."""

    draft: float = 0.0
    free: float = 0.0
    n_draft: int = 0
    n_free: int = 0
    steps: int = 0  # decisions taken for this bucket


@dataclass
class DraftFreeChoice:
    """Per batch bucket: draft this step, or decode it target-only (see the module docstring)."""

    alpha: float = 0.05
    min_steps: int = 8
    explore_every: int = 200
    _buckets: dict[int, _Rates] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if self.min_steps < 1 or self.explore_every < 2:
            raise ValueError(f"min_steps must be >= 1 and explore_every >= 2, got {self.min_steps}, {self.explore_every}")

    def draft_free(self, bucket: int) -> bool:
        """True: run this step of ``bucket`` rows without drafting."""
        r = self._buckets.setdefault(bucket, _Rates())
        r.steps += 1
        if r.n_draft < self.min_steps:
            return False
        if r.n_free < self.min_steps:
            return True
        better_free = r.free > r.draft
        if r.steps % self.explore_every == 0:
            return not better_free  # one step of the other kind keeps its average current
        return better_free

    def update(self, bucket: int, *, draft_free: bool, tokens: int, step_ms: float) -> None:
        """Count a committed step of ``bucket`` rows: its output tokens and its measured time."""
        if step_ms <= 0.0:
            return
        r = self._buckets.setdefault(bucket, _Rates())
        rate = tokens / step_ms
        if draft_free:
            r.free = rate if r.n_free == 0 else (1 - self.alpha) * r.free + self.alpha * rate
            r.n_free += 1
        else:
            r.draft = rate if r.n_draft == 0 else (1 - self.alpha) * r.draft + self.alpha * rate
            r.n_draft += 1

    def summary(self) -> dict[str, float]:
        """Per bucket: the averages (tokens/ms) and how many steps of each kind they hold."""
        out: dict[str, float] = {}
        for b, r in sorted(self._buckets.items()):
            out.update({f"draft_free/b{b}/draft_tok_per_ms": round(r.draft, 4),
                        f"draft_free/b{b}/free_tok_per_ms": round(r.free, 4),
                        f"draft_free/b{b}/draft_steps": r.n_draft, f"draft_free/b{b}/free_steps": r.n_free})
        return out
