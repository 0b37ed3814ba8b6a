#!/usr/bin/env bash
# Issue 39, second call of run_2gpu_replay_checks.sh's session (2-GPU kind): the user's own
# graph tests of pack_zigzag with MEGATRON_BURST_REPLAY unset; benchmarks/documents.py at
# 8K/GPU 32:8 d128 (calls that do not replay under auto) before, after, before, after, to
# tell a change in the eager path from the run's noise; Megatron CP=2 pack_zigzag eager,
# replay auto, with the package before (the after figure is the first call's).
# Usage: bash benchmarks/run_2gpu_replay_checks_b.sh BEFORE_DIR OUTDIR   (wheels in .whl/;
# BEFORE_DIR: a whole tree of the commit before, with .whl/ not needed)
set -uo pipefail
before=${1:?the package before}; top=${2:?output folder}; out=/tmp/run_rb; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
install_wheels
PYTHONPATH=$PWD:/tmp/site timeout 150 python3 -m pytest tests/test_gpu_pack_zigzag.py -q -s \
  -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | grep -E "passed|failed" | tail -3
export MEGATRON_BURST_REPLAY=auto
docs() {
  PYTHONPATH=$pkg:/tmp/site timeout 100 torchrun --nproc_per_node=2 benchmarks/documents.py \
    --per-gpu 8192 --heads 32:8:128 --mixes uniform,lognormal --cudnn-cases none \
    --layouts pack_zigzag --out "$out/$name/documents.json" > "$out/$name/documents_log.txt" 2>&1
  echo "$name documents rc=$?"; grep "burst pack_zigzag" "$out/$name/documents.md"
}
for name in before1 after1 before2 after2; do
  pkg=$PWD; [[ $name == before* ]] && pkg=$(cd "$before" && pwd)
  mkdir -p "$out/$name"; docs
done
# BEFORE_DIR is a whole tree: Megatron's ranks start in the tree of the script they run.
(cd "$before" && PYTHONPATH=$PWD:/tmp/site timeout 200 python3 benchmarks/megatron_graphs.py \
  --shape small --documents 32 --iters 8 --timeout 150 --only "CP=2, documents pack_zigzag, eager" \
  --out "$out/megatron_CP2_before.json" > "$out/megatron_CP2_before.txt" 2>&1)
echo "megatron CP2 before rc=$?"; tail -1 "$out/megatron_CP2_before.md" 2>/dev/null
mkdir -p "$top"; tar -czf "$top/rb.tgz" -C /tmp run_rb
