"""Where a steady overlapped graph step's time goes, per verify mode (a diagnostic, not a test).

B rows of a SmolLM2-shaped target with random weights plus the shipped drafter, CUDA graphs and
overlap, forced trims so that every step is a trimmed step (draft graph + verify graph). Per
steady step (medians over the last two thirds): host ms in planning, in each graph replay, in
the rest of launch, in commit (including the event wait) and in the event wait alone; and from
CUDA events around each launch, the device span of a step and the device gap before the next
launch. A host-bound arm shows wait ~ 0 and a gap > 0; a device-bound one a wait > 0 and gap ~ 0.

Arms (env ARMS, comma-separated, run in that order in one process): uniform, ragged (Triton
window allocation), ragged_torchwin (the torch window allocation), uniform_planned and
ragged_planned (no forced trim; random weights make the planner's input meaningless), full (the
fused draft+verify step of verify=full), and forced trims of any size: ``uniform@V`` (every row
verifies V drafts) and ``ragged@F`` (a budget of F x B x G cells). With random target weights
almost no draft is accepted, so every arm's requests grow by one token per step: the arms see the
same contexts step for step, which makes their device times comparable at equal token counts.
PROMPT=N gives every request an N-token prompt (default: 30 to 79 tokens). GRAPH_TIMING=1 adds each
graph's median device ms (CUDA events around every replay), as key=ms(replays).
Run the arms in both orders (e.g. ARMS=uniform,ragged then ARMS=ragged,uniform): the host of a
leased machine drifts, and a drift reads as the later arm's cost.

    python bench/step_host_split.py                      # B=256, STEPS=60 on a GPU
    ARMS=ragged,uniform,ragged,uniform python bench/step_host_split.py
"""
import json, os, sys, time, statistics, collections
sys.path.insert(0, os.getcwd())
import torch
from dspark.config import EngineConfig, ModelConfig, SamplingParams
from dspark.engine import Engine
from dspark.graph_decode import GraphDecoder
from dspark.models.drafter import DSparkDrafter
from dspark.models.llama import TargetModel

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
B = int(os.environ.get("B", 256 if CUDA else 4)); STEPS = int(os.environ.get("STEPS", 60 if CUDA else 12))
ASSET = "dspark/assets/dspark-smollm2"
TABLE = "bench/results/h200-2026-11-30-trim/cost_table.json"
mcfg = ModelConfig.from_dict(json.load(open(f"{ASSET}/config.json"))["target"])
if not CUDA:  # smoke run of this script on a CPU: a small target of the same vocabulary
    mcfg = ModelConfig.from_dict({**mcfg.to_dict(), "num_layers": max(mcfg.num_layers // 10, 3)})
torch.manual_seed(0)
target = TargetModel(mcfg)
with torch.no_grad():
    for n, p in target.named_parameters():
        if p.dim() >= 2: p.normal_(0, 0.05 if "embed" not in n else 1.0)
if CUDA:
    drafter = DSparkDrafter.load(ASSET, mcfg, device=DEV, dtype=torch.bfloat16)
else:
    from dspark.config import DrafterConfig
    cfgd = json.load(open(f"{ASSET}/config.json"))["drafter"]
    cfgd["target_layer_ids"] = [0, 1, 2][: len(cfgd["target_layer_ids"])]
    drafter = DSparkDrafter(mcfg, DrafterConfig.from_dict(cfgd))

T = collections.defaultdict(float)
def timed(cls, name, key):
    f = getattr(cls, name)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); T[key] += (time.perf_counter() - t0) * 1e3; return r
    setattr(cls, name, g)
timed(Engine, "_graph_decision", "plan"); timed(Engine, "_commit_launched", "commit_incl_wait")
timed(Engine, "_reserve_rows_ahead", "tables")
EVS = []
_launch = GraphDecoder.launch
def launch(self, *a, **k):
    e0 = torch.cuda.Event(enable_timing=True) if CUDA else None
    if e0: e0.record()
    t0 = time.perf_counter(); r = _launch(self, *a, **k); T["launch"] += (time.perf_counter() - t0) * 1e3
    if e0:
        e1 = torch.cuda.Event(enable_timing=True); e1.record(); EVS.append((e0, e1))
    return r
GraphDecoder.launch = launch
_run = GraphDecoder._run
def run_(self, key, fn):
    t0 = time.perf_counter(); _run(self, key, fn); T[f"replay:{key[0]}"] += (time.perf_counter() - t0) * 1e3
GraphDecoder._run = run_
_collect = GraphDecoder.collect
def collect(launched):
    res, waited = _collect(launched); T["wait"] += waited; return res, waited
GraphDecoder.collect = staticmethod(collect)

def run(name, verify, torch_windows=False, **over):
    cfg = EngineConfig(device=DEV, dtype="bfloat16" if CUDA else "float32", kv_block_size=16, max_model_len=2048,
                       max_num_seqs=B, max_num_batched_tokens=8192, spec="dspark", verify=verify,
                       attention_backend="triton" if CUDA else "torch", cost_table=TABLE, allow_foreign_cost_table=True,
                       budget_lag=2, cuda_graphs=True, overlap=True, **over)
    eng = Engine(target, None, cfg, drafter)
    if torch_windows:
        eng.graph.window_impl = "torch"  # before any capture: the ragged verify graphs use the torch allocation
    g = torch.Generator().manual_seed(1)
    for i in range(B):
        L = int(torch.randint(30, 80, (1,), generator=g))
        if os.environ.get("PROMPT"):
            L = int(os.environ["PROMPT"])
        eng.add_request(torch.randint(3, 40000, (L,), generator=g).tolist(), SamplingParams(max_tokens=1000, ignore_eos=True))
    if CUDA and os.environ.get("GRAPH_TIMING"):
        eng.graph.start_timing()  # CUDA events around every graph replay: device ms per graph key
    rows = []
    EVS.clear()
    for s in range(STEPS):
        T.clear()
        t0 = time.perf_counter(); eng.step(); wall = (time.perf_counter() - t0) * 1e3
        info = eng.last_step
        running = list(eng.scheduler.running)
        rows.append(dict(wall=wall, **T, tokens=info.num_tokens if info else 0,
                         ctx=statistics.fmean(r.num_tokens for r in running) if running else 0.0))
    if CUDA:
        torch.cuda.synchronize()
    steady = [r for r in rows[STEPS // 3:] if "launch" in r]
    keys = sorted({k for r in steady for k in r})
    med = {k: round(statistics.median([r.get(k, 0.0) for r in steady]), 3) for k in keys}
    c = eng.counters()
    line = f"{name:16s} " + " ".join(f"{k} {v}" for k, v in med.items())
    line += f" | trimmed {c['trimmed_steps']}/{c['steps']} captures {eng.graph.captures}"
    if EVS:
        n = len(steady)
        spans = [a.elapsed_time(b) for a, b in EVS[-n:]]
        gaps = [EVS[i][1].elapsed_time(EVS[i + 1][0]) for i in range(len(EVS) - n, len(EVS) - 1)]
        line += f" | device span/launch {statistics.median(spans):.3f} gap to next launch {statistics.median(gaps):.3f}"
    if eng.graph.timing is not None:
        t = eng.graph.timing_summary(skip_steps=STEPS // 3)
        line += " | graph ms " + " ".join(f"{k}={v}({t['graph_replays_timed'][k]})"
                                         for k, v in t["graph_device_ms_median"].items())
    print(line, flush=True)
    del eng
    if CUDA:
        torch.cuda.empty_cache()

ARMS = {"uniform": ("uniform", False, dict(force_verify_len=5)),
        "ragged": ("ragged", False, dict(force_budget_frac=0.7)),
        "ragged_torchwin": ("ragged", True, dict(force_budget_frac=0.7)),
        "uniform_planned": ("uniform", False, {}), "ragged_planned": ("ragged", False, {}),
        "full": ("full", False, {})}
for a in os.environ.get("ARMS", "uniform,ragged,ragged_torchwin").split(","):
    if a.startswith("uniform@"):
        v, tw, over = "uniform", False, dict(force_verify_len=int(a.split("@")[1]))
    elif a.startswith("ragged@"):
        v, tw, over = "ragged", False, dict(force_budget_frac=float(a.split("@")[1]))
    elif a in ARMS:
        v, tw, over = ARMS[a]
    else:
        raise SystemExit(f"unknown arm {a!r}: use one of {sorted(ARMS)}, uniform@V or ragged@F")
    run(a, v, tw, **over)
