"""Profile the step-cost table T(batch_size, M) that the verify-budget planner optimises against.

    from dspark.profiler import ProfileSettings, find_or_profile, plot_cost_curve, profile_engine
    settings = ProfileSettings(batch_sizes=(1, 4, 16), measure_steps=6, time_budget_s=600)
    result = profile_engine(engine, **settings.profile_kwargs(), progress=True)
    result.table.save("cost_tables/x.json")
    obtained = find_or_profile(engine, "cost_tables", settings)  # the cached table, or a new profile

Method. For every forced verify length v (default 0..block) an engine sharing the given
engine's target, drafter and tokenizer is built with ``verify="uniform"`` and
``force_verify_len=v``: the drafter still drafts the WHOLE block every step and only the
number of drafted tokens sent to the target changes. (Shrinking the drafted block instead
would make short verify lengths look cheaper than they are in a real run, which drafts the
full block before deciding, and the planner would over-trim.) For every batch size B, B
requests of seeded random token ids are submitted with ``ignore_eos`` and stepped until all
of them decode together; the first ``warmup_steps`` decode-only steps are dropped and the
next ``measure_steps`` decode-only steps (no prefill in the step, all B requests decoding)
are recorded as (B, M = B * (v + 1), step_ms). The medians per (B, M) are fitted with
:func:`dspark.cost_table.fit_cost_table`. On device-resident steps ``step_ms`` is the wall time of
the ``step()`` call that committed the step (``StepInfo.step_ms``): with the overlap scheduler that
is the pipeline's steady period, the host's planning and page-table work included.

The trim overhead. On captured steps (``engine.cuda_graphs``) a step that verifies the full
block runs one fused draft+verify graph; a trimmed step (v < block) runs a draft graph and a
verify graph sized to its tokens, which can cost more than its tokens explain. So every batch
size is also measured at the full block on the trimmed path (``engine.force_trimmed_path``):
the difference to the fused full step is the
table's ``trim_overhead_ms`` (clamped at 0), it is taken out of the v < block medians before
the fit (theta then prices tokens only) and the planner adds it back to every plan that trims.
Without it, a table fitted across both paths (and its monotone envelope) makes a one-position
trim look cheaper than the full block when it costs more. Eager steps run the same code trimmed
or not: there nothing is measured and the table carries no trim overhead.

Refusals. A table that could mislead the planner is refused with a :class:`ProfileRefusedError`
that says what to change, and nothing is saved:

- :class:`ProfileFlatError`: step times that do not grow with M, or a flat theta (every trim
  would look free);
- :class:`ProfileFitError`: a cell far above linear growth in its tokens (another job on the
  machine), theta at some M above a larger M's by more than ``max_drop_rel`` (with
  ``monotone="refuse"``), medians the additive form cannot separate, or a fit that fails the
  quality check: R^2 below ``min_r2`` or a median further than ``max_rel_residual`` from the
  fitted cost. A fit that passes is recorded in the table (``CostTable.fit``, ``passed=True``).

A sweep that runs, or is projected to run, past ``time_budget_s`` stops with a
:class:`ProfileBudgetError` (the projection is checked after every verify length, once all
batch sizes at it are measured). ``progress=True`` shows one bar over the sweep's
(verify length, batch size) configurations.

Settings and cache. :class:`ProfileSettings` holds every setting that decides a table; runners
read it from one config schema (``runners.schema.CostProfileSchema``: top level in
runners.profile, ``ab.profile`` in runners.ab) and the table records it (``profile_settings``).
:func:`cost_table_path_for` names the file after the model, the dtype, the digest of the
fingerprint's checked fields and a digest of the settings. :func:`find_or_profile` reuses that
file when its fingerprint matches, its fit passed the quality check and it was measured with
these settings; otherwise it profiles, saves the table and the PNG of the measured curve beside
it (``<name>.png``), and returns an :class:`ObtainedTable` saying which happened. A refused
profile leaves its curve beside where the table would have been (``<name>.refused.png``).

The profiling engines get a KV pool sized for the profile (``num_kv_blocks``), not the
configured one: the pool size does not change the step cost, only the memory held. The
table does not model context length: ``prompt_len`` sets the context the steps run at.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from dspark.config import SamplingParams
from dspark.cost_table import (CostTable, CostTableError, CostTableFileError, CostTableMismatchError,
                               derive_tier_ladder, fingerprint_digest, fit_cost_table)
from dspark.engine import Engine

log = logging.getLogger(__name__)

DEFAULT_FLAT_REL_TOL = 0.02
# A fitted theta may dip a little at larger M (tile shapes), but not by this fraction of the cheapest step.
DEFAULT_MAX_DROP_REL = 0.25
# A step may cost this many times linear growth in its tokens over a smaller step before the sweep counts as
# disturbed (a 2-core CPU shared with another job measured 10x; timing jitter of tiny models stays below 2x).
DEFAULT_SUPERLINEAR_SLACK = 3.0
# The fit's quality thresholds. The H200 profiles in bench/results/h200-*/profile.json fit with R^2 >= 0.988
# and every median within 24% of its fitted cost; a sweep disturbed by another job misses one of them.
DEFAULT_MIN_R2 = 0.95
DEFAULT_MAX_REL_RESIDUAL = 0.35
# A fit that misses those thresholds is given this many more sweeps of every cell, their repeats pooled, before
# it is refused. On a 2-core CPU the medians of 6 steps of 150-500 ms scatter by about 10%, enough to miss
# R^2 0.95 on some sweeps of an idle machine; a machine that stays busy misses again and is refused.
DEFAULT_REMEASURE_ROUNDS = 2
MONOTONE_MODES = ("refuse", "envelope")
# Decode-only steps a profile may wait for beyond what it needs before it gives up.
_STEP_SLACK = 8
# What to change when a sweep is too noisy to fit, appended to the refusals.
_NOISE_ADVICE = ("re-run on a quieter machine (no other job on the CPU or device), with more repeats "
                 "(measure_steps, and warmup_steps) or fewer batch sizes (batch_sizes)")


class ProfileError(RuntimeError):
    """The profile cannot be taken with these settings (the message names the setting and the fix)."""


class ProfileRefusedError(ProfileError):
    """The sweep ran but its measurements do not make a table the planner can trust.

    ``measurements`` ((batch_size, M, median ms) rows), ``samples`` (every recorded step) and
    ``table`` (the fitted table, or None when there is none) are attached so a caller can
    plot what was refused.
    """

    def __init__(self, message: str, measurements: list[tuple[int, int, float]] | None = None,
                 table: CostTable | None = None, samples: list[tuple[int, int, float]] | None = None):
        # Defaults keep the exception picklable: launchers (submitit) ship it between processes.
        super().__init__(message)
        self.measurements = measurements or []
        self.table = table
        self.samples = samples or []


class ProfileFlatError(ProfileRefusedError):
    """The measured step cost does not depend on the token count: the table would make trimming look free."""


class ProfileFitError(ProfileRefusedError):
    """The medians do not fit the additive cost model (typically: a busy machine made some configurations slow)."""


class ProfileBudgetError(ProfileError):
    """The sweep ran, or was projected to run, longer than its time budget (``time_budget_s``)."""


@dataclass(frozen=True)
class ProfileResult:
    """What a profile measured and the table fitted to it."""

    measurements: list[tuple[int, int, float]]  # (batch_size, M, median step ms), sorted
    samples: list[tuple[int, int, float]]  # every recorded (batch_size, M, step ms), warm-up dropped
    table: CostTable
    block: int
    batch_sizes: tuple[int, ...]
    verify_lens: tuple[int, ...]
    fingerprint: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)
    trim_samples: list[tuple[int, int, float]] = field(default_factory=list)  # full block, trimmed path

    def summary(self) -> dict[str, Any]:
        t = self.table
        return {
            "block": self.block,
            "batch_sizes": list(self.batch_sizes),
            "verify_lens": list(self.verify_lens),
            "token_counts": list(t.token_counts),
            "fixed_overhead_ms": round(t.fixed_overhead_ms, 4),
            "theta_ms_min": round(min(t.theta_ms), 4),
            "theta_ms_max": round(max(t.theta_ms), 4),
            "trim_overhead_ms": None if t.trim_overhead_ms is None else [round(o, 4) for o in t.trim_overhead_ms],
            "num_samples": len(self.samples),
            "fit": None if t.fit is None else t.fit.to_dict(),
            "settings": dict(self.settings),
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "fingerprint": dict(self.fingerprint),
                "measurements": [list(m) for m in self.measurements], "samples": [list(s) for s in self.samples],
                "trim_samples": [list(s) for s in self.trim_samples], "table": self.table.to_dict()}


@dataclass(frozen=True)
class ProfileSettings:
    """Every setting that decides a profiled table (the keyword arguments of :func:`profile_engine`
    besides ``progress``). Config form: ``runners.schema.CostProfileSchema``.

    ``batch_sizes`` None: powers of two up to the engine's max_num_seqs, and on a GPU at least to
    MIN_LADDER_BATCH (:func:`default_batch_sizes`);
    ``verify_lens`` None: every length 0..block. ``measure_steps`` is the number of repeats per
    (batch size, verify length); their median is fitted. ``time_budget_s`` None: no limit.
    """

    batch_sizes: tuple[int, ...] | None = None
    verify_lens: tuple[int, ...] | None = None
    warmup_steps: int = 2
    measure_steps: int = 6
    prompt_len: int = 32
    seed: int = 0
    flat_rel_tol: float = DEFAULT_FLAT_REL_TOL
    max_drop_rel: float = DEFAULT_MAX_DROP_REL
    monotone: str = "refuse"
    min_r2: float = DEFAULT_MIN_R2
    max_rel_residual: float = DEFAULT_MAX_REL_RESIDUAL
    time_budget_s: float | None = None
    remeasure_rounds: int = DEFAULT_REMEASURE_ROUNDS

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "verify_lens"):
            value = getattr(self, name)
            if isinstance(value, Sequence) and not isinstance(value, str):
                object.__setattr__(self, name, tuple(value))
        for name in ("flat_rel_tol", "max_drop_rel", "min_r2", "max_rel_residual", "time_budget_s"):
            value = getattr(self, name)
            if value is None and name == "time_budget_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ProfileError(f"{name} must be a number, got {value!r}")
            object.__setattr__(self, name, float(value))  # 1 and 1.0 name the same table
        if self.monotone not in MONOTONE_MODES:
            raise ProfileError(f"monotone={self.monotone!r}: allowed {' or '.join(map(repr, MONOTONE_MODES))}")
        if not 0.0 <= self.min_r2 <= 1.0:
            raise ProfileError(f"min_r2 must be in [0, 1] (the fit's R^2 threshold), got {self.min_r2!r}")
        if not self.max_rel_residual > 0:
            raise ProfileError(f"max_rel_residual must be > 0 (a median's largest allowed distance from its fitted "
                               f"cost, as a fraction of it), got {self.max_rel_residual!r}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ProfileError(f"time_budget_s must be > 0 seconds, or null for no limit; got {self.time_budget_s!r}")
        if isinstance(self.remeasure_rounds, bool) or not isinstance(self.remeasure_rounds, int) \
                or self.remeasure_rounds < 0:
            raise ProfileError(f"remeasure_rounds must be an integer >= 0 (0: refuse a noisy fit at once), "
                               f"got {self.remeasure_rounds!r}")

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> "ProfileSettings":
        """From :func:`profile_engine` keyword arguments (``progress`` is not a setting and is left out)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(kwargs) - known - {"progress"}
        if unknown:
            raise ProfileError(f"unknown profile settings {sorted(unknown)}; allowed: {sorted(known)}")
        return cls(**{k: v for k, v in kwargs.items() if k in known})

    def resolved(self, engine: Engine) -> "ProfileSettings":
        """The same settings with the defaults of batch_sizes and verify_lens filled in for this engine."""
        return dataclasses.replace(
            self, batch_sizes=self.batch_sizes if self.batch_sizes is not None
            else tuple(default_batch_sizes(engine.cfg.max_num_seqs, engine.runner.device.type)),
            verify_lens=self.verify_lens if self.verify_lens is not None else tuple(range(engine.block_size + 1)))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    def table_settings(self) -> dict[str, Any]:
        """The settings a table is measured and accepted with: all but the time budget and the re-measuring
        rounds, which only decide whether the sweep finishes with a table."""
        return {k: v for k, v in self.to_dict().items() if k not in ("time_budget_s", "remeasure_rounds")}

    def digest(self) -> str:
        """8 hex digits of SHA-256 over :meth:`table_settings` (part of a cached table's file name)."""
        return hashlib.sha256(json.dumps(self.table_settings(), sort_keys=True).encode()).hexdigest()[:8]

    def profile_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`profile_engine` (without ``progress``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


# ---- settings ------------------------------------------------------------------------------
def _check_settings(engine: Engine, batch_sizes: Sequence[int], verify_lens: Sequence[int] | None,
                    warmup_steps: int, measure_steps: int, prompt_len: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if engine.drafter is None or engine.block_size < 1:
        raise ProfileError("profiling forces verify lengths of drafted tokens, but this engine has no drafter "
                           f"(engine.spec={engine.cfg.spec!r}); profile with engine.spec=dspark and a drafter")
    G = engine.block_size
    bs = list(batch_sizes)
    if not bs or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in bs):
        raise ProfileError(f"batch_sizes must be a non-empty list of integers >= 1, got {bs}")
    if len(set(bs)) != len(bs):
        raise ProfileError(f"batch_sizes has repeats: {bs}; list each batch size once")
    vl = list(range(G + 1)) if verify_lens is None else list(verify_lens)
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= G for v in vl):
        raise ProfileError(f"verify_lens must be integers in [0, block={G}] (drafts verified per request), got {vl}; "
                           "or null for every length 0..block")
    if len(set(vl)) != len(vl):
        raise ProfileError(f"verify_lens has repeats: {vl}; list each length once")
    if len(vl) < 2:
        raise ProfileError(f"verify_lens={vl}: at least two verify lengths are needed to see how the step cost "
                           "grows with the token count; use null for 0..block")
    if not (isinstance(warmup_steps, int) and warmup_steps >= 0):
        raise ProfileError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
    if not (isinstance(measure_steps, int) and measure_steps >= 1):
        raise ProfileError(f"measure_steps must be an integer >= 1, got {measure_steps!r}")
    if not (isinstance(prompt_len, int) and prompt_len >= 2):
        raise ProfileError(f"prompt_len must be an integer >= 2 (a prefill plus an anchor token), got {prompt_len!r}")
    # Batch sizes above engine.max_num_seqs are measured on an engine sized for them (_profiling_config): a
    # table that reaches past the engine's own batches is valid for it (it covers every step the engine runs).
    return tuple(bs), tuple(sorted(vl))


