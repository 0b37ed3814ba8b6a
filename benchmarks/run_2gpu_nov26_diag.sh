#!/usr/bin/env bash
# Diagnosis before changing code (2026-11-26, second session; nvidia-h100-x2 or -h200-x2):
#   issue 42: benchmarks/slice_masks.py on the families whose mask follows the documents, the
#     new-mask row on the automatic kernel and on the flash kernel alone (--fresh-kernel);
#   issue 39: cProfile of a new 8K whole_docs pack every call (benchmarks/newpack_cprofile.py).
# Usage: bash benchmarks/run_2gpu_nov26_diag.sh OUTDIR   (wheels installed in /tmp/site)
set -uo pipefail
top=${1:?output folder}; out=/tmp/run_diag; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
export PYTHONPATH=$PWD:/tmp/site
fams=full_document,causal_document,shared_question,block_causal_document
for kern in auto torch-flash; do
  extra=(); [ "$kern" = auto ] || extra=(--fresh-kernel "$kern")
  timeout 150 torchrun --nproc_per_node=2 benchmarks/slice_masks.py --families $fams --no-flex \
    "${extra[@]}" --out "$out/slice_masks_fresh_$kern" > "$out/slice_masks_fresh_${kern}_log.txt" 2>&1
  echo "slice_masks $kern rc=$?"; quiet < "$out/slice_masks_fresh_${kern}_log.txt" | grep "^|" | tail -5
done
timeout 120 torchrun --nproc_per_node=2 benchmarks/newpack_cprofile.py > "$out/newpack_prof.txt" 2>&1
echo "newpack_prof rc=$?"; grep "===" "$out/newpack_prof.txt"
mkdir -p "$top"; tar -czf "$top/diag.tgz" -C /tmp run_diag
