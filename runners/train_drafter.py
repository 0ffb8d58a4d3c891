"""Train a DSpark (or DFlash-style ablation) drafter for the target on regenerated data.

    python -m runners.train_drafter data=training_data/train.safetensors train.output_dir=runs/dspark
    python -m runners.train_drafter ... train.device=cuda train.batch_size=32        # on the H200
    python -m runners.train_drafter ... resume=true                                   # continue the run
    python -m runners.train_drafter ... style=dflash                                  # ablation

``style=dflash`` trains the same backbone the same way without the Markov head
(markov_rank 0) and without the confidence head. Checkpoints go to
``train.output_dir/checkpoint-NNNNNNN/`` (loadable as drafters); the final drafter alone
is also written to ``train.output_dir/final/``. A Ctrl-C stops after the step in progress with a
checkpoint of it (``resume=true`` continues). ``data_holdout_fraction`` > 0 keeps a
seeded part of the data out of training for ``runners.calibrate`` (same fraction and seed).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from dspark.config import ConfigError, DrafterConfig
from dspark.models.drafter import DSparkDrafter
from dspark.models.llama import TargetModel
from dspark.training.data import TokenDataset
from dspark.training.trainer import DrafterTrainer, TrainConfig, complete_checkpoints, shard_data_budget
from runners.hydra_main import runner_main
from runners.schema import ModelSchema

STYLES = ("dspark", "dflash")

log = logging.getLogger(__name__)


@dataclass
class DrafterArchSchema:
    """drafter_arch: the drafter's architecture (dspark.config.DrafterConfig, which checks the values)."""
    block_size: int = 7  # gamma: tokens drafted per step (1 to 32); the anchor slot predicts the first
    num_layers: int = 2  # draft decoder layers (>= 1)
    # 0-based target decoder layers whose outputs, concatenated per position, feed the drafter (each in
    # [0, the target's layer count))
    target_layer_ids: List[int] = field(default_factory=lambda: [2, 15, 27])
    markov_rank: int = 64  # rank r of the Markov head (W1: vocab x r, W2: r x vocab); 0: no Markov head
    # the Markov head's bias from the previous token: vanilla (W2(W1[x])) | gated (that bias scaled by a
    # learned sigmoid gate) | rnn (a gated recurrent state carried across the block's slots)
    markov_variant: str = "vanilla"
    # a confidence head estimating each drafted token's probability of acceptance (trimmed verification reads it,
    # runners.calibrate calibrates it)
    use_confidence_head: bool = True
    intermediate_size: Optional[int] = None  # the draft layers' MLP width; null: the target's
    mask_token_id: Optional[int] = None  # the block's mask slots take this token's embedding; null: a learned embedding