def _max_steps(batch_size: int, prompt_len: int, budget: int, warmup_steps: int, measure_steps: int,
               chunks_per_step: int | None = None) -> int:
    """Decode steps a request may take before the measured window ends (prefill overlap included): the
    first requests decode while the last are prefilled, at most ``budget`` tokens and (on the
    device-resident path) ``chunks_per_step`` prompts per step, and join one step after their prefill."""
    prefill_steps = math.ceil(batch_size * prompt_len / budget)
    if chunks_per_step:
        prefill_steps = max(prefill_steps, math.ceil(batch_size / chunks_per_step))
    return prefill_steps + 2 + warmup_steps + measure_steps + _STEP_SLACK


def _profile_token_budget(engine: Engine, batch_size: int) -> int:
    """The profiling engine's tokens per step: the engine's own, or a whole block for every request of the
    largest batch when that is more."""
    return max(engine.cfg.max_num_batched_tokens, batch_size * (engine.block_size + 1))


def _profiling_config(engine: Engine, v: int, *, max_tokens: int, batch_size: int, prompt_len: int):
    cfg = engine.cfg
    G = engine.block_size
    page = cfg.kv_block_size
    need = prompt_len + max_tokens + G + 2  # context + generated + one verify block (+ anchor)
    pages_per_request = math.ceil(need / page) + 1
    return dataclasses.replace(
        cfg, max_num_seqs=max(cfg.max_num_seqs, batch_size),
        max_num_batched_tokens=_profile_token_budget(engine, batch_size),
        verify="uniform", force_verify_len=v, force_budget_frac=None, tiers=None, cost_table=None,
        # The forced length replaces the planner's decision before any search, so the search
        # settings only need to be valid: pin them rather than inherit a verify=full config's.
        planner_algorithm="global", budget_lag=2 if cfg.overlap else 1, min_verify_len=min(cfg.min_verify_len, v),
        # Every profiled step runs the forced length: no step may skip drafting, and the price is the table's.
        draft_free_steps=False, service_cost=False,
        max_model_len=max(cfg.max_model_len, need + 1),
        num_kv_blocks=batch_size * pages_per_request + 2)


