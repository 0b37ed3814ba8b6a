#!/usr/bin/env bash
# Issue 41, on a 2-GPU kind: benchmarks/agree_phases.py with MEGATRON_BURST_AGREE first, off,
# first, off, at 32:8 d128 and 16:4 d64 (one JSON line a rank and run, in OUTDIR/phases.txt);
# then the GPU tests of tests/test_gpu.py and tests/test_gpu_headers.py on this tree.
# Usage: bash benchmarks/run_2gpu_agree_phases.sh OUTDIR   (wheels in .whl/)
set -uo pipefail
top=${1:?output folder}; out=/tmp/run_p; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
install_wheels
export PYTHONPATH=$PWD:/tmp/site
for mode in first off first off; do
  for heads in "32 8 128" "16 4 64"; do
    set -- $heads
    MEGATRON_BURST_AGREE=$mode HQ=$1 HKV=$2 D=$3 timeout 80 torchrun --nproc_per_node=2 \
      benchmarks/agree_phases.py 2>&1 | grep '^{' | sed "s/^/$1:$2:$3 /" | tee -a "$out/phases.txt"
  done
done
PYTHONPATH=$PWD:/tmp/site timeout 280 python3 -m pytest tests/test_gpu.py tests/test_gpu_headers.py \
  -q -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | tail -2
mkdir -p "$top"; cp "$out"/{phases.txt,gpu_tests.txt,device.txt} "$top/"
