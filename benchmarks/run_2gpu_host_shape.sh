#!/usr/bin/env bash
# What the thirteenth session built and could not run on GPUs, on a 2-GPU machine, in three
# parts that each fit one device call (writes OUTDIR/hs_PART.tgz):
#   host:  benchmarks/host_repeat.py twice (first use timing its host on calls of the call's
#          own shape, then --tiny as before), each beside its 8K truths; then a Megatron
#          layer's first use in a cold process (tests/test_gpu.py -k measures_this_machine:
#          its log line names its parts; the target is 10 s);
#   auto:  benchmarks/auto_check_three.sh (the machine's links, then emulated 25 and 50 GB/s):
#          does the model, with the host at the call's shape, come within 15% in every row?
#   masks: benchmarks/slice_masks.py --graph, every family, with PyTorch's FlexAttention CP
#          beside burst_attn (benchmarks/flex_cp.py, never run on a GPU before).
# Usage: bash benchmarks/run_2gpu_host_shape.sh OUTDIR host|auto|masks
set -uo pipefail
top=${1:?output folder}; part=${2:?host, auto or masks}; out="$top/hs_$part"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
case "$part" in
  host)
    for mode in call tiny; do
      flag=""; [ "$mode" = tiny ] && flag="--tiny"
      PYTHONPATH=$PWD timeout 150 torchrun --nproc_per_node=2 benchmarks/host_repeat.py \
        --out "$out/$mode" --reps 4 $flag > "$out/host_repeat_$mode.txt" 2>&1
      echo "host_repeat $mode rc=$?"; quiet < "$out/host_repeat_$mode.txt" | grep -E "^rep|wrote"
    done
    install_wheels
    gpu_tests 150 "measures_this_machine"
    grep -h "at first use (" "$out/gpu_tests.txt" | head -1 | cut -c1-220 ;;
  auto)
    PYTHONPATH=$PWD bash benchmarks/auto_check_three.sh "$out" ;;
  masks)
    PYTHONPATH=$PWD timeout 540 torchrun --nproc_per_node=2 benchmarks/slice_masks.py \
      --graph --out "$out/slice_masks" > "$out/slice_masks_log.txt" 2>&1
    echo "slice_masks rc=$?"; grep "^|" "$out/slice_masks_log.txt" | cut -c1-160 ;;
  *) echo "part must be host, auto or masks, got $part" >&2; exit 2 ;;
esac
tar -czf "$top/hs_$part.tgz" -C "$top" "hs_$part"