# ---- measurement ---------------------------------------------------------------------------
class SweepClock:
    """The sweep's elapsed time against its budget (``time_budget_s``; None: no limit).

    :meth:`config_done` is called after every (verify length, batch size) configuration; past
    the budget, or projected past it once a verify length's row of batch sizes is complete
    (elapsed / configurations done x configurations in all), it raises ProfileBudgetError.
    """

    def __init__(self, budget_s: float | None, total_configs: int):
        self.budget_s, self.total = budget_s, int(total_configs)
        self.start = time.perf_counter()
        self.done = 0

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start

    def config_done(self, *, row_complete: bool) -> None:
        self.done += 1
        if self.budget_s is None:
            return
        elapsed = self.elapsed_s
        projected = elapsed / self.done * self.total if row_complete and self.done < self.total else None
        if elapsed <= self.budget_s and (projected is None or projected <= self.budget_s):
            return
        raise ProfileBudgetError(
            f"the cost-table profile ran {elapsed:.0f} s for {self.done} of {self.total} (verify length, batch size) "
            "configurations" + (f" and is projected to take about {projected:.0f} s in all" if projected else "")
            + f", past time_budget_s={self.budget_s:g}. Measure fewer batch sizes (batch_sizes) or verify lengths "
            "(verify_lens), fewer repeats (measure_steps, warmup_steps) or a shorter prompt_len, run on a quieter "
            "machine, or raise time_budget_s (null: no limit)")


def _progress_bar(total: int, progress: bool):
    """One bar over the sweep's configurations, or None when progress is off."""
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="cost-table profile", unit="config")


def collect_measurements(engine: Engine, *, batch_sizes: Sequence[int], verify_lens: Sequence[int] | None,
                         warmup_steps: int, measure_steps: int, prompt_len: int, seed: int,
                         progress: bool = False, trimmed_path: bool = False,
                         time_budget_s: float | None = None) -> list[tuple[int, int, float]]:
    """Every recorded (batch_size, M, step ms) of the sweep, warm-up steps dropped (see module docstring).
    ``trimmed_path``: run every forced length on the trimmed-step path (``engine.force_trimmed_path``)."""
    bs, vl = _check_settings(engine, batch_sizes, verify_lens, warmup_steps, measure_steps, prompt_len)
    bar = _progress_bar(len(vl) * len(bs), progress)
    try:
        return _collect(engine, bs, vl, warmup_steps=warmup_steps, measure_steps=measure_steps,
                        prompt_len=prompt_len, seed=seed, trimmed_path=trimmed_path, bar=bar,
                        clock=SweepClock(time_budget_s, len(vl) * len(bs)))
    finally:
        if bar is not None:
            bar.close()


