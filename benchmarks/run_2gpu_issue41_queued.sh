#!/usr/bin/env bash
# Issue 41 on a 2-GPU machine: links timed as queued hops and the accumulator's trip home
# priced (this tree), against the tree before (BEFORE_DIR: a folder holding megatron_burst/).
#   1. benchmarks/auto_check_three.sh on this tree: the machine's links, then emulated 25 and
#      50 GB/s links, each with a fresh profile cache (first use measured);
#   2. benchmarks/auto_check.py on BEFORE_DIR's package over the machine's links, same machine.
# Each JSON names the package it imported (meta.package).
# Usage: bash benchmarks/run_2gpu_issue41_queued.sh OUTDIR BEFORE_DIR   (writes OUTDIR/a41.tgz)
set -uo pipefail
top=${1:?output folder}; before=$(cd "${2:?tree before}" && pwd)
out="$top/a41"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
pack() { tar -czf "$top/a41.tgz" -C "$top" a41; }
PYTHONPATH=$PWD bash benchmarks/auto_check_three.sh "$out"; pack
PYTHONPATH=$before timeout 150 torchrun --nproc_per_node=2 benchmarks/auto_check.py \
  --out /tmp/b41 > "$out/before_auto_check_log.txt" 2>&1
echo "before rc=$?"; quiet < "$out/before_auto_check_log.txt" | grep -E "^#|wrote" | tail -9
cp /tmp/b41/auto_check*.json "$out/before_auto_check.json" 2>/dev/null
cp /tmp/b41/profile-cache/*.json "$out/before_profile.json" 2>/dev/null; pack
