#!/usr/bin/env bash
# On a 4-GPU kind: windows' rounds each way round the ring (attention/ring_rounds.py).
#   tests: the rounds in bf16 over NCCL (tests/test_gpu_rounds.py), and test_gpu.py's 4-GPU
#          window, double-ring and slice-mask tests (the ring's plans changed at 4+ ranks);
#   bench: BEFORE_DIR's package (the one-way ring) against this tree's, then BEFORE_DIR's
#          again: benchmarks/slice_masks.py --graph --chained over LongCA-bench's two windows
#          on the contiguous and area layouts, and a model's causal window (1024, 0) on
#          zigzag (benchmarks/attention.py --masks window1024).
# Usage: bash benchmarks/run_4gpu_rounds.sh OUTDIR tests|bench [BEFORE_DIR]
#        (writes OUTDIR/rounds4_tests.tgz or OUTDIR/rounds4_bench.tgz)
set -uo pipefail
top=${1:?output folder}; what=${2:?tests or bench}
out="$top/rounds4_$what"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
pack() { tar -czf "$top/rounds4_$what.tgz" -C "$top" "rounds4_$what"; }
gpu_gate || { pack; exit 3; }
if [ "$what" = tests ]; then
  PYTHONPATH=$PWD timeout 420 python3 -m pytest tests/test_gpu_rounds.py tests/test_gpu.py -q -s \
    -p no:cacheprovider -k "rounds or double_ring or slice_masks" > "$out/gpu_tests.txt" 2>&1
  echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | grep -E "err_|passed|failed|Error" | tail -40
  pack; exit 0
fi
before=$(cd "${3:?tree before}" && pwd)
for side in before after before2; do
  pkg=$PWD; [ "$side" != after ] && pkg=$before
  for layout in contiguous area; do
    PYTHONPATH=$pkg timeout 100 torchrun --nproc_per_node=4 benchmarks/slice_masks.py --graph \
      --chained --no-torch-flex-cp --families sliding_window,sliding_window_causal \
      --layout "$layout" --out "$out/${layout}_$side" > "$out/${layout}_${side}_log.txt" 2>&1
    echo "$side $layout rc=$?"; grep '^| ' "$out/${layout}_$side.md" 2>/dev/null | head -4
  done
  PYTHONPATH=$pkg timeout 90 torchrun --nproc_per_node=4 benchmarks/attention.py --per-gpu 8192 \
    --heads 64:8 --masks window1024 --methods burst --out "$out/window1024_$side.json" \
    > "$out/window1024_${side}_log.txt" 2>&1
  echo "$side window1024 rc=$?"; grep -E "burst" "$out/window1024_${side}_log.txt" | tail -6
  pack
done
