#!/usr/bin/env bash
# Issue 39: eager calls whose ring passes replay from CUDA graphs (``attention.replay``),
# against the same calls run eagerly, in one machine session (nvidia-h100-x2); the package is
# this tree's, the variable MEGATRON_BURST_REPLAY says which (off, then auto: the default).
#   part a: tests/test_gpu_replay.py, tests/test_gpu_pack_zigzag.py and tests/test_gpu.py's
#     graph, NCCL and wire tests; benchmarks/host_time.py at 8K/GPU (a call's host time on
#     tiny tensors; plain causal at 8K/GPU against cuDNN on one GPU, eager and captured);
#   part b: benchmarks/documents.py, pack_zigzag eager and in a graph, a new pack every call,
#     8K and 16K/GPU, 32:8 d128 and 16:4 d64, uniform and lognormal packs.
# Everything lands in OUTDIR/<part>.tgz.
# Usage: bash benchmarks/run_2gpu_replay.sh a|b OUTDIR   (wheels in /tmp/site)
set -uo pipefail
part=${1:?a or b}; top=${2:?output folder}
out=/tmp/run_$part; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
export PYTHONPATH=$PWD:/tmp/site
if [ "$part" = a ]; then
  timeout ${TEST_S:-240} python3 -m pytest tests/test_gpu_replay.py tests/test_gpu_pack_zigzag.py \
    tests/test_gpu.py -k "replay or pack_zigzag or graph or nccl or wire" -q -s \
    -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
  echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | grep -E "passed|failed|Error|assert" | tail -8
  for mode in off auto; do
    mkdir -p "$out/$mode"
    MEGATRON_BURST_REPLAY=$mode timeout 150 torchrun --nproc_per_node=2 benchmarks/host_time.py \
      --iters 15 --per-gpu 8192 --out "$out/$mode/host_time.json" \
      > "$out/$mode/host_time_log.txt" 2>&1
    echo "$mode host_time rc=$?"
  done
else
  for mode in off auto; do
    mkdir -p "$out/$mode"
    MEGATRON_BURST_REPLAY=$mode timeout 250 torchrun --nproc_per_node=2 benchmarks/documents.py \
      --per-gpu 8192,16384 --heads 32:8:128,16:4:64 --mixes lognormal,uniform \
      --cudnn-cases none --layouts pack_zigzag,pack_zigzag+graph \
      --out "$out/$mode/documents.json" > "$out/$mode/documents_log.txt" 2>&1
    echo "$mode documents rc=$?"
  done
fi
mkdir -p "$top"; tar -czf "$top/$part.tgz" -C /tmp "run_$part"
