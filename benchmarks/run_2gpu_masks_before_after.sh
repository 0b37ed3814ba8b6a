#!/usr/bin/env bash
# benchmarks/slice_masks.py --graph --no-torch-flex-cp on FAMILIES, before (BEFORE_DIR's
# package), after (this tree's) and before again, over the machine's links, in one device
# call: the same run times both trees. Each JSON names the package it imported
# (meta.package) and its output's error against one GPU's.
# Usage: bash benchmarks/run_2gpu_masks_before_after.sh OUTDIR BEFORE_DIR FAMILIES [GPUS]
#        (writes OUTDIR/masks<GPUS>.tgz; about 40 s a family a run on 2x H200); SLICE_ARGS:
#        more options for slice_masks.py (e.g. --chained); GRAPH="" leaves out the captured
#        timings (--graph by default)
set -uo pipefail
top=${1:?output folder}; before=$(cd "${2:?tree before}" && pwd); families=${3:?families}
gpus=${4:-2}; out="$top/masks$gpus"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
gpu_gate || exit 3  # a GPU idling hot times nothing worth keeping
for side in before after before2; do
  pkg=$PWD; [ "${side%2}" = before ] && pkg=$before
  PYTHONPATH=$pkg timeout 280 torchrun --nproc_per_node="$gpus" benchmarks/slice_masks.py \
    ${GRAPH---graph} --no-torch-flex-cp --families "$families" ${SLICE_ARGS:-} --out "$out/$side" \
    > "$out/${side}_log.txt" 2>&1
  echo "$side rc=$?"; grep '^| ' "$out/$side.md" 2>/dev/null | tail -n +2 | cut -c1-200
  grep -o '"package": "[^"]*"' "$out/$side.json"
done
tar -czf "$top/masks$gpus.tgz" -C "$top" "masks$gpus"
