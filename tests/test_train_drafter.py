"""Drafter training pipeline on a tiny random target (CPU, seconds).

Covers the data file, the dense target passes the trainer relies on, anchors/labels,
that training lowers the loss and raises realised greedy acceptance, checkpoint round
trips (sharded optimizer state), exact resume, and the four runners (through Hydra's
compose API where a runner has a config).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from dspark.attention import AttentionMetadata
from dspark.config import ConfigError, SamplingParams
from dspark.engine import Engine
from dspark.kv_cache import KVCache
from dspark.models.drafter import DSparkDrafter
from dspark.training.data import (DataError, TokenDataset, batch_indices, crop_window, epoch_permutation,
                                  make_batch)
from dspark.training.trainer import (DrafterTrainer, TrainConfig, block_labels, complete_checkpoints,
                                     dense_target_forward, replay_block_acceptance, load_tensor_shards,
                                     replay_blocks, sample_anchors, save_tensor_shards, target_verify_forward)
from tiny import tiny_drafter, tiny_engine_config, tiny_target

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = str(REPO / "conf")
TARGET_SCALE = 2.0  # greedy runs are varied (a few distinct tokens per sequence) yet learnable


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_target(scale=TARGET_SCALE)


@pytest.fixture(scope="module")
def greedy_data(target) -> TokenDataset:
    """Sequences generated greedily by the tiny target: predictable, so a drafter can learn them."""
    engine = Engine(target, None, tiny_engine_config(spec="off", max_num_seqs=16))
    gen = torch.Generator().manual_seed(123)
    prompts = [torch.randint(3, 97, (int(torch.randint(3, 7, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(24)]
    outs = engine.generate(prompts, SamplingParams(max_tokens=28, ignore_eos=True))
    assert all(o.error is None for o in outs)
    return TokenDataset.from_sequences([o.prompt_token_ids + o.token_ids for o in outs],
                                       [len(o.prompt_token_ids) for o in outs],
                                       ["even" if i % 2 == 0 else "odd" for i in range(len(outs))],
                                       info={"split": "train"})


def small_train_config(tmp_path, **kw) -> TrainConfig:
    base = dict(output_dir=str(tmp_path / "run"), max_steps=40, batch_size=6, max_len=40, anchors_per_seq=6,
                lr=1e-2, warmup_steps=4, save_every=1000, log_every=5, progress=False, seed=0)
    base.update(kw)
    return TrainConfig(**base)


# ------------------------------------------------------------------------------ data


def test_data_file_round_trip_and_selection(tmp_path, greedy_data):
    path = greedy_data.save(tmp_path / "data.safetensors")
    loaded = TokenDataset.load(path)
    assert len(loaded) == len(greedy_data) == 24
    assert torch.equal(loaded.tokens, greedy_data.tokens) and loaded.tokens.dtype == torch.int32
    assert torch.equal(loaded.offsets, greedy_data.offsets)
    assert torch.equal(loaded.prompt_lens, greedy_data.prompt_lens)
    assert [loaded.source(i) for i in range(4)] == ["even", "odd", "even", "odd"]
    assert loaded.info == {"split": "train"}
    assert loaded.summary()["per_source"] == {"even": 12, "odd": 12}

    kept, held = loaded.split_holdout(0.25, seed=3)
    assert len(held) == 6 and len(kept) == 18
    kept_seqs = {tuple(kept.sequence(i).tolist()) for i in range(len(kept))}
    held_seqs = {tuple(held.sequence(i).tolist()) for i in range(len(held))}
    assert not kept_seqs & held_seqs
    again, _ = loaded.split_holdout(0.25, seed=3)
    assert torch.equal(again.tokens, kept.tokens)

    with pytest.raises(DataError, match="prompt length"):
        TokenDataset.from_sequences([[5, 6, 7]], [3], ["x"])
    with pytest.raises(DataError, match=".safetensors"):
        loaded.save(tmp_path / "data.pt")
    with pytest.raises(FileNotFoundError, match="make_training_data"):
        TokenDataset.load(tmp_path / "missing.safetensors")


def test_batches_crop_and_order():
    ds = TokenDataset.from_sequences([list(range(10, 60)), [7, 8, 9]], [30, 2], ["a", "b"])
    batch = make_batch(ds, [0, 1], max_len=16, pad_id=0)
    assert batch.input_ids.shape == (2, 16)
    start = crop_window(50, 30, 16)
    assert start == 30 - 4
    assert batch.input_ids[0].tolist() == list(range(10 + start, 10 + start + 16))
    assert batch.response_starts.tolist() == [4, 2] and batch.lengths.tolist() == [16, 3]
    assert batch.input_ids[1].tolist()[3:] == [0] * 13

    # Data order: a pure function of (seed, step); each epoch visits every sequence once.
    steps = [batch_indices(10, 4, s, seed=5) for s in range(5)]
    flat = [i for b in steps for i in b]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    assert flat[:10] == epoch_permutation(10, 5, 0).tolist()
    assert steps[3] == batch_indices(10, 4, 3, seed=5)
    assert batch_indices(10, 4, 0, seed=6) != steps[0]


def test_length_bucketed_batches_pad_little_and_still_visit_every_sequence_once_per_epoch():
    lengths = torch.randint(10, 2000, (103,), generator=torch.Generator().manual_seed(1))
    n, size = 103, 8
    steps = [batch_indices(n, size, s, seed=3, lengths=lengths, bucket_batches=4) for s in range(3 * n // size)]
    flat = [i for b in steps for i in b]
    for epoch in range(2):  # 103 is no multiple of 8: later epochs begin inside a batch
        assert sorted(flat[epoch * n: (epoch + 1) * n]) == list(range(n))
    assert steps[7] == batch_indices(n, size, 7, seed=3, lengths=lengths, bucket_batches=4)  # pure
    orders: dict = {}  # a caller's cache of epoch orders gives the same batches
    assert [batch_indices(n, size, s, seed=3, lengths=lengths, bucket_batches=4, orders=orders)
            for s in range(3 * n // size)] == steps
    assert sorted(orders) == [0, 1, 2]
    # Padding: a batch's spread of lengths is far below a shuffled batch's (the straddling batches excepted).
    spread = [int(lengths[b].max() - lengths[b].min()) for b in steps]
    plain = [int(lengths[b].max() - lengths[b].min()) for b in (batch_indices(n, size, s, seed=3) for s in range(36))]
    assert sorted(spread)[len(spread) // 2] < sorted(plain)[len(plain) // 2] / 3
    # Epoch 1 begins inside a batch; its groups line up with the batches after that one.
    later = [spread[s] for s in range(n // size + 1, 2 * n // size)]
    assert sorted(later)[len(later) // 2] < sorted(plain)[len(plain) // 2] / 3
    with pytest.raises(DataError, match="one length per sequence"):
        batch_indices(n, size, 0, seed=3, lengths=lengths[:5], bucket_batches=4)
    with pytest.raises(DataError, match="bucket_batches"):
        batch_indices(n, size, 0, seed=3, lengths=lengths, bucket_batches=0)


# ------------------------------------------------------------------------------ dense passes


def test_dense_target_forward_matches_paged_forward(target):
    ids = torch.randint(3, 97, (2, 21), generator=torch.Generator().manual_seed(0))
    hidden, captured, kvs = dense_target_forward(target, ids, (0, 2), return_kv=True)
    assert captured.shape == (2, 21, 2 * 64) and len(kvs) == 4
    for b in range(2):
        cache = KVCache(4, 4, 8, 2, 16, torch.float32, "cpu")
        meta = AttentionMetadata(torch.tensor([0, 21], dtype=torch.int32), torch.tensor([21], dtype=torch.int32),
                                 torch.tensor([[0, 1, 2, 3]], dtype=torch.int32), torch.arange(21), True)
        with torch.no_grad():
            h_paged, cap_paged = target(ids[b], torch.arange(21), cache, meta, capture_layers=(0, 2))
        torch.testing.assert_close(hidden[b], h_paged, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(captured[b], cap_paged, atol=2e-4, rtol=2e-4)


def test_verify_forward_equals_forward_over_the_drafted_sequence(target):
    """Block rows see the true prefix < a and their own block causally: same as running the target
    on prefix + [anchor, d_1..] as one sequence."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 97, (1, 16), generator=gen)
    anchors = torch.tensor([[5, 11]])
    drafts = torch.randint(3, 97, (1, 2, 3), generator=gen)
    block_ids = torch.cat((ids.gather(1, anchors)[..., None], drafts), dim=-1)  # G = 4
    with torch.no_grad():
        _, _, kvs = dense_target_forward(target, ids, return_kv=True)
        got = target_verify_forward(target, kvs, block_ids, anchors)
        for j, a in enumerate(anchors[0].tolist()):
            seq = torch.cat((ids[0, :a], block_ids[0, j]))[None]
            ref, _, _ = dense_target_forward(target, seq)
            torch.testing.assert_close(got[0, j], ref[0, a:a + 4], atol=2e-4, rtol=2e-4)


