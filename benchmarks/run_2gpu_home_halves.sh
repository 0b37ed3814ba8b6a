#!/usr/bin/env bash
# Issue 39: half of the backward's home step computes while the accumulator comes home
# (commit e71aea2, reverted: benchmarks/results/h100x2_issue39_home_halves_rejected/ says
# why), before and after in one machine session (nvidia-h100-x2). Any before/after pair of
# packages serves: BEFORE_DIR holds one commit's megatron_burst/, this tree the other.
# The benchmark scripts are this tree's; the package is BEFORE's (a copy of an earlier
# commit's megatron_burst/) or this tree's, one after the other:
#   part a: benchmarks/host_time.py at 8K and 32K/GPU (plain causal, eager and in a CUDA
#     graph, against cuDNN on one GPU) and benchmarks/documents.py (whole_docs and
#     pack_zigzag+graph; 8K and 16K/GPU, 32:8 d128 and 16:4 d64, lognormal and uniform
#     packs, a new pack every call);
#   part b, this tree: tests/test_gpu.py and tests/test_gpu_pack_zigzag.py, the timeline of
#     pack_zigzag calls in a CUDA graph at 16K/GPU 32:8 d128 (kernel_profile.py --timeline).
# Everything lands in OUTDIR/<part>.tgz.
# Usage: bash benchmarks/run_2gpu_home_halves.sh a|b OUTDIR [BEFORE_DIR]   (wheels in /tmp/site)
set -uo pipefail
part=${1:?a or b}; top=${2:?output folder}; before=${3:-.before}
out=/tmp/run_$part; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
part_a() {  # the package $which is on PYTHONPATH
  timeout 200 torchrun --nproc_per_node=2 benchmarks/host_time.py --iters 15 \
    --per-gpu 8192,32768 --out "$out/$which/host_time.json" > "$out/$which/host_time_log.txt" 2>&1
  echo "$which host_time rc=$?"
  timeout 200 torchrun --nproc_per_node=2 benchmarks/documents.py --per-gpu 8192,16384 \
    --heads 32:8:128,16:4:64 --mixes lognormal,uniform --cudnn-cases none \
    --layouts whole_docs,pack_zigzag+graph \
    --out "$out/$which/documents.json" > "$out/$which/documents_log.txt" 2>&1
  echo "$which documents rc=$?"
}
if [ "$part" = a ]; then
  each_package "$before" part_a
else
  all_gpu_tests 330
  pack_timeline pack_zigzag+graph
fi
mkdir -p "$top"; tar -czf "$top/$part.tgz" -C /tmp "run_$part"
