"""Typed schemas of the Hydra configs, registered in Hydra's ConfigStore.

Each YAML group validates against one of these dataclasses: an unknown key, a value of the
wrong type or a string setting outside its :class:`Choice` fails at composition, before any
model loads, naming the key (and the allowed values). Range checks, and checks that span
several keys, run when the runner converts a schema into the engine's own dataclasses in
:mod:`dspark.config` (and in the runners' own config checks), whose errors name the key and
the allowed values.

A field's description is its comment: the comment lines directly above it and the comment at
the end of its line (``--help`` lists them, :mod:`runners.config_keys`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from dspark.config import ConfigError, DrafterConfig, EngineConfig, KernelSwitches, SamplingParams
from dspark.serving.config import ServerConfig


class Choice(str, Enum):
    """A string setting with a fixed set of values: OmegaConf refuses any other at composition, naming the
    key and the values allowed. A member compares equal to, prints as and serializes (JSON) as its value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class LoadMode(Choice):
    closed = "closed"
    poisson = "poisson"


class ScheduleKind(Choice):  # the values of dspark.bench.schedule.SCHEDULE_KINDS
    ABBA = "ABBA"
    ABAB = "ABAB"
    random = "random"


class GcMode(Choice):  # the values of dspark.bench.gc_pauses.GC_MODES
    default = "default"
    freeze = "freeze"
    disable = "disable"


class WandbMode(Choice):  # the values of dspark.bench.wandb_log.WANDB_MODES
    offline = "offline"
    online = "online"
    disabled = "disabled"


class HttpApi(Choice):  # the values of dspark.bench.http.endpoint.API_KINDS
    chat = "chat"
    completions = "completions"


class MetricsFlavour(Choice):  # the values of dspark.bench.http.endpoint.METRICS_FLAVOURS
    dspark = "dspark"
    vllm = "vllm"
    sglang = "sglang"
    trtllm = "trtllm"
    llamacpp = "llamacpp"


class RunOrder(Choice):
    arm_major = "arm_major"
    batch_major = "batch_major"
    alternating = "alternating"


@dataclass
class ModelSchema:
    """model: the target model."""
    name: str = "smollm2"  # the model's name in results and reports
    source: str = "smollm2"  # "smollm2" (packaged GGUF) or a path to a local Hugging Face folder
    cache_dir: Optional[str] = None  # null: $DSPARK_CACHE or ~/.cache/dspark-bench


@dataclass
class DrafterSchema:
    """drafter: the DSpark block drafter of speculative engines (engine.spec=dspark)."""
    name: str = "dspark_smollm2"  # the drafter's name in results and reports
    # builtin:NAME (shipped in dspark/assets), a checkpoint folder (config.json + safetensors), random (lossless
    # checks only) or null (no drafter)
    path: Optional[str] = None
    description: str = ""  # free text recorded with the results


@dataclass
class KernelsSchema:
    """engine.kernels: the Triton backend's kernel switches (dspark.config.KernelSwitches, which
    checks the values and names the key)."""
    fused_layers: bool = True  # fused layer kernels; false: plain PyTorch modules
    small_m_kernels: bool = True  # Triton GEMV kernels for steps of at most 16 tokens; false: cuBLAS
    fused_qkv_rope: bool = True  # the QKV GEMV with the rotary + K/V-write epilogue as one kernel
    small_m_tiles: Optional[str] = None  # a device's GEMV tile table (bench/small_m_sweep.py); null: the defaults
    fused_step_metadata: bool = True  # graph steps' row metadata, greedy acceptance and commit as Triton kernels
    triton_argmax: bool = True  # graph steps' greedy argmax as a Triton kernel (CUDA); false: torch.argmax
    fused_draft_logits: bool = True  # a draft slot's fp32 logits in one Triton pass (CUDA); false: PyTorch ops
    fused_draft_sampling: bool = True  # a sampled draft slot's softmax + draw as one Triton kernel (CUDA); false: PyTorch
    triton_top_probability: bool = True  # draft slots' top-token probability in one Triton pass (CUDA); false: PyTorch
    fused_confidence: bool = True  # a block's confidence head + calibration + survival in one kernel (CUDA)
    attention_splits: Optional[int] = None  # KV splits in paged attention (1 to 32); null: from the grid and max_model_len
    l2_prefetch: bool = False  # experimental: decode-sized steps read the next layer's weights into L2 (CUDA)
    l2_prefetch_programs: int = 16  # programs per weight matrix of that prefetch (1 to 64)
    decode_megakernel: bool = False  # experimental: one-token target steps run the whole stack as one kernel
    megakernel_programs: Optional[int] = None  # programs of that kernel; null: one per SM


