"""Count the aten ops a device-resident verify step runs outside the models, on the CPU.

A captured step launches one kernel per aten op (roughly), and at batch 1 on the H200 each tiny
one costs about a microsecond of launch latency. This counts, with a TorchDispatchMode, the ops
``GraphDecoder._verify_stage`` + ``_commit_state`` run besides the target forward, the drafter's
context write and the logits (those are counted apart), for target-only (G=0) and DSpark (G=7)
full, uniform and ragged steps, on the torch metadata path and on the fused Triton kernels
(kernels/verify_packing.py, under the interpreter).

    OMP_NUM_THREADS=1 TRITON_INTERPRET=1 python bench/step_metadata_ops.py [METADATA_IMPL[/WINDOW_IMPL] ...]
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    sys.path.insert(0, str(p))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from dspark.config import SamplingParams  # noqa: E402
from dspark.engine import Engine  # noqa: E402
from tiny import tiny_drafter, tiny_engine_config, tiny_target  # noqa: E402


def _storages(x) -> set:
    out = set()
    for t in torch.utils._pytree.tree_leaves(x):
        if isinstance(t, torch.Tensor):
            out.add(t.untyped_storage().data_ptr())
    return out


class _Count(TorchDispatchMode):
    """ops: every aten op dispatched outside the models; launches: those that would run a kernel on
    a GPU (in-place ops, and ops whose output is new memory, less empty allocations; views and
    no-op conversions excluded); a Triton kernel launch does not dispatch and is counted apart."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.launches: Counter[str] = Counter()
        self.model_ops = 0
        self.paused = 0
        self.in_triton = 0  # the interpreter's own tensor handling is not a step op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket.__name__)
        out = func(*args, **(kwargs or {}))
        if self.in_triton:
            return out
        if self.paused:
            self.model_ops += 1
            return out
        self.ops[name] += 1
        inplace = name.endswith("_") and not name.startswith("_")
        fresh = not (_storages(out) & _storages((args, kwargs)))
        if inplace or (fresh and not name.startswith("empty")):
            self.launches[name] += 1
        return out


class _Paused:
    """Wraps a model call so that its ops are counted as model ops."""

    def __init__(self, mode: _Count, fn):
        self.mode, self.fn = mode, fn

    def __call__(self, *a, **k):
        self.mode.paused += 1
        try:
            return self.fn(*a, **k)
        finally:
            self.mode.paused -= 1


class _TargetProxy:
    def __init__(self, mode, target):
        self._t, self._mode = target, mode

    def __call__(self, *a, **k):
        return _Paused(self._mode, self._t)(*a, **k)

    def compute_logits(self, *a, **k):
        return _Paused(self._mode, self._t.compute_logits)(*a, **k)

    def __getattr__(self, name):
        return getattr(self._t, name)


def count(spec: str, mode: str, impl: str, window_impl: str, batch: int = 1) -> tuple[Counter, int]:
    target = tiny_target(3)
    drafter = tiny_drafter(target, 4, block_size=7) if spec == "dspark" else None
    eng = Engine(target, None, tiny_engine_config(spec=spec, cuda_graphs=True, max_num_seqs=4), drafter)
    for i in range(batch):
        eng.add_request(list(range(3, 12 + i)), SamplingParams(max_tokens=40, ignore_eos=True))
    while eng.counters()["graph_eager_steps"] < 2:
        eng.step()
    gd = eng.graph
    if impl != "torch":
        if not hasattr(gd, "metadata_impl"):
            raise SystemExit("this tree has no fused metadata path (GraphDecoder.metadata_impl)")
        gd.metadata_impl = impl
    gd.window_impl = window_impl  # the ragged window allocation (torch ops, or one Triton kernel as on a GPU)
    R = gd.batch_buckets[0] if mode == "full" else batch
    T = R * gd.M
    if mode == "uniform":
        gd.tier.fill_(3)
    if mode == "ragged":
        gd.extra.fill_(2)
    counter = _Count()
    triton_launches = [0]
    import triton.runtime.interpreter as interp

    real_launch = interp.InterpretedFunction.run

    def counted(self, *a, **k):
        if not counter.paused:
            triton_launches[0] += 1
        counter.in_triton += 1
        try:
            return real_launch(self, *a, **k)
        finally:
            counter.in_triton -= 1

    interp.InterpretedFunction.run = counted
    with torch.inference_mode():
        if gd.G:
            gd._draft_stage(R)
        real_target = gd.target
        gd.target = _TargetProxy(counter, real_target)
        if gd.G:
            gd.drafter = type("D", (), {})()
            gd.drafter.context_kv = _Paused(counter, eng.runner.drafter.context_kv)
        try:
            with counter:
                gd._verify_stage(T, R, mode)
        finally:
            interp.InterpretedFunction.run = real_launch
            gd.target = real_target
            gd.drafter = eng.runner.drafter
    return counter, triton_launches[0]


def main() -> None:
    cases = [("off", "full"), ("dspark", "full"), ("dspark", "uniform"), ("dspark", "ragged")]
    # (metadata impl, window-allocation impl): the CPU engine's default; a GPU engine on the Triton
    # backend without the fused metadata (engine.kernels.fused_step_metadata=false); and with it.
    impls = [("torch", "torch"), ("torch", "triton"), ("triton", "triton")]
    if len(sys.argv) > 1:
        impls = [tuple(a.split("/")) if "/" in a else (a, a) for a in sys.argv[1:]]
    for spec, mode in cases:
        for impl, window_impl in impls:
            if mode != "ragged" and window_impl != impl:
                continue  # the window allocation runs in ragged steps only
            c, tl_launches = count(spec, mode, impl, window_impl)
            launches = sum(c.launches.values())
            windows = window_impl if mode == "ragged" else "-"
            print(f"{spec:6s} {mode:7s} metadata={impl:6s} windows={windows:6s}: {sum(c.ops.values()):3d} aten ops "
                  "outside the models, "
                  f"{launches:3d} of them kernel launches, + {tl_launches} Triton launches "
                  f"({c.model_ops} aten ops inside the models)", flush=True)
            print("    launches:", dict(sorted(c.launches.items(), key=lambda kv: -kv[1])), flush=True)


if __name__ == "__main__":
    main()
