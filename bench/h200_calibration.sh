#!/usr/bin/env bash
# Leased-H200 re-calibration of a DSpark drafter's confidence head, out of sample:
#  1. calibration data: prompts the drafter never trained on, answered by the target at T=0.7 /
#     top-p 0.8 / top-k 20 (as training data is made), bf16, engine=h200. The shipped drafter
#     trained on the whole train split, so by default they are the EVAL split of the training-only
#     sources (hard_questions, stdlib_prose: no benchmark or eval_drafter run draws from them);
#     for a drafter trained on part of the train split, SPLIT=train SOURCES=[...all five...] takes
#     the train split minus its training_prompts.json (exclude_prompts, applied either way);
#  2. runners.calibrate on a COPY of the drafter under $OUT: STS fitted on FIT_FRACTION of the
#     sequences, AUC/ECE reported on the rest (out of sample) with a by-sequence bootstrap interval,
#     many anchors per sequence (every STRIDE-th response position);
#  3. everything under $OUT (except the copied weights) packed into ONE tarball.
#
#   OUT=/path WORK=/tmp/dspark-cal CUDA_VISIBLE_DEVICES=0 bash bench/h200_calibration.sh STAGE_DIR
#
# STAGE_DIR holds model.part1..3 + model.sha256 (bench/stage_model.sh). Knobs (env, defaults below):
# DRAFTER (drafter folder; default the shipped one), SPLIT, EXCLUDE (prompt record(s), comma-separated;
# default $DRAFTER/training_prompts.json), PER_SOURCE, SOURCES, CAL_SEED, MAXTOK, DATA_SEQS,
# T_DATA (admission budget, s), FIT_FRACTION, ANCHORS (null = every STRIDE-th position), STRIDE,
# CHUNK, CAL_BATCH, RESAMPLES, ENGINE, T_CAL, METHOD, REPLAY (1: keep the greedy replay as $OUT/replay.pt, with
# the drafter's max probabilities, for offline analysis such as bench/auc_head_vs_max_prob.py). Budget: about 2-3 minutes on one H200.
set -uo pipefail
OUT=${OUT:?set OUT}
WORK=${WORK:-/tmp/dspark-calibration}
mkdir -p "$WORK" "$OUT"
exec > >(tee -a "$OUT/calibration_session.log") 2>&1
source "$(dirname "$0")/stage_model.sh" "${1:?stage dir with model.part1..3 + model.sha256}"   # cd's to the repo root

DRAFTER=$(cd "${DRAFTER:-dspark/assets/dspark-smollm2}" && pwd) || { echo "DRAFTER folder not found"; exit 2; }
EXCLUDE=${EXCLUDE:-$DRAFTER/training_prompts.json}
SPLIT=${SPLIT:-eval}
SOURCES=${SOURCES:-[hard_questions,stdlib_prose]}
PER_SOURCE=${PER_SOURCE:-400}      # prompts per source (stdlib_prose has 119 eval prompts): ~520 sequences
CAL_SEED=${CAL_SEED:-1}
MAXTOK=${MAXTOK:-256}              # as the shipped drafter's training data
DATA_SEQS=${DATA_SEQS:-256}
T_DATA=${T_DATA:-75}               # stop admitting prompts after this many seconds (admitted ones finish)
ENGINE=${ENGINE:-h200}
FIT_FRACTION=${FIT_FRACTION:-0.5}
METHOD=${METHOD:-sts_bias}         # sts | sts_bias (temperature + bias per position) | sts_max_prob | sts_top_gap
ANCHORS=${ANCHORS:-null}           # null: every STRIDE-th response position
STRIDE=${STRIDE:-2}
CHUNK=${CHUNK:-64}                 # anchors per sequence per draft+verify pass
CAL_BATCH=${CAL_BATCH:-16}         # sequences per target context pass
RESAMPLES=${RESAMPLES:-200}
T_CAL=${T_CAL:-150}
EX_LIST=$(python3 -c "import sys; print('[' + ','.join(repr(e) for e in sys.argv[1].split(',') if e) + ']')" "$EXCLUDE")
echo "drafter=$DRAFTER exclude=$EX_LIST sources=$SOURCES per_source=$PER_SOURCE seed=$CAL_SEED engine=$ENGINE" \
  "GPU=${CUDA_VISIBLE_DEVICES:-unset}"
[[ -f "$DRAFTER/config.json" ]] || { echo "no config.json in $DRAFTER"; exit 2; }

