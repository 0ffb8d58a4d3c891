"""Generate completions for a JSONL of prompts.

    python -m runners.generate prompts_file=prompts.jsonl output=out.jsonl spec=dspark
    python -m runners.generate prompts_file=prompts.jsonl spec=off sampling.temperature=0.7

Each input line holds "prompt" (raw text) or "messages" (chat, rendered with the model's
own template), optional "id" and "max_tokens". Output: one JSON line per prompt, in input
order, with id, text, prompt_token_ids, token_ids, num_steps and accept_lengths.

``output`` is checked before the model loads (not a folder, not the prompts file, writable).
Each generation is appended to ``<output>.partial`` as it finishes (with its input index), so a
crash or Ctrl-C keeps what finished; the ordered file then replaces ``output`` in one rename and
the partial file goes. The command exits 1 when any request errored (after writing everything).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig

from dspark.atomic import atomic_write_text
from dspark.config import ConfigError
from runners.common import build_engine, under_own_key
from runners.hydra_main import runner_main
from runners.schema import to_engine_config, to_sampling
from workloads.custom import load_custom_prompts

log = logging.getLogger(__name__)


class RequestsErrored(RuntimeError):
    """Some requests errored; every output (theirs included, with the error) was written."""


def checked_output(output: str, prompts_file: str) -> Path:
    """The output path, refused before any model loads when it cannot take the results."""
    if not output:
        raise ConfigError("output: give a file for the generations, e.g. output=generations.jsonl")
    path = Path(output)
    if path.is_dir():
        raise ConfigError(f"output: {output} is a folder; give a file, e.g. output={path / 'generations.jsonl'}")
    if path.resolve() == Path(prompts_file).resolve():
        raise ConfigError(f"output: {output} is the prompts file itself; writing there would overwrite the prompts")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.with_name(path.name + ".partial")
        if probe.is_file() and probe.stat().st_size:  # an interrupted run's generations: kept, not overwritten
            n = 1
            while probe.with_name(f"{probe.name}.{n}").exists():
                n += 1
            probe.rename(probe.with_name(f"{probe.name}.{n}"))
            log.warning("%s held an interrupted run's generations: moved to %s.%d", probe, probe.name, n)
        probe.touch()
    except OSError as e:
        raise ConfigError(f"output: cannot write next to {output} ({e.strerror}); choose another path") from None
    return path


def run(cfg: DictConfig) -> dict:
    if not cfg.prompts_file:
        raise ConfigError("prompts_file: give a JSONL file of prompts, e.g. prompts_file=prompts.jsonl")
    if not Path(cfg.prompts_file).is_file():
        raise ConfigError(f"prompts_file: {cfg.prompts_file} does not exist or is not a file")
    prompts = load_custom_prompts(cfg.prompts_file)
    sampling = to_sampling(cfg.sampling)
    try:  # every setting checked before the output
        engine_cfg = to_engine_config(cfg.engine, spec=cfg.get("spec"))
    except ConfigError as e:
        raise (under_own_key(e, {"engine.spec": "spec"}) if cfg.get("spec") is not None else e) from None
    out_path = checked_output(cfg.output, cfg.prompts_file)  # (which leaves an empty .partial beside it)
    engine = build_engine(cfg, engine_cfg)
    inputs = [p.messages if p.messages is not None else p.prompt for p in prompts]
    params = [replace(sampling, max_tokens=p.max_tokens) if p.max_tokens else sampling for p in prompts]
    ids = [p.id.removeprefix("custom/") for p in prompts]
    partial = out_path.with_name(out_path.name + ".partial")
    t0 = time.perf_counter()
    with partial.open("w") as stream:
        def keep(index: int, out) -> None:  # each generation on disk as it finishes
            stream.write(json.dumps({"index": index, **out.to_dict()}) + "\n")
            stream.flush()

        outputs = engine.generate(inputs, params, ids=ids, progress=bool(cfg.progress), on_finish=keep)
    wall = time.perf_counter() - t0
    atomic_write_text(out_path, "".join(json.dumps(o.to_dict()) + "\n" for o in outputs))
    partial.unlink()
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


@runner_main("generate")
def main(cfg: DictConfig) -> None:
    summary = run(cfg)
    print(json.dumps(summary, indent=2))
    refuse_errors(summary)


def refuse_errors(summary: dict) -> None:
    """Exit non-zero (RequestsErrored) when any request errored; the outputs are written by then."""
    if summary["errors"]:
        raise RequestsErrored(f"{summary['errors']} of {summary['requests']} requests errored (their errors are in "
                              f"{summary['output']})")


if __name__ == "__main__":
    main()