@dataclass
class EngineSchema:
    """engine: the engine's settings (dspark.config.EngineConfig, which checks the values and names the key)."""
    device: str = "cpu"  # cpu, cuda or cuda:N
    dtype: str = "float32"  # float32 | bfloat16 | float16
    kv_block_size: int = 16  # tokens per KV page
    # KV pages; null: room for max_num_seqs x max_model_len, capped by kv_cache_tokens
    num_kv_blocks: Optional[int] = None
    kv_cache_tokens: Optional[int] = 65536  # cap of the KV pool in token slots; null: no cap
    kv_memory_fraction: float = 0.9  # a GPU pool takes at most this share of the device memory free when it is built
    max_model_len: int = 2048  # prompt plus output tokens of one request, at most
    max_num_seqs: int = 64  # running requests at most
    max_num_batched_tokens: int = 2048  # tokens per step: prefill chunks + verified blocks
    spec: str = "dspark"  # off (target only) | dspark (draft with the drafter)
    verify: str = "full"  # full (the whole drafted block) | uniform | ragged | cap_accept
    seed: int = 0  # seeds sampling
    attention_backend: str = "torch"  # torch | triton
    batch_invariant: bool = False  # a row's result independent of its step's other rows (fixed-tile GEMMs, ...)
    # The confidence-scheduled verification (engine.verify != full) prices its steps with these profiled step
    # costs; null: runners.ab looks the node's table up (or profiles it), elsewhere the planner never trims.
    cost_table: Optional[str] = None
    allow_foreign_cost_table: bool = False  # use a table profiled on another node, model or dtype anyway
    planner_algorithm: str = "global"  # global | greedy_stop
    budget_lag: int = 1  # steps (0, 1 or 2) between the confidence that sizes the budget and the step it sizes
    tiers: Optional[List[int]] = None  # uniform verification's ladder of verify lengths (the tiers group); null: any
    min_verify_len: int = 1  # the shortest verify window the planner chooses
    min_predicted_gain: float = 0.03  # the planner trims only where the cost table predicts at least this gain
    plan_min_rows: int = 32  # steps with fewer decoding requests verify the whole block without planning
    confidence_calibration: Optional[str] = None  # temperatures.json (or its folder; builtin:NAME/SUB shipped)
    greedy_confidence_calibration: Optional[str] = None  # the same, read instead on steps whose rows are all greedy
    skip_mixed_trim: bool = True  # decline to trim steps that also carry a prefill
    acceptance_estimate: str = "head"  # head: the confidence head; draft_max_prob: drafter top probability, calibrated online
    service_cost: bool = False  # price the planner's options at the service step's cost learnt online, not the table's alone
    plan_gate: bool = True  # device-resident steps plan only where the planner's trims saved more than it cost
    plan_gate_warmup: int = 8  # planned steps per batch bucket before the plan gate decides
    plan_gate_probe_every: int = 16  # while a bucket skips planning, every n-th step plans anyway (1: every step)
    plan_gate_probe_every_max: int = 64  # each probe that leaves a bucket skipping doubles its interval, up to this
    draft_free_steps: bool = False  # decode a step target-only when drafting measured slower at its batch size (spec engines)
    verify_share: Optional[float] = None  # instead of the planner: the whole block or this share, the faster measured
    online_calibration: bool = False  # correct the head's confidence in service from observed acceptance
    force_verify_len: Optional[int] = None  # profiling/debug: every step verifies this many tokens
    force_trimmed_path: bool = False  # profiling: run a forced verify length as a trimmed step
    force_budget_frac: Optional[float] = None  # profiling/debug (ragged): budget = frac x the drafted cells
    token_buckets: Optional[List[int]] = None  # pad each step's tokens up to the next bucket (the graph keys)
    debug_checks: bool = False  # assert that every description of a step's verify tokens agrees
    cuda_graphs: bool = False  # device-resident decode steps, captured as CUDA graphs on a GPU
    overlap: bool = False  # launch step t+1 before reading step t's tokens (needs cuda_graphs)
    prefill_stream: bool = True  # captured prefills on their own CUDA stream beside the decode step (cuda_graphs)
    kernels: KernelsSchema = field(default_factory=KernelsSchema)


