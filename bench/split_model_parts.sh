#!/usr/bin/env bash
# Re-split the staged SmolLM2 GGUF (.gpu/model1..3 from ../shared/tools/prepare-gpu-upload) into N smaller
# parts, .gpu/part<k>of<N>/model.part<k> (the sha256 beside part 1), for when the repository has grown and
# a third of the model no longer fits beside it under the 64 MiB upload cap. Carry the folders one call
# each, right after one another, copying each part to the same stage folder; bench/stage_model.sh joins
# model.part1..N in numeric order and checks the sha256.
#   bash bench/split_model_parts.sh 4
set -euo pipefail
N=${1:?number of parts}
cd "$(git rev-parse --show-toplevel)"
tmp=$(mktemp -d)
cat .gpu/model1/model.part1 .gpu/model2/model.part2 .gpu/model3/model.part3 > "$tmp/model.gguf"
[[ "$(cat .gpu/model1/model.sha256)" == "$(sha256sum "$tmp/model.gguf" | awk '{print $1}')" ]] \
  || { echo "sha256 mismatch: run ../shared/tools/prepare-gpu-upload again"; exit 3; }
split -n "$N" -d -a 2 "$tmp/model.gguf" "$tmp/p_"
for k in $(seq 1 "$N"); do
  d=.gpu/part${k}of$N
  rm -rf "$d" && mkdir -p "$d"
  mv "$tmp/p_$(printf %02d $((k - 1)))" "$d/model.part$k"
done
cp .gpu/model1/model.sha256 ".gpu/part1of$N/"
rm -rf "$tmp"
du -b .gpu/part*of"$N"/model.part* | sort -k2 -V
