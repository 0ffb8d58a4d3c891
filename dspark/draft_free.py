"""Draft-free steps: a speculative engine decodes a step target-only when drafting measured slower (engine.draft_free_steps).

Drafting pays when the tokens it adds outweigh its cost: the drafter's forward and the verified drafts. At a
deep batch with low acceptance it does not (on the H200 at concurrency 256 on agentic prompts, DSpark
verifying every drafted block ran slower than target-only). A draft-free step runs only the verify stage with
no drafts: every row commits the target's next token, as a target-only engine would, and the drafter's
context is still written, so the next drafting step has it.

:class:`DraftFreeChoice` decides per step from what the engine measured, per batch bucket (the device's
step shape): the output rates of drafting and draft-free steps, compared on adjacent steps
(:class:`dspark.measured_choice.MeasuredChoice`'s rule: the two kinds in turn at first, then the one the
comparisons favour, with a step of the other kind every ``explore_every``). The choice reads only past steps,
never the drafts it would make, so sampled requests keep the target's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

from dspark.measured_choice import MeasuredChoice


@dataclass
class DraftFreeChoice(MeasuredChoice):
    """Per batch bucket: draft this step, or decode it target-only (see the module docstring); the rule is
    :class:`dspark.measured_choice.MeasuredChoice`'s, with drafting as the usual kind."""

    def draft_free(self, bucket: int) -> bool:
        """True: run this step of ``bucket`` rows without drafting."""
        return self.alternative(bucket)

    def update(self, bucket: int, *, draft_free: bool, tokens: int, step_ms: float) -> None:
        """Count a committed step of ``bucket`` rows: its output tokens and its measured time."""
        self.record(bucket, alternative=draft_free, tokens=tokens, step_ms=step_ms)

    def summary(self) -> dict[str, float]:
        """Per bucket: the rates (tokens/ms) and how many steps of each kind were counted."""
        return self.rate_summary("draft_free", "draft", "free")
