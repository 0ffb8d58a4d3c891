"""The peer: Hugging Face transformers on SmolLM2 (converted from the packaged GGUF), greedy, at
several batch sizes, in up to three modes:

- ``eager``: ``model.generate()`` with the default dynamic cache;
- ``static_generate``: ``model.generate(cache_implementation="static")``; transformers compiles its
  decoding forward itself (its ``generation_config.compile_config``). Called ``static_compiled``
  before; rows carry ``"legacy_mode": "static_compiled"`` and ``--modes`` still accepts the old name;
- ``static_compiled_loop``: the fastest transformers setup measured by hand: a ``StaticCache``, one
  eager prefill, then a hand-written greedy loop around a one-token decode step wrapped in
  ``torch.compile(mode="reduce-overhead", fullgraph=True)`` (CUDA graphs; ``mode="default"`` off
  CUDA, none with ``--no-compile``).

    python bench/transformers_peer.py OUT_DIR [--batches 1,16,64,128] [--new-tokens 128]
        [--modes eager,static_generate,static_compiled_loop] [--device cuda] [--dtype bfloat16]
        [--workload poetry] [--prompts N] [--no-compile]

Uses the Hugging Face folder dspark.models.loading.prepare_smollm2 writes (no download). Prompts are
the workload's prompts through the chat template, left-padded. Every mode generates exactly
``new_tokens`` tokens per sequence (EOS suppressed, like ``min_new_tokens``); output tokens/s counts
generated tokens only (batch x new_tokens) over the whole call, prefill included. The first
(compiling / capturing) call is discarded and the second timed. Each row also records how many of
the first prompt's tokens equal a batch-1 eager ``generate(do_sample=False)`` reference.

Writes OUT_DIR/transformers_peer.json ({"rows": [...], versions, device}) and transformers_peer.md.
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import sys
import time
from pathlib import Path

import torch

MODES = ("eager", "static_generate", "static_compiled_loop")
MODE_ALIASES = {"static_compiled": "static_generate"}  # old name -> current name
LEGACY_NAMES = {v: k for k, v in MODE_ALIASES.items()}


# --------------------------------------------------------------------------------------------------
# Small helpers


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _accepted(fn) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _parse_modes(text: str) -> list[str]:
    modes = []
    for m in (s.strip() for s in text.split(",") if s.strip()):
        m = MODE_ALIASES.get(m, m)
        if m not in MODES:
            raise SystemExit(f"--modes: unknown mode {m!r}; choose from {list(MODES)} (or the old name 'static_compiled')")
        if m not in modes:
            modes.append(m)
    return modes


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _load_model(folder, dtype: torch.dtype, device: torch.device):
    import transformers
    from transformers import AutoModelForCausalLM

    major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    key = "dtype" if major_minor >= (4, 56) else "torch_dtype"  # torch_dtype is deprecated from 4.56
    return AutoModelForCausalLM.from_pretrained(folder, **{key: dtype}).to(device).eval()


def _eos_ids(model, tok) -> list[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tok.eos_token_id
    ids = eos if isinstance(eos, (list, tuple)) else [eos]
    return sorted({int(i) for i in ids if i is not None})


def _matching_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# --------------------------------------------------------------------------------------------------
# The hand-written static-cache loop


def _make_static_cache(model, batch: int, max_cache_len: int, device: torch.device, dtype: torch.dtype):
    """A ``StaticCache`` across transformers versions: 4.45 takes (config, batch_size, max_cache_len,
    device, dtype); 4.46-4.55 prefer max_batch_size; 4.56+/5.x take (config, max_cache_len) and size the
    per-layer tensors lazily from the first update (the prefill)."""
    from transformers import StaticCache

    params = _accepted(StaticCache.__init__)
    kw = {"config": model.config, "max_cache_len": max_cache_len}
    if "batch_size" in params:
        kw["batch_size"] = batch
    elif "max_batch_size" in params:
        kw["max_batch_size"] = batch
    if "device" in params:
        kw["device"] = device
    if "dtype" in params:
        kw["dtype"] = dtype
    return StaticCache(**kw)


class StaticLoop:
    """Greedy decoding of one left-padded batch with a static KV cache and a (compiled) one-token step.

    ``run()`` = reset the cache, one eager prefill of the padded prompts, then ``new_tokens - 1`` calls
    of ``step(input_ids[B,1], position_ids[B,1], cache_position[1], attention_mask[B, max_cache_len])``
    -> next greedy ids [B,1]; the prefill yields the first token, so each sequence gets exactly
    ``new_tokens`` tokens, as ``generate(max_new_tokens=min_new_tokens=new_tokens)`` does. The cache and
    the attention mask keep their addresses across runs, so the CUDA graphs captured in the first run
    replay in the second. transformers 5.x places the new K/V by the cache's own counter (its forward
    takes no ``cache_position``); 4.x places it by ``cache_position``, passed when the forward accepts it.
    """

    def __init__(self, model, enc, new_tokens: int, eos_ids: list[int], compile_mode: str | None,
                 fullgraph: bool = True):
        self.model = model
        self.device = enc["input_ids"].device
        self.new_tokens = new_tokens
        ids, mask2d = enc["input_ids"], enc["attention_mask"].to(torch.long)
        self.batch, self.prompt_len = ids.shape
        self.max_cache_len = self.prompt_len + new_tokens
        self.input_ids = ids
        full = torch.ones(self.batch, self.max_cache_len, dtype=torch.long, device=self.device)
        full[:, : self.prompt_len] = mask2d
        self.attention_mask = full  # padding of the prompt, every generated slot valid; causality masks the future
        pos = (mask2d.cumsum(-1) - 1).clamp_(min=0)
        self.prefill_position_ids = pos.masked_fill(mask2d == 0, 1)  # as generate() does for pads
        # Decode inputs prepared ahead, so a step launches nothing besides the (graphed) forward: step i
        # (0-based) feeds the token generated before it, at position n_real_tokens + i, cache slot prompt_len + i.
        steps = torch.arange(max(new_tokens - 1, 1), device=self.device)
        self.decode_position_ids = mask2d.sum(-1, keepdim=True)[None] + steps[:, None, None]  # [N-1, B, 1]
        self.decode_cache_positions = (self.prompt_len + steps)[:, None]  # [N-1, 1]
        self.eos = torch.tensor(eos_ids, dtype=torch.long, device=self.device) if eos_ids else None
        self.cache = _make_static_cache(model, self.batch, self.max_cache_len, self.device, model.dtype)
        params = _accepted(model.forward)
        self.cache_kw = "cache" if "cache" in params else "past_key_values"  # 5.2x renames past_key_values
        self.pass_cache_position = "cache_position" in params
        self.logits_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        self.compile_mode = compile_mode
        self.fullgraph = fullgraph
        self.step = self._step if compile_mode is None else torch.compile(
            self._step, mode=compile_mode, fullgraph=fullgraph, dynamic=False)
        self.cudagraphs = compile_mode is not None and "reduce-overhead" in compile_mode and self.device.type == "cuda"
        self.prefill_seconds = 0.0

    def _greedy(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits[:, -1, :]
        if self.eos is not None:  # min_new_tokens == new_tokens: EOS never wins, as in the generate modes
            logits = logits.index_fill(-1, self.eos, float("-inf"))
        return logits.argmax(-1, keepdim=True)

    def _forward(self, input_ids, position_ids, cache_position, attention_mask, prefill: bool):
        kw = {self.cache_kw: self.cache}
        if self.pass_cache_position:
            kw["cache_position"] = cache_position
        if prefill and self.logits_kw:
            kw[self.logits_kw] = 1
        out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                         use_cache=True, return_dict=True, **kw)
        return self._greedy(out.logits)

    def _step(self, input_ids, position_ids, cache_position, attention_mask):
        return self._forward(input_ids, position_ids, cache_position, attention_mask, prefill=False)

    @torch.inference_mode()
    def run(self) -> torch.Tensor:
        """One full greedy generation; returns the new tokens [B, new_tokens] (on the device)."""
        self.cache.reset()
        t0 = time.perf_counter()
        cache_position = torch.arange(self.prompt_len, device=self.device)
        nxt = self._forward(self.input_ids, self.prefill_position_ids, cache_position, self.attention_mask,
                            prefill=True)
        _sync(self.device)
        self.prefill_seconds = time.perf_counter() - t0
        out = [nxt]
        for i in range(self.new_tokens - 1):
            if self.cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            nxt = self.step(nxt, self.decode_position_ids[i], self.decode_cache_positions[i], self.attention_mask)
            if self.cudagraphs:
                nxt = nxt.clone()  # the graph's output buffer is overwritten by the next replay
            out.append(nxt)
        return torch.cat(out, dim=1)


# --------------------------------------------------------------------------------------------------
# Main


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--batches", default="1,16,64,128")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated subset of {','.join(MODES)} (old name static_compiled = static_generate)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                    help="bfloat16 (default) on the GPU; use float32 on CPU")
    ap.add_argument("--workload", default="poetry")
    ap.add_argument("--prompts", type=int, default=None,
                    help="number of workload prompts (default: the largest batch; cycled if fewer)")
    ap.add_argument("--no-compile", action="store_true",
                    help="static_compiled_loop without torch.compile (CPU smoke run)")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode for the loop (default reduce-overhead on CUDA, default elsewhere)")
    ap.add_argument("--no-fullgraph", action="store_true", help="torch.compile the loop's step without fullgraph=True")
    args = ap.parse_args(argv)

    import transformers
    from transformers import AutoTokenizer

    from dspark.models.loading import prepare_smollm2
    from workloads.registry import build_workload, make_spec

    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = getattr(torch, args.dtype)
    modes = _parse_modes(args.modes)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    if args.new_tokens < 1 or not batches or min(batches) < 1:
        raise SystemExit("--new-tokens and every batch must be >= 1")
    compile_mode = None if args.no_compile else (args.compile_mode or ("reduce-overhead" if device.type == "cuda" else "default"))

    folder = prepare_smollm2()
    tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    n_prompts = args.prompts or max(batches)
    wl = build_workload(make_spec(args.workload, num_prompts=n_prompts, seed=0, greedy_replica_count=0))
    texts = [tok.apply_chat_template(p.messages or [{"role": "user", "content": p.prompt}], tokenize=False,
                                     add_generation_prompt=True) for p in wl.prompts()]

    def batch_texts(b: int) -> list[str]:
        return [texts[i % len(texts)] for i in range(b)]

    gen_kw = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                  pad_token_id=tok.pad_token_id)

    # Reference: the first prompt alone, eager generate, greedy.
    model = _load_model(folder, dtype, device)
    attn_impl = getattr(model.config, "_attn_implementation", None)
    eos_ids = _eos_ids(model, tok)
    enc1 = tok(texts[:1], return_tensors="pt", padding=True).to(device)
    with torch.inference_mode():
        ref_out = model.generate(**enc1, **gen_kw)
    reference = ref_out[0, enc1["input_ids"].shape[1]:].tolist()
    print(f"reference (batch 1, eager generate): {len(reference)} tokens: {tok.decode(reference)[:120]!r}", flush=True)

    rows: list[dict] = []
    for mode in modes:
        if mode != "eager" or model is None:
            model = _load_model(folder, dtype, device)
        torch._dynamo.reset()
        kw = dict(gen_kw)
        if mode == "static_generate":
            # transformers compiles the decoding forward itself when the cache is static (its
            # generation_config.compile_config); a hand-made torch.compile on top breaks its graphs.
            kw["cache_implementation"] = "static"
        for b in batches:
            enc = tok(batch_texts(b), return_tensors="pt", padding=True).to(device)
            extra: dict = {}
            with torch.inference_mode():
                if mode == "static_compiled_loop":
                    torch._dynamo.reset()  # a fresh graph (and CUDA graphs) per batch size
                    loop = StaticLoop(model, enc, args.new_tokens, eos_ids, compile_mode,
                                      fullgraph=not args.no_fullgraph)
                    t_first = time.perf_counter()
                    loop.run()  # compile + capture; discarded
                    _sync(device)
                    first_s = time.perf_counter() - t_first
                    _sync(device)
                    t0 = time.perf_counter()
                    new = loop.run()
                    _sync(device)
                    dt = time.perf_counter() - t0
                    extra = {"compile_mode": compile_mode, "fullgraph": (not args.no_fullgraph) if compile_mode else None,
                             "cudagraphs": loop.cudagraphs, "first_run_seconds": first_s,
                             "prefill_seconds": loop.prefill_seconds, "prompt_len": loop.prompt_len,
                             "max_cache_len": loop.max_cache_len,
                             "decode_ms_per_step": (dt - loop.prefill_seconds) * 1e3 / max(args.new_tokens - 1, 1)}
                    del loop
                else:
                    model.generate(**enc, **kw)  # warm-up / compile
                    _sync(device)
                    t0 = time.perf_counter()
                    out = model.generate(**enc, **kw)
                    _sync(device)
                    dt = time.perf_counter() - t0
                    new = out[:, enc["input_ids"].shape[1]:]
            per_seq = new.shape[1]
            first = new[0].tolist()
            r = {"mode": mode, "batch": b, "new_tokens": per_seq, "generated_tokens": per_seq * b, "seconds": dt,
                 "tokens_per_s": per_seq * b / dt, "ms_per_step": dt * 1e3 / per_seq,
                 "ref_match_tokens": _matching_prefix(first, reference), "ref_tokens": len(reference)}
            if mode in LEGACY_NAMES:
                r["legacy_mode"] = LEGACY_NAMES[mode]
            r.update(extra)
            rows.append(r)
            print(json.dumps(r), flush=True)
        del model
        model = None
        if device.type == "cuda":
            torch.cuda.empty_cache()

    loop_b1 = next((r for r in rows if r["mode"] == "static_compiled_loop" and r["batch"] == 1), None)
    result = {
        "rows": rows,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "device": str(device),
        "device_name": _device_name(device),
        "dtype": args.dtype,
        "attn_implementation": attn_impl,
        "workload": args.workload,
        "num_prompts": n_prompts,
        "new_tokens": args.new_tokens,
        "modes": modes,
        "mode_aliases": MODE_ALIASES,
        "compile_mode": compile_mode,
        "reference": {"what": "first prompt, batch 1, eager generate(do_sample=False, min_new_tokens=max_new_tokens)",
                      "tokens": reference},
        "loop_batch1_ref_match_tokens": loop_b1["ref_match_tokens"] if loop_b1 else None,
    }
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "transformers_peer.json").write_text(json.dumps(result, indent=2))
    lines = [f"transformers {transformers.__version__}, torch {torch.__version__}, {_device_name(device)}, {args.dtype}",
             "", "| mode | batch | ms/step | output tok/s | ref match |", "|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['batch']} | {r['ms_per_step']:.2f} | {r['tokens_per_s']:.0f} | "
              f"{r['ref_match_tokens']}/{r['ref_tokens']} |" for r in rows]
    (out_dir / "transformers_peer.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return rows


if __name__ == "__main__":
    main()