@dataclass
class TrainSchema:
    """train: the optimisation (dspark.training.trainer.TrainConfig, which checks the values)."""
    # where checkpoint-NNNNNNN/ folders, train_log.jsonl, run_config.json and the final drafter (final/) go
    output_dir: str = "runs/drafter"
    max_steps: int = 2000  # optimizer steps of the run; the learning-rate schedule ends here
    batch_size: int = 16  # sequences per step
    # tokens per sequence at most (>= 2); a longer sequence is cropped to a window that keeps its last
    # max_len/4 prompt tokens. Train at the context lengths the drafter will serve: positions further
    # apart than any it trained on break its attention (long tool-calling prompts)
    max_len: int = 2048
    # > 1: each batch comes from a chunk of this many batches sorted by length, so a batch pads only to
    # sequences like its own (every sequence still once per epoch); 1: plain shuffled batches
    bucket_batches: int = 16
    anchors_per_seq: int = 32  # drafted blocks per sequence per step, at seeded anchors in the response
    # anchors only where every label of the block lies inside the sequence (a shorter response falls
    # back to partial blocks, their missing labels masked)
    require_full_block: bool = True
    lr: float = 6e-4  # AdamW's peak learning rate, reached after the warm-up
    min_lr_ratio: float = 0.1  # the cosine decay ends at lr x this at max_steps (0 to 1)
    warmup_steps: int = 100  # steps of linear warm-up from 0 to lr
    weight_decay: float = 0.01  # AdamW weight decay of the weight matrices (none on biases, norms, mask embedding)
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW's (beta1, beta2), each in [0, 1)
    grad_clip: float = 1.0  # clip the gradients' global L2 norm to this (> 0)
    ce_weight: float = 0.1  # loss weight of the cross-entropy against the target's own response tokens
    tv_weight: float = 0.9  # loss weight of the L1 distance between the drafter's and the target's distributions
    # loss weight of the confidence head's BCE against its label (train.conf_target); its gradient also reaches
    # the drafter through the head's inputs, unless train.head_only or train.conf_stop_grad
    conf_weight: float = 1.0
    # the confidence head's label: analytical (1 - the total variation of the drafter's and the target's
    # distributions: a sampled draft's acceptance, the paper's) | greedy (whether the drafter's top token is the
    # target's: what T=0 verification accepts)
    conf_target: str = "analytical"
    # train the confidence head alone (every other weight frozen, CE and TV only reported): a trained drafter's
    # head trained again, its drafts unchanged; needs init_from (or resume=true)
    head_only: bool = False
    # the confidence term trains the head alone while CE and TV train the rest: the head reads h_k and W1[x_{k-1}]
    # detached, so its gradient reaches neither the backbone nor the Markov head (style=dspark; conf_weight > 0)
    conf_stop_grad: bool = False
    # block position k's loss weight is exp(-(k-1) / position_decay) (> 0); null: drafter_arch.block_size
    position_decay: Optional[float] = 4.0
    seed: int = 0  # seeds the drafter's initial weights, the data order and every step's anchors
    device: str = "cpu"  # cpu, cuda or cuda:N
    # CUDA only: the frozen target in bfloat16 and the step under bf16 autocast (the drafter's weights stay
    # float32); CPU runs stay float32
    bf16_autocast: bool = True
    pad_id: int = 0  # the token id that right-pads a batch's shorter sequences
    save_every: int = 500  # steps between checkpoints (the last step also writes one)
    log_every: int = 10  # steps between lines of train_log.jsonl (the loss terms, grad norm, lr, acceptance)
    keep_last: int = 2  # checkpoints kept, older ones deleted; 0: all
    max_shard_bytes: int = 16 * 1024 * 1024  # the largest checkpoint file, in bytes; larger tensors are split
    progress: bool = True  # a progress bar over the steps
    # stop with a checkpoint after this many seconds (leased GPUs; the learning-rate schedule still follows
    # max_steps); null: no limit
    time_budget_s: Optional[float] = None
    # CUDA only: replay the frozen target's forward from CUDA graphs, one per batch shape (length rounded up to a
    # multiple of 128); the step is host-bound without them. A resumed run may switch it
    target_graphs: bool = False


@dataclass
class TrainDrafterSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    drafter_arch: DrafterArchSchema = field(default_factory=DrafterArchSchema)
    train: TrainSchema = field(default_factory=TrainSchema)
    data: Any = None  # a .safetensors file of runners.make_training_data, or a list of them (shards), joined in order
    # in (0, 1): keep this seeded fraction of the sequences out of training (runners.calibrate holdout_fraction
    # can use it); 0: train on all
    data_holdout_fraction: float = 0.0
    data_holdout_seed: int = 0  # seeds which sequences are held out
    # dspark | dflash (the ablation: no Markov head, no confidence head, trained the same way)
    style: str = "dspark"
    # continue from the last complete checkpoint in train.output_dir: style, drafter_arch and the train settings
    # must match it, but for output_dir, save_every, log_every, keep_last, progress, max_shard_bytes, time_budget_s
    resume: bool = False
    # start from these drafter weights, a folder or builtin:NAME, of the same architecture (fresh optimizer and
    # schedule); ignored with resume=true
    init_from: Optional[str] = None
    # with init_from: a deeper drafter (drafter_arch.num_layers above the checkpoint's, all else equal) starts from the
    # checkpoint's weights with its extra layers appended as identities (their attention and MLP output projections
    # zero), so it starts as the checkpoint's function; false: the architectures must be identical
    init_grow_layers: bool = False
    # with init_from: a vanilla Markov head of a higher rank (drafter_arch.markov_rank above the checkpoint's, all else
    # equal) starts from the checkpoint's: its first rank columns are the checkpoint's W1 and W2, the rest of W1 zero
    # and of W2 as initialised, and the confidence head reads the new W1 columns with weight zero, so it starts as
    # the checkpoint's function; with init_grow_layers both may grow at once
    init_grow_markov_rank: bool = False
    # with init_from and style=dflash: the ablation starts from a DSpark checkpoint (drafter_arch as the checkpoint's
    # but for the Markov and confidence heads), its backbone copied and both heads dropped, so that the two styles
    # continue from one stage's weights on the same data and steps
    init_drop_heads: bool = False
    # with init_from and drafter_arch.markov_variant=rnn: the recurrent Markov head starts from a checkpoint's vanilla
    # head of the same rank (all else equal), so that it starts as nearly the checkpoint's function: W1 and the
    # confidence head as the checkpoint's, the cell's output rows read W1[x] alone (RNN_INIT_SCALE times the identity,
    # the state and the hidden state at weight zero), W2 the checkpoint's divided by that scale; bias = W2(tanh(o))
    # then differs from the checkpoint's W2(W1[x]) only by tanh's curvature, and the state's weights train from zero
    init_rnn_from_vanilla: bool = False
    # stop at this step, before train.max_steps, with a checkpoint (resume=true continues) and the drafter in final/
    # (an ablation stopped at another run's step count); null: train.max_steps
    stop_at_step: Optional[int] = None


