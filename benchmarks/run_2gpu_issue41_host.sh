#!/usr/bin/env bash
# Issue 41 on a 2-GPU machine:
#   1. benchmarks/host_gap.py: auto's host time on new packs against its topology forced
#      (cProfile of both), and Ulysses' CUDA kernels against the flat ring's (part "gap");
#   2. benchmarks/auto_check_three.sh on this tree (the machine's links, then emulated 25 and
#      50 GB/s links, each with a fresh profile cache), every row's host time beside its wall
#      time, in whole turns of rounds (part "auto").
# Usage: bash benchmarks/run_2gpu_issue41_host.sh OUTDIR [gap|auto|all]  (writes OUTDIR/a41h.tgz)
set -uo pipefail
top=${1:?output folder}; part=${2:-all}; out="$top/a41h"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
if [ "$part" != auto ]; then
  PYTHONPATH=$PWD timeout 150 torchrun --nproc_per_node=2 benchmarks/host_gap.py \
    --out "$out/gap" > "$out/host_gap_log.txt" 2>&1
  echo "host_gap rc=$?"; quiet < "$out/host_gap_log.txt" | head -60
fi
[ "$part" != gap ] && PYTHONPATH=$PWD bash benchmarks/auto_check_three.sh "$out"
tar -czf "$top/a41h.tgz" -C "$top" a41h
