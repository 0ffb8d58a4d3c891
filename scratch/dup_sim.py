"""Null distribution of the A/B distribution guard's pooled KS when every block replays the same seeds.

Exact draws from softmax(logits / T) for n_distinct tokens; each token's randomized PIT is pooled k times with
fresh jitter (the guard's generator), as runners.ab pools the same request's output from each of k blocks. Partial
duplication: a fraction `share` of the tokens is common to all k blocks, the rest fresh per block."""
import sys, numpy as np
from scipy import stats as sps
rng = np.random.default_rng(0)

def steps(n, V, sigma):
    """(cdf_before, p) of n exact draws; order: most probable first (as randomized_pit)."""
    logits = rng.standard_normal((n, V)).astype(np.float32) * sigma
    p = np.exp(logits - logits.max(1, keepdims=True)); p /= p.sum(1, keepdims=True)
    p = -np.sort(-p, axis=1)
    c = np.cumsum(p, axis=1)
    u = rng.random(n)
    idx = (c < u[:, None]).sum(1).clip(max=V - 1)
    w = p[np.arange(n), idx]
    return c[np.arange(n), idx] - w, w

def pooled(n_distinct, k, V, sigma, share):
    n_common = int(n_distinct * share)
    a, w = steps(n_common, V, sigma)
    parts = [np.tile(a, k) + rng.random(n_common * k) * np.tile(w, k)]
    if n_distinct - n_common:
        a2, w2 = steps((n_distinct - n_common) * k, V, sigma)
        parts.append(a2 + rng.random(a2.size) * w2)
    return np.concatenate(parts)

if __name__ == "__main__":
    n_distinct, k, V, trials = 99082, 6, 128, int(sys.argv[1]) if len(sys.argv) > 1 else 100
    for sigma in (2.0, 3.0, 4.0):
        a, w = steps(20000, V, sigma)
        for share in (1.0, 0.5, 0.0):
            D = np.array([sps.kstest(pooled(n_distinct, k, V, sigma, share), "uniform").statistic for _ in range(trials)])
            n = n_distinct * k
            pnom = sps.kstwo.sf(D, n)
            print(f"sigma={sigma} mean p(token)={w.mean():.2f} share={share}: n={n} D median={np.median(D):.5f} "
                  f"95%={np.quantile(D,.95):.5f}; nominal p<0.001 in {np.mean(pnom<1e-3):.3f}, p<0.05 in "
                  f"{np.mean(pnom<0.05):.3f}; P(D>=0.0032)={np.mean(D>=0.0032):.3f} P(D>=0.00159)={np.mean(D>=0.00159):.3f}",
                  flush=True)
