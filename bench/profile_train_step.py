"""Where a drafter training step's time goes: the steps/s of runners.train_drafter's step (DrafterTrainer.train_step,
batch 32, whole sequences, length-bucketed batches, bf16 autocast) on random weights of SmolLM2-135M's and the
shipped drafter's shapes (bench/profile_graph_step.py), on synthetic sequences with a real data run's lengths; then
a torch.profiler census of a few steps: host and device ms per phase (the trainer's profiler ranges,
dspark.training.trainer.STEP_PHASES) and the top kernels by device time. No model is staged: token values do not
change a step's cost. Writes OUT_DIR/NAME.json (name=train_step_profile by default).

    python bench/profile_train_step.py OUT_DIR [steps=30] [profiled=4] [batch=32] [max_len=2048] [top=20]
        [mean_len=432] [prompt_share=0.52] [target_graphs=0] [warmup=3] [name=train_step_profile]  # on a CUDA machine

``target_graphs=1`` replays the frozen target's forward from CUDA graphs (``train.target_graphs``); a graph is
captured the first time a batch length (rounded up to 128) comes, so give the warm-up steps enough batches to meet
every length (``warmup=40`` at max_len=2048); the result counts the graphs captured before and during the timing.

The default lengths are the fifth training stage's data (bench/results/h100-2026-12-05-drafter15/: 432 tokens per
sequence on average, 52% of them prompt): lengths uniform in [mean_len/3.6, 1.73 mean_len], each split at
prompt_share (between 0.3 and 0.7 of it at random, around that mean).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dspark.models.drafter import DSparkDrafter  # noqa: E402
from dspark.models.llama import TargetModel  # noqa: E402
from dspark.training.data import TokenDataset  # noqa: E402
from dspark.training.trainer import STEP_PHASES, DrafterTrainer, TrainConfig  # noqa: E402


def synthetic_dataset(n: int, mean_len: int, prompt_share: float, vocab: int, seed: int = 0) -> TokenDataset:
    """``n`` sequences of random tokens, lengths uniform in [mean_len/3.6, 1.73 mean_len] (mean about ``mean_len``),
    each one's prompt a random share in [prompt_share - 0.2, prompt_share + 0.2] of it."""
    if not 0.25 <= prompt_share <= 0.75:
        raise ValueError(f"prompt_share must be in [0.25, 0.75], got {prompt_share}")
    g = torch.Generator().manual_seed(seed)
    lo, hi = max(4, int(mean_len / 3.6)), max(8, int(1.73 * mean_len))
    lengths = torch.randint(lo, hi + 1, (n,), generator=g)
    share = prompt_share - 0.2 + 0.4 * torch.rand(n, generator=g)
    prompt_lens = (lengths * share).long().clamp(1, None)
    prompt_lens = torch.minimum(prompt_lens, lengths - 2)
    tokens = torch.randint(3, vocab, (int(lengths.sum()),), generator=g, dtype=torch.int32)
    return TokenDataset.from_sequences(torch.split(tokens, lengths.tolist()), prompt_lens.tolist(), ["synthetic"] * n)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_steps(trainer: DrafterTrainer, steps: int, profiled: int, top: int = 20, warmup: int = 3) -> dict:
    """Time ``steps`` training steps after ``warmup``, then profile ``profiled`` more: per-step wall ms, host and
    device ms per phase (per step) and the ``top`` kernels (device ms per step, calls per step)."""
    if steps < 1 or profiled < 1 or warmup < 0:
        raise ValueError(f"steps and profiled must be >= 1 and warmup >= 0, got {steps}, {profiled}, {warmup}")
    device = trainer.device
    for _ in range(warmup):
        trainer.train_step()
    _sync(device)
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.train_step()
        _sync(device)
        walls.append((time.perf_counter() - t0) * 1e3)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(profiled):
            trainer.train_step()
        _sync(device)
    phases = {name: {"host_ms": 0.0, "device_ms": 0.0} for name in STEP_PHASES}
    kernels_us: Counter = Counter()
    kernel_calls: Counter = Counter()
    for e in prof.events():
        on_device = e.device_type == torch.autograd.DeviceType.CUDA
        if e.name in phases:  # a phase's range: its host time, and its kernels' device time (device_time_total)
            if not on_device:  # (the range's copy on the device timeline spans its kernels, idle gaps included)
                phases[e.name]["host_ms"] += e.cpu_time_total / 1e3 / profiled
                phases[e.name]["device_ms"] += e.device_time_total / 1e3 / profiled
        elif on_device:
            kernels_us[e.name[:100]] += e.device_time_total
            kernel_calls[e.name[:100]] += 1
    walls_t = torch.tensor(walls)
    return {
        "steps_timed": steps, "steps_profiled": profiled,
        "wall_ms_per_step": {"median": float(walls_t.median()), "min": float(walls_t.min()),
                             "max": float(walls_t.max())},
        "steps_per_s": 1e3 / float(walls_t.median()),
        "phases": {k: {kk: round(vv, 3) for kk, vv in v.items()} for k, v in phases.items()},
        "device_ms_per_step": sum(kernels_us.values()) / 1e3 / profiled,
        "kernels_per_step": sum(kernel_calls.values()) / profiled,
        "top_kernels": [{"kernel": k, "device_ms_per_step": round(v / 1e3 / profiled, 3),
                         "calls_per_step": kernel_calls[k] / profiled} for k, v in kernels_us.most_common(top)],
    }


