#!/usr/bin/env bash
# Issue 25 on nvidia-h200-x2: CUDA-graph replay checks, the host time per call (eager and
# graphed), 8K/GPU efficiency, and Megatron's CUDA graphs end to end.
# Usage: bash benchmarks/run_host_h200x2.sh OUTDIR   (megatron-core on PYTHONPATH)
set -uo pipefail
out=${1:?output folder}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
quiet() { grep -v -i "warn\|^\*\*\*\|OMP_NUM\|return func"; }
timeout 200 python -m pytest tests/test_gpu.py -q -x -s -k "graph or fresh" 2>&1 | quiet \
  | tail -30 | tee "$out/gpu_tests_host_h200x2.txt" | tail -4
timeout 200 torchrun --nproc_per_node=2 benchmarks/host_time.py \
  --out "$out/h200x2_host_time.json" 2>&1 | quiet | tail -22
timeout 330 python benchmarks/megatron_graphs.py --shape small --iters 10 --timeout 150 \
  --out "$out/megatron_graphs_small_h200x2.json" 2>&1 | quiet | tail -8
