"""The server's Prometheus metrics, in a registry of its own (two servers in one process never share one).

Two sources: each finished request (counted in the server's process as it finishes: requests by finish
reason, prompt and generated tokens, time to first token, latency, mean accept length), and an
``EngineSnapshot`` taken between two engine steps when ``/metrics`` is scraped (the engine's own
counters). Speculative decoding is exported under vLLM's names (``vllm:spec_decode_*``), so dashboards
built for vLLM read it; the engine's scheduling counters (verified tokens, trim ratio, planner
decisions, ...) under ``dspark:``.

With several API server processes over one engine (runners.serve ``api_servers`` > 1) a scrape reaches one of
them, so the per-request metrics use prometheus_client's multiprocess mode (``multiprocess=True``): every process
writes its values to files under PROMETHEUS_MULTIPROC_DIR, set before the processes start, and ``/metrics`` sums
every process's. The snapshot's metrics are the whole engine's already, and come from the scraped process alone.
"""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from dspark.request import RequestOutput
from dspark.serving.engine_loop import EngineSnapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Engine.counters() key -> (metric, help): counts that only grow, exported as counters.
ENGINE_COUNTERS = (
    ("steps", "dspark:engine_steps", "Engine steps run (prefill-only steps included)."),
    ("decode_steps", "dspark:decode_steps", "Engine steps that decoded (verified a block or took one target token)."),
    ("mixed_steps", "dspark:mixed_steps", "Decode steps that also ran prefill chunks."),
    ("prefill_tokens", "dspark:prefill_tokens", "Prompt tokens prefilled (recomputation after preemption included)."),
    ("request_steps", "dspark:request_steps", "Requests decoded, summed over decode steps."),
    ("drafted_tokens", "dspark:drafted_tokens", "Draft tokens proposed by the drafter."),
    ("verified_tokens", "dspark:verified_tokens", "Draft tokens sent to the target to verify (after trimming)."),
    ("window_tokens", "dspark:window_tokens", "Draft tokens in the verify windows the planner chose."),
    ("ceiling_tokens", "dspark:ceiling_tokens", "Draft tokens an untrimmed step would have verified."),
    ("accepted_tokens", "dspark:accepted_tokens", "Draft tokens accepted."),
    ("emitted_tokens", "dspark:emitted_tokens", "Tokens committed (accepted drafts and target tokens)."),
    ("trimmed_steps", "dspark:trimmed_steps", "Decode steps whose planner trimmed the verified block."),
    ("preemptions", "dspark:preemptions", "Requests preempted for KV pages (recomputed later)."),
    ("eager_steps", "dspark:eager_steps", "Steps run on the eager path."),
    ("graph_replays", "dspark:graph_replays", "Decode steps replayed as CUDA graphs."),
    ("discarded_row_steps", "dspark:discarded_row_steps", "Rows of device steps dropped: their request had finished."),
    ("draft_free_steps", "dspark:draft_free_steps", "Decode steps run without drafting (engine.draft_free_steps)."),
    ("depth_zero_rows", "dspark:depth_zero_rows", "Request steps the planner gave no verify window (target-only)."),
    ("plan_gate/planned_steps", "dspark:plan_gate_planned_steps", "Device-resident steps the plan gate let the "
     "planner run (engine.plan_gate)."),
    ("plan_gate/skipped_steps", "dspark:plan_gate_skipped_steps", "Device-resident steps the plan gate ran without the "
     "planner: the whole block, planning measured not to pay."),
    # The engine process's messages to the HTTP side (engine_process=true; 0 with the engine in a thread).
    ("engine_process/messages", "dspark:engine_process_messages", "Messages of request events the engine process sent "
     "to the HTTP side."),
    ("engine_process/merged_steps", "dspark:engine_process_merged_steps", "Engine steps whose events those messages "
     "carried (more than one per message: the HTTP side lagged and the steps were merged)."),
    ("engine_process/held_steps", "dspark:engine_process_held_steps", "Engine steps that ended with their events held "
     "back (no credit: the HTTP side had not taken the previous messages yet)."),
    # What the planner's cost table predicted for the steps it priced, and what they did (the A/B's prediction health).
    ("sched/predicted_tokens_total", "dspark:planner_predicted_tokens", "Tokens the cost table predicted the priced "
     "steps to commit."),
    ("sched/realised_tokens_on_predicted", "dspark:planner_realised_tokens", "Tokens the priced steps committed."),
    ("sched/predicted_ms_total", "dspark:planner_predicted_ms", "Milliseconds the cost table predicted for the priced "
     "steps."),
    ("sched/measured_ms_on_predicted", "dspark:planner_measured_ms", "Milliseconds the priced steps took."),
    ("sched/priced_ms_on_measured", "dspark:planner_priced_ms", "Milliseconds the planner valued the measured priced "
     "steps at (the service price it planned with; the cost table's where it had none)."),
    ("sched/predicted_ms_on_measured", "dspark:planner_predicted_ms_on_measured", "Milliseconds the cost table "
     "predicted for the measured priced steps."),
    ("sched/measured_steps_on_predicted", "dspark:planner_measured_steps", "Priced steps whose time was measured."),
    ("sched/measured_steps_on_trimmed", "dspark:planner_measured_trimmed_steps", "Measured priced steps that ran a "
     "trim."),
    ("sched/measured_ms_on_trimmed", "dspark:planner_measured_ms_on_trimmed", "Milliseconds the measured priced steps "
     "that ran a trim took."),
    ("sched/priced_ms_on_trimmed", "dspark:planner_priced_ms_on_trimmed", "Milliseconds the planner valued the "
     "measured priced steps that ran a trim at."),
)
# Engine.counters() key -> (metric, help): ratios and averages over the engine's life, exported as gauges.
ENGINE_GAUGES = (
    ("trim_ratio", "dspark:trim_ratio", "1 - verified / ceiling draft tokens: the share of drafted tokens trimmed."),
    ("accept_rate", "dspark:accept_rate", "Accepted / verified draft tokens."),
    ("mean_running_batch", "dspark:mean_running_batch", "Requests per decode step, on average."),
)
PLAN_REASON_PREFIX = "sched/plan_reason."
VERIFY_LEN_PREFIX = "sched/verify_len_hist."
# engine.draft_free_steps: per batch bucket, the drafting and draft-free steps the choice measured
# (draft_free/b<bucket>/<kind>_steps); engine.service_cost: the steps that updated each part of the price.
DRAFT_FREE_STEPS = re.compile(r"draft_free/b(\d+)/(draft|free)_steps")
SERVICE_COST_STEPS = re.compile(r"service_cost/(floor|extra)_steps")
# The drafted steps whose survival came from each confidence calibration (confidence_calibration/<method>_steps, and
# confidence_calibration/greedy_<method>_steps for engine.greedy_confidence_calibration's).
CALIBRATION_STEPS = re.compile(r"confidence_calibration/(greedy_)?([a-z_]+?)_steps")


