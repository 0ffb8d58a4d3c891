"""Generate completions for a JSONL of prompts.

    python -m runners.generate prompts_file=prompts.jsonl output=out.jsonl spec=dspark
    python -m runners.generate prompts_file=prompts.jsonl spec=off sampling.temperature=0.7

Each input line holds "prompt" (raw text) or "messages" (chat, rendered with the model's
own template), optional "id" and "max_tokens". Output: one JSON line per prompt, in input
order, with id, text, prompt_token_ids, token_ids, num_steps and accept_lengths.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import hydra
from omegaconf import DictConfig

from dspark.config import ConfigError
from runners.common import build_engine
from runners.schema import to_sampling
from workloads.custom import load_custom_prompts


def run(cfg: DictConfig) -> dict:
    if not cfg.prompts_file:
        raise ConfigError("prompts_file: give a JSONL file of prompts, e.g. prompts_file=prompts.jsonl")
    prompts = load_custom_prompts(cfg.prompts_file)
    sampling = to_sampling(cfg.sampling)
    engine = build_engine(cfg)
    inputs = [p.messages if p.messages is not None else p.prompt for p in prompts]
    params = [replace(sampling, max_tokens=p.max_tokens) if p.max_tokens else sampling for p in prompts]
    ids = [p.id.removeprefix("custom/") for p in prompts]
    t0 = time.perf_counter()
    outputs = engine.generate(inputs, params, ids=ids, progress=bool(cfg.progress))
    wall = time.perf_counter() - t0
    out_path = Path(cfg.output)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with out_path.open("w") as f:
        for o in outputs:
            f.write(json.dumps(o.to_dict()) + "\n")
    ok = [o for o in outputs if o.error is None]
    steps = sum(o.num_steps for o in ok)
    tokens = sum(len(o.token_ids) for o in ok)
    per_req = [o.mean_accept_length for o in ok if o.accept_lengths]
    summary = {
        "output": str(out_path.resolve()),
        "requests": len(outputs),
        "errors": len(outputs) - len(ok),
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 2) if wall > 0 else None,
        "spec": engine.cfg.spec,
        "mean_accept_length": round(sum(per_req) / len(per_req), 4) if per_req else None,
        "decode_steps_per_request": round(steps / len(ok), 2) if ok else None,
    }
    return summary


@hydra.main(version_base="1.3", config_path="../conf", config_name="generate")
def main(cfg: DictConfig) -> None:
    summary = run(cfg)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
