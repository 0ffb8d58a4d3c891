"""Small-M (1..16 rows) linear layers as Triton GEMV-style kernels, with the RMSNorm (and the
residual add before it) fused into the prologue and SwiGLU's silu(gate) * up into the epilogue.

Specification (``norm_linear_reference``), rounding as the unfused path does:

    h = x + residual                     (fp32 sum rounded once to x's dtype; h = x without residual)
    n = rmsnorm_reference(x, norm_weight, eps, residual)[0]      (rounded to x's dtype)
    z = n @ weight.T + bias              (fp32 accumulation, one rounding to x's dtype)
    y = silu_mul_reference(z) if silu_mul else z    (z = [gate | up] halves, y is [M, N/2])

returning ``(y, h)``. ``linear_reference`` is ``z`` for ``n = x``. ``weight`` is [N, K] (Linear layout).

Kernel: grid over output columns in blocks of ``BLOCK_N`` (16 or 32); a program holds all rows in
a fixed ``SMALL_M_MAX``-row tile (rows >= M masked), takes 1/rms of each row in a first pass over K,
then streams its weight rows (gate and up rows with ``silu_mul``) in ``BLOCK_K`` (<= 256) chunks
into ``tl.dot``. With ``split_k`` > 1, that many programs share a tile's K chunks: each stores an
fp32 partial, and the last to arrive (a per-tile arrival counter, ``split_k_counters``) sums the
partials in split order and runs the epilogue, then resets its counter. Settings come from
``default_tiles`` or a device's tile table and depend on the weight's shape only. No tile shape
and no split depends on M, so the code and each output's reduction order are the same for every
M: deterministic and batch-invariant (a row is bitwise equal at M=1 and M=16). No host syncs;
the outputs and the split-K workspace are the only allocations (or pass ``out=`` / ``h_out=``),
and the counters persist: safe in CUDA graphs. M <= ``SMALL_M_MAX`` (ValueError above; use cuBLAS), or any M with
``any_m=True``: the grid then also runs over row tiles of the same shape, so every row is computed
exactly as at M=1 (the engine's batch-invariant mode, ``engine.batch_invariant``). fp32 inputs use an
IEEE fp32 dot (no TF32). Under TRITON_INTERPRET=1 the dot operands are upcast to fp32 (exact)
because the interpreter misreads bf16 dot operands.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels.rmsnorm import rmsnorm_reference
from kernels.silu_mul import silu_mul_reference
from kernels.switches import interpreted

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

SMALL_M_MAX = 16
BLOCK_N = 16
NUM_WARPS = 4
MAX_SPLIT_K = 8
_COUNTERS: dict = {}
_RETIRED_COUNTERS: list = []  # outgrown counter buffers: graphs captured with them still write them
# The counter lane of the code running now (split_k_lane): launches of one lane run one after another.
_LANE: contextvars.ContextVar = contextvars.ContextVar("split_k_lane", default=None)


@contextlib.contextmanager
def split_k_lane(lane):
    """Give the split-K launches made inside (eager, warm-up or captured) their own arrival counters.

    The counters of one buffer are shared by every launch that uses it, which is safe only while those
    launches run one after another. Work that runs on another CUDA stream beside the decode steps (the
    engine's prefill forwards on the prefill stream) must use its own lane: two GEMVs on two streams
    sharing counters would each count the other's arrivals and sum unfinished partials. A captured
    graph keeps the buffer of the lane it was captured in. ``lane`` is any hashable name (None: the
    default lane)."""
    token = _LANE.set(lane)
    try:
        yield
    finally:
        _LANE.reset(token)


def split_k_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """The split-K arrival counters of ``device`` in the current lane (:func:`split_k_lane`): one int32 per
    output tile, zero between launches (each launch's last split resets its tiles'). One persistent buffer
    serves every launch of a lane on the device, since they run one after another. Created (or grown)
    outside CUDA-graph capture only: a capture that would need it first raises, saying to run the layer
    once eagerly. An outgrown buffer is kept alive: graphs captured with it still use it."""
    key = (device.type, device.index, _LANE.get())
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < tiles:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"the split-K GEMV needs {tiles} arrival counters on {device} and has "
                               f"{0 if buf is None else buf.numel()}; they are created outside CUDA-graph "
                               f"capture: run the step once eagerly (a warm-up) before capturing it")
        if buf is not None:
            _RETIRED_COUNTERS.append(buf)
        buf = torch.zeros(max(tiles, 1 << 14, 0 if buf is None else 2 * buf.numel()), dtype=torch.int32,
                          device=device)
        _COUNTERS[key] = buf
    return buf


def _linear32(n: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """n @ weight.T + bias in fp32, rounded once to n's dtype."""
    z = F.linear(n.float(), weight.float(), None if bias is None else bias.float())
    return z.to(n.dtype)


def norm_linear_reference(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                          residual: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                          silu_mul: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    n, h = rmsnorm_reference(x, norm_weight, eps, residual)
    z = _linear32(n, weight, bias)
    return (silu_mul_reference(z) if silu_mul else z), h


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _linear32(x, weight, bias)


if triton is not None:
    from kernels.rotary import rotate_pair  # (a Triton helper: defined only with triton)

    @triton.jit
    def _normed_chunk(x_rows, r_rows, nw_ptr, kk, km, row_mask, rstd,
                      HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr, UPCAST_DOT: tl.constexpr):
        # One BLOCK_K chunk of the GEMM's left operand: x, or RMSNorm(x + residual) rounded to x's dtype.
        xm = row_mask[:, None] & km[None, :]
        xv = tl.load(x_rows + kk[None, :], mask=xm, other=0.0)
        if HAS_NORM:
            if HAS_RES:
                rv = tl.load(r_rows + kk[None, :], mask=xm, other=0.0)
                hv = (xv.to(tl.float32) + rv.to(tl.float32)).to(xv.dtype)
            else:
                hv = xv
            nw = tl.load(nw_ptr + kk, mask=km, other=0.0).to(tl.float32)
            n = (nw[None, :] * (hv.to(tl.float32) * rstd[:, None])).to(xv.dtype)  # the norm's output, rounded
        else:
            n = xv
        if UPCAST_DOT:  # exact casts: the same products, summed in fp32
            n = n.to(tl.float32)
        return n

    @triton.jit
    def _row_sumsq_chunk(x_rows, r_rows, h_ptr, rows, row_mask, kk, K, stride_hm, write_h, HAS_RES: tl.constexpr):
        # One BLOCK_K chunk of the rows' sum of squares of h = x (+ residual, rounded like torch's
        # x + r); the program named by write_h also stores h, the new residual stream.
        xm = row_mask[:, None] & (kk < K)[None, :]
        xv = tl.load(x_rows + kk[None, :], mask=xm, other=0.0)
        if HAS_RES:
            rv = tl.load(r_rows + kk[None, :], mask=xm, other=0.0)
            hv = (xv.to(tl.float32) + rv.to(tl.float32)).to(xv.dtype)
            if write_h:
                tl.store(h_ptr + rows[:, None] * stride_hm + kk[None, :], hv, mask=xm)
        else:
            hv = xv
        h32 = hv.to(tl.float32)
        return h32 * h32

    @triton.jit
    def _dot_chunk(acc, acc_u, x_rows, r_rows, nw_ptr, w_rows, wu_rows, kk, K, row_mask, col_mask, rstd,
                   HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr, SILU_MUL: tl.constexpr, UPCAST_DOT: tl.constexpr):
        # acc (+)= n_chunk @ w_chunk^T (and acc_u for the up half with SILU_MUL) over columns kk of K.
        km = kk < K
        n = _normed_chunk(x_rows, r_rows, nw_ptr, kk, km, row_mask, rstd, HAS_NORM, HAS_RES, UPCAST_DOT)
        wm = col_mask[:, None] & km[None, :]
        w = tl.load(w_rows + kk[None, :], mask=wm, other=0.0)
        if UPCAST_DOT:
            w = w.to(tl.float32)
        acc = tl.dot(n, tl.trans(w), acc, input_precision="ieee")  # ieee: no TF32 for fp32 inputs
        if SILU_MUL:
            wu = tl.load(wu_rows + kk[None, :], mask=wm, other=0.0)
            if UPCAST_DOT:
                wu = wu.to(tl.float32)
            acc_u = tl.dot(n, tl.trans(wu), acc_u, input_precision="ieee")
        return acc, acc_u

    @triton.jit
    def _small_m_linear_kernel(x_ptr, res_ptr, nw_ptr, w_ptr, b_ptr, y_ptr, h_ptr,
                               pos_ptr, freq_ptr, slot_ptr, kc_ptr, vc_ptr, ws_ptr, cnt_ptr,
                               M, N_OUT, stride_xm, stride_rm, stride_ym, stride_hm, eps,
                               K: tl.constexpr,
                               HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr,
                               SILU_MUL: tl.constexpr, ROPE_KV: tl.constexpr,
                               HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr, RN: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, UNROLL: tl.constexpr,
                               UPCAST_DOT: tl.constexpr):
        # Every shape here is fixed (BLOCK_M is SMALL_M_MAX whatever M is; rows >= M are masked),
        # and so is the split of K (a function of the weight's shape), so the code, and with it
        # each output's reduction order, does not depend on M.
        pid = tl.program_id(0)
        row_tile = tl.program_id(1)
        split = tl.program_id(2)  # this program's share of K: chunks [split * CPS, (split + 1) * CPS)
        NC: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
        CPS: tl.constexpr = (NC + SPLIT_K - 1) // SPLIT_K
        k_first = split * (CPS * BLOCK_K)
        row0 = row_tile.to(tl.int64) * BLOCK_M  # row tiles: any M in the batch-invariant mode
        dtype = y_ptr.dtype.element_ty
        rows = row0 + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        ks = tl.arange(0, BLOCK_K)
        if ROPE_KV:
            # A tile's BLOCK_N columns are RN = BLOCK_N / 2 rotary pairs of one head: columns
            # j .. j + RN - 1 of its first half, then the same of its second half (RN divides HALF),
            # so a tile holds both members of each pair and the grid is as wide as a plain QKV GEMV's.
            head = (pid * RN) // HALF
            j = (pid * RN) % HALF + tl.arange(0, RN)
            t = tl.arange(0, BLOCK_N)
            cols = head * (2 * HALF) + (pid * RN) % HALF + (t % RN) + (t // RN) * HALF
            col_mask = t < BLOCK_N
        else:
            cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # output columns (the gate's, with SILU_MUL)
            col_mask = cols < N_OUT
            cols_u = cols + N_OUT  # with SILU_MUL: the matching rows of the up half
        x_rows = x_ptr + rows[:, None] * stride_xm
        r_rows = res_ptr + rows[:, None] * stride_rm
        w_rows = w_ptr + cols.to(tl.int64)[:, None] * K
        if SILU_MUL:
            wu_rows = w_ptr + cols_u.to(tl.int64)[:, None] * K
        else:
            wu_rows = w_rows  # unused without SILU_MUL
        # The first chunk of weights loads before anything the step's earlier kernels wrote is read.
        kk0 = k_first + ks
        km0 = kk0 < K
        wm0 = col_mask[:, None] & km0[None, :]
        w0 = tl.load(w_rows + kk0[None, :], mask=wm0, other=0.0)
        if SILU_MUL:
            wu0 = tl.load(wu_rows + kk0[None, :], mask=wm0, other=0.0)

        if HAS_NORM:  # prologue: each row's 1/rms over all of K (every split needs it)
            ss = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
            if UNROLL:  # straight-line code: the chunks' loads can all be in flight at once
                for ci in tl.static_range(NC):
                    ss += _row_sumsq_chunk(x_rows, r_rows, h_ptr, rows, row_mask, ci * BLOCK_K + ks, K, stride_hm,
                                           (pid == 0) & (split == 0), HAS_RES)
            else:
                for ci in range(NC):
                    ss += _row_sumsq_chunk(x_rows, r_rows, h_ptr, rows, row_mask, ci * BLOCK_K + ks, K, stride_hm,
                                           (pid == 0) & (split == 0), HAS_RES)
            rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=1) / K + eps)
        else:
            rstd = tl.zeros([BLOCK_M], dtype=tl.float32)

        n = _normed_chunk(x_rows, r_rows, nw_ptr, kk0, km0, row_mask, rstd, HAS_NORM, HAS_RES, UPCAST_DOT)
        if UPCAST_DOT:
            w0 = w0.to(tl.float32)
        acc = tl.dot(n, tl.trans(w0), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), input_precision="ieee")
        if SILU_MUL:
            if UPCAST_DOT:
                wu0 = wu0.to(tl.float32)
            acc_u = tl.dot(n, tl.trans(wu0), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), input_precision="ieee")
        else:
            acc_u = acc
        # The rest of this split's chunks. Chunks past K (the last split's share can be short) are
        # fully masked: their dot adds exact zeros.
        if UNROLL:
            for ci in tl.static_range(1, CPS):
                acc, acc_u = _dot_chunk(acc, acc_u, x_rows, r_rows, nw_ptr, w_rows, wu_rows, k_first + ci * BLOCK_K + ks,
                                        K, row_mask, col_mask, rstd, HAS_NORM, HAS_RES, SILU_MUL, UPCAST_DOT)
        else:
            for ci in range(1, CPS):
                acc, acc_u = _dot_chunk(acc, acc_u, x_rows, r_rows, nw_ptr, w_rows, wu_rows, k_first + ci * BLOCK_K + ks,
                                        K, row_mask, col_mask, rstd, HAS_NORM, HAS_RES, SILU_MUL, UPCAST_DOT)

        if SPLIT_K > 1:
            # Split-K: each split stores its fp32 partial tile; the last split of the tile to arrive
            # (an arrival counter) sums all partials in split order, 0 first, so the result does not
            # depend on which split came last, and runs the epilogue. It resets the counter for the
            # next launch (launches on a stream never overlap: counters are shared by all of them).
            tile = row_tile * tl.num_programs(0) + pid
            TILE: tl.constexpr = BLOCK_M * BLOCK_N
            offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            ws_tile = ws_ptr + tile.to(tl.int64) * (SPLIT_K * (2 if SILU_MUL else 1) * TILE)
            tl.store(ws_tile + split * TILE + offs, acc)
            if SILU_MUL:
                tl.store(ws_tile + (SPLIT_K + split) * TILE + offs, acc_u)
            tl.debug_barrier()  # every thread's partial is stored before the arrival is published
            arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived != SPLIT_K - 1:
                return
            acc = tl.load(ws_tile + offs, cache_modifier=".cg")
            for si in tl.static_range(1, SPLIT_K):
                acc += tl.load(ws_tile + si * TILE + offs, cache_modifier=".cg")
            if SILU_MUL:
                acc_u = tl.load(ws_tile + SPLIT_K * TILE + offs, cache_modifier=".cg")
                for si in tl.static_range(1, SPLIT_K):
                    acc_u += tl.load(ws_tile + (SPLIT_K + si) * TILE + offs, cache_modifier=".cg")
            tl.atomic_xchg(cnt_ptr + tile, 0)

        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
            if SILU_MUL:
                acc_u += tl.load(b_ptr + cols_u, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        z = acc.to(dtype)
        out_mask = row_mask[:, None] & col_mask[None, :]
        if SILU_MUL:
            g32 = z.to(tl.float32)
            s = (g32 / (1.0 + tl.exp(-g32))).to(dtype)  # silu rounded to dtype, as torch does
            z = (s.to(tl.float32) * acc_u.to(dtype).to(tl.float32)).to(dtype)
            tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], z, mask=out_mask)
        elif ROPE_KV:
            # [BLOCK_M, BLOCK_N] -> the first-half columns z and their second-half partners zu, [BLOCK_M, RN] each
            z, zu = tl.split(tl.permute(tl.reshape(z, [BLOCK_M, 2, RN]), (0, 2, 1)))
            out_mask = row_mask[:, None] & (j < HALF)[None, :]
            if head < HQ + HK:  # q and k heads rotate (the rotary kernel's math, kernels/rotary.py)
                p = tl.load(pos_ptr + rows, mask=row_mask, other=0).to(tl.float32)
                f = tl.load(freq_ptr + j)
                lo, hi = rotate_pair(z.to(tl.float32), zu.to(tl.float32), p[:, None] * f[None, :])
                lo = lo.to(dtype)
                hi = hi.to(dtype)
            else:  # v heads go to the cache as projected
                lo = z
                hi = zu
            if head < HQ:  # rotated q: [M, HQ, 2 * HALF] rows of y
                dst = y_ptr + rows[:, None] * stride_ym + head * (2 * HALF) + j[None, :]
                tl.store(dst, lo, mask=out_mask)
                tl.store(dst + HALF, hi, mask=out_mask)
            else:  # k / v into the paged cache at the token's slot; padding tokens (slot < 0) write nothing
                slot = tl.load(slot_ptr + rows, mask=row_mask, other=-1).to(tl.int64)
                kv_mask = out_mask & (slot >= 0)[:, None]
                if head < HQ + HK:
                    dst = kc_ptr + slot[:, None] * (HK * 2 * HALF) + (head - HQ) * (2 * HALF) + j[None, :]
                else:
                    dst = vc_ptr + slot[:, None] * (HK * 2 * HALF) + (head - HQ - HK) * (2 * HALF) + j[None, :]
                tl.store(dst, lo, mask=kv_mask)
                tl.store(dst + HALF, hi, mask=kv_mask)
        else:
            tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], z, mask=out_mask)


