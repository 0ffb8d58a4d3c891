"""Replay the shipped drafter greedily on held-out sequences (every second response position an anchor, as
runners.calibrate does) and keep, per drafted slot, the confidence head's input [h_k; W1 x_(k-1)], its raw logit,
the drafter's top probability, whether the target accepted the token (the greedy label), the analytical
acceptance of the slot, sum_v min(p_d(v), p_t(v)) (the label the head was trained on), and the drafter's two
largest logits (what a pass over the logits that finds the argmax can keep at no extra cost).

    python replay_features.py DATA.safetensors FEATURES.pt
"""
import sys
import time

import torch
from dspark.models.drafter import DSparkDrafter
from dspark.models.loading import load_target_weights
from dspark.models.llama import TargetModel
from dspark.training.data import TokenDataset, make_batch
from dspark.training.trainer import sample_anchors, replay_blocks, step_generator
from runners.common import resolve_drafter_path

torch.manual_seed(0)
data_path, out = sys.argv[1], sys.argv[2]
mcfg, state, tok = load_target_weights("smollm2")
target = TargetModel(mcfg); target.load_hf_state_dict(state); target.eval()
drafter = DSparkDrafter.load(resolve_drafter_path("builtin:dspark-smollm2", key="x"), mcfg).eval()
ds = TokenDataset.load_many(data_path)
feats_store, seen = [], {}
drafter.confidence_head.register_forward_pre_hook(lambda m, args: feats_store.append(args[0].detach()))
draft, compute_logits = drafter.draft, target.compute_logits


def keep(name, fn):
    def wrapped(*args, **kwargs):
        seen[name] = fn(*args, **kwargs)
        return seen[name]
    return wrapped


drafter.draft, target.compute_logits = keep("draft", draft), keep("target_logits", compute_logits)
F, C, A, P, S, Y, L = [], [], [], [], [], [], []
t0 = time.time()
with torch.no_grad():
    for i, start in enumerate(range(0, len(ds), 4)):
        rows = list(range(start, min(start + 4, len(ds))))
        batch = make_batch(ds, rows, 1024, 0)
        anchors, valid = sample_anchors(batch.lengths + 1, batch.response_starts, None, drafter.block_size,
                                        step_generator(0, i, salt=1), require_full_block=False, stride=2)
        feats_store.clear()
        o = replay_blocks(target, drafter, batch.input_ids, anchors)
        n, a = anchors.shape
        f = feats_store[-1].reshape(n, a, drafter.block_size, -1)
        p_d = torch.softmax(seen["draft"].logits.float(), -1).reshape(n, a, drafter.block_size, -1)
        p_t = torch.softmax(seen["target_logits"].float(), -1).reshape(n, a, drafter.block_size, -1)
        Y.append(torch.minimum(p_d, p_t).sum(-1)[valid])
        L.append(seen["draft"].logits.float().topk(2, -1).values.reshape(n, a, drafter.block_size, 2)[valid])
        del p_d, p_t
        F.append(f[valid].half()); C.append(o["conf_logits"][valid]); A.append(o["accepted"][valid].float())
        P.append(o["draft_max_prob"][valid]); S.append(torch.tensor(rows)[:, None].expand(valid.shape)[valid])
        print(i, len(ds) // 4, f"{time.time() - t0:.0f}s", flush=True)
torch.save({"feats": torch.cat(F), "conf": torch.cat(C), "acc": torch.cat(A), "maxp": torch.cat(P),
            "seq": torch.cat(S), "analytical": torch.cat(Y), "top2_logits": torch.cat(L)}, out)
