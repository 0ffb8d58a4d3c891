"""Hunt the NaN that appeared in the KV caches of uniform/ragged captured steps at batch 128
(bench/results/h200-2026-11-30-sched/README.md) on a CUDA machine.

Hypothesis under test: a read of memory no step wrote (its value depends on what earlier
engines left in recycled device memory). Three phases, SmolLM2 + the shipped drafter:

1. sequence:  ragged engines at batch 1, 4, 16, 64, then 128 in one process (the failing order);
2. poisoned graphs: free device memory filled with NaN and released to the driver, then a
   fresh ragged engine at batch 128 (its graph pool is carved from the poisoned memory);
3. poisoned eager device steps: the same step functions uncaptured, on NaN-filled cached
   blocks, with forward hooks that name the first module whose output holds a NaN.

After every step of phases 2-3 the target and drafter caches are scanned: the first step and
layer with a NaN are reported. Writes OUT/nan_hunt.json.

    python bench/nan_hunt.py OUT_DIR COST_TABLE [mode=ragged] [batch=128]
    python bench/nan_hunt.py /tmp/x none mode=full batch=3 engine=cpu    # CPU smoke of the script
"""

from __future__ import annotations

import dataclasses
import gc
import json
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def compose(cost_table: str, engine: str):
    from hydra import compose as hcompose, initialize_config_dir

    root = Path(__file__).resolve().parents[1]
    table = "null" if cost_table == "none" else cost_table
    with initialize_config_dir(config_dir=str(root / "conf"), version_base=None):
        return hcompose("bench_sched_graphs", overrides=[f"engine={engine}", f"engine.cost_table={table}"])


def poison_free_memory(release: bool) -> int:
    """Fill most free device memory with NaN; release=True hands it back to the driver so that
    the next cudaMalloc (e.g. a graph's private pool) is likely to receive those pages."""
    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    n = int(free * 0.85) // 4
    x = torch.full((n,), float("nan"), device="cuda")
    torch.cuda.synchronize()
    del x
    if release:
        torch.cuda.empty_cache()
    return n * 4


def nan_layers(cache) -> list[int]:
    if cache is None:
        return []
    bad = torch.isnan(cache.k).flatten(1).any(1) | torch.isnan(cache.v).flatten(1).any(1)
    return [int(i) for i in torch.nonzero(bad).flatten().tolist()]


def run_engine(first, ecfg, prompts, batch: int, steps: int, watch: bool, hooks: bool) -> dict:
    from dspark.config import SamplingParams
    from dspark.engine import Engine

    eng = Engine(first.target, first.tokenizer, ecfg, first.drafter)
    first_nan: dict = {}
    handles = []
    if hooks:
        for tag, model in (("target", first.target), ("drafter", first.drafter)):
            for name, mod in model.named_modules():
                def hook(m, inp, out, name=f"{tag}.{name}"):
                    t = out[0] if isinstance(out, tuple) else out
                    if "module" not in first_nan and isinstance(t, torch.Tensor) and t.is_floating_point() \
                            and torch.isnan(t).any():
                        ins = [bool(torch.isnan(i).any()) for i in inp if isinstance(i, torch.Tensor)
                               and i.is_floating_point()]
                        first_nan["module"] = {"name": name, "inputs_nan": ins, "shape": list(t.shape)}
                handles.append(mod.register_forward_hook(hook))
    sp = SamplingParams(temperature=0.0, max_tokens=steps * 8, ignore_eos=True)
    for i in range(batch):
        eng.add_request(prompts[i % len(prompts)], sp)
    out = {"batch": batch, "error": None, "steps": 0}
    try:
        for s in range(steps):
            if not eng.has_unfinished():
                break
            eng.step()
            out["steps"] = s + 1
            if watch:
                t, d = nan_layers(eng.runner.cache), nan_layers(eng.runner.draft_cache)
                if (t or d) and "cache" not in first_nan:
                    first_nan["cache"] = {"step": s, "target_layers": t[:6], "drafter_layers": d,
                                          "last_step": repr(eng.last_step)[:300]}
                    break
    except Exception as e:  # noqa: BLE001 - recorded, the hunt goes on
        out["error"] = "".join(traceback.format_exception_only(type(e), e))[-1500:]
    finally:
        for h in handles:
            h.remove()
    c = eng.counters()
    out.update(first_nan=first_nan, graph_replays=c.get("graph_replays"), trimmed=c.get("trimmed_steps"),
               eager=c.get("graph_eager_steps"))
    del eng
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def main() -> None:
    out_dir, table = Path(sys.argv[1]), sys.argv[2]
    kv = dict(a.split("=", 1) for a in sys.argv[3:])
    mode, big = kv.get("mode", "ragged"), int(kv.get("batch", 128))
    from runners.common import build_engine, to_engine_config
    from workloads.registry import build_workload, make_spec

    cuda = torch.cuda.is_available()
    cfg = compose(table, kv.get("engine", "h200"))
    from omegaconf import OmegaConf

    arm = OmegaConf.to_container(cfg.arms[mode], resolve=True)
    base = to_engine_config({**OmegaConf.to_container(cfg.engine, resolve=True), **arm})
    first = build_engine(cfg, dataclasses.replace(base, verify="full", cost_table=None, cuda_graphs=False,
                                                  overlap=False, max_num_seqs=256))
    wl = build_workload(make_spec("poetry", num_prompts=256, seed=0, greedy_replica_count=0))
    prompts = [p.messages if p.messages is not None else p.prompt for p in wl.prompts()]
    res: dict = {"mode": mode, "batch": big, "phases": {}}

    def cfg_for(b: int):
        return dataclasses.replace(base, max_num_seqs=b)

    print("phase 1: sequence", flush=True)
    res["phases"]["sequence"] = [run_engine(first, cfg_for(b), prompts, b, 40, watch=False, hooks=False)
                                 for b in (1, 4, 16, 64, big) if b <= big]
    print(json.dumps(res["phases"]["sequence"][-1])[:600], flush=True)
    print("phase 2: poisoned, graphs", flush=True)
    res["phases"]["poisoned_graphs"] = {"poisoned_bytes": poison_free_memory(release=True) if cuda else 0,
                                        **run_engine(first, cfg_for(big), prompts, big, 40, watch=True, hooks=False)}
    print(json.dumps(res["phases"]["poisoned_graphs"])[:600], flush=True)
    print("phase 3: poisoned, eager device steps with hooks", flush=True)
    eager_cfg = cfg_for(big)
    if cuda:
        poison_free_memory(release=False)
    from dspark.engine import Engine

    orig_init = Engine.__init__

    def no_graphs_init(self, *a, **k):
        orig_init(self, *a, **k)
        self.graph.use_graphs = False

    Engine.__init__ = no_graphs_init
    try:
        res["phases"]["poisoned_eager"] = run_engine(first, eager_cfg, prompts, big, 25, watch=True, hooks=True)
    finally:
        Engine.__init__ = orig_init
    print(json.dumps(res["phases"]["poisoned_eager"])[:600], flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "nan_hunt.json").write_text(json.dumps(res, indent=2, default=str))


if __name__ == "__main__":
    main()
