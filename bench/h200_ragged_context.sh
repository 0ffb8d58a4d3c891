#!/usr/bin/env bash
# Leased-H200 run for ragged against full at batch 128/256: a cost table profiled at the
# benchmark's decode context, the paired benchmark against it (with device gaps, host and GC
# diagnostics), the same with the garbage collector frozen, batch 1, and a same-state device
# comparison of full / uniform / ragged steps at equal token counts (random weights).
#   OUT=/path bash bench/h200_ragged_context.sh STAGE_DIR   # STAGE_DIR: model.part1..3 + model.sha256
# Each part writes OUT/<part>/results.tar.gz (bench/h200_sched_graphs.sh packs its folder) and OUT/<part>.log.
# PARTS picks the parts (default "A B C D"); A_ARGS: part A's extra bench_decode overrides
# (default graph_timing=true). B and C use part A's table (or TABLE=path); C_BATCHES: part C's batch sizes
# (default [1]). T: GPU tests first (engine, graph decode, planner, stats modules), into OUT/T_gpu_tests.txt.
set -uo pipefail
PARTS=" ${PARTS:-A B C D} "; has() { [[ "$PARTS" == *" $1 "* ]]; }
OUT=${OUT:?set OUT}; STAGE=${1:?stage dir}
export WORK=${WORK:-/tmp/dspark-ctx}
HERE=$(cd "$(dirname "$0")" && pwd)
CTX=${PROFILE_PROMPT_LEN:-200}; ROUNDS=${ROUNDS:-3}; NEW=${NEW_TOKENS:-256}
has T && timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_engine_gpu.py tests/test_graph_decode.py \
  tests/test_planner.py tests/test_stats.py > "$OUT/T_gpu_tests.txt" 2>&1
# A: the cost table at CTX-token prompts, then target/full/uniform/ragged at batch 128 and 256 against it.
has A && { OUT=$OUT/A PHASES="profile bench" PROFILE_PROMPT_LEN=$CTX BATCHES="[128,256]" NEW_TOKENS=$NEW \
  ROUNDS=$ROUNDS BENCH_ARGS="${A_ARGS-graph_timing=true}" T_BENCH=300 bash "$HERE/h200_sched_graphs.sh" "$STAGE" \
  > "$OUT/A.log" 2>&1
  mkdir -p "$WORK/tableA" && tar xzf "$OUT/A/results.tar.gz" -C "$WORK/tableA" ./cost_table.json; }
TABLE=${TABLE:-$WORK/tableA/cost_table.json}  # TABLE=path: B and C against a table from an earlier call
# B: the same benchmark with Python's garbage collector frozen during each run (gc_mode=freeze).
has B && OUT=$OUT/B PHASES="bench" COST_TABLE=$TABLE BATCHES="[128,256]" NEW_TOKENS=$NEW ROUNDS=$ROUNDS \
  BENCH_ARGS="gc_mode=freeze" T_BENCH=300 bash "$HERE/h200_sched_graphs.sh" "$STAGE" > "$OUT/B.log" 2>&1
# C: batch 1 (target-only speed; the planner should decline).
has C && OUT=$OUT/C PHASES="bench" COST_TABLE=$TABLE BATCHES="${C_BATCHES:-[1]}" NEW_TOKENS=$NEW ROUNDS=$ROUNDS T_BENCH=200 \
  bash "$HERE/h200_sched_graphs.sh" "$STAGE" > "$OUT/C.log" 2>&1
# D: same-state device time per graph, forced trims, random target weights (bench/step_host_split.py).
has D && cd "$HERE/.." && for b in 256 128; do
  B=$b STEPS=60 PROMPT=$CTX GRAPH_TIMING=1 ARMS=full,uniform@5,ragged@0.66,ragged@0.70,uniform@3,ragged@0.40,full \
    timeout 150 python3 bench/step_host_split.py 2>&1 | grep -v Warn > "$OUT/D_b$b.txt"
done
tail -n 40 "$OUT"/*.log | cut -c1-220; cat "$OUT"/D_b*.txt 2>/dev/null | cut -c1-400
