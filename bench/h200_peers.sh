#!/usr/bin/env bash
# Leased-H200 run for the comparison points: the paged-attention kernel's bandwidth
# against the copy bandwidth, padded SDPA and flex attention; transformers' generate
# (eager and static cache + torch.compile) on SmolLM2. Needs the model staged like
# bench/h200_sched_graphs.sh (STAGE_DIR with model.part1..3 + model.sha256).
#   OUT=/path bash bench/h200_peers.sh STAGE_DIR
set -uo pipefail
OUT=${OUT:?set OUT}
WORK=${WORK:-/tmp/dspark-peers}
source "$(dirname "$0")/stage_model.sh" "${1:?stage dir}"
mkdir -p "$OUT/peers"
timeout ${T_ATTN:-180} python3 bench/attention_bandwidth.py "$OUT/peers" 2>&1 | grep -v Warning | tail -30
timeout ${T_PEER:-360} python3 bench/transformers_peer.py "$OUT/peers" --batches ${PEER_BATCHES:-1,16,64,128} 2>&1 \
  | grep -v Warning | tail -12
(cd "$OUT" && tar czf "$WORK/peers.tar.gz" peers && rm -rf peers && mv "$WORK/peers.tar.gz" "$OUT/")
