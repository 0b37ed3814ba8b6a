#!/usr/bin/env bash
# Issue 39, on a 2-GPU kind: where a pack_zigzag call's GPU time goes at 8K/GPU, 16:4 d64,
# uniform packs, a new pack every call (benchmarks/kernel_profile.py --timeline): the eager
# call with its passes replayed (MEGATRON_BURST_REPLAY=auto), and the same call captured by
# the user (pack_zigzag+graph, replay off: the ceiling).
# Usage: bash benchmarks/run_2gpu_timeline_8k.sh OUTDIR   (wheels in .whl/)
set -uo pipefail
top=${1:?output folder}; out=/tmp/run_t; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
install_wheels
export PYTHONPATH=$PWD:/tmp/site
for mode in auto off; do
  layouts=pack_zigzag; [ $mode = off ] && layouts=pack_zigzag+graph
  MEGATRON_BURST_REPLAY=$mode timeout 120 torchrun --nproc_per_node=2 \
    benchmarks/kernel_profile.py --per-gpu 8192 --heads 16:4:64 --mix uniform \
    --layouts $layouts --timeline --out "$out/$mode" > "$out/${mode}_log.txt" 2>&1
  echo "$mode rc=$?"; head -4 "$out"/$mode/*_timeline_rank0.txt; head -14 "$out/$mode"/*.txt | grep -v timeline | head -14
done
rm -f "$out"/*/*.json.gz  # the traces are large; the tables and timelines stay
mkdir -p "$top"; tar -czf "$top/t.tgz" -C /tmp run_t
