"""Verify-window allocation: hand a budget of n (request, position) cells to requests by survival rank.

Specification (``allocate_windows_reference``): the n cells with the largest prefix
survival across the whole batch are verified. Ties are broken by an order that does not
depend on values: position ascending, then request ascending. Each request verifies the
number of its selected cells, clamped to [min_verify_len, block]; inactive rows get 0
and their cells neither count nor consume budget.

Because survival is a cumulative product (non-increasing along positions) and ties go
to the earlier position, a request's selected cells always form a prefix, and the rank
of cell (r, k) depends only on r's own survivals up to k and on other requests: this is
what keeps "top-n by fresh survival" non-anticipating (the admission of draft k never
reads the drafted token x_k). The torch reference gets the tie order from a STABLE sort
over cells laid out position-major, never from float coincidences.

Both implementations are sync-free: ``budget`` may be a 0-d device tensor (sized on the
host from lagged confidence, or by a device-side search) and nothing calls ``.item()``,
so they can run inside a captured CUDA graph. Each Triton program takes a few requests
(64 cells) and ranks each of its cells against all B*G cells in blocked loops
(O((B*G)^2) compares, trivial for B*G <= 2048).
"""

from __future__ import annotations

import torch

try:  # Triton is optional at import time: the torch reference is the specification.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only on machines without triton
    triton = None
    tl = None

IMPLS = ("torch", "triton")
_CELLS_PER_PROGRAM = 64  # cells ranked per program: BLOCK_R requests x BLOCK_G positions


def _check_args(survival: torch.Tensor, min_verify_len: int, block: int, active: torch.Tensor | None) -> None:
    if survival.dim() != 2:
        raise ValueError(f"survival must be [B, G], got shape {tuple(survival.shape)}")
    if not survival.is_floating_point():
        raise ValueError(f"survival must be a floating tensor, got dtype {survival.dtype}")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if not 0 <= min_verify_len <= block:
        raise ValueError(f"min_verify_len must be in [0, block={block}], got {min_verify_len}")
    if active is not None:
        if active.dtype != torch.bool or active.shape != (survival.shape[0],):
            raise ValueError(f"active must be bool[{survival.shape[0]}], got {active.dtype} {tuple(active.shape)}")
        if active.device != survival.device:
            raise ValueError(f"active is on {active.device} but survival on {survival.device}; move it to the same device")


def _budget_tensor(budget: int | torch.Tensor, device: torch.device) -> torch.Tensor:
    if isinstance(budget, torch.Tensor):
        if budget.dim() != 0:
            raise ValueError(f"budget tensor must be 0-d, got shape {tuple(budget.shape)}")
        if budget.dtype.is_floating_point or budget.dtype == torch.bool:
            raise ValueError(f"budget tensor must be an integer count of cells, got dtype {budget.dtype}")
        return budget.to(device=device, dtype=torch.int64)
    if int(budget) != budget or budget < 0:
        raise ValueError(f"budget must be a non-negative integer count of cells, got {budget!r}")
    return torch.tensor(int(budget), dtype=torch.int64, device=device)


