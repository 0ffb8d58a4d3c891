"""Drafter trainer: frozen target, teacher-forced DSpark blocks, AdamW, resumable checkpoints.

One training step:

1. take ``batch_size`` sequences (prompt + target-generated response) in a seeded order
   (:func:`dspark.training.data.batch_indices`, a pure function of the step);
2. run the frozen target densely over them (:func:`dense_target_forward`, the same layers
   and projections as the paged path) and keep the outputs of ``drafter.target_layer_ids``
   for every position and the final hidden states;
3. sample up to ``anchors_per_seq`` anchors per sequence in the response part (anchor =
   the last committed token, so the first candidate is the last prompt token), by default
   only where the whole block of labels fits before the sequence end;
4. drafter ``forward_train`` (teacher forcing); slot k of the block at anchor a predicts the
   token at a+k+1, whose target distribution is the target's logits at position a+k;
5. :func:`dspark.training.loss.dspark_loss` over the valid cells, AdamW with linear warmup
   and cosine decay, gradient clipping, bf16 autocast on CUDA only.

Determinism: the data order and the anchors of step s depend only on (seed, s), and a
checkpoint stores the drafter, the AdamW state, the scheduler, the RNG states and the
step, so a resumed run ends in exactly the state of an uninterrupted one.

Checkpoints (``output_dir/checkpoint-NNNNNNN/``): the drafter (``DSparkDrafter.save``: config
+ its own weights only, never the target's embedding or lm_head), the optimizer state as
safetensors shards of at most ``max_shard_bytes`` each (large tensors split along their
flattened length), and ``trainer_state.pt`` written last: a checkpoint without it is
incomplete and ignored on resume. They are written every ``save_every`` steps, at the end, when
``time_budget_s`` runs out, and on a Ctrl-C, which is answered after the step in progress
(:class:`dspark.training.interrupt.DeferredInterrupt`) before ``train`` raises KeyboardInterrupt.

:func:`replay_block_acceptance` replays drafting + full-block greedy verification densely
(the drafter drafts with its own argmax tokens, the target verifies ``[anchor, d_1..d_{G-1}]``
on top of the true prefix), which is what the calibration and the tests measure.
"""

from __future__ import annotations

import json
import math
import random
import time
import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import save_file
from torch.profiler import record_function

from dspark.config import ConfigError
from dspark.models.drafter import DSparkDrafter, check_anchor_range
from dspark.models.loading import read_safetensors
from dspark.models.llama import TargetModel
from dspark.sampling import top_gap, top_probability
from dspark.training.data import TokenDataset, batch_indices, make_batch, trained_lengths
from dspark.training.interrupt import DeferredInterrupt
from dspark.training.loss import CONF_TARGETS, dspark_loss

CHECKPOINT_PREFIX = "checkpoint-"
TRAINER_STATE_FILE = "trainer_state.pt"
OPTIMIZER_DIR = "optimizer"
OPTIMIZER_INDEX = "optimizer_index.json"
LOG_FILE = "train_log.jsonl"
DEFAULT_MAX_SHARD_BYTES = 16 * 1024 * 1024
# Settings a resumed run may change; every other TrainConfig field must match the checkpoint.
RESUMABLE_CHANGES = ("output_dir", "save_every", "log_every", "keep_last", "progress", "max_shard_bytes",
                     "time_budget_s", "target_graphs")


# Train settings added after checkpoints had been written: an older checkpoint trained with their defaults.
LATER_SETTINGS = ("conf_target", "head_only", "conf_stop_grad")
HEAD_PREFIX = "confidence_head."  # the drafter's confidence head parameters (train.head_only trains these alone)