ConfigStore.instance().store(name="train_drafter_schema", node=TrainDrafterSchema)


def drafter_config_from(cfg: Any) -> DrafterConfig:
    """DrafterConfig from ``cfg.drafter_arch`` with the ``style`` switch applied."""
    style = cfg.style
    if style not in STYLES:
        raise ConfigError(f"style: {style!r} not in {list(STYLES)}")
    arch = OmegaConf.to_container(cfg.drafter_arch, resolve=True) if isinstance(cfg.drafter_arch, DictConfig) \
        else dict(cfg.drafter_arch)
    if style == "dflash":
        arch["markov_rank"] = 0
        arch["use_confidence_head"] = False
    return DrafterConfig.from_dict(arch)


def train_config_from(cfg: Any) -> TrainConfig:
    d = OmegaConf.to_container(cfg.train, resolve=True) if isinstance(cfg.train, DictConfig) else dict(cfg.train)
    d["betas"] = tuple(d["betas"])
    return TrainConfig.from_dict(d)


def load_training_data(cfg: Any) -> TokenDataset:
    if not cfg.data:
        raise ConfigError("data: give the training data file, e.g. data=training_data/train.safetensors "
                          "(make it with `python -m runners.make_training_data`)")
    dataset = TokenDataset.load_many(cfg.data)
    if cfg.data_holdout_fraction:
        dataset, _ = dataset.split_holdout(float(cfg.data_holdout_fraction), int(cfg.data_holdout_seed))
    return dataset


def load_target_and_tokenizer(cfg: Any):
    """(TargetModel, Tokenizer) named by cfg.model (the packaged SmolLM2 or a local HF folder)."""
    from dspark.models.loading import load_target

    return load_target(cfg.model.source, cache_dir=cfg.model.cache_dir)