def allocate_windows_reference(*, survival: torch.Tensor, budget: int | torch.Tensor, min_verify_len: int, block: int,
                               active: torch.Tensor | None = None) -> torch.Tensor:
    """Windows int32[B]: per request, the count of its cells among the global top-``budget``,
    clamped to [min_verify_len, block]; inactive rows 0. A negative budget tensor acts as 0."""
    _check_args(survival, min_verify_len, block, active)
    B, G = survival.shape
    dev = survival.device
    if B == 0:
        return torch.zeros(0, dtype=torch.int32, device=dev)
    n = _budget_tensor(budget, dev)
    if active is None:
        active = torch.ones(B, dtype=torch.bool, device=dev)
    # Inactive cells sort below every real cell (survival >= 0 > -inf) and are never counted.
    key = torch.where(active[:, None], survival, torch.full_like(survival, float("-inf")))
    # Position-major layout: flat index g * B + r IS the tie order, and a stable sort keeps it among equals.
    flat = key.t().reshape(-1)
    order = torch.sort(flat, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank[order] = torch.arange(B * G, device=dev)
    selected = (rank < n).reshape(G, B).t() & active[:, None]  # [B, G]
    counts = selected.sum(dim=1)
    windows = counts.clamp(min=min_verify_len, max=block)
    return torch.where(active, windows, torch.zeros_like(windows)).to(torch.int32)


if triton is not None:

    @triton.jit
    def _allocate_windows_kernel(surv_ptr, stride_b, stride_g, budget_ptr, budget_value, active_ptr, out_ptr,
                                 B, G, min_len, block,
                                 BUDGET_IS_TENSOR: tl.constexpr, HAS_ACTIVE: tl.constexpr,
                                 BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_J: tl.constexpr):
        # This program ranks the cells of BLOCK_R requests against every cell of the batch.
        idx = tl.arange(0, BLOCK_R * BLOCK_G)
        r_i = tl.program_id(0) * BLOCK_R + idx // BLOCK_G
        g_i = idx % BLOCK_G
        valid_i = (r_i < B) & (g_i < G)
        s_i = tl.load(surv_ptr + r_i * stride_b + g_i * stride_g, mask=valid_i, other=0.0)
        order_i = g_i * B + r_i  # tie order: position ascending, then request ascending
        rank = tl.zeros([BLOCK_R * BLOCK_G], dtype=tl.int64)
        n_cells = B * G
        for start in range(0, n_cells, BLOCK_J):
            j = start + tl.arange(0, BLOCK_J)
            valid_j = j < n_cells
            r_j = j // G
            g_j = j % G
            s_j = tl.load(surv_ptr + r_j * stride_b + g_j * stride_g, mask=valid_j, other=0.0)
            if HAS_ACTIVE:
                act_j = tl.load(active_ptr + r_j, mask=valid_j, other=0).to(tl.int1)
                valid_j = valid_j & act_j
            order_j = g_j * B + r_j
            before = (s_j[None, :] > s_i[:, None]) | ((s_j[None, :] == s_i[:, None]) & (order_j[None, :] < order_i[:, None]))
            before = before & valid_j[None, :]
            rank += tl.sum(before.to(tl.int64), axis=1)
        n = tl.zeros([BLOCK_R * BLOCK_G], dtype=tl.int64)
        if BUDGET_IS_TENSOR:
            n += tl.load(budget_ptr).to(tl.int64)
        else:
            n += budget_value
        selected = ((rank < n) & valid_i).to(tl.int32)
        count = tl.sum(tl.reshape(selected, [BLOCK_R, BLOCK_G]), axis=1)  # [BLOCK_R]
        count = tl.minimum(tl.maximum(count, min_len), block)
        r_out = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        valid_r = r_out < B
        if HAS_ACTIVE:
            act_r = tl.load(active_ptr + r_out, mask=valid_r, other=0).to(tl.int1)
            count = tl.where(act_r, count, 0)
        tl.store(out_ptr + r_out, count.to(tl.int32), mask=valid_r)


def allocate_windows_triton(*, survival: torch.Tensor, budget: int | torch.Tensor, min_verify_len: int, block: int,
                            active: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton version of ``allocate_windows_reference`` (same keyword signature, plus ``out``)."""
    if triton is None:
        raise RuntimeError("allocate_windows_triton needs the triton package; install it or use impl='torch'")
    _check_args(survival, min_verify_len, block, active)
    B, G = survival.shape
    dev = survival.device
    if out is None:
        out = torch.empty(B, dtype=torch.int32, device=dev)
    elif out.dtype != torch.int32 or out.shape != (B,) or out.device != dev:
        raise ValueError(f"out must be int32[{B}] on {dev}, got {out.dtype} {tuple(out.shape)} on {out.device}")
    if B == 0:
        return out
    if isinstance(budget, torch.Tensor):
        budget_t = _budget_tensor(budget, dev)
        budget_value, is_tensor = 0, True
    else:
        _budget_tensor(budget, torch.device("cpu"))  # validation only
        budget_t, budget_value, is_tensor = out, int(min(budget, 2**62)), False  # pointer unused
    active_arg = active if active is not None else out  # pointer unused when HAS_ACTIVE is False
    block_g = max(1, triton.next_power_of_2(G))
    block_r = max(1, _CELLS_PER_PROGRAM // block_g)
    _allocate_windows_kernel[(triton.cdiv(B, block_r),)](
        survival, survival.stride(0), survival.stride(1), budget_t, budget_value, active_arg, out,
        B, G, min_verify_len, block,
        BUDGET_IS_TENSOR=is_tensor, HAS_ACTIVE=active is not None, BLOCK_R=block_r, BLOCK_G=block_g, BLOCK_J=128,
    )
    return out


def allocate_windows(*, survival: torch.Tensor, budget: int | torch.Tensor, min_verify_len: int, block: int,
                     active: torch.Tensor | None = None, impl: str = "torch") -> torch.Tensor:
    """Dispatch to the torch reference or the Triton kernel (``impl`` comes from the engine config)."""
    if impl == "torch":
        return allocate_windows_reference(survival=survival, budget=budget, min_verify_len=min_verify_len,
                                          block=block, active=active)
    if impl == "triton":
        return allocate_windows_triton(survival=survival, budget=budget, min_verify_len=min_verify_len,
                                       block=block, active=active)
    raise ValueError(f"impl must be one of {list(IMPLS)}, got {impl!r}")


__all__ = ["IMPLS", "allocate_windows_reference", "allocate_windows_triton", "allocate_windows"]
