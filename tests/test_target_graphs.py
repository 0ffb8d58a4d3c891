"""train.target_graphs: the frozen target's training forward replayed from CUDA graphs
(dspark/training/target_graphs.py).

The CPU tests check the length rounding and that the option is refused off CUDA. The GPU tests (marked ``gpu``,
skipped without CUDA) check that a replay computes the eager forward within bf16 rounding, at a batch's own length
and padded (not bit for bit: an H200 replay differed in the last bits even at equal shapes); that one graph serves
every batch of a rounded length and a new one is captured for another; and that a trainer with the option takes
the same steps as one without.
"""

from __future__ import annotations

import pytest
import torch

from dspark.config import ConfigError
from dspark.training.data import TokenDataset
from dspark.training.target_graphs import LENGTH_MULTIPLE, TargetForwardGraphs, graph_length
from dspark.training.trainer import DrafterTrainer, TrainConfig, dense_target_forward
from tests.tiny import tiny_drafter, tiny_target

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA graphs need a CUDA device (run with -m gpu on the GPU)")


def test_graph_length_rounds_up_to_the_multiple():
    assert LENGTH_MULTIPLE == 128
    assert [graph_length(n) for n in (1, 127, 128, 129, 2048)] == [128, 128, 128, 256, 2048]
    with pytest.raises(ValueError, match="seq_len must be >= 1"):
        graph_length(0)


def _dataset(seed: int, n: int, lo: int, hi: int, vocab: int = 97) -> TokenDataset:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi, (n,), generator=g).tolist()
    seqs = [torch.randint(3, vocab, (length,), generator=g) for length in lengths]
    return TokenDataset.from_sequences(seqs, [length // 2 for length in lengths], ["tiny"] * n, info={})


def _config(tmp_path, device: str, graphs: bool, **kw) -> TrainConfig:
    base = dict(output_dir=str(tmp_path / f"run_{int(graphs)}"), max_steps=4, batch_size=4, max_len=200,
                anchors_per_seq=6, lr=1e-3, warmup_steps=1, save_every=10_000, log_every=10_000, progress=False,
                device=device, target_graphs=graphs)
    base.update(kw)
    return TrainConfig(**base)


def test_refused_off_cuda(tmp_path):
    target = tiny_target(0)
    with pytest.raises(ConfigError, match="train.target_graphs: CUDA graphs need train.device=cuda"):
        DrafterTrainer(target, tiny_drafter(target), _dataset(0, 8, 20, 60), _config(tmp_path, "cpu", True))


def test_refuses_a_target_off_cuda():
    with pytest.raises(ValueError, match="needs the target on a CUDA device"):
        TargetForwardGraphs(tiny_target(0), (0, 2), autocast=False)


def _gpu_target(seed: int = 0):
    return tiny_target(seed, max_position_embeddings=1024).to("cuda", torch.bfloat16)


@pytest.mark.gpu
@needs_cuda
def test_a_replay_computes_the_eager_forward():
    target = _gpu_target()
    graphs = TargetForwardGraphs(target, (0, 2), autocast=True)
    g = torch.Generator().manual_seed(3)

    def eager(ids):
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            hidden, cap, _ = dense_target_forward(target, ids, (0, 2))
        return hidden, cap

    for seq_len in (256, 200, 256, 77, 129, 300):  # 129 to 256 share one graph; 77 and 300 take their own
        ids = torch.randint(3, 97, (3, seq_len), generator=g).cuda()
        want_hidden, want_cap = eager(ids)
        hidden, cap = graphs(ids)
        assert hidden.shape == want_hidden.shape and cap.shape == want_cap.shape
        # at the graph's own length or padded to it, the values agree within bf16 rounding (kernels chosen under
        # capture, and GEMMs over more rows, may round the last bits differently)
        torch.testing.assert_close(hidden.float(), want_hidden.float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(cap.float(), want_cap.float(), rtol=2e-2, atol=2e-2)
    assert graphs.captures == 3 and sorted(graphs.graphs) == [(3, 128), (3, 256), (3, 384)]
    assert graphs.replays == 6
    with pytest.raises(ValueError, match="input_ids must be int64"):
        graphs(torch.zeros(2, 5, dtype=torch.int32, device="cuda"))


@pytest.mark.gpu
@needs_cuda
def test_a_trainer_with_graphs_takes_the_eager_trainers_steps(tmp_path):
    data = _dataset(1, 32, 40, 250)
    runs = {}
    for graphs in (False, True):
        target = tiny_target(0, max_position_embeddings=1024)
        trainer = DrafterTrainer(target, tiny_drafter(target, seed=2), data, _config(tmp_path, "cuda", graphs))
        runs[graphs] = ([trainer.train_step()["loss"] for _ in range(4)], trainer)
    (eager_losses, _), (graph_losses, trainer) = runs[False], runs[True]
    assert trainer.target_graphs is not None and trainer.target_graphs.replays == 4
    assert 1 <= trainer.target_graphs.captures <= 2  # lengths 40..249: rounded to 128 or 256
    # the first step's loss comes from the same weights: the forwards agree within bf16 rounding; later steps
    # follow the updates those losses made, so they agree as closely
    for a, b in zip(eager_losses, graph_losses):
        assert abs(a - b) <= 2e-2 * abs(a), (eager_losses, graph_losses)


@pytest.mark.gpu
@needs_cuda
def test_the_replay_and_the_drafters_forward_leave_the_host_free():
    """Between the target's replay and the loss nothing reads the device back: the host launches the drafter's
    forward while the device still runs the target's (the anchors are checked on the host beforehand)."""
    target = _gpu_target()
    drafter = tiny_drafter(target).to("cuda")
    graphs = TargetForwardGraphs(target, tuple(drafter.cfg.target_layer_ids), autocast=True)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 97, (2, 100), generator=g).cuda()
    anchors = torch.tensor([[3, 40, 80], [10, 50, 90]], device="cuda")
    targets = torch.randint(3, 97, (2, 3, drafter.block_size), generator=g).cuda()
    graphs(ids)  # the capture itself may synchronise
    torch.cuda.synchronize()

    def step(checked: bool):
        _, captured = graphs(ids)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return drafter.forward_train(captured, ids, anchors, target.embed, target.lm_head_weight, targets,
                                         anchors_checked=checked)

    torch.cuda.set_sync_debug_mode("error")
    try:
        out = step(True)
        with pytest.raises(RuntimeError, match="synchroniz"):  # the device-side anchor check does read back
            step(False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.logits.shape == (2, 3, drafter.block_size, 97)
