#!/usr/bin/env bash
# The area layout's heavy rows split over every rank (plan/area.py `_strata`) against the
# placement before (BEFORE_DIR: the package of commit 7d73a8a), on the global sliding
# window, the one family of benchmarks/slice_masks.py whose placement it changes:
# benchmarks/slice_masks.py --graph, before, after, before, over the machine's links (each
# JSON names the package it imported, meta.package; and its rel err against one GPU).
# Usage: bash benchmarks/run_2gpu_heavy_rows.sh OUTDIR BEFORE_DIR [GPUS]
#        (writes OUTDIR/heavy<GPUS>.tgz)
set -uo pipefail
top=${1:?output folder}; before=$(cd "${2:?tree before}" && pwd); gpus=${3:-2}
out="$top/heavy$gpus"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
for side in before after before2; do
  pkg=$PWD; [ "${side%2}" = before ] && pkg=$before
  PYTHONPATH=$pkg timeout 150 torchrun --nproc_per_node="$gpus" benchmarks/slice_masks.py \
    --graph --no-torch-flex-cp --families global_sliding_window --out "$out/$side" \
    > "$out/${side}_log.txt" 2>&1
  echo "$side rc=$?"; grep '^| ' "$out/$side.md" 2>/dev/null | tail -1 | cut -c1-240
  grep -o '"package": "[^"]*"' "$out/$side.json"
done
tar -czf "$top/heavy$gpus.tgz" -C "$top" "heavy$gpus"
