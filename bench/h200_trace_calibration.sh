#!/usr/bin/env bash
# Leased-H200 run: does a confidence calibration fitted on the workload's own
# step traces raise ragged's share of the oracle's gain at batch 128/256?
#   OUT=/path bash bench/h200_trace_calibration.sh STAGE_DIR    # STAGE_DIR: model.part1..3 + model.sha256
# PARTS (default "trace cal replay ab"; also ragtrace, std):
#   trace:  eager verify=full runs at batch 256 on poetry with step traces (runners.bench_decode
#           step_trace=true): the eval split (the benchmark's own prompts) and the train split
#           (TRAIN_REQUESTS requests, default 512), NEW_TOKENS new tokens each (default 256)
#   ragtrace: an eager ragged run (budget lag 2, TABLE) and an eager full run at batch B with step traces:
#           the ragged trace holds the windows the planner chose and what they accepted, to hold the
#           offline replay's prediction against
#   std:    the bench_sched_graphs arms (target / full / uniform / ragged) at STD_BATCHES, ROUNDS rounds, with
#           each trimming arm's share of the oracle gain over the same timed steps
#   cal:    runners.calibrate traces=<train traces> method=sts_bias fit_fraction=0.5 into a copy of the
#           shipped drafter ($WORK/drafter_poetry; the shipped calibration is judged on the same report
#           part), then the same fit on the eval traces in a throwaway copy, whose "previous" numbers are
#           the train-fitted calibration judged on the benchmark's own blocks
#   replay: bench/planner_replay.py on the eval traces: the shipped and the poetry calibration at batch
#           128/256, budget lag 2/1/0, against TABLE
#   ab:     full / ragged (shipped calibration) / ragged_poetry (engine.confidence_calibration) on captured
#           steps with overlap, AB_BATCHES (default [128,256]), ROUNDS alternating rounds (default 2), one
#           process; EXTRA_ARM="+arms.NAME={...}" replaces the ragged_poetry arm
# ENGINE (default h200) and BATCH (default 256) exist for a CPU smoke run of the script's commands.
set -uo pipefail
PARTS=" ${PARTS:-trace cal replay ab} "; has() { [[ "$PARTS" == *" $1 "* ]]; }
OUT=${OUT:?set OUT}; WORK=${WORK:-/tmp/dspark-cal}
source "$(dirname "$0")/stage_model.sh" "${1:?stage dir}"
TABLE=${TABLE:-bench/results/h200-2026-11-30-ragged-context/run2/A/cost_table.json}
ENGINE=${ENGINE:-h200}; B=${BATCH:-256}; NEW=${NEW_TOKENS:-256}
CAL=$WORK/drafter_poetry
traces() { ls "$OUT/trace_$1"/step_trace_*.npz | paste -sd, -; }
if has trace; then
  for split in eval train; do
    n=$B; [[ $split == train ]] && n=${TRAIN_REQUESTS:-512}
    stamp "step traces: eager verify=full, batch $B, poetry $split split, $n requests"
    timeout "${T_TRACE:-200}" python3 -m runners.bench_decode engine="$ENGINE" '~arms.target_only' \
      batch_sizes="[$B]" new_tokens="$NEW" min_requests="$n" warmup_steps=0 step_trace=true workload_split=$split \
      progress=false output_dir="$OUT/trace_$split" hydra.run.dir="$WORK/hydra/trace_$split" 2>&1 \
      | grep -v WARNING | grep "Error\|^| dspark" | cut -c1-300
  done
fi
if has ragtrace; then
  stamp "step trace of an eager ragged run (batch $B, the cost table, budget lag 2), beside an eager full run"
  timeout "${T_TRACE:-300}" python3 -m runners.bench_decode engine="$ENGINE" '~arms.target_only' \
    "+arms.ragged_eager={spec: dspark, verify: ragged, budget_lag: 2, cost_table: '$TABLE', allow_foreign_cost_table: true}" \
    batch_sizes="[$B]" new_tokens="$NEW" min_requests="$B" warmup_steps=3 step_trace=true progress=false \
    output_dir="$OUT/trace_ragged" hydra.run.dir="$WORK/hydra/trace_ragged" 2>&1 | grep -v WARNING \
    | grep "Error\|^| " | cut -c1-300
