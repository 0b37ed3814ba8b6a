#!/usr/bin/env bash
# The attention benchmark as run on nvidia-h200-x4 for benchmarks/results/.
# Usage: bash benchmarks/run_h200x4.sh OUTDIR   (then: python benchmarks/report.py OUTDIR/*.json)
set -uo pipefail
out=${1:?output folder}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
bench() { local n=$1; shift; timeout 420 torchrun --nproc_per_node="$n" benchmarks/attention.py "$@" 2>&1 \
  | grep -v -i "warn\|^\*\*\*\|OMP_NUM" ; }
bench 4 --per-gpu 8192,32768 --heads 32:32,32:8 --masks causal,full,window4096,docs \
  --out "$out/h200x4_attention.json" | grep "^#"
bench 4 --per-gpu 131072 --heads 32:8 --masks window4096 --iters 3 --warmup 1 \
  --out "$out/h200x4_window128k.json" | grep "^#"
bench 2 --per-gpu 8192,32768 --heads 32:32 --masks causal --out "$out/h200x2_attention.json" | grep "^#"
bench 1 --per-gpu 8192,32768 --heads 32:32 --masks causal --out "$out/h200x1_attention.json" | grep "^#"
bench 4 --per-gpu 8192,32768 --profile --out /dev/null > "$out/profile.txt"
