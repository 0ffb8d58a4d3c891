"""Evaluate a drafter checkpoint with the engine on the workloads' EVAL prompts.

    python -m runners.eval_drafter checkpoint=runs/dspark/final
    python -m runners.eval_drafter checkpoint=DIR engine=h200 num_prompts=64

For every workload and temperature (0 and 0.7 by default) the prompts run through the
engine with ``spec=dspark`` (full-block verification): mean acceptance length (tokens
committed per decode step, bonus included, averaged over requests) and per-position
acceptance (accepted at i / drafts that reached i, per request, averaged over requests).
At temperature 0 the same prompts also run target-only and the outputs are compared
(:func:`greedy_check`): in float32 the token ids must be identical (a difference fails the row, and a
float64 copy of the target gives the gap between the two tokens at it: a near-tie or not); in reduced precision
(bf16/fp16) a verify forward and a decode step round differently, so where the target's two
best tokens are within that rounding the outputs may part. There each row is judged on
evidence by ``dspark.bench.lossless.evidence_lossless_guard``: every output is re-scored
teacher-forced by a float32 copy of the target; the noise bound ``delta`` is the forward noise
measured on the target-only outputs; a mismatch is a ``rounding_flip`` when both outputs'
tokens at its first differing position are within ``delta`` of the reference's top logit,
else a ``divergence``; any emitted token beyond ``delta`` fails the row. Mismatches are
listed. Writes ``eval.json`` and ``eval.md`` (a model-card table) into ``output_dir``
(default: CHECKPOINT/eval). Each row also gives the accept length of each of its prompts' source labels
(``accept_length_by_source``: arena-hard's categories, agentic's BFCL categories and HumanEval, poetry's
forms), lowest first: the kinds of text a drafter lags on; and its rejected drafts by the kind of the target's
token at each (``draft_misses_by_kind``: word starts, word pieces, numbers, punctuation, newlines, ...).

Intervals: each row's mean accept length and p1 acceptance get a ``ci_level`` (95%) bootstrap
interval over PROMPTS (``scipy.stats.bootstrap``, ``n_resamples`` resamples seeded by ``seed``):
a resample draws prompts with replacement, each keeping all its decode steps, and the statistic is
the row's own (the mean over prompts of each prompt's value). BCa where it is defined; where BCa's
bounds are undefined (a degenerate bootstrap distribution) the percentile interval, and the row's
``method`` and ``note`` say so; every prompt equal gives a zero-width interval; fewer than 2 prompts
give none (null, with the reason). ``eval.json`` keeps every prompt's values under
``per_prompt`` (keyed by prompt id, each with its source label), so two reports can be compared later, paired
by prompt:

    python -m runners.eval_drafter 'compare=[runs/dflash/eval/eval.json,runs/dspark/eval/eval.json]'

prints, per (workload, temperature) row both reports hold, B's mean accept length relative to A's
on their shared prompts, (mean B / mean A - 1) in %, with a paired prompt bootstrap interval (the
same prompt indices drawn for both), and the same per source label, lowest first (``by_source``: where B gains
and where it does not; an interval only for a source of ``MIN_PROMPTS_FOR_SOURCE_INTERVAL`` prompts or more;
a report written before prompts kept their labels is labelled from its workload's eval split); with
``output_dir`` it also writes compare.json, compare.md and compare.png (:mod:`dspark.bench.compare_plot`).
"""

from __future__ import annotations

import functools
import json
import lzma
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional, Sequence

import numpy as np
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from dspark.bench.draft_misses import draft_misses_by_kind, misses_line
from dspark.bench.guards import FULL_PRECISION_DTYPES
from dspark.config import ConfigError, SamplingParams
from dspark.models.drafter import DSparkDrafter
from runners.common import resolve_drafter_path
from runners.hydra_main import runner_main
from runners.schema import EngineSchema, ModelSchema, to_engine_config
from workloads.registry import build_workload, make_spec

DEFAULT_WORKLOADS = ["agentic", "poetry", "arena_hard"]


@dataclass
class EvalDrafterSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    # the engine's settings; engine.spec is set here: dspark for the drafter's runs, off for the target-only ones
    engine: EngineSchema = field(default_factory=EngineSchema)
    checkpoint: Optional[str] = None  # the drafter folder (config.json + safetensors) or builtin:NAME to evaluate
    # the workloads whose EVAL-split prompts run, by name (workloads.registry: agentic, poetry, arena_hard, ...)
    workloads: List[str] = field(default_factory=lambda: list(DEFAULT_WORKLOADS))
    num_prompts: int = 16  # prompts per workload (a seeded choice)
    max_tokens: int = 256  # output tokens per request at most
    # the sampling temperatures (>= 0) each workload runs at; at 0 the prompts also run target-only and the
    # speculative tokens must equal the target-only ones
    temperatures: List[float] = field(default_factory=lambda: [0.0, 0.7])
    top_p: float = 1.0  # nucleus sampling at temperatures > 0; 1: off
    top_k: int = 0  # top-k sampling at temperatures > 0; 0: off
    seed: int = 0  # seeds which prompts are chosen and each request's sampling seed
    output_dir: Optional[str] = None  # where eval.json and eval.md are written; null: CHECKPOINT/eval
    progress: bool = True  # progress bars over each run's requests
    n_resamples: int = 2000  # bootstrap resamples of the prompts behind each interval (seeded by seed)
    ci_level: float = 0.95  # confidence level of the prompt-bootstrap intervals
    # two eval.json files (or the folders holding them), [A,B]: evaluate nothing; compare B's accept length
    # with A's per (workload, T) on their shared prompts, with a paired prompt-bootstrap interval
    compare: Optional[List[str]] = None


ConfigStore.instance().store(name="eval_drafter_schema", node=EvalDrafterSchema)


def _mean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _ok(o: Any) -> bool:
    return o.error is None and bool(o.accept_lengths)


