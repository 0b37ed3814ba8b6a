#!/usr/bin/env bash
# Issue 41 again after the document term became the pack's own schedule (2026-11-26, third
# 2-GPU command): benchmarks/auto_check.py on the machine and under emulated 25 and 50 GB/s
# links, each with a fresh profile cache. Output: OUTDIR/e.tgz (the logs and JSONs).
# Usage: bash benchmarks/run_2gpu_nov26_auto.sh OUTDIR   (wheels installed in /tmp/site)
set -uo pipefail
top=${1:?output folder}; out=/tmp/run_e; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/device.txt"
bash benchmarks/auto_check_three.sh "$out"
mkdir -p "$top"; tar -czf "$top/e.tgz" -C /tmp run_e
