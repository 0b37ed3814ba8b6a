#!/usr/bin/env bash
# Issue 42, on a 2-GPU kind: hops that carry the span of rows their receivers use (this tree)
# against hops that carried the sender's leading rows up to the last one used (BEFORE_DIR).
#   part 1: the GPU tests on this tree (test_gpu, test_gpu_replay, test_gpu_pack_zigzag), then
#           benchmarks/slice_masks.py --graph on six mask families over NVLink, before then after;
#   part 2: the GPU tests part 1 could not finish in its time (the wire's, the slice masks',
#           the double ring's, the packs', the Megatron layer's: megatron-core from .whl/); the window families with the link slowed
#           (MEGATRON_BURST_EMULATE: one GPU a node, 25 GB/s, 5 us; --backward ring and
#           burst), before then after; then the window families over NVLink again, captured,
#           after then before (part 1 ran before then after).
#   part 3: the window families' bytes from every rank (parts 1 and 2 counted rank 0's), with
#           the link slowed to 12.5 and 25 GB/s (ring before then after, burst after then
#           before), then over NVLink, captured, before then after.
# Writes OUTDIR/part<PART>.tgz (OUTDIR/part<PART>/...: the device's name in device.txt).
#   part 4: the comparison parts 1-3 meant to make (they timed this tree on both sides:
#           slice_masks.py put the repo's package before $PYTHONPATH's): six families over
#           NVLink, captured, before then after; the window families at 12.5 GB/s, ring
#           before then after, burst after then before.
#   part 5: BEFORE_DIR is this tree with the FlexAttention band forward of commit c97362c
#           (reverted in 2aa79fa after a run that timed one tree twice): the three window
#           families, captured, with FlexAttention's one-GPU bar: this tree, Flex, this tree.
# Usage: bash benchmarks/run_2gpu_row_spans.sh OUTDIR BEFORE_DIR PART   (PART: 1 to 5)
set -uo pipefail
top=${1:?output folder}; before=$(cd "${2:?tree before}" && pwd); part=${3:?part}
out="$top/part$part"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
FAMILIES=sliding_window,sliding_window_causal,global_sliding_window,block_causal_document,causal_document,shared_question
WINDOWS=sliding_window,sliding_window_causal,global_sliding_window,block_causal_document
THREE=sliding_window,sliding_window_causal,global_sliding_window
masks() {  # masks TREE NAME ARGS...: slice_masks.py on TREE's package, OUT/NAME.{json,md}
  local tree=$1 name=$2; shift 2
  local pkg=$PWD; [ "$tree" = before ] && pkg=$before
  PYTHONPATH=$pkg timeout 200 torchrun --nproc_per_node=2 benchmarks/slice_masks.py "$@" \
    --out "$out/$name" > "$out/${name}_log.txt" 2>&1
  echo "$name rc=$?"; grep '^| ' "$out/$name.md" 2>/dev/null | cut -d'|' -f2,5,9,10,12,13
  grep -o '"package": "[^"]*"' "$out/$name.json"
}
if [ "$part" = 1 ]; then
  PYTHONPATH=$PWD timeout 170 python3 -m pytest tests/test_gpu.py tests/test_gpu_replay.py \
    tests/test_gpu_pack_zigzag.py -q -s -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
  echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | tail -3
  masks before nvlink_before --graph --no-flex --families "$FAMILIES"
  masks after nvlink_after --graph --families "$FAMILIES"
elif [ "$part" = 2 ]; then
  install_wheels  # megatron-core for the Megatron layer's test
  PYTHONPATH=$PWD:/tmp/site timeout 200 python3 -m pytest tests/test_gpu.py \
    tests/test_gpu_pack_zigzag.py -q -s -p no:cacheprovider \
    -k "wire or slice_masks or double_ring or fresh_document or pack or megatron_layer" \
    > "$out/gpu_tests.txt" 2>&1
  echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | tail -3
  for backward in ring burst; do
    for tree in before after; do
      MEGATRON_BURST_EMULATE="gpus_per_node=1,gbps=25,latency_us=5" masks "$tree" \
        "emulated25_${backward}_$tree" --no-flex --backward "$backward" --families "$WINDOWS"
    done
  done
  masks after nvlink2_after --graph --no-flex --families "$WINDOWS"
  masks before nvlink2_before --graph --no-flex --families "$WINDOWS"
elif [ "$part" = 3 ]; then  # the busiest rank's bytes (part 2 counted rank 0's), a slower link
  for gbps in 12.5 25; do
    for backward in ring burst; do
      order="before after"; [ "$backward" = burst ] && order="after before"
      for tree in $order; do
        MEGATRON_BURST_EMULATE="gpus_per_node=1,gbps=$gbps,latency_us=5" masks "$tree" \
          "emulated${gbps}_${backward}_$tree" --no-flex --backward "$backward" \
          --families "$WINDOWS"
      done
    done
  done
  masks before nvlink3_before --graph --no-flex --families "$WINDOWS"
  masks after nvlink3_after --graph --no-flex --families "$WINDOWS"
elif [ "$part" = 5 ]; then  # FlexAttention for the bands (c97362c) on this tree, measured
  # at last (its first run timed one tree twice); BEFORE_DIR: this tree with c97362c's kernel
  masks after flex_off_1 --graph --families "$THREE"
  masks before flex_on --graph --families "$THREE"
  masks after flex_off_2 --graph --families "$THREE"
else  # part 4: parts 1-3 ran this tree's package on both sides (slice_masks.py put the repo
  # first on sys.path); it now puts it after $PYTHONPATH's and records which it ran
  masks before nvlink_before --graph --no-flex --families "$FAMILIES"
  masks after nvlink_after --graph --no-flex --families "$FAMILIES"
  for backward in ring burst; do
    order="before after"; [ "$backward" = burst ] && order="after before"
    for tree in $order; do
      MEGATRON_BURST_EMULATE="gpus_per_node=1,gbps=12.5,latency_us=5" masks "$tree" \
        "emulated12.5_${backward}_$tree" --no-flex --backward "$backward" --families "$WINDOWS"
    done
  done
fi
tar -czf "$top/part$part.tgz" -C "$top" "part$part" && rm -rf "$out"  # one file comes back