def _rows(t: torch.Tensor, K: int) -> torch.Tensor:
    t2 = t.reshape(-1, K)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _check_out(name: str, out: torch.Tensor, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    if tuple(out.shape) != tuple(shape) or out.dtype != like.dtype or out.device != like.device:
        raise ValueError(f"{name} is {tuple(out.shape)} {out.dtype} on {out.device}, "
                         f"expected {tuple(shape)} {like.dtype} on {like.device}")
    if len(shape) == 2 and out.stride(-1) == 1:
        return out  # any row stride
    if not out.is_contiguous():
        raise ValueError(f"{name} must be contiguous (or 2-D with a unit stride in its last dim)")
    return out.view(-1, shape[-1])


TILE_KEYS = ("block_n", "block_k", "num_warps", "num_stages", "split_k", "unroll")


@functools.lru_cache(maxsize=8)
def _tile_table(path: str, mtime: float) -> dict:
    try:
        data = json.loads(Path(path).read_text())
        table = {}
        for e in data["tiles"]:
            key = (int(e["N"]), int(e["K"]), bool(e["silu_mul"]), bool(e.get("rope", False)))
            cfg = {k: e[k] for k in TILE_KEYS if e.get(k) is not None}
            if (cfg.get("block_n", BLOCK_N) not in (16, 32, 64) or cfg.get("num_warps", NUM_WARPS) not in (1, 2, 4, 8)
                    or cfg.get("block_k", 256) not in (16, 32, 64, 128, 256, 512, 1024)
                    or cfg.get("num_stages", 2) not in (1, 2, 3, 4, 5)
                    or cfg.get("split_k", 1) not in range(1, MAX_SPLIT_K + 1)
                    or cfg.get("unroll", False) not in (True, False)):
                raise ValueError(f"entry {e}: block_n must be 16/32/64, block_k a power of two in 16..1024, "
                                 f"num_warps 1/2/4/8, num_stages 1..5, split_k 1..{MAX_SPLIT_K} and unroll "
                                 f"true/false")
            table[key] = cfg
        return table
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"engine.kernels.small_m_tiles={path}: not a tile table ({e}); bench/small_m_sweep.py "
                         f"writes one (small_m_tiles.json)") from e


