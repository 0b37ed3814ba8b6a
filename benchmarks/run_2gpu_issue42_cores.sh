#!/usr/bin/env bash
# Issue 42, the host's CPU: each CPU's speed at the host's Python (host_cores.py, before and
# after), then benchmarks/slice_masks.py --chained --no-flex --no-torch-flex-cp on FAMILIES
# once per entry of RUNS (free: unpinned; fast / slow: --pin-cores, each rank's main thread
# on one of the fastest / slowest CPUs; a trailing digit repeats a way), in one device call.
# With TESTS=1 first the GPU tests of this session's GPU-path change and merge_launch.py.
# SLICE_ARGS: more options for slice_masks.py (e.g. --graph); RUN_SECONDS: each run's limit.
# Usage: bash benchmarks/run_2gpu_issue42_cores.sh OUTDIR FAMILIES "free fast slow"
#        (writes OUTDIR/cores.tgz; about 25 s a family a run on 2x H100)
set -uo pipefail
top=${1:?output folder}; families=${2:?families}; runs=${3:?runs}
out="$top/cores"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
gpu_gate || exit 3  # a GPU idling hot times nothing worth keeping
if [ "${TESTS:-0}" = 1 ]; then
  PYTHONPATH=$PWD timeout 240 python3 -m pytest tests/test_gpu_wide_rows.py \
    tests/test_gpu_merge_launch.py -q -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
  echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | tail -2
  PYTHONPATH=$PWD timeout 120 python3 benchmarks/merge_launch.py --out "$out/merge_launch" \
    > "$out/merge_launch_log.txt" 2>&1
  echo "merge_launch rc=$?"; tail -n 6 "$out/merge_launch.md"
fi
PYTHONPATH=$PWD python3 benchmarks/host_cores.py --out "$out/cpus_before" > /dev/null; tail -1 "$out/cpus_before.md"
for run in $runs; do
  way=${run%[0-9]}; pin=""; [ "$way" != free ] && pin="--pin-cores $way"
  PYTHONPATH=$PWD timeout "${RUN_SECONDS:-240}" torchrun --nproc_per_node=2 \
    benchmarks/slice_masks.py --chained --no-flex --no-torch-flex-cp --families "$families" \
    $pin ${SLICE_ARGS:-} --out "$out/$run" \
    > "$out/${run}_log.txt" 2>&1
  echo "$run rc=$?"; grep -E '^main threads|^\| [a-z]' "$out/$run.md" 2>/dev/null | cut -c1-220
done
PYTHONPATH=$PWD python3 benchmarks/host_cores.py --out "$out/cpus_after" > /dev/null; tail -1 "$out/cpus_after.md"
tar -czf "$top/cores.tgz" -C "$top" cores
