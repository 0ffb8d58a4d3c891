#!/usr/bin/env bash
# Leased-H200 run of the GPU test suite as one pytest process (`pytest -m gpu` over every test module, so
# that a module setting TRITON_INTERPRET or other process state for its CPU tests would break the GPU ones).
#   OUT=/path bash bench/h200_gpu_tests.sh STAGE_DIR      # STAGE_DIR: model.part1..N + model.sha256
# Writes $OUT/gpu-tests.xml (JUnit) and $OUT/gpu-tests.log. TESTS: pytest paths or node ids to run instead of the
# whole suite (a short check of new GPU tests, e.g. TESTS="tests/test_kernels_gpu.py::TestTopProbabilityCuda").
set -uo pipefail
OUT=${OUT:?set OUT}; WORK=${WORK:-/tmp/dspark-gpu-tests}
source "$(dirname "$0")/stage_model.sh" "${1:?stage dir}"
stamp "pytest -m gpu"
timeout "${T_TESTS:-420}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=8 \
  --junitxml="$OUT/gpu-tests.xml" ${TESTS:-tests} 2>&1 | grep -v "warn(\|Warning" > "$OUT/gpu-tests.log"
echo "pytest exit ${PIPESTATUS[0]}"
tail -25 "$OUT/gpu-tests.log"
stamp done
