"""Profiled step-cost table T(batch_size, M) for the verify-budget planner (torch-free).

Form (TensorRT-LLM's): T(bs, M) = fixed_overhead_ms + batch_overhead_ms(bs) + theta_ms(M)
where M counts ALL tokens submitted to the target in the step, one anchor/bonus token
per request included: M = sum_r (verify_len_r + 1).

Lookups:
 - theta at M steps UP to the smallest measured token count >= M: the engine pads a step
   up to the next captured token bucket, so a step of M tokens costs what the bucket
   costs; linear interpolation would promise savings that padding takes back.
 - M above the largest measured count is refused (the planner would be optimising
   against a guess) unless ``extrapolate=True``, which extends the last measured slope.
 - batch overhead: the smallest listed batch size >= bs, or the last one.
 - trim overhead (same staircase): what a TRIMMED step costs beyond an untrimmed one of the same
   tokens. On captured steps an untrimmed step is one fused draft+verify graph while a trimmed
   one runs a draft graph and a separately sized verify graph; the planner adds this to every
   plan that trims, so a trim must save more than the path switch costs.

The table carries a fingerprint of where it was measured; ``check_fingerprint`` refuses
a table from another device, driver, software stack, model, drafter or dtype.
:func:`fingerprint_digest` hashes the checked fields (the name a cached table is filed under).

Fit. :func:`fit_cost_table` fits the form to the medians of the measurements by least squares.
When the unconstrained solution prices some (batch size, M) pair below zero (a negative fixed
overhead once the constants are moved into it; medians of different batch sizes that disagree
do this, often at pairs no step can reach, such as M below the batch size), the table is the
bounded least-squares fit instead (fixed, every alpha and every theta >= 0;
``scipy.optimize.lsq_linear``). Either way the table carries a :class:`FitQuality`: R^2, the
residuals, whether the bound was active, and, once a profiler has checked it against its
thresholds, whether it passed. ``profile_settings`` records the settings it was measured with.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:
    import numpy as np

FORMAT_VERSION = 1
# Fingerprint fields that must agree for a table to describe this run's step cost.
# step_path: eager, graphs or graphs+overlap steps cost differently (a graph replay has no host work).
# step_timing: how a device-resident step's time was taken. "step-call": the wall time of the step()
# call that committed it, the pipeline's period. A graph-path table without it timed only the launch
# and the commit, which leaves out the host's work between them (on the H200 such tables price
# batch-256 steps 0.8-1.1 ms low, trimmed ones most): it is refused here and must be re-profiled.
CHECKED_FINGERPRINT_FIELDS = ("device_name", "driver", "torch", "triton", "model", "drafter", "dtype", "step_path",
                              "kernels", "step_timing")
OPTIONAL_FINGERPRINT_FIELDS = ("hostname",)


class CostTableError(ValueError):
    """A cost table is malformed, does not cover a lookup, or was measured elsewhere."""


class CostTableMismatchError(CostTableError):
    """The table's fingerprint differs from the current run's in the named fields."""


class CostTableFileError(CostTableError):
    """A cost table file cannot be read as a cost table (torn, hand-edited, not JSON, missing keys)."""

    def __init__(self, path: str | Path, problem: str, hint: str | None = None) -> None:
        self.path, self.problem = str(path), problem
        self.hint = hint or (f"Delete it and re-profile: a table cached under paths.cost_tables is re-profiled by "
                             f"the next A/B run; one given as engine.cost_table is made again with "
                             f"`python -m runners.profile out={path}`")
        super().__init__(f"cost table {path}: {problem}. {self.hint}")

    def __reduce__(self):  # picklable with its arguments (launchers ship exceptions between processes)
        return (type(self), (self.path, self.problem, self.hint))


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class FitQuality:
    """How well the additive form fits the per-(batch size, M) medians it was fitted to.

    Residuals are measured minus fitted, in ms, over the fitted cells. ``bounded``: the
    unconstrained least squares priced some pair below zero (its fixed overhead is
    ``unbounded_fixed_overhead_ms`` < 0) and the table is the bounded fit. ``passed`` is None
    until a profiler checks the fit (:meth:`checked`), then records the outcome together with
    the thresholds it was checked against.
    """

    cells: int  # (batch size, M) medians fitted
    parameters: int  # free parameters of the additive form (fixed, alphas, thetas less the gauge)
    r2: float  # 1 - residual sum of squares / total sum of squares of the medians
    rms_residual_ms: float
    max_abs_residual_ms: float
    max_rel_residual: float  # the largest |residual| / median over the cells
    worst_cell: tuple[int, int]  # (batch size, M) of max_rel_residual
    bounded: bool
    unbounded_fixed_overhead_ms: float
    passed: bool | None = None
    min_r2: float | None = None  # the thresholds ``passed`` was decided with
    max_rel_residual_allowed: float | None = None

    def __post_init__(self) -> None:
        if not (_is_int(self.cells) and _is_int(self.parameters) and self.cells >= 1 and self.parameters >= 1):
            raise CostTableError(f"fit: cells and parameters must be integers >= 1, got {self.cells!r}, "
                                 f"{self.parameters!r}")
        for name in ("r2", "rms_residual_ms", "max_abs_residual_ms", "max_rel_residual",
                     "unbounded_fixed_overhead_ms"):
            if not _finite(getattr(self, name)):
                raise CostTableError(f"fit: {name} must be a finite number, got {getattr(self, name)!r}")
        cell = tuple(self.worst_cell)
        if len(cell) != 2 or not all(_is_int(x) for x in cell):
            raise CostTableError(f"fit: worst_cell must be (batch size, M), got {self.worst_cell!r}")
        object.__setattr__(self, "worst_cell", cell)

    def problems(self, min_r2: float, max_rel_residual: float) -> list[str]:
        """What fails the thresholds, one phrase each (empty: the fit passes)."""
        out = []
        if self.r2 < min_r2:
            out.append(f"R^2 = {self.r2:.3f} is below min_r2 = {min_r2}")
        if self.max_rel_residual > max_rel_residual:
            b, m = self.worst_cell
            out.append(f"the median at batch {b}, M={m} is {self.max_rel_residual:.0%} off the fitted cost, above "
                       f"max_rel_residual = {max_rel_residual:.0%}")
        return out

    def checked(self, min_r2: float, max_rel_residual: float) -> "FitQuality":
        """A copy recording whether the fit passes these thresholds, and the thresholds."""
        return dataclasses.replace(self, passed=not self.problems(min_r2, max_rel_residual), min_r2=float(min_r2),
                                   max_rel_residual_allowed=float(max_rel_residual))

    def describe(self) -> str:
        """One line: R^2, the worst relative residual and where, whether the bound was active."""
        b, m = self.worst_cell
        text = (f"R^2 {self.r2:.4f}, largest residual {self.max_rel_residual:.1%} (batch {b}, M={m}), "
                f"rms {self.rms_residual_ms:.3g} ms over {self.cells} cells")
        if self.bounded:
            text += f", bounded fit (unconstrained fixed overhead {self.unbounded_fixed_overhead_ms:.3f} ms)"
        if self.passed is not None:
            text += ", quality check " + ("passed" if self.passed else "FAILED")
        return text

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "worst_cell": list(self.worst_cell)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FitQuality":
        if not isinstance(d, Mapping):
            raise CostTableError(f"fit must be an object, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise CostTableError(f"fit: unknown keys {sorted(unknown)}; allowed: {sorted(known)}")
        try:
            return cls(**{**d, "worst_cell": tuple(d.get("worst_cell", ()))})
        except TypeError as e:
            raise CostTableError(f"fit: {e}") from None


@dataclass(frozen=True)
class CostTable:
    """Immutable step-cost table; the constructor checks every invariant."""

    token_counts: tuple[int, ...]  # M, bonus tokens included, strictly ascending
    theta_ms: tuple[float, ...]  # token-dependent cost at each M, >= 0
    fixed_overhead_ms: float = 0.0  # per-step cost that no trim can remove
    batch_sizes: tuple[int, ...] | None = None  # staircase of the per-batch-size overhead
    batch_overhead_ms: tuple[float, ...] | None = None
    fingerprint: Mapping[str, str] = field(default_factory=dict)
    trim_overhead_ms: tuple[float, ...] | None = None  # per batch_sizes entry (None: no extra cost measured)
    fit: FitQuality | None = None  # how well the form fits the medians (None: not fitted, e.g. written by hand)
    profile_settings: Mapping[str, Any] | None = None  # the settings it was measured with (JSON values)
    source: str | None = field(default=None, compare=False, repr=False)  # the file it was loaded from, if any

    def __post_init__(self) -> None:
        tc = tuple(self.token_counts)
        th = tuple(self.theta_ms)
        if not tc:
            raise CostTableError("token_counts is empty; profile at least one token count")
        if not all(_is_int(m) and m >= 1 for m in tc):
            raise CostTableError(f"token_counts must be positive integers, got {list(tc)}")
        bad = [(tc[i], tc[i + 1]) for i in range(len(tc) - 1) if tc[i + 1] <= tc[i]]
        if bad:
            raise CostTableError(f"token_counts must be strictly ascending; out of order pairs {bad} in {list(tc)}")
        if len(th) != len(tc):
            raise CostTableError(f"theta_ms has {len(th)} values but token_counts has {len(tc)}: {list(th)} vs {list(tc)}")
        if not all(_finite(t) and t >= 0.0 for t in th):
            raise CostTableError(f"theta_ms must be finite and >= 0 (no NaN), got {list(th)}")
        if not (_finite(self.fixed_overhead_ms) and self.fixed_overhead_ms >= 0.0):
            raise CostTableError(f"fixed_overhead_ms must be finite and >= 0, got {self.fixed_overhead_ms!r}")
        bs, bo = self.batch_sizes, self.batch_overhead_ms
        if (bs is None) != (bo is None):
            raise CostTableError(f"batch_sizes and batch_overhead_ms come together; got batch_sizes={bs!r}, "
                                 f"batch_overhead_ms={bo!r}")
        if bs is not None:
            bs, bo = tuple(bs), tuple(bo)
            if not bs or not all(_is_int(b) and b >= 1 for b in bs):
                raise CostTableError(f"batch_sizes must be non-empty positive integers, got {list(bs)}")
            if any(bs[i + 1] <= bs[i] for i in range(len(bs) - 1)):
                raise CostTableError(f"batch_sizes must be strictly ascending, got {list(bs)}")
            if len(bo) != len(bs):
                raise CostTableError(f"batch_overhead_ms has {len(bo)} values but batch_sizes has {len(bs)}: "
                                     f"{list(bo)} vs {list(bs)}")
            if not all(_finite(o) and o >= 0.0 for o in bo):
                raise CostTableError(f"batch_overhead_ms must be finite and >= 0 (no NaN), got {list(bo)}")
        to = self.trim_overhead_ms
        if to is not None:
            to = tuple(to)
            if bs is None or len(to) != len(bs):
                raise CostTableError(f"trim_overhead_ms needs one value per batch_sizes entry; got {list(to)} for "
                                     f"batch_sizes={bs!r}")
            if not all(_finite(o) and o >= 0.0 for o in to):
                raise CostTableError(f"trim_overhead_ms must be finite and >= 0 (no NaN), got {list(to)}")
        fp = dict(self.fingerprint)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in fp.items()):
            raise CostTableError(f"fingerprint must map str -> str, got {fp!r}")
        if self.fit is not None and not isinstance(self.fit, FitQuality):
            raise CostTableError(f"fit must be a FitQuality or None, got {type(self.fit).__name__}")
        settings = self.profile_settings
        if settings is not None:
            if not isinstance(settings, Mapping):
                raise CostTableError(f"profile_settings must be a mapping or None, got {type(settings).__name__}")
            try:  # stored as their JSON values, so a table equals itself read back from its file
                settings = MappingProxyType(json.loads(json.dumps(dict(settings), sort_keys=True)))
            except (TypeError, ValueError) as e:
                raise CostTableError(f"profile_settings must hold JSON values ({e})") from None
        object.__setattr__(self, "token_counts", tc)
        object.__setattr__(self, "theta_ms", tuple(float(t) for t in th))
        object.__setattr__(self, "fixed_overhead_ms", float(self.fixed_overhead_ms))
        object.__setattr__(self, "batch_sizes", bs)
        object.__setattr__(self, "batch_overhead_ms", None if bo is None else tuple(float(o) for o in bo))
        object.__setattr__(self, "trim_overhead_ms", None if to is None else tuple(float(o) for o in to))
        object.__setattr__(self, "fingerprint", MappingProxyType(fp))
        object.__setattr__(self, "profile_settings", settings)
        cheapest = self.cheapest_step_ms
        if cheapest <= 0.0:
            raise CostTableError(f"a step cannot be free: the cheapest step the table prices (fixed_overhead_ms "
                                 f"{self.fixed_overhead_ms} + batch overhead + theta at a token count a batch of that "
                                 f"size can send) is {cheapest} ms; it must be > 0")

    # ---- lookups -------------------------------------------------------------------------

    @property
    def max_tokens(self) -> int:
        return self.token_counts[-1]

    @functools.cached_property
    def cheapest_step_ms(self) -> float:
        """The cheapest step the table can price: over batch sizes b, fixed + batch overhead(b) + theta at
        the cheapest measured count M >= b (a batch of b requests sends at least b tokens). A pair with
        M < b is not a step, so its price does not count."""
        tc, th = self.token_counts, self.theta_ms

        def cheapest_theta(min_tokens: int) -> float:
            return min([t for m, t in zip(tc, th) if m >= min_tokens] or [th[-1]])

        if self.batch_sizes is None:
            return self.fixed_overhead_ms + min(th)
        # Listed size i prices the batch sizes above the previous listed one (the first: from 1).
        lowest = (1, *(b + 1 for b in self.batch_sizes[:-1]))
        return min(self.fixed_overhead_ms + o + cheapest_theta(lo) for lo, o in zip(lowest, self.batch_overhead_ms))

    def theta_at(self, num_tokens: int, *, extrapolate: bool = False) -> float:
        """theta at M tokens, stepping up to the next measured count (see module docstring)."""
        if not _is_int(num_tokens) or num_tokens < 1:
            raise CostTableError(f"token count must be an integer >= 1 (bonus tokens included), got {num_tokens!r}")
        tc = self.token_counts
        if num_tokens > tc[-1]:
            if not extrapolate:
                raise CostTableError(
                    f"M={num_tokens} tokens is above the table's largest measured count {tc[-1]}; profile up to "
                    f"max_num_seqs * (block + 1) tokens, or pass extrapolate=True to extend the last slope")
            return self._beyond_table(num_tokens)
        lo, hi = 0, len(tc) - 1
        while lo < hi:  # smallest index with tc[i] >= num_tokens
            mid = (lo + hi) // 2
            if tc[mid] >= num_tokens:
                hi = mid
            else:
                lo = mid + 1
        return self.theta_ms[lo]

    def _beyond_table(self, num_tokens):
        """theta above the largest measured count (an int, or an int array): the last slope extended, never below
        flat; with one measured count, proportional to M."""
        tc, th = self.token_counts, self.theta_ms
        if len(tc) == 1:
            return th[0] * num_tokens / tc[0]
        slope = max(0.0, (th[-1] - th[-2]) / (tc[-1] - tc[-2]))
        return th[-1] + slope * (num_tokens - tc[-1])

    def _staircase(self, values: tuple[float, ...] | None, batch_size: int) -> float:
        """The value at the smallest listed batch size >= batch_size, or the last one; 0 if none listed."""
        if not _is_int(batch_size) or batch_size < 1:
            raise CostTableError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if values is None:
            return 0.0
        for b, o in zip(self.batch_sizes, values):
            if b >= batch_size:
                return o
        return values[-1]

    def batch_overhead(self, batch_size: int) -> float:
        """Staircase lookup: the smallest listed batch size >= batch_size, or the last listed one."""
        return self._staircase(self.batch_overhead_ms, batch_size)

    def trim_overhead(self, batch_size: int) -> float:
        """Extra cost of a trimmed step at this batch size (staircase as :meth:`batch_overhead`; 0 if unmeasured)."""
        return self._staircase(self.trim_overhead_ms, batch_size)

    def step_ms(self, num_tokens: int, batch_size: int, *, extrapolate: bool = False, trimmed: bool = False) -> float:
        """Predicted step time for M = num_tokens submitted tokens (bonus included) over batch_size requests;
        ``trimmed``: the step verifies less than the full block somewhere (adds :meth:`trim_overhead`)."""
        return (self.fixed_overhead_ms + self.batch_overhead(batch_size) + self.theta_at(num_tokens, extrapolate=extrapolate)
                + (self.trim_overhead(batch_size) if trimmed else 0.0))

    def step_ms_many(self, num_tokens: "np.ndarray", batch_size: int, *, extrapolate: bool = False,
                     trimmed: bool = False) -> "np.ndarray":
        """:meth:`step_ms` over an integer array of token counts (float64, the same values)."""
        import numpy as np

        m = np.asarray(num_tokens, dtype=np.int64)
        if m.size and int(m.min()) < 1:
            raise CostTableError(f"token counts must be integers >= 1 (bonus tokens included), got min {int(m.min())}")
        tc, th = self._arrays
        above = m > tc[-1]
        if above.any() and not extrapolate:
            raise CostTableError(
                f"M={int(m.max())} tokens is above the table's largest measured count {tc[-1]}; profile up to "
                f"max_num_seqs * (block + 1) tokens, or pass extrapolate=True to extend the last slope")
        theta = th[np.minimum(np.searchsorted(tc, m, side="left"), len(tc) - 1)]
        if above.any():
            theta = theta.copy()
            theta[above] = self._beyond_table(m[above])
        return self.fixed_overhead_ms + self.batch_overhead(batch_size) + theta + (
            self.trim_overhead(batch_size) if trimmed else 0.0)

    @functools.cached_property
    def _arrays(self) -> "tuple[np.ndarray, np.ndarray]":
        """token_counts (int64) and theta_ms (float64) as arrays, made once: the planner prices every step."""
        import numpy as np

        return np.asarray(self.token_counts, dtype=np.int64), np.asarray(self.theta_ms, dtype=np.float64)

    def is_flat(self, rel_tol: float = 0.02) -> bool:
        """True when theta varies by at most rel_tol of the cheapest step: trimming would look free.

        Measured relative to the cheapest step (:attr:`cheapest_step_ms`) rather than to
        theta alone, because a fitted theta may be 0 at the smallest count.
        """
        if rel_tol < 0:
            raise CostTableError(f"rel_tol must be >= 0, got {rel_tol}")
        _, th = self._arrays
        return float(th.max() - th.min()) <= rel_tol * self.cheapest_step_ms

    # ---- serialisation --------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "token_counts_include_bonus": True,
            "token_counts": list(self.token_counts),
            "theta_ms": list(self.theta_ms),
            "fixed_overhead_ms": self.fixed_overhead_ms,
            "batch_sizes": None if self.batch_sizes is None else list(self.batch_sizes),
            "batch_overhead_ms": None if self.batch_overhead_ms is None else list(self.batch_overhead_ms),
            "trim_overhead_ms": None if self.trim_overhead_ms is None else list(self.trim_overhead_ms),
            "fingerprint": dict(self.fingerprint),
            **({} if self.fit is None else {"fit": self.fit.to_dict()}),
            **({} if self.profile_settings is None else {"profile_settings": dict(self.profile_settings)}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CostTable":
        if not isinstance(d, Mapping):
            raise CostTableError(f"cost table JSON must be an object, got {type(d).__name__}")
        known = {"format_version", "token_counts_include_bonus", "token_counts", "theta_ms", "fixed_overhead_ms",
                 "batch_sizes", "batch_overhead_ms", "trim_overhead_ms", "fingerprint", "fit", "profile_settings"}
        unknown = set(d) - known
        if unknown:
            raise CostTableError(f"cost table: unknown keys {sorted(unknown)}; allowed: {sorted(known)}")
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise CostTableError(f"cost table format_version {version!r} is not {FORMAT_VERSION}; re-profile")
        if d.get("token_counts_include_bonus") is not True:
            raise CostTableError("cost table must declare token_counts_include_bonus: true (M counts one bonus token "
                                 f"per request); got {d.get('token_counts_include_bonus')!r}")
        for key in ("token_counts", "theta_ms"):
            if key not in d:
                raise CostTableError(f"cost table: missing required key {key!r}")
        bs, bo = d.get("batch_sizes"), d.get("batch_overhead_ms")
        try:
            return cls(token_counts=tuple(d["token_counts"]), theta_ms=tuple(d["theta_ms"]),
                       fixed_overhead_ms=d.get("fixed_overhead_ms", 0.0),
                       batch_sizes=None if bs is None else tuple(bs),
                       batch_overhead_ms=None if bo is None else tuple(bo),
                       fingerprint=dict(d.get("fingerprint") or {}),
                       trim_overhead_ms=None if d.get("trim_overhead_ms") is None else tuple(d["trim_overhead_ms"]),
                       fit=None if d.get("fit") is None else FitQuality.from_dict(d["fit"]),
                       profile_settings=d.get("profile_settings"))
        except (TypeError, ValueError) as e:
            if isinstance(e, CostTableError):
                raise
            raise CostTableError(f"cost table: a value has the wrong type ({e})") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "CostTable":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise CostTableError(f"cost table: not valid JSON ({e})") from e
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        from dspark.atomic import atomic_write_text

        atomic_write_text(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "CostTable":
        """The table in ``path``; a :class:`CostTableFileError` naming the file (and saying to delete it and
        re-profile) when it is not a valid cost table."""
        p = Path(path)
        if not p.is_file():
            raise CostTableError(f"cost table file {str(p)!r} does not exist; run the profiler to create it")
        try:
            table = cls.from_json(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise CostTableFileError(p, f"not text ({e})") from None
        except CostTableError as e:
            raise CostTableFileError(p, re.sub(r"^cost table:?\s*", "", str(e))) from None
        return dataclasses.replace(table, source=str(p))

    # ---- provenance -----------------------------------------------------------------------

    def check_fingerprint(self, current: Mapping[str, str], override: bool = False) -> list[str]:
        """Compare the checked fields with ``current``; raise on any difference unless override.

        A field recorded on one side only counts as a mismatch. Returns the mismatch
        descriptions (empty when everything agrees), so an override can be logged.
        """
        mismatches = []
        for key in CHECKED_FINGERPRINT_FIELDS:
            mine, theirs = self.fingerprint.get(key), current.get(key)
            if mine is None and theirs is None:
                continue
            if mine != theirs:
                mismatches.append(f"{key}: table={mine!r} current={theirs!r}")
        if mismatches and not override:
            where = f" {self.source}" if self.source else ""
            raise CostTableMismatchError(
                f"cost table{where} was measured on a different setup (" + "; ".join(mismatches) + "); re-profile "
                "on this setup (`python -m runners.profile`, or leave engine.cost_table unset in runners.ab to "
                "profile this node), or set engine.allow_foreign_cost_table=true if you know the step cost is the "
                "same")
        return mismatches


def derive_tier_ladder(table: CostTable, block: int, *, batch_size: int, rel_tol: float = 0.02) -> list[int]:
    """Verify-length tiers at the right edges of theta's flat shelves, for a uniform batch.

    A shelf is a run of consecutive measured counts whose theta stays within rel_tol of
    (fixed + theta at the shelf's first count). Within a shelf, a step costs the same,
    so only its right edge M_edge is worth a graph. With batch_size requests each
    verifying v drafts, M = batch_size * (v + 1), so the edge maps to the largest v whose
    M fits: v = M_edge // batch_size - 1. Values outside [1, block] are dropped; block
    (the no-trim baseline) is always included. Returns ascending distinct lengths.
    """
    if block < 1:
        raise CostTableError(f"block must be >= 1, got {block}")
    if not _is_int(batch_size) or batch_size < 1:
        raise CostTableError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    tc, th = table.token_counts, table.theta_ms
    edges = []
    start = 0
    for i in range(1, len(tc) + 1):
        if i == len(tc) or abs(th[i] - th[start]) > rel_tol * (table.fixed_overhead_ms + th[start]):
            edges.append(tc[i - 1])
            start = i
    tiers = {block}
    for edge in edges:
        v = edge // batch_size - 1
        if 1 <= v <= block:
            tiers.add(v)
    return sorted(tiers)


def fingerprint_digest(fingerprint: Mapping[str, Any]) -> str:
    """12 hex digits of SHA-256 over the checked fingerprint fields: equal for two setups that
    :meth:`CostTable.check_fingerprint` accepts for each other, different otherwise."""
    import hashlib

    checked = {k: fingerprint.get(k) for k in CHECKED_FINGERPRINT_FIELDS}
    return hashlib.sha256(json.dumps(checked, sort_keys=True).encode()).hexdigest()[:12]


def fit_cost_table(measurements: Iterable[Sequence[float]], *, fingerprint: Mapping[str, str] | None = None) -> CostTable:
    """Fit T(bs, M) = fixed + alpha(bs) + theta(M) to (batch_size, M, ms) measurements.

    Repeats of one (bs, M) key are reduced to their median (warm-up steps must already be
    dropped by the caller). The additive form is fitted by least squares on the medians, then
    put in a canonical gauge: min theta = 0 and min alpha = 0, the removed constants going into
    fixed_overhead_ms, so predictions are unchanged. When that leaves the fixed overhead below
    zero, the fit is the bounded least squares one instead (see the module docstring). The
    table's ``fit`` records R^2, the residuals and whether the bound was active. The design must
    connect every batch size to every token count through shared keys (e.g. one M measured at
    two batch sizes); otherwise alpha and theta are not separable and this raises.
    """
    import numpy as np  # local: the table itself stays dependency-free
    from scipy.optimize import lsq_linear

    groups: dict[tuple[int, int], list[float]] = {}
    for row in measurements:
        if len(row) != 3:
            raise CostTableError(f"each measurement is (batch_size, M, ms); got {row!r}")
        bs, m, ms = row
        if not (_is_int(bs) and bs >= 1 and _is_int(m) and m >= 1):
            raise CostTableError(f"batch_size and M must be integers >= 1; got {row!r}")
        if not (_finite(ms) and ms > 0):
            raise CostTableError(f"measured ms must be finite and > 0; got {row!r}")
        groups.setdefault((bs, m), []).append(float(ms))
    if not groups:
        raise CostTableError("no measurements to fit")
    keys = sorted(groups)
    med = np.array([statistics.median(groups[k]) for k in keys])
    bss = sorted({k[0] for k in keys})
    ms_ = sorted({k[1] for k in keys})
    rows = np.arange(len(keys))
    b_of = np.array([bss.index(b) for b, _ in keys])
    m_of = np.array([ms_.index(m) for _, m in keys])
    # One column per component: fixed, alpha(bs) for every bs, theta(M) for every M. Two of them
    # are redundant (a constant moves freely between fixed, alpha and theta); the unconstrained
    # fit drops alpha(bss[0]) and theta(ms_[0]) to be identifiable.
    full = np.zeros((len(keys), 1 + len(bss) + len(ms_)))
    full[:, 0] = 1.0
    full[rows, 1 + b_of] = 1.0
    full[rows, 1 + len(bss) + m_of] = 1.0
    free = np.ones(full.shape[1], dtype=bool)
    free[[1, 1 + len(bss)]] = False
    reduced = full[:, free]
    if np.linalg.matrix_rank(reduced) < reduced.shape[1]:
        raise CostTableError(
            f"measurements at batch sizes {bss} and token counts {ms_} do not separate the batch overhead from "
            "theta; measure some token count at more than one batch size (e.g. sweep verify lengths at each batch size)")
    coef = np.zeros(full.shape[1])
    coef[free] = np.linalg.lstsq(reduced, med, rcond=None)[0]

    def canonical(x: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        alpha, theta = x[1:1 + len(bss)], x[1 + len(bss):]
        return float(x[0] + alpha.min() + theta.min()), alpha - alpha.min(), theta - theta.min()

    unbounded_fixed, alpha, theta = canonical(coef)
    bounded = unbounded_fixed < -1e-9 * float(med.max())  # below the rounding residue of the gauge shift
    if bounded:
        # Every component >= 0 is exactly "no (bs, M) pair priced below zero" (fixed + min alpha + min theta >= 0).
        solution = lsq_linear(full, med, bounds=(0.0, np.inf), method="bvls")
        if not solution.success:
            raise CostTableError(f"the bounded least-squares fit did not converge ({solution.message}); medians "
                                 f"{dict(zip(keys, med.tolist()))}")
        fixed, alpha, theta = canonical(solution.x)
    else:
        fixed = unbounded_fixed
    fixed = max(fixed, 0.0)
    predicted = fixed + alpha[b_of] + theta[m_of]
    residual = med - predicted
    total = float(((med - med.mean()) ** 2).sum())
    rss = float((residual ** 2).sum())
    rel = np.abs(residual) / med
    worst = int(rel.argmax())
    quality = FitQuality(cells=len(keys), parameters=int(reduced.shape[1]),
                         r2=(1.0 - rss / total) if total > 0 else (1.0 if rss == 0 else 0.0),
                         rms_residual_ms=float(np.sqrt(rss / len(keys))),
                         max_abs_residual_ms=float(np.abs(residual).max()), max_rel_residual=float(rel[worst]),
                         worst_cell=keys[worst], bounded=bool(bounded), unbounded_fixed_overhead_ms=unbounded_fixed)
    try:
        return CostTable(token_counts=tuple(ms_), theta_ms=tuple(theta.tolist()), fixed_overhead_ms=fixed,
                         batch_sizes=tuple(bss), batch_overhead_ms=tuple(alpha.tolist()),
                         fingerprint=dict(fingerprint or {}), fit=quality)
    except CostTableError as e:
        raise CostTableError(f"the measurements are not additive in (batch size, tokens): the closest fit prices "
                             f"a step at no cost ({e}); medians {dict(zip(keys, med.tolist()))}") from None


__all__ = ["FORMAT_VERSION", "CHECKED_FINGERPRINT_FIELDS", "CostTableError", "CostTableMismatchError",
           "CostTableFileError", "CostTable", "FitQuality", "derive_tier_ladder", "fingerprint_digest",
           "fit_cost_table"]