def init_weights(drafter: DSparkDrafter, path: str, target: TargetModel, grow_layers: bool = False,
                 grow_markov_rank: bool = False, drop_heads: bool = False, rnn_from_vanilla: bool = False) -> None:
    """Copy a saved drafter's weights into ``drafter``; the architectures must be identical, or differ only in
    ``drafter`` having more layers (``grow_layers``) or a vanilla Markov head of a higher rank
    (``grow_markov_rank``). Grown, the drafter computes what the checkpoint did: each extra layer starts as an
    identity on the residual stream (attention and MLP output projections zero, the rest as initialised); the
    head's extra rank columns of W1 and the confidence head's weights on them start at zero while W2's keep their
    initialisation, so the bias and the confidence are the checkpoint's and W1 still has a gradient. W1's rows of
    tokens training never shows stay zero, which the shipped bf16 shards compress away.

    ``drop_heads``: ``drafter`` is a DFlash-style ablation (no Markov head, no confidence head) of the checkpoint's
    architecture otherwise; it gets every weight of the checkpoint but the two heads'.

    ``rnn_from_vanilla``: ``drafter`` has an rnn Markov head where the checkpoint has a vanilla one of the same rank,
    all else equal; see :func:`_rnn_from_vanilla`."""
    from runners.common import resolve_drafter_path

    source = DSparkDrafter.load(resolve_drafter_path(path, key="init_from"), target.cfg, device="cpu", dtype=torch.float32)
    want, got = drafter.cfg.to_dict(), source.cfg.to_dict()
    diff = {k: (got.get(k), want.get(k)) for k in set(want) | set(got) if want.get(k) != got.get(k)}
    if drop_heads:
        _drop_heads(drafter, source, path, diff, grow=grow_layers or grow_markov_rank or rnn_from_vanilla)
        return
    if rnn_from_vanilla:
        _rnn_from_vanilla(drafter, source, path, diff, grow=grow_layers or grow_markov_rank)
        return
    growable = {k for k, on in (("num_layers", grow_layers), ("markov_rank", grow_markov_rank)) if on}
    grows = bool(diff) and set(diff) <= growable and all(want[k] > got[k] for k in diff)
    if grows and "markov_rank" in diff and (got["markov_variant"] != "vanilla" or got["markov_rank"] < 1):
        raise ConfigError(f"init_grow_markov_rank: grows a vanilla Markov head of rank >= 1; the checkpoint {path!r} "
                          f"has a {got['markov_variant']} head of rank {got['markov_rank']}")
    if diff and not grows:
        switch = {"num_layers": "init_grow_layers", "markov_rank": "init_grow_markov_rank"}
        hint = (f" ({' / '.join(switch[k] + '=true' for k in sorted(growable))} grows only "
                f"{' and '.join(sorted(growable))}, to more than the checkpoint's)" if growable else "")
        raise ConfigError(f"init_from={path!r}: its architecture differs from drafter_arch/style "
                          f"(key: (checkpoint, configured)): {diff}{hint}")
    if not grows:
        drafter.load_state_dict(source.state_dict())
        return
    state = drafter.state_dict()
    old = source.state_dict()
    r0, r1 = got["markov_rank"], want["markov_rank"]
    for name, tensor in old.items():
        if r1 > r0 and name in ("markov_head.w1.weight", "markov_head.w2.weight"):
            # W1 [V, r] starts its extra columns at zero; W2 [V, r] (Linear(r, V)) keeps them as initialised
            if name.endswith("w1.weight"):
                state[name][:, r0:].zero_()
            state[name][:, :r0] = tensor
        elif r1 > r0 and name == "confidence_head.weight":  # [1, d + r]: the hidden state, then W1[x]
            state[name].zero_()
            state[name][:, :tensor.shape[1]] = tensor
        else:
            state[name] = tensor  # the checkpoint's layers as the first ones
    for i in range(got["num_layers"], want["num_layers"]):
        state[f"layers.{i}.self_attn.o_proj.weight"].zero_()
        state[f"layers.{i}.mlp.down_proj.weight"].zero_()
    drafter.load_state_dict(state)
    log.info("init_from=%s: grown %s", path,
             ", ".join(f"{k} from {a} to {b}" for k, (a, b) in sorted(diff.items())))


def _drop_heads(drafter: DSparkDrafter, source: DSparkDrafter, path: str, diff: dict, grow: bool) -> None:
    """``init_weights(drop_heads=True)``: ``source``'s weights but its Markov and confidence heads' into the
    head-less ``drafter``, refused unless the two differ in those heads alone (and the source has both)."""
    if grow:
        raise ConfigError("init_drop_heads: drops the heads of the checkpoint's architecture; it does not combine "
                          "with init_grow_layers or init_grow_markov_rank")
    if drafter.markov_head is not None or drafter.confidence_head is not None:
        raise ConfigError("init_drop_heads: starts a DFlash-style ablation (style=dflash: no Markov head, no "
                          "confidence head) from a DSpark checkpoint; this drafter has a head")
    if source.markov_head is None or source.confidence_head is None:
        raise ConfigError(f"init_drop_heads: init_from={path!r} has no Markov or no confidence head to drop (a "
                          f"DFlash-style checkpoint starts an ablation without init_drop_heads)")
    others = {k: v for k, v in diff.items() if k not in ("markov_rank", "markov_variant", "use_confidence_head")}
    if others:
        raise ConfigError(f"init_drop_heads: init_from={path!r} differs from drafter_arch in more than its heads "
                          f"(key: (checkpoint, configured)): {others}")
    kept = drafter.state_dict()
    old = source.state_dict()
    dropped = sorted(k for k in old if k not in kept)
    assert all(k.startswith(("markov_head.", "confidence_head.")) for k in dropped), dropped
    drafter.load_state_dict({k: old[k] for k in kept})
    log.info("init_from=%s: backbone copied, heads dropped (%s)", path, ", ".join(dropped))