def test_anchors_and_labels():
    lengths = torch.tensor([20, 9, 4])
    starts = torch.tensor([5, 4, 3])
    anchors, valid = sample_anchors(lengths, starts, 6, 4, torch.Generator().manual_seed(0))
    # row 0: full blocks a in [4, 15]; row 1: [3, 4] (2 candidates); row 2: response shorter than a
    # block, partial range [2, 2] (the last token has nothing after it to predict)
    assert valid.sum(1).tolist() == [6, 2, 1]
    assert bool(((anchors[0] >= 4) & (anchors[0] <= 15)).all())
    assert sorted(anchors[1, :2].tolist()) == [3, 4]
    assert anchors[2, :1].tolist() == [2] and not bool(valid[1, 2:].any())
    ids = torch.arange(100, 120).expand(3, 20).clone()
    labels, cell_valid, tpos = block_labels(ids, lengths, anchors, valid, 4)
    a = int(anchors[0, 0])
    assert labels[0, 0].tolist() == [100 + a + 1 + k for k in range(4)]
    assert tpos[0, 0].tolist() == [a + k for k in range(4)]
    # unused anchor slots carry no label
    assert labels[2, 1].tolist() == [-1] * 4 and not bool(cell_valid[2, 1].any())
    assert cell_valid[2, 0].tolist() == [True, False, False, False]
    assert not bool(cell_valid[1, 2:].any())


def test_sharded_tensor_files_round_trip(tmp_path):
    tensors = {"big": torch.randn(3000), "small": torch.arange(6, dtype=torch.int64).view(2, 3),
               "mat": torch.randn(40, 50)}
    save_tensor_shards(tensors, tmp_path, "opt", max_bytes=12_000)
    files = sorted(tmp_path.glob("opt-*.safetensors"))
    assert len(files) > 2 and all(f.stat().st_size <= 12_000 for f in files)
    back = load_tensor_shards(tmp_path, "opt")
    assert set(back) == set(tensors)
    for k in tensors:
        assert torch.equal(back[k], tensors[k]) and back[k].dtype == tensors[k].dtype


# ------------------------------------------------------------------------------ training


def test_training_lowers_loss_and_raises_greedy_acceptance(tmp_path, target, greedy_data):
    drafter = tiny_drafter(target, block_size=4)
    before = replay_block_acceptance(target, drafter, greedy_data, max_len=40, anchors_per_seq=6)
    trainer = DrafterTrainer(target, drafter, greedy_data, small_train_config(tmp_path))
    with torch.no_grad():
        loss_before = trainer.compute_loss(0)
    trainer.train()
    with torch.no_grad():
        loss_after = trainer.compute_loss(0)
    after = replay_block_acceptance(target, drafter, greedy_data, max_len=40, anchors_per_seq=6)
    assert float(loss_after.total) < 0.5 * float(loss_before.total)
    assert float(loss_after.per_position_acceptance[0]) > float(loss_before.per_position_acceptance[0])
    assert float(after["accept_length"].mean()) > float(before["accept_length"].mean()) + 1.0
    assert float(after["accepted"][:, 0].mean()) > 0.6
    # the target stays frozen and outside the drafter checkpoint
    assert all(not p.requires_grad for p in target.parameters())
    ckpt = complete_checkpoints(tmp_path / "run")[-1]
    assert ckpt.name == "checkpoint-0000040"
    names = set()
    for f in ckpt.glob("model*.safetensors"):
        from safetensors import safe_open

        with safe_open(str(f), "pt") as h:
            names |= set(h.keys())
    assert names == set(drafter.state_dict())
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [5, 10, 15, 20, 25, 30, 35, 40]
    assert len(log[-1]["per_position_acceptance"]) == 4


def test_dflash_ablation_trains_without_markov_or_confidence_head(tmp_path, target, greedy_data):
    from omegaconf import OmegaConf

    from runners.train_drafter import drafter_config_from

    cfg = OmegaConf.create({"style": "dflash", "drafter_arch": {"block_size": 4, "num_layers": 1,
                                                                "target_layer_ids": [0, 2], "markov_rank": 8}})
    dcfg = drafter_config_from(cfg)
    assert dcfg.markov_rank == 0 and not dcfg.use_confidence_head
    torch.manual_seed(0)
    drafter = DSparkDrafter(target.cfg, dcfg)
    trainer = DrafterTrainer(target, drafter, greedy_data, small_train_config(tmp_path, max_steps=12))
    with torch.no_grad():
        first = trainer.compute_loss(0)
    trainer.train()
    with torch.no_grad():
        last = trainer.compute_loss(0)
    assert float(first.conf_bce) == 0.0 and float(last.total) < float(first.total)
    with pytest.raises(ConfigError, match="style"):
        drafter_config_from(OmegaConf.create({"style": "medusa", "drafter_arch": {}}))


def test_checkpoint_round_trip_with_sharded_optimizer(tmp_path, target, greedy_data):
    cfg = small_train_config(tmp_path, max_steps=3, max_shard_bytes=60_000, keep_last=1)
    trainer = DrafterTrainer(target, tiny_drafter(target), greedy_data, cfg)
    trainer.train()
    ckpt = complete_checkpoints(cfg.output_dir)
    assert [c.name for c in ckpt] == ["checkpoint-0000003"]  # keep_last=1 pruned the rest
    files = [f for f in ckpt[0].rglob("*") if f.is_file()]
    assert all(f.stat().st_size <= 60_000 for f in files)
    assert len(list((ckpt[0] / "optimizer").glob("*.safetensors"))) > 1

    fresh = DrafterTrainer(target, tiny_drafter(target, seed=9), greedy_data, cfg)
    fresh.load_checkpoint(ckpt[0])
    assert fresh.step == 3
    for (name, p), q in zip(trainer.drafter.named_parameters(), fresh.drafter.parameters()):
        assert torch.equal(p, q), name
    sa, sb = trainer.optimizer.state_dict(), fresh.optimizer.state_dict()
    for idx in sa["state"]:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa["state"][idx][key], sb["state"][idx][key])
    assert fresh.scheduler.state_dict()["last_epoch"] == 3
    # the checkpoint folder is a loadable drafter too
    loaded = DSparkDrafter.load(ckpt[0], target.cfg)
    assert torch.equal(loaded.fc.weight, trainer.drafter.fc.weight)
    with pytest.raises(ConfigError, match="lr"):
        DrafterTrainer(target, tiny_drafter(target), greedy_data,
                       small_train_config(tmp_path, max_steps=3, lr=5e-3)).load_checkpoint(ckpt[0])


def compose_train(tmp_path: Path, data: Path, out: str, *extra: str):
    overrides = [f"data={data}", f"train.output_dir={tmp_path / out}", "drafter_arch.block_size=4",
                 "drafter_arch.num_layers=1", "drafter_arch.target_layer_ids=[0,2]", "drafter_arch.markov_rank=8",
                 "train.max_steps=6", "train.batch_size=4", "train.max_len=32", "train.anchors_per_seq=4",
                 "train.warmup_steps=2", "train.lr=2e-3", "train.save_every=2", "train.keep_last=0",
                 "train.progress=false", *extra]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="train_drafter", overrides=overrides)


