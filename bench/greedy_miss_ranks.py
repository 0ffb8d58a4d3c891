"""Where a drafter's greedy drafts miss, how far its own ranking was from the target's choice: for every cell a greedy
draft reaches (the block's earlier slots all accepted) at anchors along the target's answers, whether the drafter's
argmax is the target's argmax, and at a rejected cell the rank of the target's token among the drafter's logits, the
drafter's probability of its own draft and of the target's token, and the target's top-two probabilities. A miss
whose token is the drafter's close runner-up is one a mode-seeking loss could turn; a miss whose token lies beyond
the drafter's top ten, or where the target itself is nearly undecided, is not. Each cell is also marked a repeat when
the pair (the token before it, the target's token) already occurred in the context the cell sees: a copy from the
context, as against a word new to it; the summary gives the repeats' share of the accepted cells and of the misses.
Runs on the CPU in fp32; writes OUT_DIR/greedy_miss_ranks.json (the summary, by block position too) and prints the
summary.

    python bench/greedy_miss_ranks.py OUT_DIR data=FILE[,FILE...] [drafter=builtin:dspark-smollm2] [stride=3]
        [max_sequences=N]

``data``: token files from runners.make_training_data (prompt + answer per sequence), e.g. the target's greedy
answers to eval-split prompts: ``split=eval sources=[arena_hard] sampling.greedy_first=true``. Anchors run from the
last prompt token every ``stride`` positions; the drafter drafts a block at each, greedily, and the target verifies
it on top of the answer's true prefix (dspark.training.trainer.replay_blocks, greedy, keep_logits=True).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NEAR = (0.05, 0.1, 0.2)  # a miss is "near" when p_d(draft) - p_d(target's token) is below this


@torch.no_grad()
def block_cells(target, drafter, ids: torch.Tensor, anchors: torch.Tensor) -> dict[str, np.ndarray]:
    """Greedy draft + verify at ``anchors`` [A] of one sequence ``ids`` [L]; per cell (anchor, slot) the arrays below,
    flattened over the cells the draft reached."""
    from dspark.training.calibration import reached_cells
    from dspark.training.trainer import replay_blocks

    gamma = drafter.block_size
    n_anchor = anchors.numel()
    replay = replay_blocks(target, drafter, ids[None], anchors[None], keep_logits=True)
    tokens, accepted = replay["tokens"][0], replay["accepted"][0]
    d_logits, t_logits = replay["draft_logits"][0], replay["target_logits"][0]
    t_token = t_logits.argmax(-1)
    reached = reached_cells(accepted)
    p_d, p_t = d_logits.softmax(-1), t_logits.softmax(-1)
    top2 = p_t.topk(2, -1).values
    # whether the cell's token pair (the token before the cell, the target's token) occurred earlier in the context
    # the cell sees (the sequence up to the anchor, then the block's accepted drafts): a copy an attention over the
    # context can make, as against a word new to that context
    repeat = torch.zeros(n_anchor, gamma, dtype=torch.bool)
    for a_i, anchor in enumerate(anchors.tolist()):
        for k in range(gamma):
            if not reached[a_i, k]:
                break
            context = torch.cat((ids[: anchor + 1], tokens[a_i, :k]))
            before = context[:-1] == context[-1]
            repeat[a_i, k] = bool((before & (context[1:] == t_token[a_i, k])).any())
    cells = {
        "slot": torch.arange(gamma).expand(n_anchor, gamma),
        "repeat": repeat,
        "accepted": accepted,
        # 0 when the drafter's argmax is the target's; k: k of the drafter's logits are above the target's token's
        "rank": (d_logits > d_logits.gather(-1, t_token[..., None])).sum(-1),
        "p_draft": p_d.gather(-1, tokens[..., None])[..., 0],
        "p_target_token": p_d.gather(-1, t_token[..., None])[..., 0],
        "target_top1": top2[..., 0],
        "target_top2": top2[..., 1],
    }
    return {k: v[reached].numpy() for k, v in cells.items()}


def share(flags: np.ndarray) -> float | None:
    return round(float(flags.mean()), 4) if flags.size else None


def summarize(c: dict[str, np.ndarray]) -> dict:
    def shares(sel: np.ndarray) -> dict:
        miss = sel & ~c["accepted"]
        rank, gap = c["rank"][miss], (c["p_draft"] - c["p_target_token"])[miss]
        t1, t2 = c["target_top1"][miss], c["target_top2"][miss]
        n = int(miss.sum())
        return {"reached": int(sel.sum()), "accepted": share(c["accepted"][sel]), "missed": n,
                "missed_target_token_rank_2": share(rank == 1), "rank_3": share(rank == 2),
                "rank_4_to_10": share((rank >= 3) & (rank < 10)), "beyond_rank_10": share(rank >= 10),
                **{f"missed_within_{t}": share(gap < t) for t in NEAR},
                "missed_target_top1_median": round(float(np.median(t1)), 4) if n else None,
                "missed_target_margin_below_0.1": share(t1 - t2 < 0.1),
                "repeat_share_accepted": share(c["repeat"][sel & c["accepted"]]),
                "repeat_share_missed_within_top10": share(c["repeat"][miss][rank < 10]),
                "repeat_share_missed_beyond_top10": share(c["repeat"][miss][rank >= 10])}

    every = np.ones_like(c["accepted"], dtype=bool)
    out = shares(every)
    out["accepted_target_top1_median"] = round(float(np.median(c["target_top1"][c["accepted"]])), 4)
    out["by_slot"] = [shares(c["slot"] == k) for k in range(int(c["slot"].max()) + 1)]
    return out


def main(argv: list[str]) -> dict:
    from dspark.bench.script_args import existing_files, out_and_options

    out, opts = out_and_options(argv, __doc__, ("data", "drafter", "stride", "max_sequences"), ("data",))
    try:
        stride = int(opts.get("stride", 3))
        max_seqs = int(opts["max_sequences"]) if "max_sequences" in opts else None
    except ValueError as e:
        raise SystemExit(f"stride and max_sequences are whole numbers: {e}")
    if stride < 1:
        raise SystemExit(f"stride={stride}: a whole number >= 1")
    from dspark.models.drafter import DSparkDrafter
    from dspark.models.loading import load_target
    from dspark.training.data import TokenDataset
    from runners.common import resolve_drafter_path

    files = existing_files(opts["data"])
    target, _ = load_target("smollm2")
    target.eval()
    path = resolve_drafter_path(opts.get("drafter", "builtin:dspark-smollm2"), key="drafter")
    drafter = DSparkDrafter.load(path, target.cfg, device="cpu", dtype=torch.float32).eval()
    data = TokenDataset.load_many(files)
    n = len(data) if max_seqs is None else min(len(data), max_seqs)
    parts = []
    from tqdm.auto import tqdm
    for i in tqdm(range(n), desc="sequences"):
        ids = data.sequence(i)
        anchors = torch.arange(int(data.prompt_lens[i]) - 1, ids.numel() - drafter.block_size, stride)
        if anchors.numel():
            parts.append(block_cells(target, drafter, ids, anchors))
    if not parts:
        raise SystemExit("no sequence is long enough for one block after its prompt")
    cells = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    report = {"drafter": str(path), "data": files, "sequences": n, "stride": stride, **summarize(cells)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "greedy_miss_ranks.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "by_slot"}, indent=1))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
