#!/usr/bin/env bash
# The merges' two changes on 2 GPUs, before (BEFORE_DIR's package) and after (this tree's),
# in one device call: tests/test_gpu.py's merge tests; benchmarks/merge_rate.py on GPU 0
# for both packages; then run_2gpu_masks_before_after.sh on FAMILIES (before, after, before).
# Usage: bash benchmarks/run_2gpu_first_writes.sh OUTDIR BEFORE_DIR FAMILIES
#        (writes OUTDIR/first_writes.tgz and OUTDIR/masks2.tgz)
set -uo pipefail
top=${1:?output folder}; before=$(cd "${2:?tree before}" && pwd); families=${3:?families}
out="$top/first_writes"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
PYTHONPATH=$PWD timeout 200 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider \
  -k merge > "$out/gpu_tests.txt" 2>&1
echo "merge tests rc=$?"; tail -1 "$out/gpu_tests.txt"
for side in before after; do
  pkg=$PWD; [ "$side" = before ] && pkg=$before
  PYTHONPATH=$pkg:$PWD timeout 120 python3 benchmarks/merge_rate.py --out "$out/merge_$side" \
    > "$out/merge_${side}_log.txt" 2>&1
  echo "merge_rate $side rc=$?"; cat "$out/merge_$side/merge_rate.md"
done
tar -czf "$top/first_writes.tgz" -C "$top" first_writes
bash benchmarks/run_2gpu_masks_before_after.sh "$top" "$before" "$families"
