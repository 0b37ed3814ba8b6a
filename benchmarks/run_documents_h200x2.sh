#!/usr/bin/env bash
# Issue 21 on nvidia-h200-x2: the GPU checks of the document path, then packed documents as
# training feeds them (a new pack every call against one pack repeated, and the one-GPU
# kernel on the same packs). Usage: bash benchmarks/run_documents_h200x2.sh OUTDIR
set -uo pipefail
out=${1:?output folder}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
quiet() { grep -v -i "warn\|^\*\*\*\|OMP_NUM\|return func"; }
nvidia-smi -L
timeout 240 python -m pytest tests/test_gpu.py -q -x -s -k "fresh or varlen or kernel or nccl" \
  2>&1 | quiet | tail -30 | tee "$out/gpu_tests_documents_h200x2.txt"
timeout 330 torchrun --nproc_per_node=2 benchmarks/documents.py --per-gpu 8192,16384,32768 \
  --heads 32:8:128,16:4:64 --mixes lognormal,uniform,tiny,long \
  --pyprofile 16384:16:lognormal,8192:16:tiny \
  --out "$out/h200x2_documents_fresh.json" 2>&1 | quiet | tee "$out/documents_fresh.log" \
  | grep -v "^ \|^$\|ncalls\|Ordered\|List reduced\|function calls" | cut -c1-400