@dataclass
class SamplingSchema:
    """sampling: every request's sampling settings (dspark.config.SamplingParams)."""
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0  # nucleus sampling; 1: off
    top_k: int = 0  # 0: off
    max_tokens: int = 128  # output tokens at most
    ignore_eos: bool = False  # run on past the end-of-sequence token
    stop: List[str] = field(default_factory=list)  # stop strings
    seed: Optional[int] = None  # a request's own sampling seed; null: the engine's


@dataclass
class PathsSchema:
    """paths: where things are read and written."""
    root: str = "."  # the working folder the command started in
    output_dir: str = "outputs"  # this run's output folder (Hydra's run or sweep-job folder)
    cost_tables: str = "cost_tables"  # the cache of profiled cost tables


@dataclass
class GenerateSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    drafter: DrafterSchema = field(default_factory=DrafterSchema)
    engine: EngineSchema = field(default_factory=EngineSchema)
    sampling: SamplingSchema = field(default_factory=SamplingSchema)
    paths: PathsSchema = field(default_factory=PathsSchema)
    spec: str = "dspark"  # off | dspark (shortcut for engine.spec)
    prompts_file: Optional[str] = None  # JSONL: {"prompt": text} or {"messages": [...]}, optional "id"
    output: str = "generations.jsonl"  # the generations, one JSON line each
    progress: bool = True  # a progress bar


@dataclass
class ServeSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    drafter: DrafterSchema = field(default_factory=DrafterSchema)
    engine: EngineSchema = field(default_factory=EngineSchema)
    paths: PathsSchema = field(default_factory=PathsSchema)
    spec: str = "dspark"  # off | dspark (shortcut for engine.spec)
    host: str = "127.0.0.1"  # the address to listen on
    port: int = 8000  # 0: any free port
    served_model_name: Optional[str] = None  # the name requests give as `model`; null: model.name
    log_level: str = "info"  # the server's log level
    graceful_shutdown_s: float = 30.0  # on SIGINT/SIGTERM, how long requests in flight may take to finish
    # true: the engine is built and run in a process of its own, which never shares a GIL with the HTTP side (the
    # serving stack's Python work does not slow the engine's steps); false: in a thread of the server's process
    engine_process: bool = True
    # requests' prompts rendered and tokenized in this many worker processes, off the event loop that streams every
    # response (dspark/serving/prompt_workers.py); 0: on the event loop
    prompt_workers: int = 0
    # HTTP front-end processes (API servers) on the one listening socket over the one engine process
    # (dspark/serving/api_servers.py; needs engine_process=true), each with its own event loop; 1: this process
    api_servers: int = 1
    # true: collect, then freeze what is alive (the engine or its process handle, the app, the tokenizer) before
    # serving, so that the collector's full passes never scan it again (a pass over it stalled the event loop that
    # streams every response); false: the collector as Python sets it
    gc_freeze: bool = True
    # engine.verify != full without engine.cost_table: look this node's cost table up under paths.cost_tables, profiling
    # it first (with the profile settings) when there is none, as runners.ab does for its arms; false: no table
    find_cost_table: bool = False
    # the cost-table profile's settings (find_cost_table); the same defaults as runners.ab's ab.profile
    profile: CostProfileSchema = field(default_factory=lambda: CostProfileSchema(monotone=MonotoneMode.envelope))


