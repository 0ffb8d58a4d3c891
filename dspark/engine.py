"""The engine: add requests, run steps (schedule -> draft -> verify -> commit), return outputs.

    engine = Engine.from_pretrained("smollm2", drafter="path/to/drafter", config=EngineConfig())
    outputs = engine.generate(["Write a haiku about rain."], SamplingParams(max_tokens=64))
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import Counter
from typing import Sequence

import torch

from dspark.config import ConfigError, EngineConfig, SamplingParams
from dspark.kv_cache import BlockManager
from dspark.model_runner import DTYPES, ModelRunner, Segment
from dspark.models.llama import TargetModel
from dspark.plan_gate import SKIPPED_REASON, backlog_ms
from dspark.planner import SMALL_BATCH_REASON, UNPLANNED_REASONS, PlanDecision
from dspark.request import Request, RequestOutput
from dspark.scheduler import Scheduler
from dspark.stats import HOST_PHASES, EngineStats, check_step_consistency
from dspark.survival import prefix_survival
from dspark.verify_share import SHARE_FULL_REASON, SHARE_REASON, share_budget

PromptLike = str | list[int] | list[dict]


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What the last step ran and how long it took (read by the profiler and benchmarks)."""

    num_decodes: int
    num_prefill_tokens: int
    num_tokens: int  # tokens the target processed, bonus/anchor included, before padding
    bucket: int  # after padding to the token bucket
    windows: tuple[int, ...]
    # Eager path: the step's wall time, device work included. Device-resident steps: the wall time
    # of the step() call that committed the step (Engine._step_period_ms): with overlap, the steady
    # period of the pipeline, so the host's planning and launch of the next step are counted.
    step_ms: float
    # Host ms spent waiting for the device inside this step (a device-resident step's collect; 0 on
    # the eager path, which synchronises at its end and counts that in step_ms).
    wait_ms: float = 0.0


# Environment variables this engine refuses to read: each names the engine setting that does the job
# (engine.kernels.*), or None where there is none.
RETIRED_ENV_SWITCHES = {
    "DSPARK_FUSED_KERNELS": "engine.kernels.fused_layers", "DSPARK_SMALL_M_KERNELS": "engine.kernels.small_m_kernels",
    "DSPARK_FUSED_QKV_ROPE": "engine.kernels.fused_qkv_rope", "DSPARK_SMALL_M_TILES": "engine.kernels.small_m_tiles",
    "DSPARK_FUSED_STEP_METADATA": "engine.kernels.fused_step_metadata",
    "DSPARK_TRITON_ARGMAX": "engine.kernels.triton_argmax", "DSPARK_L2_PREFETCH": "engine.kernels.l2_prefetch",
    "DSPARK_L2_PREFETCH_PROGRAMS": "engine.kernels.l2_prefetch_programs",
    "DSPARK_DECODE_MEGAKERNEL": "engine.kernels.decode_megakernel",
    "DSPARK_MEGAKERNEL_PROGRAMS": "engine.kernels.megakernel_programs",
    "DSPARK_PDL": None,
}


def refuse_retired_env_switches() -> None:
    """A retired kernel switch left in the environment would silently do nothing: refuse it, naming its key."""
    import os

    found = sorted(k for k in RETIRED_ENV_SWITCHES if k in os.environ)
    if found:
        says = [f"{k} -> {RETIRED_ENV_SWITCHES[k]}" if RETIRED_ENV_SWITCHES[k] else f"{k} (removed: it measured no gain)"
                for k in found]
        raise ConfigError("kernel switches are engine settings now, not environment variables; unset "
                          + ", ".join(says))


class RequestError(ValueError):
    """A request was refused; the engine keeps serving the others."""


