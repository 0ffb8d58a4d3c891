#!/usr/bin/env bash
# Leased-H200 check of the device-resident decode path: GPU tests, then eager vs
# CUDA-graph vs graph+overlap decode throughput with SmolLM2 and the shipped drafter.
#   OUT=/path bash bench/h200_graphs.sh STAGE_DIR      # STAGE_DIR holds model.part1..3 + model.sha256
set -uo pipefail
OUT=${OUT:?set OUT}
WORK=${WORK:-/tmp/dspark-graphs}
source "$(dirname "$0")/stage_model.sh" "${1:?stage dir}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/nvidia-smi.txt"
stamp "GPU tests"
timeout ${T_TESTS:-240} python3 -m pytest -q -p no:cacheprovider tests/test_engine_gpu.py tests/test_kernels_gpu.py \
  ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tail -40 | tee "$OUT/gpu_tests.txt"
stamp "bench: eager vs graphs vs graphs+overlap"
timeout ${T_BENCH:-300} python3 -m runners.bench_decode --config-name bench_graphs engine=h200 progress=false \
  batch_sizes="${BATCHES:-[1,4,16,64,128,256]}" new_tokens=${NEW_TOKENS:-96} output_dir="$OUT/bench" \
  hydra.run.dir="$WORK/hydra/bench" 2>&1 | grep -v WARNING | tail -45
stamp done
