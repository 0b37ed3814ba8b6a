#!/usr/bin/env bash
# Issue 41 (and 39's whole_docs rows), on a 2-GPU kind, one machine session: what the argument
# check's read-back costs a whole_docs call on a new pack (every new pack is a new signature,
# checked by an all-gather whose result the host reads, so the host waits for the GPU's queue
# there). MEGATRON_BURST_AGREE=first (the default) against off, first, off:
#   benchmarks/auto_check.py, 8K/GPU, 32:8, documents (the cells where auto/best was 1.06-1.11);
#   benchmarks/documents.py, whole_docs, 8K/GPU, 16:4 d64 and 32:8 d128, uniform;
# and the Megatron loss checks' cost through both ways in (--no-check-for-nan-in-loss-and-grad).
# Usage: bash benchmarks/run_2gpu_agree_sync.sh OUTDIR MEGATRON_LM_TARBALL (wheels in .whl/)
set -uo pipefail
top=${1:?output folder}; tarball=${2:?Megatron-LM tarball}; out=/tmp/run_a; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
install_wheels
export PYTHONPATH=$PWD:/tmp/site
for round in 1 2 3 4; do
  mode=first; [ $((round % 2)) = 0 ] && mode=off
  MEGATRON_BURST_AGREE=$mode timeout 100 torchrun --nproc_per_node=2 benchmarks/auto_check.py \
    --per-gpu 8192 --heads 32:8 --masks documents --cache /tmp/a41cache \
    --out "$out/auto_$round$mode" > "$out/auto_${round}_$mode.txt" 2>&1
  echo "auto_check round $round ($mode) rc=$?"; quiet < "$out/auto_${round}_$mode.txt" | grep -E "^#" | tail -2
  mkdir -p "$out/docs_$round$mode"
  MEGATRON_BURST_AGREE=$mode timeout 100 torchrun --nproc_per_node=2 benchmarks/documents.py \
    --per-gpu 8192 --heads 16:4:64,32:8:128 --mixes uniform --cudnn-cases none \
    --layouts whole_docs --out "$out/docs_$round$mode/documents.json" \
    > "$out/docs_${round}_$mode.txt" 2>&1
  echo "documents round $round ($mode) rc=$?"; grep "burst whole_docs" "$out/docs_$round$mode/documents.md"
done
lm=/tmp/Megatron-LM; megatron_lm_checkout "$tarball"
MEGATRON_BURST_REPLAY=auto timeout 170 python3 benchmarks/megatron_upstream.py \
  --megatron-lm "$lm" --gpus 2 --iters 12 --timeout 80 --only "documents pack_zigzag, eager" \
  --extra="--no-check-for-nan-in-loss-and-grad" --out "$out/upstream_zigzag_nocheck.json" \
  > "$out/upstream_zigzag_nocheck.txt" 2>&1
echo "upstream nocheck rc=$?"; tail -2 "$out/upstream_zigzag_nocheck.md" 2>/dev/null
mkdir -p "$top"; tar -czf "$top/a.tgz" -C /tmp run_a
