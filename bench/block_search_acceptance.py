"""Whether a search over the block beats DSpark's left-to-right greedy draft at T=0. With a Markov head the drafter's
slots form a joint distribution q(d_1..d_G) = prod_k q(d_k | d_<k), and the block a greedy verifier accepts on
average, if q is calibrated, is E[L] = 1 + sum_k prod_{j<=k} q(d_j | d_<j). Drafting each slot's argmax in turn does
not maximise it in general: a slightly less likely first token can lead to surer later ones. A beam of width W
(the W most likely partial blocks under q, the most likely continuations of each) then the beam with the largest
E[L] does better, if anything does; width 1 is the greedy draft. A DFlash-style drafter (no Markov head) has
independent slots, for which the greedy draft already maximises E[L].

For every anchor along the target's greedy answers (every ``stride`` positions from the last prompt token), the
drafter drafts a block at each width and the script counts its leading tokens equal to the answer's next tokens, plus
the bonus token: the accept length a greedy verifier gives where the answer is the target's own greedy choice (data
made with sampling.greedy_first=true by the same target). Runs on the CPU in fp32; writes
OUT_DIR/block_search_acceptance.json (mean accept length per source and width, and each width's paired change against
width 1 in %, with a bootstrap interval over sequences) and prints it.

    python bench/block_search_acceptance.py OUT_DIR data=FILE[,FILE...] [drafter=builtin:dspark-smollm2]
        [widths=2,4,8] [stride=3] [max_sequences=N]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@torch.no_grad()
def beam_block(drafter, hidden: torch.Tensor, anchor_ids: torch.Tensor, lm_head_weight: torch.Tensor,
               width: int) -> torch.Tensor:
    """hidden [N, G, d] (the backbone's block output), anchor_ids [N] -> tokens int64 [N, G]: of the ``width`` most
    likely blocks a beam search under the drafter's slot distributions keeps, the one with the largest
    sum_k prod_{j<=k} q(d_j | d_<j). Width 1 is the greedy draft (DSparkDrafter.draft with an argmax)."""
    n, gamma, d = hidden.shape
    base = drafter._base_logits(hidden, lm_head_weight)  # [N, G, V]
    head = drafter.markov_head
    logp = torch.zeros(n, 1)
    score = torch.zeros(n, 1)
    tokens = torch.zeros(n, 1, 0, dtype=torch.long)
    prev = anchor_ids.long()[:, None]
    state = head.initial_state(n, hidden) if head is not None else None
    for k in range(gamma):
        b = logp.shape[1]
        rows = lambda t: t[:, None].expand(n, b, *t.shape[1:]).reshape(n * b, *t.shape[1:])  # noqa: E731
        logits, state = drafter._slot_logits(rows(hidden[:, k]), rows(base[:, k]), prev.reshape(-1), state)
        top = torch.log_softmax(logits, -1).view(n, b, -1).topk(width, -1)
        cand = (logp[..., None] + top.values).reshape(n, -1)  # [N, b * width]
        logp, pick = cand.topk(min(width, cand.shape[1]), -1)
        parent = pick // width
        chosen = top.indices.reshape(n, -1).gather(1, pick)
        score = score.gather(1, parent) + logp.exp()
        tokens = torch.cat((tokens.gather(1, parent[..., None].expand(-1, -1, k)), chosen[..., None]), dim=-1)
        prev = chosen
        if state is not None:
            state = state.view(n, b, -1).gather(1, parent[..., None].expand(-1, -1, state.shape[-1]))
            state = state.reshape(n * logp.shape[1], -1)
    best = score.argmax(-1)
    return tokens[torch.arange(n), best]


def accept_lengths(tokens: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Leading tokens equal to ``truth`` plus the bonus token, per row of tokens/truth [N, G]."""
    return (tokens == truth).long().cumprod(-1).sum(-1) + 1


def summarize(per_seq: dict[str, list[list[float]]], widths: list[int]) -> dict:
    """Per source: the mean accept length at width 1 and each of ``widths`` (a sequence's mean per row of
    ``per_seq[source]``, width 1 first), and each width's paired change against width 1 in % with its bootstrap
    interval over sequences (runners.eval_drafter's, as its drafter comparisons give)."""
    from runners.eval_drafter import _paired_change

    out = {}
    for source, rows in sorted(per_seq.items()):
        a = np.asarray(rows, dtype=float)
        entry = {"sequences": len(rows),
                 "accept_length": {str(w): round(float(a[:, j].mean()), 4) for j, w in enumerate([1, *widths])}}
        for j, w in enumerate(widths, start=1):
            change, ci = _paired_change(a[:, 0], a[:, j], n_resamples=2000, ci_level=0.95, seed=0)
            entry[f"width_{w}_vs_greedy_pct"] = {"change": round(change, 3), "ci95": [ci["low"], ci["high"]],
                                                 "method": ci["method"]}
        out[source] = entry
    return out


def main(argv: list[str]) -> dict:
    from dspark.bench.script_args import existing_files, out_and_options

    out, opts = out_and_options(argv, __doc__, ("data", "drafter", "widths", "stride", "max_sequences"), ("data",))
    try:
        widths = sorted({int(w) for w in opts.get("widths", "2,4,8").split(",")} - {1})
        stride = int(opts.get("stride", 3))
        max_seqs = int(opts["max_sequences"]) if "max_sequences" in opts else None
    except ValueError as e:
        raise SystemExit(f"widths, stride and max_sequences are whole numbers: {e}")
    if stride < 1 or not widths or widths[0] < 1:
        raise SystemExit(f"stride={stride} and widths={widths}: whole numbers >= 1, and a width above 1")
    files = existing_files(opts["data"])
    from tqdm.auto import tqdm

    from dspark.models.drafter import DSparkDrafter
    from dspark.models.loading import load_target
    from dspark.training.data import TokenDataset
    from dspark.training.trainer import dense_target_forward
    from runners.common import resolve_drafter_path

    data = TokenDataset.load_many(files)
    target, _ = load_target("smollm2")
    target.eval()
    path = resolve_drafter_path(opts.get("drafter", "builtin:dspark-smollm2"), key="drafter")
    drafter = DSparkDrafter.load(path, target.cfg, device="cpu", dtype=torch.float32).eval()
    gamma = drafter.block_size
    per_seq: dict[str, list[list[float]]] = {}  # source -> per sequence, the mean accept length at width 1, then widths
    n = len(data) if max_seqs is None else min(len(data), max_seqs)
    for i in tqdm(range(n), desc="sequences"):
        ids = data.sequence(i)
        anchors = torch.arange(int(data.prompt_lens[i]) - 1, ids.numel() - gamma, stride)
        if not anchors.numel():
            continue
        with torch.no_grad():
            _, captured = dense_target_forward(target, ids[None], drafter.cfg.target_layer_ids)[:2]
            hidden = drafter.block_hidden(captured, ids[None], anchors[None], target.embed)[0]
        truth = torch.stack([ids[a + 1: a + 1 + gamma] for a in anchors.tolist()])
        row = [float(accept_lengths(beam_block(drafter, hidden, ids[anchors], target.lm_head_weight, w),
                                    truth).float().mean()) for w in [1, *widths]]
        per_seq.setdefault(data.source(i), []).append(row)
    if not per_seq:
        raise SystemExit("no sequence is long enough for one block after its prompt")
    report = {"drafter": str(path), "data": files, "sequences": n, "stride": stride, "widths": [1, *widths],
              "sources": summarize(per_seq, widths)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "block_search_acceptance.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report["sources"], indent=1))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
