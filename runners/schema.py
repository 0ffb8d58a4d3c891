"""Typed schemas of the Hydra configs, registered in Hydra's ConfigStore.

Each YAML group validates against one of these dataclasses: an unknown key or a value of
the wrong type fails at composition, before any model loads. Value checks (ranges, allowed
names) run when the runner converts a schema into the engine's own dataclasses in
:mod:`dspark.config`, whose errors name the key and the allowed values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore

from dspark.config import ConfigError, DrafterConfig, EngineConfig, KernelSwitches, SamplingParams


@dataclass
class ModelSchema:
    name: str = "smollm2"
    source: str = "smollm2"  # "smollm2" (packaged GGUF) or a path to a local Hugging Face folder
    cache_dir: Optional[str] = None  # None: $DSPARK_CACHE or ~/.cache/dspark-bench


@dataclass
class DrafterSchema:
    name: str = "dspark_smollm2"
    path: Optional[str] = None  # checkpoint folder (config.json + safetensors); None = no drafter
    description: str = ""


@dataclass
class KernelsSchema:
    """engine.kernels: the Triton backend's kernel switches (dspark.config.KernelSwitches, which
    checks the values and names the key)."""
    fused_layers: bool = True
    small_m_kernels: bool = True
    fused_qkv_rope: bool = True
    small_m_tiles: Optional[str] = None  # a device's GEMV tile table (bench/small_m_sweep.py)
    fused_step_metadata: bool = True
    triton_argmax: bool = True
    # Experimental, off by default.
    l2_prefetch: bool = False
    l2_prefetch_programs: int = 16
    decode_megakernel: bool = False
    megakernel_programs: Optional[int] = None  # null: one program per SM


@dataclass
class EngineSchema:
    device: str = "cpu"
    dtype: str = "float32"
    kv_block_size: int = 16
    num_kv_blocks: Optional[int] = None
    kv_cache_tokens: Optional[int] = 65536
    kv_memory_fraction: float = 0.9
    max_model_len: int = 2048
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    spec: str = "dspark"
    verify: str = "full"
    seed: int = 0
    attention_backend: str = "torch"
    batch_invariant: bool = False  # fixed-tile GEMMs + unsplit attention (needs attention_backend=triton)
    # Confidence-scheduled verification (engine.verify != full); see dspark.config.EngineConfig.
    cost_table: Optional[str] = None  # null: looked up (or profiled) by the A/B runner; the engine alone declines
    allow_foreign_cost_table: bool = False
    planner_algorithm: str = "global"  # global | greedy_stop
    budget_lag: int = 1
    tiers: Optional[List[int]] = None  # set by the tiers group (verify=uniform)
    min_verify_len: int = 1
    min_predicted_gain: float = 0.03
    confidence_calibration: Optional[str] = None  # temperatures.json (or its folder) replacing the drafter's own
    skip_mixed_trim: bool = True
    force_verify_len: Optional[int] = None
    force_trimmed_path: bool = False
    force_budget_frac: Optional[float] = None
    token_buckets: Optional[List[int]] = None
    debug_checks: bool = False
    cuda_graphs: bool = False
    overlap: bool = False
    kernels: KernelsSchema = field(default_factory=KernelsSchema)


@dataclass
class SamplingSchema:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 128
    ignore_eos: bool = False
    stop: List[str] = field(default_factory=list)
    seed: Optional[int] = None


@dataclass
class PathsSchema:
    root: str = "."
    output_dir: str = "outputs"
    cost_tables: str = "cost_tables"


@dataclass
class GenerateSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    drafter: DrafterSchema = field(default_factory=DrafterSchema)
    engine: EngineSchema = field(default_factory=EngineSchema)
    sampling: SamplingSchema = field(default_factory=SamplingSchema)
    paths: PathsSchema = field(default_factory=PathsSchema)
    spec: str = "dspark"  # off | dspark (shortcut for engine.spec)
    prompts_file: Optional[str] = None
    output: str = "generations.jsonl"
    progress: bool = True


@dataclass
class ArmSchema:
    label: str = "arm"
    engine: Dict[str, Any] = field(default_factory=dict)  # overrides of the engine group for this arm


@dataclass
class ArmsSchema:
    A: ArmSchema = field(default_factory=lambda: ArmSchema(label="verify_all", engine={"spec": "dspark", "verify": "full"}))
    B: ArmSchema = field(default_factory=lambda: ArmSchema(label="ragged", engine={"spec": "dspark", "verify": "ragged"}))


@dataclass
class ABSettingsSchema:
    name: str = "dspark_full_vs_ragged"
    arms: ArmsSchema = field(default_factory=ArmsSchema)
    schedule: str = "ABBA"  # ABBA | ABAB | random
    n_blocks: int = 4
    warmup_requests: int = 2
    warmup_full_batch: bool = True  # the warm-up also runs a full batch: load.concurrency requests (capped at the workload)
    cooldown_s: float = 0.0
    seed: int = 0
    lossless_alpha: float = 0.001  # bf16: an arm leaving the fp32 reference's argmax more often than the control fails
    lossless_control: bool = True  # bf16: arm A again under another batch composition measures the rounding noise
    distribution_min_tokens: int = 2000  # sampled workloads: the KS test of an arm's tokens needs at least this many
    distribution_alpha: float = 0.001  # sampled workloads: an arm whose token PITs reject U(0,1) at p < this fails
    n_boot: int = 4000
    fail_on_guard: bool = True
    greedy_replica_max_tokens: Optional[int] = 256  # output cap of the greedy replicas (lossless check)
    force_rerun: bool = False  # run again even when the output folder holds a finished summary for this config
    capture_before_timing: bool = True  # capture every CUDA graph of both arms before the first timed block
    device_timing: bool = True  # CUDA events around device-resident steps: the report's device idle share
    max_prediction_error: float = 0.15  # flag a planner whose cost table mispredicts its steps' tokens or time by more
    max_first_block_slowdown: float = 0.05  # flag a first timed block this much slower than the arm's median block
    gc_mode: str = "freeze"  # the garbage collector over the timed blocks: freeze | disable | default


@dataclass
class LoadSchema:
    mode: str = "closed"  # closed: all requests queued, at most `concurrency` running | poisson
    concurrency: int = 8  # batch depth (engine.max_num_seqs)
    request_rate: float = 4.0  # requests per second (poisson)


@dataclass
class WandbSchema:
    mode: str = "offline"  # offline | online | disabled
    project: str = "dspark-bench"


@dataclass
class WorkloadSchema:
    name: str = "poetry"
    num_prompts: Optional[int] = 8
    seed: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    split: str = "eval"
    path: Optional[str] = None
    greedy_replica_count: int = 0


@dataclass
class ABSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    drafter: DrafterSchema = field(default_factory=DrafterSchema)
    engine: EngineSchema = field(default_factory=EngineSchema)
    paths: PathsSchema = field(default_factory=PathsSchema)
    ab: ABSettingsSchema = field(default_factory=ABSettingsSchema)
    load: LoadSchema = field(default_factory=LoadSchema)
    wandb: WandbSchema = field(default_factory=WandbSchema)
    workload: Optional[WorkloadSchema] = None
    experiment: str = "ab"
    spec: Optional[str] = None
    progress: bool = True


@dataclass
class BenchDecodeSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    drafter: DrafterSchema = field(default_factory=DrafterSchema)
    engine: EngineSchema = field(default_factory=EngineSchema)
    paths: PathsSchema = field(default_factory=PathsSchema)
    arms: Dict[str, Any] = field(default_factory=dict)  # arm name -> engine overrides
    batch_sizes: List[int] = field(default_factory=lambda: [1, 16, 64])
    new_tokens: int = 64
    warmup_steps: int = 3
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
    order: str = "arm_major"
    rounds: int = 1  # repeat the whole schedule; rows carry their round, and a median-over-rounds table is added
    # Python's garbage collector during each (arm, batch) run: default (as is), freeze (collect, then
    # gc.freeze(): the objects alive before the run are never scanned again, as servers do after start-up)
    # or disable (no automatic collection during the run). Every row records the collector's pauses.
    gc_mode: str = "default"
    # Speculative eager arms: write each run's per-step survival, windows and accepted counts
    # (dspark.step_trace) to step_trace_<arm>_b<batch>_r<round>.npz, for bench/planner_replay.py.
    step_trace: bool = False
    output_dir: str = "outputs/bench_decode"
    progress: bool = True


def to_engine_config(engine: Any, spec: str | None = None) -> EngineConfig:
    d = dict(engine)
    if spec is not None:
        d["spec"] = spec
    if d.get("kernels") is not None:  # a DictConfig / dict of the engine.kernels group
        d["kernels"] = KernelSwitches.from_dict({str(k): v for k, v in dict(d["kernels"]).items()})
    ecfg = EngineConfig(**d)
    check_pool_holds_a_request(ecfg)
    return ecfg


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


def to_drafter_config(d: Any) -> DrafterConfig:
    return DrafterConfig.from_dict(dict(d))


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="generate_schema", node=GenerateSchema)
    cs.store(name="ab_schema", node=ABSchema)
    cs.store(name="bench_decode_schema", node=BenchDecodeSchema)


register()
