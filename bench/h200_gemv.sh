#!/usr/bin/env bash
# Leased-H200 run for the batch-1 GEMVs (kernels/small_m_linear.py: split-K, unrolled loops).
# Random SmolLM2-shaped weights only: no model to stage.
#   OUT=/path PHASES="tests sweep census" bash bench/h200_gemv.sh
#   tests:  the GPU kernel tests (GPU_TESTS) -> $OUT/gpu_tests.txt
#   sweep:  bench/small_m_sweep.py over SWEEP_SHAPES (default: all five layer shapes) -> $OUT/small_m_sweep/
#   census: bench/profile_graph_step.py over CENSUS_VARIANTS (default: rope rope+tiles) at PROFILE_BATCHES
#           (default 1,16); rope+tiles reads CENSUS_TILES (default: the sweep's small_m_tiles.json)
set -uo pipefail
PHASES=${PHASES:-tests sweep census}
has() { [[ " $PHASES " == *" $1 "* ]]; }
OUT=${OUT:?set OUT}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT"
start=$(date +%s); stamp() { echo "=== [$(( $(date +%s) - start ))s] $*"; }
GPU_TESTS=${GPU_TESTS:-tests/test_small_m_linear.py tests/test_kernels_gpu.py tests/test_fused_kernels.py}
if has tests; then
  stamp "GPU tests: $GPU_TESTS"
  timeout ${T_TESTS:-240} python3 -m pytest -q -p no:cacheprovider $GPU_TESTS > "$OUT/gpu_tests.txt" 2>&1
  tail -25 "$OUT/gpu_tests.txt"
fi
if has sweep; then
  stamp "small-M GEMV sweep (grid ${SWEEP_GRID:-split}) ${SWEEP_SHAPES:-all shapes}"
  timeout ${T_SWEEP:-420} python3 bench/small_m_sweep.py "$OUT/small_m_sweep" ${SWEEP_SHAPES:-} 2>&1 \
    | grep -v Warning | tail -14
fi
if has census; then
  export CENSUS_TILES=${CENSUS_TILES:-$OUT/small_m_sweep/small_m_tiles.json}
  stamp "census ${CENSUS_VARIANTS:-rope rope+tiles} (tiles: $CENSUS_TILES)"
  PROFILE_BATCHES=${PROFILE_BATCHES:-1,16} timeout ${T_CENSUS:-200} python3 bench/profile_graph_step.py \
    "$OUT/census" ${CENSUS_VARIANTS:-rope rope+tiles} 2>&1 | grep -v Warning | grep -v '^{' | tail -40
  cp "$CENSUS_TILES" "$OUT/census/tiles_used.json" 2>/dev/null
fi
stamp done
