"""Typed configuration objects of the engine.

The engine never imports Hydra: runners turn composed YAML into these dataclasses,
whose ``__post_init__`` checks every value and names the key that is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from dspark.plan_gate import check_plan_gate_settings


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and the fix."""


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


def _as_dict(obj: Any) -> dict[str, Any]:
    """A config dataclass as JSON-able data (tuples become lists)."""
    return {f.name: list(v) if isinstance(v, tuple) else v for f in fields(obj) for v in [getattr(obj, f.name)]}


def _from_dict(cls: type, d: dict[str, Any], what: str) -> Any:
    """Build ``cls`` from data, refusing keys it does not have (the dataclass converts lists back)."""
    known = {f.name for f in fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise ConfigError(f"{what}: unknown keys {sorted(unknown)}; allowed: {sorted(known)}")
    return cls(**d)


@dataclass(slots=True)
class ModelConfig:
    """Architecture of a Llama-family decoder (Llama, Qwen2, Qwen3)."""

    arch: str  # "llama" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    attention_bias: bool = False  # qwen2: bias on q/k/v projections
    qk_norm: bool = False  # qwen3: RMSNorm on q and k per head
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    ARCHS = ("llama", "qwen2", "qwen3")

    def __post_init__(self) -> None:
        _check(self.arch in self.ARCHS, "model.arch", f"unsupported architecture {self.arch!r}; supported: {list(self.ARCHS)}")
        for k in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            _check(int(getattr(self, k)) > 0, f"model.{k}", f"must be > 0, got {getattr(self, k)}")
        _check(self.num_heads % self.num_kv_heads == 0, "model.num_kv_heads",
               f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        _check(self.head_dim % 2 == 0, "model.head_dim", "must be even for rotary embeddings")
        self.eos_token_ids = tuple(int(t) for t in self.eos_token_ids)

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        return _from_dict(cls, d, "model config")


@dataclass(slots=True)
class DrafterConfig:
    """Architecture of a DSpark block drafter attached to a target model."""

    block_size: int = 7  # gamma: drafted tokens per step (anchor slot predicts the first)
    num_layers: int = 2
    target_layer_ids: tuple[int, ...] = (1, 15, 28)  # 0-based target decoder layers whose outputs feed the drafter
    markov_rank: int = 64  # 0 disables the Markov head (DFlash-style drafting)
    markov_variant: str = "vanilla"  # vanilla | gated | rnn
    use_confidence_head: bool = True
    # Architecture of the draft layers; None means "same as the target".
    intermediate_size: int | None = None
    mask_token_id: int | None = None  # None: a learned mask embedding is used

    VARIANTS = ("vanilla", "gated", "rnn")

    def __post_init__(self) -> None:
        _check(1 <= self.block_size <= 32, "drafter.block_size", f"must be in [1, 32], got {self.block_size}")
        _check(self.num_layers >= 1, "drafter.num_layers", f"must be >= 1, got {self.num_layers}")
        self.target_layer_ids = tuple(int(i) for i in self.target_layer_ids)
        _check(len(self.target_layer_ids) >= 1, "drafter.target_layer_ids", "needs at least one target layer")
        _check(self.markov_rank >= 0, "drafter.markov_rank", f"must be >= 0, got {self.markov_rank}")
        _check(self.markov_variant in self.VARIANTS, "drafter.markov_variant",
               f"unknown variant {self.markov_variant!r}; allowed: {list(self.VARIANTS)}")

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DrafterConfig":
        return _from_dict(cls, d, "drafter config")


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling settings. temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    max_tokens: int = 128
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        _check(self.temperature >= 0.0, "sampling.temperature", f"must be >= 0, got {self.temperature}")
        _check(0.0 < self.top_p <= 1.0, "sampling.top_p", f"must be in (0, 1], got {self.top_p}")
        _check(self.top_k >= 0, "sampling.top_k", f"must be >= 0 (0 disables), got {self.top_k}")
        _check(self.max_tokens >= 1, "sampling.max_tokens", f"must be >= 1, got {self.max_tokens}")
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)
        _check(all(isinstance(s, str) and s for s in self.stop), "sampling.stop", "stop strings must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class KernelSwitches:
    """The ``engine.kernels`` group: which Triton kernels an engine on the Triton attention backend
    runs. Each switch's default is what the engine runs; turning one off measures what it buys, and
    the experimental group at the end is off by default. On the torch backend none of them applies."""

    fused_layers: bool = True  # fused norms/projections, rotary + K/V write, SiLU*mul (kernels/rmsnorm.py ...)
    small_m_kernels: bool = True  # Triton GEMV kernels for steps of at most 16 tokens (else cuBLAS)
    fused_qkv_rope: bool = True  # the GEMV's QKV projection with the rotary + K/V-write epilogue
    small_m_tiles: str | None = None  # a device's GEMV tile table (bench/small_m_sweep.py); None: defaults
    fused_step_metadata: bool = True  # graph steps' row metadata, greedy acceptance and commit as Triton kernels
    triton_argmax: bool = True  # graph steps' greedy argmax through kernels/argmax.py (CUDA)
    fused_draft_logits: bool = True  # a draft slot's logits (backbone + Markov bias) in one pass (kernels/draft_logits.py)
    fused_draft_sampling: bool = True  # a sampled draft slot's softmax + inverse-CDF draw in one kernel (CUDA)
    triton_top_probability: bool = True  # draft slots' top-token probability in one pass (kernels/top_probability.py)
    fused_confidence: bool = True  # a drafted block's confidence head, calibration and survival in one kernel (CUDA)
    # KV chunks per (request, kv head, query tile) in paged attention; None: from the grid size alone
    # (kernels.paged_attention.default_num_splits). More splits spread a long request's keys over more SMs.
    attention_splits: int | None = None
    # Experimental, off by default.
    l2_prefetch: bool = False  # decode-sized steps read the next layer's weights into L2 (CUDA)
    l2_prefetch_programs: int = 16  # programs per weight matrix of that prefetch
    decode_megakernel: bool = False  # one-token target steps run the whole stack as one kernel
    megakernel_programs: int | None = None  # programs of that kernel (None: one per SM)

    PREFIX = "engine.kernels"

    def __post_init__(self) -> None:
        p = self.PREFIX
        for name in ("fused_layers", "small_m_kernels", "fused_qkv_rope", "fused_step_metadata", "triton_argmax",
                     "fused_draft_logits", "fused_draft_sampling", "triton_top_probability", "fused_confidence",
                     "l2_prefetch", "decode_megakernel"):
            value = getattr(self, name)
            _check(isinstance(value, bool), f"{p}.{name}", f"must be true or false, got {value!r}")
        tiles = self.small_m_tiles
        _check(tiles is None or (isinstance(tiles, str) and tiles.strip() != ""), f"{p}.small_m_tiles",
               f"must be the path of a tile table (bench/small_m_sweep.py writes one) or null, got {tiles!r}")
        n = self.l2_prefetch_programs
        _check(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 64, f"{p}.l2_prefetch_programs",
               f"must be an integer from 1 to 64, got {n!r}")
        n = self.attention_splits
        _check(n is None or (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 32), f"{p}.attention_splits",
               f"must be null (from the grid size) or an integer from 1 to 32 (the kernel's most), got {n!r}")
        n = self.megakernel_programs
        _check(n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 1), f"{p}.megakernel_programs",
               f"must be null (one program per SM) or an integer >= 1 (at most the device's SMs), got {n!r}")

    def switches(self) -> dict[str, Any]:
        """The ``engine.kernels`` values (without the backend and batch-invariance of a KernelConfig)."""
        return {f.name: getattr(self, f.name) for f in fields(KernelSwitches)}

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "KernelSwitches":
        return _from_dict(KernelSwitches, dict(d), "engine.kernels")


@dataclass(frozen=True, slots=True)
class KernelConfig(KernelSwitches):
    """Everything an engine's kernels depend on: the attention backend, the batch-invariant mode and
    the ``engine.kernels`` switches. One engine's settings, frozen; the model code reads them from
    the step's :class:`dspark.attention.AttentionMetadata` (``meta.kernels``), never from globals or
    the environment, so engines with different settings can share a process (an A/B's two arms).
    ``EngineConfig.kernel_config()`` builds it; ``KernelConfig()`` is the torch backend with defaults."""

    attention_backend: str = "torch"  # engine.attention_backend: torch | triton
    batch_invariant: bool = False  # engine.batch_invariant

    BACKENDS = ("torch", "triton")

    def __post_init__(self) -> None:
        KernelSwitches.__post_init__(self)
        _check(self.attention_backend in self.BACKENDS, "engine.attention_backend",
               f"{self.attention_backend!r} not in {list(self.BACKENDS)}")
        _check(isinstance(self.batch_invariant, bool), "engine.batch_invariant",
               f"must be true or false, got {self.batch_invariant!r}")
        triton = self.attention_backend == "triton"
        for name, what in (("l2_prefetch", "reads weights for the fused small-M (GEMV) layer kernels"),
                           ("decode_megakernel", "replaces the fused layer kernels of one-token steps")):
            if getattr(self, name):
                _check(triton and self.fused_layers, f"{self.PREFIX}.{name}",
                       f"{what}: it needs engine.attention_backend=triton and engine.kernels.fused_layers=true; "
                       f"set engine.kernels.{name}=false")
                _check(not self.batch_invariant, f"{self.PREFIX}.{name}",
                       f"never runs in the batch-invariant mode (engine.batch_invariant=true); set "
                       f"engine.kernels.{name}=false")
        _check(not self.l2_prefetch or self.small_m_kernels, f"{self.PREFIX}.l2_prefetch",
               "prefetches for the small-M GEMV kernels, which engine.kernels.small_m_kernels=false turns off; "
               "set engine.kernels.l2_prefetch=false")

    @property
    def triton(self) -> bool:
        """Whether this engine runs the Triton attention backend (and with it the switches above)."""
        return self.attention_backend == "triton"

    def to_dict(self) -> dict[str, Any]:
        return {"attention_backend": self.attention_backend, "batch_invariant": self.batch_invariant,
                **self.switches()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "KernelConfig":
        return _from_dict(KernelConfig, dict(d), "kernel config")


DEFAULT_KERNELS = KernelConfig()  # the torch backend, every switch at its default


@dataclass(slots=True)
class EngineConfig:
    """Engine-wide settings: memory, batching, speculation, verification scheduling."""

    device: str = "cpu"
    dtype: str = "float32"  # float32 | bfloat16 | float16
    kv_block_size: int = 16  # tokens per KV page
    # The KV pool, when num_kv_blocks is None: room for max_num_seqs requests of max_model_len tokens,
    # capped by kv_cache_tokens (None: no cap) and, on a GPU, by kv_memory_fraction of the device memory
    # free when the engine is built.
    num_kv_blocks: int | None = None
    kv_cache_tokens: int | None = 65536
    kv_memory_fraction: float = 0.9
    max_model_len: int = 2048
    max_num_seqs: int = 64  # running requests at most
    max_num_batched_tokens: int = 2048  # token budget per step (prefill chunks + verify tokens)
    spec: str = "dspark"  # off | dspark
    verify: str = "full"  # full | uniform | ragged | cap_accept
    seed: int = 0
    attention_backend: str = "torch"  # torch | triton
    # Every GEMM through the fixed-tile Triton kernel and attention unsplit, so that a row's logits do
    # not depend on the step's row count: bf16 greedy outputs then agree across arms and batch sizes.
    batch_invariant: bool = False
    # Confidence-scheduled verification (verify != full).
    cost_table: str | None = None  # path of a profiled cost-table JSON; None: the planner declines every step
    allow_foreign_cost_table: bool = False  # use a table profiled on another node/model/dtype anyway
    planner_algorithm: str = "global"  # global | greedy_stop (the paper's Algorithm 1)
    budget_lag: int = 1  # 0, 1 or 2 steps between the confidence that sizes the budget and this step
    tiers: tuple[int, ...] | None = None  # uniform mode's tier ladder (verify lengths); None: any 1..block
    min_verify_len: int = 1
    # 0.03: on the H200 (the `traces` results folder) predicted gains are optimistic by about 3
    # points (closed loop); at batch 4 a predicted +2.6% trim realised -2%, and 0.03 costs nothing at 128/256.
    min_predicted_gain: float = 0.03
    # Steps with fewer decoding requests than this verify the whole block without planning (plan reason
    # declined_small_batch). Below a few dozen rows a step's time is set by weights, launches and KV reads, not by
    # the verified tokens: a trim there saves a few microseconds while the rows it cuts are often the ones the
    # step's period waits for (a closed-loop block's tail), and the planner's host time is charged to every such step.
    plan_min_rows: int = 32
    # A confidence calibration (temperatures.json, or the folder holding it) that replaces the drafter's
    # own for this engine, e.g. one fitted on the workload's step traces (runners.calibrate traces=...).
    confidence_calibration: str | None = None
    # A calibration read instead on the steps whose rows all decode greedily (the rest keep the one above, or the
    # drafter's own), e.g. builtin:dspark-smollm2/sts_top_gap, which ranks greedy acceptance better and costs the
    # sampled traffic it trims more; chosen per step, so a step that mixes greedy and sampled rows reads the other.
    greedy_confidence_calibration: str | None = None
    skip_mixed_trim: bool = True  # decline to trim on steps that also carry a prefill
    # What the planner reads as each drafted slot's acceptance: the drafter's confidence head ("head"), or the
    # drafter's top-token probability calibrated online against observed acceptance ("draft_max_prob",
    # dspark/acceptance_estimate.py; works for a drafter without a head).
    acceptance_estimate: str = "head"
    # Price the planner's options at what a service step costs, learnt online from the committed steps
    # (dspark/service_cost.py: the host's work per step as a floor, and how a device-bound step's time follows the
    # table's price, as a slope and an offset), instead of the cost table's steady-decode price alone.
    service_cost: bool = False
    # Run the planner on a device-resident step only where it is expected to pay (dspark/plan_gate.py): per batch
    # bucket, the milliseconds its trims saved against the host milliseconds it cost where the host set the step's
    # period; a skipped step verifies the whole block (plan reason skipped_plan_not_paying). plan_gate_warmup:
    # planned steps per bucket before the rule decides; plan_gate_probe_every: while a bucket skips, it plans
    # anyway after this many skipped steps in a row, so the estimates follow the workload; each probe that leaves
    # the rule at skip doubles the interval up to plan_gate_probe_every_max (equal values: a fixed interval).
    plan_gate: bool = True
    plan_gate_warmup: int = 8
    plan_gate_probe_every: int = 16
    plan_gate_probe_every_max: int = 64
    # Let a speculative engine decode a step target-only (no drafting) when its measured rate at that batch
    # size says drafting does not pay (dspark/draft_free.py); counted as draft_free_steps.
    draft_free_steps: bool = False
    # Instead of the planner: from plan_min_rows rows up, each step verifies the whole drafted block or this share of
    # its cells (the cells of highest fresh survival, picked on the device), whichever measured the higher output
    # rate at its batch bucket (dspark/verify_share.py). Needs verify=ragged; None: the planner.
    verify_share: float | None = None
    # Correct the confidence head's calibration in service: a logit offset per block position, refitted every 16
    # steps from the acceptances the engine observes (dspark/online_calibration.py), so the planner's survival
    # follows the traffic it serves. Needs a scheduling verify mode and acceptance_estimate=head.
    online_calibration: bool = False
    force_verify_len: int | None = None  # profiling/debug override of the decision (must be on the ladder)
    force_trimmed_path: bool = False  # profiling: run a forced verify length (even the full block) as a trimmed step
    force_budget_frac: float | None = None  # profiling/debug override (ragged): budget = frac * R * G cells
    token_buckets: tuple[int, ...] | None = None  # pad each step's tokens up to the next bucket (graph keys)
    debug_checks: bool = False  # assert every description of a step's verify tokens agrees
    # Device-resident decode steps (dspark.graph_decode): captured as CUDA graphs, one per token
    # bucket, on a GPU; on the CPU the same step function runs eagerly (for tests).
    cuda_graphs: bool = False
    overlap: bool = False  # launch step t+1 before reading step t's tokens (needs cuda_graphs)
    # Captured prefill forwards on their own CUDA stream, beside the decode step (cuda_graphs on a GPU); their
    # requests join the decode rows one step later. Counted as prefill_side_stream_replays.
    prefill_stream: bool = True
    # Kernel switches of the Triton backend (engine.kernels.*); kernel_config() combines them with
    # attention_backend and batch_invariant into what the model code reads.
    kernels: KernelSwitches = field(default_factory=KernelSwitches)

    DTYPES = ("float32", "bfloat16", "float16")
    SPECS = ("off", "dspark")
    VERIFY = ("full", "uniform", "ragged", "cap_accept")
    ESTIMATES = ("head", "draft_max_prob")
    BACKENDS = ("torch", "triton")

    def __post_init__(self) -> None:
        _check(self.dtype in self.DTYPES, "engine.dtype", f"{self.dtype!r} not in {list(self.DTYPES)}")
        _check(self.spec in self.SPECS, "engine.spec", f"{self.spec!r} not in {list(self.SPECS)}")
        _check(self.verify in self.VERIFY, "engine.verify", f"{self.verify!r} not in {list(self.VERIFY)}")
        _check(self.acceptance_estimate in self.ESTIMATES, "engine.acceptance_estimate",
               f"{self.acceptance_estimate!r} not in {list(self.ESTIMATES)}")
        _check(self.attention_backend in self.BACKENDS, "engine.attention_backend",
               f"{self.attention_backend!r} not in {list(self.BACKENDS)}")
        if isinstance(self.kernels, KernelConfig):  # a whole kernel config: it must agree with this engine's
            _check(self.kernels.attention_backend == self.attention_backend
                   and self.kernels.batch_invariant == self.batch_invariant, "engine.kernels",
                   f"a KernelConfig with attention_backend={self.kernels.attention_backend!r}, batch_invariant="
                   f"{self.kernels.batch_invariant} given to an engine with attention_backend="
                   f"{self.attention_backend!r}, batch_invariant={self.batch_invariant}; set those on the engine")
            self.kernels = KernelSwitches(**self.kernels.switches())
        elif isinstance(self.kernels, Mapping):  # from YAML / a runner's dict
            self.kernels = KernelSwitches.from_dict(self.kernels)
        elif self.kernels is None:
            self.kernels = KernelSwitches()
        _check(isinstance(self.kernels, KernelSwitches), "engine.kernels",
               f"must be a KernelSwitches or a mapping of its keys, got {type(self.kernels).__name__}")
        self.kernel_config()  # validates the combination (backend, batch invariance, switches)
        plain_off_cpu = self.attention_backend == "torch" and not str(self.device).startswith("cpu")
        _check(not (self.batch_invariant and plain_off_cpu), "engine.batch_invariant",
               f"on the torch backend the mode is the CPU's (tested with MKL's GEMM, not on {self.device!r}); "
               "on a GPU set engine.attention_backend=triton, or engine.batch_invariant=false")
        _check(self.kv_block_size >= 1, "engine.kv_block_size", "must be >= 1")
        _check(self.max_model_len >= 2, "engine.max_model_len", "must be >= 2")
        _check(self.max_num_seqs >= 1, "engine.max_num_seqs", "must be >= 1")
        _check(self.max_num_batched_tokens >= 64, "engine.max_num_batched_tokens", "must be >= 64")
        if self.num_kv_blocks is not None:
            _check(self.num_kv_blocks >= 2, "engine.num_kv_blocks", "must be >= 2")
        _check(self.kv_cache_tokens is None or self.kv_cache_tokens >= 1, "engine.kv_cache_tokens",
               f"must be >= 1 token slot, or null for no cap, got {self.kv_cache_tokens}")
        _check(0.0 < self.kv_memory_fraction <= 1.0, "engine.kv_memory_fraction",
               f"must be in (0, 1], got {self.kv_memory_fraction}")
        _check(not (self.spec == "off" and self.verify != "full"), "engine.verify",
               f"verify={self.verify!r} schedules drafted tokens but engine.spec=off drafts none; set engine.spec=dspark "
               "or engine.verify=full")
        _check(not self.online_calibration or (self.verify in ("uniform", "ragged", "cap_accept")
                                                and self.acceptance_estimate == "head"), "engine.online_calibration",
               f"corrects the confidence head's survival that the planner reads: it needs engine.verify uniform, "
               f"ragged or cap_accept and engine.acceptance_estimate=head (got verify={self.verify!r}, "
               f"acceptance_estimate={self.acceptance_estimate!r}); set it to false")
        _check(self.confidence_calibration is None or self.spec == "dspark", "engine.confidence_calibration",
               "calibrates the drafter's confidence head, and engine.spec=off has no drafter; set it to null")
        _check(self.greedy_confidence_calibration is None or (
            self.spec == "dspark" and self.acceptance_estimate == "head" and not self.online_calibration),
            "engine.greedy_confidence_calibration",
            "calibrates the confidence head the planner reads on all-greedy steps: it needs engine.spec=dspark and "
            "engine.acceptance_estimate=head, and engine.online_calibration=false (its offsets correct one "
            f"calibration, not two; got spec={self.spec!r}, acceptance_estimate={self.acceptance_estimate!r}, "
            f"online_calibration={self.online_calibration!r}); set it to null")
        if self.tiers is not None:
            self.tiers = tuple(int(t) for t in self.tiers)
            _check(self.verify == "uniform", "engine.tiers",
                   f"a tier ladder applies to verify=uniform (got verify={self.verify!r}); set tiers=null")
        if self.token_buckets is not None:
            b = tuple(int(t) for t in self.token_buckets)
            _check(len(b) > 0 and all(x > 0 for x in b) and all(b[i] < b[i + 1] for i in range(len(b) - 1)),
                   "engine.token_buckets", f"must be strictly ascending positive integers, got {list(b)}")
            self.token_buckets = b
        _check(self.verify != "ragged" or self.token_buckets is not None or self.device == "cpu" or self.cuda_graphs,
               "engine.token_buckets", "verify=ragged on a GPU pads each step to a token bucket: set "
               "engine.token_buckets (e.g. [64, 128, 256, 512, 1024, 2048])")
        _check(not self.overlap or self.cuda_graphs, "engine.overlap",
               "the overlap scheduler pipelines device-resident steps: set engine.cuda_graphs=true too")
        if self.cuda_graphs and self.verify != "full":
            _check(self.verify in ("uniform", "ragged"), "engine.cuda_graphs",
                   f"captured steps support verify=full, uniform and ragged, got verify={self.verify!r}; "
                   f"set engine.cuda_graphs=false")
            _check(self.planner_algorithm == "global", "engine.planner_algorithm",
                   "greedy_stop decides each step from fresh survival on the host, which captured steps never "
                   "read back in time; use planner_algorithm=global with cuda_graphs")
            need = 2 if self.overlap else 1
            _check(self.budget_lag >= need, "engine.budget_lag",
                   f"captured steps size the budget from survival the host has already read back: at least "
                   f"{need} step(s) old {'with the overlap scheduler ' if self.overlap else ''}(got "
                   f"{self.budget_lag}); set engine.budget_lag={need}")
        if self.verify_share is not None:
            from dspark.verify_share import check_verify_share

            problem = check_verify_share(self.verify_share)
            _check(problem is None, "engine.verify_share", problem or "")
            _check(self.verify == "ragged", "engine.verify_share",
                   f"picks each step's cells from fresh survival as a ragged step does: it needs engine.verify=ragged "
                   f"(got {self.verify!r})")
            _check(self.force_verify_len is None and self.force_budget_frac is None, "engine.verify_share",
                   "replaces the planner's decisions, as engine.force_verify_len / force_budget_frac do: set one")
        _check(isinstance(self.plan_min_rows, int) and self.plan_min_rows >= 0, "engine.plan_min_rows",
               f"must be an integer >= 0 (0: plan steps of any size), got {self.plan_min_rows!r}")
        for name, problem in check_plan_gate_settings(warmup=self.plan_gate_warmup,
                                                      probe_every=self.plan_gate_probe_every,
                                                      probe_every_max=self.plan_gate_probe_every_max).items():
            _check(False, f"engine.plan_gate_{name}", problem)
        if self.force_verify_len is not None:
            _check(self.verify in ("uniform", "ragged", "cap_accept"), "engine.force_verify_len",
                   f"overrides the planner's decision, but verify={self.verify!r} has no planner")
        _check(not self.force_trimmed_path or self.force_verify_len is not None, "engine.force_trimmed_path",
               "runs the forced verify length on the trimmed-step path (the profiler measures its extra cost); "
               "set engine.force_verify_len too")
        if self.force_budget_frac is not None:
            _check(0.0 <= self.force_budget_frac <= 1.0, "engine.force_budget_frac",
                   f"must be in [0, 1], got {self.force_budget_frac}")
            _check(self.verify in ("ragged", "cap_accept"), "engine.force_budget_frac",
                   f"applies to verify=ragged or cap_accept, got verify={self.verify!r}")

    def kernel_config(self) -> KernelConfig:
        """This engine's frozen kernel settings (attention backend, batch invariance, engine.kernels.*):
        what the model runner puts into every step's AttentionMetadata."""
        return KernelConfig(attention_backend=self.attention_backend, batch_invariant=self.batch_invariant,
                            **self.kernels.switches())

    def to_dict(self) -> dict[str, Any]:
        d = _as_dict(self)
        d["kernels"] = self.kernels.to_dict()
        return d


__all__ = ["ConfigError", "ModelConfig", "DrafterConfig", "SamplingParams", "KernelSwitches", "KernelConfig",
           "DEFAULT_KERNELS", "EngineConfig", "field"]