class MonotoneMode(Choice):  # the values of dspark.profiler.MONOTONE_MODES
    refuse = "refuse"
    envelope = "envelope"


@dataclass
class CostProfileSchema:
    """The cost-table profile's settings (dspark.profiler.ProfileSettings, which checks the values): the top
    level of runners.profile, and ab.profile in runners.ab (the profile it runs when a trimming arm has no
    engine.cost_table and no table for this setup and these settings is cached under paths.cost_tables)."""
    # Requests decoding together; null: powers of two up to engine.max_num_seqs (runners.ab: load.concurrency), and
    # on a GPU at least to 16 (fewer requests' steps cost the same at every M; dspark.profiler.MIN_LADDER_BATCH).
    batch_sizes: Optional[List[int]] = None
    verify_lens: Optional[List[int]] = None  # forced verify lengths; null: every length 0..block
    warmup_steps: int = 2  # decode-only steps dropped per (batch size, verify length)
    measure_steps: int = 6  # repeats: decode-only steps recorded per (batch size, verify length); the median is fitted
    # random prompt tokens per request (the context the steps run at); null (runners.ab only): the A/B's own
    # context, its prompts' median token count plus half their median output cap (see profile_context)
    prompt_len: Optional[int] = 32
    seed: int = 0  # seeds the random prompts
    flat_rel_tol: float = 0.02  # refuse a table whose theta varies by less than this fraction of the cheapest step
    max_drop_rel: float = 0.25  # monotone=refuse: refuse a cost at some M this fraction above a larger M's
    # a theta(M) above a larger M's: refuse the table (beyond max_drop_rel), or envelope: replace it by the
    # cheapest cost at any M' >= M (a step can be padded up to M'; counted in the profile)
    monotone: MonotoneMode = MonotoneMode.refuse
    min_r2: float = 0.95  # refuse a fit whose R^2 over the medians is below this
    max_rel_residual: float = 0.35  # refuse a fit with a median further than this fraction from its fitted cost
    time_budget_s: Optional[float] = None  # stop a sweep that runs or is projected to run longer; null: no limit
    # a fit below min_r2 / max_rel_residual (or a cell far above linear growth) is given this many more rounds, each
    # measuring every cell again and pooling the repeats; then it is refused
    remeasure_rounds: int = 2


@dataclass
class HttpArmSchema:
    """ab.arms.<arm>.http: the arm is an OpenAI-compatible server reached over HTTP instead of an engine in this
    process (dspark.bench.http.endpoint.HttpEndpoint, which checks the values and names the key)."""
    base_url: str = MISSING  # the OpenAI API base the requests go to, e.g. http://127.0.0.1:8021/v1
    model: Optional[str] = None  # the `model` requests name; null: the one model the server's /v1/models lists
    # chat: /v1/chat/completions, for chat-message workloads (every built-in one); completions: /v1/completions,
    # for text prompts (a custom JSONL of "prompt")
    api: HttpApi = HttpApi.chat
    # The argv that starts the server (e.g. [python, -m, runners.serve, port=8021]): runners.ab starts it before each
    # of the arm's blocks, waits for health_url, warms it up and stops it after the block; null: a server already running.
    launch: Optional[List[str]] = None
    cwd: Optional[str] = None  # the launch command's working folder; null: the folder runners.ab runs in
    env: Dict[str, str] = field(default_factory=dict)  # variables added to the launch command's environment
    # keep a launched server up from the arm's first block to the end of the run (both arms' servers then share the node)
    keep_running: bool = False
    health_url: Optional[str] = None  # must answer 200 before the arm runs; null: base_url without /v1, + /health
    health_timeout_s: float = 600.0  # a launched server must answer health_url within this many seconds
    stop_timeout_s: float = 30.0  # stopping: SIGINT, then SIGTERM after this many seconds, then SIGKILL after as long
    # the Prometheus endpoint scraped before and after every block (acceptance and engine counters by delta); null: none
    metrics_url: Optional[str] = None
    metrics: MetricsFlavour = MetricsFlavour.dspark  # whose counter names metrics_url exports (docs/DESIGN.md, HTTP arms)
    request_timeout_s: float = 600.0  # a request whose response has not ended by then is an error
    # ask for the output's token ids (return_token_ids, as vLLM and runners.serve name it); false for servers that
    # refuse the parameter: the lossless guard then compares text
    return_token_ids: bool = True
    extra_body: Dict[str, Any] = field(default_factory=dict)  # added to every request's JSON body


