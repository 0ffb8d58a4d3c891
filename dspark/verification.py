"""Verification of drafted tokens against the target: the acceptance rules of the step pipeline.

Greedy: the longest prefix of tested drafts equal to the target's argmax. Sampled: rejection
sampling with residual resampling (:mod:`kernels.acceptance`, a reference and a Triton kernel), with
counter-based uniforms keyed by (request seed, anchor position) (:mod:`dspark.uniforms`), so a
request's samples do not depend on what else is in the batch, nor on the device.
"""

from __future__ import annotations

import torch

from dspark.sampling import RowSampling, processed_probs


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
