"""Does a drafter lose its acceptance on long prompts? Greedy block acceptance at every response
position of held-out agentic prompts, with the whole prompt as context and with the prompt cut to
its last K tokens (the window a drafter trained on short crops has seen).

    python bench/long_context_acceptance.py CHECKPOINT [CHECKPOINT ...] --out long_context.json
    python bench/long_context_acceptance.py builtin:dspark-smollm2 --prompts 24 --max-tokens 96 --crops 128 384

For each prompt the target answers greedily (target-only, fp32 on the CPU unless --device); each
drafter then drafts a block at every response position (dspark.training.trainer.replay_blocks:
the drafter's own greedy draft against the target's argmax, as the engine verifies it) over the
full sequence and over each crop. A drafter that works on short contexts but fails on long ones
shows high acceptance on the crops and low acceptance on the full prompt. Prints one line per
prompt and drafter and writes every number to --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def block_acceptance(target, drafter, ids: torch.Tensor, response_start: int) -> dict:
    """Mean accept length (bonus included) and per-position acceptance of blocks anchored at every response position."""
    from dspark.training.trainer import replay_blocks

    anchors = torch.arange(response_start - 1, ids.shape[1] - 1)[None]
    with torch.no_grad():
        out = replay_blocks(target, drafter, ids, anchors, anchor_chunk=16)
    accepted = out["accepted"][0].float()
    return {"accept_length": round(float((torch.cumprod(accepted, -1).sum(-1) + 1).mean()), 4),
            "per_position": [round(float(v), 3) for v in accepted.mean(0)]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="drafter folders or builtin:NAME")
    parser.add_argument("--prompts", type=int, default=24, help="eval-split agentic prompts (the eval_drafter set)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--crops", type=int, nargs="*", default=[128, 384], help="prompt tokens kept in each crop")
    parser.add_argument("--min-prompt-tokens", type=int, default=0, help="only prompts longer than this")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="long_context.json")
    args = parser.parse_args(argv)

    from dspark.config import EngineConfig
    from dspark.engine import Engine
    from dspark.models.drafter import DSparkDrafter
    from dspark.sampling import SamplingParams
    from runners.common import resolve_drafter_path
    from runners.eval_drafter import eval_prompts

    dtype = "float32" if args.device == "cpu" else "bfloat16"
    engine = Engine.from_pretrained("smollm2", config=EngineConfig(spec="off", device=args.device, dtype=dtype))
    target = engine.target
    drafters = {c: DSparkDrafter.load(resolve_drafter_path(c, key="checkpoint"), target.cfg, device=args.device,
                                      dtype=next(target.parameters()).dtype) for c in args.checkpoints}
    items = eval_prompts(["agentic"], args.prompts, 0)["agentic"]
    outputs = engine.generate([p for _, p in items], SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
    rows = []
    for (pid, _), o in zip(items, outputs):
        prompt = list(o.prompt_token_ids)
        if len(prompt) <= args.min_prompt_tokens or not o.token_ids:
            continue
        seq = torch.tensor(prompt + list(o.token_ids), device=args.device)[None]
        for name, drafter in drafters.items():
            row = {"prompt": pid, "checkpoint": name, "prompt_tokens": len(prompt), "response_tokens": len(o.token_ids),
                   "full": block_acceptance(target, drafter, seq, len(prompt))}
            for keep in args.crops:
                if len(prompt) > keep:
                    row[f"crop{keep}"] = block_acceptance(target, drafter, seq[:, len(prompt) - keep:], keep)
            rows.append(row)
            crops = " ".join(f"crop{k} {row[f'crop{k}']['accept_length']:.2f}" for k in args.crops if f"crop{k}" in row)
            print(f"{pid:32s} {len(prompt):5d} tok  {name:28s} full {row['full']['accept_length']:.2f}  {crops}",
                  flush=True)
    report = {"max_tokens": args.max_tokens, "device": args.device, "dtype": dtype, "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
