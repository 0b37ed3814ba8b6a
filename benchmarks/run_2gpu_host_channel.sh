#!/usr/bin/env bash
# Issues 41 and 39 (the whole_docs rows), on a 2-GPU kind, one machine session: the ranks'
# agreements over a gloo twin of the NCCL group (MEGATRON_BURST_HOST_CHANNEL=gloo, the
# default; comm.host_channel) against over the group itself (=group: what every agreement did
# before, its read-back waiting for the GPU's queue), alternated so that drift shows:
#   the GPU tests of the twin (tests/test_gpu_host_channel.py) and of replay's teardown
#   (tests/test_gpu_replay.py), whose wrapper moved to comm.teardown;
#   benchmarks/documents.py, whole_docs, 8K/GPU, 16:4 d64 and 32:8 d128, uniform: gloo, group,
#   gloo, group (docs_<round><channel>);
#   benchmarks/agree_phases.py, ranks lined up, 32:8 d128 and 16:4 d64: gloo, group (phases.txt);
#   benchmarks/auto_check.py, 8K/GPU 32:8 documents: gloo, group (auto_<round><channel>).
# Usage: bash benchmarks/run_2gpu_host_channel.sh OUTDIR   (wheels in .whl/)
set -uo pipefail
top=${1:?output folder}; out=/tmp/run_h; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
install_wheels
export PYTHONPATH=$PWD:/tmp/site
timeout 150 python3 -m pytest tests/test_gpu_host_channel.py tests/test_gpu_replay.py -q \
  -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | tail -2
for round in 1 2 3 4; do
  channel=gloo; [ $((round % 2)) = 0 ] && channel=group
  mkdir -p "$out/docs_$round$channel"
  MEGATRON_BURST_HOST_CHANNEL=$channel timeout 100 torchrun --nproc_per_node=2 \
    benchmarks/documents.py --per-gpu 8192 --heads 16:4:64,32:8:128 --mixes uniform \
    --cudnn-cases none --layouts whole_docs --out "$out/docs_$round$channel/documents.json" \
    > "$out/docs_${round}_$channel.txt" 2>&1
  echo "documents round $round ($channel) rc=$?"
  grep "burst whole_docs" "$out/docs_$round$channel/documents.md" | cut -d'|' -f3,6,7,8,10
done
for channel in gloo group; do
  for heads in "32 8 128" "16 4 64"; do
    set -- $heads
    MEGATRON_BURST_HOST_CHANNEL=$channel HQ=$1 HKV=$2 D=$3 timeout 80 torchrun \
      --nproc_per_node=2 benchmarks/agree_phases.py 2>&1 | grep '^{' | sed "s/^/$1:$2:$3 /" \
      | tee -a "$out/phases.txt"
  done
done
round=0
for channel in gloo group; do
  round=$((round + 1))
  MEGATRON_BURST_HOST_CHANNEL=$channel timeout 100 torchrun --nproc_per_node=2 \
    benchmarks/auto_check.py --per-gpu 8192 --heads 32:8 --masks documents --cache /tmp/hcache \
    --out "$out/auto_$round$channel" > "$out/auto_${round}_$channel.txt" 2>&1
  echo "auto_check $round ($channel) rc=$?"; quiet < "$out/auto_${round}_$channel.txt" | grep -E "^#" | tail -2
done
mkdir -p "$top"; tar -czf "$top/h.tgz" -C /tmp run_h