def test_a_budget_stop_is_not_reported_by_the_call_that_resumes_to_the_end(tmp_path, target, greedy_data):
    """The first call runs out of its time budget; the second resumes from its checkpoint and reaches the last step,
    so it reports no budget stop (the checkpoint's record of the first call's stop is not the second's)."""
    from runners import train_drafter

    data = greedy_data.save(tmp_path / "data.safetensors")
    first = train_drafter.run(compose_train(tmp_path, data, "run", "train.time_budget_s=0"), target=target)
    assert first["stopped_by_time_budget"] and first["step"] == 0
    stopped = train_drafter.run(compose_train(tmp_path, data, "run2", "stop_at_step=2"), target=target)
    assert stopped["step"] == 2
    cut = train_drafter.run(compose_train(tmp_path, data, "run2", "resume=true", "stop_at_step=4",
                                          "train.time_budget_s=0"), target=target)
    assert cut["stopped_by_time_budget"] and cut["step"] == 2
    done = train_drafter.run(compose_train(tmp_path, data, "run2", "resume=true"), target=target)
    assert done["step"] == 6 and not done["stopped_by_time_budget"]


def test_resume_reproduces_an_uninterrupted_run(tmp_path, target, greedy_data):
    from runners import train_drafter

    data = greedy_data.save(tmp_path / "data.safetensors")
    full = train_drafter.run(compose_train(tmp_path, data, "full"), target=target)
    assert full["step"] == 6 and Path(full["final_drafter"]).is_dir()

    part = train_drafter.run(compose_train(tmp_path, data, "split", "stop_at_step=3"), target=target)
    assert part["step"] == 3 and part["stopped_at_step"] and not part["stopped_by_time_budget"]
    # the drafter it stopped with, in final/ (as a budget-stopped run's), the checkpoint's weights
    at_3 = DSparkDrafter.load(Path(part["final_drafter"]), target.cfg).state_dict()
    checkpoint_3 = DSparkDrafter.load(Path(part["checkpoint"]), target.cfg).state_dict()
    assert part["checkpoint"].endswith("checkpoint-0000003") and all(torch.equal(at_3[k], checkpoint_3[k])
                                                                     for k in at_3)
    with pytest.raises(ConfigError, match="resume=true"):
        train_drafter.run(compose_train(tmp_path, data, "split"), target=target)
    with pytest.raises(ConfigError, match="max_steps"):
        train_drafter.run(compose_train(tmp_path, data, "split", "resume=true", "train.max_steps=7"), target=target)
    resumed = train_drafter.run(compose_train(tmp_path, data, "split", "resume=true"), target=target)
    assert resumed["resumed_from"].endswith("checkpoint-0000003") and resumed["step"] == 6
    assert resumed["last_metrics"]["loss"] == full["last_metrics"]["loss"]

    a = DSparkDrafter.load(Path(full["final_drafter"]), target.cfg).state_dict()
    b = DSparkDrafter.load(Path(resumed["final_drafter"]), target.cfg).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    opt_a = load_tensor_shards(Path(full["checkpoint"]) / "optimizer", "optimizer")
    opt_b = load_tensor_shards(Path(resumed["checkpoint"]) / "optimizer", "optimizer")
    assert all(torch.equal(opt_a[k], opt_b[k]) for k in opt_a)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        train_drafter.run(compose_train(tmp_path, data, "empty", "resume=true"), target=target)


def weights_each_run_moved(tmp_path: Path, target, data: Path, runs: dict[str, tuple[str, ...]], *common: str
                           ) -> tuple[str, dict[str, set[str]]]:
    """Train a start drafter, then from it one run per name with its own and the ``common`` settings: (the start's
    folder, the names of the weights each run changed)."""
    from runners import train_drafter

    start = train_drafter.run(compose_train(tmp_path, data, "start"), target=target)["final_drafter"]
    before = DSparkDrafter.load(Path(start), target.cfg).state_dict()
    moved = {}
    for name, extra in runs.items():
        out = train_drafter.run(compose_train(tmp_path, data, name, f"init_from={start}", *common, *extra),
                                target=target)
        after = DSparkDrafter.load(Path(out["final_drafter"]), target.cfg).state_dict()
        moved[name] = {k for k in before if not torch.equal(before[k], after[k])}
    return start, moved


def test_head_only_trains_the_confidence_head_alone_and_keeps_the_drafts(tmp_path, target, greedy_data):
    """train.head_only (from init_from): the confidence head is trained on train.conf_target and every other weight
    stays bit for bit, so the drafter drafts exactly what it did; a whole-drafter run on the same settings moves
    them (the check can fail). Bad settings are refused before anything loads; a checkpoint written before the two
    settings existed resumes as one trained with their defaults."""
    from runners import train_drafter

    data = greedy_data.save(tmp_path / "data.safetensors")
    start, moved = weights_each_run_moved(tmp_path, target, data, {"head": ("train.head_only=true",), "whole": ()},
                                          "train.conf_target=greedy")
    assert moved["head"] == {"confidence_head.weight", "confidence_head.bias"}
    assert moved["whole"] > moved["head"]
    cfg = json.loads((tmp_path / "head" / "run_config.json").read_text())["train"]
    assert cfg["head_only"] is True and cfg["conf_target"] == "greedy"

    for extra, message in ((("train.head_only=true",), "give init_from"),
                           (("train.head_only=true", f"init_from={start}", "style=dflash"), "no confidence head"),
                           (("train.head_only=true", f"init_from={start}", "train.conf_weight=0"), "conf_weight > 0"),
                           (("train.conf_target=sampled",), "conf_target")):
        with pytest.raises(ConfigError, match=message):
            train_drafter.run(compose_train(tmp_path, data, "refused", *extra), target=target)
    assert not (tmp_path / "refused").exists()

    # A checkpoint without the two settings (written before they existed) resumes.
    part = train_drafter.run(compose_train(tmp_path, data, "old", "stop_at_step=2"), target=target)
    state_path = Path(part["checkpoint"]) / "trainer_state.pt"
    state = torch.load(state_path, weights_only=False)
    for key in ("conf_target", "head_only", "conf_stop_grad"):
        del state["train_config"][key]
    torch.save(state, state_path)
    assert train_drafter.run(compose_train(tmp_path, data, "old", "resume=true"), target=target)["step"] == 6


def test_conf_stop_grad_keeps_the_confidence_terms_gradient_in_the_head(tmp_path, target, greedy_data):
    """train.conf_stop_grad: the confidence term trains the head alone. With CE and TV weighted 0 (and no weight
    decay) only the head's weights move, while the same run without it moves the backbone and the Markov head too
    (the check can fail); the setting is recorded, and refused where it would do nothing."""
    from runners import train_drafter

    data = greedy_data.save(tmp_path / "data.safetensors")
    runs = {"stopped": ("train.conf_stop_grad=true",), "through": ()}
    _, moved = weights_each_run_moved(tmp_path, target, data, runs, "train.ce_weight=0", "train.tv_weight=0",
                                      "train.weight_decay=0")
    assert moved["stopped"] == {"confidence_head.weight", "confidence_head.bias"}
    assert {"markov_head.w1.weight", "layers.0.self_attn.q_proj.weight"} <= moved["through"]
    assert json.loads((tmp_path / "stopped" / "run_config.json").read_text())["train"]["conf_stop_grad"] is True

    for extra, message in ((("train.conf_stop_grad=true", "style=dflash"), "no confidence head"),
                           (("train.conf_stop_grad=true", "train.conf_weight=0"), "conf_weight > 0")):
        with pytest.raises(ConfigError, match=message):
            train_drafter.run(compose_train(tmp_path, data, "refused", *extra), target=target)
    assert not (tmp_path / "refused").exists()