@dataclass
class TrainConfig:
    """Optimisation settings of :class:`DrafterTrainer` (all checked in ``__post_init__``)."""

    output_dir: str = "drafter_run"
    max_steps: int = 2000
    batch_size: int = 16
    max_len: int = 1024
    # > 1: batches drawn from chunks of this many batches sorted by length (data.bucketed_epoch_order),
    # so a long max_len pads a batch only to sequences like its own; 1: plain shuffled batches
    bucket_batches: int = 1
    anchors_per_seq: int = 32
    require_full_block: bool = True  # anchors only where all block_size labels lie inside the sequence
    lr: float = 6e-4
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    ce_weight: float = 0.1
    tv_weight: float = 0.9
    conf_weight: float = 1.0
    position_decay: float | None = 4.0
    # the confidence head's label: "analytical" (the acceptance of a sampled draft) or "greedy" (whether the
    # drafter's top token is the target's: what T=0 verification accepts); see dspark.training.loss
    conf_target: str = "analytical"
    # train the confidence head alone: every other weight frozen and left out of the optimizer, so a trained
    # drafter's drafts stay exactly as they were (its head is trained again, e.g. on another conf_target)
    head_only: bool = False
    # the confidence term trains the confidence head alone: the head reads its inputs (h_k, W1[x_{k-1}]) detached,
    # so the backbone and the Markov head learn from CE and TV alone, as the DFlash ablation's backbone does
    conf_stop_grad: bool = False
    seed: int = 0
    device: str = "cpu"
    bf16_autocast: bool = True  # used on CUDA only; CPU runs stay float32
    pad_id: int = 0
    save_every: int = 500
    log_every: int = 10
    keep_last: int = 2  # checkpoints kept (older ones are deleted); 0 keeps all
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
    progress: bool = True
    # Wall-clock budget: stop (with a checkpoint) once exceeded, even before max_steps. For
    # leased machines; the learning-rate schedule still follows max_steps, so size both.
    time_budget_s: float | None = None
    # CUDA only: the frozen target's forward replayed from CUDA graphs, one per batch shape (its length rounded up
    # to a multiple of 128): the same operations with one launch (dspark.training.target_graphs)
    target_graphs: bool = False

    def __post_init__(self) -> None:
        def need(cond: bool, key: str, msg: str) -> None:
            if not cond:
                raise ConfigError(f"train.{key}: {msg}")

        for key in ("max_steps", "batch_size", "bucket_batches", "anchors_per_seq", "save_every", "log_every",
                    "max_shard_bytes"):
            need(int(getattr(self, key)) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        need(self.max_len >= 2, "max_len", f"must be >= 2, got {self.max_len}")
        need(self.warmup_steps >= 0, "warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        need(self.keep_last >= 0, "keep_last", f"must be >= 0 (0 keeps all), got {self.keep_last}")
        need(self.lr > 0 and math.isfinite(self.lr), "lr", f"must be a finite number > 0, got {self.lr}")
        need(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        need(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        need(self.grad_clip > 0, "grad_clip", f"must be > 0, got {self.grad_clip}")
        need(self.conf_target in CONF_TARGETS, "conf_target", f"one of {list(CONF_TARGETS)}, got {self.conf_target!r}")
        need(not self.head_only or self.conf_weight > 0, "conf_weight",
             f"head_only trains the confidence head on its loss term alone, which needs conf_weight > 0 "
             f"(got {self.conf_weight})")
        need(not self.conf_stop_grad or self.conf_weight > 0, "conf_stop_grad",
             f"stops the confidence term's gradient at the head's inputs, which needs conf_weight > 0 "
             f"(got {self.conf_weight})")
        self.betas = tuple(float(b) for b in self.betas)  # type: ignore[assignment]
        need(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas",
             f"must be two numbers in [0, 1), got {self.betas}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"train: unknown keys {unknown}; allowed: {sorted(known)}")
        return cls(**d)


# ---------------------------------------------------------------------------- dense target


def dense_target_forward(target: TargetModel, input_ids: torch.Tensor, capture_layers: tuple[int, ...] = (),
                         return_kv: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor | None, list[tuple[torch.Tensor, torch.Tensor]] | None]:
    """Full-sequence causal forward of the target without a paged cache.

    input_ids int64 [B, S] (right padding is harmless: a real token never sees a later one)
    -> (final-normed hidden [B, S, d], outputs of ``capture_layers`` concatenated [B, S, n*d]
    or None, per-layer rotated (K, V) [B, S, Hkv, D] when ``return_kv``). Uses each layer's
    own norms, projections and MLP, so it computes what ``TargetModel.forward`` computes.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, S], got shape {tuple(input_ids.shape)}")
    batch, seq_len = input_ids.shape
    device = input_ids.device
    positions = torch.arange(seq_len, device=device).expand(batch, seq_len)
    wanted = {layer: slot for slot, layer in enumerate(capture_layers)}
    bad = [i for i in capture_layers if not 0 <= i < len(target.model.layers)]
    if bad:
        raise ValueError(f"capture_layers {list(capture_layers)} has ids {bad} outside [0, {len(target.model.layers)})")
    captured: list[torch.Tensor | None] = [None] * len(capture_layers)
    kvs: list[tuple[torch.Tensor, torch.Tensor]] = []
    x = target.embed(input_ids)
    for i, layer in enumerate(target.model.layers):
        normed = layer.input_layernorm(x)
        if return_kv:
            kvs.append(layer.self_attn.project_kv(normed, positions))
        x = x + layer.self_attn.forward_dense(normed, positions, None, None, None)  # causal
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        if i in wanted:
            captured[wanted[i]] = x
    cap = torch.cat(captured, dim=-1) if capture_layers else None  # type: ignore[arg-type]
    return target.model.norm(x), cap, (kvs if return_kv else None)


def target_verify_forward(target: TargetModel, kvs: list[tuple[torch.Tensor, torch.Tensor]],
                          block_ids: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Target over A verify blocks per sequence on top of the true prefix.

    kvs: per-layer (K, V) [B, S, Hkv, D] of the sequences (from :func:`dense_target_forward`);
    block_ids int64 [B, A, G] = [anchor, d_1, .., d_{G-1}] fed at positions a..a+G-1;
    anchors int64 [B, A]. Block row j sees the sequence positions < a and its block rows <= j
    (what the engine's verify step sees). Returns final-normed hidden [B, A, G, d].
    """
    batch, n_anchor, gamma = block_ids.shape
    seq_len = kvs[0][0].shape[1]
    device = block_ids.device
    rows = n_anchor * gamma
    offsets = torch.arange(gamma, device=device)
    positions = (anchors[:, :, None] + offsets).reshape(batch, rows)
    prefix_visible = (torch.arange(seq_len, device=device)[None, None, :] < anchors[:, :, None])
    prefix_visible = prefix_visible.repeat_interleave(gamma, dim=1)  # [B, A*G, S]
    block_of_row = torch.arange(n_anchor, device=device).repeat_interleave(gamma)
    slot_of_row = offsets.repeat(n_anchor)
    own = (block_of_row[:, None] == block_of_row[None, :]) & (slot_of_row[None, :] <= slot_of_row[:, None])
    visible = torch.cat((prefix_visible, own.expand(batch, rows, rows)), dim=-1)
    x = target.embed(block_ids.reshape(batch, rows))
    for layer, (k, v) in zip(target.model.layers, kvs):
        x = x + layer.self_attn.forward_dense(layer.input_layernorm(x), positions, k, v, visible)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return target.model.norm(x).view(batch, n_anchor, gamma, -1)


# ---------------------------------------------------------------------------- anchors and labels


def step_generator(seed: int, step: int, salt: int = 0) -> torch.Generator:
    """CPU generator for the random choices of one step: a pure function of (seed, step, salt)."""
    return torch.Generator().manual_seed((int(seed) * 7919 + int(step) * 104729 + salt) & 0x7FFF_FFFF_FFFF_FFFF)


def sample_anchors(lengths: torch.Tensor, response_starts: torch.Tensor, num_anchors: int | None, block_size: int,
                   generator: torch.Generator, require_full_block: bool = True, stride: int = 1
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``num_anchors`` distinct anchors per row in the response part, sorted; (anchors [B, A], valid [B, A]).

    Candidates are a in [start-1, length-2] (a = start-1 is the last prompt token: its block
    predicts the first response tokens). With ``require_full_block`` the range ends at
    length-1-block_size so all labels exist; a row whose response is shorter falls back to
    the partial range, whose out-of-sequence slots are masked by :func:`block_labels`.
    With ``stride`` > 1 only every stride-th candidate from start-1 on is eligible.
    ``num_anchors=None`` takes every eligible candidate (no randomness; A is then the largest
    count in the batch). Unused anchor slots are 0 and invalid.
    """
    if int(stride) < 1:
        raise ValueError(f"anchor stride must be >= 1, got {stride}")
    if num_anchors is not None and int(num_anchors) < 1:
        raise ValueError(f"num_anchors must be >= 1 or None (every eligible position), got {num_anchors}")
    batch = lengths.shape[0]
    picked: list[torch.Tensor | None] = []
    for b in range(batch):
        lo = int(response_starts[b]) - 1
        hi = int(lengths[b]) - 2
        if require_full_block and int(lengths[b]) - 1 - block_size >= lo:
            hi = int(lengths[b]) - 1 - block_size
        count = (hi - lo) // stride + 1 if hi >= lo else 0
        if count < 1:
            picked.append(None)
            continue
        if num_anchors is None:
            chosen = torch.arange(count, dtype=torch.int64)
        else:
            chosen = torch.randperm(count, generator=generator)[:min(int(num_anchors), count)].sort().values
        picked.append(chosen * stride + lo)
    width = int(num_anchors) if num_anchors is not None else max([c.numel() for c in picked if c is not None],
                                                                  default=0)
    anchors = torch.zeros(batch, width, dtype=torch.int64)
    valid = torch.zeros(batch, width, dtype=torch.bool)
    for b, chosen in enumerate(picked):
        if chosen is not None:
            anchors[b, :chosen.numel()] = chosen
            valid[b, :chosen.numel()] = True
    return anchors, valid


def block_labels(input_ids: torch.Tensor, lengths: torch.Tensor, anchors: torch.Tensor, anchor_valid: torch.Tensor,
                 block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(labels [B, A, G] = token at a+k+1 or -1, valid [B, A, G], target positions a+k [B, A, G] clamped)."""
    seq_len = input_ids.shape[1]
    offsets = torch.arange(block_size, device=input_ids.device)
    label_pos = anchors[:, :, None] + offsets + 1
    valid = anchor_valid[:, :, None] & (label_pos < lengths.to(input_ids.device)[:, None, None])
    flat = label_pos.clamp(max=seq_len - 1).reshape(input_ids.shape[0], -1)
    labels = input_ids.gather(1, flat).view_as(label_pos)
    labels = torch.where(valid, labels, torch.full_like(labels, -1))
    return labels, valid, (label_pos - 1).clamp(max=seq_len - 1)


def gather_positions(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x [B, S, d], positions [B, ...] -> x at those positions [B, ..., d]."""
    batch = x.shape[0]
    flat = positions.reshape(batch, -1)
    out = x.gather(1, flat[:, :, None].expand(-1, -1, x.shape[-1]))
    return out.view(*positions.shape, x.shape[-1])


# ---------------------------------------------------------------------------- sharded tensor files


def shard_data_budget(max_file_bytes: int) -> int:
    """Tensor bytes per safetensors file so that the file, header included, stays within ``max_file_bytes``."""
    return max(256, int(max_file_bytes * 0.97) - 8192)


def save_tensor_shards(tensors: dict[str, torch.Tensor], directory: Path, stem: str, max_bytes: int) -> Path:
    """Write ``tensors`` as safetensors files of at most ``max_bytes`` each plus ``{stem}_index.json``.

    A tensor larger than ``max_bytes`` is flattened and split into parts; the index records
    every tensor's shape, dtype and parts so :func:`load_tensor_shards` rebuilds it exactly.
    """
    directory.mkdir(parents=True, exist_ok=True)
    max_bytes = shard_data_budget(max_bytes)
    pieces: list[tuple[str, str, torch.Tensor]] = []  # (tensor name, part key, data)
    entries: dict[str, dict[str, Any]] = {}
    for name, tensor in tensors.items():
        t = tensor.detach().to("cpu").contiguous()
        entries[name] = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "parts": []}
        flat = t.reshape(-1)
        per_part = max(1, max_bytes // max(1, t.element_size()))
        if flat.numel() * t.element_size() <= max_bytes:
            pieces.append((name, name, t))
        else:
            for j, start in enumerate(range(0, flat.numel(), per_part)):
                pieces.append((name, f"{name}@part{j}", flat[start: start + per_part].clone()))
    shards: list[dict[str, torch.Tensor]] = [{}]
    owner: list[list[tuple[str, str]]] = [[]]
    used = 0
    for name, key, data in pieces:
        size = data.numel() * data.element_size()
        if shards[-1] and used + size > max_bytes:
            shards.append({})
            owner.append([])
            used = 0
        shards[-1][key] = data
        owner[-1].append((name, key))
        used += size
    for i, shard in enumerate(shards):
        fname = f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / fname))
        for name, key in owner[i]:
            entries[name]["parts"].append([fname, key])
    index = directory / f"{stem}_index.json"
    index.write_text(json.dumps(entries, indent=1) + "\n")
    return index


def load_tensor_shards(directory: Path, stem: str) -> dict[str, torch.Tensor]:
    index_path = directory / f"{stem}_index.json"
    if not index_path.is_file():
        raise FileNotFoundError(f"{index_path} not found: the checkpoint is incomplete; resume from another one")
    entries = json.loads(index_path.read_text())
    files: dict[str, dict[str, torch.Tensor]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, entry in entries.items():
        parts = []
        for fname, key in entry["parts"]:
            if fname not in files:
                files[fname] = read_safetensors(directory / fname, "The training checkpoint is damaged; "
                                                "resume from another one")
            parts.append(files[fname][key].reshape(-1))
        flat = torch.cat(parts) if len(parts) > 1 else parts[0]
        out[name] = flat.reshape(entry["shape"])
    return out


def _flatten_optimizer_state(state_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for idx, per_param in state_dict["state"].items():
        for key, value in per_param.items():
            if torch.is_tensor(value):
                tensors[f"{idx}.{key}"] = value
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def _unflatten_optimizer_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in list(tensors.items()) + list(meta["scalars"].items()):
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


# ---------------------------------------------------------------------------- trainer


def lr_lambda_factory(warmup_steps: int, max_steps: int, min_lr_ratio: float) -> Callable[[int], float]:
    """Linear warmup from 0 over ``warmup_steps``, then cosine to ``min_lr_ratio`` at ``max_steps``."""

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(1, max_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def _freeze(target: TargetModel) -> TargetModel:
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    return target


# The profiler ranges of one training step, in order (DrafterTrainer.compute_loss and train_step; what is left of a
# step is the metrics it reports, whose .item() calls wait for the device).
STEP_PHASES = ("train/batch", "train/target_forward", "train/drafter_forward", "train/loss", "train/backward",
               "train/optimizer")


def expected_accept_length(per_position: torch.Tensor) -> float:
    """1 + sum_k prod_{i<=k} a_i: tokens per step implied by per-position acceptance (NaN -> 0)."""
    a = torch.nan_to_num(per_position.float().cpu(), nan=0.0)
    return float(1.0 + torch.cumprod(a, 0).sum())


class DrafterTrainer:
    """Trains ``drafter`` against the frozen ``target`` on ``dataset``; see the module docstring."""

    def __init__(self, target: TargetModel, drafter: DSparkDrafter, dataset: TokenDataset, cfg: TrainConfig,
                 extra_state: dict[str, Any] | None = None):
        if len(dataset) == 0:
            raise ConfigError("train data: the dataset holds no sequences; make data with runners.make_training_data")
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"train.device: {cfg.device!r} requested but CUDA is not available; use device=cpu")
        drafter.validate_target_layers(target.cfg)
        self.autocast = self.device.type == "cuda" and cfg.bf16_autocast
        target_dtype = torch.bfloat16 if self.autocast else torch.float32
        self.target = _freeze(target.to(device=self.device, dtype=target_dtype))
        self.drafter = drafter.to(device=self.device, dtype=torch.float32).train()
        self.target_graphs = None
        if cfg.target_graphs:
            if self.device.type != "cuda":
                raise ConfigError(f"train.target_graphs: CUDA graphs need train.device=cuda, got {cfg.device!r}")
            from dspark.training.target_graphs import TargetForwardGraphs

            self.target_graphs = TargetForwardGraphs(self.target, tuple(drafter.cfg.target_layer_ids), self.autocast,
                                                     pad_id=cfg.pad_id)
        self.dataset = dataset
        self.lengths = trained_lengths(dataset, cfg.max_len) if cfg.bucket_batches > 1 else None
        self.epoch_orders: dict[int, torch.Tensor] = {}  # batch_indices' epoch orders, computed once per epoch
        self.extra_state = dict(extra_state or {})
        for key in ("head_only", "conf_stop_grad"):
            if getattr(cfg, key) and drafter.confidence_head is None:
                raise ConfigError(f"train.{key}: this drafter has no confidence head to train (style=dflash, or "
                                  f"drafter_arch.use_confidence_head=false)")
        if cfg.head_only:
            for name, p in self.drafter.named_parameters():  # frozen weights get no gradient and no weight decay
                p.requires_grad_(name.startswith(HEAD_PREFIX))
        decay, no_decay = [], []
        for name, p in self.drafter.named_parameters():
            if p.requires_grad:
                (decay if p.dim() >= 2 and "mask_embedding" not in name else no_decay).append(p)
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=cfg.betas)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda_factory(cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio))
        self.step = 0
        self.output_dir = Path(cfg.output_dir)
        self.last_metrics: dict[str, Any] = {}
        self._saved_step: int | None = None  # the step of the last checkpoint this trainer wrote or loaded

    # ------------------------------------------------------------------ one step

    def _autocast(self):
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.autocast)

    def step_batch(self, step: int):
        """(dataset rows, padded batch) of training step ``step``: a function of the seed and the step."""
        cfg = self.cfg
        rows = batch_indices(len(self.dataset), cfg.batch_size, step, cfg.seed, self.lengths, cfg.bucket_batches,
                             self.epoch_orders)
        return rows, make_batch(self.dataset, rows, cfg.max_len, cfg.pad_id)

    def compute_loss(self, step: int):
        """Loss of training step ``step`` (batch and anchors are functions of the seed and the step). Its phases are
        profiler ranges (:data:`STEP_PHASES`), as are :meth:`train_step`'s backward and optimizer step."""
        cfg = self.cfg
        gamma = self.drafter.block_size
        with record_function("train/batch"):
            rows, batch = self.step_batch(step)
            anchors, anchor_valid = sample_anchors(batch.lengths, batch.response_starts, cfg.anchors_per_seq, gamma,
                                                   step_generator(cfg.seed, step), cfg.require_full_block)
            if not bool(anchor_valid.any()):
                raise ValueError(f"step {step}: no sequence of the batch has a response token to train on; check "
                                 f"the data (rows {rows[:8]}) and train.max_len={cfg.max_len}")
            # checked here on the host: the drafter's forward then need not read the device copy back (a sync)
            check_anchor_range(anchors, batch.input_ids.shape[1])
            ids = batch.input_ids.to(self.device)
            lengths = batch.lengths.to(self.device)
            anchors = anchors.to(self.device)
            anchor_valid = anchor_valid.to(self.device)
            labels, valid, target_pos = block_labels(ids, lengths, anchors, anchor_valid, gamma)
        with record_function("train/target_forward"), torch.no_grad(), self._autocast():
            if self.target_graphs is not None:  # views into the graph's outputs, read within this step
                hidden, captured = self.target_graphs(ids)
            else:
                hidden, captured, _ = dense_target_forward(self.target, ids, self.drafter.cfg.target_layer_ids)
            target_logits = self.target.compute_logits(gather_positions(hidden, target_pos))  # [B, A, G, V]
        with record_function("train/drafter_forward"), self._autocast():
            out = self.drafter.forward_train(captured, ids, anchors, self.target.embed, self.target.lm_head_weight,
                                             labels, anchors_checked=True, conf_stop_grad=cfg.conf_stop_grad)
        weights = (0.0, 0.0) if cfg.head_only else (cfg.ce_weight, cfg.tv_weight)  # head_only: CE, TV reported only
        with record_function("train/loss"):
            return dspark_loss(out.logits, target_logits, out.confidence_logits, valid, ce_weight=weights[0],
                               tv_weight=weights[1], conf_weight=cfg.conf_weight,
                               position_decay=cfg.position_decay, targets=labels, conf_target=cfg.conf_target)

    def train_step(self) -> dict[str, Any]:
        loss = self.compute_loss(self.step)
        with record_function("train/backward"):
            self.optimizer.zero_grad(set_to_none=True)
            loss.total.backward()
        with record_function("train/optimizer"):
            grad_norm = torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.cfg.grad_clip)
            if not torch.isfinite(loss.total.detach()):
                raise FloatingPointError(f"step {self.step}: loss is {loss.total.item()}; lower train.lr "
                                         f"(now {self.cfg.lr}) or check the data")
            self.optimizer.step()
            self.scheduler.step()
        self.step += 1
        acc = loss.per_position_acceptance.detach().float().cpu()
        metrics = {
            "step": self.step,
            "loss": loss.total.item(), "ce": loss.ce.item(), "tv": loss.tv.item(), "conf_bce": loss.conf_bce.item(),
            "grad_norm": float(grad_norm), "lr": float(self.scheduler.get_last_lr()[0]),
            "per_position_acceptance": [None if math.isnan(v) else round(v, 4) for v in acc.tolist()],
            "expected_accept_length": expected_accept_length(acc),
        }
        self.last_metrics = metrics
        return metrics

    # ------------------------------------------------------------------ loop

    def train(self, until_step: int | None = None) -> dict[str, Any]:
        """Train up to ``until_step`` (default cfg.max_steps); checkpoints every save_every and at the end."""
        cfg = self.cfg
        stop = cfg.max_steps if until_step is None else min(int(until_step), cfg.max_steps)
        if stop <= self.step:
            return self.last_metrics
        # A budget stop belongs to the call that made it: a resumed run's checkpoint carries the earlier call's, which
        # would otherwise be reported for a run that then reached its last step.
        self.extra_state.pop("stopped_by_time_budget", None)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        from tqdm.auto import tqdm

        bar = tqdm(total=stop, initial=self.step, desc="train drafter", unit="step", disable=not cfg.progress)
        log_path = self.output_dir / LOG_FILE
        started = time.perf_counter()
        # A Ctrl-C is answered between steps: a checkpoint of the last whole step, then KeyboardInterrupt.
        with DeferredInterrupt() as interrupt:
            try:
                self._train_loop(stop, bar, log_path, started, interrupt)
            finally:
                bar.close()
        return self.last_metrics

    def _train_loop(self, stop: int, bar, log_path: Path, started: float, interrupt: DeferredInterrupt) -> None:
        cfg = self.cfg
        while self.step < stop:
            if interrupt.requested:
                bar.close()
                if self.step == 0:
                    print("train drafter: interrupted before the first step; nothing to save")
                else:
                    saved = self.save_checkpoint() if self._saved_step != self.step else self.checkpoint_dir(self.step)
                    print(f"train drafter: interrupted at step {self.step} of {stop}; {saved} holds it "
                          f"(resume=true continues from there)")
                raise KeyboardInterrupt
            if cfg.time_budget_s is not None and time.perf_counter() - started > cfg.time_budget_s:
                self.extra_state["stopped_by_time_budget"] = {"step": self.step, "budget_s": cfg.time_budget_s}
                print(f"train drafter: time budget {cfg.time_budget_s:.0f} s reached at step {self.step} "
                      f"of {stop}; saving a checkpoint and stopping")
                self.save_checkpoint()
                break
            metrics = self.train_step()
            acc = " ".join("-" if v is None else f"{v:.2f}" for v in metrics["per_position_acceptance"])
            bar.set_postfix_str(f"loss {metrics['loss']:.4f} tau {metrics['expected_accept_length']:.2f} "
                                f"acc [{acc}]")
            bar.update(1)
            if self.step % cfg.log_every == 0 or self.step == stop:
                with log_path.open("a") as f:
                    f.write(json.dumps(metrics) + "\n")
            if self.step % cfg.save_every == 0 or self.step == stop:
                self.save_checkpoint()

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_dir(self, step: int) -> Path:
        return self.output_dir / f"{CHECKPOINT_PREFIX}{step:07d}"

    def save_checkpoint(self) -> Path:
        """Write checkpoint-<step>/ (drafter, optimizer shards, trainer_state.pt last) and prune old ones."""
        final = self.checkpoint_dir(self.step)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.drafter.save(tmp, max_shard_bytes=shard_data_budget(self.cfg.max_shard_bytes))
        opt_tensors, opt_meta = _flatten_optimizer_state(self.optimizer.state_dict())
        save_tensor_shards(opt_tensors, tmp / OPTIMIZER_DIR, "optimizer", self.cfg.max_shard_bytes)
        rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        state = {
            "step": self.step,
            "train_config": self.cfg.to_dict(),
            "drafter_config": self.drafter.cfg.to_dict(),
            "optimizer_meta": opt_meta,
            "scheduler": self.scheduler.state_dict(),
            "rng": rng,
            "last_metrics": self.last_metrics,
            "extra": self.extra_state,
        }
        torch.save(state, tmp / TRAINER_STATE_FILE)
        too_big = [p.name for p in tmp.rglob("*") if p.is_file() and p.stat().st_size > self.cfg.max_shard_bytes]
        if too_big:
            raise RuntimeError(f"checkpoint files {too_big} exceed train.max_shard_bytes={self.cfg.max_shard_bytes}; "
                               f"DSparkDrafter.save keeps each weight tensor whole: lower drafter_arch.markov_rank "
                               f"or raise train.max_shard_bytes")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        self._saved_step = self.step
        if self.cfg.keep_last > 0:
            for old in complete_checkpoints(self.output_dir)[: -self.cfg.keep_last]:
                shutil.rmtree(old)
        return final

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore drafter weights, optimizer, scheduler, RNG and step from a checkpoint folder."""
        src = Path(directory)
        state_path = src / TRAINER_STATE_FILE
        if not state_path.is_file():
            raise FileNotFoundError(f"{state_path} not found: {src} is not a complete training checkpoint")
        state = torch.load(state_path, map_location="cpu", weights_only=True)
        # a setting the checkpoint's version did not have yet (LATER_SETTINGS) had its default
        saved_cfg = {**{f.name: f.default for f in fields(TrainConfig) if f.name in LATER_SETTINGS},
                     **state["train_config"]}
        now = self.cfg.to_dict()
        changed = {k: (saved_cfg.get(k), now[k]) for k in now
                   if k not in RESUMABLE_CHANGES and saved_cfg.get(k) != now[k]}
        if changed:
            raise ConfigError(f"cannot resume from {src}: train settings differ from the checkpoint's "
                              f"(saved, now) = {changed}; resume with the same settings or start a new output_dir")
        if state["drafter_config"] != self.drafter.cfg.to_dict():
            raise ConfigError(f"cannot resume from {src}: drafter config {state['drafter_config']} differs from "
                              f"the current {self.drafter.cfg.to_dict()}")
        loaded = DSparkDrafter.load(src, self.target.cfg, device="cpu", dtype=torch.float32)
        self.drafter.load_state_dict(loaded.state_dict(), strict=True)
        self.drafter.set_confidence_temperatures(*loaded.calibration_values())
        opt_tensors = load_tensor_shards(src / OPTIMIZER_DIR, "optimizer")
        self.optimizer.load_state_dict(_unflatten_optimizer_state(opt_tensors, state["optimizer_meta"]))
        self.scheduler.load_state_dict(state["scheduler"])
        random.setstate(state["rng"]["python"])
        torch.set_rng_state(state["rng"]["torch"])
        if "cuda" in state["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.step = int(state["step"])
        # a checkpoint of this run's own folder already holds this step (one loaded from elsewhere does not)
        self._saved_step = self.step if src.resolve() == self.checkpoint_dir(self.step).resolve() else None
        self.last_metrics = dict(state.get("last_metrics") or {})
        self.extra_state = dict(state.get("extra") or {})

    def resume_latest(self) -> Path:
        found = complete_checkpoints(self.output_dir)
        if not found:
            raise FileNotFoundError(f"resume=true but {self.output_dir} holds no complete checkpoint "
                                    f"({CHECKPOINT_PREFIX}NNNNNNN/ with {TRAINER_STATE_FILE}); set resume=false "
                                    f"to start a new run")
        self.load_checkpoint(found[-1])
        return found[-1]


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Checkpoint folders of a run holding trainer_state.pt, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)
             and p.name[len(CHECKPOINT_PREFIX):].isdigit() and (p / TRAINER_STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX):]))


# ---------------------------------------------------------------------------- greedy replay


def replay_blocks(target: TargetModel, drafter: DSparkDrafter, input_ids: torch.Tensor, anchors: torch.Tensor,
                  anchor_chunk: int | None = None, temperature: float = 0.0,
                  generator: torch.Generator | None = None, keep_logits: bool = False) -> dict[str, torch.Tensor]:
    """Draft + full-block verification at given anchors, as the engine would do them: greedy, or sampled.

    input_ids int64 [B, S] (committed tokens; only positions <= anchor are used); anchors int64 [B, A].
    The drafter sees context 0..a-1 and the anchor, drafts (Markov and confidence features from the
    drafted tokens); the target verifies [anchor, d_1..d_{G-1}] on top of the true prefix. Returns
    ``tokens`` [B, A, G], ``accepted`` bool [B, A, G] (every slot verified) and float32 ``conf_logits``
    [B, A, G] (zeros without a confidence head). ``temperature`` 0: the drafter drafts its argmax and a
    slot is accepted when it is the target's argmax. ``temperature`` > 0: the drafter draws each slot from
    q = softmax(logits / t) and a slot is accepted with probability min(1, p(d) / q(d)), p = softmax(target
    logits / t): the rejection sampling of a row that samples at t (no top-k, no top-p), drawn with
    ``generator`` (on the tensors' device). ``anchor_chunk`` bounds memory: the target's context pass runs
    once, then drafting and verification run over at most that many anchors per sequence at a time (the
    verify attention grows with (anchors x block)^2 otherwise). ``keep_logits``: also return float32
    ``draft_logits`` and ``target_logits`` [B, A, G, V], the drafter's logits at each slot and the target's where it
    verified that slot (a vocabulary's worth per cell: for analyses of a few sequences at a time).
    """
    if anchor_chunk is not None and int(anchor_chunk) < 1:
        raise ValueError(f"anchor_chunk must be >= 1 or None, got {anchor_chunk}")
    if not 0.0 <= float(temperature) < float("inf"):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    _, captured, kvs = dense_target_forward(target, input_ids, drafter.cfg.target_layer_ids, return_kv=True)
    n_anchor = anchors.shape[1]
    chunk = n_anchor if anchor_chunk is None else min(int(anchor_chunk), max(n_anchor, 1))
    if chunk >= n_anchor:
        return _replay_anchor_chunk(target, drafter, input_ids, captured, kvs, anchors, float(temperature), generator,
                                    keep_logits)
    parts = [_replay_anchor_chunk(target, drafter, input_ids, captured, kvs, anchors[:, i: i + chunk],
                                  float(temperature), generator, keep_logits)
             for i in range(0, n_anchor, chunk)]
    return {key: torch.cat([p[key] for p in parts], dim=1) for key in parts[0]}


def _replay_anchor_chunk(target: TargetModel, drafter: DSparkDrafter, input_ids: torch.Tensor,
                         captured: torch.Tensor, kvs: list, anchors: torch.Tensor, temperature: float = 0.0,
                         generator: torch.Generator | None = None, keep_logits: bool = False
                         ) -> dict[str, torch.Tensor]:
    gamma = drafter.block_size
    device = input_ids.device
    hidden = drafter.block_hidden(captured, input_ids, anchors, target.embed)
    n, a = anchors.shape
    anchor_ids = input_ids.gather(1, anchors)
    if temperature > 0.0:
        def sample_fn(logits: torch.Tensor, k: int) -> torch.Tensor:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    else:
        def sample_fn(logits: torch.Tensor, k: int) -> torch.Tensor:
            return logits.argmax(-1)
    drafted = drafter.draft(hidden.reshape(n * a, gamma, -1), anchor_ids.reshape(-1), target.lm_head_weight,
                            sample_fn)
    tokens = drafted.tokens.view(n, a, gamma)
    block_ids = torch.cat((anchor_ids[..., None], tokens[..., : gamma - 1]), dim=-1)
    verify_hidden = target_verify_forward(target, kvs, block_ids, anchors)
    target_logits = target.compute_logits(verify_hidden.reshape(n * a * gamma, -1))
    if temperature > 0.0:
        flat = tokens.reshape(-1, 1)
        log_p = torch.log_softmax(target_logits.float() / temperature, dim=-1).gather(-1, flat)
        log_q = torch.log_softmax(drafted.logits.reshape(n * a * gamma, -1).float() / temperature,
                                  dim=-1).gather(-1, flat)
        keep = torch.exp(torch.clamp(log_p - log_q, max=0.0)).view(n, a, gamma)
        accepted = torch.rand(keep.shape, generator=generator, device=device) < keep
    else:
        accepted = tokens == target_logits.argmax(-1).view(n, a, gamma)
    conf = (drafted.confidence_logits.view(n, a, gamma).float() if drafted.confidence_logits is not None
            else torch.zeros(n, a, gamma, device=device))
    out = {"tokens": tokens, "accepted": accepted, "conf_logits": conf,
           # the drafter's own confidence in each token it drafted (its argmax)
           # (dspark.sampling.top_probability: the engine's draft stage computes it the same way)
           "draft_max_prob": top_probability(drafted.logits).view(n, a, gamma),
           # the gap between its two largest logits: a confidence that needs no softmax over the vocabulary
           # (dspark.sampling.top_gap: the argmax kernel's gap_out gives the same values in its own pass)
           "draft_top_gap": top_gap(drafted.logits).view(n, a, gamma)}
    if keep_logits:
        out["draft_logits"] = drafted.logits.reshape(n, a, gamma, -1).float()
        out["target_logits"] = target_logits.reshape(n, a, gamma, -1).float()
    return out


@torch.no_grad()
def replay_block_acceptance(target: TargetModel, drafter: DSparkDrafter, dataset: TokenDataset, *, max_len: int = 1024,
                            anchors_per_seq: int | None = 16, batch_size: int = 8, seed: int = 0, pad_id: int = 0,
                            progress: bool = False, anchor_stride: int = 1, anchor_chunk: int | None = None,
                            temperature: float = 0.0) -> dict[str, torch.Tensor]:
    """:func:`replay_blocks` at up to ``anchors_per_seq`` seeded anchors of every sequence; greedy, or with
    ``temperature`` > 0 sampled drafts and rejection-sampling verification (seeded by ``seed``).

    Anchors a lie in [response_start-1, length-1] (verification needs only the prefix), every
    ``anchor_stride``-th position from response_start-1 on; ``anchors_per_seq=None`` takes all
    of them. ``batch_size`` sequences share one context pass and ``anchor_chunk`` anchors per
    sequence share one draft + verify pass, which bounds memory however many anchors there are.
    Returns float32 ``conf_logits`` [M, G] (raw z_k of the drafted tokens), float32
    ``draft_top_gap`` [M, G] (the gap between the drafter's two largest logits at each slot: a confidence with no
    softmax), ``draft_max_prob`` [M, G] (the drafter's softmax probability of each drafted token, its argmax: the
    confidence a head-free estimate has), float32 ``accepted`` [M, G], ``accept_length`` [M] (accepted prefix
    + 1 bonus), and int64
    ``seq_index`` [M] / ``anchor`` [M] (the dataset row and the position of each block's anchor)
    over the M blocks, in dataset order.
    """
    from tqdm.auto import tqdm

    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = next(drafter.parameters()).device
    gamma = drafter.block_size
    was_training = drafter.training
    drafter.eval()
    conf_all, acc_all, seq_all, anchor_all, prob_all, gap_all = [], [], [], [], [], []
    starts = range(0, len(dataset), batch_size)
    draws = torch.Generator(device=device).manual_seed(int(seed) + 1) if temperature > 0 else None
    what = "greedy replay" if temperature == 0 else f"replay sampled at T={temperature:g}"
    try:
        for i, start in enumerate(tqdm(starts, desc=what, unit="batch", disable=not progress)):
            rows = list(range(start, min(start + batch_size, len(dataset))))
            batch = make_batch(dataset, rows, max_len, pad_id)
            anchors, valid = sample_anchors(batch.lengths + 1, batch.response_starts, anchors_per_seq, gamma,
                                            step_generator(seed, i, salt=1), require_full_block=False,
                                            stride=anchor_stride)
            if not bool(valid.any()):
                continue
            out = replay_blocks(target, drafter, batch.input_ids.to(device), anchors.to(device),
                                anchor_chunk=anchor_chunk, temperature=temperature, generator=draws)
            valid_dev = valid.to(device)
            conf_all.append(out["conf_logits"][valid_dev].float().cpu())
            acc_all.append(out["accepted"][valid_dev].float().cpu())
            prob_all.append(out["draft_max_prob"][valid_dev].float().cpu())
            gap_all.append(out["draft_top_gap"][valid_dev].float().cpu())
            seq_all.append(torch.tensor(rows, dtype=torch.int64)[:, None].expand(valid.shape)[valid])
            anchor_all.append(anchors[valid])
    finally:
        drafter.train(was_training)
    if not conf_all:
        raise ValueError(f"no sequence of the {len(dataset)} given has a response position to anchor a block at")
    conf_logits = torch.cat(conf_all)
    accepted = torch.cat(acc_all)
    accept_length = torch.cumprod(accepted, dim=-1).sum(-1) + 1.0
    return {"conf_logits": conf_logits, "accepted": accepted, "accept_length": accept_length,
            "seq_index": torch.cat(seq_all), "anchor": torch.cat(anchor_all), "draft_max_prob": torch.cat(prob_all),
            "draft_top_gap": torch.cat(gap_all)}


__all__ = ["DrafterTrainer", "TrainConfig", "block_labels", "complete_checkpoints", "dense_target_forward",
           "expected_accept_length", "gather_positions", "replay_block_acceptance", "load_tensor_shards",
           "lr_lambda_factory", "replay_blocks", "sample_anchors", "save_tensor_shards", "target_verify_forward"]