class EngineSnapshotCollector:
    """Metric families of the snapshot handed to ``render`` (a custom collector: values come from the
    engine loop's snapshot, never read from the engine here)."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.snapshot: EngineSnapshot | None = None

    def collect(self):
        s = self.snapshot
        if s is None:
            return
        name = self.model_name
        c = s.counters

        def family(kind, metric: str, doc: str, value: float):
            f = kind(metric, doc, labels=["model_name"])
            f.add_metric([name], value)
            return f

        yield family(GaugeMetricFamily, "vllm:num_requests_running", "Requests in the engine's running batch.",
                     s.num_running)
        yield family(GaugeMetricFamily, "vllm:num_requests_waiting", "Requests waiting to be scheduled.",
                     s.num_waiting)
        used = 1.0 - s.kv_pages_free / s.kv_pages_total if s.kv_pages_total else 0.0
        yield family(GaugeMetricFamily, "vllm:kv_cache_usage_perc", "Share of KV pages in use (1 = full).", used)
        yield family(GaugeMetricFamily, "dspark:server_live_requests",
                     "Requests the server has in the engine (running, waiting or preempted).", s.num_live_requests)

        drafts = c.get("request_steps", 0) if s.block_size else 0
        yield family(CounterMetricFamily, "vllm:spec_decode_num_drafts", "Draft blocks proposed (one per request "
                     "per decode step).", drafts)
        yield family(CounterMetricFamily, "vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.",
                     c.get("drafted_tokens", 0))
        yield family(CounterMetricFamily, "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                     c.get("accepted_tokens", 0))
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Draft tokens accepted at each block position (0-based).",
                                      labels=["model_name", "position"])
        for position, n in enumerate(s.accepted_per_position):
            per_pos.add_metric([name, str(position)], n)
        yield per_pos

        for key, metric, doc in ENGINE_COUNTERS:
            yield family(CounterMetricFamily, metric, doc, c.get(key, 0))
        for key, metric, doc in ENGINE_GAUGES:
            yield family(GaugeMetricFamily, metric, doc, c.get(key, 0.0))
        reasons = CounterMetricFamily("dspark:planner_decisions", "Planner decisions by reason (trimmed, or why "
                                      "it verified the whole block).", labels=["model_name", "reason"])
        windows = CounterMetricFamily("dspark:verify_windows", "Request steps by the number of draft tokens "
                                      "verified.", labels=["model_name", "length"])
        for key, n in c.items():
            if key.startswith(PLAN_REASON_PREFIX):
                reasons.add_metric([name, key[len(PLAN_REASON_PREFIX):]], n)
            elif key.startswith(VERIFY_LEN_PREFIX):
                windows.add_metric([name, key[len(VERIFY_LEN_PREFIX):]], n)
        yield reasons
        yield windows
        measured = CounterMetricFamily("dspark:draft_free_measured_steps", "Steps the draft-free choice measured, "
                                       "by batch bucket and kind (draft or free).",
                                       labels=["model_name", "bucket", "kind"])
        priced = CounterMetricFamily("dspark:service_cost_steps", "Committed steps that updated the service price, "
                                     "by part (floor or extra).", labels=["model_name", "part"])
        calibrated = CounterMetricFamily("dspark:confidence_calibration_steps", "Drafted steps whose survival came "
                                         "from a confidence calibration, by its method and the steps it serves "
                                         "(greedy: the steps whose rows all decode greedily, with "
                                         "engine.greedy_confidence_calibration; all: every other drafted step).",
                                         labels=["model_name", "method", "steps"])
        for key, n in c.items():
            if (m := DRAFT_FREE_STEPS.fullmatch(key)) is not None:
                measured.add_metric([name, m.group(1), m.group(2)], n)
            elif (m := SERVICE_COST_STEPS.fullmatch(key)) is not None:
                priced.add_metric([name, m.group(1)], n)
            elif (m := CALIBRATION_STEPS.fullmatch(key)) is not None:
                calibrated.add_metric([name, m.group(2), "greedy" if m.group(1) else "all"], n)
        yield measured
        yield priced
        yield calibrated


class ServerMetrics:
    """Everything ``/metrics`` exports for one server. ``multiprocess``: the per-request metrics are summed over
    every process of the server (prometheus_client's multiprocess mode: PROMETHEUS_MULTIPROC_DIR must have been
    set when prometheus_client was imported)."""

    def __init__(self, model_name: str, multiprocess: bool = False):
        self.model_name = model_name
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        own = self.registry
        if multiprocess:
            if values.ValueClass is values.MutexValue:
                raise RuntimeError("multiprocess metrics: PROMETHEUS_MULTIPROC_DIR was not set when "
                                   "prometheus_client was imported in this process")
            MultiProcessCollector(self.registry)  # every process's values, read from their files
            own = None  # this process's values are among them: registered here they would count twice
        self.requests = Counter("vllm:request_success", "Finished requests by finish reason (stop, length, abort, "
                                "error).", ["model_name", "finished_reason"], registry=own)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests.", labels,
                                     registry=own)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated for finished requests.",
                                         labels, registry=own)
        self.time_to_first_token = Histogram(
            "vllm:time_to_first_token_seconds", "From the engine taking a request to its first token.", labels,
            buckets=(0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0),
            registry=own)
        self.latency = Histogram(
            "vllm:e2e_request_latency_seconds", "From the engine taking a request to its end.", labels,
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0), registry=own)
        self.mean_accept_length = Histogram(
            "dspark:request_mean_accept_length", "A request's tokens committed per decode step (accepted drafts "
            "plus the target's token).", labels,
            buckets=(1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 12.0, 16.0, 33.0),
            registry=own)
        self.engine = EngineSnapshotCollector(model_name)
        self.registry.register(self.engine)

    def record_finished(self, output: RequestOutput) -> None:
        """Count a finished request (called by the engine loop's thread, or the thread that reads the engine
        process's messages; prometheus_client is thread-safe)."""
        name = self.model_name
        self.requests.labels(name, output.finish_reason or "unknown").inc()
        self.prompt_tokens.labels(name).inc(len(output.prompt_token_ids))
        self.generation_tokens.labels(name).inc(len(output.token_ids))
        if output.first_token_time is not None:
            self.time_to_first_token.labels(name).observe(output.first_token_time - output.arrival_time)
        if output.finish_time is not None:
            self.latency.labels(name).observe(output.finish_time - output.arrival_time)
        if output.accept_lengths:
            self.mean_accept_length.labels(name).observe(output.mean_accept_length)

    def render(self, snapshot: EngineSnapshot | None) -> bytes:
        """The exposition text, with the engine's counters from ``snapshot`` (call on one thread)."""
        self.engine.snapshot = snapshot
        return generate_latest(self.registry)
