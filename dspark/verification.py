"""Verification of drafted tokens against the target: inputs for the acceptance rule.

The rule itself (greedy exact match; rejection sampling with residual resampling) lives
in :mod:`kernels.acceptance` as a reference and a Triton kernel. This module turns the
target's verify logits and the drafter's distributions into that rule's inputs, with
counter-based uniforms keyed by (request seed, anchor position) (:mod:`dspark.uniforms`), so
a request's samples do not depend on what else is in the batch, nor on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.request import Request
from dspark.sampling import RowSampling, processed_probs


@dataclass
class Verdict:
    num_accepted: list[int]
    next_tokens: list[int]


def step_uniforms_for(decodes: list[Request], block_size: int, device: torch.device | str) -> torch.Tensor:
    """[B, 2G+1] uniforms of this step: G draft slots, G acceptance tests, one resample."""
    from dspark.uniforms import step_uniforms

    seeds = torch.tensor([r.seed for r in decodes], dtype=torch.int64)
    anchors = torch.tensor([r.anchor_position for r in decodes], dtype=torch.int64)
    return step_uniforms(seeds, anchors, block_size).to(device)


def draw_uniforms(decodes: list[Request], block_size: int, device: torch.device | str) -> torch.Tensor:
    """[B, G+1] uniforms of this step's verification: G acceptance tests and one resample."""
    return step_uniforms_for(decodes, block_size, device)[:, block_size:]


def verify(*, decodes: list[Request], rows: RowSampling, verify_logits: torch.Tensor, draft_tokens: torch.Tensor | None,
           draft_probs: torch.Tensor | None, windows: list[int], block_size: int, impl: str = "torch",
           uniforms: torch.Tensor | None = None) -> Verdict:
    """Accepted drafts and the target's next token per request. ``windows[i]`` drafts of request i
    are tested (the rest are never read); pass ``uniforms`` to replay the same random draws."""
    from kernels.acceptance import accept

    B = len(decodes)
    G = block_size
    V = verify_logits.shape[-1]
    dev = verify_logits.device
    target_probs = processed_probs(verify_logits.view(B * (G + 1), V), rows.repeat(G + 1)).view(B, G + 1, V)
    uni = uniforms if uniforms is not None else draw_uniforms(decodes, G, dev)  # [B, G+1]
    if G == 0:  # target-only: nothing to verify, the target's own token is the whole step
        from dspark.sampling import sample_inverse_cdf

        probs = target_probs[:, 0]
        tokens = torch.where(rows.greedy.to(dev), torch.argmax(verify_logits[:, 0], dim=-1),
                             sample_inverse_cdf(probs, uni[:, 0]))
        return Verdict(num_accepted=[0] * B, next_tokens=tokens.tolist())
    res = accept(
        draft_tokens=draft_tokens,
        windows=torch.tensor(windows, dtype=torch.int32, device=dev),
        target_probs=target_probs,
        draft_probs=None if rows.all_greedy else draft_probs,
        greedy=rows.greedy.to(dev),
        accept_uniforms=uni[:, :G],
        sample_uniforms=uni[:, G],
        impl=impl,
    )
    return Verdict(num_accepted=res.num_accepted.tolist(), next_tokens=res.next_token.tolist())
