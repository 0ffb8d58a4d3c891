"""Counter-based uniforms: the random numbers of a request as a pure function of where they are used.

Every random number a request consumes is ``u(seed, anchor_position, index)``: the request's
seed, the position of the anchor of the step that uses it (strictly increasing from step to
step, since each step commits at least one token) and an index inside the step
(draft slot k -> k, acceptance test k -> G + k, the final resample -> 2G). Nothing is
drawn from a stateful generator, so

- the numbers are the same on the CPU and the GPU, eagerly and inside a captured CUDA graph
  (plain integer tensor ops, no host sync, no generator state to advance);
- a request's numbers do not depend on the batch it runs in, nor on how many numbers the
  previous steps consumed;
- every step reads numbers no earlier step has read (its anchor position is new), so the
  uniforms of a step are independent of everything that decided the committed prefix and
  of the verify windows planned from earlier steps: rejection sampling stays lossless.

The hash is SplitMix64's finaliser over a mixed 64-bit key; the top 24 bits give a float32
in [0, 1).
"""

from __future__ import annotations

import torch

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
_M1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_M2 = -7723592293110705685  # 0x94D049BB133111EB
_POSITION_MUL = 0x2545F4914F6CDD1D  # odd constant spreading positions over the key space


def _logical_shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x >>> bits on int64 (torch's >> is arithmetic, so mask the sign extension away)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _logical_shift_right(z, 30)) * _M1
    z = (z ^ _logical_shift_right(z, 27)) * _M2
    return z ^ _logical_shift_right(z, 31)


def counter_uniforms(seeds: torch.Tensor, anchor_positions: torch.Tensor, count: int) -> torch.Tensor:
    """float32 [B, count] in [0, 1): ``u(seed_b, anchor_b, i)`` for i = 0..count-1.

    seeds, anchor_positions: int64 [B] on any device (the result lives there too).
    """
    if seeds.shape != anchor_positions.shape or seeds.dim() != 1:
        raise ValueError(f"seeds {tuple(seeds.shape)} and anchor_positions {tuple(anchor_positions.shape)} must both "
                         f"be [B]")
    idx = torch.arange(count, device=seeds.device, dtype=torch.int64)
    key = _mix64(seeds.long() * _GOLDEN + anchor_positions.long() * _POSITION_MUL)  # [B]
    z = _mix64(key[:, None] + (idx[None, :] + 1) * _GOLDEN)
    return _logical_shift_right(z, 40).to(torch.float32) * (1.0 / (1 << 24))


def step_uniforms(seeds: torch.Tensor, anchor_positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """float32 [B, 2G+1] for one step: draft slots 0..G-1, acceptance tests G..2G-1, resample 2G."""
    return counter_uniforms(seeds, anchor_positions, 2 * block_size + 1)


__all__ = ["counter_uniforms", "step_uniforms"]
