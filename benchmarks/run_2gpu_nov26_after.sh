#!/usr/bin/env bash
# After this session's changes (2026-11-26, second session; nvidia-h100-x2 or -h200-x2):
#   part a (issue 42; issue 41's emulator): GPU tests (the emulated links' start, slice masks
#     in bf16, new packs, the merge); benchmarks/slice_masks.py, all twelve families, this
#     tree; and, right after on the same machine, the document families' new-mask row with
#     .before26 (commit 26ca445: the package and the script before attention.varying_masks);
#   part b (issue 41): benchmarks/auto_check.py on the machine and under emulated 25 and 50
#     GB/s links (benchmarks/auto_check_three.sh), with the measured profiles;
#   part c (issue 42, the area layout's chunking): benchmarks/slice_masks.py, this tree,
#     then .before26's (26ca445: the finest balance) on the same machine, every family, and
#     benchmarks/slice_mask_profile.py on the two window families.
# Everything lands in OUTDIR/<part>.tgz (the device returns 8 files).
# Usage: bash benchmarks/run_2gpu_nov26_after.sh a|b|c OUTDIR   (wheels installed in /tmp/site)
set -uo pipefail
part=${1:?a or b}; top=${2:?output folder}; out=/tmp/run_$part; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
if [ "$part" = a ]; then
  gpu_tests 150 "emulated_transfer or slice_masks or compiles_the_merge or fresh_document"
  PYTHONPATH=$PWD:/tmp/site timeout 240 torchrun --nproc_per_node=2 benchmarks/slice_masks.py \
    --out "$out/slice_masks" > "$out/slice_masks_log.txt" 2>&1; echo "slice_masks rc=$?"
  quiet < "$out/slice_masks_log.txt" | grep "^|" | tail -12
  fams=full_document,causal_document,shared_question,block_causal_document
  (cd .before26 && PYTHONPATH=$PWD:/tmp/site timeout 150 torchrun --nproc_per_node=2 \
    benchmarks/slice_masks.py --families $fams --no-flex --out "$out/before_slice_masks_fresh" \
    > "$out/before_slice_masks_fresh_log.txt" 2>&1); echo "before rc=$?"
  quiet < "$out/before_slice_masks_fresh_log.txt" | grep "^|" | tail -4
elif [ "$part" = b ]; then
  export PYTHONPATH=$PWD:/tmp/site
  bash benchmarks/auto_check_three.sh "$out"
else
  PYTHONPATH=$PWD:/tmp/site timeout 200 torchrun --nproc_per_node=2 benchmarks/slice_masks.py \
    --out "$out/slice_masks" > "$out/slice_masks_log.txt" 2>&1; echo "slice_masks rc=$?"
  quiet < "$out/slice_masks_log.txt" | grep "^|" | tail -12
  (cd .before26 && PYTHONPATH=$PWD:/tmp/site timeout 150 torchrun --nproc_per_node=2 \
    benchmarks/slice_masks.py --no-flex --out "$out/before_slice_masks" \
    > "$out/before_slice_masks_log.txt" 2>&1); echo "before rc=$?"
  quiet < "$out/before_slice_masks_log.txt" | grep "^|" | tail -12
  PYTHONPATH=$PWD:/tmp/site timeout 120 torchrun --nproc_per_node=2 \
    benchmarks/slice_mask_profile.py --families sliding_window_causal,global_sliding_window \
    > "$out/slice_mask_profile.txt" 2>&1; echo "profile rc=$?"; grep "=====" "$out/slice_mask_profile.txt"
fi
mkdir -p "$top"; tar -czf "$top/$part.tgz" -C /tmp "run_$part"