def _collect(engine: Engine, bs: Sequence[int], vl: Sequence[int], *, warmup_steps: int, measure_steps: int,
             prompt_len: int, seed: int, trimmed_path: bool, bar, clock: SweepClock) -> list[tuple[int, int, float]]:
    G = engine.block_size
    budget = _profile_token_budget(engine, max(bs))
    chunks = engine.steps.max_prefill_segments if engine.cfg.cuda_graphs else None  # the device path's cap
    steps_cap = _max_steps(max(bs), prompt_len, budget, warmup_steps, measure_steps, chunks)
    max_tokens = steps_cap * (G + 1)
    V = engine.target.cfg.vocab_size
    gen = torch.Generator().manual_seed(int(seed))
    prompts = {b: torch.randint(0, V, (b, prompt_len), generator=gen).tolist() for b in bs}
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    samples: list[tuple[int, int, float]] = []
    for v in vl:
        cfg_v = _profiling_config(engine, v, max_tokens=max_tokens, batch_size=max(bs), prompt_len=prompt_len)
        cfg_v = dataclasses.replace(cfg_v, force_trimmed_path=bool(trimmed_path))
        eng = Engine(engine.target, engine.tokenizer, cfg_v, engine.drafter)
        for b in bs:
            if bar is not None:
                bar.set_postfix(batch=b, verify_len=v, **({"path": "trimmed"} if trimmed_path else {}))
            samples += _measure_one(eng, prompts[b], params, b, v, warmup_steps, measure_steps,
                                    _max_steps(b, prompt_len, budget, warmup_steps, measure_steps, chunks))
            eng.reset()
            if bar is not None:
                bar.update(1)
            clock.config_done(row_complete=b == bs[-1])
        del eng
    return samples


def _measure_one(eng: Engine, prompts: list[list[int]], params: SamplingParams, b: int, v: int,
                 warmup_steps: int, measure_steps: int, max_steps: int) -> list[tuple[int, int, float]]:
    for p in prompts:
        eng.add_request(p, params)
    expected_m = b * (v + 1)
    seen_decode_only = 0
    out: list[tuple[int, int, float]] = []
    steps = 0
    while len(out) < measure_steps:
        if not eng.has_unfinished():
            raise ProfileError(f"batch {b}, verify length {v}: the requests finished after {steps} steps, before "
                               f"{measure_steps} decode-only steps were measured; this is a profiler sizing bug")
        finished = eng.step()
        steps += 1
        if finished:
            reasons = sorted({o.finish_reason for o in finished})
            errors = [o.error for o in finished if o.error]
            raise ProfileError(f"batch {b}, verify length {v}: {len(finished)} request(s) finished during the "
                               f"profile (reasons {reasons}{', errors ' + repr(errors[:2]) if errors else ''}); "
                               "lower prompt_len or raise engine.max_model_len / engine.num_kv_blocks")
        info = eng.last_step
        if steps > max_steps + b:
            raise ProfileError(f"batch {b}, verify length {v}: after {steps} steps only {seen_decode_only} had all "
                               f"{b} requests decoding without a prefill (last step: {info}); the KV pool or token "
                               "budget cannot hold the batch: raise engine.max_num_batched_tokens or lower the batch "
                               "size / prompt_len")
        if info is None or info.num_prefill_tokens != 0 or info.num_decodes != b:
            continue
        seen_decode_only += 1
        if info.num_tokens != expected_m or any(w != v for w in info.windows):
            raise ProfileError(f"batch {b}, forced verify length {v}: the step ran {info.num_tokens} tokens with "
                               f"windows {list(info.windows)}, expected M={expected_m} (= {b} x ({v} + 1)); the "
                               "engine did not honour engine.force_verify_len")
        if seen_decode_only <= warmup_steps:
            continue
        if not (math.isfinite(info.step_ms) and info.step_ms > 0):
            raise ProfileError(f"batch {b}, verify length {v}: step time {info.step_ms!r} ms is not a positive number")
        out.append((b, info.num_tokens, float(info.step_ms)))
    return out


def medians_of(samples: Sequence[Sequence[float]]) -> list[tuple[int, int, float]]:
    groups: dict[tuple[int, int], list[float]] = {}
    for b, m, ms in samples:
        groups.setdefault((int(b), int(m)), []).append(float(ms))
    return [(b, m, statistics.median(groups[(b, m)])) for b, m in sorted(groups)]


def check_not_flat(measurements: Sequence[tuple[int, int, float]], table: CostTable | None,
                   rel_tol: float = DEFAULT_FLAT_REL_TOL, samples: Sequence[tuple[int, int, float]] = ()) -> None:
    """Raise ProfileFlatError when the step cost does not grow with M, or the fitted theta is flat."""
    by_b: dict[int, list[tuple[int, float]]] = {}
    for b, m, ms in measurements:
        by_b.setdefault(b, []).append((m, ms))
    growth = {}
    for b, rows in by_b.items():
        rows.sort()
        growth[b] = rows[-1][1] - rows[0][1]
    advice = ("the planner would read every trim as free. Measure more steps (measure_steps), sweep larger batch "
              "sizes so the target's token cost rises above the fixed per-step overhead, and keep the machine "
              "otherwise idle")
    if growth and max(growth.values()) <= 0.0:
        detail = ", ".join(f"B={b}: {g:+.3f} ms" for b, g in sorted(growth.items()))
        raise ProfileFlatError(f"measured step time does not increase with the token count M at any batch size "
                               f"(largest-M minus smallest-M median: {detail}); the measurement is noise-dominated "
                               f"and {advice}", list(measurements), table, list(samples))
    if table is not None and table.is_flat(rel_tol):
        raise ProfileFlatError(
            f"the fitted cost table is flat: theta varies by {max(table.theta_ms) - min(table.theta_ms):.4f} ms over "
            f"M={table.token_counts[0]}..{table.token_counts[-1]}, within {rel_tol:.0%} of the cheapest step "
            f"({table.fixed_overhead_ms + min(table.theta_ms):.4f} ms); {advice}", list(measurements), table,
            list(samples))


