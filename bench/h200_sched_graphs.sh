#!/usr/bin/env bash
# Leased-H200 run: GPU tests, a graph+overlap cost table, then target-only / full /
# uniform / ragged on captured steps at batch 1..256 with SmolLM2 and the shipped drafter.
#   OUT=/path bash bench/h200_sched_graphs.sh STAGE_DIR     # STAGE_DIR holds model.part1..3 + model.sha256
# DRAFTER=DIR benchmarks (and profiles) that drafter instead of the shipped one.
# PHASES picks what runs (default: tests census graphs nan profile bench; also: sweep, exact), in this
# order: tests census sweep exact graphs nan profile bench.
#   census:   bench/profile_graph_step.py over CENSUS_VARIANTS (default: fused rope) at
#             PROFILE_BATCHES (default 1,16,64,256): kernels per step, kernel time, graph replay time
#   sweep:  bench/small_m_sweep.py (GEMV tile settings vs the cuBLAS path)
#   exact:  every arm with engine.batch_invariant=true (bf16), outputs compared with target-only,
#           and what the fixed-tile kernels cost against the bench phase
#   graphs: target-only and DSpark full on captured steps, overlap off/on (bench_graphs without eager arms)
#   nan:    bench/nan_hunt.py (ragged, batch 128) against $OUT/cost_table.json or COST_TABLE
#   profile: the cost table, at PROFILE_PROMPT_LEN-token contexts (default 128; the table records it, and
#           runners.bench_decode warns when a run's decode contexts are much longer)
set -uo pipefail
PHASES=${PHASES:-tests census graphs nan profile bench}
has() { [[ " $PHASES " == *" $1 "* ]]; }
OUT=${OUT:?set OUT}
WORK=${WORK:-/tmp/dspark-sched}
source "$(dirname "$0")/stage_model.sh" "${1:?stage dir}"
GRAPH="engine.cuda_graphs=true engine.overlap=true engine.budget_lag=2"
DRAFT=${DRAFTER:+drafter.path=$DRAFTER}  # DRAFTER=DIR: a drafter other than the shipped one
GPU_TESTS="tests/test_engine_gpu.py tests/test_kernels_gpu.py tests/test_fused_kernels.py tests/test_paged_attention.py tests/test_small_m_linear.py"
if has tests; then
stamp "GPU tests"
timeout ${T_TESTS:-200} python3 -m pytest -q -p no:cacheprovider $GPU_TESTS > "$OUT/gpu_tests.txt" 2>&1
tail -30 "$OUT/gpu_tests.txt"
fi
if has census; then
stamp "kernel census: layer-kernel variants ${CENSUS_VARIANTS:-fused rope} (random SmolLM2-shaped weights)"
timeout ${T_CENSUS:-240} python3 bench/profile_graph_step.py "$OUT/census" ${CENSUS_VARIANTS:-fused rope} \
  2>&1 | grep -v Warning | grep -v '^{' | tail -60
fi
if has sweep; then
stamp "small-M GEMV tile sweep (SmolLM2 layer shapes, M = 1, 8, 16) against the cuBLAS path"
timeout ${T_SWEEP:-420} python3 bench/small_m_sweep.py "$OUT/small_m_sweep" ${SWEEP_SHAPES:-} 2>&1 | grep -v Warning | tail -12
cp "$OUT/small_m_sweep/small_m_tiles.json" "$WORK/small_m_tiles.json" 2>/dev/null  # for engine.kernels.small_m_tiles later
fi
if has exact; then
stamp "exactness: all arms in bf16 with engine.batch_invariant=true, outputs compared with target-only (expect 0)"
timeout ${T_EXACT:-240} python3 -m runners.bench_decode --config-name bench_sched_graphs engine=h200 $DRAFT \
  engine.batch_invariant=true engine.cost_table="${COST_TABLE:-$OUT/cost_table.json}" \
  engine.allow_foreign_cost_table=${EXACT_FOREIGN_TABLE:-false} \
  progress=false batch_sizes="${BATCHES:-[1,4,16,64,128,256]}" new_tokens=${NEW_TOKENS:-96} \
  output_dir="$OUT/bench_batch_invariant" hydra.run.dir="$WORK/hydra/bench_exact" 2>&1 | grep -v WARNING \
  | grep "Error\|^| " | cut -c1-300
