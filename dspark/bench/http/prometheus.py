"""Speculative decoding read from a server's Prometheus counters, per block by delta.

A server's counters grow over its life; the arm scrapes ``/metrics`` right before and right after each block
(its warm-up already done) and keeps the difference. Samples are summed over every label set (engines,
models) except the draft position, which keeps its own series. A counter that shrank between the scrapes
(the server restarted within the block) is an error, never a negative count.

The names each server exports (:data:`FLAVOURS`), as found in its source:

- ``vllm``: ``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total``,
  ``vllm:spec_decode_num_accepted_tokens_total`` and ``vllm:spec_decode_num_accepted_tokens_per_pos_total``
  (label ``position``): vllm/v1/spec_decode/metrics.py (``SpecDecodingProm``). Per-position acceptance
  there is accepted at a position over drafts.
- ``dspark`` (``runners.serve``): the same vLLM names, and the engine's own counters under ``dspark:``
  (dspark/serving/metrics.py), from which the A/B's engine counters are rebuilt (:func:`dspark_engine_counters`).
- ``trtllm`` (``trtllm-serve``): ``trtllm_spec_decode_num_draft_tokens_total``,
  ``trtllm_spec_decode_num_accepted_tokens_total``, and per position (label ``token_position``)
  ``trtllm_spec_decode_drafted_tokens_total`` and ``trtllm_spec_decode_accepted_tokens_total``:
  tensorrt_llm/metrics/collector.py (``MetricsCollector``). No count of drafts is exported, so no accept
  length; per-position acceptance is accepted over drafted at that position.
- ``sglang``: no speculative-decoding counters. The gauges ``sglang:spec_accept_length`` and
  ``sglang:spec_accept_rate`` (python/sglang/srt/metrics/collector.py, ``SchedulerMetricsCollector``) hold
  the scheduler's last logging interval; they are read at the block's end as they are, recorded under their
  own names and never as the block's acceptance.
- ``llamacpp`` (``llama-server --metrics``): ``/metrics`` exports no speculative-decoding counters (the list
  in tools/server/README.md). Its responses carry ``timings.draft_n`` and ``timings.draft_n_accepted`` when
  drafting ran (tools/server/server-task.cpp, ``result_timings::to_json``); the load generator keeps them per
  request and the arm sums them over the block (:func:`timings_acceptance`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class MetricsError(RuntimeError):
    """A metrics endpoint could not be read, or its counters went backwards within a block."""


@dataclass(frozen=True)
class SpecDecodeNames:
    """The sample names (``_total`` included) one kind of server exports its speculative decoding under;
    None where it exports no such counter. ``gauges``: (key, sample name) read as they are at a block's end."""

    flavour: str
    source: str
    drafts: str | None = None
    draft_tokens: str | None = None
    accepted_tokens: str | None = None
    accepted_per_position: str | None = None
    drafted_per_position: str | None = None
    position_label: str | None = None
    gauges: tuple[tuple[str, str], ...] = ()


_VLLM = dict(drafts="vllm:spec_decode_num_drafts_total", draft_tokens="vllm:spec_decode_num_draft_tokens_total",
             accepted_tokens="vllm:spec_decode_num_accepted_tokens_total",
             accepted_per_position="vllm:spec_decode_num_accepted_tokens_per_pos_total", position_label="position")
FLAVOURS: dict[str, SpecDecodeNames] = {
    "vllm": SpecDecodeNames("vllm", "vllm/v1/spec_decode/metrics.py (SpecDecodingProm)", **_VLLM),
    "dspark": SpecDecodeNames("dspark", "dspark/serving/metrics.py (vLLM's names, and the engine's under dspark:)",
                              **_VLLM),
    "trtllm": SpecDecodeNames("trtllm", "tensorrt_llm/metrics/collector.py (MetricsCollector)",
                              draft_tokens="trtllm_spec_decode_num_draft_tokens_total",
                              accepted_tokens="trtllm_spec_decode_num_accepted_tokens_total",
                              accepted_per_position="trtllm_spec_decode_accepted_tokens_total",
                              drafted_per_position="trtllm_spec_decode_drafted_tokens_total",
                              position_label="token_position"),
    "sglang": SpecDecodeNames("sglang", "python/sglang/srt/metrics/collector.py (SchedulerMetricsCollector: gauges "
                              "of the last logging interval, no counters)",
                              gauges=(("sglang_spec_accept_length_gauge", "sglang:spec_accept_length"),
                                      ("sglang_spec_accept_rate_gauge", "sglang:spec_accept_rate"))),
    "llamacpp": SpecDecodeNames("llamacpp", "tools/server/README.md (/metrics: no speculative-decoding counters); "
                                "per request timings.draft_n / timings.draft_n_accepted "
                                "(tools/server/server-task.cpp)"),
}