fi
if has cal; then
  stamp "calibration fitted on the train-split traces (copy of the shipped drafter: $CAL)"
  rm -rf "$CAL" "$WORK/drafter_check" && cp -r dspark/assets/dspark-smollm2 "$CAL"
  timeout "${T_CAL:-200}" python3 -m runners.calibrate checkpoint="$CAL" "traces=[$(traces train)]" method=sts_bias \
    fit_fraction=0.5 output_json="$OUT/calibration_poetry.json" plot="$OUT/reliability_poetry.png" progress=false \
    hydra.run.dir="$WORK/hydra/cal" 2>&1 | grep -v WARNING | tail -40
  cp "$CAL/temperatures.json" "$OUT/temperatures_poetry.json"
  stamp "the same fit on the eval traces (throwaway): its 'previous' is the train fit on the benchmark's blocks"
  cp -r "$CAL" "$WORK/drafter_check"
  timeout "${T_CAL:-200}" python3 -m runners.calibrate checkpoint="$WORK/drafter_check" "traces=[$(traces eval)]" \
    method=sts_bias fit_fraction=0.5 output_json="$OUT/calibration_check_eval.json" \
    plot="$OUT/reliability_check_eval.png" progress=false hydra.run.dir="$WORK/hydra/cal_check" 2>&1 \
    | grep -v WARNING | tail -40
fi
if has replay; then
  stamp "planner replay on the eval traces"
  timeout "${T_REPLAY:-200}" python3 bench/planner_replay.py $(traces eval | tr , ' ') --table "$TABLE" \
    --head shipped=dspark/assets/dspark-smollm2 --head poetry="$CAL" --batches 128 256 --lags 2 1 0 \
    --out "$OUT/replay" 2>&1 | tail -30
fi
if has ab; then
  POETRY_ARM="+arms.ragged_poetry={spec: dspark, verify: ragged, cuda_graphs: true, overlap: true, budget_lag: 2, confidence_calibration: '$CAL'}"
  EXTRA=${EXTRA_ARM:-$POETRY_ARM}
  stamp "A/B on captured steps: full / ragged (shipped calibration) / $EXTRA"
  timeout "${T_AB:-420}" python3 -m runners.bench_decode --config-name bench_sched_graphs engine="$ENGINE" \
    engine.cost_table="$TABLE" '~arms.target' '~arms.uniform' \
    "$EXTRA" \
    batch_sizes="${AB_BATCHES:-[128,256]}" new_tokens="$NEW" order=alternating rounds="${ROUNDS:-2}" progress=false \
    ${AB_ARGS:-} output_dir="$OUT/ab" hydra.run.dir="$WORK/hydra/ab" 2>&1 | grep -v WARNING | grep "Error\|^| " \
    | cut -c1-300
fi
if has std; then
  stamp "bench_sched_graphs arms (target / full / uniform / ragged) with the like-for-like oracle share"
  timeout "${T_STD:-420}" python3 -m runners.bench_decode --config-name bench_sched_graphs engine="$ENGINE" \
    engine.cost_table="$TABLE" batch_sizes="${STD_BATCHES:-[1,4,16,128,256]}" new_tokens="$NEW" order=alternating \
    rounds="${ROUNDS:-2}" progress=false ${AB_ARGS:-} output_dir="$OUT/std" hydra.run.dir="$WORK/hydra/std" 2>&1 \
    | grep -v WARNING | grep "Error\|^| \|^Share" | cut -c1-300
fi
(cd "$OUT" && tar czf "$WORK/results.tar.gz" . && find . -mindepth 1 -delete && mv "$WORK/results.tar.gz" "$OUT/")
stamp done
