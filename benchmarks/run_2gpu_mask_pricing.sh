#!/usr/bin/env bash
# Issues 41/42 (nvidia-h100-x2 or nvidia-h200-x2): 'auto' prices a slice mask's call from its
# own schedule (decide/pack_load.py, PackLoad.of_mask), not as full attention.
# benchmarks/slice_masks.py on every LongCA-bench family with the decisions logged
# (--log-auto: each family's "burst auto (...) decides" line with its prediction, and the
# first-use check's "predicted ..., measured ..." line), each family decided as a fresh run
# would; then the GPU tests of the slice masks and of auto's first use.
# Everything lands in OUTDIR/masks/ and one OUTDIR/masks.tgz.
# Usage: bash benchmarks/run_2gpu_mask_pricing.sh OUTDIR   (wheels installed in /tmp/site)
set -uo pipefail
top=${1:?output folder}; out=/tmp/run_masks; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
export PYTHONPATH=$PWD:/tmp/site
timeout 330 torchrun --nproc_per_node=2 benchmarks/slice_masks.py --log-auto \
  --out "$out/slice_masks" > "$out/slice_masks_log.txt" 2>&1; echo "slice_masks rc=$?"
quiet < "$out/slice_masks_log.txt" | grep "^|" | tail -13
grep -a "burst auto" "$out/slice_masks_log.txt" | grep -v "measured this machine" \
  | sort -u > "$out/auto_lines.txt"; wc -l < "$out/auto_lines.txt"
gpu_tests 150 "slice_masks or measures_this_machine"
mkdir -p "$top"; tar -czf "$top/masks.tgz" -C /tmp run_masks
