#!/usr/bin/env bash
# Held-out accept length of a drafter on larger samples than bench/h200_session.sh's finish phase evaluates, and
# of a baseline drafter paired with it by prompt: every arena-hard-style eval prompt (57) and the first 96 agentic
# and poetry eval prompts by default. Each (drafter, workload) runs as its own runners.eval_drafter process, up to
# PARALLEL of them side by side on the one GPU (T=0 and three workloads: about a minute per drafter on an H200). With a
# baseline, `runners.eval_drafter compare=[BASE,DRAFTER]` then gives the paired change per workload with its
# bootstrap interval. Everything comes back as one tarball, $OUT/heldout.tar.gz.
#
#   DRAFTER=/tmp/w/ship BASE=builtin:dspark-smollm2 OUT=... bash bench/h200_heldout_eval.sh STAGE_DIR
#
# STAGE_DIR holds model.part1..N + model.sha256 (bench/stage_model.sh). Knobs (env, defaults below): DRAFTER (a
# drafter folder or builtin:NAME; required), BASE (the same; empty: no comparison), SAMPLES (workload:prompts
# pairs; the prompts are each workload's seeded choice, so a smaller count is a prefix of a larger one), TEMPS
# (a Hydra list), TOK (new tokens per answer), ENGINE, T_EVAL (seconds per process), PARALLEL and PER_EVAL_GIB
# (below), WORK.
set -uo pipefail
OUT=${OUT:?set OUT}
WORK=${WORK:-/tmp/dspark-heldout}
DRAFTER=${DRAFTER:?set DRAFTER: the drafter folder (or builtin:NAME) to evaluate}
BASE=${BASE:-}
SAMPLES=${SAMPLES:-"agentic:96 poetry:96 arena_hard:57"}
TEMPS=${TEMPS:-"[0.0]"}
TOK=${TOK:-192}
ENGINE=${ENGINE:-h200}
T_EVAL=${T_EVAL:-300}
# PARALLEL: evaluations at once. Each engine=h200 process holds about 26 GiB at its peak (a KV pool of about 24 GiB and
# its activations), PER_EVAL_GIB with a margin: unset, as many as fit in the GPU's free memory (at most 6); set higher
# than fit, it is lowered to what fits, and the log says so (more would run out of memory and fail part of the runs).
PER_EVAL_GIB=${PER_EVAL_GIB:-28}
EV="$WORK/heldout"
[[ -z "${PARALLEL:-}" || "$PARALLEL" =~ ^[1-9][0-9]*$ ]] || { echo "PARALLEL=$PARALLEL: a whole number >= 1"; exit 2; }
[[ "$PER_EVAL_GIB" =~ ^[1-9][0-9]*$ ]] || { echo "PER_EVAL_GIB=$PER_EVAL_GIB: a whole number of GiB >= 1"; exit 2; }
gpu=${CUDA_VISIBLE_DEVICES:-}; gpu=${gpu%%,*}
free_mib=$(nvidia-smi ${gpu:+-i "$gpu"} --query-gpu=memory.free --format=csv,noheader,nounits 2>/dev/null | head -1)
if [[ "$ENGINE" != cpu && "$free_mib" =~ ^[0-9]+$ ]]; then
  fit=$(( free_mib / (PER_EVAL_GIB * 1024) )); (( fit < 1 )) && fit=1
  if [[ -z "${PARALLEL:-}" ]]; then
    PARALLEL=$(( fit < 6 ? fit : 6 ))
    echo "PARALLEL=$PARALLEL: evaluations of about $PER_EVAL_GIB GiB each at once, for the GPU's $free_mib MiB free"
  elif (( PARALLEL > fit )); then
    echo "PARALLEL=$PARALLEL lowered to $fit: only $fit evaluations of about $PER_EVAL_GIB GiB each fit in the" \
         "GPU's $free_mib MiB free"
    PARALLEL=$fit
  fi
fi
PARALLEL=${PARALLEL:-3}
for s in $SAMPLES; do
  [[ "$s" =~ ^[a-z_]+:[1-9][0-9]*$ ]] || { echo "SAMPLES: '$s' is not workload:prompts (e.g. agentic:96)"; exit 2; }
done
mkdir -p "$EV" "$OUT"
source "$(dirname "$0")/stage_model.sh" "${1:?stage dir with model.part1..N + model.sha256}"  # cd's to the repo root

runs=("drafter=$DRAFTER"); [[ -n "$BASE" ]] && runs+=("base=$BASE")
stamp "evaluate ${runs[*]} on $SAMPLES at T=$TEMPS"
pids=(); logs=(); failed=(); next=0
finish_one() {  # wait for the oldest evaluation still running, and note its log when it failed
  wait "${pids[$next]}" || failed+=("${logs[$next]}"); next=$(( next + 1 ))
}
for r in "${runs[@]}"; do
  run=${r%%=*}; ckpt=${r#*=}
  for s in $SAMPLES; do
    w=${s%%:*}; n=${s#*:}
    (( ${#pids[@]} - next >= PARALLEL )) && finish_one
    timeout "$T_EVAL" python3 -m runners.eval_drafter checkpoint="$ckpt" engine="$ENGINE" "workloads=[$w]" \
      num_prompts="$n" max_tokens="$TOK" "temperatures=$TEMPS" progress=false output_dir="$EV/$run/$w" \
      hydra.run.dir="$WORK/hydra/${run}_$w" > "$EV/${run}_$w.log" 2>&1 &
    pids+=($!); logs+=("$EV/${run}_$w.log")
  done
done
while (( next < ${#pids[@]} )); do finish_one; done
stamp "evaluated; failed: ${failed[*]:-none}"
for s in $SAMPLES; do
  w=${s%%:*}
  for run in drafter base; do [[ -f "$EV/$run/$w/eval.md" ]] && { echo "--- $run $w"; cat "$EV/$run/$w/eval.md"; }; done
  if [[ -n "$BASE" && -f "$EV/base/$w/eval.json" && -f "$EV/drafter/$w/eval.json" ]]; then
    if python3 -m runners.eval_drafter "compare=[$EV/base/$w,$EV/drafter/$w]" output_dir="$EV/compare/$w" \
      hydra.run.dir="$WORK/hydra/compare_$w" > "$WORK/compare_$w.log" 2>&1; then
      cat "$EV/compare/$w/compare.md"   # the whole comparison: the table, by source, notes
    else
      echo "FAILED: compare $w"; tail -5 "$WORK/compare_$w.log"
    fi
  fi
done
for log in "${failed[@]}"; do echo "FAILED: $log"; tail -5 "$log"; done
tar czf "$OUT/heldout.tar.gz" -C "$WORK" heldout
stamp "packed $OUT/heldout.tar.gz"
(( ${#failed[@]} == 0 ))
