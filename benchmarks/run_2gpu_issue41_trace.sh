#!/usr/bin/env bash
# Issue 41 on a 2-GPU machine, the two open questions of results/h100x2_issue41_settled:
#   1. auto's own call against its topology forced, traced: benchmarks/auto_check.py on the
#      machine's links, 8K tokens a GPU, documents cells only, one more turn of rounds
#      under torch.profiler (each rank's trace), then benchmarks/trace_methods.py on each
#      trace against both flat-ring rows;
#   2. where Ulysses' host time on packs grows with tokens: benchmarks/host_kinds.py --ops;
#   3. what a model's layers pay a call when they share a pack: auto_check.py --layers 8
#      (8K, documents), beside the rows of 1 (a new pack every call, what the model prices).
# Usage: bash benchmarks/run_2gpu_issue41_trace.sh OUTDIR   (writes OUTDIR/a41t.tgz)
set -uo pipefail
top=${1:?output folder}; out="$top/a41t"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
PYTHONPATH=$PWD timeout 200 torchrun --nproc_per_node=2 benchmarks/auto_check.py \
  --per-gpu 8192 --masks documents --trace 8192 --out "$out" > "$out/auto_check_log.txt" 2>&1
echo "auto_check rc=$?"; quiet < "$out/auto_check_log.txt" | grep -E "^#|wrote"
for trace in "$out"/trace/*.json; do
  for other in "flat ring 2, ring bwd" "flat ring 2, burst bwd"; do
    python3 benchmarks/trace_methods.py "$trace" --against "$other" \
      > "${trace%.json}_vs_${other//[ ,]/_}.txt" 2>&1
  done
done
head -30 "$out"/trace/*rank0_vs_flat_ring_2__ring_bwd.txt
PYTHONPATH=$PWD timeout 200 torchrun --nproc_per_node=2 benchmarks/host_kinds.py --ops \
  --out "$out" > "$out/host_kinds_log.txt" 2>&1
echo "host_kinds rc=$?"; quiet < "$out/host_kinds_log.txt" | grep "^{" | cut -c1-300
mkdir -p "$out/layers8"
PYTHONPATH=$PWD timeout 200 torchrun --nproc_per_node=2 benchmarks/auto_check.py \
  --per-gpu 8192 --masks documents --layers 8 --out "$out/layers8" \
  > "$out/layers8/auto_check_log.txt" 2>&1
echo "auto_check --layers 8 rc=$?"; quiet < "$out/layers8/auto_check_log.txt" | grep -E "^#|wrote"
tar -czf "$top/a41t.tgz" -C "$top" a41t
