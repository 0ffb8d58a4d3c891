"""CPU fp32 experiment: sampled outputs of target-only vs scheduled DSpark against the tiny target's exact
distribution (PIT + KS under a float32 teacher-forced re-scoring; exact chi-square of tokens 1 and 2)."""
import sys, os, time, json, math, tempfile
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main")
import numpy as np, torch
from scipy import stats as sps
from dspark.config import SamplingParams
from dspark.engine import Engine
from dspark.cost_table import CostTable
from dspark.bench.reference import ReferenceScorer
from dspark.bench.distribution import request_pits, distribution_check
from tiny import tiny_target, tiny_drafter, tiny_engine_config
from test_engine_lossless import exact_marginals

torch.set_num_threads(1)
T = float(os.environ.get("TEMP", "0.7"))
N = int(os.environ.get("N", "2000"))
L = int(os.environ.get("L", "24"))
CONC = int(os.environ.get("CONC", "128"))
VOCAB = int(os.environ.get("VOCAB", "97"))
PROMPT = [5, 17, 33]

target = tiny_target(11, scale=float(os.environ.get("SCALE", "2.0")), vocab=VOCAB)
drafter = tiny_drafter(target, 12, block_size=4)

def steep(eng, path):
    counts = list(range(1, 257)) + list(range(264, 8193, 8))
    CostTable(token_counts=tuple(counts), theta_ms=tuple(1.0 + 0.5 * m for m in counts), fixed_overhead_ms=0.5,
              fingerprint=eng.fingerprint()).save(path)

def config(name):
    base = dict(max_num_seqs=CONC, max_num_batched_tokens=8192, num_kv_blocks=CONC * 16 + 64, max_model_len=256)
    if name == "target":
        return dict(spec="off", **base)
    if name == "full":
        return dict(verify="full", **base)
    sched = dict(verify="ragged", min_verify_len=0, service_cost=True, budget_lag=2, cuda_graphs=True, overlap=True, **base)
    variants = {
        "sched": {},
        "sched_mvl1": dict(min_verify_len=1),
        "sched_nosvc": dict(service_cost=False),
        "sched_lag1_nooverlap": dict(overlap=False, budget_lag=1),
        "sched_eager": dict(cuda_graphs=False, overlap=False, budget_lag=2),
        "sched_forced": dict(force_budget_frac=0.5, force_trimmed_path=True),
    }
    sched.update(variants[name])
    return sched

def run(name):
    cfg = config(name)
    drf = None if cfg.get("spec") == "off" else drafter
    table = None
    if cfg.get("verify", "full") != "full" and drf is not None:
        probe = Engine(target, None, tiny_engine_config(**cfg), drf)
        table = os.path.join(tempfile.mkdtemp(), "t.json"); steep(probe, table)
    eng = Engine(target, None, tiny_engine_config(cost_table=table, **cfg), drf)
    sps_ = [SamplingParams(temperature=T, max_tokens=L, ignore_eos=True, seed=1000003 * i + 7) for i in range(N)]
    t0 = time.time()
    outs = eng.generate([list(PROMPT)] * N, sps_)
    c = eng.counters()
    info = {k: c.get(k) for k in ("steps", "trimmed_steps", "depth_zero_rows", "preemptions", "eager_steps",
                                  "graph_eager_steps", "pipelined_steps", "discarded_row_steps", "window_tokens",
                                  "drafted_tokens", "accepted_tokens", "service_cost/floor_ms")}
    info["gen_s"] = round(time.time() - t0, 1)
    return [o.token_ids for o in outs], info

def pits(toks_list, seed=0):
    scorer = ReferenceScorer(target)
    gen = torch.Generator().manual_seed(seed)
    items = [(list(PROMPT), t) for t in toks_list]
    us = []
    params = SamplingParams(temperature=T, max_tokens=L, ignore_eos=True)
    for i, logits in scorer.iter_logits(items, reference=True):
        us.append(request_pits(logits, torch.tensor(toks_list[i]), params, gen).numpy())
    return np.concatenate(us), np.stack([u for u in us])

if __name__ == "__main__":
    names = sys.argv[1:] or ["target", "sched"]
    p1, p2 = exact_marginals(target, T, prompt=tuple(PROMPT))
    res = {}
    for name in names:
        toks, info = run(name)
        u, U = pits(toks)
        ks = sps.kstest(u, "uniform")
        arr = torch.tensor([t[:2] for t in toks])
        chi = {}
        for pos, p in ((0, p1), (1, p2)):
            cnt = torch.bincount(arr[:, pos], minlength=VOCAB).double().numpy()
            e = p.double().numpy() * N
            keep = e >= 5
            obs = np.append(cnt[keep], cnt[~keep].sum()); exp = np.append(e[keep], e[~keep].sum())
            st = ((obs - exp) ** 2 / exp).sum(); df = len(obs) - 1
            chi[f"tok{pos+1}"] = (round(float(st), 1), df, float(sps.chi2.sf(st, df)))
        # per-position KS (each column i.i.d. across requests)
        pos_p = [float(sps.kstest(U[:, j], "uniform").pvalue) for j in range(U.shape[1])]
        res[name] = dict(n=int(u.size), D=float(ks.statistic), p=float(ks.pvalue), chi=chi,
                         min_pos_p=min(pos_p), fisher_pos=float(sps.combine_pvalues(pos_p).pvalue), **info)
        print(name, json.dumps(res[name]), flush=True)
