"""Host time per device-resident step of a scheduled engine whose plan gate skips, against verify-all, on any machine.

A step the plan gate skips (dspark/plan_gate.py) runs the whole drafted block with no planner call, exactly the
work of a verify-all step; whatever host time it costs beyond a verify-all step is overhead of the scheduled
configuration. This runs one greedy workload through two engines on the same tiny random models (the graph
decoder runs its steps eagerly on the CPU) and a steep cost table:

- ``full``: engine.verify=full (no planner);
- ``skipped``: engine.verify=ragged, min_verify_len=0, service_cost=true, with the plan gate's estimates set so
  that every bucket skips (benefit 0 < cost, no probe within the run);

and prints, per engine, the host phases per step() call (the engine's ``host/<phase>_ms_per_step`` counters,
median of ``repeats`` timed runs after a warm-up run) and a cProfile top list of the plan and commit phases
(``Engine._graph_decision`` and ``Engine._commit_launched``) over ``repeats`` more runs. The engines' timed runs
alternate, on one torch thread, so that a busy machine slows both alike. The ``launch`` phase holds the tiny
models' forward on the CPU and is not comparable with a GPU's; on the CPU numpy calls cost more after that
forward than in a micro-benchmark (cold caches), so the phases weigh the number of such calls.

    python bench/host_overhead_skipped_steps.py [concurrency=16] [max_tokens=64] [repeats=5] [top=25]

(each setting as ``name=value``, or positionally in that order; the values shown are the defaults)
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from dspark.config import SamplingParams  # noqa: E402
from dspark.engine import Engine  # noqa: E402
from test_engine_lossless import prompts_for  # noqa: E402
from test_engine_scheduling import device_step_models_and_table  # noqa: E402
from test_plan_gate import skipping_gate  # noqa: E402
from tiny import tiny_engine_config  # noqa: E402

PHASES = ("rows", "prefill", "join", "plan", "launch", "wait", "commit")


def build(kind: str, target, drafter, lag: int, table: str, concurrency: int) -> Engine:
    common = dict(max_num_seqs=concurrency, cuda_graphs=True, overlap=True, budget_lag=lag)
    if kind == "full":
        return Engine(target, None, tiny_engine_config(verify="full", **common), drafter)
    eng = Engine(target, None, tiny_engine_config(verify="ragged", min_verify_len=0, service_cost=True,
                                                  cost_table=table, **common), drafter)
    eng.plan_gate = skipping_gate(eng, probe_every=10**9)  # every bucket skips, no probe due within a run
    return eng


def profiled(engine: Engine, profile: cProfile.Profile) -> None:
    """Profile the engine's plan and commit phases (instance attributes shadow the methods)."""
    for name in ("_graph_decision", "_commit_launched"):
        method = getattr(engine, name)

        def wrapper(*args, _method=method, **kw):
            profile.enable()
            try:
                return _method(*args, **kw)
            finally:
                profile.disable()

        setattr(engine, name, wrapper)


def timed_runs(engines: dict, prompts, params, repeats: int) -> dict:
    """Per engine: the median over ``repeats`` runs of each host phase (ms per step() call), its last run's
    outputs and counters. The engines' runs alternate, so that a busy machine slows both alike."""
    runs = {kind: {p: [] for p in PHASES} for kind in engines}
    last = {}
    for eng in engines.values():
        eng.generate(prompts, params)  # warm-up (the gate's estimates are set already)
    for _ in range(repeats):
        for kind, eng in engines.items():
            eng.reset()
            outputs = [o.token_ids for o in eng.generate(prompts, params)]
            counters = eng.counters()
            for p in PHASES:
                runs[kind][p].append(counters.get(f"host/{p}_ms_per_step", 0.0))
            last[kind] = (outputs, counters)
    return {kind: ({p: statistics.median(v) for p, v in runs[kind].items()},) + last[kind] for kind in engines}


def profile_text(engine: Engine, prompts, params, top: int, runs: int) -> str:
    """A cProfile top list (by own time) of the plan and commit phases of ``runs`` runs."""
    profile = cProfile.Profile()
    profiled(engine, profile)
    for _ in range(runs):
        engine.reset()
        engine.generate(prompts, params)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main(concurrency: int = 16, max_tokens: int = 64, repeats: int = 5, top: int = 25) -> None:
    torch.set_num_threads(1)  # the host phases are single-threaded Python; one thread keeps the forward's noise out
    with tempfile.TemporaryDirectory() as tmp:
        target, drafter, lag, table = device_step_models_and_table(Path(tmp), overlap=True)
        prompts = prompts_for(12, concurrency)
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        engines = {kind: build(kind, target, drafter, lag, table, concurrency) for kind in ("full", "skipped")}
        results = timed_runs(engines, prompts, params, repeats)
        profiles = {kind: profile_text(eng, prompts, params, top, repeats) for kind, eng in engines.items()}
    (a, out_a, ca), (b, out_b, cb) = results["full"], results["skipped"]
    print(f"concurrency {concurrency}, {max_tokens} tokens per request, median of {repeats} runs; "
          f"outputs identical: {out_a == out_b}")
    print(f"{'host ms per step':<18}{'full':>10}{'skipped':>10}{'B - A':>10}")
    for p in PHASES:
        print(f"{p:<18}{a[p]:>10.4f}{b[p]:>10.4f}{b[p] - a[p]:>10.4f}")
    for k in ("host/step_calls", "decode_steps", "plan_gate/skipped_steps"):
        print(f"{k:<24}{ca.get(k, 0):>10}{cb.get(k, 0):>10}")
    for kind, prof in profiles.items():
        print(f"\n==== cProfile, plan + commit phases, {kind} (sorted by own time) ====")
        print(prof)


def parse_args(argv: list[str]) -> dict[str, int]:
    """``name=value`` or positional integers, in main's order; a clear error on anything else."""
    names = ("concurrency", "max_tokens", "repeats", "top")
    settings: dict[str, int] = {}
    for i, arg in enumerate(argv):
        name, sep, value = arg.partition("=")
        if not sep:
            if i >= len(names):
                raise SystemExit(f"too many arguments: {argv!r}; settings: {', '.join(names)}")
            name, value = names[i], arg
        if name not in names:
            raise SystemExit(f"unknown setting {name!r}; settings: {', '.join(names)}")
        try:
            settings[name] = int(value)
        except ValueError:
            raise SystemExit(f"{name} must be an integer, got {value!r}") from None
    return settings


if __name__ == "__main__":
    main(**parse_args(sys.argv[1:]))
