#!/usr/bin/env bash
# Issue 39, on a 2-GPU kind, one machine session:
#   p: where an eager pack_zigzag call's host time goes with MEGATRON_BURST_REPLAY=auto
#      (benchmarks/documents.py --pyprofile: cProfile of rank 0's calls, 8K/GPU 16:4 d64);
#   m: Megatron with document masks, eager (benchmarks/megatron_graphs.py --documents 32,
#      the small model): CP=2 pack_zigzag with MEGATRON_BURST_REPLAY off and auto, and CP=1;
#   c: benchmarks/capture_after_eager.py, the user's capture after eager calls (replay auto),
#      a few times in the patterns that failed once (V=warm,fs and V=warm,bwdonly).
# Usage: PARTS="p m c" bash benchmarks/run_2gpu_megatron_replay.sh OUTDIR (wheels in .whl/)
set -uo pipefail
top=${1:?output folder}; out=/tmp/run_s; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
install_wheels
export PYTHONPATH=$PWD:/tmp/site
for part in ${PARTS:-p m c}; do
  case $part in
  p)
    MEGATRON_BURST_REPLAY=auto timeout 150 torchrun --nproc_per_node=2 benchmarks/documents.py \
      --per-gpu 8192 --heads 16:4:64 --mixes uniform --cudnn-cases none \
      --layouts pack_zigzag --pyprofile 8192:16:uniform \
      --out "$out/profile_documents.json" > "$out/profile_log.txt" 2>&1
    echo "profile rc=$?" ;;
  m)
    for mode in off auto; do
      MEGATRON_BURST_REPLAY=$mode timeout 200 python3 benchmarks/megatron_graphs.py \
        --shape small --documents 32 --iters 8 --timeout 150 --only "CP=2, documents pack_zigzag, eager" \
        --out "$out/megatron_replay_$mode.json" > "$out/megatron_$mode.txt" 2>&1
      echo "megatron $mode rc=$?"; cat "$out/megatron_replay_$mode.md" 2>/dev/null | tail -1
    done
    timeout 200 python3 benchmarks/megatron_graphs.py --shape small --documents 32 --iters 8 \
      --timeout 150 --only "CP=1, documents whole_docs" --out "$out/megatron_cp1.json" \
      > "$out/megatron_cp1.txt" 2>&1
    echo "megatron cp1 rc=$?"; cat "$out/megatron_cp1.md" 2>/dev/null | tail -1 ;;
  c)
    for v in warm,fs warm,bwdonly warm,fs warm,bwdonly; do
      MODE=auto V=$v timeout 60 torchrun --nproc_per_node=2 benchmarks/capture_after_eager.py \
        --out "$out/capture.txt" > "$out/capture_$v.txt" 2>&1
      echo "capture $v rc=$?"
    done
    cat "$out/capture.txt" ;;
  esac
done
mkdir -p "$top"; tar -czf "$top/s.tgz" -C /tmp run_s