def carry_state(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(["bash", str(REPO / "bench" / "carry_state.sh"), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def test_carried_parts_unpack_from_relative_folders(tmp_path):
    """`unpack` named by paths relative to the working directory (as in `carry_state.sh unpack DEST .gpu/x`) checks
    the sums it finds there and extracts the folder that was packed."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train_0p0.safetensors").write_bytes(bytes(range(256)) * 300)
    packed = carry_state("pack", "data", "data_c", "carry/data_c", env={"PART_BYTES": "20K"}, cwd=tmp_path)
    assert packed.returncode == 0, packed.stderr
    assert len(list((tmp_path / "carry" / "data_c").glob("data_c.tar.xz.*"))) >= 1
    unpacked = carry_state("unpack", "elsewhere", "carry/data_c", cwd=tmp_path)
    assert unpacked.returncode == 0, unpacked.stderr
    assert (tmp_path / "elsewhere" / "data" / "train_0p0.safetensors").read_bytes() == bytes(range(256)) * 300


def test_a_run_carried_to_another_machine_resumes_as_if_uninterrupted(tmp_path, target, greedy_data):
    """bench/carry_state.sh: a stopped run packed in small parts, sent back in two batches, grouped into upload
    folders and unpacked elsewhere resumes to the same weights and optimizer state as an uninterrupted run; a
    missing part is refused before anything is extracted."""
    from runners import train_drafter

    data = greedy_data.save(tmp_path / "data.safetensors")
    full = train_drafter.run(compose_train(tmp_path, data, "full"), target=target)
    train_drafter.run(compose_train(tmp_path, data, "gpu1/split", "stop_at_step=3"), target=target)
    assert (tmp_path / "gpu1" / "split" / "final").is_dir()  # left out by EXCLUDE, as h200_session.sh packs runs

    pack = tmp_path / "pack"
    done = carry_state("pack", str(tmp_path / "gpu1" / "split"), "split", str(pack),
                       env={"PART_BYTES": "40K", "EXCLUDE": "final"})
    assert done.returncode == 0, done.stderr
    parts = sorted(p.name for p in pack.glob("split.tar.xz.*"))
    assert len(parts) >= 3, parts
    for first, out in ((1, "back1"), (4, "back2")):  # two calls' returns: files 1-3, then the rest
        sent = carry_state("send", str(pack), str(tmp_path / out), str(first), "3" if first == 1 else "99")
        assert sent.returncode == 0, sent.stderr
    grouped = carry_state("group", str(tmp_path / "back1"), str(tmp_path / "back2"), str(tmp_path / "upload"))
    assert grouped.returncode == 0, grouped.stderr
    uploads = sorted((tmp_path / "upload").iterdir())
    assert len(uploads) >= 2 and all(len([f for f in d.iterdir() if ".tar.xz." in f.name]) <= 2 for d in uploads)

    missing = tmp_path / "missing"
    shutil.copytree(tmp_path / "upload", missing)
    next(missing.glob("carry2/split.tar.xz.*")).unlink()
    refused = carry_state("unpack", str(tmp_path / "gpu3"), *map(str, sorted(missing.iterdir())))
    assert refused.returncode == 3 and "sha256 mismatch" in refused.stderr
    assert not (tmp_path / "gpu3" / "split").exists()

    unpacked = carry_state("unpack", str(tmp_path / "gpu2"), *map(str, uploads))
    assert unpacked.returncode == 0, unpacked.stderr
    assert not (tmp_path / "gpu2" / "split" / "final").exists()
    resumed = train_drafter.run(compose_train(tmp_path, data, "gpu2/split", "resume=true"), target=target)
    assert resumed["resumed_from"].endswith("checkpoint-0000003") and resumed["step"] == 6
    a = DSparkDrafter.load(Path(full["final_drafter"]), target.cfg).state_dict()
    b = DSparkDrafter.load(Path(resumed["final_drafter"]), target.cfg).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    opt_a = load_tensor_shards(Path(full["checkpoint"]) / "optimizer", "optimizer")
    opt_b = load_tensor_shards(Path(resumed["checkpoint"]) / "optimizer", "optimizer")
    assert all(torch.equal(opt_a[k], opt_b[k]) for k in opt_a)


# ------------------------------------------------------------------------------ runners


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory, target, greedy_data) -> Path:
    out = tmp_path_factory.mktemp("trained")
    drafter = tiny_drafter(target, block_size=4)
    DrafterTrainer(target, drafter, greedy_data, small_train_config(out, max_steps=30)).train()
    return drafter.save(out / "final")


def test_calibrate_runner_writes_loadable_temperatures(tmp_path, target, greedy_data, trained_checkpoint):
    from runners import calibrate

    data = greedy_data.save(tmp_path / "eval.safetensors")
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="calibrate", overrides=[
            f"checkpoint={trained_checkpoint}", f"data={data}", "holdout_fraction=0.5", "anchors_per_seq=8",
            "max_len=40", "progress=false", "n_grid=40"])
    report = calibrate.run(cfg, target=target)
    assert report["blocks"] > 50 and report["sequences"] == 12
    assert len(report["temperatures"]) == 4 and report["ece_after"] <= report["ece_before"] + 1e-9
    assert Path(report["reliability_plot"]).stat().st_size > 1000
    saved = json.loads((trained_checkpoint / "calibration.json").read_text())
    assert saved["temperatures"] == report["temperatures"]
    loaded = DSparkDrafter.load(trained_checkpoint, target.cfg)
    torch.testing.assert_close(loaded.confidence_temperatures, torch.tensor(report["temperatures"]))


def test_eval_runner_reports_acceptance_and_greedy_losslessness(tmp_path, target, trained_checkpoint):
    from runners import eval_drafter

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="eval_drafter", overrides=[
            f"checkpoint={trained_checkpoint}", f"output_dir={tmp_path / 'eval'}", "max_tokens=16",
            "engine.max_model_len=128", "engine.kv_block_size=8", "engine.max_num_seqs=8",
            "engine.max_num_batched_tokens=64", "progress=false"])
    gen = torch.Generator().manual_seed(7)
    sets = {"tiny": [(f"p{i}", torch.randint(3, 97, (5,), generator=gen).tolist()) for i in range(6)]}
    report = eval_drafter.run(cfg, target=target, prompt_sets=sets)
    assert report["greedy_lossless"]
    greedy, sampled = report["results"]
    assert greedy["temperature"] == 0.0 and sampled["temperature"] == 0.7
    assert greedy["greedy_mismatches"] == [] and "greedy_lossless" not in sampled
    assert 1.5 < greedy["mean_accept_length"] <= 5.0  # the trained drafter beats 1 token/step
    assert len(greedy["per_position_acceptance"]) == 4 and greedy["errors"] == 0
    table = (tmp_path / "eval" / "eval.md").read_text()
    assert "| tiny | 0 | 6 |" in table and "yes" in table
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())["block_size"] == 4


def test_eval_runner_replays_float32_mismatches_only_off_batch_invariance(tmp_path, target, trained_checkpoint,
                                                                          monkeypatch):
    """engine=cpu leaves batch invariance off, so the runner gives the greedy check a replay on batch-invariant copies
    of its engines (the trained drafter's drafts accepted alike by both); with engine.batch_invariant=true it needs
    none."""
    from runners import eval_drafter

    seen = {}
    real = eval_drafter.evaluate
    monkeypatch.setattr(eval_drafter, "evaluate", lambda *a, **k: seen.update(k) or real(*a, **k))
    common = [f"checkpoint={trained_checkpoint}", "max_tokens=12", "engine.max_model_len=128",
              "engine.kv_block_size=8", "engine.max_num_seqs=8", "engine.max_num_batched_tokens=64",
              "progress=false", "temperatures=[0.0]"]
    sets = {"tiny": [(f"p{i}", [5 + i, 9, 11, 40 + i]) for i in range(3)]}
    for invariant in (False, True):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(config_name="eval_drafter", overrides=common + [
                f"output_dir={tmp_path / str(invariant)}", f"engine.batch_invariant={str(invariant).lower()}"])
        assert eval_drafter.run(cfg, target=target, prompt_sets=sets)["greedy_lossless"]
        replay = seen["replay"]
        if invariant:
            assert replay is None
            continue
        assert isinstance(replay, eval_drafter.BatchInvariantReplay)
        prompts = [p for _, p in sets["tiny"]]
        spec, plain = replay(prompts, [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)] * 3)
        assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
        assert sum(n - 1 for o in spec for n in o.accept_lengths) > 0
        assert all("batch_invariant" in e.fingerprint()["kernels"].split("+") for e in replay._engines)


def test_greedy_replay_matches_the_engine_step_by_step(target, greedy_data, trained_checkpoint):
    """At the anchors the engine actually used, the dense replay accepts exactly what the engine did."""
    drafter = DSparkDrafter.load(trained_checkpoint, target.cfg)
    engine = Engine(target, None, tiny_engine_config(spec="dspark"), drafter)
    prompts = [greedy_data.sequence(i)[: int(greedy_data.prompt_lens[i])].tolist() for i in range(6)]
    outs = engine.generate(prompts, SamplingParams(max_tokens=28, ignore_eos=True))
    checked = 0
    for i, out in enumerate(outs):
        seq = greedy_data.sequence(i)
        assert out.token_ids == seq[len(prompts[i]):].tolist()  # the data is the target's greedy output
        anchors = [len(prompts[i]) - 1]
        for length in out.accept_lengths[:-1]:
            anchors.append(anchors[-1] + length)
        got = replay_blocks(target, drafter, seq[None], torch.tensor([anchors]))
        replay_accepted = torch.cumprod(got["accepted"][0].long(), dim=-1).sum(-1)
        assert replay_accepted.tolist() == [length - 1 for length in out.accept_lengths]
        checked += len(anchors)
    assert checked > 20


def test_greedy_mismatch_detection():
    from types import SimpleNamespace

    from runners.eval_drafter import greedy_mismatches

    out = lambda ids: SimpleNamespace(token_ids=ids, prompt_token_ids=[9], error=None)  # noqa: E731
    found = greedy_mismatches([out([1, 2, 3]), out([4, 5])], [out([1, 2, 3]), out([4, 6, 7])], ["a", "b"])
    assert found == [{"id": "b", "first_difference": 1, "spec_len": 2, "target_len": 3}]


class CharTokenizer:
    """Stand-in tokenizer for the tiny vocabulary: one id per character of the rendered chat."""

    def encode_chat(self, messages, add_generation_prompt=True):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)[-10:]
        return [1] + [3 + ord(c) % 90 for c in text]

    def encode(self, text):
        return [3 + ord(c) % 90 for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(32 + i % 90) for i in ids)


def test_make_training_data_runner(tmp_path, target):
    from runners import make_training_data

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="make_training_data", overrides=[
            "sources=[stdlib_prose,poetry]", "num_prompts_per_source=3", "max_tokens=6",
            f"output={tmp_path / 'train.safetensors'}", "engine.max_model_len=64", "engine.kv_block_size=8",
            "engine.max_num_batched_tokens=64", "engine.spec=dspark", "progress=false"])
    assert cfg.sampling.temperature == 0.7 and cfg.sampling.top_p == 0.8 and cfg.sampling.top_k == 20
    summary = make_training_data.run(cfg, target=target, tokenizer=CharTokenizer())
    assert summary["failed"] == 0 and summary["sequences"] == 6
    steps = summary["engine_steps"]
    assert steps["steps"] > 0 and steps["emitted_tokens"] == summary["response_tokens"]
    reasons = {k: v for k, v in steps.items() if k.startswith("eager_reason/")}
    assert reasons and sum(reasons.values()) == steps["eager_steps"] == steps["steps"]  # CPU: every step eager, said why
    assert steps["graph_replays"] == 0 and steps["ms_per_step"] > 0
    ds = TokenDataset.load(tmp_path / "train.safetensors")
    assert ds.summary()["per_source"] == {"poetry": 3, "stdlib_prose": 3}
    assert ds.info["split"] == "train" and ds.info["sampling"]["top_k"] == 20
    items = make_training_data.expand_samples(make_training_data.collect_prompts(["stdlib_prose", "poetry"], "train", 3, 0),
                                              {}, 0)
    tok = CharTokenizer()
    for i, (_, _, messages) in enumerate(items):
        prompt = tok.encode_chat(messages)
        assert int(ds.prompt_lens[i]) == len(prompt) and ds.sequence(i)[: len(prompt)].tolist() == prompt
        assert 1 <= ds.length(i) - len(prompt) <= 6
    with pytest.raises(ConfigError, match="split"):
        make_training_data.collect_prompts(["poetry"], "all", 1, 0)


def test_make_training_data_samples_per_prompt_and_time_budget(tmp_path, target):
    from runners import make_training_data

    items = make_training_data.collect_prompts(["stdlib_prose", "poetry"], "train", 2, 0)
    expanded = make_training_data.expand_samples(items, {"stdlib_prose": 3}, 0)
    ids = sorted(pid for _, pid, _ in expanded)
    assert len(expanded) == 2 * 3 + 2 and len(set(ids)) == len(ids)
    assert sum(src == "stdlib_prose" for src, _, _ in expanded) == 6
    assert expanded == make_training_data.expand_samples(items, {"stdlib_prose": 3}, 0)  # deterministic
    with pytest.raises(ConfigError, match="not among the selected sources"):
        make_training_data.expand_samples(items, {"agentic": 2}, 0)
    with pytest.raises(ConfigError, match=">= 1"):
        make_training_data.expand_samples(items, {"poetry": 0}, 0)

    def compose_with(*extra):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return compose(config_name="make_training_data", overrides=[
                "sources=[stdlib_prose,poetry]", "num_prompts_per_source=2", "max_tokens=6",
                f"output={tmp_path / 'train.safetensors'}", "engine.max_model_len=64", "engine.kv_block_size=8",
                "engine.max_num_batched_tokens=64", "engine.max_num_seqs=2", "progress=false", *extra])

    summary = make_training_data.run(compose_with("++samples_per_prompt={stdlib_prose: 3}"), target=target,
                                     tokenizer=CharTokenizer())
    assert summary["sequences"] == 8 and summary["not_admitted"] == 0
    ds = TokenDataset.load(tmp_path / "train.safetensors")
    assert ds.summary()["per_source"] == {"poetry": 2, "stdlib_prose": 6}
    # The repeated prompts got different seeds: not all their responses are equal.
    prose = [ds.sequence(i).tolist() for i in range(len(ds)) if ds.source(i) == "stdlib_prose"]
    assert len({tuple(x) for x in prose}) > 2
    # A spent budget admits nothing, and says so instead of writing an empty file.
    with pytest.raises(RuntimeError, match="no prompt produced"):
        make_training_data.run(compose_with("time_budget_s=0.0"), target=target, tokenizer=CharTokenizer())
    # max_requests answers the prefix of the shuffled requests that a budgeted run admitted, and nothing else.
    out = tmp_path / "prefix.safetensors"
    summary = make_training_data.run(compose_with("++samples_per_prompt={stdlib_prose: 3}", "max_requests=3",
                                                  f"output={out}"), target=target, tokenizer=CharTokenizer())
    assert summary["sequences"] == summary["prompts"] == 3
    prefix = TokenDataset.load(out)
    assert prefix.info["max_requests"] == 3
    assert [prefix.source(i) for i in range(3)] == [src for src, _, _ in expanded[:3]]
    tok = CharTokenizer()
    for i, (_, _, messages) in enumerate(expanded[:3]):
        assert prefix.sequence(i)[: int(prefix.prompt_lens[i])].tolist() == tok.encode_chat(messages)
    for bad, message in (("max_requests=9", "only 8 requests"), ("max_requests=0", ">= 1")):
        with pytest.raises(ConfigError, match=message):
            make_training_data.run(compose_with("++samples_per_prompt={stdlib_prose: 3}", bad), target=target,
                                   tokenizer=CharTokenizer())
    # part=j/m splits that prefix between m processes: together they answer it, each request once, each with the
    # seed it has in one process (the same responses)
    prefix_seqs = [prefix.sequence(i).tolist() for i in range(3)]
    parts = []
    for part in ("0/2", "1/2"):
        out = tmp_path / f"part{part[0]}.safetensors"
        make_training_data.run(compose_with("++samples_per_prompt={stdlib_prose: 3}", "max_requests=3",
                                            f"part={part}", f"output={out}"), target=target, tokenizer=CharTokenizer())
        parts.append(TokenDataset.load(out))
        assert parts[-1].info["part"] == part and parts[-1].info["max_requests"] == 3
        record = make_training_data.load_prompt_record(str(out).replace(".safetensors", ".prompts.json"))
        assert record["recipe"]["shards"][0]["part"] == part
    assert [len(p) for p in parts] == [2, 1]
    assert [p.sequence(i).tolist() for p, i in ((parts[0], 0), (parts[1], 0), (parts[0], 1))] == prefix_seqs
    for bad in ("2/2", "x"):
        with pytest.raises(ConfigError, match="part: "):
            make_training_data.run(compose_with(f"part={bad}"), target=target, tokenizer=CharTokenizer())
    with pytest.raises(ConfigError, match="holds no request"):
        make_training_data.run(compose_with("max_requests=1", "part=1/2"), target=target, tokenizer=CharTokenizer())


def test_generate_dataset_admits_in_waves_so_most_steps_are_pure_decode(target):
    """Topping the batch up after every finished request puts a prefill into most steps (which
    cannot replay a decode graph); waves keep most steps pure decode. Same data either way."""
    import random

    from dspark.training.data import generate_dataset

    rng = random.Random(0)
    items = [("x", [1] + [rng.randrange(3, 90) for _ in range(rng.randrange(4, 20))]) for _ in range(24)]
    sampling = [SamplingParams(temperature=0.7, top_p=0.8, top_k=20, max_tokens=rng.randrange(3, 14), seed=i,
                               ignore_eos=True) for i in range(24)]
    runs = {}
    for name, kw in (("top_up", {"in_flight": 8, "refill_at": 7}), ("waves", {})):
        engine = Engine(target, None, tiny_engine_config(spec="off", max_num_seqs=8, max_num_batched_tokens=256))
        data, failed = generate_dataset(engine, items, sampling, progress=False, **kw)
        assert not failed and len(data) == 24
        runs[name] = (data, engine.counters())
    (top_data, top), (wave_data, wave) = runs["top_up"], runs["waves"]
    assert [wave_data.sequence(i).tolist() for i in range(24)] == [top_data.sequence(i).tolist() for i in range(24)]
    assert wave["mixed_steps"] * 2 < top["mixed_steps"]
    assert wave["mixed_steps"] / wave["steps"] < 0.25 < top["mixed_steps"] / top["steps"]
    with pytest.raises(DataError, match="refill_at"):
        generate_dataset(engine, items, sampling, progress=False, in_flight=4, refill_at=4)


def test_make_training_data_shards_partition_the_prompts_and_train_together(tmp_path, target):
    from runners import make_training_data, train_drafter

    def shard_cfg(shard):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return compose(config_name="make_training_data", overrides=[
                "sources=[stdlib_prose,poetry]", "num_prompts_per_source=3", "max_tokens=6",
                f"output={tmp_path / ('s' + shard[0] + '.safetensors')}", "engine.max_model_len=64",
                "engine.kv_block_size=8", "engine.max_num_batched_tokens=64", "progress=false", f"shard={shard}"])

    whole = make_training_data.expand_samples(make_training_data.collect_prompts(["stdlib_prose", "poetry"], "train",
                                                                                 3, 0), {}, 0)
    parts = []
    for shard in ("0/2", "1/2"):
        summary = make_training_data.run(shard_cfg(shard), target=target, tokenizer=CharTokenizer())
        parts.append(TokenDataset.load(summary["output"]))
        assert parts[-1].info["shard"] == shard
    assert [len(p) for p in parts] == [3, 3]
    joined = TokenDataset.load_many([tmp_path / "s0.safetensors", tmp_path / "s1.safetensors"])
    assert len(joined) == 6 and joined.summary()["per_source"] == {"poetry": 3, "stdlib_prose": 3}
    # every prompt answered exactly once: shard 0 holds items 0, 2, 4; shard 1 holds 1, 3, 5
    tok = CharTokenizer()
    for k, (src, _, messages) in enumerate(whole):
        part, i = parts[k % 2], k // 2
        assert part.source(i) == src and part.sequence(i)[: int(part.prompt_lens[i])].tolist() == tok.encode_chat(messages)
    assert torch.equal(joined.sequence(3), parts[1].sequence(0)) and joined.source(3) == parts[1].source(0)
    for bad in ("2/2", "1", "a/b", "0/2/3"):
        with pytest.raises(ConfigError, match="shard"):
            make_training_data.parse_shard(bad)
    # the trainer takes the shards as one list
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="train_drafter", overrides=[
            f"data=[{tmp_path / 's0.safetensors'},{tmp_path / 's1.safetensors'}]"])
    assert len(train_drafter.load_training_data(cfg)) == 6


def test_init_from_copies_weights_and_refuses_another_architecture(tmp_path, target):
    from runners.train_drafter import init_weights

    source = tiny_drafter(target, seed=0, block_size=4)
    source.save(tmp_path / "src")
    fresh = tiny_drafter(target, seed=1, block_size=4)
    assert any(not torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), source.state_dict().values()))
    init_weights(fresh, str(tmp_path / "src"), target)
    for k, v in source.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    other = tiny_drafter(target, block_size=5)
    with pytest.raises(ConfigError, match="block_size"):
        init_weights(other, str(tmp_path / "src"), target)


def _drafted(target, drafter):
    """An engine run's accepted tokens, decode steps and the head's survival of its first rows, with ``drafter``."""
    from dspark.config import SamplingParams
    from dspark.engine import Engine
    from test_engine_lossless import prompts_for
    from tiny import tiny_engine_config

    eng = Engine(target, None, tiny_engine_config(), drafter)
    eng.steps.confidence = True  # the head's survival too, as a planning engine's draft stage writes it
    eng.generate(prompts_for(7, 3), SamplingParams(max_tokens=16, ignore_eos=True))
    c = eng.counters()
    assert eng.steps.survival[:3].abs().sum() > 0
    return c["accepted_tokens"], c["decode_steps"], eng.steps.survival[:3].clone()


def test_init_grow_layers_starts_a_deeper_drafter_as_the_checkpoint(tmp_path, target):
    """A two-layer drafter grown from a one-layer checkpoint drafts what the checkpoint drafts (the same accepted
    tokens and confidence in an engine run) while its extra layer has weights to train; growth is refused without
    the switch, towards fewer layers, and with any other difference."""
    from runners.train_drafter import init_weights

    source = tiny_drafter(target, seed=0, block_size=4)
    source.save(tmp_path / "src")
    deeper = tiny_drafter(target, seed=1, block_size=4, num_layers=2)
    with pytest.raises(ConfigError, match="num_layers"):
        init_weights(deeper, str(tmp_path / "src"), target)
    init_weights(deeper, str(tmp_path / "src"), target, grow_layers=True)
    grown = deeper.state_dict()
    assert not grown["layers.1.self_attn.o_proj.weight"].any() and not grown["layers.1.mlp.down_proj.weight"].any()
    assert grown["layers.1.self_attn.q_proj.weight"].abs().sum() > 0  # trainable from its initialisation

    (acc_a, steps_a, surv_a), (acc_b, steps_b, surv_b) = _drafted(target, source), _drafted(target, deeper)
    assert (acc_a, steps_a) == (acc_b, steps_b)
    assert torch.allclose(surv_a, surv_b, atol=1e-5)
    deeper.save(tmp_path / "deep")
    with pytest.raises(ConfigError, match="init_grow_layers=true grows only num_layers"):
        init_weights(tiny_drafter(target, block_size=4), str(tmp_path / "deep"), target, grow_layers=True)
    with pytest.raises(ConfigError, match="block_size"):
        init_weights(tiny_drafter(target, block_size=5, num_layers=2), str(tmp_path / "src"), target, grow_layers=True)


def test_init_grow_markov_rank_starts_a_wider_markov_head_as_the_checkpoint(tmp_path, target):
    """A rank-16 Markov head grown from a rank-8 checkpoint (alone, and with a layer grown beside it) drafts what the
    checkpoint drafts, with the same confidence, while its new rank has weights and gradients to train; growth is
    refused without the switch, towards a lower rank, and from a head that is not vanilla."""
    from runners.train_drafter import init_weights

    source = tiny_drafter(target, seed=0, block_size=4, markov_rank=8)
    source.save(tmp_path / "src")
    wider = tiny_drafter(target, seed=1, block_size=4, markov_rank=16)
    with pytest.raises(ConfigError, match="markov_rank"):
        init_weights(wider, str(tmp_path / "src"), target)
    with pytest.raises(ConfigError, match="init_grow_layers=true grows only num_layers"):
        init_weights(wider, str(tmp_path / "src"), target, grow_layers=True)
    init_weights(wider, str(tmp_path / "src"), target, grow_markov_rank=True)
    old, new = source.state_dict(), wider.state_dict()
    assert torch.equal(new["markov_head.w1.weight"][:, :8], old["markov_head.w1.weight"])
    assert torch.equal(new["markov_head.w2.weight"][:, :8], old["markov_head.w2.weight"])
    assert not new["markov_head.w1.weight"][:, 8:].any() and new["markov_head.w2.weight"][:, 8:].abs().sum() > 0
    d = target.cfg.hidden_size
    assert torch.equal(new["confidence_head.weight"][:, :d + 8], old["confidence_head.weight"])
    assert not new["confidence_head.weight"][:, d + 8:].any()
    for k in old:
        if k not in ("markov_head.w1.weight", "markov_head.w2.weight", "confidence_head.weight"):
            assert torch.equal(new[k], old[k]), k
    # the new rank learns: the bias reaches W1's new columns (of the tokens it reads, and only those) through W2's
    wider.train()
    wider.markov_head.w2(wider.markov_head.w1(torch.tensor([3, 5]))).pow(2).sum().backward()
    grad = wider.markov_head.w1.weight.grad
    assert grad[[3, 5], 8:].abs().min() > 0 and not grad[:3, 8:].any()
    wider.zero_grad(set_to_none=True)
    wider.eval()

    both = tiny_drafter(target, seed=2, block_size=4, markov_rank=16, num_layers=2)
    init_weights(both, str(tmp_path / "src"), target, grow_layers=True, grow_markov_rank=True)
    (acc_a, steps_a, surv_a) = _drafted(target, source)
    for grown in (wider, both):
        acc_b, steps_b, surv_b = _drafted(target, grown)
        assert (acc_a, steps_a) == (acc_b, steps_b)
        assert torch.allclose(surv_a, surv_b, atol=1e-5)

    wider.save(tmp_path / "wide")
    with pytest.raises(ConfigError, match="init_grow_markov_rank=true grows only markov_rank"):
        init_weights(tiny_drafter(target, block_size=4, markov_rank=8), str(tmp_path / "wide"), target,
                     grow_markov_rank=True)
    tiny_drafter(target, seed=0, block_size=4, markov_rank=8, markov_variant="gated").save(tmp_path / "gated")
    with pytest.raises(ConfigError, match="grows a vanilla Markov head"):
        init_weights(tiny_drafter(target, block_size=4, markov_rank=16, markov_variant="gated"),
                     str(tmp_path / "gated"), target, grow_markov_rank=True)


def test_init_drop_heads_starts_the_ablation_from_a_dspark_checkpoints_backbone(tmp_path, target, greedy_data):
    """style=dflash with init_from=DSPARK init_drop_heads=true: the ablation starts with every weight of the DSpark
    checkpoint but its Markov and confidence heads', trains from there (on record in run_config.json), and is refused
    for a DSpark run, without init_from, beside a growth, from a head-less checkpoint, into a drafter with a head,
    and where the architectures differ beyond the heads."""
    from runners import train_drafter
    from runners.train_drafter import init_weights

    data = greedy_data.save(tmp_path / "data.safetensors")
    start = train_drafter.run(compose_train(tmp_path, data, "start"), target=target)["final_drafter"]
    source = DSparkDrafter.load(Path(start), target.cfg).state_dict()
    ablation = tiny_drafter(target, seed=3, block_size=4, markov_rank=0, use_confidence_head=False)
    assert any(not torch.equal(v, source[k]) for k, v in ablation.state_dict().items())
    init_weights(ablation, start, target, drop_heads=True)
    kept = ablation.state_dict()
    assert set(source) - set(kept) == {"markov_head.w1.weight", "markov_head.w2.weight", "confidence_head.weight",
                                       "confidence_head.bias"}
    for k, v in kept.items():
        assert torch.equal(v, source[k]), k

    out = train_drafter.run(compose_train(tmp_path, data, "ablation", "style=dflash", f"init_from={start}",
                                          "init_drop_heads=true", "stop_at_step=1"), target=target)
    assert out["step"] == 1 and json.loads((tmp_path / "ablation" / "run_config.json").read_text())["init_drop_heads"]
    trained = DSparkDrafter.load(Path(out["final_drafter"]), target.cfg)
    assert trained.markov_head is None and trained.confidence_head is None

    for extra, message in ((("init_drop_heads=true", f"init_from={start}"), "style=dspark"),
                           (("init_drop_heads=true", "style=dflash"), "init_from=None")):
        with pytest.raises(ConfigError, match=message):
            train_drafter.run(compose_train(tmp_path, data, "refused", *extra), target=target)
    assert not (tmp_path / "refused").exists()
    with pytest.raises(ConfigError, match="does not combine"):
        init_weights(tiny_drafter(target, block_size=4, num_layers=2, markov_rank=0, use_confidence_head=False), start,
                     target, grow_layers=True, drop_heads=True)
    with pytest.raises(ConfigError, match="this drafter has a head"):
        init_weights(tiny_drafter(target, block_size=4), start, target, drop_heads=True)
    with pytest.raises(ConfigError, match="more than its heads"):
        init_weights(tiny_drafter(target, block_size=5, markov_rank=0, use_confidence_head=False), start, target,
                     drop_heads=True)
    ablation.save(tmp_path / "headless")
    with pytest.raises(ConfigError, match="no Markov or no confidence head to drop"):
        init_weights(tiny_drafter(target, block_size=4, markov_rank=0, use_confidence_head=False),
                     str(tmp_path / "headless"), target, drop_heads=True)


def test_init_rnn_from_vanilla_starts_the_recurrent_head_as_nearly_the_checkpoint(tmp_path, target, greedy_data):
    """drafter_arch.markov_variant=rnn with init_from=VANILLA init_rnn_from_vanilla=true: every weight of the checkpoint
    is kept (W2 divided by the scale the cell's output rows multiply W1[x] by), so the engine drafts and accepts what
    the checkpoint does; the state's weights start at zero and get a gradient; the run trains from there (on record in
    run_config.json); refused for the ablation, without init_from, without the switch, beside a growth, from a head
    that is not vanilla and where the architectures differ beyond the variant."""
    from runners import train_drafter
    from runners.train_drafter import RNN_INIT_SCALE, init_weights

    source = tiny_drafter(target, seed=0, block_size=4)
    source.save(tmp_path / "src")
    start = str(tmp_path / "src")
    rnn = tiny_drafter(target, seed=1, block_size=4, markov_variant="rnn")
    with pytest.raises(ConfigError, match="markov_variant"):
        init_weights(rnn, start, target)
    init_weights(rnn, start, target, rnn_from_vanilla=True)
    old, new = source.state_dict(), rnn.state_dict()
    for k, v in old.items():
        assert torch.equal(new[k], v / RNN_INIT_SCALE if k == "markov_head.w2.weight" else v), k
    r = rnn.markov_head.rank
    out_rows = new["markov_head.cell.weight"][2 * r:]  # z = [s; W1[x]; h]
    assert torch.equal(out_rows[:, r: 2 * r], RNN_INIT_SCALE * torch.eye(r))
    assert not out_rows[:, :r].any() and not out_rows[:, 2 * r:].any()
    assert not new["markov_head.cell.bias"][2 * r:].any()
    assert new["markov_head.cell.weight"][:2 * r].abs().sum() > 0  # the gate and candidate rows as initialised

    # the bias is the vanilla one up to tanh's curvature, at a slot whose state is not zero
    head = rnn.markov_head
    g = torch.Generator().manual_seed(4)
    h = torch.randn(6, rnn.hidden_size, generator=g)
    prev = torch.randint(0, target.cfg.vocab_size, (6,), generator=g)
    want = source.markov_head(h, source.markov_head.w1(prev), None)[0]
    _, state = head(h, head.w1(prev), head.initial_state(6, h))
    assert state.abs().sum() > 0
    got, _ = head(h, head.w1(prev), state)
    assert torch.allclose(got, want, rtol=1e-2, atol=1e-4) and not torch.equal(got, want)
    (acc_a, steps_a, surv_a), (acc_b, steps_b, surv_b) = _drafted(target, source), _drafted(target, rnn)
    assert (acc_a, steps_a) == (acc_b, steps_b)
    assert torch.allclose(surv_a, surv_b, atol=1e-5)
    # the state's weights train from zero: the output rows' state columns get a gradient at once
    rnn.train()
    got, _ = head(h, head.w1(prev), state)
    got.pow(2).sum().backward()
    assert head.cell.weight.grad[2 * r:, :r].abs().sum() > 0
    rnn.zero_grad(set_to_none=True)
    rnn.eval()

    data = greedy_data.save(tmp_path / "data.safetensors")
    out = train_drafter.run(compose_train(tmp_path, data, "rnn", "drafter_arch.markov_variant=rnn",
                                          f"init_from={start}", "init_rnn_from_vanilla=true", "stop_at_step=1"),
                            target=target)
    assert out["step"] == 1
    assert json.loads((tmp_path / "rnn" / "run_config.json").read_text())["init_rnn_from_vanilla"]
    assert DSparkDrafter.load(Path(out["final_drafter"]), target.cfg).cfg.markov_variant == "rnn"

    for extra, message in ((("init_rnn_from_vanilla=true", f"init_from={start}", "style=dflash"), "style=dflash"),
                           (("init_rnn_from_vanilla=true",), "init_from=None")):
        with pytest.raises(ConfigError, match=message):
            train_drafter.run(compose_train(tmp_path, data, "refused", "drafter_arch.markov_variant=rnn", *extra),
                              target=target)
    assert not (tmp_path / "refused").exists()
    with pytest.raises(ConfigError, match="does not combine"):
        init_weights(tiny_drafter(target, block_size=4, num_layers=2, markov_variant="rnn"), start, target,
                     grow_layers=True, rnn_from_vanilla=True)
    tiny_drafter(target, block_size=4, markov_variant="gated").save(tmp_path / "gated")
    for drafter, path in ((tiny_drafter(target, block_size=4, markov_variant="rnn"), tmp_path / "gated"),
                          (tiny_drafter(target, block_size=5, markov_variant="rnn"), tmp_path / "src"),
                          (tiny_drafter(target, block_size=4, markov_variant="gated"), tmp_path / "src")):
        with pytest.raises(ConfigError, match="init_rnn_from_vanilla: needs"):
            init_weights(drafter, str(path), target, rnn_from_vanilla=True)


@pytest.mark.parametrize("sources, warned", [(["hard_questions", "tool_calls"], False), (["agentic"], True)])
def test_calibration_data_from_an_eval_split_is_warned_of_only_when_a_benchmark_draws_from_it(tmp_path, capsys,
                                                                                              sources, warned):
    """The eval split of the training-only sources is the held-out calibration material of a drafter trained on the
    whole train split (no benchmark draws from it): no warning; a benchmark workload's eval split is warned of."""
    from omegaconf import OmegaConf

    from runners.calibrate import held_out_data

    seqs = [[1, 2, 3, 4, 5, 6]] * 4
    data = TokenDataset.from_sequences(seqs, [2] * 4, [sources[i % len(sources)] for i in range(4)],
                                       info={"split": "eval"}).save(tmp_path / "calib.safetensors")
    cfg = OmegaConf.create({"data": str(data), "holdout_fraction": 0.0, "max_sequences": None, "fit_fraction": 0.5})
    assert len(held_out_data(cfg)) == 4
    out = capsys.readouterr().out
    assert ("holds EVAL-split prompts of ['agentic']" in out) == warned, out


def test_make_training_data_greedy_first_answers_each_prompts_first_sample_greedily():
    from runners import make_training_data

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        off = compose(config_name="make_training_data", overrides=[])
        on = compose(config_name="make_training_data", overrides=["sampling.greedy_first=true"])
    assert off.sampling.greedy_first is False
    first, second = (make_training_data.response_sampling(on.sampling, pid, 8, 0) for pid in ("p1", "p1#1"))
    assert first.temperature == 0.0 and first.max_tokens == 8
    assert (second.temperature, second.top_p, second.top_k) == (0.7, 0.8, 20)
    # off: every sample as configured, with the same per-sample seeds
    plain = make_training_data.response_sampling(off.sampling, "p1", 8, 0)
    assert plain.temperature == 0.7 and plain.seed == first.seed == make_training_data.prompt_seed(0, "p1")
    assert second.seed == make_training_data.prompt_seed(0, "p1#1") != first.seed


# ------------------------------------------------------------------------------ Ctrl-C


def _sigint_during(obj, method: str, at_call: int, monkeypatch) -> None:
    """Send this process a SIGINT from inside the ``at_call``-th call of ``obj.method`` (1-based), as a Ctrl-C
    arriving in the middle of that step."""
    import os
    import signal

    original = getattr(obj, method)
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == at_call:
            os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, method, wrapped)


def test_deferred_interrupt_waits_for_the_loop_and_a_second_ctrl_c_acts_at_once():
    import os
    import signal

    from dspark.training.interrupt import DeferredInterrupt

    before = signal.getsignal(signal.SIGINT)
    with DeferredInterrupt() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGINT)  # handled: no KeyboardInterrupt here
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_in_training_saves_the_last_whole_step_and_resumes_from_it(tmp_path, target, greedy_data, capsys,
                                                                           monkeypatch):
    """A Ctrl-C in the middle of step 4 (in its forward pass) finishes that step, writes checkpoint 4
    and raises KeyboardInterrupt; the checkpoint is the uninterrupted run's step 4, and resuming from it ends where
    the uninterrupted run ends."""
    cfg = small_train_config(tmp_path, max_steps=6, save_every=1000, keep_last=0)
    ref = DrafterTrainer(target, tiny_drafter(target), greedy_data,
                         small_train_config(tmp_path / "ref", max_steps=6, save_every=4, keep_last=0))
    ref.train()

    trainer = DrafterTrainer(target, tiny_drafter(target), greedy_data, cfg)
    _sigint_during(trainer, "compute_loss", 4, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert "interrupted at step 4 of 6" in capsys.readouterr().out
    assert [c.name for c in complete_checkpoints(cfg.output_dir)] == ["checkpoint-0000004"]
    saved = DSparkDrafter.load(Path(cfg.output_dir) / "checkpoint-0000004", target.cfg).state_dict()
    at4 = DSparkDrafter.load(Path(ref.cfg.output_dir) / "checkpoint-0000004", target.cfg).state_dict()
    assert all(torch.equal(saved[k], at4[k]) for k in at4)

    resumed = DrafterTrainer(target, tiny_drafter(target, seed=9), greedy_data, cfg)
    resumed.resume_latest()
    resumed.train()
    assert resumed.last_metrics["loss"] == ref.last_metrics["loss"]
    for (name, p), q in zip(ref.drafter.named_parameters(), resumed.drafter.parameters()):
        assert torch.equal(p, q), name


def test_ctrl_c_in_make_training_data_keeps_the_finished_responses(tmp_path, target, capsys, monkeypatch):
    from runners import make_training_data
    from dspark.engine import Engine

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="make_training_data", overrides=[
            "sources=[stdlib_prose,poetry]", "num_prompts_per_source=4", "max_tokens=6", "in_flight=2",
            "refill_at=0", f"output={tmp_path / 'train.safetensors'}", "engine.max_model_len=64",
            "engine.kv_block_size=8", "engine.max_num_batched_tokens=64", "progress=false"])
    _sigint_during(Engine, "step", 9, monkeypatch)  # in the second wave of two requests
    with pytest.raises(KeyboardInterrupt):
        make_training_data.run(cfg, target=target, tokenizer=CharTokenizer())
    out = capsys.readouterr().out
    assert "make_training_data: interrupted; 2 finished responses written" in out
    assert "2 unfinished and 4 never admitted left out" in out
    ds = TokenDataset.load(tmp_path / "train.safetensors")
    assert len(ds) == 2 and ds.info["interrupted"] == {"unfinished": 2} and ds.info["not_admitted"] == 4
    record = json.loads(make_training_data.prompt_record_path(tmp_path / "train.safetensors").read_text())
    assert len(record["prompt_ids"]) == 4  # every admitted prompt, the unfinished ones too: safe to exclude

    # interrupted before anything finished: nothing written
    (tmp_path / "train.safetensors").unlink()
    _sigint_during(Engine, "step", 1, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        make_training_data.run(cfg, target=target, tokenizer=CharTokenizer())
    assert "nothing written" in capsys.readouterr().out and not (tmp_path / "train.safetensors").exists()


def test_the_replay_keeps_the_gap_between_the_two_largest_draft_logits():
    """The replay's draft_top_gap is dspark.sampling.top_gap: the largest logit minus the runner-up, per row, in
    float32 (ties give 0)."""
    from dspark.sampling import top_gap
    from dspark.training import trainer

    assert trainer.top_gap is top_gap
    logits = torch.tensor([[[1.0, 4.0, 2.5], [3.0, 3.0, -1.0]]], dtype=torch.bfloat16)
    gap = top_gap(logits)
    assert gap.dtype == torch.float32 and gap.tolist() == [[1.5, 0.0]]
