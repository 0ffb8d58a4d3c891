"""A benchmark client nobody here wrote (NVIDIA AIPerf) against runners.serve, held against the server's own count.

Starts ``python -m runners.serve`` (CPU, the embedded SmolLM2 and drafter unless overrides say otherwise), waits
for /health, reads /metrics, runs ``aiperf profile`` (streaming chat completions, synthetic prompts from the
served model's tokenizer, a fixed concurrency and request count), reads /metrics again and stops the server.
Ours: the tokens the server counted as generated for finished requests (``vllm:generation_tokens_total``) over
AIPerf's own benchmark duration. Theirs: AIPerf's output token throughput (it counts the streamed text's tokens
with the tokenizer) and its per-user rates and TTFT distribution. Writes crosscheck.json beside AIPerf's artifacts
(aiperf/: profile_export_aiperf.json, its console table, the per-request records).

    python bench/aiperf_crosscheck.py OUT --aiperf /path/to/aiperf [--concurrency 4] [--requests 24]
        [--isl 64] [--osl 64] [--port 8011] [-- serve overrides...]

AIPerf installs from the package index into its own environment (``python -m venv V && V/bin/pip install
aiperf``); it needs the tokenizer's folder (the converted SmolLM2 under the dspark cache, found here).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def scrape(url: str) -> dict[str, float]:
    """Prometheus text -> {sample name with labels: value} (the handful of lines this script reads)."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                continue
    return out


def total(samples: dict[str, float], metric: str) -> float:
    return sum(v for k, v in samples.items() if re.fullmatch(re.escape(metric) + r"(\{.*\})?", k))


def tokenizer_folder() -> Path:
    cache = Path(os.environ.get("DSPARK_CACHE", Path.home() / ".cache" / "dspark-bench"))
    found = sorted(cache.glob("SmolLM2-135M-Instruct*/tokenizer.json"))
    if not found:
        raise SystemExit(f"no converted SmolLM2 tokenizer under {cache}: run the quickstart once")
    return found[0].parent


def aiperf_value(export: dict, metric: str) -> float | None:
    """A metric's average from AIPerf's profile_export_aiperf.json ({"unit": ..., "avg": ...} per metric)."""
    entry = export.get(metric)
    return float(entry["avg"]) if isinstance(entry, dict) and entry.get("avg") is not None else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--aiperf", required=True)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--isl", type=int, default=64)
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("serve", nargs="*", help="runners.serve overrides")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{args.port}"
    serve_cmd = [sys.executable, "-m", "runners.serve", f"port={args.port}",
                 f"engine.max_num_seqs={max(args.concurrency, 1)}", *args.serve]
    log = open(out / "serve.log", "w")
    server = subprocess.Popen(serve_cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None:
                raise SystemExit(f"runners.serve exited ({server.returncode}); see {out / 'serve.log'}")
            time.sleep(1)
        model = json.load(urllib.request.urlopen(base + "/v1/models", timeout=10))["data"][0]["id"]
        before = scrape(base + "/metrics")
        aiperf_cmd = [args.aiperf, "profile", "--model", model, "--url", base, "--endpoint-type", "chat",
                      "--streaming", "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
                      "--prompt-input-tokens-mean", str(args.isl), "--prompt-input-tokens-stddev", "0",
                      "--prompt-output-tokens-mean", str(args.osl), "--prompt-output-tokens-stddev", "0",
                      "--extra-inputs", "ignore_eos:true", "--tokenizer", str(tokenizer_folder()),
                      "--random-seed", "0", "--output-artifact-dir", str(out / "aiperf")]
        t0 = time.perf_counter()
        run = subprocess.run(aiperf_cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        (out / "aiperf_stdout.txt").write_text(run.stdout + "\n" + run.stderr)
        after = scrape(base + "/metrics")
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    if run.returncode != 0:
        raise SystemExit(f"aiperf exited {run.returncode}; see {out / 'aiperf_stdout.txt'}")
    generated = total(after, "vllm:generation_tokens_total") - total(before, "vllm:generation_tokens_total")
    finished = total(after, "vllm:request_success_total") - total(before, "vllm:request_success_total")
    export_path = out / "aiperf" / "profile_export_aiperf.json"
    theirs = json.loads(export_path.read_text())
    duration = aiperf_value(theirs, "benchmark_duration")
    result = {"command": {"serve": serve_cmd, "aiperf": aiperf_cmd}, "requests_finished": finished,
              "generated_tokens_server": generated, "aiperf_wall_s": wall,
              "aiperf_benchmark_duration_s": duration,
              "aiperf_total_output_tokens": aiperf_value(theirs, "total_output_tokens"),
              "aiperf_output_token_throughput": aiperf_value(theirs, "output_token_throughput"),
              "ours_tokens_per_s_over_aiperf_duration": generated / duration if duration else None,
              "aiperf_output_tokens_per_s_per_user": theirs.get("output_token_throughput_per_user"),
              "aiperf_time_to_first_token_ms": theirs.get("time_to_first_token"), "aiperf_export": str(export_path)}
    ours, their = result["ours_tokens_per_s_over_aiperf_duration"], result["aiperf_output_token_throughput"]
    if ours and their:
        result["difference_pct"] = 100.0 * (their / ours - 1.0)
    (out / "crosscheck.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
