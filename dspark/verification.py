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
    """Accepted drafts and the target's next token per request of an eager step. ``windows[i]`` drafts
    of request i are tested (the rest are never read); pass ``uniforms`` to replay the same random draws.
    The rules are :func:`accept_greedy` and :func:`accept_sampled`, the device-resident steps' own."""
    B, G = len(decodes), block_size
    dev = verify_logits.device
    win = torch.tensor(windows, dtype=torch.int64, device=dev)
    if rows.all_greedy:
        drafts = draft_tokens if G else torch.zeros((B, 0), dtype=torch.int64, device=dev)
        k, nxt = accept_greedy(drafts, torch.argmax(verify_logits, dim=-1), win)
    else:
        uni = uniforms if uniforms is not None else draw_uniforms(decodes, G, dev)  # [B, G+1]
        k, nxt = accept_sampled(verify_logits, rows, draft_tokens, draft_probs, win, uni[:, :G], uni[:, G], impl)
    return Verdict(num_accepted=k.tolist(), next_tokens=nxt.tolist())


def accept_sampled(verify_logits: torch.Tensor, rows: RowSampling, drafts: torch.Tensor | None,
                   draft_probs: torch.Tensor | None, windows: torch.Tensor, accept_uniforms: torch.Tensor,
                   sample_uniforms: torch.Tensor, impl: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """The lossless acceptance rule of both step paths for a batch with sampled rows (greedy rows in it
    keep the argmax rule): the target's logits [R, G+1, V] processed like the drafter's (temperature,
    top-k, top-p), then kernels/acceptance.py (rejection sampling; ``impl`` "torch" or "triton"), or a
    plain draw when G == 0. Returns (accepted int64 [R], next int64 [R]). Capture-safe."""
    from dspark.sampling import sample_inverse_cdf
    from kernels.acceptance import accept

    R, M, V = verify_logits.shape
    G = M - 1
    target_probs = processed_probs(verify_logits.reshape(R * M, V), rows.repeat(M)).view(R, M, V)
    greedy = rows.greedy.to(verify_logits.device)
    if not G:  # target-only: the target's own token is the whole step
        drawn = sample_inverse_cdf(target_probs[:, 0], sample_uniforms)
        return (torch.zeros(R, dtype=torch.int64, device=verify_logits.device),
                torch.where(greedy, torch.argmax(verify_logits[:, 0], dim=-1), drawn))
    res = accept(draft_tokens=drafts, windows=windows.to(torch.int32), target_probs=target_probs,
                 draft_probs=draft_probs, greedy=greedy, accept_uniforms=accept_uniforms,
                 sample_uniforms=sample_uniforms, impl=impl)
    return res.num_accepted.long(), res.next_token.long()


def accept_greedy(drafts: torch.Tensor, target_tokens: torch.Tensor, windows: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy acceptance rule of both step paths: drafts [R, G] against the target's argmax tokens
    [R, G+1] (row r's token after its anchor and each draft), the first ``windows[r]`` drafts tested.
    Returns (accepted int64 [R]: the longest prefix of tested drafts equal to the target's tokens, next
    int64 [R]: the target's token after them). Capture-safe: no host read."""
    R, G = drafts.shape[0], drafts.shape[1]
    if G:
        tested = torch.arange(G, device=drafts.device)[None, :] < windows.to(torch.int64)[:, None]
        k = ((drafts == target_tokens[:, :G]) & tested).to(torch.int64).cumprod(dim=1).sum(dim=1)
    else:
        k = torch.zeros(R, dtype=torch.int64, device=target_tokens.device)
    return k, target_tokens.gather(1, k[:, None]).squeeze(1)
