#!/usr/bin/env bash
# Carry a run's state (generated training data, training checkpoints) from one leased GPU machine
# to the next within the device tool's transfer limits: results come back as at most 8 files of
# 16 MiB per call, and an upload (repository included) is at most 64 MiB.
#
#   bash bench/carry_state.sh pack SRC NAME PACK_DIR      # on the GPU: SRC (a folder) -> PACK_DIR/NAME.tar.xz.NNN
#                                                           # (parts of 15 MiB) + PACK_DIR/NAME.sha256; EXCLUDE:
#                                                           # tar patterns left out, e.g. EXCLUDE="final"
#   bash bench/carry_state.sh send PACK_DIR OUT FIRST [N]   # on the GPU: copy parts FIRST..FIRST+N-1 (1-based, in
#                                                           # name order, N=8 by default) to OUT; says how many remain
#   bash bench/carry_state.sh group FROM... DEST           # here: gather returned parts into DEST/carryK/ folders of
#                                                           # two parts each (each carried in its own upload call)
#   bash bench/carry_state.sh unpack DEST_DIR FROM...      # on the GPU: join NAME.tar.xz.NNN found in the FROM
#                                                           # folders, check each archive's sha256, extract into DEST_DIR
#
# A checkpoint folder extracted by `unpack` is the one `pack` read, byte for byte (the archive's
# sha256 is checked before anything is extracted), so `train_drafter resume=true` continues from it.
set -euo pipefail
cmd=${1:?pack|send|group|unpack}; shift
PART_BYTES=${PART_BYTES:-15M}

case "$cmd" in
  pack)
    src=${1:?SRC}; name=${2:?NAME}; pack=${3:?PACK_DIR}
    [[ -d "$src" ]] || { echo "carry_state pack: $src is not a folder" >&2; exit 2; }
    mkdir -p "$pack"; rm -f "$pack/$name".tar.xz.* "$pack/$name.sha256"
    excludes=(); for e in ${EXCLUDE:-}; do excludes+=("--exclude=$e"); done  # e.g. EXCLUDE="final" (tar patterns)
    tar -C "$(dirname "$src")" "${excludes[@]}" -cf - "$(basename "$src")" | xz -T0 -3 > "$pack/$name.tar.xz"
    (cd "$pack" && sha256sum "$name.tar.xz" > "$name.sha256")
    split -b "$PART_BYTES" -d -a 3 "$pack/$name.tar.xz" "$pack/$name.tar.xz."
    rm "$pack/$name.tar.xz"
    echo "packed $src: $(ls "$pack/$name".tar.xz.* | wc -l) part(s), $(du -cb "$pack/$name".tar.xz.* | tail -1 | cut -f1) bytes"
    ;;
  send)
    pack=${1:?PACK_DIR}; out=${2:?OUT}; first=${3:?FIRST}; n=${4:-8}
    [[ -d "$pack" ]] || { echo "carry_state send: no $pack (a fresh machine? the packed state went with the last one)" >&2; exit 2; }
    mapfile -t files < <(ls "$pack" | sort)
    mkdir -p "$out"
    for f in "${files[@]:$((first - 1)):$n}"; do cp "$pack/$f" "$out/"; done
    left=$(( ${#files[@]} - (first - 1) - n )); (( left < 0 )) && left=0
    echo "sent files $first..$(( first + n - 1 > ${#files[@]} ? ${#files[@]} : first + n - 1 )) of ${#files[@]}; $left left"
    ;;
  group)
    (( $# >= 2 )) || { echo "carry_state group: FROM... DEST" >&2; exit 2; }
    dest=${!#}; froms=("${@:1:$#-1}")
    mkdir -p "$dest"
    mapfile -t files < <(for d in "${froms[@]}"; do find "$d" -maxdepth 1 -type f \( -name '*.tar.xz.[0-9][0-9][0-9]' -o -name '*.sha256' \); done | sort -u)
    k=0; in_dir=2
    for f in "${files[@]}"; do
      if [[ "$f" == *.sha256 ]]; then mkdir -p "$dest/carry1"; cp "$f" "$dest/carry1/"; continue; fi
      if (( in_dir == 2 )); then k=$((k + 1)); in_dir=0; mkdir -p "$dest/carry$k"; fi
      cp "$f" "$dest/carry$k/"; in_dir=$((in_dir + 1))
    done
    du -sh "$dest"/carry* | sort -V
    ;;
  unpack)
    dest=${1:?DEST_DIR}; shift
    (( $# >= 1 )) || { echo "carry_state unpack: DEST_DIR FROM..." >&2; exit 2; }
    mkdir -p "$dest"
    mapfile -t sums < <(find "$@" -maxdepth 1 -name '*.sha256' | sort -u)
    (( ${#sums[@]} )) || { echo "carry_state unpack: no NAME.sha256 in $*" >&2; exit 2; }
    for s in "${sums[@]}"; do
      name=$(basename "$s" .sha256)
      tmp=$(mktemp -d)
      find "$@" -maxdepth 1 -name "$name.tar.xz.[0-9][0-9][0-9]" -printf '%f %p\n' | sort -u -k1,1 | cut -d' ' -f2 \
        | xargs cat > "$tmp/$name.tar.xz"
      # the sum file is opened before the cd, so FROM folders may be relative
      (cd "$tmp" && sha256sum -c --quiet -) < "$s" \
        || { echo "carry_state unpack: $name: sha256 mismatch (a part missing?)" >&2; exit 3; }
      xz -dc "$tmp/$name.tar.xz" | tar -C "$dest" -xf -
      rm -rf "$tmp"
      echo "unpacked $name into $dest"
    done
    ;;
  *) echo "carry_state: unknown command $cmd (pack|send|group|unpack)" >&2; exit 2 ;;
esac