def step_lengths(trainer: DrafterTrainer, first: int, count: int) -> list[int]:
    """The padded batch length of training steps first..first+count-1 (the trainer's own batch choice)."""
    return [int(trainer.step_batch(step)[1].input_ids.shape[1]) for step in range(first, first + count)]


def new_lengths(lengths: list[int], seen_before: int) -> int:
    """How many of ``lengths[seen_before:]`` (the timed steps) have a batch length no earlier step had: a new shape
    costs the libraries' kernel selection on the host, which a long run pays once per length."""
    seen, new = set(lengths[:seen_before]), 0
    for length in lengths[seen_before:]:
        new += length not in seen
        seen.add(length)
    return new


def report_lines(result: dict) -> list[str]:
    """The profile as lines of text: steps/s, each phase's host and device ms per step, the top kernels."""
    w = result["wall_ms_per_step"]
    new = result.get("timed_steps_at_a_new_length")
    lines = [f"{result['steps_per_s']:.2f} steps/s: {w['median']:.1f} ms per step (median of "
             f"{result['steps_timed']}; {w['min']:.1f} .. {w['max']:.1f}); device busy "
             f"{result['device_ms_per_step']:.1f} ms per step in {result['kernels_per_step']:.0f} kernels"
             + ("" if new is None else f"; {new} timed steps at a batch length not seen before"),
             f"{'phase':24} {'host ms':>9} {'device ms':>10}"]
    for name, v in result["phases"].items():
        lines.append(f"{name:24} {v['host_ms']:9.2f} {v['device_ms']:10.2f}")
    lines.append("top kernels (device ms per step, calls per step):")
    for k in result["top_kernels"]:
        lines.append(f"  {k['device_ms_per_step']:8.3f} x{k['calls_per_step']:<6g} {k['kernel']}")
    return lines


def main(argv: list[str]) -> dict:
    if not argv:
        raise SystemExit(__doc__)
    out_dir = Path(argv[0])
    kv = dict(a.split("=", 1) for a in argv[1:])
    unknown = set(kv) - {"steps", "profiled", "batch", "max_len", "top", "mean_len", "prompt_share", "target_graphs",
                         "warmup", "name"}
    if unknown:
        raise SystemExit(f"unknown settings {sorted(unknown)}; see the usage:\n{__doc__}")
    from profile_graph_step import DRAFTER, SMOLLM2

    if not torch.cuda.is_available():
        raise SystemExit("profile_train_step.py times the GPU step: run it on a CUDA machine")
    torch.manual_seed(0)
    batch, max_len = int(kv.get("batch", 32)), int(kv.get("max_len", 2048))
    data = synthetic_dataset(batch * 64, int(kv.get("mean_len", 432)), float(kv.get("prompt_share", 0.52)),
                             SMOLLM2.vocab_size)
    cfg = TrainConfig(output_dir=str(out_dir / "run"), max_steps=10**6, batch_size=batch, max_len=max_len,
                      bucket_batches=16, anchors_per_seq=32, lr=2e-4, warmup_steps=10, device="cuda",
                      progress=False, target_graphs=kv.get("target_graphs", "0") == "1")
    trainer = DrafterTrainer(TargetModel(SMOLLM2), DSparkDrafter(SMOLLM2, DRAFTER), data, cfg)
    graphs = trainer.target_graphs
    warmup = int(kv.get("warmup", 3))
    captured_in_warmup = None
    if graphs is not None:
        for _ in range(warmup):
            trainer.train_step()
        captured_in_warmup, warmup = graphs.captures, 0
    start = trainer.step
    steps = int(kv.get("steps", 30))
    result = profile_steps(trainer, steps, int(kv.get("profiled", 4)), int(kv.get("top", 20)), warmup=warmup)
    # the timed steps at a batch length none before them had (each pays a new shape's kernel selection once)
    lengths = step_lengths(trainer, 0, start + warmup + steps)
    result["timed_steps_at_a_new_length"] = new_lengths(lengths, start + warmup)
    result.update(device=torch.cuda.get_device_name(), batch=batch, max_len=max_len,
                  mean_len=float((data.offsets[1:] - data.offsets[:-1]).float().mean()), torch=torch.__version__,
                  target_graphs=graphs is not None)
    if graphs is not None:
        result.update(graphs_captured_in_warmup=captured_in_warmup, graphs_captured=graphs.captures)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{kv.get('name', 'train_step_profile')}.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(report_lines(result)), flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
