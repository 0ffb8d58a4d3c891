"""Host work of a continuous-batching service step, by engine function (a diagnostic, not a test).

A closed loop at concurrency C (N = 4 x C requests, mixed prompt lengths, output lengths drawn from
[MIN_NEW, MAX_NEW] with ignore_eos, so requests join and retire every few steps as in runners.ab)
through a device-resident engine (graphs + overlap). Every host function of the service step is
wrapped with a timer; the table gives ms per step over the whole run and per call. ``host`` is a
step() call's wall time minus the time it waited for the device (``wait``); on a CPU the forward runs
inside ``launch`` and ``prefill``, so there only the other rows are host work.

On a GPU: a SmolLM2-shaped target with random weights (bf16) and, for SPEC=dspark, the shipped
drafter; on a CPU a tiny random model. Prompt lengths: PROMPT_LENS, a JSON file with
``prompt_tokens`` (default bench/prompt_lengths_mixed_chat.json), cut to the context.

    python bench/service_host_split.py OUT_DIR [C=256] [SPEC=off|dspark] [REPEATS=1]
    REQUESTS_PER_SLOT=8 python bench/service_host_split.py ...   # 8 x C requests instead of 4 x C
    PREFILL_STREAM=0 python bench/service_host_split.py ...      # prefills on the decode stream (engine.prefill_stream)
    TIMING=1 python bench/service_host_split.py ...   # also CUDA events around every graph replay
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dspark.config import EngineConfig, ModelConfig, SamplingParams  # noqa: E402
from dspark.engine import Engine  # noqa: E402
from dspark.graph_decode import GraphDecoder  # noqa: E402
from dspark.models.drafter import DSparkDrafter  # noqa: E402
from dspark.models.llama import TargetModel  # noqa: E402
from dspark.scheduler import Scheduler  # noqa: E402

ASSET = Path(__file__).resolve().parents[1] / "dspark/assets/dspark-smollm2"
CUDA = torch.cuda.is_available()
# (owner, method, label): the host functions of a device-resident service step.
TIMED = ((Engine, "_reserve_rows_ahead", "reserve_pages"), (Scheduler, "schedule_prefills", "schedule_prefills"),
         (Engine, "_prefill", "prefill"), (GraphDecoder, "join", "join"), (Engine, "_graph_decision", "plan"),
         (GraphDecoder, "launch", "launch"), (Engine, "_commit_launched", "commit"), (GraphDecoder, "set_table_entries", "table_entries"),
         (Engine, "_commit_rows", "commit_rows"), (GraphDecoder, "retire", "retire"), (Engine, "_finish", "finish"))


def models(spec: str):
    torch.manual_seed(0)
    if CUDA:
        mcfg = ModelConfig.from_dict(json.loads((ASSET / "config.json").read_text())["target"])
        target = TargetModel(mcfg)
        with torch.no_grad():
            for n, p in target.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0, 1.0 if "embed" in n else 0.05)
        target = target.to("cuda", torch.bfloat16)
        drafter = DSparkDrafter.load(str(ASSET), mcfg, device="cuda", dtype=torch.bfloat16) if spec == "dspark" else None
        return target, drafter
    from bench.host_overhead import TINY, TINY_DRAFTER  # the tiny random model of the host-time diagnostics

    return TargetModel(TINY), DSparkDrafter(TINY, TINY_DRAFTER) if spec == "dspark" else None


def engine_config(concurrency: int, spec: str) -> EngineConfig:
    if CUDA:
        return EngineConfig(device="cuda", dtype="bfloat16", attention_backend="triton", max_num_seqs=concurrency,
                            kv_cache_tokens=None, max_model_len=2048, max_num_batched_tokens=8192, spec=spec, verify="full",
                            cuda_graphs=True, overlap=True, budget_lag=2,
                            prefill_stream=os.environ.get("PREFILL_STREAM", "1") == "1")
    return EngineConfig(device="cpu", dtype="float32", attention_backend="torch", max_num_seqs=concurrency,
                        kv_cache_tokens=concurrency * 400, max_model_len=400, max_num_batched_tokens=2048, spec=spec,
                        verify="full", cuda_graphs=True, overlap=True, budget_lag=2)


def main() -> None:
    out = Path(sys.argv[1])
    kv = dict(a.split("=", 1) for a in sys.argv[2:])
    C, spec, repeats = int(kv.get("C", 256)), kv.get("SPEC", "off"), int(kv.get("REPEATS", 1))
    lo, hi = int(os.environ.get("MIN_NEW", 60)), int(os.environ.get("MAX_NEW", 256))
    lens_file = os.environ.get("PROMPT_LENS", str(Path(__file__).with_name("prompt_lengths_mixed_chat.json")))
    lengths = json.loads(Path(lens_file).read_text())["prompt_tokens"]
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for owner, name, label in TIMED:
        fn = getattr(owner, name, None)
        if fn is None:  # an engine without this function (an older commit): not timed
            continue

        def timed(*a, _fn=fn, _label=label, **k):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                times[_label] += time.perf_counter() - t0
                calls[_label] += 1
        setattr(owner, name, staticmethod(timed) if isinstance(owner.__dict__[name], staticmethod) else timed)
    prefill = GraphDecoder.prefill

    def counted_prefill(self, segments, **kw):
        bucket = prefill(self, segments, **kw)
        times["prefill_real_tokens"] += sum(len(s.tokens) for s in segments)
        times["prefill_bucket_tokens"] += bucket
        return bucket
    GraphDecoder.prefill = counted_prefill
    collect = GraphDecoder.collect

    def timed_collect(launched):
        res, waited = collect(launched)
        times["wait"] += waited / 1e3
        calls["wait"] += 1
        return res, waited
    GraphDecoder.collect = staticmethod(timed_collect)

    target, drafter = models(spec)
    cfg = engine_config(C, spec)
    eng = Engine(target, None, cfg, drafter)
    eng.capture_graphs()
    rng = random.Random(0)
    room = cfg.max_model_len - hi - 8
    rows = []
    for rep in range(repeats):
        eng.reset()
        N = int(os.environ.get("REQUESTS_PER_SLOT", 4)) * C
        prompts = [[3 + (i * 7 + j) % 400 for j in range(min(rng.choice(lengths), room))] for i in range(N)]
        news = [rng.randint(lo, hi) for _ in range(N)]
        times.clear()
        calls.clear()
        submitted = steps = 0
        wall = 0.0

        def submit():
            nonlocal submitted
            eng.add_request(prompts[submitted], SamplingParams(max_tokens=news[submitted], ignore_eos=True))
            submitted += 1
        for _ in range(C):
            submit()
        timing = CUDA and os.environ.get("TIMING") == "1"
        if timing:
            eng.graph.start_timing()
        while eng.has_unfinished():
            t0 = time.perf_counter()
            outs = eng.step()
            wall += time.perf_counter() - t0
            steps += 1
            for o in outs:
                if o.finish_reason and submitted < N:
                    submit()
        c = eng.counters()
        row = {"repeat": rep, "concurrency": C, "spec": spec, "steps": steps, "wall_s": round(wall, 3),
               "tokens_per_s": round(c["emitted_tokens"] / wall, 1) if wall else None,
               "host_ms_per_step": round((wall - times["wait"]) * 1e3 / steps, 4),
               "device_resident_share": c.get("device_resident_share"), "eager_reasons": dict(eng.eager_reasons),
               "mean_running_batch": c.get("mean_running_batch"),
               "prefill_side_stream_replays": c.get("prefill_side_stream_replays")}
        row["prefill_padding_share"] = round(1 - times["prefill_real_tokens"] / max(times["prefill_bucket_tokens"], 1), 4)
        row["prefill_tokens_per_replay"] = round(times["prefill_real_tokens"] / max(calls["prefill"], 1), 1)
        for label in ["wait"] + [t[2] for t in TIMED]:
            row[f"{label}_ms_per_step"] = round(times[label] * 1e3 / steps, 4)
            row[f"{label}_calls"] = calls[label]
        if timing:  # device ms per graph kind (summed over the run) and the device's idle share
            torch.cuda.synchronize()
            per_kind: dict[str, list[float]] = defaultdict(list)
            for _, events, _ in eng.graph.timing:
                for key, start, end in events:
                    per_kind[str(key[0])].append(start.elapsed_time(end))
            per_prefill: dict[str, list[float]] = defaultdict(list)
            for _, events, _ in eng.graph.timing:
                for key, start, end in events:
                    if key[0] == "prefill":
                        per_prefill[f"T{key[1]}xP{key[2]}"].append(start.elapsed_time(end))
            row["prefill_replays_by_shape"] = {k: {"replays": len(v), "ms_median": round(sorted(v)[len(v) // 2], 4)}
                                               for k, v in sorted(per_prefill.items())}
            for kind, ms in per_kind.items():
                row[f"device_{kind}_ms_per_step"] = round(sum(ms) / steps, 4)
                row[f"device_{kind}_ms_per_replay"] = round(sum(ms) / len(ms), 4)
            summary = eng.graph.timing_summary()
            row["device_idle_fraction"] = summary.get("device_idle_fraction")
            row["step_gap_ms_median"] = summary.get("step_gap_ms_median")
            eng.graph.timing = None
        rows.append(row)
        print(json.dumps(row), flush=True)
    (out / "service_host_split.json").write_text(json.dumps({
        "rows": rows, "cuda": CUDA, "device": torch.cuda.get_device_name() if CUDA else platform.processor(),
        "python": platform.python_version(), "torch": torch.__version__}, indent=2))


if __name__ == "__main__":
    main()