@dataclass
class ArmSchema:
    label: str = "arm"  # the arm's name in results, reports and W&B
    engine: Dict[str, Any] = field(default_factory=dict)  # overrides of the engine group for this arm (in-process arms)
    http: Optional[HttpArmSchema] = None  # null: the arm runs an engine in this process; set: a server over HTTP


@dataclass
class ArmsSchema:
    # the control arm (conf/ab/ sets each arm's engine or http)
    A: ArmSchema = field(default_factory=lambda: ArmSchema(label="verify_all"))
    # the treatment arm
    B: ArmSchema = field(default_factory=lambda: ArmSchema(label="ragged"))


@dataclass
class ABSettingsSchema:
    """ab: the experiment (the ab group: conf/ab/)."""
    name: str = "dspark_full_vs_ragged"  # the experiment's name (experiment, W&B group)
    arms: ArmsSchema = field(default_factory=ArmsSchema)
    schedule: ScheduleKind = ScheduleKind.ABBA  # the order of the arms in each block (dspark.bench.schedule)
    n_blocks: int = 4  # timed blocks, each running both arms once over the workload (>= 1; a verdict needs >= 6)
    warmup_requests: int = 2  # untimed requests per arm before the first block (outputs capped at 64 tokens)
    warmup_full_batch: bool = True  # the warm-up also runs a full batch: load.concurrency requests (capped at the workload)
    cooldown_s: float = 0.0  # pause after every arm-block, seconds
    seed: int = 0  # seeds the schedule (random), the Poisson arrivals and the bootstrap
    lossless_alpha: float = 0.001  # bf16: an arm leaving the fp32 reference's argmax more often than the control fails
    lossless_control: bool = True  # bf16: arm A again under another batch composition measures the rounding noise
    distribution_min_tokens: int = 2000  # sampled workloads: the KS test of an arm's tokens needs at least this many
    distribution_alpha: float = 0.001  # sampled workloads: an arm whose token PITs reject U(0,1) at p < this fails
    n_boot: int = 4000  # bootstrap resamples of the confidence intervals (>= 100)
    # a failed guard fails the job (exit 1; in a multirun at the sweep's end), after every result is written
    fail_on_guard: bool = True
    greedy_replica_max_tokens: Optional[int] = 256  # output cap of the greedy replicas (lossless check)
    force_rerun: bool = False  # run again even when the output folder holds a finished summary for this config
    capture_before_timing: bool = True  # capture every CUDA graph of both arms before the first timed block
    device_timing: bool = True  # CUDA events around device-resident steps: the report's device idle share
    max_prediction_error: float = 0.15  # flag a planner whose cost table mispredicts its steps' tokens or time by more
    max_first_block_slowdown: float = 0.05  # flag a first timed block this much slower than the arm's median block
    gc_mode: GcMode = GcMode.freeze  # the garbage collector over the timed blocks (dspark.bench.gc_pauses)
    # The cost-table profile of a trimming arm without engine.cost_table. CPU cost curves have real
    # shape-dependent bumps, so here the table takes the cheaper padded cost there (monotone=envelope).
    profile: CostProfileSchema = field(default_factory=lambda: CostProfileSchema(monotone=MonotoneMode.envelope))


