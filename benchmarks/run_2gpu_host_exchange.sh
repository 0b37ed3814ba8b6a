#!/usr/bin/env bash
# Issue 41, on a 2-GPU kind: one agreement's exchange over the NCCL group against over its
# gloo twin, alternated in one process, the GPU idle and busy (benchmarks/host_exchange.py,
# OUTDIR/host_exchange.{json,txt}); then the GPU tests over NCCL on this tree
# (tests/test_gpu.py, test_gpu_headers.py, test_gpu_pack_zigzag.py, test_gpu_ulysses.py,
# test_gpu_host_channel.py: every agreement now goes over the twin), log OUTDIR/gpu_tests.txt.
# Usage: bash benchmarks/run_2gpu_host_exchange.sh OUTDIR   (wheels in .whl/)
set -uo pipefail
top=${1:?output folder}; out=/tmp/run_x; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
install_wheels
export PYTHONPATH=$PWD:/tmp/site
timeout 60 torchrun --nproc_per_node=2 benchmarks/host_exchange.py --out "$out/host_exchange.json" \
  2>&1 | quiet | tee "$out/host_exchange.txt" | grep "^|"
timeout 440 python3 -m pytest tests/test_gpu.py tests/test_gpu_headers.py \
  tests/test_gpu_pack_zigzag.py tests/test_gpu_ulysses.py tests/test_gpu_host_channel.py -q \
  -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | tail -4
mkdir -p "$top"; cp "$out"/{host_exchange.json,host_exchange.txt,gpu_tests.txt,device.txt} "$top/"
