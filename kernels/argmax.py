"""Greedy argmax over the vocabulary: the first index of each row's maximum.

:func:`argmax_reference` is the specification, ``torch.argmax(logits, dim=-1)``: the first
index of the maximum, where NaN (of either sign) counts as larger than everything, so the
first NaN wins, and -0.0 equals +0.0 (the first zero wins when zero is the maximum).

:func:`argmax_triton` computes the same index with one row spread over many programs. A
single-block reduction per row (what ``torch.argmax`` launches for a few rows of a
49152-token vocabulary) leaves the GPU mostly idle; here the grid is ``(T, chunks)``:

- each program reduces its chunk of the row to (max, first index of the max). Values are
  compared as order-preserving int32 keys of their fp32 bits (every NaN mapped above +inf,
  -0.0 mapped onto +0.0), so the comparison is exact and NaN needs no special case;
- it packs the pair into one int64, key in the high 32 bits and ``2**32 - 1 - index`` in the
  low 32 bits, and combines it into the row's cell with ``atomic_max``: the largest packed
  value is the largest key and, among equal keys, the smallest index. A maximum is unique,
  so the result does not depend on the order the programs arrive in (bitwise deterministic);
- it then bumps the row's arrival counter (``atomic_add``, acquire-release); the program
  that arrives last swaps the cell back to its empty value (``atomic_xchg``), writes the
  index and resets the counter to 0. Every call therefore leaves the cells and counters as
  it found them: no memset per call, and a CUDA-graph replay starts clean.

The cells (int64) and counters (int32), and with ``top_out`` or ``gap_out`` each chunk's states (below),
live in a per-device workspace created on first use and grown (never shrunk) for more rows or chunk
states. Growing it allocates, so it must happen outside CUDA-graph capture: capturing a call with more
rows (or chunk states) than the workspace holds raises (run the call once eagerly first, with the same
outputs; the workspace starts with room for 4096 rows). Buffers replaced by a larger workspace are kept
alive, since graphs captured earlier still point at them. Calls that share a device must not run
concurrently on different streams (they would share cells); one stream, or one graph at a time, is how
the engine runs them. A row that fits in one chunk skips the workspace and writes its results directly.

With ``top_out`` the same pass also gives each row's top softmax probability (what
kernels/top_probability.py computes on its own): every program keeps an online softmax state per
lane (largest value, sum of exponentials, a NaN seen) beside its argmax, stores its chunk's
(maximum, sum) in the workspace before it arrives, and the row's last program combines the
chunks' states into ``1 / sum exp(x - max)`` (NaN for a row with a NaN, +inf or only -inf, as
the reference). A greedy draft reads its argmax anyway, so the probability costs no second
read of the logits.

With ``gap_out`` the same pass also gives each row's top-2 gap, the largest value minus the second
largest. :func:`top_gap_reference` is its specification: ``v = torch.topk(x, 2, dim=-1).values`` of
``x = logits.float()``, then ``v[..., 0] - v[..., 1]``, one fp32 subtraction of two values of the row
(it needs at least 2 columns). torch.topk ranks NaN (of either sign) above +inf, as torch.argmax does, so
for special rows it gives:

- a NaN anywhere in the row: NaN (the NaN is the top value);
- a maximum repeated (twice or more): 0 (of either sign for zeros of both signs);
- only -inf: NaN (-inf - -inf);
- a finite maximum and -inf everywhere else: +inf;
- one +inf and a finite runner-up: +inf; +inf twice or more: NaN (inf - inf).

In the kernel every lane keeps, beside the key of the largest value it has seen (the argmax's), the key
of the second largest: one max and one select per element. A larger key moves the lane's largest into
second place, any other key raises the second (a repeat of the largest makes it the second: gap 0). The
keys stand for the fp32 values exactly, except that a zero loses its sign, which can change only the
sign of a zero gap. Padding's key is below every value's and stands for -inf where a lane saw no value,
which never changes the top two of V >= 2 values. A program reduces its lanes to its chunk's top (the
largest key) and runner-up (the largest of the lanes' second keys and of the other lanes' largest, all
lanes but one lane holding the top: a maximum tied across lanes gives gap 0), stores the pair as fp32
values in the workspace before it arrives, and the row's last program combines the chunks' pairs the
same way. Whether the row holds a NaN is read from the argmax itself (its key is the NaN key), and a NaN
row's gap is NaN whatever its top two hold. The result is the reference's subtraction of the same two
exact values, so it equals :func:`top_gap_reference` bitwise (up to the sign of a zero gap).

The kernel is the engine's greedy token choice on the Triton backend through
:func:`dspark.sampling.greedy_argmax` (CUDA tensors only). ``engine.kernels.triton_argmax=false``
switches it off there (``torch.argmax`` is used instead).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.row_checks import check_row_logits, power_of_two
BLOCK = 1024  # default elements per tile; a program reduces 1..MAX_TILES tiles of its row
MAX_TILES = 16
DEFAULT_NUM_SMS = 132  # an H200's, assumed when the device cannot be asked (CPU interpreter)
_MIN_WORKSPACE_ROWS = 4096
_MAX_GRID_Y = 65535  # CUDA's limit on a grid's second dimension (chunks per row)
_INT64_MIN = -(2 ** 63)  # the empty cell: below every packed (key, index)


def argmax_reference(logits: torch.Tensor) -> torch.Tensor:
    """``torch.argmax(logits, dim=-1)``: int64 [T], the first index of each row's maximum (NaN largest)."""
    return torch.argmax(logits, dim=-1)


