#!/usr/bin/env bash
# Issue 41 again after the document term became the pack's own schedule (2026-11-26, third
# 2-GPU command): benchmarks/auto_check.py on the machine and under emulated 25 and 50 GB/s
# links, each with a fresh profile cache. Output: OUTDIR/e.tgz (the logs and JSONs).
# Usage: bash benchmarks/run_2gpu_nov26_auto.sh OUTDIR   (wheels installed in /tmp/site)
set -uo pipefail
top=${1:?output folder}; out=/tmp/run_e; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site
quiet() { grep -v -E "Warning:|warnings\.warn|^\*\*\*|OMP_NUM|return func|^W[0-9]|Guessing device"; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/device.txt"
for emu in "" "gpus_per_node=1,gbps=25,latency_us=5" "gpus_per_node=1,gbps=50,latency_us=5"; do
  tag=${emu:+_$(echo "$emu" | sed 's/.*gbps=\([0-9]*\).*/\1gbps/')}
  MEGATRON_BURST_EMULATE=$emu timeout 150 torchrun --nproc_per_node=2 \
    benchmarks/auto_check.py --out "/tmp/a41$tag" > "$out/auto_check${tag}_log.txt" 2>&1
  echo "auto_check$tag rc=$?"
  quiet < "$out/auto_check${tag}_log.txt" | grep -E "^#|wrote" | tail -9
  cp /tmp/a41$tag/auto_check*.json "$out/auto_check${tag}.json" 2>/dev/null
done
mkdir -p "$top"; tar -czf "$top/e.tgz" -C /tmp run_e