stamp "calibration data: $SPLIT split of $SOURCES minus the drafter's training prompts, T=0.7/0.8/20, $MAXTOK tokens"
mkdir -p "$OUT/data"
timeout $(( T_DATA + 120 )) python3 -m runners.make_training_data engine=$ENGINE engine.max_num_seqs=$DATA_SEQS \
  split=$SPLIT sources="$SOURCES" num_prompts_per_source=$PER_SOURCE "exclude_prompts=$EX_LIST" seed=$CAL_SEED \
  max_tokens=$MAXTOK time_budget_s=$T_DATA output="$OUT/data/calib.safetensors" progress=false \
  hydra.run.dir="$WORK/hydra/data" > "$OUT/data.log" 2>&1 &
pid_data=$!
wait $pid_data; rc=$?
grep -v '^\s*"\(index\|error\)' "$OUT/data.log" | tail -45
if [[ $rc != 0 || ! -f "$OUT/data/calib.safetensors" ]]; then
  echo "CALIBRATION DATA FAILED (rc=$rc); not calibrating"
else
  stamp "calibrate: STS fitted on $FIT_FRACTION of the sequences, reported out of sample on the rest"
  rm -rf "$OUT/drafter"; mkdir -p "$OUT/drafter"
  cp "$DRAFTER"/* "$OUT/drafter/"   # a copy: the repo's drafter is never modified
  timeout $T_CAL python3 -m runners.calibrate checkpoint="$OUT/drafter" data="$OUT/data/calib.safetensors" \
    method=$METHOD fit_fraction=$FIT_FRACTION anchors_per_seq=$ANCHORS anchor_stride=$STRIDE anchor_chunk=$CHUNK \
    batch_size=$CAL_BATCH bootstrap_resamples=$RESAMPLES max_len=1024 device=cuda dtype=bfloat16 progress=false \
    ${REPLAY:+replay_cache=$OUT/replay.pt} \
    hydra.run.dir="$WORK/hydra/cal" > "$OUT/calibrate.log" 2>&1 &
  pid_cal=$!
  wait $pid_cal; rc=$?
  tail -40 "$OUT/calibrate.log"
  [[ $rc == 0 ]] || echo "CALIBRATION FAILED (rc=$rc)"
  python3 - "$OUT/drafter/calibration.json" <<'EOF' 2>&1 || true
import json, sys
r = json.load(open(sys.argv[1]))
pct = lambda v: "n/a" if v is None else f"{100 * v:.2f}%"
print(f"blocks fit/report: {r['split']['blocks']}  sequences: {r['split']['sequences']}")
print(f"in-sample ECE after: {pct(r['in_sample']['ece_after'])}  out-of-sample ECE before/after: "
      f"{pct(r['ece_before'])} / {pct(r['ece_after'])}  AUC (out of sample): {r['auc_overall']}")
if "head_auc" in r:  # sts_max_prob / sts_top_gap: the AUC above is the fused confidence's
    print(f"AUC of the head alone, same blocks: {r['head_auc']['auc_overall']}")
for score, what in (("draft_max_prob", "max probability"), ("draft_top_gap", "top-2 logit gap")):
    if f"{score}_auc" in r:
        print(f"AUC of the drafter's own {what}, same blocks (a head-free estimate): "
              f"{r[f'{score}_auc']['auc_overall']}")
b = r.get("bootstrap", {}).get("ece_after")
if b:
    print(f"95% interval of the out-of-sample ECE after: [{pct(b['low'])}, {pct(b['high'])}]  "
          f"noise floor: {pct(b['noise_floor'])}  -> {r.get('target_ece_verdict')}")
old = r.get("previous_temperatures")
if old:
    ob = old.get("bootstrap", {})
    print(f"previous temperatures on the same report blocks: ECE {pct(old['ece_after'])} "
          f"[{pct(ob.get('low'))}, {pct(ob.get('high'))}]")
print("temperatures:", [round(t, 3) for t in r["temperatures"]])
EOF
fi

stamp "pack: everything under \$OUT but the copied weights, into calibration_results.tar.gz"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>/dev/null
rm -f "$OUT"/drafter/*.safetensors "$OUT/drafter/model.safetensors.index.json"  # the weights are the repo's
stamp "done"
tar czf "$WORK/calibration_results.tar.gz" -C "$OUT" --exclude=calibration_results.tar.gz . \
  && find "$OUT" -mindepth 1 -maxdepth 1 ! -name calibration_results.tar.gz -exec rm -rf {} + \
  && mv "$WORK/calibration_results.tar.gz" "$OUT/" && ls -la "$OUT"