RNN_INIT_SCALE = 0.25  # init_rnn_from_vanilla: o = this x W1[x] (tanh nearly linear there), W2 / this


def _rnn_from_vanilla(drafter: DSparkDrafter, source: DSparkDrafter, path: str, diff: dict, grow: bool) -> None:
    """``init_weights(rnn_from_vanilla=True)``: ``source``'s weights into ``drafter``, whose rnn Markov head starts
    from ``source``'s vanilla one. The cell reads z = [s; W1[x]; h]; its output rows get RNN_INIT_SCALE times the
    identity on the W1[x] columns and zero elsewhere (bias included), so o = a W1[x] and bias = (W2 / a)(tanh(a W1[x])),
    which is the vanilla bias up to tanh's curvature (a relative error under (a W1[x])^2 / 3 per component). The
    gate and candidate rows keep their initialisation: the state they make is read by the output rows with weight
    zero at first, and trains from there. Refused unless the two differ in the head's variant alone."""
    if grow:
        raise ConfigError("init_rnn_from_vanilla: starts an rnn Markov head from the checkpoint's vanilla one of the "
                          "same architecture; it does not combine with init_grow_layers or init_grow_markov_rank")
    if diff != {"markov_variant": ("vanilla", "rnn")} or drafter.markov_head is None:
        raise ConfigError(f"init_rnn_from_vanilla: needs drafter_arch.markov_variant=rnn and a checkpoint with a "
                          f"vanilla Markov head, all else equal (key: (checkpoint, configured)); init_from={path!r} "
                          f"differs in {diff or 'nothing'}")
    r = drafter.markov_head.rank
    state = drafter.state_dict()
    old = source.state_dict()
    for name, tensor in old.items():
        state[name] = tensor / RNN_INIT_SCALE if name == "markov_head.w2.weight" else tensor
    cell_w, cell_b = state["markov_head.cell.weight"], state["markov_head.cell.bias"]  # [3r, 2r + d], [3r]: g, c, o
    cell_w[2 * r:].zero_()
    cell_w[2 * r:, r: 2 * r] = RNN_INIT_SCALE * torch.eye(r, dtype=cell_w.dtype)
    cell_b[2 * r:].zero_()
    drafter.load_state_dict(state)
    log.info("init_from=%s: rnn Markov head from the checkpoint's vanilla one (output rows %.2f x W1[x], W2 / %.2f)",
             path, RNN_INIT_SCALE, RNN_INIT_SCALE)