@dataclass
class LoadSchema:
    # closed: all requests queued, at most `concurrency` running; poisson: arrivals at request_rate
    mode: LoadMode = LoadMode.closed
    concurrency: int = 8  # batch depth (engine.max_num_seqs)
    request_rate: float = 4.0  # requests per second (poisson)
    # The service level a request must meet to count towards goodput (null: no goodput): its time to first token
    # in milliseconds. With either limit set, every block reports goodput (requests/s and output tokens/s of the
    # requests within the limits) and the share that met them.
    sla_ttft_ms: Optional[float] = None
    sla_tpot_ms: Optional[float] = None  # goodput's limit on a request's time per output token after the first, ms


@dataclass
class WandbSchema:
    """wandb: how runners.ab logs to W&B; the keyword arguments of dspark.bench.wandb_log.WandbLogger."""
    # offline | online | disabled. conf/wandb sets ${oc.env:WANDB_MODE,offline}: wandb.mode given on the
    # command line wins, else the WANDB_MODE environment variable, else offline.
    mode: WandbMode = WandbMode.offline
    project: str = "dspark-bench"  # the W&B project of the runs
    entity: Optional[str] = None  # W&B user or team; null: the default entity of the API key
    tags: List[str] = field(default_factory=list)  # besides the experiment's name and, in a multirun, sweep:<folder>
    notes: Optional[str] = None  # the runs' description in the W&B UI
    report: bool = False  # a W&B report of the job: made at the end of online runs; offline, the command for later


@dataclass
class WorkloadSchema:
    """workload: the requests (the workload group, +workload=NAME: conf/workload/)."""
    name: str = "poetry"  # agentic | poetry | arena_hard | mixed_chat | custom
    num_prompts: Optional[int] = 8  # prompts per block; null: every prompt of the split
    seed: int = 0  # seeds which prompts are chosen
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0  # nucleus sampling; 1: off
    top_k: int = 0  # 0: off
    max_tokens: int = 256  # output tokens per request at most
    split: str = "eval"  # eval | train | all
    path: Optional[str] = None  # custom: the JSONL of {"prompt": ...} or {"messages": [...]}
    greedy_replica_count: int = 0  # sampled workloads: greedy copies of the first prompts, for the lossless check
    repeat: int = 1  # each drawn prompt is sent this many times per block (ids #r1, #r2, ...): more requests than the split holds


@dataclass
class ABSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    drafter: DrafterSchema = field(default_factory=DrafterSchema)
    engine: EngineSchema = field(default_factory=EngineSchema)
    paths: PathsSchema = field(default_factory=PathsSchema)
    ab: ABSettingsSchema = field(default_factory=ABSettingsSchema)
    load: LoadSchema = field(default_factory=LoadSchema)
    wandb: WandbSchema = field(default_factory=WandbSchema)
    workload: Optional[WorkloadSchema] = None  # none until chosen: +workload=NAME
    experiment: str = "ab"  # the experiment's name in results and W&B (default: ab.name)
    spec: Optional[str] = None  # unused here: each arm sets its own engine.spec (ab.arms.A.engine.spec)
    progress: bool = True  # progress bars (blocks, requests in a block, the profile) and the verdict table