def top_gap_reference(logits: torch.Tensor) -> torch.Tensor:
    """The largest value minus the second largest over the last axis of ``logits.float()`` [..., V], float32
    [...]: ``v = torch.topk(x, 2, dim=-1).values``, then ``v[..., 0] - v[..., 1]`` (0 for a repeated maximum;
    NaN for a row with a NaN, a row of only -inf and a row with +inf twice; +inf for a finite maximum over only
    -inf and for a single +inf: see the module docstring). ValueError for fewer than 2 columns."""
    if logits.dim() == 0 or logits.shape[-1] < 2:
        raise ValueError(f"top_gap_reference needs at least 2 columns on the last axis (a largest and a second "
                         f"largest value), got shape {tuple(logits.shape)}")
    v = torch.topk(logits.float(), 2, dim=-1).values
    return v[..., 0] - v[..., 1]


# --------------------------------------------------------------------------------------
# Workspace
# --------------------------------------------------------------------------------------

class _Workspace:
    def __init__(self, rows: int, device: torch.device, partials: int = 0):
        self.rows = rows
        self.cells = torch.full((rows,), _INT64_MIN, dtype=torch.int64, device=device)
        self.counts = torch.zeros(rows, dtype=torch.int32, device=device)
        # each chunk's states, rows x chunks of them: the softmax state (max, sum) for argmax_triton's top_out in
        # rows 0 and 1, the top two values (top, runner-up) for its gap_out in rows 2 and 3
        self.partials = torch.zeros(4, partials, dtype=torch.float32, device=device)


_WORKSPACES: dict[torch.device, _Workspace] = {}
_RETIRED: list[_Workspace] = []  # outgrown buffers that captured graphs may still use


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _workspace(device: torch.device, rows: int, partials: int = 0) -> _Workspace:
    """The device's workspace with room for ``rows`` rows and ``partials`` chunk states (grown when short)."""
    ws = _WORKSPACES.get(device)
    if ws is not None and ws.rows >= rows and ws.partials.shape[1] >= partials:
        return ws
    if _capturing(device):
        have = "none" if ws is None else f"{ws.rows} rows and {ws.partials.shape[1]} chunk states"
        raise RuntimeError(f"argmax_triton needs a workspace for {rows} rows and {partials} chunk states on "
                           f"{device} but has {have}, and it cannot be allocated during CUDA-graph capture: call "
                           "argmax_triton once with at least this many rows (and top_out or gap_out, as captured) "
                           "before capturing")
    if ws is not None:
        _RETIRED.append(ws)
        partials = max(partials, ws.partials.shape[1])
    size = max(_MIN_WORKSPACE_ROWS, triton.next_power_of_2(rows), 0 if ws is None else ws.rows)
    ws = _Workspace(size, device, triton.next_power_of_2(partials) if partials else 0)
    _WORKSPACES[device] = ws
    return ws


