import sys; sys.path.insert(0,"tests"); sys.path.insert(0,".")
import torch
from tiny import tiny_target
from test_engine_lossless import exact_marginals
for scale in (2.0, 4.0):
  for T in (0.7, 1.0, 2.0, 4.0):
    t = tiny_target(11, scale=scale)
    p1, p2 = exact_marginals(t, T, prompt=(5,17,33))
    H = lambda p: float(-(p*p.clamp_min(1e-30).log()).sum())
    print(scale, T, "H1=%.2f H2=%.2f max1=%.2f max2=%.2f" % (H(p1), H(p2), p1.max(), p2.max()))