def check_not_superlinear(measurements: Sequence[tuple[int, int, float]], samples: Sequence[tuple[int, int, float]] = (),
                          slack: float = DEFAULT_SUPERLINEAR_SLACK) -> None:
    """Raise ProfileFitError when a step of more tokens costs more than ``slack`` times linear in its tokens
    over a step of fewer (any two measured cells, M2 > M1: median(M2) > slack * median(M1) * M2 / M1).
    A forward's cost per token only falls as M grows (its fixed work is shared), so a cell that far above
    the line was slowed by something else: another process on the machine during that part of the sweep.
    Without this check such a sweep fits a table that is wrong in shape, and it would be reused."""
    cells = sorted(measurements, key=lambda r: r[1])
    worst = None
    for i, (b1, m1, ms1) in enumerate(cells):
        for b2, m2, ms2 in cells[i + 1:]:
            if m2 > m1 and ms1 > 0:
                ratio = ms2 / (ms1 * m2 / m1)
                if ratio > slack and (worst is None or ratio > worst[0]):
                    worst = (ratio, b1, m1, ms1, b2, m2, ms2)
    if worst is not None:
        ratio, b1, m1, ms1, b2, m2, ms2 = worst
        raise ProfileFitError(f"a step of M={m2} tokens (batch {b2}) took {ms2:.1f} ms, {ratio:.1f}x what linear growth "
                              f"from M={m1} (batch {b1}, {ms1:.1f} ms) allows: more tokens never cost that much more "
                              "per token, so something else was using the CPU or device during the sweep. Re-run the "
                              "profile on an otherwise idle machine (delete the cached table if one was written)",
                              list(measurements), None, list(samples))


def check_monotone(table: CostTable, measurements: Sequence[tuple[int, int, float]],
                   samples: Sequence[tuple[int, int, float]] = (), max_drop_rel: float = DEFAULT_MAX_DROP_REL) -> None:
    """Raise ProfileFitError when theta at some M exceeds theta at a larger M by more than
    max_drop_rel of the cheapest step: fewer tokens cannot cost that much more, so some
    configurations were slowed by something else (the planner would never pick them)."""
    if max_drop_rel < 0:
        raise ProfileError(f"max_drop_rel must be >= 0, got {max_drop_rel}")
    tc, th = table.token_counts, table.theta_ms
    floor = table.cheapest_step_ms
    worst = (0.0, 0, 0)
    running_min_after = [0.0] * len(th)
    for i in range(len(th) - 1, -1, -1):
        running_min_after[i] = th[i] if i == len(th) - 1 else min(th[i], running_min_after[i + 1])
    for i in range(len(th) - 1):
        drop = th[i] - running_min_after[i + 1]
        if drop > worst[0]:
            j = next(k for k in range(i + 1, len(th)) if th[k] == running_min_after[i + 1])
            worst = (drop, tc[i], tc[j])
    if worst[0] > max_drop_rel * floor:
        raise ProfileFitError(f"the fitted step cost at M={worst[1]} is {worst[0]:.3f} ms above the cost at the larger "
                              f"M={worst[2]} (more than {max_drop_rel:.0%} of the cheapest step, {floor:.3f} ms): the "
                              "sweep was disturbed (a busy machine, thermal throttling); re-run on an idle machine, "
                              "with more measure_steps", list(measurements), table, list(samples))


def check_fit_quality(table: CostTable, measurements: Sequence[tuple[int, int, float]],
                      samples: Sequence[tuple[int, int, float]] = (), *, min_r2: float = DEFAULT_MIN_R2,
                      max_rel_residual: float = DEFAULT_MAX_REL_RESIDUAL) -> CostTable:
    """The table with its fit marked as checked against these thresholds; ProfileFitError (naming what
    fails and what to change) when it does not pass. A table without a fit record is refused too."""
    if table.fit is None:
        raise ProfileFitError("the table carries no fit record to check (it was not made by fit_cost_table)",
                              list(measurements), table, list(samples))
    problems = table.fit.problems(min_r2, max_rel_residual)
    if problems:
        raise ProfileFitError(
            "the additive cost model does not fit the measured medians: " + "; ".join(problems)
            + f" ({table.fit.describe()}). Step times this inconsistent were disturbed: {_NOISE_ADVICE}. The "
            "thresholds are min_r2 and max_rel_residual", list(measurements), table, list(samples))
    return dataclasses.replace(table, fit=table.fit.checked(min_r2, max_rel_residual))