# --------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------

@triton.jit
def _ordered_key(x):
    """int32 keys ordered like the fp32 values x, with -0.0 == +0.0 and every NaN above +inf."""
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negatives: larger magnitude, smaller key
    key = tl.where(x == 0.0, 0, key)
    return tl.where(x != x, 0x7FFFFFFF, key)


@triton.jit
def _key_value(key):
    """The fp32 value of an _ordered_key: +0.0 for a zero, a NaN for the NaN key, -inf for padding's key."""
    key = tl.maximum(key, -2139095041)  # key(-inf); padding's key is below it
    bits = tl.where(key < 0, key ^ 0x7FFFFFFF, key)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _softmax_state(m, s, nan):
    """A program's chunk as one softmax state: (its maximum M, sum of exp(x - M), whether it saw a NaN)."""
    top = tl.max(m, 0)
    scale = tl.where(m == -float("inf"), 0.0, tl.exp(m - top))  # lanes of only -inf hold s = 0
    return top, tl.sum(s * scale, 0), tl.max(nan, 0) > 0


@triton.jit
def _top_probability(top, total, nan):
    """1 / sum exp(x - max): the top softmax probability, NaN where top_probability_reference has NaN."""
    bad = nan | (top == -float("inf")) | (top == float("inf"))
    return tl.where(bad, float("nan"), 1.0 / total)


@triton.jit
def _top_two(t1, t2, lanes, N: tl.constexpr):
    """The (largest, second largest) of the values (or keys) held as N lanes' (top, second) pairs ``t1 >= t2``:
    the largest t1, and the largest of every t2 and of the t1 of all lanes but one lane holding the largest
    (so a largest value held by two lanes is also the second)."""
    top = tl.max(t1, 0)
    one = tl.min(tl.where(t1 == top, lanes, N), 0)
    return top, tl.max(tl.where(lanes == one, t2, t1), 0)


@triton.jit
def _top_gap(top, second, nan):
    """top - second, NaN where the row holds a NaN (as top_gap_reference, whose top value is then the NaN)."""
    return tl.where(nan, float("nan"), top - second)