# ---- reading -------------------------------------------------------------------------------------
def parse_samples(text: str) -> Samples:
    """Prometheus exposition text -> {(sample name, sorted labels): value}."""
    out: Samples = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    except ValueError as exc:
        raise MetricsError(f"not Prometheus exposition text: {exc}") from None
    return out


def scrape(url: str, timeout_s: float = 10.0) -> Samples:
    """The samples ``url`` exports now (MetricsError when it cannot be read)."""
    try:
        response = httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise MetricsError(f"{url}: cannot read the metrics ({type(exc).__name__}: {exc})") from None
    if response.status_code != 200:
        raise MetricsError(f"{url}: answered {response.status_code} instead of the metrics: {response.text[:200]}")
    return parse_samples(response.text)


def total(samples: Samples, name: str) -> float | None:
    """The sum of ``name``'s samples over every label set; None when the server exports no such sample."""
    values = [v for (n, _), v in samples.items() if n == name]
    return sum(values) if values else None


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """``name``'s samples summed per value of ``label`` (its other labels summed over)."""
    out: dict[str, float] = {}
    for (n, labels), v in samples.items():
        if n == name:
            key = dict(labels).get(label)
            if key is not None:
                out[key] = out.get(key, 0.0) + v
    return out


def _delta(before: Samples, after: Samples, name: str) -> int | float | None:
    a, b = total(after, name), total(before, name)
    if a is None:
        return None
    return _checked(name, (a - (b or 0.0)))


def _checked(name: str, diff: float) -> int | float:
    """A counter's growth: an int for a count, a float for a sum of amounts (milliseconds, predicted tokens)."""
    if diff < -1e-6:
        raise MetricsError(f"{name} went down by {-diff:g} within the block: the server restarted (or its counter "
                           "was reset) between the scrapes, so the block's count is unknown")
    return int(round(diff)) if abs(diff - round(diff)) < 1e-9 else diff


def _delta_by_label(before: Samples, after: Samples, name: str, label: str) -> dict[str, int] | None:
    a = by_label(after, name, label)
    if not a:
        return None
    b = by_label(before, name, label)
    return {key: _checked(f"{name}{{{label}={key!r}}}", value - b.get(key, 0.0)) for key, value in a.items()}


def _positions(counts: Mapping[str, int] | None) -> list[int] | None:
    """Per-position counts keyed by the position label ("0", "1", ...) as a list by position."""
    if counts is None:
        return None
    try:
        keyed = {int(k): v for k, v in counts.items()}
    except ValueError:
        raise MetricsError(f"draft positions must be integers, got labels {sorted(counts)}") from None
    return [keyed.get(p, 0) for p in range(max(keyed) + 1)] if keyed else []


# ---- per-block deltas ----------------------------------------------------------------------------
@dataclass
class SpecDecodeDelta:
    """One block's speculative decoding from a server's counters (None: not exported by that server)."""

    flavour: str
    drafts: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    accepted_per_position: list[int] | None = None
    drafted_per_position: list[int] | None = None
    gauges: dict[str, float] = field(default_factory=dict)

    def counters(self) -> dict[str, float]:
        """The block's counters under ``spec_decode/`` (what blocks.csv records as counter/spec_decode/...)."""
        out: dict[str, float] = {}
        for key in ("drafts", "draft_tokens", "accepted_tokens"):
            value = getattr(self, key)
            if value is not None:
                out[f"spec_decode/num_{key}"] = value
        for key, values in (("accepted_pos", self.accepted_per_position), ("drafted_pos", self.drafted_per_position)):
            for position, n in enumerate(values or []):
                out[f"spec_decode/{key}.{position}"] = n
        out.update({f"spec_decode/{k}": v for k, v in self.gauges.items()})
        return out

    def acceptance(self) -> dict[str, Any]:
        """The block's acceptance from the counters, pooled over its drafts (a token-weighted mean, where the
        per-request fields give a mean over requests): accept_length = 1 + accepted / drafts (bonus token
        included), accept_rate = accepted / draft tokens, and per position accepted over drafts (vLLM) or over
        drafted at that position (TensorRT-LLM). Keys whose counters the server does not export are absent."""
        out: dict[str, Any] = {}
        if self.drafts and self.accepted_tokens is not None:
            out["accept_length"] = 1.0 + self.accepted_tokens / self.drafts
        if self.draft_tokens and self.accepted_tokens is not None:
            out["accept_rate"] = self.accepted_tokens / self.draft_tokens
        if self.accepted_per_position is not None:
            if self.drafted_per_position is not None:
                reached = self.drafted_per_position
                out["per_position_acceptance"] = [a / r if r else math.nan for a, r in
                                                  zip(self.accepted_per_position, reached)]
            elif self.drafts:
                out["per_position_acceptance"] = [a / self.drafts for a in self.accepted_per_position]
        return out