def per_prompt_values(outputs: Sequence[Any], ids: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{prompt id: its acceptance values}`` of engine outputs: what a row's intervals and a later paired
    comparison are computed from (``ids`` default to each output's user id, else its index)."""
    if ids is None:
        ids = [str(o.user_id) if getattr(o, "user_id", None) is not None else str(i) for i, o in enumerate(outputs)]
    if len(ids) != len(outputs):
        raise ValueError(f"{len(ids)} prompt ids for {len(outputs)} outputs")
    if len(set(map(str, ids))) != len(ids):
        raise ValueError(f"prompt ids must be unique to pair prompts, got {list(ids)}")
    out = {}
    for pid, o in zip(ids, outputs):
        ok = _ok(o)
        out[str(pid)] = {
            "mean_accept_length": float(o.mean_accept_length) if ok else None,
            "decode_steps": int(o.num_steps) if ok else 0,
            "output_tokens": len(o.token_ids) if ok else 0,
            "prompt_tokens": len(o.prompt_token_ids),
            "pos_accepted": [int(v) for v in o.pos_accepted] if ok else [],
            "pos_reached": [int(v) for v in o.pos_reached] if ok else [],
            "error": o.error if o.error is not None else (None if ok else "no decode steps"),
        }
    return out


def _p1(entry: Mapping[str, Any]) -> float | None:
    reached = entry.get("pos_reached") or []
    return entry["pos_accepted"][0] / reached[0] if reached and reached[0] > 0 else None


def _relative_change(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(b, axis=axis) / np.mean(a, axis=axis) - 1.0


def bootstrap_interval(samples: Sequence[Sequence[float]], statistic: Callable[..., np.ndarray], *,
                       paired: bool = False, n_resamples: int = 2000, ci_level: float = 0.95,
                       seed: int = 0) -> dict[str, Any]:
    """A prompt-bootstrap interval of ``statistic`` (vectorized, ``axis=-1``) of ``samples`` (one sequence,
    or several of equal length with ``paired``: the same prompt indices are drawn for all), through
    dspark.bench.statistics' BCa and percentile intervals (a paired statistic is bootstrapped over the prompt
    indices, as scipy's ``paired=True`` does).

    Returns ``{low, high, level, method, n_prompts, n_resamples, seed, note}``. ``method`` is "bca";
    "percentile" where BCa's bounds are undefined (``note`` says so); "zero-width" when every prompt gave
    the same value(s); None with null bounds for fewer than 2 prompts."""
    from dspark.bench.statistics import bca_interval, percentile_interval

    data = [np.asarray(x, dtype=float) for x in samples]
    n = data[0].size
    if any(x.ndim != 1 or x.size != n for x in data):
        raise ValueError(f"bootstrap samples must be 1-D of one length, got {[x.shape for x in data]}")
    if len(data) > 1 and not paired:
        raise ValueError("several bootstrap samples are resampled together: set paired=True")
    if not all(np.all(np.isfinite(x)) for x in data):
        raise ValueError("bootstrap samples hold non-finite values")
    info = {"low": None, "high": None, "level": float(ci_level), "method": None, "n_prompts": int(n),
            "n_resamples": int(n_resamples), "seed": int(seed), "note": None}
    if n < 2:
        info["note"] = f"{n} prompt(s): a prompt bootstrap needs at least 2, so no interval"
        return info
    if len(data) == 1:
        x, stat = data[0], statistic
    else:  # the prompts' indices, each resample's statistic computed on the same prompts of every sample
        x = np.arange(n, dtype=float)
        stat = lambda idx, axis=-1: statistic(*(d[idx.astype(int)] for d in data), axis=axis)  # noqa: E731
    kw = dict(n_boot=int(n_resamples), ci_level=float(ci_level), seed=int(seed), statistic=stat)
    if all(np.ptp(d) == 0 for d in data):
        theta = float(statistic(*data, axis=-1))
        info.update(low=theta, high=theta, method="zero-width", note="every prompt gave the same value: no spread")
        return info
    low, high, how = bca_interval(x, **kw)
    if how["method"] == "bca":
        info.update(low=low, high=high, method="bca")
    else:
        low, high = percentile_interval(x, **kw)
        info.update(low=low, high=high, method="percentile",
                    note="BCa bounds undefined (degenerate bootstrap distribution): percentile interval instead")
    return info


def row_intervals(per_prompt: Mapping[str, Mapping[str, Any]], *, n_resamples: int = 2000, ci_level: float = 0.95,
                  seed: int = 0) -> dict[str, Any]:
    """The prompt-bootstrap intervals of a row from its ``per_prompt`` values: ``mean_accept_length_ci``
    (mean over prompts of each prompt's mean accept length, as ``mean_accept_length``) and
    ``p1_acceptance_ci`` (as ``per_position_acceptance[0]``)."""
    kw = dict(statistic=np.mean, n_resamples=n_resamples, ci_level=ci_level, seed=seed)
    lengths = [e["mean_accept_length"] for e in per_prompt.values() if e.get("mean_accept_length") is not None]
    p1 = [v for v in (_p1(e) for e in per_prompt.values() if e.get("mean_accept_length") is not None) if v is not None]
    return {"mean_accept_length_ci": bootstrap_interval([lengths], **kw),
            "p1_acceptance_ci": bootstrap_interval([p1], **kw)}


def acceptance_metrics(outputs: Sequence[Any], block_size: int, ids: Sequence[str] | None = None, *,
                       n_resamples: int = 2000, ci_level: float = 0.95, seed: int = 0,
                       sources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Request-averaged acceptance length and per-position acceptance of engine outputs, the prompt-bootstrap
    intervals of the first and of p1 (:func:`row_intervals`), and every prompt's values (``per_prompt``).
    ``sources`` ({prompt id: its workload's source label, e.g. "arena_hard:debugging"}) adds the accept length by
    source (:func:`by_source`)."""
    ok = [o for o in outputs if _ok(o)]
    per_position = []
    for i in range(block_size):
        rates = [o.pos_accepted[i] / o.pos_reached[i] for o in ok if o.pos_reached[i] > 0]
        per_position.append(_mean(rates))
    per_prompt = per_prompt_values(outputs, ids)
    for pid, entry in per_prompt.items():  # each prompt's label, so that a comparison can pair by source
        if sources and sources.get(pid):
            entry["source"] = str(sources[pid])
    return {
        **by_prompt_length(per_prompt),
        **(by_source(per_prompt, sources) if sources is not None else {}),
        "requests": len(outputs),
        "errors": sum(o.error is not None for o in outputs),
        "mean_accept_length": _mean([o.mean_accept_length for o in ok]),
        "per_position_acceptance": per_position,
        "output_tokens": sum(len(o.token_ids) for o in ok),
        "decode_steps": sum(o.num_steps for o in ok),
        **row_intervals(per_prompt, n_resamples=n_resamples, ci_level=ci_level, seed=seed),
        "per_prompt": per_prompt,
    }


# A prompt longer than this many tokens is "long" in the report: a drafter trained on shorter contexts
# than it serves loses its acceptance there first, so the split shows whether that happened.
LONG_PROMPT_TOKENS = 512


def by_prompt_length(per_prompt: Mapping[str, Mapping[str, Any]], threshold: int = LONG_PROMPT_TOKENS
                     ) -> dict[str, Any]:
    """Request-averaged accept length of the prompts up to ``threshold`` tokens and of the longer ones."""
    split: dict[str, list[float]] = {"short": [], "long": []}
    for entry in per_prompt.values():
        if entry.get("mean_accept_length") is not None and entry.get("prompt_tokens") is not None:
            split["long" if entry["prompt_tokens"] > threshold else "short"].append(entry["mean_accept_length"])
    return {"accept_length_by_prompt_length": {"threshold_tokens": int(threshold),
                                               **{k: {"prompts": len(v), "mean_accept_length": _mean(v)}
                                                  for k, v in split.items()}}}


def by_source(per_prompt: Mapping[str, Mapping[str, Any]], sources: Mapping[str, str]) -> dict[str, Any]:
    """Request-averaged accept length of each source label's prompts (a workload's categories: arena-hard's six,
    agentic's BFCL categories and HumanEval, poetry's forms), lowest first, so that a drafter's weak kinds of
    text show; empty where the row's prompts have fewer than two labels. A prompt id without a label is
    "unlabelled"."""
    groups: dict[str, list[float]] = {}
    for pid, entry in per_prompt.items():
        if entry.get("mean_accept_length") is not None:
            groups.setdefault(str(sources.get(pid, "unlabelled")), []).append(entry["mean_accept_length"])
    if len(groups) < 2:
        return {}
    rows = sorted(((name, len(v), _mean(v)) for name, v in groups.items()), key=lambda r: (r[2], r[0]))
    return {"accept_length_by_source": {name: {"prompts": n, "mean_accept_length": m} for name, n, m in rows}}


def greedy_mismatches(spec_outputs: Sequence[Any], plain_outputs: Sequence[Any], ids: Sequence[str]) -> list[dict]:
    """Requests whose speculative greedy tokens differ from target-only greedy tokens: ``{id,
    first_difference, spec_len, target_len}`` each (``{id, error}`` where either run failed).
    :func:`greedy_check` classifies them."""
    found = []
    for pid, a, b in zip(ids, spec_outputs, plain_outputs):
        if a.error is not None or b.error is not None:
            found.append({"id": pid, "error": a.error or b.error})
            continue
        if list(a.token_ids) != list(b.token_ids):
            first = next((k for k, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
                         min(len(a.token_ids), len(b.token_ids)))
            entry = {"id": pid, "first_difference": first, "spec_len": len(a.token_ids),
                     "target_len": len(b.token_ids)}
            found.append(entry)
    return found


# The guard's rate test compares an arm with a control run; this check has none, so the guard makes no rate test
# and its significance level decides nothing (it must still be a valid level).
NO_RATE_TEST_ALPHA = 0.05


def _regret_at(scorer, prompt: Sequence[int], tokens: Sequence[int], idx: int) -> float | None:
    """The reference's regret of ``tokens[idx]`` (None past the end): re-uses the guard's cached scores."""
    if idx >= len(tokens):
        return None
    return float(scorer.score(list(prompt), list(tokens)).regret[idx])


def float64_ties(mismatches: list[dict], spec: Mapping[str, Any], plain: Mapping[str, Any], target) -> None:
    """Evidence for float32 mismatches: at each first difference inside both outputs (``spec`` and ``plain``: engine
    outputs by prompt id), the two tokens' logit gap in a float64 forward of ``target`` after the shared prefix
    (:func:`dspark.bench.reference.float64_token_gaps`), added as ``float64_gap`` and ``float64_prefers`` ("spec" or
    "target"). Either way the row fails: in float32 equality is demanded."""
    from dspark.bench.reference import float64_token_gaps

    todo = [m for m in mismatches if "error" not in m
            and m["first_difference"] < min(len(spec[m["id"]].token_ids), len(plain[m["id"]].token_ids))]
    cases = []
    for m in todo:
        a, b, at = spec[m["id"]].token_ids, plain[m["id"]].token_ids, m["first_difference"]
        cases.append((plain[m["id"]].prompt_token_ids, b[:at], a[at], b[at]))
    for m, gap in zip(todo, float64_token_gaps(target, cases)):
        m.update(float64_gap=gap["float64_gap"], float64_prefers="spec" if gap["float64_prefers"] == "a" else "target")


def replay_batch_invariant(mismatches: list[dict], ids: Sequence[str], replay: Callable[[list[int]], tuple]) -> str:
    """Float32 mismatches generated again by ``replay`` (the indices into ``ids`` -> the speculative and the
    target-only outputs of batch-invariant engines, :class:`BatchInvariantReplay`). Where a row's logits do not
    depend on the step's row count, speculative and target-only greedy decoding do the same arithmetic, so their
    outputs must be identical: each mismatch gets ``exact_replay`` "identical" (and ``kind`` "row_count_flip": in the
    first runs the GEMMs rounded a near-tie differently in steps of different row counts) or "differs" (it stays a
    divergence). Returns the evidence's sentence."""
    todo = [m for m in mismatches if "error" not in m]
    if not todo:
        return ""
    at = {pid: i for i, pid in enumerate(ids)}
    spec, plain = replay([at[m["id"]] for m in todo])
    for m, a, b in zip(todo, spec, plain):
        same = a.error is None and b.error is None and list(a.token_ids) == list(b.token_ids)
        m["exact_replay"] = "identical" if same else "differs"
        if same:
            m["kind"] = "row_count_flip"
    same = sum(m["exact_replay"] == "identical" for m in todo)
    return f"; replayed with engine.batch_invariant=true: {same}/{len(todo)} identical"


class BatchInvariantReplay:
    """Generates prompts again on a batch-invariant speculative engine and target-only engine (``build()`` makes the
    pair on the first call; ``engine.batch_invariant=true``), for :func:`replay_batch_invariant`."""

    def __init__(self, build: Callable[[], tuple[Any, Any]]):
        self._build, self._engines = build, None

    def __call__(self, prompts: Sequence[Any], params: Sequence[SamplingParams]) -> tuple[list, list]:
        if self._engines is None:
            self._engines = self._build()
        spec, plain = self._engines
        spec.reset()
        plain.reset()
        return spec.generate(list(prompts), list(params)), plain.generate(list(prompts), list(params))


def greedy_check(spec_outputs: Sequence[Any], plain_outputs: Sequence[Any], ids: Sequence[str], *, dtype: str,
                 scorer=None, decode: Callable[[list[int]], str] | None = None,
                 progress: Callable | None = None, float64_target=None,
                 replay: Callable[[list[int]], tuple] | None = None) -> dict[str, Any]:
    """A temperature-0 row's check that the speculative greedy outputs are the target-only ones.

    float32 (``scorer`` None): exact equality; every mismatch is a ``divergence``, and with ``float64_target``
    (the target) each gets the float64 evidence of :func:`float64_ties`; with ``replay`` (engines that are not
    batch-invariant) each is generated again batch-invariant (:func:`replay_batch_invariant`): one identical there
    is a ``row_count_flip``, which says why the row failed; it fails all the same (float32 promises equality, and
    the replay runs other arithmetic than the run it explains). Reduced precision: the
    evidence guard (``dspark.bench.lossless.evidence_lossless_guard``) over the runs "target" (arm A, whose
    outputs measure the forward noise: ``delta``) and "dspark" (arm B), re-scored by ``scorer`` (a
    ``ReferenceScorer`` of the target), without a control run. Each mismatch gets ``kind`` "rounding_flip"
    (both tokens at its first difference have a regret <= ``delta``) or "divergence", ``spec_regret``,
    ``target_regret`` (None past an output's end) and ``delta``.

    Returns the row's ``greedy_mismatches``, ``greedy_rounding_flips`` (their count), ``greedy_lossless`` (the
    guard passed, so no token of either run is beyond ``delta``, and no request failed), ``greedy_evidence``
    (the guard's message) and, in reduced precision, ``greedy_guard`` (delta, the real divergences, ...)."""
    mism = greedy_mismatches(spec_outputs, plain_outputs, ids)
    failed = {m["id"] for m in mism if "error" in m}
    if scorer is None:
        for m in mism:
            if "error" not in m:
                m["kind"] = "divergence"
        if float64_target is not None:
            float64_ties(mism, dict(zip(ids, spec_outputs)), dict(zip(ids, plain_outputs)), float64_target)
        replayed = replay_batch_invariant(mism, ids, replay) if replay is not None else ""
        same = len(ids) - len(mism)
        gaps = [f"{m['id']} at {m['first_difference']}: {m['float64_gap']:.2g}" for m in mism if "float64_gap" in m]
        return {"greedy_mismatches": mism, "greedy_rounding_flips": 0, "greedy_lossless": not mism,
                "greedy_evidence": f"{dtype}: exact equality demanded; {same}/{len(ids)} identical"
                                   + (f", {len(failed)} failed" if failed else "")
                                   + (f"; float64 logit gap of the two tokens: {', '.join(gaps)}" if gaps else "")
                                   + replayed}

    from dspark.bench.lossless import RunOutputs, evidence_lossless_guard

    ok = [(pid, a, b) for pid, a, b in zip(ids, spec_outputs, plain_outputs) if pid not in failed]
    prompts = {pid: list(b.prompt_token_ids) for pid, _, b in ok}
    spec = {pid: list(a.token_ids) for pid, a, _ in ok}
    plain = {pid: list(b.token_ids) for pid, _, b in ok}
    g = evidence_lossless_guard([RunOutputs("target", "A", plain), RunOutputs("dspark", "B", spec)],
                                [("target", "dspark")], prompts, scorer, control_pair=None, alpha=NO_RATE_TEST_ALPHA,
                                dtype=dtype, decode=decode, name="greedy_lossless", progress=progress)
    delta = float(g.details["delta"])
    for m in mism:
        if "error" in m:
            continue
        pid, idx = m["id"], m["first_difference"]
        spec_regret = _regret_at(scorer, prompts[pid], spec[pid], idx)
        target_regret = _regret_at(scorer, prompts[pid], plain[pid], idx)
        flip = spec_regret is not None and target_regret is not None and max(spec_regret, target_regret) <= delta
        m.update(kind="rounding_flip" if flip else "divergence", spec_regret=spec_regret,
                 target_regret=target_regret, delta=delta)
    d = g.details
    return {"greedy_mismatches": mism, "greedy_rounding_flips": sum(m.get("kind") == "rounding_flip" for m in mism),
            "greedy_lossless": bool(g.passed) and not failed,
            "greedy_evidence": g.message + (f"; {len(failed)} request(s) failed" if failed else ""),
            "greedy_guard": {"delta": delta, "delta_forward": d["delta_forward"],
                             "forward_noise_quantiles": {str(q): v for q, v in d["forward_noise_quantiles"].items()},
                             "comparisons": d["comparisons"], "real_divergence_count": d["real_divergence_count"],
                             "real_divergences": d["real_divergences"]}}


def misses_by_kind(outputs: Sequence[Any], ids: Sequence[str], text_of: Callable[[int], str],
                   sources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A row's rejected drafts by the kind of the target's token there (``draft_misses_by_kind``,
    :func:`dspark.bench.draft_misses.draft_misses_by_kind`) and, where its prompts carry two or more source labels,
    the same per label (``draft_misses_by_source``, by label). An output whose per-step record does not add up to
    its tokens (an engine fault) leaves the tally out, with the reason in ``draft_misses_error``, rather than lose
    the row's other measurements."""
    text_of = functools.lru_cache(maxsize=None)(text_of)  # each token's text read once for the row and its labels
    try:
        row: dict[str, Any] = {"draft_misses_by_kind": draft_misses_by_kind(outputs, text_of)}
    except ValueError as exc:
        return {"draft_misses_by_kind": None, "draft_misses_error": str(exc)}
    if sources:
        groups: dict[str, list[Any]] = {}
        for pid, o in zip(ids, outputs):
            groups.setdefault(str(sources.get(pid, "unlabelled")), []).append(o)
        if len(groups) > 1:
            row["draft_misses_by_source"] = {name: draft_misses_by_kind(outs, text_of)
                                             for name, outs in sorted(groups.items())}
    return row


def _rescoring_bar(total: int) -> Callable[[int], Any]:
    """A progress bar's update(n), called with the outputs each packed forward of the re-scoring scored."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="greedy check: fp32 re-scoring", unit="output").update


def evaluate(spec_engine, plain_engine, prompt_sets: dict[str, list[tuple[str, Any]]], temperatures: Sequence[float],
             *, max_tokens: int, top_p: float = 1.0, top_k: int = 0, seed: int = 0, progress: bool = False,
             dtype: str | None = None, scorer=None,
             decode: Callable[[list[int]], str] | None = None, n_resamples: int = 2000,
             ci_level: float = 0.95, sources: Mapping[str, str] | None = None,
             replay: Callable[[Sequence[Any], Sequence[SamplingParams]], tuple] | None = None) -> dict[str, Any]:
    """Run every (workload, temperature); ``prompt_sets`` maps workload -> [(id, prompt)] (messages or ids);
    ``sources`` labels the prompt ids (:func:`by_source`).
    ``seed`` also seeds the prompt bootstrap of each row's intervals. Each temperature-0 row is checked by
    :func:`greedy_check`: exactly in float32, on evidence in reduced precision (``dtype``; default the
    target-only engine's target's), with ``scorer`` (default one ``ReferenceScorer`` of that target, made here
    and re-used by every row); ``decode`` renders tokens in its evidence, and with it each row also gives its
    rejected drafts by the kind of the target's token there (``draft_misses_by_kind``,
    :mod:`dspark.bench.draft_misses`). ``replay`` (prompts, params -> the outputs of batch-invariant copies of the
    two engines, :class:`BatchInvariantReplay`) tells float32 mismatches' cause (:func:`replay_batch_invariant`)."""
    block = spec_engine.block_size
    if dtype is None:
        dtype = str(next(plain_engine.target.parameters()).dtype).removeprefix("torch.")
    exact = dtype in FULL_PRECISION_DTYPES
    if not exact and scorer is None and any(t == 0 for t in temperatures):
        from dspark.bench.reference import ReferenceScorer

        scorer = ReferenceScorer(plain_engine.target)  # its float32 copy is made when the first row is scored
    rescoring = _rescoring_bar if progress else None
    results = []
    for name, items in prompt_sets.items():
        ids = [pid for pid, _ in items]
        prompts = [p for _, p in items]
        for temp in temperatures:
            base = SamplingParams(temperature=float(temp), top_p=float(top_p) if temp > 0 else 1.0,
                                  top_k=int(top_k) if temp > 0 else 0, max_tokens=int(max_tokens))
            params = [replace(base, seed=zlib.crc32(f"{seed}:{pid}".encode()) & 0x7FFF_FFFF) for pid in ids]
            spec_engine.reset()
            t0 = time.perf_counter()
            spec_out = spec_engine.generate(prompts, params, progress=progress)
            wall = time.perf_counter() - t0
            row = {"workload": name, "temperature": float(temp), "wall_s": round(wall, 3),
                   **acceptance_metrics(spec_out, block, ids, n_resamples=n_resamples, ci_level=ci_level,
                                        seed=seed, sources=sources)}
            if decode is not None:
                row.update(misses_by_kind(spec_out, ids, lambda token: decode([token]), sources))
            if temp == 0:
                plain_engine.reset()
                plain_out = plain_engine.generate(prompts, params, progress=progress)
                again = None
                if exact and replay is not None:
                    again = lambda idx, prompts=prompts, params=params: replay(  # noqa: E731
                        [prompts[i] for i in idx], [params[i] for i in idx])
                row.update(greedy_check(spec_out, plain_out, ids, dtype=dtype, scorer=None if exact else scorer,
                                        decode=decode, progress=rescoring,
                                        float64_target=plain_engine.target if exact else None, replay=again))
            results.append(row)
    lossless = all(r.get("greedy_lossless", True) for r in results)
    return {"block_size": block, "results": results, "greedy_lossless": lossless,
            "bootstrap": {"unit": "prompt", "n_resamples": int(n_resamples), "ci_level": float(ci_level),
                          "seed": int(seed)}}


METHOD_NAMES = {"bca": "BCa", "percentile": "percentile (BCa undefined)", "zero-width": "zero-width (no spread)"}


def _fmt(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _with_ci(value: float | None, ci: Mapping[str, Any] | None, digits: int = 3) -> str:
    if value is None or not ci or ci.get("low") is None:
        return _fmt(value, digits)
    return f"{value:.{digits}f} ({ci['low']:.{digits}f} .. {ci['high']:.{digits}f})"


def _ci_method(ci: Mapping[str, Any] | None) -> str:
    if not ci:
        return "-"
    if ci.get("method") is None:
        return f"none ({ci.get('n_prompts', 0)} prompt{'s' * (ci.get('n_prompts') != 1)})"
    return METHOD_NAMES.get(ci["method"], str(ci["method"]))


def rounding_flips(row: Mapping[str, Any]) -> int:
    """A temperature-0 row's rounding flips: ``greedy_rounding_flips``, or in an eval.json written before the
    evidence guard, its ``greedy_near_ties`` (mismatches of ``kind`` "near_tie" under a fixed logit margin)."""
    for key in ("greedy_rounding_flips", "greedy_near_ties"):
        if row.get(key) is not None:
            return int(row[key])
    return sum(m.get("kind") in ("rounding_flip", "near_tie") for m in row.get("greedy_mismatches") or [])


def row_count_flips(row: Mapping[str, Any]) -> int:
    """A float32 row's mismatches that a batch-invariant replay gave identical outputs
    (:func:`replay_batch_invariant`)."""
    return sum(m.get("kind") == "row_count_flip" for m in row.get("greedy_mismatches") or [])


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def greedy_cell(row: Mapping[str, Any]) -> str:
    """The table's "greedy = target" cell: "yes", "yes (2 rounding flips)", "NO (1 unexplained, 2 rounding
    flips)"; "n/a" for a sampled row. Reads the older eval.json fields (near-tie flips) too."""
    if "greedy_lossless" not in row:
        return "n/a"
    n, flips = len(row.get("greedy_mismatches") or []), rounding_flips(row)
    noun = "rounding flip" if "greedy_near_ties" not in row else "near-tie flip"
    if row["greedy_lossless"]:
        return f"yes ({_count(flips, noun)})" if n else "yes"
    row_count = row_count_flips(row)
    parts = [f"{n - flips - row_count} unexplained", _count(flips, noun)]
    if row_count:
        parts.append(_count(row_count, "row-count flip"))
    beyond = (row.get("greedy_guard") or {}).get("real_divergence_count") or 0
    if beyond:
        parts.append(_count(beyond, "token") + " beyond the noise bound")
    return f"NO ({', '.join(parts)})"


def markdown_table(report: dict[str, Any]) -> str:
    block = report["block_size"]
    level = report.get("bootstrap", {}).get("ci_level", 0.95)
    long_at = next((r["accept_length_by_prompt_length"]["threshold_tokens"] for r in report["results"]
                    if "accept_length_by_prompt_length" in r), LONG_PROMPT_TOKENS)
    head = (["workload", "T", "requests", f"accept length ({level:.0%} CI)"] + [f"p{i + 1}" for i in range(block)]
            + [f"prompts <= {long_at} / longer: accept length (n)", "CI method", "greedy = target"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    for r in report["results"]:
        greedy = greedy_cell(r)
        pos = r["per_position_acceptance"]
        cells = [r["workload"], f"{r['temperature']:g}", str(r["requests"]),
                 _with_ci(r["mean_accept_length"], r.get("mean_accept_length_ci"))]
        cells += [_with_ci(pos[0], r.get("p1_acceptance_ci"), 2) if pos else "-"]
        split = r.get("accept_length_by_prompt_length") or {}
        by_len = " / ".join(f"{_fmt(split[k]['mean_accept_length'])} ({split[k]['prompts']})" if k in split else "-"
                            for k in ("short", "long"))
        cells += [_fmt(v, 2) for v in pos[1:]] + [by_len, _ci_method(r.get("mean_accept_length_ci")), greedy]
        lines.append("| " + " | ".join(cells) + " |")
    boot = report.get("bootstrap")
    if boot:
        lines.append("")
        lines.append(f"Intervals: {boot['ci_level']:.0%} bootstrap over prompts ({boot['n_resamples']} resamples, "
                     f"seed {boot['seed']}) of the accept length and of p1.")
    by = [r for r in report["results"] if r.get("accept_length_by_source")]
    if by:
        lines += ["", "Accept length by source, lowest first (prompts):", ""]
        for r in by:
            groups = ", ".join(f"{name} {_fmt(g['mean_accept_length'], 2)} ({g['prompts']})"
                               for name, g in r["accept_length_by_source"].items())
            lines.append(f"- {r['workload']}, T={r['temperature']:g}: {groups}")
    misses = [r for r in report["results"] if r.get("draft_misses_by_kind") or r.get("draft_misses_error")]
    if misses:
        lines += ["", "Rejected drafts by the kind of the target's token there: share of the rejections "
                      "(rejection rate of the drafts verified at such tokens):", ""]
        lines += [f"- {r['workload']}, T={r['temperature']:g}: "
                  + (misses_line(r["draft_misses_by_kind"]) if r.get("draft_misses_by_kind")
                     else f"not tallied: {r['draft_misses_error']}") for r in misses]
    return "\n".join(lines) + "\n"


# ---- paired comparison of two reports ------------------------------------------------------------------
def load_report(path: str | Path) -> dict[str, Any]:
    """An eval.json (or the folder holding one; either may be its committed ``eval.json.xz`` copy,
    :mod:`dspark.packed_files`), with ``path`` added; a clear error when it is missing, not JSON, or not an
    eval_drafter report."""
    from dspark.packed_files import plain_or_packed, read_text

    asked = Path(path)
    p = plain_or_packed(asked / "eval.json" if asked.is_dir() else asked)
    if p is None:
        where = asked / "eval.json" if asked.is_dir() else asked
        raise ConfigError(f"compare: {where} does not exist (give an eval.json, or the folder eval_drafter wrote it "
                          f"to)")
    try:
        report = json.loads(read_text(p))
    except (json.JSONDecodeError, lzma.LZMAError) as e:
        raise ConfigError(f"compare: {p} is not valid JSON ({e}); it is truncated or not an eval.json") from None
    if not isinstance(report, dict) or not isinstance(report.get("results"), list):
        raise ConfigError(f"compare: {p} is not an eval_drafter report (no 'results' list)")
    report["path"] = str(p)
    return report


def _row_key(r: Mapping[str, Any]) -> tuple[str, float]:
    return r["workload"], float(r["temperature"])


def _paired_change(a: np.ndarray, b: np.ndarray, *, n_resamples: int, ci_level: float, seed: int
                   ) -> tuple[float, dict[str, Any]]:
    """100 (mean b / mean a - 1) over paired prompts, and its paired prompt-bootstrap interval (bounds in %)."""
    ci = bootstrap_interval([a, b], _relative_change, paired=True, n_resamples=n_resamples, ci_level=ci_level,
                            seed=seed)
    if len(a) >= 2 and np.array_equal(a, b):  # every resample gives 0; BCa would be undefined
        ci.update(low=0.0, high=0.0, method="zero-width", note="A and B gave the same value on every prompt")
    for key in ("low", "high"):
        ci[key] = None if ci[key] is None else 100.0 * ci[key]
    ci["unit"] = "%"
    return 100.0 * float(_relative_change(a, b)), ci


# A source with fewer prompts than this gets its change without an interval: a bootstrap over two or three
# prompts has only a handful of distinct resamples, and its "interval" would be their spread.
MIN_PROMPTS_FOR_SOURCE_INTERVAL = 5


def compare_by_source(pa: Mapping[str, Mapping[str, Any]], pb: Mapping[str, Mapping[str, Any]],
                      labels: Mapping[str, str], *, n_resamples: int = 2000, ci_level: float = 0.95,
                      seed: int = 0) -> list[dict[str, Any]]:
    """:func:`compare_rows`' change for each source label's prompts (``labels``: {prompt id: label}, the prompts
    both rows hold), lowest change first: where B gains on A and where it does not. Empty with fewer than two
    labels; a prompt without a label counts as "unlabelled". A source of fewer than
    ``MIN_PROMPTS_FOR_SOURCE_INTERVAL`` prompts gets no interval (its ``ci`` says why)."""
    groups: dict[str, list[str]] = {}
    for pid in sorted(labels):
        groups.setdefault(labels[pid] or "unlabelled", []).append(pid)
    if len(groups) < 2:
        return []
    rows = []
    for name, pids in groups.items():
        a = np.array([pa[k]["mean_accept_length"] for k in pids], dtype=float)
        b = np.array([pb[k]["mean_accept_length"] for k in pids], dtype=float)
        change, ci = _paired_change(a, b, n_resamples=n_resamples, ci_level=ci_level, seed=seed)
        if len(pids) < MIN_PROMPTS_FOR_SOURCE_INTERVAL:
            ci.update(low=None, high=None, method=None,
                      note=f"{len(pids)} prompt(s): an interval needs {MIN_PROMPTS_FOR_SOURCE_INTERVAL} or more")
        rows.append({"source": name, "n_prompts": len(pids), "a_mean_accept_length": float(a.mean()),
                     "b_mean_accept_length": float(b.mean()), "change_pct": change, "ci": ci})
    return sorted(rows, key=lambda r: (r["change_pct"], r["source"]))


def compare_rows(row_a: Mapping[str, Any], row_b: Mapping[str, Any], *, n_resamples: int = 2000,
                 ci_level: float = 0.95, seed: int = 0, sources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """B's mean accept length relative to A's on the prompts both rows hold (by id, both without error):
    ``change_pct`` = 100 (mean B / mean A - 1), with a paired prompt-bootstrap interval ``ci`` (in %), and the
    same per source label (``by_source``, :func:`compare_by_source`) where the prompts carry labels (each
    prompt's ``source``, else ``sources``: {prompt id: label})."""
    for name, row in (("A", row_a), ("B", row_b)):
        if "per_prompt" not in row:
            raise ValueError(f"report {name}, {row['workload']} T={row['temperature']:g}: no per_prompt values "
                             "(written before eval_drafter saved them); run eval_drafter again")
    pa, pb = row_a["per_prompt"], row_b["per_prompt"]
    valid = lambda pp: {k for k, e in pp.items() if e.get("mean_accept_length") is not None}  # noqa: E731
    va, vb = valid(pa), valid(pb)
    shared = sorted(va & vb)
    a = np.array([pa[k]["mean_accept_length"] for k in shared], dtype=float)
    b = np.array([pb[k]["mean_accept_length"] for k in shared], dtype=float)
    out: dict[str, Any] = {"workload": row_a["workload"], "temperature": float(row_a["temperature"]),
                           "n_prompts": len(shared), "only_a": sorted(va - vb), "only_b": sorted(vb - va)}
    if not shared:
        out.update(a_mean_accept_length=None, b_mean_accept_length=None, change_pct=None,
                   ci=bootstrap_interval([[]], np.mean, n_resamples=n_resamples, ci_level=ci_level, seed=seed),
                   by_source=[])
        return out
    change, ci = _paired_change(a, b, n_resamples=n_resamples, ci_level=ci_level, seed=seed)
    labels = {k: pb[k].get("source") or pa[k].get("source") or (sources or {}).get(k) for k in shared}
    by_source = compare_by_source(pa, pb, labels, n_resamples=n_resamples, ci_level=ci_level, seed=seed)
    out.update(a_mean_accept_length=float(a.mean()), b_mean_accept_length=float(b.mean()), change_pct=change, ci=ci,
               by_source=by_source)
    return out


def compare_reports(report_a: Mapping[str, Any], report_b: Mapping[str, Any], *, n_resamples: int = 2000,
                    ci_level: float = 0.95, seed: int = 0, sources: Mapping[str, str] | None = None
                    ) -> dict[str, Any]:
    """:func:`compare_rows` for every (workload, temperature) row both reports hold (e.g. A: the DFlash
    ablation, B: DSpark, evaluated on the same prompts); ``notes`` name rows only one holds and settings
    that differ between the two runs. ``sources`` labels prompts whose reports do not (written before
    eval_drafter saved each prompt's label)."""
    rows_a = {_row_key(r): r for r in report_a["results"]}
    rows_b = {_row_key(r): r for r in report_b["results"]}
    notes = [f"{w} T={t:g}: only in {name}" for name, mine, other in (("A", rows_a, rows_b), ("B", rows_b, rows_a))
             for w, t in mine if (w, t) not in other]
    for key in ("max_tokens", "engine", "block_size"):
        if report_a.get(key) != report_b.get(key):
            notes.append(f"{key} differs: A {report_a.get(key)!r}, B {report_b.get(key)!r}")
    rows = [compare_rows(rows_a[k], rows_b[k], n_resamples=n_resamples, ci_level=ci_level, seed=seed,
                         sources=sources) for k in rows_a if k in rows_b]
    for r in rows:
        if r["only_a"] or r["only_b"]:
            notes.append(f"{r['workload']} T={r['temperature']:g}: {len(r['only_a'])} prompt(s) only in A, "
                         f"{len(r['only_b'])} only in B (left out of the pairing)")
    return {"a": {k: report_a.get(k) for k in ("path", "checkpoint")},
            "b": {k: report_b.get(k) for k in ("path", "checkpoint")},
            "statistic": "100 * (mean over shared prompts of B's per-prompt mean accept length / A's - 1)",
            "bootstrap": {"unit": "prompt (paired)", "n_resamples": int(n_resamples), "ci_level": float(ci_level),
                          "seed": int(seed)},
            "rows": rows, "notes": notes}


def compare_markdown(comparison: Mapping[str, Any]) -> str:
    level = comparison["bootstrap"]["ci_level"]
    head = ["workload", "T", "prompts", "A accept length", "B accept length", f"B vs A ({level:.0%} CI)", "CI method"]
    lines = [f"A: {comparison['a'].get('path')}", f"B: {comparison['b'].get('path')}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in comparison["rows"]:
        ci = r["ci"]
        change = "-" if r["change_pct"] is None else f"{r['change_pct']:+.2f}%"
        if ci.get("low") is not None:
            change += f" ({ci['low']:+.2f} .. {ci['high']:+.2f}%)"
        lines.append("| " + " | ".join([r["workload"], f"{r['temperature']:g}", str(r["n_prompts"]),
                                        _fmt(r["a_mean_accept_length"]), _fmt(r["b_mean_accept_length"]), change,
                                        _ci_method(ci)]) + " |")
    by = [r for r in comparison["rows"] if r.get("by_source")]
    if by:
        lines += ["", f"B vs A by source, lowest first ({level:.0%} CI where a source has "
                      f"{MIN_PROMPTS_FOR_SOURCE_INTERVAL} or more prompts; prompts):", ""]
        for r in by:
            groups = []
            for g in r["by_source"]:
                ci = g["ci"]
                interval = f"{ci['low']:+.1f} .. {ci['high']:+.1f}%; " if ci.get("low") is not None else ""
                groups.append(f"{g['source']} {g['change_pct']:+.1f}% ({interval}{g['n_prompts']})")
            lines.append(f"- {r['workload']}, T={r['temperature']:g}: " + ", ".join(groups))
    lines += [""] + [f"- {n}" for n in comparison["notes"]]
    return "\n".join(lines).rstrip() + "\n"


def run_compare(cfg: Any) -> dict[str, Any]:
    """``compare=[A,B]``: compare two eval.json reports; writes compare.json and compare.md to output_dir if set."""
    paths = list(cfg.compare)
    if len(paths) != 2:
        raise ConfigError(f"compare: give two eval.json files (or folders), [A,B], got {paths}")
    report_a, report_b = load_report(paths[0]), load_report(paths[1])
    unlabelled = sorted({r["workload"] for rep in (report_a, report_b) for r in rep["results"]
                         if any(not e.get("source") for e in r.get("per_prompt", {}).values())})
    sources, missing = eval_source_labels(unlabelled)
    comparison = compare_reports(report_a, report_b, n_resamples=int(cfg.n_resamples), ci_level=float(cfg.ci_level),
                                 seed=int(cfg.seed), sources=sources)
    comparison["notes"] += [f"{name}: no source labels ({why})" for name, why in missing.items()]
    if cfg.output_dir:
        out_dir = Path(cfg.output_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "compare.json").write_text(json.dumps(comparison, indent=2) + "\n")
        (out_dir / "compare.md").write_text(compare_markdown(comparison))
        from dspark.bench.compare_plot import plot_comparison

        plot_comparison(comparison, out_dir / "compare.png")
    return comparison


def eval_source_labels(names: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """{prompt id: source label} of every eval-split prompt of the named workloads (for reports written before
    eval_drafter saved each prompt's label; ids and labels are stable), and {workload: why not} for those that
    could not be loaded (a custom workload that is not here)."""
    from workloads.base import WorkloadError

    labels: dict[str, str] = {}
    missing: dict[str, str] = {}
    for name in names:
        try:
            labels.update(eval_prompt_sets([name], None, 0)[1])
        except (WorkloadError, OSError, ValueError) as e:
            missing[name] = str(e).splitlines()[0] if str(e) else type(e).__name__
    return labels, missing


def eval_prompt_sets(names: Sequence[str], num_prompts: int | None, seed: int
                     ) -> tuple[dict[str, list[tuple[str, Any]]], dict[str, str]]:
    """The eval-split prompts of each workload (``num_prompts`` of each, None: all of them), {workload: [(id,
    messages or prompt)]}, and {id: source label}."""
    sets, sources = {}, {}
    count = None if num_prompts is None else int(num_prompts)
    for name in names:
        workload = build_workload(make_spec(name, split="eval", num_prompts=count, seed=int(seed),
                                            greedy_replica_count=0))
        prompts = workload.prompts()
        sets[name] = [(p.id, p.messages if p.messages is not None else p.prompt) for p in prompts]
        sources.update({p.id: p.source for p in prompts if p.source})
    return sets, sources


def eval_prompts(names: Sequence[str], num_prompts: int, seed: int) -> dict[str, list[tuple[str, Any]]]:
    """The prompts of :func:`eval_prompt_sets`, without their labels."""
    return eval_prompt_sets(names, num_prompts, seed)[0]


def run(cfg: Any, target=None, tokenizer=None, prompt_sets: dict[str, list[tuple[str, Any]]] | None = None
        ) -> dict[str, Any]:
    """Evaluate cfg.checkpoint; ``target``/``tokenizer``/``prompt_sets`` override loading (tests)."""
    from dspark.engine import Engine
    from dspark.model_runner import DTYPES

    if not cfg.checkpoint:
        raise ConfigError("checkpoint: give the drafter folder to evaluate, e.g. checkpoint=runs/dspark/final")
    checkpoint = Path(resolve_drafter_path(str(cfg.checkpoint), key="checkpoint"))  # a folder, or builtin:NAME
    if any(t < 0 for t in cfg.temperatures) or not cfg.temperatures:
        raise ConfigError(f"temperatures: need at least one value >= 0, got {list(cfg.temperatures)}")
    if not 0.0 < float(cfg.ci_level) < 1.0:
        raise ConfigError(f"ci_level: the bootstrap interval's level must lie in (0, 1), e.g. 0.95; got {cfg.ci_level}")
    from runners.common import check_sampling, writable_folder

    check_sampling({"top_p": "top_p", "top_k": "top_k", "max_tokens": "max_tokens"}, temperature=1.0,
                   top_p=float(cfg.top_p), top_k=int(cfg.top_k), max_tokens=int(cfg.max_tokens))
    writable_folder(cfg.output_dir or checkpoint / "eval", "output_dir")  # before any model loads
    spec_cfg = to_engine_config(cfg.engine, spec="dspark")
    plain_cfg = to_engine_config(cfg.engine, spec="off")
    if target is None:
        from runners.train_drafter import load_target_and_tokenizer

        target, tokenizer = load_target_and_tokenizer(cfg)
    drafter = DSparkDrafter.load(checkpoint, target.cfg, device=spec_cfg.device, dtype=DTYPES[spec_cfg.dtype])
    sources = None
    if prompt_sets is None:
        prompt_sets, sources = eval_prompt_sets(list(cfg.workloads), int(cfg.num_prompts), int(cfg.seed))
    spec_engine = Engine(target, tokenizer, spec_cfg, drafter)
    plain_engine = Engine(target, tokenizer, plain_cfg)
    replay = None  # float32 engines that are not batch-invariant: mismatches are generated again batch-invariant
    if spec_cfg.dtype in FULL_PRECISION_DTYPES and not spec_cfg.batch_invariant:
        invariant = {**dict(cfg.engine), "batch_invariant": True}
        try:
            spec_inv, plain_inv = (to_engine_config(invariant, spec=s) for s in ("dspark", "off"))
        except ConfigError:  # settings without a batch-invariant mode: a mismatch stays a divergence, unexplained
            pass
        else:
            replay = BatchInvariantReplay(lambda: (Engine(target, tokenizer, spec_inv, drafter),
                                                   Engine(target, tokenizer, plain_inv)))
    decode = None  # renders the tokens the greedy check's evidence names
    if tokenizer is not None and hasattr(tokenizer, "decode"):
        decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    report = evaluate(spec_engine, plain_engine, prompt_sets, list(cfg.temperatures), max_tokens=int(cfg.max_tokens),
                      top_p=float(cfg.top_p), top_k=int(cfg.top_k), seed=int(cfg.seed), progress=bool(cfg.progress),
                      dtype=spec_cfg.dtype, decode=decode, sources=sources, replay=replay,
                      n_resamples=int(cfg.n_resamples), ci_level=float(cfg.ci_level))
    report.update({"checkpoint": str(checkpoint.resolve()), "drafter": drafter.cfg.to_dict(),
                   "engine": {"device": spec_cfg.device, "dtype": spec_cfg.dtype, "verify": spec_cfg.verify,
                              "kernels": spec_engine.fingerprint()["kernels"]},
                   "max_tokens": int(cfg.max_tokens)})
    out_dir = Path(cfg.output_dir) if cfg.output_dir else checkpoint / "eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "eval.md").write_text(markdown_table(report))
    report["output_dir"] = str(out_dir.resolve())
    return report


@runner_main("eval_drafter")
def main(cfg: DictConfig) -> None:
    if cfg.compare:
        print(compare_markdown(run_compare(cfg)))
        return
    report = run(cfg)
    print(markdown_table(report))
    if not report["greedy_lossless"]:
        rows = report["results"]
        mismatches = sum(len(r.get("greedy_mismatches") or []) for r in rows)
        hint = ""
        if mismatches and sum(row_count_flips(r) for r in rows) == mismatches:
            hint = ("; each was identical when replayed with engine.batch_invariant=true: this engine's GEMMs "
                    "round a row differently in steps of different row counts, and that flipped a near-tie; "
                    "engine.batch_invariant=true checks float32 outputs exactly")
        raise SystemExit(f"greedy speculative outputs differ from target-only outputs{hint}; see eval.json")


if __name__ == "__main__":
    main()