def tile_settings(N: int, K: int, silu_mul: bool, rope: bool = False, table: str | None = None) -> dict:
    """Tile settings for a weight of N rows and K columns: the tile table at path ``table``
    (engine.kernels.small_m_tiles, written by bench/small_m_sweep.py for one device) where it has
    this shape, else none (the defaults apply). They depend on the weight's shape only, never on M,
    so rows stay batch-invariant. ``rope``: the fused QKV + rotary epilogue's entry (a table's
    ``"rope": true`` rows), kept apart from the plain GEMV's entry for the same weight shape."""
    path = table
    if not path:
        return {}
    return dict(_tile_table(path, os.path.getmtime(path)).get((N, K, bool(silu_mul), bool(rope)), {}))


def split_cuts_evenly(chunks: int, split_k: int) -> bool:
    """Whether ``split_k`` programs, each taking ceil(chunks / split_k) consecutive BLOCK_K chunks,
    all get at least one (the kernel's shares; an empty share would have nothing to add)."""
    return 1 <= split_k <= chunks and -(-chunks // -(-chunks // split_k)) == split_k


def _even_split(chunks: int, want: int) -> int:
    """The largest split of ``chunks`` BLOCK_K chunks, at most ``want``, whose shares are all non-empty."""
    return next(s for s in range(min(want, chunks), 0, -1) if split_cuts_evenly(chunks, s))


def default_tiles(N: int, K: int, silu_mul: bool, rope: bool = False, norm: bool = False,
                  any_m: bool = False) -> dict:
    """The built-in settings for a weight of N rows and K columns (a device's table, tile_settings(),
    overrides them). Like the table, a function of the weight's shape and the fused prologue/epilogue
    only, never of M, so rows stay batch-invariant.

    - Base: 16-column tiles, BLOCK_K up to 256, four warps, three stages, no split of K, rolled loops.
    - Norm + gate/up + SiLU: 32-column tiles, unrolled loops (the prologue's loads of x and the
      residual over all of K in flight together), K split three ways.
    - Plain projections over a long K (four or more chunks, e.g. down_proj): 32-column tiles, K split
      into one chunk per program (up to MAX_SPLIT_K).
    - ``any_m`` (the batch-invariant mode, any number of rows): never split, since the partial tiles of
      hundreds of row tiles would cost more than they save; the mode's choice is the same at every M.

    H200, weights streamed from HBM (the `gemv-split` results folder): gate/up 7.11 -> 6.28 us
    per launch at M=1, down 5.24 -> 4.74; a batch-1 target-only step 0.884 -> 0.843 ms. The QKV + rotary
    kernel gained at M=1 only, o_proj not at all: both keep the base settings."""
    block_k = max(16, min(256, 1 << max(K - 1, 1).bit_length()))
    chunks = -(-K // block_k)
    cfg = {"block_n": BLOCK_N, "block_k": block_k, "num_warps": NUM_WARPS, "num_stages": 3, "split_k": 1,
           "unroll": False}
    if silu_mul and norm:
        cfg.update(block_n=32, unroll=True, split_k=1 if any_m else _even_split(chunks, 3))
    elif not (norm or rope or silu_mul or any_m) and chunks >= 4:
        cfg.update(block_n=32, split_k=_even_split(chunks, MAX_SPLIT_K))
    return cfg


def _launch(fn: str, x, weight, bias, *, norm_weight=None, eps=0.0, residual=None, silu_mul=False,
            rope: dict | None = None, out=None, h_out=None, any_m: bool = False, tiles: str | None = None,
            block_n: int | None = None,
            block_k: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
            split_k: int | None = None, unroll: bool | None = None):
    # block_n / block_k / num_warps / num_stages / split_k / unroll: explicit tile settings
    # (bench/small_m_sweep.py); unset ones come from the tile table at path ``tiles``
    # (tile_settings(), engine.kernels.small_m_tiles), then the defaults.
    # rope: the fused QKV + rotary + paged K/V write epilogue (norm_qkv_rope_triton checks it);
    # its tile is BLOCK_N wide whatever a table says (a tile holds BLOCK_N / 2 rotary pairs).
    K = x.shape[-1]
    cfg = default_tiles(weight.shape[0], K, silu_mul, rope=rope is not None, norm=norm_weight is not None,
                        any_m=any_m)
    cfg.update(tile_settings(weight.shape[0], K, silu_mul, rope=rope is not None, table=tiles))
    given = dict(block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=num_stages, split_k=split_k,
                 unroll=unroll)
    cfg.update({k: v for k, v in given.items() if v is not None})
    block_n, block_k, num_warps, num_stages = cfg["block_n"], cfg["block_k"], cfg["num_warps"], cfg["num_stages"]
    split_k, unroll = int(cfg["split_k"]), bool(cfg["unroll"])
    if rope is not None:
        block_n = BLOCK_N
    if triton is None:
        raise RuntimeError(f"{fn} needs the triton package")
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"{fn} needs CUDA tensors (got {x.device}); on CPU set TRITON_INTERPRET=1")
    if weight.dim() != 2 or weight.shape[1] != K:
        raise ValueError(f"weight has shape {tuple(weight.shape)}, expected (N, {K}) for x {tuple(x.shape)}")
    if weight.dtype != x.dtype or not weight.is_contiguous():
        raise ValueError(f"weight must be a contiguous {x.dtype} tensor (got {weight.dtype}, "
                         f"contiguous={weight.is_contiguous()})")
    N = weight.shape[0]
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({N},)")
    if norm_weight is not None and tuple(norm_weight.shape) != (K,):
        raise ValueError(f"norm_weight has shape {tuple(norm_weight.shape)}, expected ({K},)")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}")
    if silu_mul and N % 2:
        raise ValueError(f"silu_mul needs an even N (gate and up halves), weight has N={N}")
    x2 = _rows(x, K)
    M = x2.shape[0]
    if M > SMALL_M_MAX and not any_m:
        raise ValueError(f"{fn} handles at most {SMALL_M_MAX} rows (got {M}); use the cuBLAS path (F.linear), "
                         f"or any_m=True (the batch-invariant mode: same tiles, a grid over row tiles)")
    if rope is not None:
        hq, hk, half = rope["hq"], rope["hk"], rope["half"]
        n_out, y_shape, n_programs = N, (M, hq, 2 * half), (hq + 2 * hk) * half // (block_n // 2)
    else:
        hq = hk = half = 0
        n_out = N // 2 if silu_mul else N
        y_shape, n_programs = (*x.shape[:-1], n_out), triton.cdiv(n_out, block_n) if n_out else 0
    if out is None:
        out = torch.empty(y_shape, dtype=x.dtype, device=x.device)
    y2 = _check_out("out", out, y_shape, x)
    if rope is not None:
        y2 = out.view(M, hq * 2 * half)
    if residual is not None:
        r2 = _rows(residual, K)
        if h_out is None:
            h_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        h2 = _check_out("h_out", h_out, tuple(x.shape), x)
        h = h_out
    else:
        if h_out is not None:
            raise ValueError("h_out is only written with a residual (without one h is x itself)")
        r2, h2, h = x2, x2, x
    if M and n_programs:
        chunks = triton.cdiv(K, block_k)
        if not split_cuts_evenly(chunks, split_k):
            raise ValueError(f"split_k={split_k} does not cut K={K} into {split_k} non-empty shares of "
                             f"BLOCK_K={block_k} chunks ({chunks} chunks); pick a split_k that does")
        row_tiles = triton.cdiv(M, SMALL_M_MAX)
        grid = (n_programs, row_tiles, split_k)
        r_ = rope or {}
        if split_k > 1:
            tiles = n_programs * row_tiles
            ws = torch.empty(tiles * split_k * (2 if silu_mul else 1) * SMALL_M_MAX * block_n,
                             dtype=torch.float32, device=x.device)
            counters = split_k_counters(x.device, tiles)
        else:
            ws = counters = x2
        _small_m_linear_kernel[grid](
            x2, r2, norm_weight if norm_weight is not None else x2, weight, bias if bias is not None else x2,
            y2, h2, r_.get("positions", x2), r_.get("inv_freq", x2), r_.get("slot_mapping", x2),
            r_.get("k_cache", x2), r_.get("v_cache", x2), ws, counters,
            M, n_out, x2.stride(0), r2.stride(0), y2.stride(0), h2.stride(0), float(eps), K=K,
            HAS_NORM=norm_weight is not None, HAS_RES=residual is not None, HAS_BIAS=bias is not None,
            SILU_MUL=silu_mul, ROPE_KV=rope is not None,
            HQ=hq, HK=hk, HALF=half, RN=block_n // 2, BLOCK_M=SMALL_M_MAX, BLOCK_N=block_n, BLOCK_K=block_k,
            SPLIT_K=split_k, UNROLL=unroll,
            UPCAST_DOT=interpreted(),  # (the interpreter misreads bf16 dot operands: upcast there)
            num_warps=num_warps, num_stages=num_stages)
    elif M and residual is not None:  # nothing to project, but h is still owed
        h.copy_(x + residual)
    return out, h