def spec_decode_delta(before: Samples, after: Samples, names: SpecDecodeNames) -> SpecDecodeDelta:
    """The block's speculative decoding: ``after`` minus ``before`` for each counter of ``names``; its gauges as
    ``after`` holds them."""
    out = SpecDecodeDelta(names.flavour)
    for key in ("drafts", "draft_tokens", "accepted_tokens"):
        name = getattr(names, key)
        if name is not None:
            setattr(out, key, _delta(before, after, name))
    if names.position_label is not None:
        for key in ("accepted_per_position", "drafted_per_position"):
            name = getattr(names, key)
            if name is not None:
                setattr(out, key, _positions(_delta_by_label(before, after, name, names.position_label)))
    for key, name in names.gauges:
        value = total(after, name)
        if value is not None:
            out.gauges[key] = value
    return out


def timings_acceptance(timings: Iterable[Mapping[str, Any] | None]) -> dict[str, int] | None:
    """llama.cpp: the block's drafted and accepted tokens summed from its responses' ``timings`` (None when no
    response carried ``draft_n``: drafting did not run, or the server is not llama.cpp)."""
    drafted = accepted = 0
    seen = False
    for t in timings:
        if t and t.get("draft_n") is not None:
            seen = True
            drafted += int(t["draft_n"])
            accepted += int(t.get("draft_n_accepted") or 0)
    return {"spec_decode/num_draft_tokens": drafted, "spec_decode/num_accepted_tokens": accepted} if seen else None


# ---- this project's server: the engine's counters ------------------------------------------------
# dspark:<name>_total labelled families -> the engine counter key each label value stands for.
_LABELLED = (
    ("dspark:planner_decisions_total", ("reason",), lambda reason: f"sched/plan_reason.{reason}"),
    ("dspark:verify_windows_total", ("length",), lambda length: f"sched/verify_len_hist.{length}"),
    ("dspark:draft_free_measured_steps_total", ("bucket", "kind"),
     lambda bucket, kind: f"draft_free/b{bucket}/{kind}_steps"),
    ("dspark:service_cost_steps_total", ("part",), lambda part: f"service_cost/{part}_steps"),
    ("dspark:confidence_calibration_steps_total", ("method", "steps"),
     lambda method, steps: f"confidence_calibration/{'greedy_' if steps == 'greedy' else ''}{method}_steps"),
)


def dspark_engine_counters(before: Samples, after: Samples) -> dict[str, float]:
    """A ``runners.serve`` server's engine counters over a block, under ``Engine.counters()``'s keys: the
    ``dspark:`` counters of dspark/serving/metrics.py by delta, and the ratios the engine derives from them
    (trim_ratio, accept_rate, mean_running_batch) computed again from the deltas."""
    from dspark.serving.metrics import ENGINE_COUNTERS

    out: dict[str, float] = {}
    for key, metric, _ in ENGINE_COUNTERS:
        value = _delta(before, after, f"{metric}_total")
        if value is not None:
            out[key] = value
    for name, labels, key_of in _LABELLED:
        a = _label_sets(after, name, labels)
        b = _label_sets(before, name, labels)
        for values, count in a.items():
            out[key_of(*values)] = _checked(f"{name}{dict(zip(labels, values))}", count - b.get(values, 0.0))
    if out.get("ceiling_tokens") is not None and "window_tokens" in out:
        out["trim_ratio"] = 1.0 - out["window_tokens"] / out["ceiling_tokens"] if out["ceiling_tokens"] else 0.0
    if "verified_tokens" in out and "accepted_tokens" in out:
        out["accept_rate"] = out["accepted_tokens"] / out["verified_tokens"] if out["verified_tokens"] else 0.0
    if "decode_steps" in out and "request_steps" in out:
        out["mean_running_batch"] = out["request_steps"] / out["decode_steps"] if out["decode_steps"] else 0.0
    return out


def _label_sets(samples: Samples, name: str, labels: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for (n, pairs), v in samples.items():
        if n == name:
            d = dict(pairs)
            if all(label in d for label in labels):
                key = tuple(d[label] for label in labels)
                out[key] = out.get(key, 0.0) + v
    return out

