#!/usr/bin/env bash
# One 2-GPU machine session (nvidia-h100-x2 or nvidia-h200-x2) for issues 39, 40 and 42:
#   1. GPU tests of the new code: kept outputs (remat hash), the merge's compiled variants,
#      issue 40's bf16 edges, the CP=1 native op, and the slice-mask families in bf16;
#   2. benchmarks/slice_masks.py (issue 42's table);
#   3. issue 39's 32K new-pack row with the merge not specialised on lse alignment (after)
#      and with it specialised (before: .prev/, a copy of the package with the old merge.py).
# Usage: bash benchmarks/run_2gpu_issues_40_42.sh OUTDIR   (wheels installed in /tmp/site)
set -uo pipefail
out=${1:?output folder}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
quiet() { grep -v -E "Warning:|warnings\.warn|^\*\*\*|OMP_NUM|return func"; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/device.txt"
PYTHONPATH=$PWD:/tmp/site timeout 110 python3 -m pytest tests/test_gpu.py -q -s \
  -p no:cacheprovider -k "kept_output or compiles_once or edges or slice_masks or one_rank_without" \
  > "$out/gpu_tests.txt" 2>&1; echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | tail -4
PYTHONPATH=$PWD:/tmp/site timeout 220 torchrun --nproc_per_node=2 benchmarks/slice_masks.py \
  --out "$out/slice_masks" 2>&1 | quiet | tail -20
for side in after before; do
  root=$PWD; [ "$side" = before ] && root=$PWD/.prev
  PYTHONPATH=$root:/tmp/site timeout 100 torchrun --nproc_per_node=2 benchmarks/documents.py \
    --per-gpu 32768 --heads 32:8:128 --mixes uniform --iters 6 --cudnn-cases none \
    --out "$out/documents_32k_$side.json" 2>&1 | quiet | grep -v "^#" | tail -8
done
