#!/usr/bin/env bash
# Issue 21 end to end on nvidia-h200-x2: Megatron with and without document masks, model
# FLOPs actually done and MFU (benchmarks/megatron_documents.py). Needs megatron-core 0.19
# (carried as a wheel, installed into /tmp/site by the caller).
# Usage: bash benchmarks/run_documents_e2e_h200x2.sh OUTDIR PART   (small | cp1 | 1b | text)
set -uo pipefail
out=${1:?output folder}
part=${2:?small, cp1, 1b or text}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
quiet() { grep -v -i "warn\|^\*\*\*\|OMP_NUM\|return func"; }
case $part in
  small) timeout 560 python benchmarks/megatron_documents.py --shapes small --iters 8 \
           --timeout 170 --out "$out/megatron_documents_small_h200x2.json" 2>&1 | quiet ;;
  cp1) timeout 200 python benchmarks/megatron_documents.py --shapes small --iters 8 \
         --only CP=1 --timeout 170 --out "$out/megatron_documents_cp1_h200x2.json" 2>&1 | quiet ;;
  1b) timeout 560 python benchmarks/megatron_documents.py --shapes 1b --iters 7 \
        --timeout 260 --out "$out/megatron_documents_1b_h200x2.json" 2>&1 | quiet ;;
  text) python -m megatron_burst.cli data --sample-corpus /tmp/sample >/dev/null &&
        timeout 500 python benchmarks/megatron_documents.py --shapes small --iters 8 \
          --timeout 150 --data /tmp/sample --out "$out/megatron_documents_text_h200x2.json" \
          2>&1 | quiet ;;
esac
