#!/usr/bin/env bash
# The second 2-GPU command pair of 2026-11-26 (nvidia-h100-x2 or nvidia-h200-x2):
#   part c (issue 39): GPU tests of the merge and slice masks; benchmarks/documents.py at
#     8K/16K (16:4 d64) and 32K (32:8 d128, uniform and lognormal) tokens per GPU, after
#     (this tree: the merge compiled when a ring call is planned) and before (.before: the
#     package at 5e8498f), one after the other on the same machine;
#   part d (issues 41, 42): benchmarks/auto_check.py on the machine and under emulated 25 and
#     50 GB/s links (the document term, Ulysses across nodes), and benchmarks/slice_masks.py.
# Everything lands in OUTDIR/<part>/ and one OUTDIR/<part>.tgz (the device returns 8 files).
# Usage: bash benchmarks/run_2gpu_nov26_final.sh c|d OUTDIR   (wheels installed in /tmp/site)
set -uo pipefail
part=${1:?c or d}; top=${2:?output folder}; out=/tmp/run_$part; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
if [ "$part" = c ]; then
  gpu_tests 120 "compiles_once or compiles_the_merge or kept_output or slice_masks"
  for side in after before; do
    root=$PWD; [ "$side" = before ] && root=$PWD/.before
    PYTHONPATH=$root:/tmp/site timeout 110 torchrun --nproc_per_node=2 benchmarks/documents.py \
      --per-gpu 8192,16384 --heads 16:4:64 --mixes uniform --iters 10 --cudnn-cases none \
      --out "$out/documents_8k16k_$side.json" 2>&1 | quiet | grep -v "^#" | grep "burst\|1 GPU varlen flash" | tail -8
    PYTHONPATH=$root:/tmp/site timeout 120 torchrun --nproc_per_node=2 benchmarks/documents.py \
      --per-gpu 32768 --heads 32:8:128 --mixes uniform,lognormal --iters 6 --cudnn-cases none \
      --out "$out/documents_32k_$side.json" 2>&1 | quiet | grep -v "^#" | grep "burst\|1 GPU varlen flash" | tail -8
  done
else
  export PYTHONPATH=$PWD:/tmp/site
  bash benchmarks/auto_check_three.sh "$out"
  timeout 200 torchrun --nproc_per_node=2 benchmarks/slice_masks.py --out "$out/slice_masks" \
    > "$out/slice_masks_log.txt" 2>&1; echo "slice_masks rc=$?"
  quiet < "$out/slice_masks_log.txt" | grep "^|" | tail -14
fi
mkdir -p "$top"; tar -czf "$top/$part.tgz" -C /tmp "run_$part"
