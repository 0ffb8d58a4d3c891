"""One draft slot's logits: the drafter's backbone logits plus its Markov head's bias, in fp32.

The DSpark drafter draws its block left to right. Slot k's logits are the backbone's logits for that slot
(one GEMM for every slot at once, kept in the LM head's dtype) plus the Markov head's bias from the token
drawn before it (a rank-r GEMM in the same dtype, times a per-row gate for the gated variant), both widened
to fp32 and added there (:meth:`dspark.models.drafter.DSparkDrafter.draft`).

:func:`draft_slot_logits_reference` is the specification: ``base.float() + bias.float()``, or
``base.float() + gate * bias.float()`` with a gate [M, 1] (fp32). In PyTorch that is three or four passes over
[M, V] (each widening copy, the product, the sum), which at 256 rows and SmolLM2's 49,152-token vocabulary
write and read about 100 MB each, seven times per draft. :func:`draft_slot_logits_triton` is the same
arithmetic in one pass: every program widens a tile of both inputs, multiplies by the row's gate when there is
one, adds, and writes the fp32 tile. The values are the reference's bit for bit (the same IEEE fp32 operations
on the same exactly widened operands, in the same order: the kernel is compiled without fused multiply-adds,
which would round the gated product and the sum once instead of twice).

``base`` may be a strided view (one slot of the [M, gamma, V] block logits); its last dim must be contiguous.
"""

from __future__ import annotations

import torch

from kernels.switches import interpreted

try:  # Triton is optional at import time: the torch reference is the specification.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only on machines without triton
    triton = None
    tl = None

BLOCK_V = 2048  # vocabulary entries per program


def draft_slot_logits_reference(base: torch.Tensor, bias: torch.Tensor,
                                gate: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 [M, V]: ``base.float() + bias.float()``, the bias first scaled by ``gate`` [M, 1] when given."""
    widened = bias.float()
    return base.float() + (widened if gate is None else gate * widened)


def _check(base: torch.Tensor, bias: torch.Tensor, gate: torch.Tensor | None) -> None:
    if base.dim() != 2 or bias.shape != base.shape:
        raise ValueError(f"base and bias must both be [M, V], got {tuple(base.shape)} and {tuple(bias.shape)}")
    if base.stride(1) != 1 or bias.stride(1) != 1:
        raise ValueError(f"base and bias need a contiguous last dim, got strides {base.stride()} and {bias.stride()}")
    if base.device != bias.device:
        raise ValueError(f"base is on {base.device}, bias on {bias.device}")
    if gate is not None and (gate.shape != (base.shape[0], 1) or gate.dtype != torch.float32
                             or gate.device != base.device):
        raise ValueError(f"gate must be float32 [{base.shape[0]}, 1] on {base.device}, got {gate.dtype} "
                         f"{tuple(gate.shape)} on {gate.device}")


def draft_slot_logits_triton(base: torch.Tensor, bias: torch.Tensor,
                             gate: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`draft_slot_logits_reference` in one pass (CUDA, or the CPU interpreter); capture-safe."""
    if triton is None:
        raise RuntimeError("draft_slot_logits_triton needs the triton package (engine.kernels.fused_draft_logits="
                           "false runs the PyTorch reference)")
    _check(base, bias, gate)
    M, V = base.shape
    out = torch.empty((M, V), dtype=torch.float32, device=base.device)
    if M == 0 or V == 0:
        return out
    grid = (M, triton.cdiv(V, BLOCK_V))
    _draft_slot_logits_kernel[grid](base, bias, gate if gate is not None else out, out, V,
                                    base.stride(0), bias.stride(0), out.stride(0),
                                    HAS_GATE=gate is not None, BLOCK=BLOCK_V, num_warps=4,
                                    **({} if interpreted() else {"enable_fp_fusion": False}))
    return out


if triton is not None:

    @triton.jit
    def _draft_slot_logits_kernel(base_ptr, bias_ptr, gate_ptr, out_ptr, V, stride_base, stride_bias, stride_out,
                                  HAS_GATE: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < V
        base = tl.load(base_ptr + row * stride_base + cols, mask=ok, other=0.0).to(tl.float32)
        bias = tl.load(bias_ptr + row * stride_bias + cols, mask=ok, other=0.0).to(tl.float32)
        if HAS_GATE:
            bias = tl.load(gate_ptr + row) * bias
        tl.store(out_ptr + row * stride_out + cols, base + bias, mask=ok)


def draft_slot_logits(base: torch.Tensor, bias: torch.Tensor, gate: torch.Tensor | None = None, *,
                      fused: bool = False) -> torch.Tensor:
    """The slot's fp32 logits: through the Triton kernel where ``fused`` (the caller's kernel settings decide,
    CUDA tensors only), else the reference. The two give the same bits."""
    if fused:
        return draft_slot_logits_triton(base, bias, gate)
    return draft_slot_logits_reference(base, bias, gate)
