"""Device time of a CUDA-graph-captured call, for the benchmark scripts (bench/)."""

from __future__ import annotations

import statistics
from typing import Callable

import torch


def graph_us(fn: Callable[[int], object], launches: int = 1, replays: int = 20, repeats: int = 5,
             warmup: int = 3) -> float:
    """Median microseconds per call of ``fn(i)`` (i: the call's index in the graph, e.g. to pick a
    weight copy) over ``repeats`` blocks of ``replays`` replays of one graph of ``launches`` calls,
    timed with CUDA events. ``warmup`` eager calls first, on the capture's side stream (compilation,
    lazily created workspaces)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for i in range(warmup):
            fn(i % launches)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(launches):
            fn(i)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / (replays * launches))
    return statistics.median(times)


__all__ = ["graph_us"]