class Engine:
    def __init__(self, target: TargetModel, tokenizer=None, config: EngineConfig | None = None, drafter=None):
        self.cfg = config or EngineConfig()
        refuse_retired_env_switches()
        if self.cfg.spec == "dspark" and drafter is None:
            raise ConfigError("engine.spec: 'dspark' needs a drafter; pass one or set engine.spec=off")
        if self.cfg.spec == "off":
            drafter = None
        self.kernels = self.cfg.kernel_config()  # this engine's kernel settings, in every step's metadata
        if self.cfg.batch_invariant and self.kernels.triton and target.cfg.qk_norm:
            raise ConfigError("engine.batch_invariant: the batch-invariant layers cover Llama/Qwen2 attention; "
                              f"this {target.cfg.arch} target has q/k norms; set engine.batch_invariant=false")
        self.tokenizer = tokenizer
        dtype = DTYPES[self.cfg.dtype]
        self.target = target.to(device=self.cfg.device, dtype=dtype).eval()
        self.drafter = drafter.to(device=self.cfg.device, dtype=dtype).eval() if drafter is not None else None
        if self.drafter is not None:
            self.drafter.validate_target_layers(target.cfg)
            if self.cfg.confidence_calibration is not None:
                self.drafter = self._recalibrated(self.drafter, self.cfg.confidence_calibration)
        # engine.greedy_confidence_calibration: the drafter again (its weights shared) with the calibration that
        # all-greedy steps read (GraphDecoder.calibrated_drafter)
        self._greedy_drafter = (self._recalibrated(self.drafter, self.cfg.greedy_confidence_calibration,
                                                   key="engine.greedy_confidence_calibration")
                                if self.drafter is not None and self.cfg.greedy_confidence_calibration is not None
                                else None)
        G = self.drafter.cfg.block_size if self.drafter is not None else 0
        page = self.cfg.kv_block_size
        # Device-resident steps reserve pages ahead: the host knows lengths up to one step late.
        self._lookahead = (2 if self.cfg.overlap else 1) * (G + 1) + 1 if self.cfg.cuda_graphs else G + 1
        if self.cfg.num_kv_blocks is not None:
            num_pages = self.cfg.num_kv_blocks
        else:
            num_pages = max(2, -(-self._kv_pool_tokens() // page))
        self.blocks = BlockManager(num_pages, page)
        self.runner = ModelRunner(self.target, self.drafter, self.cfg, self.blocks)
        self._eos = frozenset(self.target.cfg.eos_token_ids or ())
        self.scheduler = Scheduler(self.blocks, max_num_seqs=self.cfg.max_num_seqs,
                                   max_num_batched_tokens=self.cfg.max_num_batched_tokens, block_size=G)
        self.block_size = G
        # the head's calibration method the survival comes from (engine.acceptance_estimate=head), for counters()
        self._confidence_calibration = (self.drafter.confidence_calibration_method
                                        if self.drafter is not None and self.drafter.confidence_head is not None
                                        and self.cfg.acceptance_estimate == "head" else None)
        self._greedy_calibration = (self._greedy_drafter.confidence_calibration_method
                                    if self._greedy_drafter is not None else None)
        self._next_id = 0
        self._requests: dict[int, Request] = {}
        self.num_steps = 0
        self._counts = self._zero_counts()
        self._megakernel_base = self._megakernel_raw()
        self._oracle_steps: list[list[int]] = []
        self._oracle_step_ms: list[float] = []  # each of those steps' measured time (StepInfo.step_ms)
        self.step_trace = None  # a StepTrace while start_step_trace() is in effect (eager steps only)
        self.stats = EngineStats()
        self.last_step: StepInfo | None = None
        self.cost_table = None
        self.planner = None
        self.service_cost = None  # engine.service_cost: the online price of a service step (kept across reset)
        self.plan_gate = None  # engine.plan_gate: whether planning a device-resident step pays (kept across reset)
        self.share_choice = None  # engine.verify_share: the measured choice replacing the planner (kept across reset)
        # (rows, reason) -> the PlanDecision of a step that ran the full block without a planner call
        self._full_block_decisions: dict[tuple[int, str], object] = {}
        self._plan_cost = None  # (bucket, host ms) of the planner call the step() in progress made
        self._build_planner()
        self._free_slots = list(range(self.cfg.max_num_seqs - 1, -1, -1))
        self._slot_of: dict[int, int] = {}
        self.graph = None
        self._inflight = None
        self._host_step_ms: list[float] = []
        self._host_phase_ms = dict.fromkeys(HOST_PHASES, 0.0)  # device-resident steps' host time by phase
        self._host_phase_calls = 0  # step() calls those phases cover
        self._step_call_end: float | None = None  # perf_counter at the end of the last device-resident step()
        self._graph_wait_ms = 0.0
        self._step_call_start: float | None = None  # perf_counter at the start of the step() in progress
        self._step_calls = 0  # step() calls on the device-resident path
        self._last_commit: tuple[int, float] | None = None  # (step() call, perf_counter) of the last commit
        self._eager_reason = "no_cuda_graphs"
        self.eager_reasons: Counter[str] = Counter()
        self._rows_stale = False  # eager steps ran since the device rows were last loaded
        self._unjoined: list[Request] = []  # prefilled requests waiting for pages to join the device rows
        self._captured_key = None  # (bucket, sampling) whose graphs ensure_captured last checked
        self._captures_base = 0  # graphs captured before the current run (reset() / capture_graphs())
        self._eager_step_ms: list[float] = []
        self._build_steps()

    def _kv_pool_tokens(self) -> int:
        """Token slots of the KV pool when engine.num_kv_blocks is not given: room for max_num_seqs requests
        of max_model_len tokens, capped by engine.kv_cache_tokens and, on a GPU, by kv_memory_fraction of
        the device memory free now (the target cache plus the drafter's, one page spare)."""
        cfg = self.cfg
        tokens = cfg.max_num_seqs * (cfg.max_model_len + self._lookahead)
        if cfg.kv_cache_tokens is not None:
            tokens = min(tokens, cfg.kv_cache_tokens)
        device = torch.device(cfg.device)
        if device.type == "cuda":
            tc = self.target.cfg
            layers = tc.num_layers + (self.drafter.cfg.num_layers if self.drafter is not None else 0)
            per_token = layers * 2 * tc.num_kv_heads * tc.head_dim * DTYPES[cfg.dtype].itemsize
            free, _ = torch.cuda.mem_get_info(device)
            fits = int(cfg.kv_memory_fraction * free) // per_token - 2 * cfg.kv_block_size
            if fits < cfg.max_model_len:
                raise ConfigError(f"engine.kv_memory_fraction: {cfg.kv_memory_fraction} of the {free / 2**30:.1f} GiB "
                                  f"free on {device} holds {max(fits, 0)} KV token slots, fewer than one request of "
                                  f"engine.max_model_len={cfg.max_model_len}; raise it or free device memory")
            tokens = min(tokens, fits)
        return tokens

    @staticmethod
    def _recalibrated(drafter, path: str, key: str = "engine.confidence_calibration"):
        """The drafter with the calibration in ``path`` (the setting ``key`` names), its weights shared."""
        from dspark.training.calibration import calibration_dir, load_calibration

        if drafter.confidence_head is None:
            raise ConfigError(f"{key}: this drafter has no confidence head to calibrate "
                              "(a DFlash-style ablation); set it to null")
        try:
            where = calibration_dir(path)
            calibration = load_calibration(where, drafter.block_size)
        except (FileNotFoundError, ValueError) as e:
            raise ConfigError(f"{key}: {e}") from None
        return drafter.with_calibration(*calibration.as_lists())

    def _build_steps(self) -> None:
        """The step pipeline (dspark.graph_decode.GraphDecoder): draft, pack, verify, accept and commit over
        device rows, for every step of this engine. With engine.cuda_graphs its steps are captured and
        replayed (``self.graph``); otherwise, and for the steps the device-resident path hands over, the
        host drives the same stages uncaptured (``_host_step``)."""
        from dspark.graph_decode import GraphDecoder

        from dspark.profiler import batch_size_ladder

        M = self.block_size + 1
        if self.cfg.token_buckets is not None and self.cfg.verify == "full":
            bad = [b for b in self.cfg.token_buckets if b % M]
            if bad:
                raise ConfigError(f"engine.token_buckets: {bad} are not multiples of {M} tokens per request "
                                  f"(block {self.block_size} + 1); a full-block captured step of R requests "
                                  f"processes R*{M} tokens, so give multiples of {M}")
            buckets = tuple(self.cfg.token_buckets)
        else:  # full-block steps of 1, 2, 4, ... max_num_seqs requests
            buckets = tuple(M * b for b in batch_size_ladder(self.cfg.max_num_seqs))
        page = self.cfg.kv_block_size
        max_pages = -(-(self.cfg.max_model_len + self._lookahead) // page) + 1
        ragged_buckets = self.cfg.token_buckets if self.cfg.verify != "full" else None
        triton_backend = self.kernels.triton
        # The verify step's packing/metadata and state commit as one Triton kernel each on the Triton backend.
        fused_metadata = triton_backend and self.kernels.fused_step_metadata
        self.steps = GraphDecoder(self.runner, self.cfg.max_num_seqs, max_pages, buckets, use_graphs=self.cfg.cuda_graphs,
                                  token_buckets=ragged_buckets, min_verify_len=self.cfg.min_verify_len,
                                  window_impl="triton" if triton_backend else "torch",
                                  metadata_impl="triton" if fused_metadata else "torch",
                                  max_prefill_tokens=self.cfg.max_num_batched_tokens,
                                  acceptance_estimate=self.cfg.acceptance_estimate,
                                  prefill_stream=self.cfg.cuda_graphs and self.cfg.prefill_stream,
                                  draft_free_steps=self.cfg.draft_free_steps,
                                  confidence_offsets=self.cfg.online_calibration and bool(self.block_size),
                                  confidence=self.cfg.verify != "full",  # verify-all reads no survival
                                  # no planning below engine.plan_min_rows, so no head there (a forced decision
                                  # allocates from survival at every size)
                                  confidence_min_rows=0 if self._forced_decisions() else self.cfg.plan_min_rows,
                                  greedy_drafter=self._greedy_drafter)
        self.graph = self.steps if self.cfg.cuda_graphs else None  # the device-resident path
        self._head_steps_base = 0  # self.steps.head_steps at the last reset()
        self._greedy_head_steps_base = 0  # self.steps.greedy_head_steps at the last reset()
        # engine.acceptance_estimate=draft_max_prob: the online calibration of the drafter's top probabilities. It is
        # calibration, not request state: reset() keeps it, so a run's warm-up trains it for the timed blocks.
        self.acceptance_estimate = None
        if self.block_size and self.cfg.acceptance_estimate == "draft_max_prob":
            from dspark.acceptance_estimate import OnlineAcceptanceEstimate

            self.acceptance_estimate = OnlineAcceptanceEstimate(self.block_size)
        # engine.online_calibration: logit offsets on the head's confidence, refitted from observed acceptance
        # (kept across reset like the other online estimates).
        self.online_calibration = None
        if self.block_size and self.cfg.online_calibration:
            from dspark.online_calibration import OnlineHeadCalibration

            self.online_calibration = OnlineHeadCalibration(self.block_size)
        self._graph_table_lens: dict[int, int] = {}
        self._prefilled: list[Request] = []  # prefilled on the prefill stream, joining the rows next call
        if self.graph is not None and self._decides_without_planner() and self.online_calibration is None:
            # nothing on the host reads the steps' survival (no lagged rows, no calibration to refit): the launch
            # copies none back and the commit checks and queues none
            self.graph.read_survival = False
        # engine.draft_free_steps: the per-step choice between drafting and a target-only step (kept across reset,
        # like the other online estimates: a run's warm-up trains it for the timed blocks).
        self.draft_free = None
        if self.cfg.draft_free_steps and self.block_size:
            from dspark.draft_free import DraftFreeChoice

            self.draft_free = DraftFreeChoice()

    def _build_planner(self) -> None:
        cfg = self.cfg
        if cfg.cost_table is not None:  # also in verify=full, where it prices the oracle bound
            from dspark.cost_table import CostTable

            self.cost_table = CostTable.load(cfg.cost_table)
            self.cost_table.check_fingerprint(self.fingerprint(), override=cfg.allow_foreign_cost_table)
            most = cfg.max_num_seqs * (self.block_size + 1)
            if self.cost_table.token_counts[-1] < most:
                raise ConfigError(f"engine.cost_table: {cfg.cost_table} covers steps of up to "
                                  f"{self.cost_table.token_counts[-1]} tokens, but this engine may verify "
                                  f"{most} (max_num_seqs {cfg.max_num_seqs} x (block {self.block_size} + 1)); "
                                  f"profile with batch sizes up to {cfg.max_num_seqs} (runners.profile) or lower "
                                  f"engine.max_num_seqs")
        if cfg.verify == "full":
            return
        from dspark.planner import Planner, PlannerConfig

        if self.drafter.confidence_head is None and cfg.acceptance_estimate == "head":
            raise ConfigError(f"engine.verify={cfg.verify!r} schedules by confidence, but this drafter has no "
                              "confidence head (a DFlash-style ablation); use engine.verify=full, or "
                              "engine.acceptance_estimate=draft_max_prob")
        fresh_global = cfg.planner_algorithm == "global" and cfg.budget_lag == 0
        self.planner_config = PlannerConfig(
            block=self.block_size, mode="uniform" if cfg.verify == "uniform" else "ragged",
            algorithm=cfg.planner_algorithm, budget_lag=cfg.budget_lag, allowed_verify_lens=cfg.tiers,
            min_verify_len=cfg.min_verify_len, min_predicted_gain=cfg.min_predicted_gain,
            min_rows=cfg.plan_min_rows, skip_mixed_trim=cfg.skip_mixed_trim, temperature_positive=not fresh_global,
            force_verify_len=cfg.force_verify_len, force_budget_frac=cfg.force_budget_frac,
            force_trimmed_path=cfg.force_trimmed_path)
        self.planner = Planner(self.planner_config, self.cost_table, stats=self.stats)
        if cfg.service_cost:
            from dspark.service_cost import ServiceCostEstimate

            self.service_cost = ServiceCostEstimate()
        if cfg.verify_share is not None:
            from dspark.verify_share import VerifyShareChoice

            self.share_choice = VerifyShareChoice(share=cfg.verify_share)
        # a forced decision applies to every step, and a measured share calls no planner: no gate
        if cfg.plan_gate and cfg.cuda_graphs and not self._forced_decisions() and self.share_choice is None:
            from dspark.plan_gate import PlanGate

            self.plan_gate = PlanGate(warmup=cfg.plan_gate_warmup, probe_every=cfg.plan_gate_probe_every,
                                      probe_every_max=cfg.plan_gate_probe_every_max)

    def _forced_decisions(self) -> bool:
        """Whether engine.force_verify_len / force_budget_frac replace every planner decision."""
        return self.cfg.force_verify_len is not None or self.cfg.force_budget_frac is not None

    def _decides_without_planner(self) -> bool:
        """Whether no device-resident step calls the planner: engine.verify_share's measured choice, or a forced
        share with no minimum window (every cell of its budget is an extra cell, whatever the survival)."""
        if self.planner is None:
            return False
        pc = self.planner_config
        return self.share_choice is not None or (pc.force_budget_frac is not None and pc.min_verify_len == 0
                                                 and pc.mode == "ragged")

    def fingerprint(self) -> dict:
        """What a cost table must have been profiled on to be valid here."""
        import platform

        try:
            import triton

            triton_v = triton.__version__
        except ImportError:
            triton_v = "not installed"
        if self.runner.device.type == "cuda":
            device_name = torch.cuda.get_device_name(self.runner.device)
            driver = str(torch.version.cuda)
        else:
            device_name, driver = f"cpu:{platform.processor() or platform.machine()}", "none"
        step_path = ("graphs+overlap" if self.cfg.overlap else "graphs") if self.cfg.cuda_graphs else "eager"
        from dspark.models.layers import kernel_set

        fp = {"device_name": device_name, "driver": driver, "torch": torch.__version__, "triton": triton_v,
              "step_path": step_path, "kernels": kernel_set(self.kernels, self.runner.device),
              "model": self._target_arch(), "drafter": self._drafter_arch(),
              "dtype": self.cfg.dtype}
        if self.cfg.cuda_graphs and self.cfg.prefill_stream and self.runner.device.type == "cuda":
            fp["prefill_path"] = "side-stream"  # not a checked field: decode steps' cost does not depend on it
        if self.cfg.cuda_graphs:
            # Device-resident steps are timed as their step() call's wall time (StepInfo.step_ms);
            # eager steps as they always were (no field: nothing to check).
            fp["step_timing"] = "step-call"
        return fp

    def _target_arch(self) -> str:
        tc = self.target.cfg
        return f"{tc.arch}-h{tc.hidden_size}-L{tc.num_layers}-V{tc.vocab_size}"

    def _drafter_arch(self) -> str | None:
        if self.drafter is None:
            return None
        dc = self.drafter.cfg
        return f"block{dc.block_size}-L{dc.num_layers}-r{dc.markov_rank}-{dc.markov_variant}"

    def models(self) -> dict:
        """The weights this engine runs: the target's and the drafter's architecture and the checkpoint each was
        loaded from (``origin``, :mod:`dspark.models.provenance`; None for a model built in memory), and the
        confidence calibration in effect (``engine.confidence_calibration``'s file, else the drafter's own; and
        ``engine.greedy_confidence_calibration``'s, which all-greedy steps read, as ``greedy_calibration``)."""
        out = {"target": {"arch": self._target_arch(), "dtype": self.cfg.dtype, "origin": self.target.origin},
               "drafter": None}
        if self.drafter is not None:
            from dspark.models.provenance import calibration_record
            from dspark.training.calibration import calibration_dir

            origin = self.drafter.origin
            if self.cfg.confidence_calibration is not None:
                calibration = calibration_record(calibration_dir(self.cfg.confidence_calibration))
            else:
                calibration = None if origin is None else origin.get("calibration")
            out["drafter"] = {"arch": self._drafter_arch(), "origin": origin, "calibration": calibration}
            if self.cfg.greedy_confidence_calibration is not None:  # what all-greedy steps read instead
                out["drafter"]["greedy_calibration"] = calibration_record(
                    calibration_dir(self.cfg.greedy_confidence_calibration))
        return out

    def _megakernel_raw(self) -> int:
        mk = self.target.megakernel_launches  # (the model may have served other engines before)
        graph = getattr(self, "graph", None)
        if graph is not None:
            mk += graph.megakernel_replays - graph.capture_megakernel_calls
        return mk

    @staticmethod
    def _zero_counts() -> dict[str, int]:
        return {"steps": 0, "decode_steps": 0, "mixed_steps": 0, "prefill_tokens": 0, "request_steps": 0,
                "drafted_tokens": 0, "verified_tokens": 0, "accepted_tokens": 0, "emitted_tokens": 0,
                "trimmed_steps": 0, "ceiling_tokens": 0, "window_tokens": 0, "preemptions": 0,
                "graph_replays": 0, "graph_eager_steps": 0, "eager_steps": 0, "discarded_row_steps": 0,
                "pipelined_steps": 0, "prefill_graph_replays": 0, "prefill_uncaptured": 0,
                "prefill_eager_steps": 0, "prefill_side_stream_replays": 0, "draft_free_steps": 0,
                "depth_zero_rows": 0}

    @property
    def emitted_tokens(self) -> int:
        """Tokens committed so far (cheap: benchmarks read it around every step)."""
        return self._counts["emitted_tokens"]

    @property
    def oracle_steps_recorded(self) -> int:
        """How many committed decode steps the oracle bound holds (full-block acceptances, verify=full
        or cap_accept); a benchmark notes it around the steps it times (:meth:`oracle_bound_over`)."""
        return len(self._oracle_steps)

    def oracle_bound_over(self, indices: Sequence[int]) -> dict | None:
        """The oracle bound (``dspark.planner.oracle_bound``) over the given recorded steps only, e.g. a
        benchmark's timed steps, so that an arm's gain over the same window compares with it. None
        without a cost table or steps."""
        if self.cost_table is None or not indices or self.cfg.verify not in ("full", "cap_accept"):
            return None
        from dspark.planner import oracle_bound

        steps = [self._oracle_steps[i] for i in indices]
        return oracle_bound(steps, [len(s) for s in steps], self.cost_table, block=self.block_size)

    def counters(self) -> dict[str, float]:
        """What the engine did since the last reset (feeds the A/B guards and reports)."""
        c: dict = {f"sched/{k}": v for k, v in self.stats.summary().items() if v is not None}
        c.update(self._counts)
        c["trim_ratio"] = 1.0 - c["window_tokens"] / c["ceiling_tokens"] if c["ceiling_tokens"] else 0.0
        c["accept_rate"] = c["accepted_tokens"] / c["verified_tokens"] if c["verified_tokens"] else 0.0
        for why, n in self.eager_reasons.items():
            c[f"eager_reason/{why}"] = n
        if self.steps.runs_confidence_head():
            # steps whose draft stage ran the confidence head (none below engine.plan_min_rows on the device path)
            c["confidence_head_steps"] = self.steps.head_steps - self._head_steps_base
            if self._confidence_calibration is not None:
                # what the planner reads as survival (acceptance_estimate=head): the steps whose survival came
                # from this calibration (a count, so it sums across blocks); with
                # engine.greedy_confidence_calibration, the all-greedy steps' came from that one
                greedy = self.steps.greedy_head_steps - self._greedy_head_steps_base
                c[f"confidence_calibration/{self._confidence_calibration}_steps"] = c["confidence_head_steps"] - greedy
                if self._greedy_calibration is not None:
                    c[f"confidence_calibration/greedy_{self._greedy_calibration}_steps"] = greedy
        # Steps whose target forward ran the decode megakernel (kernels/decode_megakernel.py):
        # graph replays of steps captured with it, plus eager calls (captures' own calls excluded).
        c["megakernel_steps"] = self._megakernel_raw() - self._megakernel_base
        decode_steps = c["decode_steps"]
        c["mean_running_batch"] = c["request_steps"] / decode_steps if decode_steps else 0.0
        c["kv_pool_tokens"] = self.blocks.num_pages * self.blocks.page_size
        if self.service_cost is not None:
            c.update(self.service_cost.summary())
        if self.plan_gate is not None:
            c.update(self.plan_gate.summary())
        if self.draft_free is not None:
            c.update(self.draft_free.summary())
        if self.share_choice is not None:
            c.update(self.share_choice.summary())
        if self.online_calibration is not None:
            c.update(self.online_calibration.counters())
        if self._eager_step_ms:
            e = sorted(self._eager_step_ms)
            c["eager_step_ms_median"] = e[len(e) // 2]
        if self.graph is not None:
            # Decode steps on the device-resident path (replayed graphs; on a CPU, the same step uncaptured).
            resident = c["graph_replays"] + c["graph_eager_steps"]
            c["device_resident_share"] = resident / decode_steps if decode_steps else 0.0
            c["graphs_captured"] = self.graph.captures - self._captures_base  # since reset(): 0 in a timed run
            c["graphs_total"] = self.graph.captures
            if self._host_step_ms:
                h = sorted(self._host_step_ms)
                c["host_ms_per_graph_step_median"] = h[len(h) // 2]
            if self._host_phase_calls:
                n = self._host_phase_calls
                c.update({f"host/{k}_ms_per_step": v / n for k, v in self._host_phase_ms.items()})
                c["host/step_calls"] = n
            if self.graph.timing is not None:
                t = self.graph.timing_summary()
                if t.get("device_idle_fraction") is not None:
                    c["device_idle_fraction"] = t["device_idle_fraction"]
                # A step's device time per step mode (full, ragged, uniform, draft_free, prefill): first graph's
                # start to last graph's end, median (with the prefill stream, prefills beside it included).
                for mode, ms in t.get("step_device_ms_median", {}).items():
                    c[f"device/{mode}_step_ms_median"] = ms
                # The same per batch bucket (rows), where it has 10 steps or more: a trimmed step and a whole-block
                # step of the same rows compare directly (the median over all steps mixes batch sizes).
                counts_by_batch = t.get("steps_timed_by_batch", {})
                for key, ms in t.get("step_device_ms_median_by_batch", {}).items():
                    if counts_by_batch.get(key, 0) >= 10:
                        mode, rows = key.split("/")
                        c[f"device/{mode}_{rows}_step_ms_median"] = ms
                        c[f"device/{mode}_{rows}_steps"] = int(counts_by_batch[key])
                # Each graph's own device time (draft, verify per token bucket, the fused step, prefill), where it
                # replayed 10 times or more: the parts a step's time above is made of.
                replays = t.get("graph_replays_timed", {})
                for name, ms in t.get("graph_device_ms_median", {}).items():
                    if replays.get(name, 0) >= 10:
                        c[f"device/graph_{name}_ms_median"] = ms
        if self.cost_table is not None and self._oracle_steps and self.cfg.verify in ("full", "cap_accept"):
            from dspark.planner import oracle_bound

            try:
                ob = oracle_bound(self._oracle_steps, [len(s) for s in self._oracle_steps], self.cost_table,
                                  block=self.block_size, measured_ms=self._oracle_step_ms, extrapolate=True)
                c.update({f"oracle/{k}": v for k, v in ob.items() if isinstance(v, (int, float))})
            except ValueError as e:  # a step outside the table: say so instead of guessing
                c["oracle/unavailable"] = str(e)
        return c

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, model: str = "smollm2", drafter: str | None = None, config: EngineConfig | None = None,
                        cache_dir: str | None = None) -> "Engine":
        from dspark.models.loading import load_hf_folder, target_folder
        from dspark.models.provenance import target_record

        folder = target_folder(model, cache_dir=cache_dir)
        mcfg, state, tokenizer = load_hf_folder(folder)
        target = TargetModel(mcfg)
        target.load_hf_state_dict(state)
        target.origin = target_record(folder)
        draft_model = None
        config = config or EngineConfig()
        if config.spec == "dspark":
            if drafter is None:
                raise ConfigError("engine.spec=dspark needs a drafter checkpoint: set drafter=PATH or engine.spec=off")
            from dspark.models.drafter import DSparkDrafter

            draft_model = DSparkDrafter.load(drafter, mcfg, device=config.device, dtype=DTYPES[config.dtype])
        return cls(target, tokenizer, config, draft_model)

    # ---- requests -------------------------------------------------------------------------
    def _tokenize(self, prompt: PromptLike) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("a text prompt needs a tokenizer; pass token ids instead")
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            if self.tokenizer is None:
                raise RequestError("chat messages need a tokenizer with a chat template")
            return self.tokenizer.encode_chat(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise RequestError(f"prompt must be text, a list of token ids or a list of chat messages, got {type(prompt).__name__}")

    def _validate(self, ids: list[int], params: SamplingParams) -> None:
        V = self.target.cfg.vocab_size
        if not ids:
            raise RequestError("empty prompt: a request needs at least one token")
        bad = [t for t in ids if not 0 <= t < V]
        if bad:
            raise RequestError(f"unknown token ids {bad[:5]}: valid ids are 0..{V - 1}")
        if len(ids) >= self.cfg.max_model_len:
            raise RequestError(f"prompt has {len(ids)} tokens, the context holds {self.cfg.max_model_len} "
                               f"(engine.max_model_len) including at least one generated token")
        pool = self.blocks.num_pages * self.blocks.page_size
        if len(ids) + self._lookahead > pool:  # it could never be prefilled: refuse it instead of waiting forever
            raise RequestError(f"prompt has {len(ids)} tokens and its first step needs {self._lookahead} more slots, "
                               f"but the whole KV pool holds {pool} (engine.num_kv_blocks x engine.kv_block_size, or "
                               f"engine.kv_cache_tokens); raise it or shorten the prompt")

    def add_request(self, prompt: PromptLike, params: SamplingParams | None = None, user_id: str | None = None) -> int:
        """Queue a request; raises RequestError (nothing queued) when the input is invalid."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise RequestError(f"sampling must be SamplingParams, got {type(params).__name__}")
        if (params.temperature > 0 and self.planner is not None
                and self.cfg.planner_algorithm == "global" and self.cfg.budget_lag == 0):
            raise RequestError("temperature > 0 with a global budget search over fresh confidence "
                               "(engine.budget_lag=0) would bias the output distribution (non-anticipation); "
                               "set engine.budget_lag to 1 or 2, or engine.planner_algorithm=greedy_stop")
        ids = self._tokenize(prompt)
        self._validate(ids, params)
        req = Request(self._next_id, ids, params, self.block_size, user_id=user_id)
        self._next_id += 1
        self._requests[req.req_id] = req
        self.scheduler.add(req)
        return req.req_id

    def output_ids(self, req_id: int) -> list[int] | None:
        """The tokens a live request has committed so far (a copy), or None once it finished or was
        never queued: a streaming server sends the part it has not sent yet after each step."""
        req = self._requests.get(req_id)
        return None if req is None else list(req.output_ids)

    def abort(self, req_id: int) -> RequestOutput | None:
        """Stop a live request now (a client went away): it finishes with reason ``abort``, its pages and
        device row are freed, and a step in flight drops its tokens. Returns its output, or None when it
        already finished or was never queued."""
        req = self._requests.get(req_id)
        if req is None:
            return None
        self._finish(req, "abort")
        if self.graph is not None:
            if any(r is req for r in self.graph.rows):
                self.graph.retire({req_id})  # queued behind any step in flight, like a finished row
            self._graph_table_lens.pop(req_id, None)
            self._unjoined = [r for r in self._unjoined if r is not req]
        return RequestOutput.from_request(req)

    def has_unfinished(self) -> bool:
        if not self.scheduler.has_work() and self._inflight is not None:
            self._drain()  # every row of the step in flight has finished: its tokens are discarded
        return self.scheduler.has_work()

    # ---- the step -------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        if self.graph is not None:
            start = time.perf_counter()
            self._graph_wait_ms = 0.0
            self._step_call_start = start
            self._step_calls += 1
            try:
                out = self._graph_step()
            finally:
                self._step_call_start = None
            if out is not None:
                end = time.perf_counter()
                # Host time of a device-resident step: its wall time minus the wait for the device.
                # With overlap that host work runs while the device computes the step in flight.
                self._host_step_ms.append((end - start) * 1e3 - self._graph_wait_ms)
                if self._step_call_end is not None:  # the caller's own work since the last step() returned
                    self._host_phase_ms["caller"] += (start - self._step_call_end) * 1e3
                self._step_call_end = end
                self._host_phase_calls += 1
                return out
            self._step_call_end = None
        plan = self.scheduler.schedule()
        finished: list[RequestOutput] = []
        for req, why in plan.failed:
            self._finish(req, "error", error=why)
            finished.append(RequestOutput.from_request(req))
        if plan.empty:
            return finished
        self.num_steps += 1
        step_start = time.perf_counter()
        counts = self._counts
        counts["steps"] += 1
        counts["eager_steps"] += 1  # this path never replays a graph
        counts["prefill_eager_steps"] += int(bool(plan.prefills))
        self.eager_reasons[self._eager_reason] += 1
        counts["preemptions"] += len(plan.preempted)
        counts["prefill_tokens"] += sum(c.length for c in plan.prefills)
        decodes = plan.decodes
        if decodes:
            counts["decode_steps"] += 1
            counts["mixed_steps"] += int(plan.is_mixed)
        G = self.block_size
        steps = self.steps
        steps.wait_prefill()  # requests prefilled on the prefill stream may decode in this step
        prefill_tokens = sum(c.length for c in plan.prefills)
        if plan.prefills:
            self._prefill(plan.prefills)
        windows: list[int] = []
        num_tokens, bucket = prefill_tokens, prefill_tokens
        if decodes:
            if self.graph is not None:
                self._rows_stale = True  # the host-driven step reloads the rows: the device path reloads after it
            steps.load(decodes)
            free_bucket = steps.bucket_for(len(decodes)) or len(decodes)
            free = self.draft_free is not None and self.draft_free.draft_free(free_bucket)
            if free:  # no drafting: every row verifies nothing and commits the target's token
                decision, windows, cap = None, [0] * len(decodes), False
            else:
                steps.draft_rows(len(decodes))
                decision = self._plan(decodes, plan, all_greedy=steps.sampling[0])
                windows = list(decision.windows) if decision is not None else [G] * len(decodes)
                cap = self.cfg.verify == "cap_accept" and G > 0  # verify the whole block, cap acceptance at the plan
            step_tokens = sum(w + 1 for w in ([G] * len(decodes) if cap else windows))
            buckets = self.cfg.token_buckets
            step_bucket = next((b for b in buckets if b >= step_tokens), step_tokens) if buckets else step_tokens
            results = steps.verify_rows(windows, step_bucket, cap_accept=cap)
            num_tokens, bucket = prefill_tokens + step_tokens, prefill_tokens + step_bucket
            if self.cfg.debug_checks:
                check_step_consistency([G] * len(decodes) if cap else windows, steps.last_indptr.cpu().to(torch.int32),
                                       step_tokens, step_bucket, G)
            accepted = [k for k, _, _ in results]
            uncapped = steps.uncapped[: len(decodes)].tolist() if cap else None
            # The step so far (drafting and planning included), as the profiler times a step: the cost table's
            # prediction for this step is compared with it (stats: measured_ms_on_predicted).
            step_ms = (time.perf_counter() - step_start) * 1e3
            now = time.perf_counter()
            if G and not free:  # a draft-free step verifies nothing: not a scheduling step
                self.stats.record_step(request_ids=[r.req_id for r in decodes], windows=windows,
                                       accepted=accepted, block=G, mode=self.cfg.verify,
                                       uncapped_accepted=uncapped, num_tokens=num_tokens,
                                       bucket=bucket, graph_replay=False, eager_reason=self._eager_reason,
                                       step_ms=step_ms, decision=decision)
                self._oracle_steps.append(list(uncapped if uncapped is not None else accepted))
                self._oracle_step_ms.append(step_ms)
                counts["trimmed_steps"] += int(decision is not None and decision.trimmed)
                if self.step_trace is not None:
                    self._trace_step(decodes, windows if not cap else [G] * len(decodes),
                                     uncapped if uncapped is not None else accepted)
            if self.acceptance_estimate is not None and not free:
                self._learn_acceptance(steps.max_prob[: len(decodes)].cpu().numpy(),
                                       [G] * len(decodes) if cap else windows, uncapped if cap else accepted)
            if self.online_calibration is not None and not free:
                self._learn_calibration(steps.survival[: len(decodes)].cpu().numpy(),
                                        [G] * len(decodes) if cap else windows, uncapped if cap else accepted)
            self._count_rows(windows, accepted, drafted=not free)
            finished += self._commit_rows([(req, w, k, new) for req, w, (k, _, new) in zip(decodes, windows, results)],
                                          now)
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize(self.runner.device)  # step timing below must include the device work
        self.last_step = StepInfo(num_decodes=len(decodes), num_prefill_tokens=prefill_tokens,
                                  num_tokens=num_tokens, bucket=bucket, windows=tuple(windows),
                                  step_ms=(time.perf_counter() - step_start) * 1e3)
        self._eager_step_ms.append(self.last_step.step_ms)
        if decodes:  # a host-driven step is synchronous: its time is the host's and the device's together
            self._learn_step_cost(free_bucket, free, sum(accepted) + len(decodes), self.last_step.step_ms, decision,
                                  host_ms=None, waited_ms=self.last_step.step_ms)
        return finished

    def _learn_step_cost(self, bucket: int, free: bool, tokens: int, step_ms: float, decision, *,
                         host_ms: float | None, waited_ms: float) -> None:
        """Count a committed decode step in the online estimates that read step times: the draft-free choice
        (engine.draft_free_steps; its output tokens and time, per batch bucket, when it committed any) and the
        service price (engine.service_cost; against the table's price of the decision, which the planner then
        uses)."""
        if free:
            self._counts["draft_free_steps"] += 1
        if self.draft_free is not None and tokens:
            self.draft_free.update(bucket, draft_free=free, tokens=tokens, step_ms=step_ms)
        if (self.share_choice is not None and decision is not None and tokens
                and decision.reason in (SHARE_REASON, SHARE_FULL_REASON)):
            self.share_choice.record(bucket, alternative=decision.reason == SHARE_REASON, tokens=tokens,
                                     step_ms=step_ms)
        if self.service_cost is not None and decision is not None:
            # (the planner reads the price right before it plans: _service_price)
            self.service_cost.update(step_ms=step_ms, table_ms=decision.predicted_ms, host_ms=host_ms,
                                     waited_ms=waited_ms)

    def _service_price(self) -> None:
        """Give the planner the service price of the steps committed so far (engine.service_cost), right before
        it plans: the estimate's medians (and at times its line) are host work that a step the plan gate skips
        does not need."""
        if self.service_cost is not None:
            self.planner.service = self.service_cost.current()

    def _prefill(self, chunks, overlap: bool = False) -> None:
        """Prefill chunks through the step pipeline's prefill stage, in forwards that fit its largest
        prefill shape (tokens and chunks); with ``overlap``, on the prefill stream when there is one."""
        steps = self.steps
        group: list[Segment] = []
        tokens = 0
        for c in chunks:
            seg = Segment(c.req, c.start, c.req.all_ids[c.start: c.start + c.length])
            if group and not steps.prefill_fits(tokens + c.length, len(group) + 1):
                steps.prefill(group, overlap=overlap)
                group, tokens = [], 0
            group.append(seg)
            tokens += c.length
        if group:
            steps.prefill(group, overlap=overlap)
        for c in chunks:
            c.req.num_computed = c.start + c.length

    def start_step_trace(self):
        """Record every later decode step's fresh survival, windows and accepted counts
        (``dspark.step_trace.StepTrace``; returned, and kept in ``self.step_trace`` until reset()).
        Eager steps only: refused on the CUDA-graph path, whose steps return the survival of the
        block they drafted, not of the one they verified."""
        from dspark.step_trace import StepTrace

        if self.block_size == 0 or self.drafter.confidence_head is None:
            raise ConfigError("step trace: it records the confidence head's survival, and this engine has "
                              + ("no drafter (spec=off)" if self.block_size == 0 else "a drafter without one"))
        if self.graph is not None:
            raise ConfigError("step trace: recorded by eager steps only; set engine.cuda_graphs=false")
        self.step_trace = StepTrace(self.block_size)
        self.steps.trace_max_prob = True  # the draft stage keeps each slot's top-token probability for the trace
        return self.step_trace

    def _trace_step(self, decodes, windows, accepted) -> None:
        n = len(decodes)
        raw = self.steps.confidence_logits[:n].clone()  # the buffers are the next step's too
        top = self.steps.max_prob[:n].clone()
        gap = self.steps.top_gap[:n].clone() if self.steps.keeps_top_gap() else None
        # the survival the planner read, recomputed on the host from the raw logits (and, for an sts_max_prob
        # calibration, the max probabilities, for an sts_top_gap one the top-2 gaps; with
        # engine.online_calibration, the offsets this step drafted with)
        calibrated = self.steps.calibrated_drafter()  # this step's rows' calibration
        survival = prefix_survival(calibrated.calibrated_confidence(raw, top, self.steps.confidence_offsets, gap))
        self.step_trace.record([r.req_id for r in decodes], survival.cpu().numpy(), windows,
                               [int(k) for k in accepted], confidence_logits=raw.cpu().numpy(),
                               draft_max_prob=top.cpu().numpy())

    def _count_rows(self, windows: list[int], accepted: list[int], drafted: bool = True) -> None:
        """Step counters for the rows committed this step (one update per step, not per row); ``drafted``
        False for a draft-free step."""
        n, G, W, K = len(windows), self.block_size if drafted else 0, sum(windows), sum(accepted)
        counts = self._counts
        counts["request_steps"] += n
        counts["drafted_tokens"] += G * n
        counts["ceiling_tokens"] += G * n
        counts["window_tokens"] += W
        counts["verified_tokens"] += W
        counts["accepted_tokens"] += K
        counts["emitted_tokens"] += K + n
        if drafted:
            counts["depth_zero_rows"] += windows.count(0)  # drafted rows that verified no draft (min_verify_len 0)

    # ---- device-resident steps (engine.cuda_graphs) ---------------------------------------
    def _reserve_rows_ahead(self, rows: list[Request], pending: list[Request]) -> str | None:
        """Reserve pages for every row's next steps (``num_tokens`` + the lookahead) and send the device
        the page-table entries that adds; or, touching nothing, say why the device path cannot run."""
        gd = self.graph
        if gd.bucket_for(len(rows) + len(pending)) is None:
            return "over_largest_bucket"
        needed, ahead, lens = self.blocks.pages_needed, self._lookahead, self._graph_table_lens
        # A row's pages hold lens[id] * page_size positions (lens: the table lengths the device has).
        # Most steps add no page to most rows, so one comparison per row finds those that grow.
        span = self.blocks.page_size
        grow = [(i, r, n) for i, r in enumerate(rows)
                if len(r.prompt_ids) + len(r.output_ids) + ahead > lens.get(r.req_id, 0) * span
                and (n := needed(r.req_id, r.num_tokens + ahead))]
        pages = sum(n for _, _, n in grow) + sum(needed(r.req_id, r.num_tokens + ahead) for r in pending)
        if pages > self.blocks.num_free:
            return "kv_pages"  # the eager scheduler preempts to make room
        if grow:
            updates = []
            table_of, reserve = self.blocks.table, self.blocks.reserve
            for i, r, _ in grow:
                reserve(r.req_id, r.num_tokens + ahead)
                table = table_of(r.req_id)
                known = lens.get(r.req_id, 0)
                updates.extend((i, c, table[c]) for c in range(known, len(table)))
                lens[r.req_id] = len(table)
            gd.set_table_entries(updates)
        return None

    def _graph_step(self) -> list[RequestOutput] | None:
        """One device-resident step, or None to let the eager path run this step (reason counted).

        A call (1) rebuilds the device rows from the host after eager steps; (2) reserves the rows'
        pages ahead, or hands over to the eager path (after draining the pipeline) when the pool cannot;
        (3) runs this call's prefill chunks and admissions (``Scheduler.schedule_prefills``) as one
        captured forward, and requests whose prefill is complete join the rows; (4) plans and launches
        the decode step over the rows; (5) commits the step launched by the previous call (overlap) or
        this one, and retires the rows of requests that finished. Joining and retiring rows touch only
        those rows on the device, queued behind the step in flight, so admissions, retirements and the
        ramp-down keep the pipeline going.
        """
        gd, sched = self.graph, self.scheduler
        clock, phase = time.perf_counter, self._host_phase_ms
        mark = clock()
        if self._rows_stale:  # eager steps ran: the host's state is exact and the device's is not
            if self._inflight is not None:
                return self._drain()
            gd.load([r for r in sched.running if not r.in_prefill])
            self._graph_table_lens = {r.req_id: len(self.blocks.table(r.req_id)) for r in gd.rows}
            self._unjoined = []
            self._prefilled = []
            self._rows_stale = False
        why = self._reserve_rows_ahead(gd.rows, self._unjoined + self._prefilled)
        if why is not None:
            if self._inflight is not None:
                return self._drain()  # finish the pipeline first; the next call re-plans on exact state
            self._eager_reason = why
            self._rows_stale = True
            return None
        ahead = self._lookahead
        counts = self._counts
        finished: list[RequestOutput] = []
        now = clock()
        phase["rows"] += (now - mark) * 1e3
        mark = now
        # Requests whose prefill is complete join the rows: those that waited for pages; those an earlier
        # call prefilled on the prefill stream (ordered before this step's launch here, before this call's
        # prefill is issued, so that it still runs beside this step); this call's completed prefills when
        # they ran on the current stream; and requests with nothing to prefill (a one-token prompt).
        candidates = self._unjoined + [r for r in self._prefilled if r.finish_reason is None]
        if self._prefilled:
            gd.wait_prefill()
            self._prefilled = []
        plan = sched.schedule_prefills(min(self.cfg.max_num_batched_tokens, gd.prefill_buckets[-1]),
                                       max_chunks=gd.max_prefill_segments)
        for req, reason in plan.failed:
            self._finish(req, "error", error=reason)
            finished.append(RequestOutput.from_request(req))
        prefill_tokens = sum(c.length for c in plan.prefills)
        overlapped = gd.prefill_stream is not None
        if plan.prefills:
            side_before = gd.prefill_side_replays
            self._prefill(plan.prefills, overlap=overlapped)
            counts["prefill_side_stream_replays"] += gd.prefill_side_replays - side_before
            counts["prefill_tokens"] += prefill_tokens
            counts["prefill_graph_replays" if gd.use_graphs else "prefill_uncaptured"] += 1
        done = [c.req for c in plan.prefills if not c.req.in_prefill]
        if overlapped:
            self._prefilled = done
        else:
            candidates += done
        candidates += [r for r in plan.admitted_ready]
        now = clock()
        phase["prefill"] += (now - mark) * 1e3
        mark = now
        joiners, self._unjoined = [], []
        for r in candidates:
            if self.blocks.can_reserve(r.req_id, r.num_tokens + ahead):
                self.blocks.reserve(r.req_id, r.num_tokens + ahead)
                joiners.append(r)
            else:  # it joins once pages free up (until then the pool check above counts it)
                self._unjoined.append(r)
        if joiners:
            gd.join(joiners)
            for r in joiners:
                self._graph_table_lens[r.req_id] = len(self.blocks.table(r.req_id))
        rows = gd.rows
        if not rows:  # nothing decodes (yet): a prefill-only call
            if self._inflight is not None:
                finished += self._drain()
            if plan.prefills:
                counts["steps"] += 1
                self.last_step = StepInfo(num_decodes=0, num_prefill_tokens=prefill_tokens, num_tokens=prefill_tokens,
                                          bucket=0, windows=(), step_ms=0.0)
            return finished
        B = len(rows)
        now = clock()
        phase["join"] += (now - mark) * 1e3
        mark = now
        key = (gd.bucket_for(B), gd.sampling)
        if key != self._captured_key:  # a new batch bucket: its graphs (captured ahead by capture_graphs)
            gd.ensure_captured(B, self._graph_mode, self.cfg.tiers)
            self._captured_key = key
        if self.draft_free is not None and self.draft_free.draft_free(gd.bucket_for(B)):
            mode, tier, extra, decision = "draft_free", None, None, None
        else:
            mode, tier, extra, decision = self._graph_decision(rows)
        now = clock()
        phase["plan"] += (now - mark) * 1e3
        launched = gd.launch(B, mode, tier=tier, extra=extra)
        mark = clock()
        phase["launch"] += (mark - now) * 1e3
        launched.decision = decision
        launched.num_prefill_tokens = prefill_tokens
        counts["steps"] += 1
        counts["decode_steps"] += 1
        counts["mixed_steps"] += int(bool(plan.prefills))
        if gd.use_graphs:
            counts["graph_replays"] += 1
        else:
            counts["graph_eager_steps"] += 1
            self.eager_reasons["cpu"] += 1
        if self.cfg.overlap:
            previous, self._inflight = self._inflight, launched
            if previous is None:  # the pipeline's first step: nothing to commit yet
                self.last_step = StepInfo(num_decodes=0, num_prefill_tokens=prefill_tokens, num_tokens=0,
                                          bucket=launched.bucket, windows=(), step_ms=launched.launch_ms)
                self._count_plan_cost(0.0, device_ran=False)
                return finished
            counts["pipelined_steps"] += 1
            launched = previous
        waited_before = self._graph_wait_ms
        finished += self._commit_launched(launched)
        waited = self._graph_wait_ms - waited_before
        # With overlap the host planned while the device ran the step just committed: a wait for it hid the plan.
        self._count_plan_cost(waited, device_ran=self.cfg.overlap)
        phase["wait"] += waited
        phase["commit"] += (clock() - mark) * 1e3 - waited
        return finished

    @property
    def _graph_mode(self) -> str:
        """The verify mode the device-resident steps capture graphs for (full without a planner)."""
        return self.cfg.verify if self.planner is not None else "full"

    def capture_graphs(self, sampling: Sequence[SamplingParams] = ()) -> int:
        """Capture, before any timed work, every graph this engine's runs can replay: decode graphs for
        every batch bucket up to max_num_seqs (for the sampling signature of ``sampling``, the requests
        a run will serve; greedy when empty) and every prefill graph. Needs an idle engine (after
        reset()). Returns the number of graphs captured now (0 without CUDA graphs)."""
        if self.graph is None or not self.graph.use_graphs:
            return 0
        if self.scheduler.has_work() or self._inflight is not None:
            raise RuntimeError("capture_graphs needs an idle engine: call it after reset()")
        from dspark.sampling import RowSampling

        signatures = {(True, False, False)}
        if sampling:
            flags = RowSampling(list(sampling))
            signatures = {(flags.all_greedy, flags.needs_k, flags.needs_p)}
        with torch.inference_mode():
            n = self.graph.capture_all(self._graph_mode, self.cfg.tiers, sorted(signatures))
        self._captures_base = self.graph.captures
        return n

    def _slot(self, req: Request) -> int:
        slot = self._slot_of.get(req.req_id)
        if slot is None:
            slot = self._free_slots.pop()
            self._slot_of[req.req_id] = slot
            self.planner.reset_slot(slot)  # a recycled slot never inherits its predecessor's confidence
        return slot

    def _graph_decision(self, running: list[Request]):
        """(mode, tier, extra, decision) of a captured step, planned on the host from lagged survival; with
        engine.plan_gate, only where planning is expected to pay (a skipped step runs the full block)."""
        if self.planner is None:
            return "full", None, None, None
        if len(running) < self.planner_config.min_rows and not self._forced_decisions():
            # engine.plan_min_rows: the planner's own decline, without its host time (nor the gate's, which
            # learns only where the planner may trim)
            decision = self._full_block_decision(len(running), SMALL_BATCH_REASON)
            self.stats.record_plan(decision)
            return "full", None, None, decision
        if self.share_choice is not None:
            return self._share_decision(len(running))
        pc = self.planner_config
        if self._decides_without_planner():
            # A forced share with no minimum window: every cell of its budget is an extra cell, whatever the
            # survival, so the planner's host work (lagged rows, service price) would only add to the step.
            return self._cell_share_decision(len(running), pc.force_budget_frac, "forced")
        gate = self.plan_gate
        if gate is not None:
            bucket = self.graph.bucket_for(len(running))
            if not gate.should_plan(bucket):
                decision = self._full_block_decision(len(running), SKIPPED_REASON)
                self.stats.record_plan(decision)
                return "full", None, None, decision
        from dspark.planner import plan_budget

        start = time.perf_counter()
        queued = self.planner.catch_up()  # the snapshots of the steps since the planner last read them
        caught_up = time.perf_counter()
        fits = self.service_cost.slope_fits if self.service_cost is not None else 0
        self._service_price()
        priced = time.perf_counter()
        newest_age = 2 if self.cfg.overlap else 1  # the newest snapshot read back is this old already
        sizing = self.planner.lagged_rows([self._slot(r) for r in running], newest_age)
        decision = plan_budget(ranking_survival=None, sizing_survival=sizing, table=self.cost_table,
                               config=self.planner_config, temperature_positive=False, service=self.planner.service)
        plan_ms = (time.perf_counter() - start) * 1e3
        self.stats.record_plan(decision, plan_ms=plan_ms)
        if gate is not None:
            refit = self.service_cost is not None and self.service_cost.slope_fits > fits
            lump_ms = backlog_ms((caught_up - start) * 1e3, max(queued, 1),
                                 (priced - caught_up) * 1e3 if refit else 0.0,
                                 self.service_cost.refit_every if refit else 1)
            self._plan_cost = (bucket, plan_ms - lump_ms, lump_ms)
        if not decision.trimmed:
            return "full", None, None, decision
        if self.cfg.verify == "uniform":
            return "uniform", decision.windows[0], None, decision
        return "ragged", None, decision.extra_cells, decision

    def _share_decision(self, rows: int):
        """engine.verify_share: this step's (mode, tier, extra, decision) from the measured choice at its batch
        bucket, the whole block or the share's cells (allocated from fresh survival: on the device on the
        device-resident path, by the host-driven step's allocation otherwise)."""
        choice = self.share_choice
        if not choice.alternative(self.steps.bucket_for(rows)):
            decision = self._full_block_decision(rows, SHARE_FULL_REASON)
            self.stats.record_plan(decision)
            return "full", None, None, decision
        return self._cell_share_decision(rows, choice.share, SHARE_REASON)

    def _cell_share_decision(self, rows: int, share: float, reason: str):
        """(mode, tier, extra, decision) of a ragged step verifying ``share`` of its ``rows`` x block drafted cells
        (engine.verify_share, or a forced share without a minimum window): min_verify_len per row, then the extra
        cells of highest fresh survival, picked by the allocation; recorded as ``reason``, with no prediction."""
        budget = share_budget(share, rows, self.block_size)
        extra = max(0, budget - rows * self.planner_config.min_verify_len)
        decision = PlanDecision(None, True, reason, 0.0, None, None, budget, extra)
        self.stats.record_plan(decision)
        return "ragged", None, extra, decision

    def _full_block_decision(self, rows: int, reason: str):
        """The decision of a step of ``rows`` requests that ran the full block without a planner call (``reason``:
        the plan gate skipped it, engine.plan_min_rows, or engine.verify_share's choice), priced by the cost table
        as a declined decision is (the service price learns from it)."""
        decision = self._full_block_decisions.get((rows, reason))
        if decision is None:
            G = self.block_size
            ms = None
            if self.cost_table is not None:
                ms = self.cost_table.step_ms(rows * (G + 1), rows, extrapolate=self.planner_config.extrapolate_cost)
            decision = PlanDecision(tuple([G] * rows), False, reason, 0.0, None, ms, rows * G)
            self._full_block_decisions[(rows, reason)] = decision
        return decision

    def _count_plan_cost(self, waited_ms: float, device_ran: bool) -> None:
        """Give the plan gate the host time of the planner call this step() call made (if it made one) less its
        backlog (``plan_gate.backlog_ms``), and how long the call then waited for the device step that ran while
        it planned, plus that backlog (``device_ran`` False: none ran, the device idled while the host planned)."""
        if self._plan_cost is not None:
            bucket, plan_ms, lump_ms = self._plan_cost
            self._plan_cost = None
            # Without the backlog (work a planning engine spreads over its steps) the call would have waited longer.
            self.plan_gate.record_cost(bucket, plan_ms, waited_ms + lump_ms if device_ran else 0.0)

    def _drain(self) -> list[RequestOutput]:
        launched, self._inflight = self._inflight, None
        return self._commit_launched(launched) if launched is not None else []

    def _step_period_ms(self, launched, commit_start: float) -> float:
        """A committed device-resident step's time, as the service pays it: from the previous step's commit
        to this one's when the previous step() call committed too (a busy engine: everything the host did
        in between, the caller's work included, is in it; with overlap this is the device's step time
        when the host keeps up, the host's cycle when it does not). After a pause (a step() call that
        committed nothing) it is the wall time of the step() call that commits it; a commit outside step()
        (a drain from has_unfinished) has no such call: its launch plus its commit."""
        now = time.perf_counter()
        previous, self._last_commit = self._last_commit, None
        if self._step_call_start is None:
            return launched.launch_ms + (now - commit_start) * 1e3
        self._last_commit = (self._step_calls, now)
        if previous is not None and previous[0] == self._step_calls - 1:
            return (now - previous[1]) * 1e3
        return (now - self._step_call_start) * 1e3

    def _commit_launched(self, launched) -> list[RequestOutput]:
        start = time.perf_counter()
        results, waited_ms = self.graph.collect(launched)
        self._graph_wait_ms += waited_ms
        now = time.perf_counter()
        G = self.block_size
        track = launched.survival is not None and self.planner is not None
        # A row whose request finished in the step before is dropped with its tokens (counted below); in the
        # common step every row is live, and the columns are built without a per-row branch.
        reqs = list(map(self._requests.get, launched.req_ids))
        live_at = [i for i, req in enumerate(reqs) if req is not None and req.finish_reason is None]
        if len(live_at) == len(reqs):
            live_ids, live_reqs, live_results = list(launched.req_ids), reqs, results
        else:
            live_ids = [launched.req_ids[i] for i in live_at]
            live_reqs = [reqs[i] for i in live_at]
            live_results = [results[i] for i in live_at]
        accepted = [r[0] for r in live_results]
        windows = [r[1] for r in live_results]
        rows = [(req, r[1], r[0], r[2]) for req, r in zip(live_reqs, live_results)]
        self._counts["discarded_row_steps"] += len(results) - len(rows)
        # Slots first: committing finishes requests, and a finished request gives its slot back.
        slots = [self._slot(r) for r, _, _, _ in rows] if track else []
        live_rows = live_at if track else []
        finished = self._commit_rows(rows, now)
        free = launched.draft_free
        self._count_rows(windows, accepted, drafted=not free)
        if launched.max_prob is not None and live_at and self.acceptance_estimate is not None:
            self._learn_acceptance(launched.max_prob.numpy()[live_at], windows, accepted)
        if live_rows:
            # The live rows' survival, as one host array (the pinned copy the launch made; a view of it when
            # every row is live).
            snapshot = launched.survival.numpy()
            if len(live_rows) < len(results):
                snapshot = snapshot[live_rows]
            in_range = bool(snapshot.min() >= 0.0) and bool(snapshot.max() <= 1.0)  # two reductions; NaN fails them
            bad = [] if in_range else [i for i, row in enumerate(snapshot.tolist())
                                       if any(not 0.0 <= v <= 1.0 for v in row)]
            if bad:
                gd = self.graph
                B = len(launched.req_ids)
                diag = {"nan_rows_now": int(torch.isnan(gd.survival[:B]).any(1).sum()),
                        "seq_len": (int(gd.seq_len[:B].min()), int(gd.seq_len[:B].max())),
                        "extra": int(gd.extra[0]), "tier": int(gd.tier[0]), "windows": [r[1] for r in results][:8]}
                R = gd.bucket_for(B) // gd.M
                gd._draft_stage(R)  # the same stage, uncaptured, on the same state
                diag["nan_rows_eager_redo"] = int(torch.isnan(gd.survival[:B]).any(1).sum())
                diag["nan_drafts_hidden_cache"] = int(torch.isnan(self.runner.draft_cache.k).sum())
                diag["nan_target_cache"] = int(torch.isnan(self.runner.cache.k).sum())
                raise RuntimeError(f"device step (bucket {launched.bucket}, {B} rows) returned "
                                   f"survival outside [0, 1] for live rows {bad[:4]}: {snapshot[bad[0]].tolist()}; "
                                   f"{diag}")
            # distinct slots (the slot map) and rows in range (tested above): the planner need not check them again
            self.planner.push_checked_snapshot(slots, snapshot)
            if self.online_calibration is not None and not free:
                self._learn_calibration(snapshot, windows, accepted)
        decision = launched.decision
        if decision is not None and decision.trimmed:
            self._counts["trimmed_steps"] += 1
        step_ms = self._step_period_ms(launched, start)
        bucket = self.graph.bucket_for(len(launched.req_ids))
        self._learn_step_cost(bucket, free, sum(accepted) + len(live_ids),
                              step_ms, decision, waited_ms=waited_ms, host_ms=max(0.0, step_ms - waited_ms))
        if self.plan_gate is not None and decision is not None and decision.reason not in UNPLANNED_REASONS:
            self.plan_gate.record_benefit(bucket, trimmed=decision.trimmed, predicted_gain=decision.predicted_gain,
                                          period_ms=step_ms)
        if G and live_ids and not free:  # a draft-free step verifies nothing: not a scheduling step
            self.stats.record_step(request_ids=live_ids, windows=windows, accepted=accepted, block=G,
                                   mode=self.cfg.verify, num_tokens=launched.num_tokens,
                                   bucket=launched.bucket, graph_replay=self.graph.use_graphs,
                                   eager_reason=None if self.graph.use_graphs else "cpu", step_ms=step_ms,
                                   decision=decision)
            if self.cfg.verify == "full":
                self._oracle_steps.append(list(accepted))
                self._oracle_step_ms.append(step_ms)
        self.last_step = StepInfo(num_decodes=len(live_ids), num_prefill_tokens=launched.num_prefill_tokens,
                                  num_tokens=launched.num_tokens, bucket=launched.bucket,
                                  windows=tuple(windows),
                                  step_ms=step_ms, wait_ms=waited_ms)
        if finished:  # their rows leave the device batch (queued behind any step in flight)
            gone = {o.req_id for o in finished}
            self.graph.retire(gone)
            for rid in gone:
                self._graph_table_lens.pop(rid, None)
        return finished

    def _learn_calibration(self, survival, windows: list[int], accepted: list[int]) -> None:
        """Count a committed step's verified rows in the online calibration; after a refit, send the device the new
        offsets (engine.online_calibration)."""
        if self.online_calibration.update(survival, windows, accepted):
            self.steps.set_confidence_offsets(self.online_calibration.offsets)

    def _learn_acceptance(self, max_prob, windows: list[int], accepted: list[int]) -> None:
        """Count a committed step's rows in the online acceptance estimate and send the device the new table."""
        self.acceptance_estimate.update(max_prob, windows, accepted)
        self.steps.set_estimate_table(self.acceptance_estimate.table())

    def _plan(self, decodes: list[Request], plan, all_greedy: bool):
        """The planner's decision for this host-driven step, on the survival its draft stage just computed
        (None in verify=full or without decodes)."""
        if self.planner is None or not decodes:
            return None
        for r in decodes:
            self._slot(r)
        survival = self.steps.survival[: len(decodes)].tolist()
        if self.share_choice is not None and len(decodes) >= self.planner_config.min_rows:
            decision = self._share_decision(len(decodes))[3]
        else:
            self._service_price()  # (the measured share reads no price)
            decision = self.planner.plan(survival, [self._slot_of[r.req_id] for r in decodes],
                                         temperature_positive=not all_greedy, is_mixed_step=plan.is_mixed)
        if decision.windows is None:  # the planner left the allocation to the device kernel
            from kernels.window_allocation import allocate_windows

            w = allocate_windows(survival=torch.tensor(survival), budget=decision.budget,
                                 min_verify_len=self.planner_config.min_verify_len, block=self.block_size)
            decision = dataclasses.replace(decision, windows=tuple(int(x) for x in w.tolist()))
        return decision

    def _commit_rows(self, rows, now: float) -> list[RequestOutput]:
        """Commit a step's rows, each (request, window, accepted drafts k, tokens): the k accepted drafts
        and the target's token after them are appended, cut after an EOS or a stop string and at
        max_tokens or the context; requests that end are finished. Returns their outputs. The caller
        counts the step's rows with _count_rows. This runs for every row of every step, so the common
        path makes no per-row calls."""
        finished: list[RequestOutput] = []
        eos, max_len, stops_apply = self._eos, self.cfg.max_model_len, self.tokenizer is not None
        for req, window, k, new in rows:
            req.accept_lengths.append(k + 1)
            req.verify_lens.append(window)
            p = req.params
            out = req.output_ids
            n_prompt, n_out = len(req.prompt_ids), len(out)
            req.num_computed = n_prompt + n_out + k  # anchor + accepted drafts are now in the cache
            room, m = p.max_tokens - n_out, len(new)  # m: tokens this row emits
            if max_len - n_prompt - n_out < room:
                room = max_len - n_prompt - n_out
            if room < m:
                new = new[:max(room, 0)]
                m = len(new)
            reason = None
            if eos and not p.ignore_eos and not eos.isdisjoint(new):
                for j, t in enumerate(new):
                    if t in eos:
                        new = new[: j + 1]
                        m = j + 1
                        reason = "stop"
                        break
            if reason is None and p.stop and stops_apply and m:
                # Token by token, as a one-token-per-step decode would stop: the accepted block is cut
                # after the token that completes a stop string, so every arm emits the same token ids.
                cut = self._stop_cut(out, new, p.stop)
                if cut is not None:
                    new = new[:cut]
                    m = len(new)
                    reason = "stop"
            if m:
                out.extend(new)
                n_out += m
                if req.first_token_time is None:
                    req.first_token_time = now
                req.chunk_times.append(now)
                req.chunk_sizes.append(m)
            if reason is None and (n_out >= p.max_tokens or n_prompt + n_out >= max_len):
                reason = "length"
            if reason is not None:
                self._finish(req, reason)
                finished.append(RequestOutput.from_request(req))
        return finished

    def _stop_cut(self, out: list[int], new: list[int], stops: tuple[str, ...]) -> int | None:
        """How many of ``new`` to keep so that the text ends at the first token that completes a stop
        string (None when the whole block completes none). One decode when no stop string appears."""
        decode = self.tokenizer.decode
        if not any(s in decode(out + new) for s in stops):
            return None
        for j in range(1, len(new) + 1):
            text = decode(out + new[:j])
            if any(s in text for s in stops):
                return j
        return len(new)

    def _finish(self, req: Request, reason: str, error: str | None = None) -> None:
        req.finish_reason = reason
        req.error = error
        req.finish_time = time.perf_counter()
        if self.tokenizer is not None and req.output_ids:
            text = self.tokenizer.decode(req.output_ids)
            for s in req.params.stop:
                cut = text.find(s)
                if cut >= 0:
                    text = text[:cut]
            req.text = text
        slot = self._slot_of.pop(req.req_id, None)
        if slot is not None:
            self._free_slots.append(slot)
        if req in self.scheduler.waiting:
            self.scheduler.waiting.remove(req)
        self.scheduler.finish(req)
        self._requests.pop(req.req_id, None)

    # ---- batch API ------------------------------------------------------------------------
    def generate(self, prompts: Sequence[PromptLike], sampling: SamplingParams | Sequence[SamplingParams] | None = None,
                 ids: Sequence[str] | None = None, progress: bool = False,
                 on_finish=None) -> list[RequestOutput]:
        """Run all prompts to completion; outputs in input order. An invalid prompt yields an
        output with `error` set and finish_reason 'error'; the others are served normally.
        ``on_finish(index, output)``, when given, is called as each request finishes (refused ones first),
        so a caller can keep what finished if the run is cut short."""
        n = len(prompts)
        params = list(sampling) if isinstance(sampling, (list, tuple)) else [sampling or SamplingParams()] * n
        if len(params) != n:
            raise ValueError(f"got {n} prompts but {len(params)} sampling settings")
        order: dict[int, int] = {}
        outputs: list[RequestOutput | None] = [None] * n
        for i, (p, sp) in enumerate(zip(prompts, params)):
            uid = ids[i] if ids is not None else None
            try:
                rid = self.add_request(p, sp, user_id=uid)
                order[rid] = i
            except (RequestError, ConfigError) as e:
                outputs[i] = RequestOutput(req_id=-1, user_id=uid, prompt_token_ids=[], token_ids=[], text="",
                                           finish_reason="error", error=str(e), num_steps=0, accept_lengths=[],
                                           verify_lens=[], pos_accepted=[], pos_reached=[],
                                           arrival_time=time.perf_counter(), first_token_time=None,
                                           finish_time=time.perf_counter(), chunk_times=[], chunk_sizes=[],
                                           num_preemptions=0)
        if on_finish is not None:
            for i, out in enumerate(outputs):
                if out is not None:
                    on_finish(i, out)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(order), desc="generate", unit="req")
        while self.has_unfinished():
            for out in self.step():
                outputs[order[out.req_id]] = out
                if on_finish is not None:
                    on_finish(order[out.req_id], out)
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return outputs  # type: ignore[return-value]

    @contextlib.contextmanager
    def running_limit(self, n: int):
        """At most ``n`` (1..engine.max_num_seqs) requests running together inside the block, the
        engine's own limit after it: the same engine under another batch composition (the A/B lossless
        guard's control run). Only between runs: the engine must be idle."""
        if not 1 <= int(n) <= self.cfg.max_num_seqs:
            raise ValueError(f"running_limit: {n} outside 1..engine.max_num_seqs={self.cfg.max_num_seqs}")
        if self.scheduler.has_work():
            raise RuntimeError("running_limit: the engine still has requests; change the limit between runs")
        self.scheduler.max_num_seqs = int(n)
        try:
            yield self
        finally:
            self.scheduler.max_num_seqs = self.cfg.max_num_seqs

    def reset(self) -> None:
        """Drop every request and clear the caches (used between A/B arms)."""
        self.scheduler.clear()
        if self._inflight is not None:
            self.graph.collect(self._inflight)
            self._inflight = None
        self._host_step_ms = []
        self._host_phase_ms = dict.fromkeys(HOST_PHASES, 0.0)
        self._host_phase_calls = 0
        self._step_call_end = None
        self._eager_step_ms = []
        self._last_commit = None
        if self.graph is not None:
            self.graph.wait_prefill()
            self.graph.clear()
            self._graph_table_lens = {}
            self._unjoined = []
            self._prefilled = []
            self._rows_stale = False
            self._captured_key = None
            self._captures_base = self.graph.captures
            if self.graph.timing is not None:
                self.graph.start_timing()  # a fresh record for the next run
        self.eager_reasons = Counter()
        self._requests.clear()
        self.runner.reset()
        self.num_steps = 0
        self._counts = self._zero_counts()
        self._megakernel_base = self._megakernel_raw()
        self._head_steps_base = self.steps.head_steps
        self._greedy_head_steps_base = self.steps.greedy_head_steps
        self._oracle_steps = []
        self._oracle_step_ms = []
        self.step_trace = None
        self.steps.trace_max_prob = False
        self.stats = EngineStats()
        if self.planner is not None:
            self.planner.stats = self.stats
            for slot in range(self.cfg.max_num_seqs):
                self.planner.reset_slot(slot)
        if self.plan_gate is not None:
            self.plan_gate.reset_counts()  # its estimates persist: a run's warm-up trains them for the timed blocks
        if self.online_calibration is not None:
            self.online_calibration.reset_counts()  # its offsets persist, like the gate's estimates
        for choice in (self.share_choice, self.draft_free):  # their rates and comparisons persist too
            if choice is not None:
                choice.reset_counts()
        self._plan_cost = None
        self._free_slots = list(range(self.cfg.max_num_seqs - 1, -1, -1))
        self._slot_of.clear()
