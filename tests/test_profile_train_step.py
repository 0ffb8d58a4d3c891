"""bench/profile_train_step.py, the census of a drafter training step, on a tiny random target on the CPU: the step
is timed and every phase of the trainer's profiler ranges is found; the synthetic data has the lengths asked for;
bad settings and a machine without CUDA are refused with a reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from dspark.training.trainer import STEP_PHASES, DrafterTrainer, TrainConfig
from tiny import tiny_drafter, tiny_target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import profile_train_step as pts  # noqa: E402


def test_synthetic_lengths_and_prompt_shares():
    data = pts.synthetic_dataset(2000, 432, 0.52, vocab=97)
    lengths = (data.offsets[1:] - data.offsets[:-1]).float()
    assert 420 < float(lengths.mean()) < 445 and int(lengths.min()) >= 120 and int(lengths.max()) <= 747
    share = data.prompt_lens.float() / lengths
    assert 0.5 < float(share.mean()) < 0.54 and bool((data.prompt_lens.long() <= lengths.long() - 2).all())
    assert int(data.tokens.min()) >= 3 and int(data.tokens.max()) < 97
    with pytest.raises(ValueError, match="prompt_share"):
        pts.synthetic_dataset(10, 100, 0.9, vocab=97)


def test_every_phase_of_a_step_is_timed_on_a_tiny_model(tmp_path):
    torch.set_num_threads(1)
    target = tiny_target()
    data = pts.synthetic_dataset(64, 40, 0.5, vocab=target.cfg.vocab_size)
    cfg = TrainConfig(output_dir=str(tmp_path / "run"), max_steps=100, batch_size=4, max_len=64, anchors_per_seq=4,
                      bucket_batches=4, warmup_steps=2, progress=False)
    trainer = DrafterTrainer(target, tiny_drafter(target), data, cfg)
    result = pts.profile_steps(trainer, steps=2, profiled=2, top=5, warmup=1)
    assert trainer.step == 5 and result["steps_per_s"] > 0
    assert list(result["phases"]) == list(STEP_PHASES)
    assert all(v["host_ms"] > 0 for v in result["phases"].values()), result["phases"]
    assert result["kernels_per_step"] == 0 and result["top_kernels"] == []  # no device: nothing on a GPU
    lines = pts.report_lines(result)
    assert lines[0].split()[1] == "steps/s:" and any(line.startswith("train/loss") for line in lines)
    with pytest.raises(ValueError, match="steps and profiled"):
        pts.profile_steps(trainer, steps=0, profiled=1)
    # the batch lengths of the steps it ran, as the trainer chose them; the timed ones at a length not seen before
    lengths = pts.step_lengths(trainer, 0, 5)
    assert len(lengths) == 5 and all(2 <= n <= 64 for n in lengths)
    assert lengths == pts.step_lengths(trainer, 0, 5)  # a pure function of the step
    assert pts.new_lengths([5, 5, 6, 7, 6, 8], 2) == 3 and pts.new_lengths([5, 6], 2) == 0
    result["timed_steps_at_a_new_length"] = 1
    assert pts.report_lines(result)[0].endswith("; 1 timed steps at a batch length not seen before")


def test_the_command_line_refuses_unknown_settings_and_a_machine_without_cuda(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="unknown settings"):
        pts.main([str(tmp_path), "stepz=3"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="CUDA machine"):
        pts.main([str(tmp_path)])
    assert not (tmp_path / "train_step_profile.json").exists()