@dataclass
class BenchDecodeSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    drafter: DrafterSchema = field(default_factory=DrafterSchema)
    engine: EngineSchema = field(default_factory=EngineSchema)
    paths: PathsSchema = field(default_factory=PathsSchema)
    arms: Dict[str, Any] = field(default_factory=dict)  # arm name -> engine overrides
    batch_sizes: List[int] = field(default_factory=lambda: [1, 16, 64])  # requests decoding together, one run each
    new_tokens: int = 64  # output tokens per request (ignore_eos)
    warmup_steps: int = 3  # steady decode steps discarded per run
    min_requests: int = 8  # small batches run consecutive sets of distinct prompts up to this many requests
    # The prompts: the A/B's workload config group (`+workload=NAME`, conf/workload/); null = the default,
    # poetry prompts of workload_split, seed 0, as many as the largest batch needs (runners.bench_decode.bench_prompts).
    workload: Optional[WorkloadSchema] = None
    # eval (benchmarks) | train (e.g. step traces to calibrate on) | all; null = the group's split (eval without one).
    workload_split: Optional[str] = None
    # A group selecting fewer prompts than the largest run needs is refused; true cycles through them instead.
    repeat_prompts: bool = False
    graph_timing: bool = False  # CUDA events around every graph replay: device ms per graph and per step
    # Run order of the (arm, batch) jobs, against machine drift and in-process state (runners.bench_decode.run_order):
    # arm_major (every batch of an arm, then the next arm), batch_major (every arm at a batch, then the next
    # batch) or alternating (batch-major with the arm order reversed at every other batch and round).
    order: RunOrder = RunOrder.arm_major
    rounds: int = 1  # repeat the whole schedule; rows carry their round, and a median-over-rounds table is added
    # Python's garbage collector during each (arm, batch) run: default (as is), freeze (collect, then
    # gc.freeze(): the objects alive before the run are never scanned again, as servers do after start-up)
    # or disable (no automatic collection during the run). Every row records the collector's pauses.
    gc_mode: GcMode = GcMode.default
    # Speculative eager arms: write each run's per-step survival, windows and accepted counts
    # (dspark.step_trace) to step_trace_<arm>_b<batch>_r<round>.npz, for bench/planner_replay.py.
    step_trace: bool = False
    output_dir: str = "outputs/bench_decode"  # where bench_decode.{json,md,png} are written
    progress: bool = True  # a progress bar over the runs


def to_engine_config(engine: Any, spec: str | None = None, local: bool = True) -> EngineConfig:
    """The EngineConfig of an engine group (``spec`` overriding its spec). ``local``: an engine this process
    will build, whose device must exist here (False for an engine another process reports, e.g. a served arm's)."""
    d = dict(engine)
    if spec is not None:
        d["spec"] = spec
    if local:
        check_device_present(str(d.get("device", "cpu")))
    if d.get("kernels") is not None:  # a DictConfig / dict of the engine.kernels group
        d["kernels"] = KernelSwitches.from_dict({str(k): v for k, v in dict(d["kernels"]).items()})
    from runners.common import ENGINE_CALIBRATION_KEYS, resolve_calibration_path

    for key in ENGINE_CALIBRATION_KEYS:
        if d.get(key) is not None:  # builtin:NAME/SUB: a calibration the package ships
            d[key] = resolve_calibration_path(str(d[key]), f"engine.{key}")
    ecfg = EngineConfig(**d)
    check_pool_holds_a_request(ecfg)
    return ecfg


def check_device_present(device: str, key: str = "engine.device") -> None:
    """Refuse a device that is not cpu, cuda or cuda:N, and a CUDA device where torch sees none, before any other
    check reads the settings; ``key`` names the setting."""
    import re

    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ConfigError(f"{key}={device}: one of cpu, cuda or cuda:N")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"{key}={device}: torch sees no CUDA device here (torch {torch.__version__}, "
                              "torch.cuda.is_available() is False); run engine=cpu, or on a machine with a GPU")


