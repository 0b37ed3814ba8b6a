#!/usr/bin/env bash
# `tune` and `auto` on nvidia-h200-x4, then the final documents benchmark and GPU checks.
# Usage: bash benchmarks/run_auto_h200x4.sh OUTDIR
set -uo pipefail
out=${1:?output folder}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
quiet() { grep -v -i "warn\|^\*\*\*\|OMP_NUM\|return func"; }
timeout 150 torchrun --nproc_per_node=4 -m megatron_burst.tools.tune --out "$out/tune_h200x4.json" \
  2>&1 | quiet | tail -2 | cut -c1-400
export MEGATRON_BURST_PROFILE=$out/tune_h200x4.json
timeout 300 torchrun --nproc_per_node=4 benchmarks/attention.py --per-gpu 8192,32768 \
  --heads 32:32,32:8 --masks causal,full --methods "burst,ulysses a2a" \
  --out "$out/h200x4_auto.json" 2>&1 | quiet | grep "^#"
methods="burst whole_docs,burst per-document,all-gather KV + varlen,ulysses + varlen,burst (auto bwd)"
timeout 200 torchrun --nproc_per_node=4 benchmarks/attention.py --per-gpu 8192,32768 \
  --heads 32:32,32:8 --masks docs-lognormal,docs,causal --methods "$methods" \
  --out "$out/h200x4_documents.json" 2>&1 | quiet | grep "^#"
timeout 150 python -m pytest tests/test_gpu.py -q -x -k "varlen or window_documents or kernel" \
  2>&1 | tail -3