def profile_engine(engine: Engine, *, batch_sizes: Sequence[int] | None, verify_lens: Sequence[int] | None = None,
                   warmup_steps: int = 2, measure_steps: int = 6, prompt_len: int = 32, seed: int = 0,
                   progress: bool = False, flat_rel_tol: float = DEFAULT_FLAT_REL_TOL,
                   max_drop_rel: float = DEFAULT_MAX_DROP_REL, monotone: str = "refuse",
                   min_r2: float = DEFAULT_MIN_R2, max_rel_residual: float = DEFAULT_MAX_REL_RESIDUAL,
                   time_budget_s: float | None = None,
                   remeasure_rounds: int = DEFAULT_REMEASURE_ROUNDS) -> ProfileResult:
    """Sweep (batch size, forced verify length), fit the cost table, refuse one that could mislead the planner.

    The settings are :class:`ProfileSettings`'s (``batch_sizes`` None: powers of two up to
    engine.max_num_seqs, and on a GPU at least to MIN_LADDER_BATCH). Raises ProfileError on settings the
    engine cannot run, ProfileBudgetError past ``time_budget_s``, ProfileFlatError when the table would make
    trimming look free, ProfileFitError when the medians do not fit the additive model (a
    disturbed cell, medians the fit cannot separate, or a fit below the quality thresholds
    ``min_r2`` / ``max_rel_residual``). A fit below those thresholds, or a cell far above linear growth,
    first gets ``remeasure_rounds`` more chances: each measures every cell once more, pools the repeats
    (the medians are then over 2, 3, ... times ``measure_steps``) and fits again; ``settings["remeasured"]``
    records why each extra sweep was taken. The returned table records its fit (checked and passed) and
    the settings it was measured with.

    ``monotone``: what to do when the fitted theta(M) costs more at some M than at a larger
    one. "refuse" (default) raises ProfileFitError beyond ``max_drop_rel``; "envelope"
    replaces theta(M) by the cheapest cost at any M' >= M (a step can always be padded up to
    M'), records how many points changed in ``settings["monotone_repaired"]``, and never
    refuses for this reason. runners.ab's profile defaults to "envelope": CPU cost curves have
    real shape-dependent bumps.
    """
    settings = ProfileSettings(
        batch_sizes=batch_sizes, verify_lens=verify_lens, warmup_steps=warmup_steps, measure_steps=measure_steps,
        prompt_len=prompt_len, seed=seed, flat_rel_tol=flat_rel_tol, max_drop_rel=max_drop_rel, monotone=monotone,
        min_r2=min_r2, max_rel_residual=max_rel_residual, time_budget_s=time_budget_s,
        remeasure_rounds=remeasure_rounds).resolved(engine)
    bs, vl = _check_settings(engine, settings.batch_sizes, settings.verify_lens, warmup_steps, measure_steps,
                             prompt_len)
    G = engine.block_size
    if G not in vl:
        raise ProfileError(f"verify_lens={list(vl)} leaves out the full block {G}: the planner compares every trim "
                           f"with the full block's cost, and an engine refuses a table that does not cover it; add {G}")
    # Only captured steps have two paths (one fused graph vs draft + verify graphs); an eager step
    # runs the same code trimmed or not, so there the overhead is 0 by construction and measuring
    # it would only turn timing noise into a tax on every trim.
    two_paths = bool(engine.cfg.cuda_graphs)
    total = len(vl) * len(bs) + (len(bs) if two_paths else 0)
    clock = SweepClock(time_budget_s, total)
    bar = _progress_bar(total, progress)
    sweep = dict(warmup_steps=warmup_steps, measure_steps=measure_steps, prompt_len=prompt_len, seed=seed, bar=bar,
                 clock=clock)
    try:
        samples = _collect(engine, bs, vl, trimmed_path=False, **sweep)
        trim_samples = _collect(engine, bs, [G], trimmed_path=True, **sweep) if two_paths else []
    finally:
        if bar is not None:
            bar.close()
    trim_overhead = trim_overheads(samples, trim_samples, G) if two_paths else {b: 0.0 for b in bs}
    # The context the steps attended over is recorded with the table (not a checked field): the
    # table does not model context length, and runners.bench_decode warns when a run's is much longer.
    fingerprint = {**engine.fingerprint(), "profile_context_tokens": str(prompt_len)}
    remeasured: list[str] = []  # why each extra sweep was measured
    while True:
        measurements = medians_of(samples)
        try:
            table = _fit_checked(measurements, samples, trim_overhead, fingerprint, G, two_paths,
                                 flat_rel_tol=flat_rel_tol, min_r2=min_r2, max_rel_residual=max_rel_residual)
            break
        except ProfileFitError as e:
            if len(remeasured) >= remeasure_rounds or isinstance(e.__cause__, CostTableError):
                if remeasured:  # (a fit the medians cannot determine is not a matter of noise: refused at once)
                    e.args = (f"{e.args[0]} (after {len(remeasured)} more sweep(s) of every cell, their repeats "
                              "pooled)",)
                raise
            log.info("profile: %s; measuring every cell again (round %d of %d)", e.args[0].split(". ")[0],
                     len(remeasured) + 1, remeasure_rounds)
            clock.total += len(vl) * len(bs)
            round_bar = _progress_bar(len(vl) * len(bs), progress)
            try:
                more = _collect(engine, bs, vl, trimmed_path=False, **{**sweep, "bar": round_bar})
            finally:
                if round_bar is not None:
                    round_bar.close()
            remeasured.append(_refusal_reason(e))
            samples += more
    check_not_flat(measurements, table, flat_rel_tol, samples)
    repaired = 0
    if monotone == "envelope":
        table, repaired = monotone_envelope(table)
        if repaired:
            check_not_flat(measurements, table, flat_rel_tol, samples)
            log.info("profile: theta(M) was above a larger M's cost at %d token counts; replaced by the "
                     "cheaper padded cost (monotone envelope)", repaired)
    else:
        check_monotone(table, measurements, samples, max_drop_rel)
    table = dataclasses.replace(table, profile_settings=settings.table_settings())
    record = {"warmup_steps": warmup_steps, "measure_steps": measure_steps, "prompt_len": prompt_len, "seed": seed,
              "flat_rel_tol": flat_rel_tol, "max_drop_rel": max_drop_rel, "monotone": monotone,
              "monotone_repaired": repaired, "min_r2": min_r2, "max_rel_residual": max_rel_residual,
              "time_budget_s": time_budget_s, "profile_s": round(clock.elapsed_s, 3),
              "remeasure_rounds": remeasure_rounds, "remeasured": remeasured,
              "trim_overhead": "measured (captured steps)" if two_paths else
              "not measured: eager steps run the same code trimmed or not"}
    return ProfileResult(measurements=measurements, samples=samples, table=table, block=engine.block_size,
                         batch_sizes=bs, verify_lens=vl, fingerprint=fingerprint, settings=record,
                         trim_samples=trim_samples)


def _fit_checked(measurements, samples, trim_overhead: dict[int, float], fingerprint: dict, G: int,
                 two_paths: bool, *, flat_rel_tol: float, min_r2: float, max_rel_residual: float) -> CostTable:
    """The table fitted to these medians and checked: not flat, no cell far above linear growth, a fit that
    meets the quality thresholds (ProfileFlatError / ProfileFitError otherwise)."""
    check_not_flat(measurements, None, flat_rel_tol, samples)
    check_not_superlinear(measurements, samples)
    fit_points = [(b, m, ms - trim_overhead[b] if m < b * (G + 1) else ms) for b, m, ms in measurements]
    try:
        table = fit_cost_table(fit_points, fingerprint=fingerprint)
        table = dataclasses.replace(table, trim_overhead_ms=tuple(trim_overhead[b] for b in table.batch_sizes)
                                    if two_paths and table.batch_sizes is not None else None)
    except CostTableError as e:
        raise ProfileFitError(f"fitting the cost table failed: {e}. When medians of neighbouring token counts jump "
                              f"by large factors, something else was using the device or CPU during the sweep: "
                              f"{_NOISE_ADVICE}", measurements, None, samples) from e
    if table.fit.bounded:
        log.info("profile: the unconstrained fit priced some (batch size, M) pair below zero (fixed overhead "
                 "%.3f ms); the table is the bounded least-squares fit (%s)", table.fit.unbounded_fixed_overhead_ms,
                 table.fit.describe())
    return check_fit_quality(table, measurements, samples, min_r2=min_r2, max_rel_residual=max_rel_residual)


def _refusal_reason(error: ProfileFitError) -> str:
    """A refused fit's reason in a few words, for the profile's record of its extra sweeps."""
    table = error.table
    if table is not None and table.fit is not None:
        return f"fit: {table.fit.describe()}"
    return error.args[0].split(":")[0]