def run(cfg: Any, target: TargetModel | None = None) -> dict[str, Any]:
    """Train as configured; ``target`` overrides loading cfg.model (tests pass a tiny one)."""
    from runners.common import writable_folder
    from runners.schema import check_device_present

    train_cfg = train_config_from(cfg)
    drafter_cfg = drafter_config_from(cfg)
    check_device_present(str(cfg.train.device), "train.device")
    if cfg.stop_at_step is not None and int(cfg.stop_at_step) < 1:
        raise ConfigError(f"stop_at_step: the step to stop at with a checkpoint, >= 1 (or null: train.max_steps); "
                          f"got {cfg.stop_at_step}")
    if train_cfg.head_only and not cfg.get("init_from") and not cfg.resume:
        raise ConfigError("train.head_only trains the confidence head of a trained drafter with its other weights "
                          "frozen: give init_from=DRAFTER (e.g. builtin:dspark-smollm2), or resume=true")
    if cfg.get("init_drop_heads") and (cfg.style != "dflash" or not cfg.get("init_from")):
        raise ConfigError(f"init_drop_heads: starts the DFlash ablation (style=dflash) from a DSpark checkpoint "
                          f"(init_from); got style={cfg.style}, init_from={cfg.get('init_from')}")
    if cfg.get("init_rnn_from_vanilla") and (cfg.style != "dspark" or not cfg.get("init_from")):
        raise ConfigError(f"init_rnn_from_vanilla: starts DSpark's rnn Markov head (style=dspark) from a checkpoint's "
                          f"vanilla one (init_from); got style={cfg.style}, init_from={cfg.get('init_from')}")
    for key in ("head_only", "conf_stop_grad"):
        if getattr(train_cfg, key) and cfg.style != "dspark":
            raise ConfigError(f"train.{key}: style={cfg.style} has no confidence head to train; use style=dspark")
    writable_folder(train_cfg.output_dir, "train.output_dir")  # before the data and the model load
    dataset = load_training_data(cfg)
    if target is None:
        target, _ = load_target_and_tokenizer(cfg)
    out = Path(train_cfg.output_dir)
    existing = complete_checkpoints(out)
    if existing and not cfg.resume:
        raise ConfigError(f"train.output_dir {str(out)!r} already holds checkpoints ({existing[-1].name}); set "
                          f"resume=true to continue that run or choose another train.output_dir")
    torch.manual_seed(train_cfg.seed)
    drafter = DSparkDrafter(target.cfg, drafter_cfg)
    init_from, grow = cfg.get("init_from"), bool(cfg.get("init_grow_layers", False))
    grow_rank = bool(cfg.get("init_grow_markov_rank", False))
    drop = bool(cfg.get("init_drop_heads", False))
    to_rnn = bool(cfg.get("init_rnn_from_vanilla", False))
    if init_from and not cfg.resume:
        init_weights(drafter, init_from, target, grow_layers=grow, grow_markov_rank=grow_rank, drop_heads=drop,
                     rnn_from_vanilla=to_rnn)
    extra = {"init_from": init_from, "init_grow_layers": grow, "init_grow_markov_rank": grow_rank,
             "init_drop_heads": drop, "init_rnn_from_vanilla": to_rnn,
             "style": cfg.style, "data": str(cfg.data), "data_holdout_fraction": float(cfg.data_holdout_fraction),
             "data_holdout_seed": int(cfg.data_holdout_seed)}
    trainer = DrafterTrainer(target, drafter, dataset, train_cfg, extra_state=extra)
    resumed_from = None
    if cfg.resume:
        resumed_from = str(trainer.resume_latest())
        if trainer.extra_state.get("style") != cfg.style:
            raise ConfigError(f"cannot resume: the checkpoint was trained with style={trainer.extra_state.get('style')}, "
                              f"now style={cfg.style}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "run_config.json").write_text(json.dumps(
        {"train": train_cfg.to_dict(), "drafter": drafter_cfg.to_dict(), **extra}, indent=2) + "\n")
    metrics = trainer.train(until_step=cfg.stop_at_step)
    summary: dict[str, Any] = {
        "output_dir": str(out.resolve()),
        "style": cfg.style,
        "step": trainer.step,
        "max_steps": train_cfg.max_steps,
        "resumed_from": resumed_from,
        "drafter_parameters": drafter.num_parameters(),
        "data": dataset.summary(),
        "last_metrics": metrics,
    }
    stopped_by_budget = "stopped_by_time_budget" in trainer.extra_state
    stopped_at_step = cfg.stop_at_step is not None and trainer.step >= int(cfg.stop_at_step)
    summary["stopped_by_time_budget"] = stopped_by_budget
    summary["stopped_at_step"] = stopped_at_step
    if trainer.step >= train_cfg.max_steps or stopped_by_budget or stopped_at_step:
        # A run stopped early (time budget, stop_at_step) is still a usable drafter: its step count is in the
        # summary, and a resumed run writes final/ again when it ends.
        final = trainer.drafter.save(out / "final", max_shard_bytes=shard_data_budget(train_cfg.max_shard_bytes))
        summary["final_drafter"] = str(final.resolve())
    summary["checkpoint"] = str(complete_checkpoints(out)[-1].resolve()) if complete_checkpoints(out) else None
    return summary


@runner_main("train_drafter")
def main(cfg: DictConfig) -> None:
    print(json.dumps(run(cfg), indent=2))


if __name__ == "__main__":
    main()