def check_pool_holds_a_request(ecfg: EngineConfig) -> None:
    """Refuse a KV pool that cannot hold one request of engine.max_model_len tokens: every request that
    long would be refused at admission. (The engine itself accepts smaller pools, e.g. the profiler's
    throw-away ones; this check is for configs a user runs.)"""
    if ecfg.num_kv_blocks is not None:
        tokens, how = ecfg.num_kv_blocks * ecfg.kv_block_size, (
            f"engine.num_kv_blocks={ecfg.num_kv_blocks} x engine.kv_block_size={ecfg.kv_block_size}")
    elif ecfg.kv_cache_tokens is not None:
        tokens, how = ecfg.kv_cache_tokens, f"engine.kv_cache_tokens={ecfg.kv_cache_tokens}"
    else:
        return
    if tokens < ecfg.max_model_len:
        raise ConfigError(f"the KV pool holds {tokens} token slots ({how}), fewer than one request of "
                          f"engine.max_model_len={ecfg.max_model_len} tokens: raise it (or set "
                          "engine.num_kv_blocks / engine.kv_cache_tokens to null to size it from max_num_seqs x "
                          "max_model_len), or lower engine.max_model_len")


def to_sampling(sampling: Any) -> SamplingParams:
    d = dict(sampling)
    d["stop"] = tuple(d.get("stop") or ())
    return SamplingParams(**d)


def to_server_config(cfg: Any) -> ServerConfig:
    """The serve config's server settings (ServerConfig checks them; served_model_name null: model.name)."""
    if cfg.served_model_name is not None and not str(cfg.served_model_name).strip():
        raise ConfigError("served_model_name: empty; give the name clients send as `model`, or null for "
                          f"model.name ({cfg.model.name!r})")
    return ServerConfig(host=cfg.host, port=cfg.port, served_model_name=cfg.served_model_name or cfg.model.name,
                        log_level=cfg.log_level, graceful_shutdown_s=cfg.graceful_shutdown_s,
                        engine_process=cfg.engine_process, prompt_workers=cfg.prompt_workers,
                        api_servers=cfg.api_servers)


def to_drafter_config(d: Any) -> DrafterConfig:
    return DrafterConfig.from_dict(dict(d))


def to_profile_settings(node: Any, *, context: int | None = None):
    """dspark.profiler.ProfileSettings from a config node holding CostProfileSchema's keys (other keys
    of the node, such as runners.profile's model or out, are ignored). A bad value raises ConfigError
    starting with its key. ``context``: the prompt length a null ``prompt_len`` stands for (runners.ab's
    :func:`profile_context`); without it a null ``prompt_len`` is refused."""
    from dataclasses import fields

    from dspark.profiler import ProfileError, ProfileSettings

    values = {f.name: node[f.name] for f in fields(CostProfileSchema)}
    if values["prompt_len"] is None:
        if context is None:
            raise ConfigError("prompt_len: null takes the context from an A/B's workload (runners.ab); give the "
                              "context the profiled steps run at as an integer >= 2")
        values["prompt_len"] = int(context)
    for key in ("batch_sizes", "verify_lens"):
        if values[key] is not None:  # a ListConfig: plain integers
            values[key] = [int(x) for x in values[key]]
    values["monotone"] = str(values["monotone"])  # a MonotoneMode: its value
    try:
        return ProfileSettings(**values)
    except ProfileError as e:
        raise ConfigError(str(e)) from None


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="generate_schema", node=GenerateSchema)
    cs.store(name="ab_schema", node=ABSchema)
    cs.store(name="bench_decode_schema", node=BenchDecodeSchema)
    cs.store(name="serve_schema", node=ServeSchema)


register()


def profile_context(prompt_tokens: list[int], output_caps: list[int]) -> int:
    """The context a decode step of an A/B runs at on average, for ab.profile.prompt_len=null: the median
    prompt token count plus half the median output cap (a request decodes from its prompt's end to its cap;
    an early end only shortens it). At least 2 (a prefill plus an anchor token)."""
    import statistics

    if not prompt_tokens or len(prompt_tokens) != len(output_caps):
        raise ValueError(f"profile_context needs one output cap per prompt, got {len(prompt_tokens)} prompts and "
                         f"{len(output_caps)} caps")
    return max(2, int(statistics.median(prompt_tokens) + statistics.median(output_caps) // 2))
