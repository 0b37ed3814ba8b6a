#!/usr/bin/env bash
# Issue 39, on a 2-GPU kind, one machine session: what an eager pack_zigzag call's host
# work outside its replayed passes costs, before (BEFORE_DIR's package) and after (this
# tree's: the launches bound only where a pass runs eagerly, the boundaries check replayed
# from a graph of its own), with MEGATRON_BURST_REPLAY=auto:
#   tests/test_gpu_replay.py and tests/test_gpu_pack_zigzag.py (this tree);
#   benchmarks/documents.py, pack_zigzag, a new pack every call, 8K/GPU, 16:4 d64 uniform
#     and 32:8 d128 lognormal, before and after;
#   Megatron with document masks, eager, this tree (benchmarks/megatron_graphs.py
#     --documents 32, the small model): CP=2 pack_zigzag with replay auto, and CP=1.
# Usage: bash benchmarks/run_2gpu_replay_checks.sh BEFORE_DIR OUTDIR   (wheels in .whl/)
set -uo pipefail
before=${1:?the package before}; top=${2:?output folder}; out=/tmp/run_r; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
install_wheels
export PYTHONPATH=$PWD:/tmp/site MEGATRON_BURST_REPLAY=auto
timeout 240 python3 -m pytest tests/test_gpu_replay.py tests/test_gpu_pack_zigzag.py -q -s \
  -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | grep -E "passed|failed|Error|assert" | tail -6
docs() {
  timeout 150 torchrun --nproc_per_node=2 benchmarks/documents.py --per-gpu 8192 \
    --heads 16:4:64,32:8:128 --mixes uniform,lognormal --cudnn-cases none \
    --layouts pack_zigzag --out "$out/$which/documents.json" > "$out/$which/documents_log.txt" 2>&1
  echo "$which documents rc=$?"; grep "burst pack_zigzag" "$out/$which/documents.md"
}
each_package "$before" docs
megatron_steps 200 150
mkdir -p "$top"; tar -czf "$top/r.tgz" -C /tmp run_r
