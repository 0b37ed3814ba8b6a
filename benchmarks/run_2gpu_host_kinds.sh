#!/usr/bin/env bash
# Issue 41 on a 2-GPU machine: benchmarks/host_kinds.py on the machine's links and under
# emulated 25 GB/s links (does a tiny call's host time stand for a real call's?).
# Usage: bash benchmarks/run_2gpu_host_kinds.sh OUTDIR   (writes OUTDIR/hk.tgz)
set -uo pipefail
top=${1:?output folder}; out="$top/hk"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
for emu in "" "gpus_per_node=1,gbps=25,latency_us=5"; do
  MEGATRON_BURST_EMULATE=$emu PYTHONPATH=$PWD timeout 200 torchrun --nproc_per_node=2 \
    benchmarks/host_kinds.py --out "$out" > "$out/host_kinds${emu:+_emulated}_log.txt" 2>&1
  echo "host_kinds ${emu:-machine} rc=$?"; quiet < "$out/host_kinds${emu:+_emulated}_log.txt" | grep "^{" 
done
tar -czf "$top/hk.tgz" -C "$top" hk
