#!/usr/bin/env bash
# One 2-GPU machine session (nvidia-h100-x2 or nvidia-h200-x2), issues 39, 41 and 42, in two
# commands (each under the device's 10-minute limit):
#   part a: benchmarks/run_2gpu_issues_40_42.sh (GPU tests of the merge, kept outputs, issue
#           40's edges and the slice masks; slice_masks.py; the 32K new-pack documents row,
#           after and before: .prev, the old merge.py);
#   part b: benchmarks/auto_check.py on the machine and under emulated 25 and 50 GB/s links
#           (issue 41), each with a fresh profile cache (first use measured); and the 32K
#           new-pack documents row again under cProfile (rank 0; issue 39).
# Usage: bash benchmarks/run_2gpu_nov26.sh a|b OUTDIR   (wheels installed in /tmp/site)
set -uo pipefail
part=${1:?a or b}; out=${2:?output folder}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site
quiet() { grep -v -E "Warning:|warnings\.warn|^\*\*\*|OMP_NUM|return func|^W[0-9]"; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/device.txt"
git log --oneline -1 > "$out/commit.txt" 2>/dev/null || true
if [ "$part" = a ]; then
  bash benchmarks/run_2gpu_issues_40_42.sh "$out"  # the same runs, the same session plan
else
  timeout 100 torchrun --nproc_per_node=2 benchmarks/documents.py --per-gpu 32768 \
    --heads 32:8:128 --mixes uniform --iters 6 --cudnn-cases none --pyprofile 32768:32:uniform \
    --out /tmp/documents_32k_profiled.json 2>&1 | quiet | grep -v "^#" | head -60
  bash benchmarks/auto_check_three.sh "$out"
fi
