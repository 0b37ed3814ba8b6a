#!/usr/bin/env bash
# Issue 42, window families (nvidia-h100-x2 or nvidia-h200-x2): the forward of large band
# blocks through FlexAttention (kernels/flex.py). benchmarks/slice_masks.py --graph on the
# three window families, after (this tree) and before (.before: the package without it), one
# after the other on the same machine; then the GPU tests of FlexAttention's bands and of
# the slice masks, graphs and kernels it touches. Everything lands in OUTDIR/flex/ and one
# OUTDIR/flex.tgz.
# Usage: [SKIP_TESTS=1] bash benchmarks/run_2gpu_flex_bands.sh OUTDIR   (wheels in /tmp/site)
set -uo pipefail
top=${1:?output folder}; out=/tmp/run_flex; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
families=sliding_window,sliding_window_causal,global_sliding_window
for side in after before; do
  date +"%T $side"
  root=$PWD; [ "$side" = before ] && root=$PWD/.before
  PYTHONPATH=$root:/tmp/site timeout 270 torchrun --nproc_per_node=2 benchmarks/slice_masks.py \
    --graph --families "$families" --out "$out/slice_masks_graph_$side" \
    > "$out/slice_masks_graph_${side}_log.txt" 2>&1; echo "$side rc=$?"
  quiet < "$out/slice_masks_graph_${side}_log.txt" | grep "^|" | tail -4
  grep -c "recompile" "$out/slice_masks_graph_${side}_log.txt"
done
[ "${SKIP_TESTS:-0}" = 1 ] || {
PYTHONPATH=$PWD:/tmp/site timeout 200 python3 -m pytest tests/test_gpu_flex.py tests/test_gpu.py \
  -q -s -p no:cacheprovider -k "flex or slice_masks or graph_replay or forced_kernel or without_lse" \
  > "$out/gpu_tests.txt" 2>&1
echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | tail -4; }
mkdir -p "$top"; tar -czf "$top/flex.tgz" -C /tmp run_flex
