"""The acceptance rule of speculative decoding: how many drafts to keep and the next token.

For request b the target scored ``v_b`` drafts (its window, ``0 <= v_b <= G``):
``target_probs[b, k]`` is the target's (processed) distribution for the token that
follows ``k`` accepted drafts, so rows ``0..v_b`` are meaningful and rows past ``v_b``
are padding that is never read.

- Greedy rows accept draft k while it equals ``argmax(target_probs[b, k])`` (ties go to
  the lowest index); the next token is the argmax of the row after the last accepted one.
- Sampled rows accept draft ``d`` at position k iff ``u_k * q_k(d) < p_k(d)``, that is with
  probability ``min(1, p_k(d) / q_k(d))``, and stop at the first rejection. After a
  rejection at k the next token comes from ``normalize(max(p_k - q_k, 0))``; when all
  ``v_b`` drafts pass it is the bonus token sampled from ``p_{v_b}``. Accepting with
  ``min(1, p/q)`` and resampling the excess of p over q gives each emitted token exactly
  the target's distribution p (Leviathan et al. 2023), so sampling stays lossless.

Sampling is by inverse CDF from caller-provided uniforms, which makes the torch reference
and the Triton kernel agree token for token (up to float summation order at a CDF step).

Entry points (keyword-only, same signature): :func:`accept_reference` (the
specification, vectorised torch), :func:`accept_triton` (one program per request, the
vocabulary walked in tiles, no host reads: capture-safe) and :func:`accept` which picks
one by ``impl``.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl


class AcceptResult(NamedTuple):
    num_accepted: torch.Tensor  # int32 [B], in [0, windows[b]]
    next_token: torch.Tensor  # int64 [B], correction or bonus token


# --------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------

def sample_from_probs_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling of unnormalised rows. probs: [N, V] >= 0, u: [N] in [0, 1) -> int64 [N].

    Returns the first index i with ``probs[i] > 0`` and ``cumsum(probs)[i] > u * sum(probs)``
    (sums in fp64);
    if rounding leaves no such index, the last index with positive mass. Zero-mass tokens are
    therefore never returned.
    """
    if probs.dim() != 2 or u.shape != probs.shape[:1]:
        raise ValueError(f"probs must be [N, V] and u [N]; got {tuple(probs.shape)} and {tuple(u.shape)}")
    if probs.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=probs.device)
    probs = probs.float()
    if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
        raise ValueError("probs must be finite and non-negative")
    total = probs.sum(-1)
    if bool((total <= 0).any()):
        bad = torch.nonzero(total <= 0).flatten().tolist()
        raise ValueError(f"rows {bad} of probs have no mass to sample from")
    if bool(((u < 0) | (u >= 1)).any()):
        raise ValueError(f"uniforms must lie in [0, 1); got min {u.min().item()}, max {u.max().item()}")
    positive = probs > 0
    # The CDF is accumulated in fp64 so that the order of summation (sequential here, tiled
    # in the kernel) cannot move a sample across a boundary: over a 10^5-token vocabulary
    # fp32 rounding is comparable to the mass of a typical token.
    cdf = probs.double().cumsum(-1)
    hit = (cdf > (u.double() * cdf[:, -1])[:, None]) & positive
    idx = torch.arange(probs.shape[1], device=probs.device)
    first_hit = torch.where(hit, idx, probs.shape[1]).min(-1).values
    last_positive = torch.where(positive, idx, -1).max(-1).values
    return torch.where(first_hit < probs.shape[1], first_hit, last_positive).long()


def _check_shapes(draft_tokens, windows, target_probs, draft_probs, greedy, accept_uniforms,
                  sample_uniforms) -> tuple[int, int, int]:
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, G], got {tuple(draft_tokens.shape)}")
    B, G = draft_tokens.shape
    if target_probs.dim() != 3 or target_probs.shape[:2] != (B, G + 1):
        raise ValueError(f"target_probs must be [B, G+1, V] = [{B}, {G + 1}, V], got {tuple(target_probs.shape)}")
    V = target_probs.shape[2]
    if draft_probs is not None and tuple(draft_probs.shape) != (B, G, V):
        raise ValueError(f"draft_probs must be [B, G, V] = [{B}, {G}, {V}], got {tuple(draft_probs.shape)}")
    expected = {"windows": (windows, (B,), torch.int32), "greedy": (greedy, (B,), torch.bool),
                "accept_uniforms": (accept_uniforms, (B, G), torch.float32),
                "sample_uniforms": (sample_uniforms, (B,), torch.float32),
                "draft_tokens": (draft_tokens, (B, G), torch.int64),
                "target_probs": (target_probs, tuple(target_probs.shape), torch.float32)}
    if draft_probs is not None:
        expected["draft_probs"] = (draft_probs, (B, G, V), torch.float32)
    for name, (t, shape, dtype) in expected.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
        if t.dtype != dtype:
            raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
        if t.device != target_probs.device:
            raise ValueError(f"{name} is on {t.device}, target_probs on {target_probs.device}")
    if V == 0:
        raise ValueError("target_probs has an empty vocabulary")
    return B, G, V