def trim_overheads(samples: Sequence[Sequence[float]], trimmed_full: Sequence[Sequence[float]],
                   block: int) -> dict[int, float]:
    """Per batch size: the median full-block step on the trimmed path minus the median fused full
    step, where that difference is real: at least 2 standard errors (from each side's median
    absolute deviation) and > 0; otherwise 0, so that noise does not tax every trim (on the eager
    CPU path both paths run the same code)."""
    def by_batch(rows):
        out: dict[int, list[float]] = {}
        for b, m, ms in rows:
            if int(m) == int(b) * (block + 1):
                out.setdefault(int(b), []).append(float(ms))
        return out

    full, split = by_batch(samples), by_batch(trimmed_full)
    missing = sorted(set(full) ^ set(split))
    if missing:
        raise ProfileError(f"trim overhead: batch sizes {missing} lack a full-block step on one of the two paths")

    def median_and_se(xs: list[float]) -> tuple[float, float]:
        med = statistics.median(xs)
        mad = statistics.median(abs(x - med) for x in xs)
        return med, 1.4826 * mad / math.sqrt(len(xs))

    overhead = {}
    for b in sorted(full):
        (mf, sf), (ms, ss) = median_and_se(full[b]), median_and_se(split[b])
        diff = ms - mf
        overhead[b] = diff if diff > 2.0 * math.hypot(sf, ss) else 0.0
    return overhead


def monotone_envelope(table: CostTable) -> tuple[CostTable, int]:
    """theta(M) -> min over M' >= M of theta(M'): padding a step up to M' is always possible,
    so no step needs to cost more than a larger one. Returns the table and the points changed."""
    theta = list(table.theta_ms)
    changed = 0
    for i in range(len(theta) - 2, -1, -1):
        if theta[i] > theta[i + 1]:
            theta[i] = theta[i + 1]
            changed += 1
    return dataclasses.replace(table, theta_ms=tuple(theta)), changed


# The smallest largest batch of a default profile ladder on a GPU. There a few requests' steps cost the same at every
# token count (a step's fixed launch and weight-read cost dominates), so a ladder that stopped there would fit a flat
# table and be refused (ProfileFlatError); one that reaches 16 requests shows how the cost grows with M, and the
# planner of an engine that runs fewer requests reads its steps off the curve's flat start (and declines to trim
# them). On a CPU the cost grows with M at any batch, and batches the engine never runs only add noise to the fit.
MIN_LADDER_BATCH = 16


def default_batch_sizes(max_num_seqs: int, device_type: str) -> list[int]:
    """The profile's batch sizes when none are given: powers of two up to max_num_seqs, and on a GPU at least
    up to MIN_LADDER_BATCH."""
    return batch_size_ladder(max(max_num_seqs, MIN_LADDER_BATCH) if device_type == "cuda" else max_num_seqs)


def batch_size_ladder(max_batch: int) -> list[int]:
    """Powers of two up to max_batch, max_batch included: neighbours share token counts (the fit needs that)
    and the largest covers every step of a run at that concurrency (M up to max_batch * (block + 1))."""
    if not (isinstance(max_batch, int) and not isinstance(max_batch, bool) and max_batch >= 1):
        raise ProfileError(f"max_batch must be an integer >= 1, got {max_batch!r}")
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return out + [max_batch]


def recommend_tier_ladder(table: CostTable, block: int, batch_size: int,
                          rel_tol: float = DEFAULT_FLAT_REL_TOL) -> list[int]:
    """The uniform-mode tier ladder at the right edges of theta's shelves for this batch size."""
    return derive_tier_ladder(table, block, batch_size=batch_size, rel_tol=rel_tol)


# ---- plot ----------------------------------------------------------------------------------
def plot_cost_curve(result: ProfileResult | ProfileRefusedError, table: CostTable | None, path: str | Path) -> Path:
    """PNG of step ms against M per batch size: every sample, the medians, and the fitted table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measurements = result.measurements
    samples = result.samples
    if not measurements:
        raise ProfileError("nothing to plot: the profile holds no measurements")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 5))
    by_b: dict[int, list[tuple[int, float]]] = {}
    for b, m, ms in measurements:
        by_b.setdefault(b, []).append((m, ms))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (b, rows) in enumerate(sorted(by_b.items())):
        c = colors[i % len(colors)]
        rows.sort()
        raw = [(m, ms) for bb, m, ms in samples if bb == b]
        if raw:
            ax.scatter([m for m, _ in raw], [ms for _, ms in raw], s=8, color=c, alpha=0.25)
        ax.plot([m for m, _ in rows], [ms for _, ms in rows], "o", color=c, label=f"B={b} measured (median)")
        if table is not None:
            ms_grid = [m for m, _ in rows]
            ax.step(ms_grid, [table.step_ms(m, b) for m in ms_grid], where="pre", color=c, linestyle="--",
                    label=f"B={b} fitted")
    all_m = [m for _, m, _ in measurements]
    if max(all_m) / max(min(all_m), 1) > 20:
        ax.set_xscale("log")
    ax.set_xlabel("M = tokens sent to the target per step (bonus included)")
    ax.set_ylabel("step time (ms)")
    title = "step cost vs verify tokens"
    if isinstance(result, ProfileRefusedError):
        title += f" (REFUSED: {type(result).__name__})"
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- cache: found again by fingerprint and settings ----------------------------------------
def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "_", text).strip("_") or "unknown"


def cost_table_path_for(fingerprint: Mapping[str, Any], root: str | Path,
                        settings: ProfileSettings | None = None) -> Path:
    """root/<model>-<dtype>-<fingerprint digest>[-p<settings digest>].json.

    Two setups that CostTable.check_fingerprint would accept for each other get the same
    digest; any difference in device, driver, torch, triton, model, drafter, dtype or step path
    gets another one. With ``settings`` (resolved for the engine) the name also carries
    :meth:`ProfileSettings.digest`, so tables measured with other settings are other files.
    """
    missing = [k for k in ("model", "dtype") if not fingerprint.get(k)]
    if missing:
        raise ProfileError(f"fingerprint lacks {missing}: pass engine.fingerprint(), got keys {sorted(fingerprint)}")
    tail = "" if settings is None else f"-p{settings.digest()}"
    return Path(root) / (f"{_slug(str(fingerprint['model']))}-{_slug(str(fingerprint['dtype']))}-"
                         f"{fingerprint_digest(fingerprint)}{tail}.json")


def refused_plot_path(table_path: str | Path) -> Path:
    """Where a refused profile's curve goes: beside where its table would have been."""
    p = Path(table_path)
    return p.with_name(p.stem + ".refused.png")


def describe_table(path: str | Path | None, table: CostTable | None, how: str, *,
                   plot: str | Path | None = None, **extra: Any) -> dict[str, Any]:
    """What a run reports about the table it used: its path, how it was obtained, its fingerprint digest,
    its fit quality (None when the table records none; ``fit_summary`` in words), the settings it was
    measured with, and its PNG (the one beside the table when ``plot`` is not given)."""
    if plot is None and path is not None and Path(path).with_suffix(".png").is_file():
        plot = Path(path).with_suffix(".png")
    fit = None if table is None else table.fit
    return {"path": None if path is None else str(path), "how": how,
            "fingerprint": None if table is None else fingerprint_digest(table.fingerprint),
            "fit": None if fit is None else fit.to_dict(), "fit_summary": None if fit is None else fit.describe(),
            "settings": None if table is None or table.profile_settings is None else dict(table.profile_settings),
            "plot": None if plot is None else str(plot), **extra}