fi
if has graphs; then
stamp "bench: target-only and DSpark full, captured steps, overlap off/on"
timeout ${T_GRAPHS:-240} python3 -m runners.bench_decode --config-name bench_graphs engine=h200 progress=false \
  '~arms.target_eager' '~arms.dspark_eager' batch_sizes="${BATCHES:-[1,4,16,64,128,256]}" \
  new_tokens=${NEW_TOKENS:-96} output_dir="$OUT/bench_graphs" hydra.run.dir="$WORK/hydra/bench_graphs" 2>&1 \
  | grep -v WARNING | grep "Error\|^| " | cut -c1-300
fi
if has nan; then
stamp "NaN hunt (ragged, batch 128)"
timeout ${T_NAN:-200} python3 bench/nan_hunt.py "$OUT" "${COST_TABLE:-$OUT/cost_table.json}" mode=ragged batch=128 \
  2>&1 | grep -v Warning | tail -12
fi
if has profile; then
stamp "profile: cost table of captured + overlapped steps"
timeout ${T_PROFILE:-200} python3 -m runners.profile engine=h200 $GRAPH $DRAFT batch_sizes=[1,4,16,64,128,256] \
  warmup_steps=3 measure_steps=8 prompt_len=${PROFILE_PROMPT_LEN:-128} monotone=envelope out="$OUT/cost_table.json" progress=false \
  hydra.run.dir="$WORK/hydra/profile" 2>&1 | grep -v WARNING | tail -25
cp "$WORK/hydra/profile/profile.json" "$OUT/" 2>/dev/null
fi
if has bench; then
# All arms in one process, so that every arm's greedy outputs are compared with the target-only
# arm's (runners.bench_decode), in ORDER (default alternating: the arm order reverses at every
# other batch and round, so a drifting host is not charged to the last arm) for ROUNDS rounds. SEPARATE=1 runs one process per arm instead (each then compares
# only with itself).
if [[ "${SEPARATE:-0}" == 1 ]]; then
stamp "bench: target / full / uniform / ragged on captured steps (one process per arm)"
for arm in target full uniform ragged; do
  drop=""; for o in target full uniform ragged; do [[ $o != "$arm" ]] && drop="$drop ~arms.$o"; done
  timeout ${T_ARM:-70} python3 -m runners.bench_decode --config-name bench_sched_graphs engine=h200 $DRAFT \
    engine.cost_table="${COST_TABLE:-$OUT/cost_table.json}" progress=false $drop batch_sizes="${BATCHES:-[1,4,16,64,128,256]}" \
    new_tokens=${NEW_TOKENS:-96} output_dir="$OUT/bench_$arm" hydra.run.dir="$WORK/hydra/bench_$arm" 2>&1 \
    | grep -v WARNING | grep "Error\|^| " | cut -c1-300
done
else
stamp "bench: target / full / uniform / ragged on captured steps (one process, outputs compared)"
timeout ${T_BENCH:-400} python3 -m runners.bench_decode --config-name bench_sched_graphs engine=h200 $DRAFT \
  engine.cost_table="${COST_TABLE:-$OUT/cost_table.json}" progress=false batch_sizes="${BATCHES:-[1,4,16,64,128,256]}" \
  new_tokens=${NEW_TOKENS:-96} order=${ORDER:-alternating} rounds=${ROUNDS:-1} ${BENCH_ARGS:-} \
  output_dir="$OUT/bench_sched" hydra.run.dir="$WORK/hydra/bench_sched" 2>&1 \
  | grep -v WARNING | grep "Error\|^| " | cut -c1-300
fi
fi
# At most 8 files come back from a leased machine: pack everything into one archive.
(cd "$OUT" && tar czf "$WORK/results.tar.gz" . && find . -mindepth 1 -delete && mv "$WORK/results.tar.gz" "$OUT/")
stamp done