def accept_reference(*, draft_tokens: torch.Tensor, windows: torch.Tensor, target_probs: torch.Tensor,
                     draft_probs: torch.Tensor | None, greedy: torch.Tensor, accept_uniforms: torch.Tensor,
                     sample_uniforms: torch.Tensor) -> AcceptResult:
    """Specification of the acceptance rule (see the module docstring).

    draft_tokens int64 [B, G]; windows int32 [B] (v_b in [0, G]); target_probs float32
    [B, G+1, V]; draft_probs float32 [B, G, V] or None (then every row must be greedy);
    greedy bool [B]; accept_uniforms float32 [B, G]; sample_uniforms float32 [B].
    Only target rows ``0..v_b``, draft rows ``0..v_b-1`` and draft tokens ``0..v_b-1`` are
    read (in the sense that values elsewhere, NaN included, cannot change the result).
    """
    B, G, V = _check_shapes(draft_tokens, windows, target_probs, draft_probs, greedy, accept_uniforms,
                            sample_uniforms)
    dev = target_probs.device
    if B == 0:
        return AcceptResult(torch.zeros(0, dtype=torch.int32, device=dev), torch.zeros(0, dtype=torch.int64, device=dev))
    if bool(((windows < 0) | (windows > G)).any()):
        raise ValueError(f"windows must lie in [0, {G}], got {windows.tolist()}")
    if draft_probs is None and not bool(greedy.all()):
        raise ValueError("draft_probs is None but some rows are sampled: "
                         f"greedy={greedy.tolist()}; sampled rows need the drafter's distribution")
    w = windows.long()
    in_window = torch.arange(G, device=dev)[None, :] < w[:, None]  # [B, G]
    bad_tokens = in_window & ((draft_tokens < 0) | (draft_tokens >= V))
    if bool(bad_tokens.any()):
        raise ValueError(f"draft tokens outside [0, {V}) inside the window at (row, pos) "
                         f"{torch.nonzero(bad_tokens).tolist()}")
    d = torch.where(in_window, draft_tokens, 0)

    # Per-position acceptance; positions outside the window are forced False so padding
    # values (NaN included) cannot leak in: torch.where selects, it does not mix.
    greedy_ok = d == target_probs[:, :G].argmax(-1)
    ok = greedy_ok
    if draft_probs is not None:
        p_d = target_probs[:, :G].gather(2, d[..., None]).squeeze(-1)
        q_d = draft_probs.gather(2, d[..., None]).squeeze(-1)
        ok = torch.where(greedy[:, None], greedy_ok, accept_uniforms * q_d < p_d)
    ok = ok & in_window
    num_accepted = ok.int().cumprod(1).sum(1)  # [B], stops at the first rejection

    rows = torch.arange(B, device=dev)
    p_next = target_probs[rows, num_accepted.long()]  # [B, V]: row k = n_acc <= v_b
    next_token = p_next.argmax(-1)
    sampled = ~greedy
    if bool(sampled.any()):
        idx = torch.nonzero(sampled).flatten()
        p_s = p_next[idx]
        n_s = num_accepted[idx].long()
        rejected = n_s < w[idx]
        # q row n_s is only meaningful (and only read) after a rejection, where n_s < v_b.
        q_s = draft_probs[idx, n_s.clamp(max=G - 1)] if G > 0 else torch.zeros_like(p_s)
        residual = torch.where(rejected[:, None], (p_s - q_s).clamp_min(0.0), p_s)
        # A rejection implies p(d) < q(d), so the residual max(p - q, 0) has mass
        # TV(p, q) > 0 in exact arithmetic; it can only vanish when p and q differ by
        # rounding, i.e. p == q to float precision, where the exact residual distribution is
        # the limit of normalize(max(p - q, 0)) and p itself is what lossless decoding asks
        # for (emitting d or a p-sample after accepting with p/q = 1 gives p). Sample p then.
        empty = residual.sum(-1) <= 0
        residual = torch.where(empty[:, None], p_s, residual)
        next_token[idx] = sample_from_probs_inverse_cdf(residual, sample_uniforms[idx])
    return AcceptResult(num_accepted.int(), next_token.long())


