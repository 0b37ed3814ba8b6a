#!/usr/bin/env bash
# Hops that carry runs (plan/runs.py) against hops of one span (BEFORE_DIR: the package of
# commit 8d96d08), on the GPUs of the machine: GPUS 2 or 4.
#   1. the GPU tests whose rings move runs (test_gpu.py's NCCL tests: every mask family in
#      bf16 with both backwards, windows and documents, the double ring and Ulysses on 4);
#   2. benchmarks/slice_masks.py --graph over the families runs change (the windows,
#      block-causal documents, the global window, shared question, causal documents), over
#      the machine's links: before, after, before;
#   3. the same with the link slowed to 12.5 GB/s (MEGATRON_BURST_EMULATE, one GPU a node),
#      where the bytes are on the critical path: before, after.
# Each JSON names the package it imported (meta.package) and each rank's bytes (sent_mb).
# PART (default all): tests = step 1 only, masks = steps 2 and 3 only, nvlink = step 2 only,
# so each fits one device call.
# Usage: bash benchmarks/run_gpu_runs.sh OUTDIR BEFORE_DIR GPUS [PART]  (writes OUTDIR/runs<GPUS>.tgz)
set -uo pipefail
top=${1:?output folder}; before=$(cd "${2:?tree before}" && pwd); gpus=${3:?2 or 4}; part=${4:-all}
out="$top/runs$gpus"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
pack() { tar -czf "$top/runs$gpus.tgz" -C "$top" "runs$gpus"; }
FAMILIES=sliding_window,sliding_window_causal,global_sliding_window,block_causal_document,shared_question,causal_document
masks() {  # masks SIDE NAME ARGS...
  local side=$1 name=$2; shift 2
  local pkg=$PWD; [ "${side%2}" = before ] && pkg=$before
  PYTHONPATH=$pkg timeout 200 torchrun --nproc_per_node="$gpus" benchmarks/slice_masks.py \
    "$@" --families "$FAMILIES" --out "$out/$name" > "$out/${name}_log.txt" 2>&1
  echo "$name rc=$?"; grep '^| ' "$out/$name.md" 2>/dev/null | cut -d'|' -f2,9,10,12,13
  grep -o '"package": "[^"]*"' "$out/$name.json"; pack
}
if [ "$part" = all ] || [ "$part" = tests ]; then
PYTHONPATH=$PWD timeout 300 python3 -m pytest tests/test_gpu.py -q -s -p no:cacheprovider \
  -k "nccl" > "$out/gpu_tests.txt" 2>&1
echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | tail -3; pack
fi
[ "$part" = tests ] && exit 0
masks before nvlink_before --graph
masks after nvlink_after --graph
masks before2 nvlink_before2 --graph
[ "$part" = nvlink ] && exit 0
for side in before after; do
  MEGATRON_BURST_EMULATE="gpus_per_node=1,gbps=12.5,latency_us=5" masks "$side" \
    "emulated12.5_$side" --backward ring
done
