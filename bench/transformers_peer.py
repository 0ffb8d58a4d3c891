"""The peer: transformers' generate on SmolLM2 (converted from the packaged GGUF), eager and
with a static cache and torch.compile, greedy, at several batch sizes.

    python bench/transformers_peer.py OUT_DIR [--batches 1,16,64,128] [--new-tokens 128]

Uses the Hugging Face folder dspark.models.loading.prepare_smollm2 writes (no download).
Prompts are the poetry workload's eval prompts through the chat template, left-padded.
Output tokens/s counts generated tokens only; the first (compiling) call is discarded.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--batches", default="1,16,64,128")
    ap.add_argument("--new-tokens", type=int, default=128)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dspark.models.loading import prepare_smollm2
    from workloads.registry import build_workload, make_spec

    folder = prepare_smollm2()
    tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    batches = [int(b) for b in args.batches.split(",")]
    wl = build_workload(make_spec("poetry", num_prompts=max(batches), seed=0, greedy_replica_count=0))
    texts = [tok.apply_chat_template(p.messages or [{"role": "user", "content": p.prompt}], tokenize=False,
                                     add_generation_prompt=True) for p in wl.prompts()]
    rows = []
    for mode in ("eager", "static_compiled"):
        model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16).cuda().eval()
        kw = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                  pad_token_id=tok.pad_token_id)
        if mode == "static_compiled":
            # transformers compiles the decoding forward itself when the cache is static (its
            # generation_config.compile_config); a hand-made torch.compile on top breaks its graphs.
            kw["cache_implementation"] = "static"
        for b in batches:
            enc = tok(texts[:b], return_tensors="pt", padding=True).to("cuda")
            with torch.inference_mode():
                model.generate(**enc, **kw)  # warm-up / compile
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = model.generate(**enc, **kw)
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            new = (out.shape[1] - enc["input_ids"].shape[1]) * b
            r = {"mode": mode, "batch": b, "new_tokens": new, "seconds": dt, "tokens_per_s": new / dt,
                 "ms_per_step": dt * 1e3 / args.new_tokens}
            rows.append(r)
            print(json.dumps(r), flush=True)
        del model
        torch.cuda.empty_cache()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    import transformers

    (out_dir / "transformers_peer.json").write_text(json.dumps({"rows": rows, "transformers": transformers.__version__,
                                                                "torch": torch.__version__}, indent=2))
    lines = ["| mode | batch | ms/step | output tok/s |", "|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['batch']} | {r['ms_per_step']:.2f} | {r['tokens_per_s']:.0f} |" for r in rows]
    (out_dir / "transformers_peer.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