# --------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------

@triton.jit
def _row_argmax(row_ptr, V, BLOCK_V: tl.constexpr):
    """Index of the first maximum of row_ptr[0:V]."""
    offs = tl.arange(0, BLOCK_V)
    best_val = tl.full([], float("-inf"), dtype=tl.float32)
    best_idx = tl.full([], 0, dtype=tl.int32)
    for start in range(0, V, BLOCK_V):
        idx = start + offs
        x = tl.load(row_ptr + idx, mask=idx < V, other=float("-inf"))
        tile_max = tl.max(x, 0)
        tile_idx = tl.min(tl.where(x == tile_max, idx, V), 0)
        better = tile_max > best_val  # strict: an equal later tile keeps the earlier index
        best_idx = tl.where(better, tile_idx, best_idx)
        best_val = tl.where(better, tile_max, best_val)
    return best_idx


@triton.jit
def _residual_mass(p_row, q_row, use_q, V, BLOCK_V: tl.constexpr):
    offs = tl.arange(0, BLOCK_V)
    total = tl.zeros([], dtype=tl.float64)
    for start in range(0, V, BLOCK_V):
        idx = start + offs
        ok = idx < V
        p = tl.load(p_row + idx, mask=ok, other=0.0)
        q = tl.load(q_row + idx, mask=ok & ((idx * 0 + use_q) != 0), other=0.0)
        total += tl.sum(tl.maximum(p - q, 0.0).to(tl.float64), 0)
    return total


@triton.jit
def _sample_residual(p_row, q_row, use_q, u, V, BLOCK_V: tl.constexpr):
    """Inverse-CDF sample from max(p - q, 0) (or p when use_q, an int32 flag, is 0), falling back to p
    when the residual is empty; same rule as sample_from_probs_inverse_cdf (fp64 sums)."""
    total = _residual_mass(p_row, q_row, use_q, V, BLOCK_V)
    if total <= 0.0:
        use_q = use_q * 0
        total = _residual_mass(p_row, q_row, use_q, V, BLOCK_V)
    target = u.to(tl.float64) * total
    offs = tl.arange(0, BLOCK_V)
    carry = tl.zeros([], dtype=tl.float64)
    first_hit = tl.full([], 0, dtype=tl.int32) + V
    last_positive = tl.full([], -1, dtype=tl.int32)
    for start in range(0, V, BLOCK_V):
        idx = start + offs
        ok = idx < V
        p = tl.load(p_row + idx, mask=ok, other=0.0)
        q = tl.load(q_row + idx, mask=ok & ((idx * 0 + use_q) != 0), other=0.0)
        r = tl.maximum(p - q, 0.0).to(tl.float64)
        positive = (r > 0.0) & ok
        cdf = carry + tl.cumsum(r, 0)
        first_hit = tl.minimum(first_hit, tl.min(tl.where(positive & (cdf > target), idx, V), 0))
        last_positive = tl.maximum(last_positive, tl.max(tl.where(positive, idx, -1), 0))
        carry += tl.sum(r, 0)
    return tl.where(first_hit < V, first_hit, last_positive)


