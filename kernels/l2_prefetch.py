"""Pull a decoder layer's weights into L2 while the layer before it runs (decode-sized steps).

At batch 1 every GEMV of a decode step reads its weight from HBM, and the H200 census showed each
one near a latency floor that an L2-resident weight lowers by about a microsecond (o_proj 3.76 ->
2.77 us, down_proj 5.24 -> 3.73 us, the `gemv-split` results folder). A layer's weights
(about 7 MB for SmolLM2) fit the 50 MB L2 many times over. So, on a side stream forked from the
step's stream at the start of layer i, one small kernel reads layer i+1's weight matrices with an
evict-last hint: by the time layer i+1 runs, its GEMVs hit L2. The side stream only reads weights
(nothing in a step writes them), and joins the step's stream at the end of the stack, so a CUDA
graph captures it as a parallel branch.

``l2_prefetch_reference`` is the specification of the kernel's only output: per program, the sum of
the elements it read (float32), which keeps the loads from being compiled away; the engine throws it
away. The engine runs it with ``engine.kernels.l2_prefetch=true`` (experimental, off by default;
``engine.kernels.l2_prefetch_programs`` sets the programs per tensor), on CUDA only
(``prefetch_runs``: under the CPU interpreter the kernel runs in tests, never in the engine).
"""

from __future__ import annotations

import functools
import os

import torch

from kernels.switches import interpreted

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

BLOCK = 4096  # elements per load
UNROLL = 4  # loads in flight per program and iteration: a layer's weights must arrive within its predecessor
MAX_TENSORS = 4
PROGRAMS_PER_TENSOR = 16
CHUNK = BLOCK * UNROLL  # elements a program reads per iteration


def prefetch_runs(device: torch.device) -> bool:
    """Whether an engine asking for the prefetch runs it on ``device``: CUDA, not interpreted."""
    return device.type == "cuda" and not interpreted()


if triton is not None:

    @triton.jit
    def _l2_prefetch_kernel(p0, p1, p2, p3, n0, n1, n2, n3, sums_ptr,
                            NT: tl.constexpr, PROGS: tl.constexpr, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
        # Program (t, j) reads chunks j, j + PROGS, ... (BLOCK * UNROLL elements each, UNROLL loads in
        # flight) of tensor t (t < NT), keeping them in L2.
        t = tl.program_id(0)
        j = tl.program_id(1)
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        CH: tl.constexpr = BLOCK * UNROLL
        for ti in tl.static_range(NT):
            if t == ti:
                ptr = p0 if ti == 0 else (p1 if ti == 1 else (p2 if ti == 2 else p3))
                n = n0 if ti == 0 else (n1 if ti == 1 else (n2 if ti == 2 else n3))
                for start in range(j * CH, n, PROGS * CH):
                    for u in tl.static_range(UNROLL):
                        idx = start + u * BLOCK + offs
                        acc += tl.load(ptr + idx, mask=idx < n, other=0.0,
                                       eviction_policy="evict_last").to(tl.float32)
        tl.store(sums_ptr + t * PROGS + j, tl.sum(acc, axis=0))


def l2_prefetch_reference(tensors: list[torch.Tensor], programs: int = PROGRAMS_PER_TENSOR,
                          block: int = CHUNK) -> torch.Tensor:
    """[len(tensors), programs] float32: the sum of the elements program (t, j) reads (chunks j,
    j + programs, ... of ``block`` elements of tensor t, flattened)."""
    out = torch.zeros((len(tensors), programs), dtype=torch.float32)
    for t, x in enumerate(tensors):
        flat = x.detach().reshape(-1).float().cpu()
        for j in range(programs):
            for start in range(j * block, flat.numel(), programs * block):
                out[t, j] += flat[start: start + block].sum()
    return out


@functools.lru_cache(maxsize=None)
def _sums_buffer(device: torch.device, programs: int) -> torch.Tensor:
    # Persistent per device (a graph capture must not allocate): every launch overwrites it.
    return torch.empty((MAX_TENSORS, programs), dtype=torch.float32, device=device)


def l2_prefetch(tensors: list[torch.Tensor], out: torch.Tensor | None = None,
                programs: int = PROGRAMS_PER_TENSOR) -> torch.Tensor:
    """Read ``tensors`` (1 to 4 contiguous tensors on one device) with an evict-last hint; returns the
    per-program sums (into ``out`` or a persistent per-device buffer). ``programs`` per tensor: 1..64
    (engine.kernels.l2_prefetch_programs). Launch it on a side stream."""
    if not 1 <= len(tensors) <= MAX_TENSORS:
        raise ValueError(f"l2_prefetch takes 1 to {MAX_TENSORS} tensors, got {len(tensors)}")
    dev = tensors[0].device
    for x in tensors:
        if x.device != dev or not x.is_contiguous():
            raise ValueError(f"l2_prefetch needs contiguous tensors on one device; got {x.device}, "
                             f"contiguous={x.is_contiguous()}")
    if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"l2_prefetch is a Triton kernel: it needs CUDA tensors (got {dev}), or TRITON_INTERPRET=1")
    if isinstance(programs, bool) or not isinstance(programs, int) or not 1 <= programs <= 64:
        raise ValueError(f"l2_prefetch programs={programs!r}: use an integer from 1 to 64")
    progs = programs
    if out is None:
        out = _sums_buffer(dev, progs) if dev.type == "cuda" else torch.empty((MAX_TENSORS, progs),
                                                                              dtype=torch.float32, device=dev)
    if out.shape != (MAX_TENSORS, progs) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous float32 [{MAX_TENSORS}, {progs}], got {tuple(out.shape)} {out.dtype}")
    ptrs = list(tensors) + [tensors[0]] * (MAX_TENSORS - len(tensors))
    sizes = [x.numel() for x in tensors] + [0] * (MAX_TENSORS - len(tensors))
    _l2_prefetch_kernel[(len(tensors), progs)](
        *ptrs, *sizes, out, NT=len(tensors), PROGS=progs, BLOCK=BLOCK, UNROLL=UNROLL, num_warps=8)
    return out


@functools.lru_cache(maxsize=None)
def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream a device's prefetches run on (one per device, reused by every step and capture)."""
    return torch.cuda.Stream(device)


__all__ = ["PROGRAMS_PER_TENSOR", "l2_prefetch", "l2_prefetch_reference", "prefetch_runs", "side_stream"]
