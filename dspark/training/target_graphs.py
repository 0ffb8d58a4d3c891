"""The frozen target's training forward replayed from CUDA graphs (``train.target_graphs``).

A drafter training step runs the frozen target over the whole batch (:func:`dspark.training.trainer.
dense_target_forward`): about 15 small operations per layer, each launched from Python. On a GPU that forward is
host-bound: the device waits while Python launches its kernels. :class:`TargetForwardGraphs` captures the same
forward once per batch shape and replays it with one launch.

- **Shapes.** A batch of ``B`` sequences padded to length ``S`` is run at ``S`` rounded up to a multiple of
  :data:`LENGTH_MULTIPLE`, so a run whose batches vary in length (``train.bucket_batches``) captures one graph per
  rounded length: 16 graphs at ``train.max_len=2048``. The extra positions hold ``pad_id``. The forward is causal,
  so a real token never sees them, and the caller gets the first ``S`` positions back.
- **Numerics.** The graph runs the operations of the eager forward under the same bf16 autocast (its cast cache off,
  as capture requires), so it computes the same function, but not always bit for bit: on an H200 a replay at a
  batch's own length differed from the eager forward in the last bits (the kernels chosen under capture, attention
  or GEMM, may differ from eager ones), and a padded batch's GEMMs see more rows. The tests hold the two within
  bf16 rounding, and a trainer's losses with and without graphs within 2%.
- **Memory.** The graphs share one memory pool. A replay overwrites the outputs of the previous one, whatever its
  shape, so the returned tensors are valid until the next call: the trainer reads them (forward, loss and backward)
  within the step.
- **Overlap.** A replay returns at once, and nothing the trainer does next reads the device back before the loss (it
  checks the anchors on the host: ``forward_train(anchors_checked=True)``), so the host launches the drafter's forward
  while the device still runs the target's.

CUDA only; :class:`DrafterTrainer` refuses ``train.target_graphs`` on another device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LENGTH_MULTIPLE = 128  # a batch's length is rounded up to this before its graph is looked up or captured


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor  # int64 [B, S_graph]: the input the graph reads
    hidden: torch.Tensor  # [B, S_graph, d]: the final-normed hidden states it writes
    captured: torch.Tensor | None  # [B, S_graph, n*d]: the capture layers' outputs, concatenated


def graph_length(seq_len: int) -> int:
    """The length a batch of ``seq_len`` positions runs at: rounded up to a multiple of :data:`LENGTH_MULTIPLE`."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    return -(-seq_len // LENGTH_MULTIPLE) * LENGTH_MULTIPLE


class TargetForwardGraphs:
    """:func:`dspark.training.trainer.dense_target_forward` of a frozen ``target`` (final-normed hidden states and
    the ``capture_layers`` outputs) from CUDA graphs, captured per (batch rows, rounded length) on first use.

    ``autocast``: capture under bf16 autocast (the trainer's ``bf16_autocast`` on CUDA). ``pad_id`` fills the
    positions past a batch's length. :attr:`captures` counts the graphs captured, :attr:`replays` the calls.
    """

    def __init__(self, target, capture_layers: tuple[int, ...], autocast: bool, pad_id: int = 0,
                 warmup: int = 2):
        device = target.lm_head_weight.device
        if device.type != "cuda":
            raise ValueError(f"TargetForwardGraphs needs the target on a CUDA device, found it on {device}")
        self.target = target
        self.capture_layers = tuple(capture_layers)
        self.autocast = bool(autocast)
        self.pad_id = int(pad_id)
        self.warmup = int(warmup)
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int], _Captured] = {}
        self.captures = 0
        self.replays = 0

    def _forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        from dspark.training.trainer import dense_target_forward

        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast,
                                             cache_enabled=False):
            hidden, captured, _ = dense_target_forward(self.target, ids, self.capture_layers)
        return hidden, captured

    def _capture(self, rows: int, length: int) -> _Captured:
        ids = torch.full((rows, length), self.pad_id, dtype=torch.int64, device=self.device)
        side = torch.cuda.Stream(self.device)  # warm-up off the default stream, as capture requires
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self._forward(ids)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden, captured = self._forward(ids)
        self.captures += 1
        return _Captured(graph, ids, hidden, captured)

    def __call__(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(hidden [B, S, d], captured [B, S, n*d] or None) for ``input_ids`` int64 [B, S] on the target's device:
        views into the graph's outputs, valid until the next call."""
        if input_ids.dim() != 2 or input_ids.dtype != torch.int64 or input_ids.device != self.device:
            raise ValueError(f"input_ids must be int64 [B, S] on {self.device}, got {input_ids.dtype} "
                             f"{tuple(input_ids.shape)} on {input_ids.device}")
        rows, seq_len = input_ids.shape
        key = (rows, graph_length(seq_len))
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._capture(*key)
        entry.ids[:, :seq_len].copy_(input_ids)
        entry.ids[:, seq_len:].fill_(self.pad_id)
        entry.graph.replay()
        self.replays += 1
        cap = None if entry.captured is None else entry.captured[:, :seq_len]
        return entry.hidden[:, :seq_len], cap


__all__ = ["LENGTH_MULTIPLE", "TargetForwardGraphs", "graph_length"]
