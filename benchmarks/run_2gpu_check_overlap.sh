#!/usr/bin/env bash
# Issues 41 and 39 (the whole_docs rows), on a 2-GPU kind, one machine session: a new
# signature's check posted once the call is signed and read after its plan (this tree)
# against read where it is posted (BEFORE_DIR: the tree before that change), each over the
# gloo twin (MEGATRON_BURST_HOST_CHANNEL=gloo) and over the NCCL group (=group); BEFORE with
# group is how every agreement went before the twin. Two rounds of the four, in turn:
#   benchmarks/documents.py, whole_docs, 8K/GPU, 16:4 d64 and 32:8 d128, uniform
#   (OUTDIR/<round>_<tree>_<channel>/documents.{json,md});
# then benchmarks/agree_phases.py, ranks lined up, each of the four (OUTDIR/phases.txt).
# Usage: bash benchmarks/run_2gpu_check_overlap.sh OUTDIR BEFORE_DIR   (wheels in .whl/)
set -uo pipefail
top=${1:?output folder}; before=$(cd "${2:?tree before}" && pwd); out=/tmp/run_o; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
install_wheels
for round in 1 2; do
  for tree in before after; do
    pkg=$PWD; [ "$tree" = before ] && pkg=$before
    for channel in gloo group; do
      run="$out/${round}_${tree}_$channel"; mkdir -p "$run"
      PYTHONPATH=$pkg:/tmp/site MEGATRON_BURST_HOST_CHANNEL=$channel timeout 90 torchrun \
        --nproc_per_node=2 benchmarks/documents.py --per-gpu 8192 --heads 16:4:64,32:8:128 \
        --mixes uniform --cudnn-cases none --layouts whole_docs --out "$run/documents.json" \
        > "$run/log.txt" 2>&1
      echo "documents $round $tree $channel rc=$?"
      grep "burst whole_docs, new" "$run/documents.md" | cut -d'|' -f3,6,7,10
    done
  done
done
for tree in before after; do
  pkg=$PWD; [ "$tree" = before ] && pkg=$before
  for channel in gloo group; do
    for heads in "32 8 128" "16 4 64"; do
      set -- $heads
      PYTHONPATH=$pkg:/tmp/site MEGATRON_BURST_HOST_CHANNEL=$channel HQ=$1 HKV=$2 D=$3 \
        timeout 60 torchrun --nproc_per_node=2 benchmarks/agree_phases.py 2>&1 | grep '^{' \
        | sed "s/^/$tree $1:$2:$3 /" | tee -a "$out/phases.txt"
    done
  done
done
mkdir -p "$top"; tar -czf "$top/o.tgz" -C /tmp run_o
