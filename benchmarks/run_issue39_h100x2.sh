#!/usr/bin/env bash
# Issue 39 on nvidia-h100-x2 (2x H100): the ring's host time and efficiency where training
# runs (packed documents at 8-16K tokens per GPU), before and after, in one machine session.
# Usage: bash benchmarks/run_issue39_h100x2.sh OUTDIR SIDE PACKAGE_ROOT PART
#   SIDE: before | after (a label); PACKAGE_ROOT: the folder holding that side's
#   megatron_burst/ (the repository root for after, a copy of the earlier commit for before);
#   PART: tests | micro | megatron. megatron-core must be importable (carried wheel in /tmp/site).
set -uo pipefail
out=${1:?output folder}; side=${2:?before or after}; root=${3:?package root}; part=${4:?part}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$root:/tmp/site
# Drop Python's warning lines, not pytest's summary ("14 passed, ... warnings in ...").
quiet() { grep -v -E "Warning:|warnings\.warn|^\*\*\*|OMP_NUM|return func"; }
case $part in
  tests)
    timeout 330 python3 -m pytest tests/test_gpu.py -q -x --durations=8 2>&1 | quiet \
      | tee "$out/gpu_tests_h100x2_$side.txt" | tail -14 ;;
  micro)
    timeout 150 torchrun --nproc_per_node=2 benchmarks/host_time.py --iters 15 \
      --per-gpu 8192,32768 --out "$out/h100x2_host_time_$side.json" 2>&1 | quiet | tail -22
    timeout 200 torchrun --nproc_per_node=2 benchmarks/documents.py --per-gpu 8192,16384 \
      --heads 16:4:64 --mixes uniform --iters 10 --cudnn-cases none \
      --out "$out/h100x2_documents_8k16k_$side.json" 2>&1 | quiet | grep -v "^#" | tail -12
    timeout 200 torchrun --nproc_per_node=2 benchmarks/documents.py --per-gpu 32768 \
      --heads 32:8:128 --mixes uniform,lognormal --iters 8 --cudnn-cases none \
      --out "$out/h100x2_documents_32k_$side.json" 2>&1 | quiet | grep -v "^#" | tail -12 ;;
  megatron)
    timeout 500 python3 benchmarks/megatron_documents.py --shapes small --iters 8 \
      --timeout 110 --peak-tflops 989 --out "$out/megatron_documents_small_h100x2_$side.json" \
      2>&1 | quiet | tail -12 ;;
esac