@triton.jit
def _accept_kernel(
    draft_ptr, windows_ptr, p_ptr, q_ptr, greedy_ptr, au_ptr, su_ptr, num_acc_ptr, next_ptr,
    V, stride_db, stride_pb, stride_pk, stride_qb, stride_qk, stride_ab,
    G: tl.constexpr, HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    window = tl.load(windows_ptr + b)
    is_greedy = tl.load(greedy_ptr + b) != 0
    p_req = p_ptr + b * stride_pb
    q_req = q_ptr + b * stride_qb

    num_acc = tl.full([], 0, dtype=tl.int32)
    going = tl.full([], 1, dtype=tl.int32)
    for k in range(0, G):
        if (k < window) & (going != 0):
            d = tl.load(draft_ptr + b * stride_db + k)
            d_ok = (d >= 0) & (d < V)
            d_safe = tl.where(d_ok, d, 0)
            if is_greedy:
                ok = (_row_argmax(p_req + k * stride_pk, V, BLOCK_V).to(tl.int64) == d) & d_ok
            else:
                if HAS_Q:
                    p_d = tl.load(p_req + k * stride_pk + d_safe)
                    q_d = tl.load(q_req + k * stride_qk + d_safe)
                    u = tl.load(au_ptr + b * stride_ab + k)
                    ok = (u * q_d < p_d) & d_ok
                else:
                    ok = d_ok & False
            going = ok.to(tl.int32)
            num_acc += going

    row = p_req + num_acc.to(tl.int64) * stride_pk
    if is_greedy:
        token = _row_argmax(row, V, BLOCK_V).to(tl.int64)
    else:
        if HAS_Q:
            rejected = num_acc < window
            q_row = q_req + tl.minimum(num_acc, G - 1).to(tl.int64) * stride_qk
            token = _sample_residual(row, q_row, rejected.to(tl.int32), tl.load(su_ptr + b), V, BLOCK_V).to(tl.int64)
        else:
            # A sampled row without draft probabilities is a caller error the kernel cannot
            # raise without a host sync: flag it with an impossible token instead.
            num_acc = num_acc * 0
            token = tl.full([], -1, dtype=tl.int64)
    tl.store(num_acc_ptr + b, num_acc)
    tl.store(next_ptr + b, token)


def accept_triton(*, draft_tokens: torch.Tensor, windows: torch.Tensor, target_probs: torch.Tensor,
                  draft_probs: torch.Tensor | None, greedy: torch.Tensor, accept_uniforms: torch.Tensor,
                  sample_uniforms: torch.Tensor, block_v: int | None = None) -> AcceptResult:
    """Triton acceptance with the semantics of :func:`accept_reference`; never reads device
    values on the host, so it can be captured in a CUDA graph.

    Inputs are not range-checked (that would need a sync): windows outside [0, G] are
    undefined, an out-of-vocabulary draft token inside the window is rejected, and a sampled
    row when draft_probs is None returns num_accepted 0 and next_token -1.
    block_v: vocabulary tile (power of two); default min(1024, next_power_of_2(V)).
    """
    B, G, V = _check_shapes(draft_tokens, windows, target_probs, draft_probs, greedy, accept_uniforms,
                            sample_uniforms)
    dev = target_probs.device
    if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"accept_triton needs CUDA tensors (got {dev}); on CPU set TRITON_INTERPRET=1 "
                           "before importing triton")
    for name, t in (("draft_tokens", draft_tokens), ("target_probs", target_probs), ("draft_probs", draft_probs),
                    ("accept_uniforms", accept_uniforms)):
        if t is not None and t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} needs a unit stride on its last dim, got strides {t.stride()}")
    for name, t in (("windows", windows), ("greedy", greedy), ("sample_uniforms", sample_uniforms)):
        if t.shape[0] > 1 and t.stride(0) != 1:
            raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
    if block_v is None:
        block_v = min(1024, triton.next_power_of_2(V))
    elif block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two >= 16, got {block_v}")
    num_accepted = torch.empty(B, dtype=torch.int32, device=dev)
    next_token = torch.empty(B, dtype=torch.int64, device=dev)
    if B == 0:
        return AcceptResult(num_accepted, next_token)
    has_q = draft_probs is not None
    q = draft_probs if has_q else target_probs  # placeholder pointer, never dereferenced
    _accept_kernel[(B,)](
        draft_tokens, windows, target_probs, q, greedy.view(torch.uint8), accept_uniforms, sample_uniforms,
        num_accepted, next_token,
        V, draft_tokens.stride(0), target_probs.stride(0), target_probs.stride(1),
        q.stride(0), q.stride(1), accept_uniforms.stride(0),
        G=G, HAS_Q=has_q, BLOCK_V=block_v, num_warps=4,
    )
    return AcceptResult(num_accepted, next_token)


_IMPLS = {"torch": accept_reference, "triton": accept_triton}


def accept(*, draft_tokens: torch.Tensor, windows: torch.Tensor, target_probs: torch.Tensor,
           draft_probs: torch.Tensor | None, greedy: torch.Tensor, accept_uniforms: torch.Tensor,
           sample_uniforms: torch.Tensor, impl: str = "torch") -> AcceptResult:
    """Dispatch to :func:`accept_reference` (impl="torch") or :func:`accept_triton` (impl="triton")."""
    if impl not in _IMPLS:
        raise ValueError(f"acceptance impl {impl!r} unknown; allowed: {sorted(_IMPLS)}")
    return _IMPLS[impl](draft_tokens=draft_tokens, windows=windows, target_probs=target_probs,
                        draft_probs=draft_probs, greedy=greedy, accept_uniforms=accept_uniforms,
                        sample_uniforms=sample_uniforms)
