#!/usr/bin/env bash
# On 4 GPUs: the global sliding window placed by even chunks (BEFORE_DIR's package: its 1,024
# rows that see every key on one rank, 1.69x the mean area) against heavy chunks dealt in
# pieces (this tree: 1.00x, 20 pieces a rank), benchmarks/slice_masks.py --graph, before,
# after, before.
# Usage: bash benchmarks/run_4gpu_area_pieces.sh OUTDIR BEFORE_DIR   (writes OUTDIR/pieces4.tgz)
set -uo pipefail
top=${1:?output folder}; before=$(cd "${2:?tree before}" && pwd)
out="$top/pieces4"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
for side in before after before2; do
  pkg=$PWD; [ "$side" != after ] && pkg=$before
  PYTHONPATH=$pkg timeout 75 torchrun --nproc_per_node=4 benchmarks/slice_masks.py --graph \
    --families global_sliding_window --iters 10 --out "$out/global_$side" \
    > "$out/global_${side}_log.txt" 2>&1
  echo "$side rc=$?"; grep '^| global' "$out/global_$side.md" | cut -d'|' -f2,4,5,9,10,12,13
  grep -o '"package": "[^"]*"' "$out/global_$side.json"
  tar -czf "$top/pieces4.tgz" -C "$top" pieces4
done
