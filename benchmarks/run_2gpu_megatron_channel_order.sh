#!/usr/bin/env bash
# Issue 41's agreement channel in Megatron, the step times again, in turn: the package's entry
# point, document masks (whole_docs, eager; benchmarks/megatron_graphs.py's small model), CP=2,
# with MEGATRON_BURST_HOST_CHANNEL=group, gloo, group, gloo (OUTDIR/cp2_<round>_<channel>.*).
# Usage: bash benchmarks/run_2gpu_megatron_channel_order.sh OUTDIR   (wheels in .whl/)
set -uo pipefail
top=${1:?output folder}; out=/tmp/run_q; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
install_wheels
export PYTHONPATH=$PWD:/tmp/site
round=0
for channel in group gloo group gloo; do
  round=$((round + 1))
  MEGATRON_BURST_HOST_CHANNEL=$channel timeout 80 python3 benchmarks/megatron_graphs.py \
    --shape small --documents 32 --iters 8 --timeout 70 --only "CP=2, documents whole_docs, eager" \
    --out "$out/cp2_${round}_$channel.json" > "$out/cp2_${round}_$channel.txt" 2>&1
  echo "round $round $channel rc=$?"; tail -1 "$out/cp2_${round}_$channel.md" 2>/dev/null
done
mkdir -p "$top"; cp "$out"/*.json "$out"/*.md "$out/device.txt" "$top/" 2>/dev/null
