#!/usr/bin/env bash
# Packed documents on nvidia-h200-x4: the GPU checks of the varlen path, then the
# documents family of benchmarks/attention.py against the same tokens as one causal
# sequence. Usage: bash benchmarks/run_docs_h200x4.sh OUTDIR
set -uo pipefail
out=${1:?output folder}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
timeout 240 python -m pytest tests/test_gpu.py -q -x -s -k "varlen or window_documents" \
  2>&1 | tail -25 | tee "$out/gpu_tests.txt"
methods="burst whole_docs,burst per-document,all-gather KV + varlen,ulysses + varlen,burst (auto bwd)"
timeout 420 torchrun --nproc_per_node=4 benchmarks/attention.py --per-gpu 8192,32768 \
  --heads 32:32,32:8 --masks docs-lognormal,docs,causal --methods "$methods" \
  --out "$out/h200x4_documents.json" 2>&1 | grep -v -i "warn\|^\*\*\*\|OMP_NUM" \
  | tee "$out/documents.log" | grep "^#\|error\|Error"
