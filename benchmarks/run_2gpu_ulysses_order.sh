#!/usr/bin/env bash
# A Ulysses group in position order, on a 2-GPU machine:
#   1. tests/test_gpu_ulysses.py and tests/test_gpu.py (NCCL all-to-alls, fresh-pack check);
#   2. benchmarks/attention.py's Ulysses and flat-ring rows at 8K and 32K tokens/GPU, causal,
#      32:32 and 32:8 heads, with the package before the change (BEFORE_DIR, rank order) and
#      after it (this tree), in one machine session.
# Usage: bash benchmarks/run_2gpu_ulysses_order.sh OUTDIR BEFORE_DIR   (writes OUTDIR/uo.tgz)
set -uo pipefail
top=${1:?output folder}; before=${2:?package tree before the change}; out="$top/uo"
mkdir -p "$out"
. benchmarks/session_env.sh "$out"
install_wheels
PYTHONPATH=$PWD:/tmp/site timeout 330 python3 -m pytest tests/test_gpu_ulysses.py \
  tests/test_gpu.py -q -s -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | tail -4
timed_rows() {
  timeout 150 torchrun --nproc_per_node=2 benchmarks/attention.py --per-gpu 8192,32768 \
    --heads 32:32,32:8 --masks causal --iters 10 --warmup 3 --methods "usp,ring bwd" \
    --out "$SESSION_OUT/$which/attention.json" > "$SESSION_OUT/$which/attention_log.txt" 2>&1
  echo "attention $which rc=$?"
}
each_package "$before" timed_rows
tar -czf "$top/uo.tgz" -C "$top" uo