@dataclass(frozen=True)
class ObtainedTable:
    """The table :func:`find_or_profile` settled on and how: ``how`` is "reused from cache" or "profiled now";
    ``replaced`` says why a cached file at ``path`` was not reused (empty when none was there)."""

    path: Path
    table: CostTable
    how: str
    plot: Path | None = None
    replaced: str = ""
    profile_s: float | None = None

    def describe(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.profile_s is not None:
            extra["profile_s"] = round(self.profile_s, 3)
        if self.replaced:
            extra["replaced"] = self.replaced
        return describe_table(self.path, self.table, self.how, plot=self.plot, **extra)


def _reuse_problem(table: CostTable, settings: ProfileSettings) -> str:
    """Why a cached table (its fingerprint already matched) is not reused; empty when it is."""
    if table.fit is None or table.fit.passed is None:
        return "it records no checked fit quality (it was not saved by the profiler's quality check)"
    if not table.fit.passed:
        return f"its fit failed the quality check ({table.fit.describe()})"
    wanted = settings.table_settings()
    recorded = dict(table.profile_settings or {})
    if recorded != wanted:
        differ = sorted(k for k in set(wanted) | set(recorded) if wanted.get(k) != recorded.get(k))
        return "it was measured with other settings (" + ", ".join(
            f"{k}: table {recorded.get(k)!r}, now {wanted.get(k)!r}" for k in differ) + ")"
    return ""


def find_or_profile(engine_factory: Engine | Callable[[], Engine], root: str | Path,
                    settings: ProfileSettings | Mapping[str, Any], log: Callable[[str], Any] = log.info, *,
                    progress: bool | None = None) -> ObtainedTable:
    """The cost table for this engine's fingerprint and these settings under root; profiles and saves one
    (with its PNG beside it) when none is cached or the cached one may not be reused.

    ``engine_factory``: an Engine, or a zero-argument callable returning one (called once;
    the engine is needed for its fingerprint even when the table exists). ``settings``: a
    :class:`ProfileSettings`, or :func:`profile_engine` keyword arguments (a ``progress`` among
    them is used when the ``progress`` argument is None). ``log`` receives the lines saying what
    happened. A cached table is reused only when its fingerprint matches, its fit passed the
    quality check and it was measured with these settings; one that fails the last two is
    profiled again and replaced (logged). A file that does not load, or whose fingerprint
    does not match its name, raises naming the file and saying that deleting it makes the next
    run profile again: it is never silently replaced. A refused profile saves nothing and
    leaves its curve in :func:`refused_plot_path`.
    """
    if not isinstance(settings, ProfileSettings):
        if progress is None:
            progress = bool(settings.get("progress", False))
        settings = ProfileSettings.from_kwargs(settings)
    engine = engine_factory if isinstance(engine_factory, Engine) else engine_factory()
    if not isinstance(engine, Engine):
        raise ProfileError(f"engine_factory must be an Engine or return one, got {type(engine).__name__}")
    settings = settings.resolved(engine)
    fingerprint = engine.fingerprint()
    path = cost_table_path_for(fingerprint, root, settings)
    setup = (f"{fingerprint['device_name']}, {fingerprint['model']}, drafter {fingerprint.get('drafter')}, "
             f"{fingerprint['dtype']}")
    replaced = ""
    if path.exists():
        delete = (f"This is the table cached for this setup: delete {path} and the next run profiles this node "
                  f"again")
        try:
            table = CostTable.load(path)
        except CostTableFileError as e:
            raise CostTableFileError(path, e.problem, delete) from None
        foreign = table.check_fingerprint(fingerprint, override=True)
        if foreign:  # copied or edited by hand: its name says this setup, its fingerprint another
            raise CostTableMismatchError(f"cost table {path} was measured on a different setup ("
                                         + "; ".join(foreign) + f") than its name says. {delete}")
        replaced = _reuse_problem(table, settings)
        if not replaced:
            plot = path.with_suffix(".png")
            log(f"cost table: reusing {path} from the cache (profiled earlier on this setup: {setup}; "
                f"fingerprint {fingerprint_digest(fingerprint)}; fit {table.fit.describe()})")
            return ObtainedTable(path, table, "reused from cache", plot if plot.is_file() else None)
        log(f"cost table: not reusing the cached {path}: {replaced}; profiling again, the new table replaces it")
    else:
        log(f"cost table: none under {Path(root)} for this setup ({setup}) and these profile settings; "
            f"profiling now, the table will be saved to {path}")
    try:
        result = profile_engine(engine, **settings.profile_kwargs(), progress=bool(progress))
    except ProfileRefusedError as e:
        png = plot_cost_curve(e, e.table, refused_plot_path(path)) if e.measurements else None
        where = f" The measured curve is in {png}." if png else ""
        raise type(e)(f"{str(e).rstrip('.')}.{where} Nothing was cached.", e.measurements, e.table,
                      e.samples) from e
    path.parent.mkdir(parents=True, exist_ok=True)
    result.table.save(path)
    plot = plot_cost_curve(result, result.table, path.with_suffix(".png"))
    refused_plot_path(path).unlink(missing_ok=True)  # an earlier refusal's curve no longer describes this file
    seconds = float(result.settings.get("profile_s", 0.0))
    log(f"cost table: profiled in {seconds:.1f} s and saved {path} with its curve {plot} (token counts "
        f"{result.table.token_counts[0]}..{result.table.token_counts[-1]}, batch sizes {list(result.batch_sizes)}; "
        f"fit {result.table.fit.describe()})")
    return ObtainedTable(path, result.table, "profiled now", plot, replaced, seconds)


__all__ = ["ProfileError", "ProfileRefusedError", "ProfileFlatError", "ProfileFitError", "ProfileBudgetError",
           "ProfileResult", "ProfileSettings", "ObtainedTable", "SweepClock", "collect_measurements", "medians_of",
           "trim_overheads", "check_not_flat", "check_not_superlinear", "check_monotone", "check_fit_quality",
           "profile_engine", "batch_size_ladder", "recommend_tier_ladder", "plot_cost_curve", "cost_table_path_for",
           "refused_plot_path", "describe_table", "find_or_profile", "DEFAULT_FLAT_REL_TOL", "DEFAULT_MAX_DROP_REL",
           "DEFAULT_MIN_R2", "DEFAULT_MAX_REL_RESIDUAL"]
