"""Per-request and per-block metrics of a benchmark arm, computed from timestamps.

Definitions (the same as the serving benchmarks of SGLang and vLLM, whose clocks start when a
request is sent):

- arrival_s is when the load generator submitted the request to the engine; scheduled_arrival_s is
  when the load was due to send it (a closed loop: the block's start, every request is due at once and
  waits for a free concurrency slot; Poisson load: its arrival time).
- queue wait = arrival_s - scheduled_arrival_s: the time a request waited before it could be sent,
  reported as its own metric and never inside TTFT (NaN when no scheduled arrival was recorded).
- TTFT = first_token_s - arrival_s.
- E2E = finish_s - arrival_s.
- TPOT = (E2E - TTFT) / (n - 1) with n output tokens. A one-token request has no
  time *per output token after the first*, so its TPOT is NaN and it is left out of
  TPOT percentiles (never counted as zero).
- ITL (inter-chunk latency): gaps between consecutive chunks of a request, where a
  chunk is everything one engine step emitted for it (several tokens under
  speculation). ITL percentiles pool the gaps of all requests.
- Throughput at full load (``steady_output_tokens_per_s``): the output tokens emitted inside the block's
  full-load window, over the window's length (:func:`full_load_window`). A block's throughput
  (``output_tokens_per_s``) counts its drain too: the end of a finite block, when the load has no more
  requests to send and the engine finishes the last ones at ever smaller batches. How long that drain lasts
  depends on the block's size and on how unequal the requests' step counts are (under speculation a request
  with low acceptance needs more steps than one with the same output and high acceptance), not on the speed
  the engine sustains under the load; both are reported.
- accept_length: per verify step, tokens committed including the bonus token.
  accept_rate: accepted drafts / drafts sent to the target, bonus excluded.
  per-position acceptance: accepted at position i / drafts that reached i.
  All three are first averaged within a request and then over requests, so long
  completions do not dominate (docs/DESIGN.md, "Metrics").

Errored requests are counted (``n_errors``) but excluded from every latency and
acceptance statistic; the errors guard is what fails the run on them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_wait_s")
# The list-valued fields of a RequestRecord: list columns of requests_dataframe (parquet keeps them as lists).
REQUEST_LIST_COLUMNS = ("output_token_ids", "chunk_times_s", "chunk_tokens", "accept_lengths", "verify_lengths",
                        "per_position_accepts", "per_position_reached")


@dataclass(slots=True)
class RequestRecord:
    """Everything measured about one request in one arm of one block.

    Times are seconds on one monotonic clock. ``arrival_s`` is when the request was submitted to
    the engine, ``scheduled_arrival_s`` when the load generator was due to submit it (None: not
    recorded). ``chunk_times_s`` holds the time of every chunk the request emitted (the first one
    is the first token) and ``chunk_tokens`` the output tokens each chunk carried (empty: not known, as for
    a server that streams text without token ids).
    ``accept_lengths`` and ``verify_lengths`` have one entry per verify step
    (tokens committed incl. bonus; drafts sent to the target). ``per_position_accepts[i]``
    / ``per_position_reached[i]`` count draft position i (0-based) over the request.
    """

    request_id: str
    arm: str
    block: int
    prompt_tokens: int
    output_token_ids: list[int]
    arrival_s: float
    first_token_s: float | None
    finish_s: float | None
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)
    verify_lengths: list[int] = field(default_factory=list)
    per_position_accepts: list[int] = field(default_factory=list)
    per_position_reached: list[int] = field(default_factory=list)
    error: str | None = None
    # The engine's finish reason (dspark.request.RequestOutput.finish_reason): "stop" (eos or a stop
    # string), "length" (max_tokens or the context length engine.max_model_len), "error"; None: unknown.
    finish_reason: str | None = None
    scheduled_arrival_s: float | None = None
    # The output's length when its token ids are unknown (an HTTP arm whose server returns text and usage only:
    # its usage.completion_tokens); None: len(output_token_ids).
    output_token_count: int | None = None

    @property
    def n_output_tokens(self) -> int:
        """Output tokens: the ids' count, or the server's count when the ids are unknown."""
        return self.output_token_count if self.output_token_count is not None else len(self.output_token_ids)

    def __post_init__(self) -> None:
        if self.output_token_count is not None and self.output_token_ids:
            raise ValueError(f"request {self.request_id!r}: output_token_count is for outputs whose token ids are "
                             f"unknown, but {len(self.output_token_ids)} ids are given")
        if self.error is not None:
            return
        if self.first_token_s is None or self.finish_s is None:
            raise ValueError(f"request {self.request_id!r}: first_token_s and finish_s are required "
                             f"unless error is set (got {self.first_token_s!r}, {self.finish_s!r})")
        if not self.arrival_s <= self.first_token_s <= self.finish_s:
            raise ValueError(f"request {self.request_id!r}: need arrival_s <= first_token_s <= finish_s, got "
                             f"{self.arrival_s}, {self.first_token_s}, {self.finish_s}")
        if self.chunk_tokens and len(self.chunk_tokens) != len(self.chunk_times_s):
            raise ValueError(f"request {self.request_id!r}: chunk_tokens has {len(self.chunk_tokens)} entries but "
                             f"chunk_times_s has {len(self.chunk_times_s)}: one token count per chunk")
        if len(self.per_position_accepts) != len(self.per_position_reached):
            raise ValueError(f"request {self.request_id!r}: per_position_accepts has {len(self.per_position_accepts)} "
                             f"entries but per_position_reached has {len(self.per_position_reached)}")
        if self.verify_lengths and len(self.verify_lengths) != len(self.accept_lengths):
            raise ValueError(f"request {self.request_id!r}: verify_lengths ({len(self.verify_lengths)} steps) and "
                             f"accept_lengths ({len(self.accept_lengths)} steps) must have one entry per verify step")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def request_metrics(rec: RequestRecord) -> dict[str, Any]:
    """Scalar metrics of one request (NaN where undefined; see the module docstring)."""
    n_out = rec.n_output_tokens
    row: dict[str, Any] = {
        "request_id": rec.request_id, "arm": rec.arm, "block": rec.block,
        "prompt_tokens": rec.prompt_tokens, "output_tokens": n_out, "error": rec.error,
        "finish_reason": rec.finish_reason,
    }
    nan = float("nan")
    row["queue_wait_s"] = nan if rec.scheduled_arrival_s is None else rec.arrival_s - rec.scheduled_arrival_s
    if rec.error is not None:
        row.update(ttft_s=nan, e2e_s=nan, tpot_s=nan, mean_itl_s=nan, n_chunks=len(rec.chunk_times_s),
                   accept_length=nan, accept_rate=nan)
        return row
    ttft = rec.first_token_s - rec.arrival_s
    e2e = rec.finish_s - rec.arrival_s
    itls = request_itls(rec)
    row.update(
        ttft_s=ttft,
        e2e_s=e2e,
        tpot_s=(e2e - ttft) / (n_out - 1) if n_out >= 2 else nan,
        mean_itl_s=float(itls.mean()) if itls.size else nan,
        n_chunks=len(rec.chunk_times_s),
        accept_length=float(np.mean(rec.accept_lengths)) if rec.accept_lengths else nan,
        accept_rate=_request_accept_rate(rec),
    )
    return row


def request_itls(rec: RequestRecord) -> np.ndarray:
    """Gaps between consecutive chunks of one request, in seconds."""
    return np.diff(np.asarray(rec.chunk_times_s, dtype=float))


def pooled_itls(chunk_times: Iterable[Sequence[float]]) -> np.ndarray:
    """The gaps between consecutive chunks of every request (one sequence of chunk times each), pooled."""
    gaps = [np.diff(np.asarray(c, dtype=float)) for c in chunk_times]
    return np.concatenate(gaps) if gaps else np.zeros(0)


def _request_accept_rate(rec: RequestRecord) -> float:
    proposed = sum(rec.verify_lengths)
    if proposed == 0:
        return float("nan")
    accepted = sum(rec.accept_lengths) - len(rec.accept_lengths)  # the bonus/correction token is not a draft
    return accepted / proposed


def per_position_acceptance(records: Iterable[RequestRecord]) -> list[float]:
    """Acceptance per draft position, averaged over the requests that reached it."""
    per_request = [pd.Series(rec.per_position_accepts, dtype=float)
                   / pd.Series(rec.per_position_reached, dtype=float).where(lambda r: r > 0)
                   for rec in records if rec.error is None]
    if not per_request:
        return []
    return pd.concat(per_request, axis=1).mean(axis=1, skipna=True).tolist()  # positions as rows, NaN skipped


def _percentiles(values: Iterable[float], name: str) -> dict[str, float]:
    series = pd.Series(list(values), dtype=float).dropna()
    quantiles = series.quantile([q / 100 for q in PERCENTILES]).to_numpy()  # NaN when there are no values
    return {f"{name}_p{q}": float(v) for q, v in zip(PERCENTILES, quantiles)} | {f"{name}_mean": float(series.mean())}


def full_load_window(records: Sequence[RequestRecord], load_mode: str,
                     concurrency: int | None = None) -> tuple[float, float] | None:
    """(start, end) of the span in which the load kept its full load on the engine; None when it never did.

    Closed loop at concurrency C over N completed requests: from the C-th submission (C requests in flight) to
    the (N-C+1)-th finish. Until then every finish was followed by the next submission, so C requests were in
    flight throughout; from then on the load has nothing left to send and the block drains. Poisson arrivals:
    from the first arrival to the last (the load is offered until then; afterwards the engine only drains)."""
    ok = [r for r in records if r.error is None]
    if load_mode == "closed":
        c = int(concurrency or 0)
        if c < 1 or len(ok) < c:
            return None
        start = sorted(r.arrival_s for r in ok)[c - 1]
        end = sorted(r.finish_s for r in ok)[len(ok) - c]
    elif load_mode == "poisson":
        if not ok:
            return None
        start, end = min(r.arrival_s for r in ok), max(r.arrival_s for r in ok)
    else:
        raise ValueError(f"load_mode must be 'closed' or 'poisson', got {load_mode!r}")
    return (start, end) if end > start else None


def full_load_throughput(records: Sequence[RequestRecord], window: tuple[float, float] | None) -> float:
    """Output tokens per second emitted inside ``window`` (:func:`full_load_window`): every chunk whose time
    lies in it, with the tokens it carried. NaN without a window or when a completed request's chunk token
    counts are unknown (``chunk_tokens`` empty)."""
    if window is None:
        return float("nan")
    start, end = window
    tokens = 0
    for r in records:
        if r.error is not None or not r.chunk_times_s:
            continue
        if not r.chunk_tokens:
            return float("nan")
        times = np.asarray(r.chunk_times_s, dtype=float)
        inside = (times >= start) & (times <= end)
        tokens += int(np.asarray(r.chunk_tokens, dtype=np.int64)[inside].sum())
    return tokens / (end - start)


def aggregate_block(records: list[RequestRecord], wall_time_s: float,
                    counters: Mapping[str, Any] | None = None, *, sla_ttft_s: float | None = None,
                    sla_tpot_s: float | None = None, load_mode: str | None = None,
                    concurrency: int | None = None) -> dict[str, Any]:
    """Aggregate the requests of one arm in one block.

    ``wall_time_s`` is the time the arm held the engine in this block (first arrival
    to last finish as seen by the runner); throughput is total output tokens over it.
    ``counters`` (the engine's own counters for this arm/block) pass through under
    ``counter/<name>``. With the load's ``load_mode`` (and a closed loop's ``concurrency``): the throughput
    at full load (:func:`full_load_window`, :func:`full_load_throughput`), the window's length and its share of
    the block's wall time. With a service level (``sla_ttft_s`` and/or ``sla_tpot_s``), goodput: the
    requests that met every given limit (a one-token output has no TPOT and meets that limit), per
    second and their output tokens per second, and their share of the block's requests (errors miss).
    """
    if not wall_time_s > 0:
        raise ValueError(f"wall_time_s must be > 0 to compute throughput, got {wall_time_s!r}")
    ok = [r for r in records if r.error is None]
    rows = [request_metrics(r) for r in ok]
    output_tokens = sum(r.n_output_tokens for r in ok)
    out: dict[str, Any] = {
        "n_requests": len(records),
        "n_errors": len(records) - len(ok),
        "output_tokens": output_tokens,
        "wall_time_s": float(wall_time_s),
        "output_tokens_per_s": output_tokens / wall_time_s,
        "requests_per_s": len(ok) / wall_time_s,
    }
    if load_mode is not None:
        window = full_load_window(records, load_mode, concurrency)
        span = window[1] - window[0] if window is not None else float("nan")
        out["steady_output_tokens_per_s"] = full_load_throughput(records, window)
        out["steady_window_s"] = span
        out["steady_share"] = span / wall_time_s
    frame = pd.DataFrame(rows, columns=["ttft_s", "tpot_s", "e2e_s", "queue_wait_s", "accept_length", "accept_rate"])
    out |= _percentiles(frame["ttft_s"], "ttft_s")
    out |= _percentiles(frame["tpot_s"], "tpot_s")
    out |= _percentiles(pooled_itls(r.chunk_times_s for r in ok), "itl_s")
    out |= _percentiles(frame["e2e_s"], "e2e_s")
    out |= _percentiles(frame["queue_wait_s"], "queue_wait_s")
    out["accept_length"] = float(frame["accept_length"].mean())  # NaN skipped; NaN when every value is
    out["accept_rate"] = float(frame["accept_rate"].mean())
    out["per_position_acceptance"] = per_position_acceptance(ok)
    if sla_ttft_s is not None or sla_tpot_s is not None:
        met = pd.Series(True, index=frame.index)
        if sla_ttft_s is not None:
            met &= frame["ttft_s"] <= sla_ttft_s
        if sla_tpot_s is not None:
            met &= frame["tpot_s"].isna() | (frame["tpot_s"] <= sla_tpot_s)
        good_tokens = sum(r.n_output_tokens for r, m in zip(ok, met) if m)
        out["goodput_requests_per_s"] = int(met.sum()) / wall_time_s
        out["goodput_tokens_per_s"] = good_tokens / wall_time_s
        out["sla_attainment"] = int(met.sum()) / len(records) if records else float("nan")
    for name, value in (counters or {}).items():
        out[f"counter/{name}"] = value
    return out


def requests_dataframe(records: Iterable[RequestRecord]) -> pd.DataFrame:
    """One row per request: the scalar metrics, the timestamps and the raw lists
    (:data:`REQUEST_LIST_COLUMNS`) as list cells, which parquet stores as list columns."""
    rows = []
    for rec in records:
        row = request_metrics(rec)
        row["scheduled_arrival_s"] = rec.scheduled_arrival_s
        row["arrival_s"] = rec.arrival_s
        row["first_token_s"] = rec.first_token_s
        row["finish_s"] = rec.finish_s
        for list_field in REQUEST_LIST_COLUMNS:
            row[list_field] = list(getattr(rec, list_field))
        rows.append(row)
    return pd.DataFrame(rows)


def finish_reason_counts(requests_df: pd.DataFrame) -> dict[str, dict[str, int]]:
    """{arm: {finish_reason: requests}} of a :func:`requests_dataframe` ("unknown" where none was
    recorded); {} when the frame has no finish_reason column (an older run)."""
    if requests_df is None or not {"arm", "finish_reason"} <= set(requests_df.columns):
        return {}
    reasons = requests_df["finish_reason"].where(requests_df["finish_reason"].notna(), "unknown")
    out: dict[str, dict[str, int]] = {}
    for (arm, reason), n in reasons.groupby(requests_df["arm"]).value_counts().items():
        out.setdefault(str(arm), {})[str(reason)] = int(n)
    return {arm: dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))) for arm, c in sorted(out.items())}


def truncation_counts(requests_df: pd.DataFrame,
                      max_model_len: Mapping[str, int | None] | None = None) -> dict[str, dict[str, int]]:
    """{arm: {"max_tokens": n, "max_model_len": m}}: requests of each arm cut by a length limit
    (finish_reason "length"). The engine reports both limits as "length"; a request whose prompt plus
    output reached the arm's ``max_model_len`` counts as cut by the context length, the others by
    max_tokens (all of them without ``max_model_len``). {} without a finish_reason column."""
    if requests_df is None or not {"arm", "finish_reason"} <= set(requests_df.columns):
        return {}
    out: dict[str, dict[str, int]] = {}
    for arm, group in requests_df.groupby("arm", sort=True):
        cut = group[group["finish_reason"] == "length"]
        limit = (max_model_len or {}).get(str(arm))
        by_context = 0
        if limit and {"prompt_tokens", "output_tokens"} <= set(cut.columns):
            by_context = int(((cut["prompt_tokens"] + cut["output_tokens"]) >= int(limit)).sum())
        out[str(arm)] = {"max_tokens": len(cut) - by_context, "max_model_len": by_context}
    return out


def prediction_health(counters: Mapping[str, Mapping[str, Any]], tolerance: float) -> dict[str, dict[str, Any]]:
    """Per arm, how the planner's cost-table predictions compare with what its planned steps did:
    realised / predicted tokens and measured / predicted step time over the steps it priced (engine
    counters ``sched/predicted_tokens_total``, ``sched/realised_tokens_on_predicted``,
    ``sched/predicted_ms_total``, ``sched/measured_ms_on_predicted``). Where the planner valued its options at
    the service price (engine.service_cost), also the measured step time over that price on the same steps
    (``sched/priced_ms_on_measured``, ``step_ms_measured_over_service_price``): the table prices a steady decode
    step, the service price what a step costs in service, so the second is the check of the model the planner
    used. A ratio off 1 by more than ``tolerance`` is flagged: a price that mispredicts the step the device runs
    in service steers the planner wrong. The measured time over the price the planner valued each step at is also
    given apart for the steps that ran a trim and for the priced steps that kept the whole block
    (``trimmed_step_ms_measured_over_price``, ``untrimmed_...``, with their step counts; counters
    ``sched/measured_ms_on_trimmed``, ``sched/priced_ms_on_trimmed``, ``sched/measured_steps_on_trimmed``): a trim
    is worth what it saves against the whole block, so a gap between the two misleads the planner even where the
    overall ratio is near 1. Arms without priced steps are left out."""
    out: dict[str, dict[str, Any]] = {}
    for arm, c in counters.items():
        pt, rt = c.get("sched/predicted_tokens_total"), c.get("sched/realised_tokens_on_predicted")
        pm, mm = c.get("sched/predicted_ms_total"), c.get("sched/measured_ms_on_predicted")
        if not pt or rt is None:
            continue
        entry: dict[str, Any] = {"tokens_realised_over_predicted": float(rt) / float(pt),
                                 "step_ms_measured_over_predicted": (float(mm) / float(pm)
                                                                     if pm and mm else None),
                                 "step_ms_measured_over_service_price": None,
                                 "tolerance": tolerance}
        priced, table_on_measured = c.get("sched/priced_ms_on_measured"), c.get("sched/predicted_ms_on_measured")
        if priced and mm and table_on_measured and abs(priced - table_on_measured) > 1e-9 * table_on_measured:
            entry["step_ms_measured_over_service_price"] = float(mm) / float(priced)
        # The same ratio apart on the steps that ran a trim and the priced steps that kept the whole block: a trimmed
        # step's price holds its trim overhead, so where the two differ the planner values a trim wrong.
        # (steps, measured ms, priced ms) of each side; an engine that did not count trims apart leaves both None
        trim = [c.get(f"sched/{k}") for k in ("measured_steps_on_trimmed", "measured_ms_on_trimmed",
                                                "priced_ms_on_trimmed", "measured_steps_on_predicted")]
        sides = {}
        if None not in (*trim, mm, priced):
            nt, mt, ptr, n = trim
            sides = {"trimmed": (nt, mt, ptr), "untrimmed": (n - nt, mm - mt, priced - ptr)}
        for key in ("trimmed", "untrimmed"):
            steps, ms, price = sides.get(key, (None, None, None))
            entry[f"{key}_steps"] = None if steps is None else int(steps)
            entry[f"{key}_step_ms_measured_over_price"] = float(ms) / float(price) if steps and price else None
        flags = []
        table, service = "the cost table's prediction", "the service price it planned with"
        for key, what, of in (("tokens_realised_over_predicted", "tokens per step", table),
                              ("step_ms_measured_over_predicted", "step time", table),
                              ("step_ms_measured_over_service_price", "step time", service)):
            r = entry[key]
            if r is not None and abs(r - 1.0) > tolerance:
                flags.append(f"arm {arm}: {what} {r:.2f}x {of} (beyond +/-{tolerance:.0%})")
        entry["flags"] = flags
        out[arm] = entry
    return out
