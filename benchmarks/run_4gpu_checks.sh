#!/usr/bin/env bash
# On a 4-GPU kind: the GPU tests whose ring has 4 members (test_gpu.py's NCCL tests take every
# GPU: the double ring 2x2, windows and documents, Ulysses 2 x ring 2, the mask families, the
# edges), FlexAttention's and pack_zigzag's tests, then benchmarks/slice_masks.py over the
# window families on 4 GPUs (each rank's bytes: on 4 ranks a hop may carry both ends of a
# shard, benchmarks/NOTES.md eighth session).
# Usage: bash benchmarks/run_4gpu_checks.sh OUTDIR     (writes OUTDIR/checks4.tgz)
set -uo pipefail
top=${1:?output folder}
if [ "${2:-}" = capture ]; then
  out="$top/capture4"; mkdir -p "$out"
  . benchmarks/session_env.sh "$out"
  PYTHONPATH=$PWD timeout 150 python3 -m pytest tests/test_gpu.py -q -s -p no:cacheprovider \
    -k "graph_replay or compiles_the_merge" > "$out/gpu_tests_4gpu.txt" 2>&1
  echo "tests rc=$?"; quiet < "$out/gpu_tests_4gpu.txt" | tail -3
  PYTHONPATH=$PWD timeout 150 torchrun --nproc_per_node=4 benchmarks/capture_modes.py \
    --out "$out/capture_modes.json" > "$out/capture_modes_log.txt" 2>&1
  echo "capture_modes rc=$?"; grep -E "^(global|thread_local) " "$out/capture_modes_log.txt"
  tar -czf "$top/capture4.tgz" -C "$top" capture4
  exit 0
fi
out="$top/checks4"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
pack() { tar -czf "$top/checks4.tgz" -C "$top" checks4; }
PYTHONPATH=$PWD timeout 420 python3 -m pytest tests/test_gpu.py tests/test_gpu_flex.py \
  tests/test_gpu_pack_zigzag.py -q -s -p no:cacheprovider -k "nccl or flex or pack" \
  > "$out/gpu_tests_4gpu.txt" 2>&1
echo "tests rc=$?"; quiet < "$out/gpu_tests_4gpu.txt" | tail -3; pack
PYTHONPATH=$PWD timeout 150 torchrun --nproc_per_node=4 benchmarks/slice_masks.py --graph \
  --families sliding_window,sliding_window_causal,global_sliding_window,block_causal_document,causal_document \
  --out "$out/windows_4gpu" > "$out/windows_4gpu_log.txt" 2>&1
echo "slice_masks rc=$?"; grep '^| ' "$out/windows_4gpu.md" 2>/dev/null | cut -d'|' -f2,5,9,10,12,13
pack
# Usage: bash benchmarks/run_4gpu_checks.sh OUTDIR capture   (writes OUTDIR/capture4.tgz):
# the two tests the first run failed, then benchmarks/capture_modes.py (which captures fail,
# in which capture error mode).
