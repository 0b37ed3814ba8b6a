#!/usr/bin/env bash
# One 2-GPU machine session (nvidia-h100-x2 or nvidia-h200-x2), issues 39, 41 and 42, in two
# commands (each under the device's 10-minute limit):
#   part a: GPU tests of the merge's compiled variants, kept outputs, issue 40's edges and the
#           slice-mask families; benchmarks/slice_masks.py (issue 42's table, JSON); the 32K
#           new-pack documents row, after (this tree) and before (.prev: the old merge.py);
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
  timeout 150 python3 -m pytest tests/test_gpu.py -q -s -p no:cacheprovider \
    -k "kept_output or compiles_once or edges or slice_masks or one_rank_without" \
    > "$out/gpu_tests.txt" 2>&1; echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | tail -4
  timeout 240 torchrun --nproc_per_node=2 benchmarks/slice_masks.py --out "$out/slice_masks" \
    > "$out/slice_masks_log.txt" 2>&1; echo "slice_masks rc=$?"
  quiet < "$out/slice_masks_log.txt" | tail -24
  for side in after before; do
    root=$PWD; [ "$side" = before ] && root=$PWD/.prev
    PYTHONPATH=$root:/tmp/site timeout 90 torchrun --nproc_per_node=2 benchmarks/documents.py \
      --per-gpu 32768 --heads 32:8:128 --mixes uniform --iters 6 --cudnn-cases none \
      --out "$out/documents_32k_$side.json" 2>&1 | quiet | grep -v "^#" | tail -8
  done
else
  timeout 100 torchrun --nproc_per_node=2 benchmarks/documents.py --per-gpu 32768 \
    --heads 32:8:128 --mixes uniform --iters 6 --cudnn-cases none --pyprofile 32768:32:uniform \
    --out /tmp/documents_32k_profiled.json 2>&1 | quiet | grep -v "^#" | head -60
  for emu in "" "gpus_per_node=1,gbps=25,latency_us=5" "gpus_per_node=1,gbps=50,latency_us=5"; do
    gbps=${emu#*gbps=}; tag=${emu:+_${gbps%%,*}gbps}
    MEGATRON_BURST_EMULATE=$emu timeout 170 torchrun --nproc_per_node=2 \
      benchmarks/auto_check.py --out "/tmp/a41$tag" > "$out/auto_check${tag}_log.txt" 2>&1
    echo "auto_check$tag rc=$?"; quiet < "$out/auto_check${tag}_log.txt" | grep -E "wrote|worst|measured" | tail -3
    cp "/tmp/a41$tag"/auto_check*.json "$out/auto_check${tag}.json" 2>/dev/null
  done
fi
