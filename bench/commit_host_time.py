"""Host time of one step's commit at R rows: ``Engine._commit_launched`` alone, on synthetic rows (a diagnostic).

A tiny CPU engine holds R running requests that never finish; each call commits a recorded step of R rows (random
accepted counts, the whole block verified, token ids) through the engine's own commit path: the rows' columns,
``_commit_rows``, the step counters and ``EngineStats.record_step``. The device side is a stub that hands back the
recorded step (no wait, no retire), so what is timed is the host's Python work per row, without a forward between
the calls to cool the caches (``bench/service_host_split.py`` times the commit inside a served loop).

    python bench/commit_host_time.py [ROWS=256] [BLOCK=7] [CALLS=200] [REPEATS=7]

Prints the median over REPEATS of the mean ms per call, and every repeat.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from dspark.config import SamplingParams  # noqa: E402
from dspark.engine import Engine  # noqa: E402
from dspark.graph_decode import Launched, _committed_rows  # noqa: E402
from dspark.request import Request  # noqa: E402
from tiny import tiny_drafter, tiny_engine_config, tiny_target  # noqa: E402  (tests/tiny.py)


class _RecordedSteps:
    """The decoder's part of a commit, for recorded steps: their rows, no wait, nothing to retire."""

    use_graphs = True

    def __init__(self, slots: int):
        self.slots = slots

    @staticmethod
    def collect(launched):
        return _committed_rows(launched.host.tolist()), 0.0

    def bucket_for(self, rows: int) -> int:
        return rows * self.slots

    @staticmethod
    def retire(gone) -> None:
        pass


def main(argv: list[str]) -> None:
    kv = dict(a.split("=", 1) for a in argv)
    R, G = int(kv.get("ROWS", 256)), int(kv.get("BLOCK", 7))
    calls, repeats = int(kv.get("CALLS", 200)), int(kv.get("REPEATS", 7))
    M = G + 1
    target = tiny_target(0)
    cfg = tiny_engine_config(max_num_seqs=R, spec="dspark", verify="full", max_model_len=1 << 20, num_kv_blocks=64,
                             max_num_batched_tokens=2048)
    engine = Engine(target, None, cfg, tiny_drafter(target, 1, block_size=G))
    for i in range(R):
        engine._requests[i] = Request(req_id=i, prompt_ids=[5] * 50, block_size=G,
                                      params=SamplingParams(max_tokens=1 << 40, ignore_eos=True))
    engine.graph = _RecordedSteps(M)
    rng = random.Random(0)
    steps = []
    for _ in range(20):
        host = torch.randint(10, 90, (R, 2 + M), dtype=torch.int64)
        host[:, 0] = torch.tensor([rng.randint(0, G) for _ in range(R)])
        host[:, 1] = G
        steps.append(Launched(req_ids=tuple(range(R)), host=host, survival=None, event=None, bucket=R * M,
                              num_tokens=R * M, launch_ms=0.0))
    per_call = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for j in range(calls):
            engine._commit_launched(steps[j % len(steps)])
        per_call.append((time.perf_counter() - t0) / calls * 1e3)
    print(f"commit of {R} rows (block {G}): {statistics.median(per_call):.4f} ms per call, median of {repeats} "
          f"repeats of {calls} calls: {[round(t, 4) for t in per_call]}")


if __name__ == "__main__":
    main(sys.argv[1:])