@triton.jit
def _argmax_kernel(x_ptr, out_ptr, cell_ptr, count_ptr, p_ptr, p_stride, g_ptr, g_stride, part_ptr, part_n, V,
                   stride_t, num_chunks, TILES: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr,
                   WITH_PROB: tl.constexpr, WITH_GAP: tl.constexpr, CHUNKS: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    row_ptr = x_ptr + row.to(tl.int64) * stride_t
    offs = tl.arange(0, BLOCK)
    start = chunk * (TILES * BLOCK)
    # Per lane: the best key so far and its index; a later tile replaces it only when strictly
    # larger, so each lane keeps the first index of its maximum.
    best_key = tl.full([BLOCK], -2147483648, dtype=tl.int32)
    best_idx = tl.full([BLOCK], 0, dtype=tl.int32) + V
    # WITH_PROB, per lane: an online softmax state (largest value m, sum of exp(value - m), a NaN seen), as
    # kernels/top_probability.py keeps it
    m = tl.full([BLOCK], -float("inf"), dtype=tl.float32)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    nan = tl.zeros([BLOCK], dtype=tl.int32)
    # WITH_GAP, per lane: the key of the second-largest value seen (beside best_key, the largest)
    second_key = tl.full([BLOCK], -2147483648, dtype=tl.int32)
    for t in range(TILES):
        idx = start + t * BLOCK + offs
        ok = idx < V
        x = tl.load(row_ptr + idx, mask=ok, other=0.0).to(tl.float32)
        key = tl.where(ok, _ordered_key(x), -2147483648)  # below key(-inf): padding never wins
        better = key > best_key
        if WITH_GAP:  # a larger key moves the largest to second place; any other (a tie too) may raise the second
            second_key = tl.where(better, best_key, tl.maximum(second_key, key))
        best_key = tl.where(better, key, best_key)
        best_idx = tl.where(better, idx, best_idx)
        if WITH_PROB:
            xs = tl.where(ok, x, -float("inf"))
            nan = nan | (xs != xs).to(tl.int32)
            hi = tl.maximum(xs, m)
            lo = tl.minimum(xs, m)
            e = tl.where(hi == -float("inf"), 0.0, tl.exp(lo - hi))  # both -inf: weighs nothing
            s = tl.where(xs > m, s * e + 1.0, s + e)
            m = hi
    top = tl.max(best_key, 0)
    first = tl.min(tl.where(best_key == top, best_idx, V), 0)
    if SINGLE:
        tl.store(out_ptr + row, first.to(tl.int64))
        if WITH_PROB:
            c_top, c_sum, c_nan = _softmax_state(m, s, nan)
            tl.store(p_ptr + row * p_stride, _top_probability(c_top, c_sum, c_nan))
        if WITH_GAP:
            g_top, g_second = _top_two(best_key, second_key, offs, BLOCK)
            tl.store(g_ptr + row * g_stride, _top_gap(_key_value(g_top), _key_value(g_second), top == 0x7FFFFFFF))
    else:
        if WITH_PROB:  # this chunk's state, read by the row's last program (a NaN chunk stores a NaN maximum)
            c_top, c_sum, c_nan = _softmax_state(m, s, nan)
            slot = row * num_chunks + chunk
            tl.store(part_ptr + slot, tl.where(c_nan, float("nan"), c_top))
            tl.store(part_ptr + part_n + slot, c_sum)
        if WITH_GAP:  # this chunk's top two values (a NaN reaches the row through the cell's key)
            g_top, g_second = _top_two(best_key, second_key, offs, BLOCK)
            slot = row * num_chunks + chunk
            tl.store(part_ptr + 2 * part_n + slot, _key_value(g_top))
            tl.store(part_ptr + 3 * part_n + slot, _key_value(g_second))
        low_mask = tl.full([], 0xFFFFFFFF, dtype=tl.int64)
        packed = (top.to(tl.int64) << 32) | (low_mask - first.to(tl.int64))
        tl.atomic_max(cell_ptr + row, packed)
        tl.debug_barrier()  # the cell update (and the chunk state) are ordered before this program's arrival
        arrived = tl.atomic_add(count_ptr + row, 1)  # acq_rel, gpu scope
        if arrived == num_chunks - 1:  # the last program of the row: every chunk is in the cell
            final = tl.atomic_xchg(cell_ptr + row, tl.full([], -9223372036854775808, dtype=tl.int64))
            index = low_mask - (final & low_mask)
            tl.store(out_ptr + row, index)
            tl.store(count_ptr + row, 0)
            if WITH_PROB:  # combine the chunks' states, read past L1 (other SMs wrote them)
                cc = tl.arange(0, CHUNKS)
                here = part_ptr + row * num_chunks + cc
                c_m = tl.load(here, mask=cc < num_chunks, other=-float("inf"), cache_modifier=".cg")
                c_s = tl.load(here + part_n, mask=cc < num_chunks, other=0.0, cache_modifier=".cg")
                r_top, r_sum, r_nan = _softmax_state(c_m, c_s, (c_m != c_m).to(tl.int32))
                tl.store(p_ptr + row * p_stride, _top_probability(r_top, r_sum, r_nan))
            if WITH_GAP:  # combine the chunks' top two values (missing chunks: -inf, which never counts)
                cc = tl.arange(0, CHUNKS)
                here = part_ptr + 2 * part_n + row * num_chunks + cc
                c_t1 = tl.load(here, mask=cc < num_chunks, other=-float("inf"), cache_modifier=".cg")
                c_t2 = tl.load(here + part_n, mask=cc < num_chunks, other=-float("inf"), cache_modifier=".cg")
                r_top, r_second = _top_two(c_t1, c_t2, cc, CHUNKS)
                tl.store(g_ptr + row * g_stride, _top_gap(r_top, r_second, (final >> 32) == 0x7FFFFFFF))


# --------------------------------------------------------------------------------------
# Wrapper
# --------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _tiles_per_program(T: int, V: int, device: torch.device, block: int) -> int:
    """Tiles of ``block`` elements per program, for about four programs per SM. On an H200 at
    V = 49152 (bf16 and fp32) this was within 0.1 us of the best power-of-two tiling for T <= 64
    and within 4% for T = 300 and 2048."""
    if device.type == "cuda":
        sms = _num_sms(device.index if device.index is not None else torch.cuda.current_device())
    else:
        sms = DEFAULT_NUM_SMS
    chunks_wanted = max(1, triton.cdiv(4 * sms, T))
    return min(MAX_TILES, triton.next_power_of_2(triton.cdiv(triton.cdiv(V, block), chunks_wanted)))


def _check(logits: torch.Tensor, out: torch.Tensor | None) -> tuple[int, int]:
    return check_row_logits(logits, out, kernel="argmax_triton", result="argmax", columns="indices",
                            out_dtype=torch.int64, contiguous_out=True)


def argmax_triton(logits: torch.Tensor, out: torch.Tensor | None = None, *, top_out: torch.Tensor | None = None,
                  gap_out: torch.Tensor | None = None, tiles: int | None = None, block: int = BLOCK) -> torch.Tensor:
    """First index of each row's maximum of ``logits`` [T, V] (float32/bfloat16/float16, unit
    stride on V, any row stride) as int64 [T], equal to ``torch.argmax(logits, dim=-1)``.

    Writes into ``out`` (int64 [T], contiguous) when given and returns it. ``top_out`` (float32 [T], any
    stride: e.g. one slot's column of a [rows, slots] buffer): also write each row's top softmax probability
    there, :func:`kernels.top_probability.top_probability_reference` up to rounding (NaN where it is), in the
    same pass over the logits (each chunk keeps an online softmax state; the row's last program combines them).
    ``gap_out`` (float32 [T], any stride; needs V >= 2): also write each row's largest value minus its second
    largest there, :func:`top_gap_reference` bitwise (NaN and inf where it has them), in the same pass (each
    chunk keeps its top two values). ``top_out`` and ``gap_out`` may be given together or alone.
    Reads nothing on the host and allocates nothing but ``out`` (and, on first use or for more rows, the
    workspace: see the module docstring), so it can be captured in a CUDA graph.
    block, tiles: elements per tile and tiles per program (powers of two; tests use small ones to
    split short rows); tiles defaults by the row count and the SM count.
    """
    T, V = _check(logits, out)
    if top_out is not None:
        check_row_logits(logits, top_out, kernel="argmax_triton", result="top probability",
                         columns="column offsets", out_dtype=torch.float32, contiguous_out=False)
    if gap_out is not None:
        check_row_logits(logits, gap_out, kernel="argmax_triton", result="top-2 gap",
                         columns="column offsets", out_dtype=torch.float32, contiguous_out=False)
        if V < 2:
            raise ValueError(f"argmax_triton's gap_out needs at least 2 columns (a largest and a second largest "
                             f"value), got logits of shape {tuple(logits.shape)}")
    if out is None:
        out = torch.empty(T, dtype=torch.int64, device=logits.device)
    if T == 0:
        return out
    block = power_of_two("block", block, 16)
    tiles = _tiles_per_program(T, V, logits.device, block) if tiles is None else power_of_two("tiles", tiles, 1)
    while triton.cdiv(V, tiles * block) > _MAX_GRID_Y:
        tiles *= 2
    num_chunks = triton.cdiv(V, tiles * block)
    single = num_chunks == 1
    with_prob = top_out is not None
    with_gap = gap_out is not None
    states = with_prob or with_gap
    if single:
        cells, counts, parts = out, out, out  # never dereferenced
    else:
        ws = _workspace(logits.device, T, T * num_chunks if states else 0)
        cells, counts, parts = ws.cells, ws.counts, ws.partials
    p_out, p_stride = (top_out, top_out.stride(0)) if with_prob else (out, 0)
    g_out, g_stride = (gap_out, gap_out.stride(0)) if with_gap else (out, 0)
    part_n = parts.shape[1] if (states and not single) else 0
    _argmax_kernel[(T, num_chunks)](logits, out, cells, counts, p_out, p_stride, g_out, g_stride, parts, part_n, V,
                                    logits.stride(0), num_chunks, TILES=tiles, BLOCK=block, SINGLE=single,
                                    WITH_PROB=with_prob, WITH_GAP=with_gap, CHUNKS=triton.next_power_of_2(num_chunks),
                                    num_warps=4)
    return out