def rope_fusable(head_dim: int, block_n: int = BLOCK_N) -> bool:
    """Whether :func:`norm_qkv_rope_triton` takes this head size (a tile's block_n / 2 rotary pairs
    must fit inside half a head)."""
    return head_dim % 2 == 0 and (head_dim // 2) % (block_n // 2) == 0


def norm_qkv_rope_reference(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor, *,
                            num_heads: int, num_kv_heads: int, positions: torch.Tensor, inv_freq: torch.Tensor,
                            k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                            residual: torch.Tensor | None = None, bias: torch.Tensor | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual add +) RMSNorm + the fused q/k/v projection, then rotary on q and k and the paged
    K/V write (kernels/rotary.py's specification). -> (rotated q [M, H, D], h); k and v land in
    the caches at slot_mapping (negative slots skipped)."""
    from kernels.rotary import rotary_kv_write_reference

    qkv, h = norm_linear_reference(x, norm_weight, eps, weight, residual, bias)
    D = k_cache.shape[-1]
    H, Hk = num_heads, num_kv_heads
    q = qkv[:, : H * D].unflatten(-1, (H, D))
    k = qkv[:, H * D: (H + Hk) * D].unflatten(-1, (Hk, D))
    v = qkv[:, (H + Hk) * D:].unflatten(-1, (Hk, D))
    return rotary_kv_write_reference(q, k, v, positions, inv_freq, k_cache, v_cache, slot_mapping), h


def norm_qkv_rope_triton(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor, *,
                         num_heads: int, num_kv_heads: int, positions: torch.Tensor, inv_freq: torch.Tensor,
                         k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                         residual: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                         h_out: torch.Tensor | None = None, any_m: bool = False, tiles: str | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """One kernel for :func:`norm_qkv_rope_reference`: the GEMV's programs run over rotary pairs
    (columns j and j + D/2 of one head) and rotate in the epilogue, writing q to the output and k
    and v straight into the paged cache. x [M, K] with M <= SMALL_M_MAX (any M with ``any_m``).
    Capture-safe: no host reads, the output (and h) is the only allocation."""
    if x.dim() != 2:
        raise ValueError(f"x must be [tokens, hidden], got {tuple(x.shape)}")
    M = x.shape[0]
    H, Hk = int(num_heads), int(num_kv_heads)
    if H < 1 or Hk < 1 or H % Hk:
        raise ValueError(f"num_heads={H} must be a positive multiple of num_kv_heads={Hk}")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dim() != 4 or c.shape[2] != Hk or not c.is_contiguous() or c.dtype != x.dtype:
            raise ValueError(f"{name} must be a contiguous [pages, page_size, {Hk}, head_dim] {x.dtype} tensor, "
                             f"got {tuple(c.shape)} {c.dtype} (contiguous={c.is_contiguous()})")
    D = k_cache.shape[-1]
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache {tuple(v_cache.shape)} must match k_cache {tuple(k_cache.shape)}")
    if not rope_fusable(D):
        raise ValueError(f"head_dim {D}: the fused rotary epilogue needs head_dim/2 to be a multiple of {BLOCK_N // 2}; "
                         f"use norm_linear_triton + kernels.rotary.rotary_kv_write_triton")
    if weight.dim() != 2 or weight.shape[0] != (H + 2 * Hk) * D:
        raise ValueError(f"weight has {weight.shape[0] if weight.dim() == 2 else '?'} rows, expected "
                         f"(num_heads + 2 num_kv_heads) * head_dim = {(H + 2 * Hk) * D}")
    if inv_freq.shape != (D // 2,) or inv_freq.dtype != torch.float32:
        raise ValueError(f"inv_freq must be fp32 [{D // 2}], got {inv_freq.dtype} {tuple(inv_freq.shape)}")
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping)):
        if t.shape != (M,) or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be int32/int64 [{M}], got {t.dtype} {tuple(t.shape)}")
    rope = {"hq": H, "hk": Hk, "half": D // 2, "positions": positions, "inv_freq": inv_freq.contiguous(),
            "slot_mapping": slot_mapping, "k_cache": k_cache, "v_cache": v_cache}
    q, h = _launch("norm_qkv_rope_triton", x, weight, bias, norm_weight=norm_weight, eps=eps, residual=residual,
                   rope=rope, h_out=h_out, any_m=any_m, tiles=tiles)
    return q, h


def norm_linear_triton(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                       residual: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                       silu_mul: bool = False, *, out: torch.Tensor | None = None,
                       h_out: torch.Tensor | None = None, any_m: bool = False, tiles: str | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused (residual add +) RMSNorm + linear (+ silu*mul); see the module docstring.
    ``out`` / ``h_out``: optional preallocated outputs (``h_out`` only with a residual).
    ``any_m``: lift the M <= SMALL_M_MAX limit (row tiles of the same shape: still batch-invariant).
    ``tiles``: the path of a device's tile table (engine.kernels.small_m_tiles), or None."""
    return _launch("norm_linear_triton", x, weight, bias, norm_weight=norm_weight, eps=eps, residual=residual,
                   silu_mul=silu_mul, out=out, h_out=h_out, any_m=any_m, tiles=tiles)


def linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  out: torch.Tensor | None = None, any_m: bool = False, tiles: str | None = None) -> torch.Tensor:
    """y = x @ weight.T (+ bias), fp32 accumulation, one rounding to x's dtype, for M <= SMALL_M_MAX
    (any M with ``any_m``); ``tiles``: a device's tile table (engine.kernels.small_m_tiles), or None."""
    return _launch("linear_triton", x, weight, bias, out=out, any_m=any_m, tiles=tiles)[0]


__all__ = ["SMALL_M_MAX", "MAX_SPLIT_K", "default_tiles", "split_cuts_evenly", "split_k_counters", "split_k_lane", "norm_linear_reference",
           "norm_linear_triton", "linear_reference", "linear_triton", "norm_qkv_rope_reference", "norm_qkv_rope_triton",
           "rope_fusable"]
