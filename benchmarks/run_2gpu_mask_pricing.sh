#!/usr/bin/env bash
# Issues 41/42 (nvidia-h100-x2 or nvidia-h200-x2): 'auto' prices a slice mask's call from its
# own schedule (decide/pack_load.py, PackLoad.of_mask), not as full attention.
# benchmarks/slice_masks.py on every LongCA-bench family with the decisions logged
# (--log-auto: each family's "burst auto (...) decides" line with its prediction, and the
# first-use check's "predicted ..., measured ..." line), each family decided as a fresh run
# would; the profile first use measured (to price the calls as full attention, as before);
# benchmarks/auto_check.py at 8K/GPU (the causal and document cells, whose decisions are
# keyed anew); then the GPU tests of the slice masks and of auto's first use.
# Everything lands in OUTDIR/masks/ and one OUTDIR/masks.tgz.
# Usage: [AUTO_RUNS="a b"] [SKIP_TESTS=1] bash benchmarks/run_2gpu_mask_pricing.sh OUTDIR
#   (wheels installed in /tmp/site; AUTO_RUNS names each auto_check run, default one)
set -uo pipefail
top=${1:?output folder}; out=/tmp/run_masks; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
export PYTHONPATH=$PWD:/tmp/site
timeout 330 torchrun --nproc_per_node=2 benchmarks/slice_masks.py --log-auto \
  --out "$out/slice_masks" > "$out/slice_masks_log.txt" 2>&1; echo "slice_masks rc=$?"
quiet < "$out/slice_masks_log.txt" | grep "^|" | tail -13
grep -a "burst auto" "$out/slice_masks_log.txt" | grep -v "measured this machine" \
  | sort -u > "$out/auto_lines.txt"; wc -l < "$out/auto_lines.txt"
mkdir -p "$out/profiles"; cp ~/.cache/megatron-burst/profiles/*.json "$out/profiles/" 2>/dev/null
for run in ${AUTO_RUNS:-a}; do
  timeout 120 torchrun --nproc_per_node=2 benchmarks/auto_check.py --per-gpu 8192 \
    --out "$out/auto_check_8k_$run" > "$out/auto_check_${run}_log.txt" 2>&1
  echo "auto_check $run rc=$?"; grep -a "auto/best\|^wrote" "$out/auto_check_${run}_log.txt"
done
[ "${SKIP_TESTS:-0}" = 1 ] || gpu_tests 150 "slice_masks or measures_this_machine"
mkdir -p "$top"; tar -czf "$top/masks.tgz" -C /tmp run_masks
