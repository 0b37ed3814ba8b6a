#!/usr/bin/env bash
# Issue 39's table, every row, before and after in one machine session (2x H100 or H200).
# "before" is the package at the commit the issue measured (7b3f129), "after" this tree with
# its defaults, and "replay" this tree with MEGATRON_BURST_REPLAY=auto (eager passes replayed
# from CUDA graphs, opt-in). The sides alternate benchmark by benchmark, because the hosts of
# this kind drift within minutes (benchmarks/NOTES.md, seventh session).
#   part micro: benchmarks/host_time.py (host time on tiny tensors, eager and replayed; plain
#               causal at 8K and 32K tokens per GPU, eager and in a CUDA graph) and
#               benchmarks/documents.py (a new pack every call, 8K/16K 16:4 d64 uniform),
#               each side in turn;
#   part megatron: benchmarks/documents.py at 32K 32:8 d128 (uniform and lognormal), then
#               benchmarks/megatron_documents.py --shapes small (the Megatron rows: CP=2
#               and CP=1, with and without document masks), before from BEFORE_TREE's own
#               script (a Megatron run imports the tree it is started in), then after, then
#               the replayed CP=2 document run.
# Usage: bash benchmarks/run_2gpu_issue39_final.sh OUTDIR BEFORE_TREE PART
#   part cp1: the CP=1 document-mask runs part megatron had no time left for (before, after),
#               after benchmarks/newpack_cprofile.py (where a new whole_docs pack's host
#               time goes, this tree).
#   BEFORE_TREE: a whole tree of the earlier commit (git archive 7b3f129 | tar -x -C DIR).
# Writes OUTDIR/<part>.tgz after every step (a device call returns at most 8 files).
set -uo pipefail
top=${1:?output folder}; before=$(cd "${2:?tree before}" && pwd); part=${3:?part}
out="$top/$part"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
pack() { tar -czf "$top/$part.tgz" -C "$top" "$part"; }
side_env() {  # side_env SIDE: the package path and replay setting of a side
  case $1 in
    before) echo "PYTHONPATH=$before MEGATRON_BURST_REPLAY=off" ;;
    after) echo "PYTHONPATH=$PWD MEGATRON_BURST_REPLAY=off" ;;
    replay) echo "PYTHONPATH=$PWD MEGATRON_BURST_REPLAY=auto" ;;
  esac
}
bench() {  # bench SIDE NAME SECONDS SCRIPT ARGS...: torchrun SCRIPT on SIDE, OUT/NAME_SIDE.*
  local side=$1 name=$2 secs=$3 script=$4; shift 4
  env $(side_env "$side") timeout "$secs" torchrun --nproc_per_node=2 "benchmarks/$script" \
    "$@" --out "$out/${name}_$side.json" > "$out/${name}_${side}_log.txt" 2>&1
  echo "$name $side rc=$?"; grep -o '"package": "[^"]*"' "$out/${name}_$side.json" | head -1
  pack
}
if [ "$part" = micro ]; then
  for side in before after; do
    bench "$side" host_time 120 host_time.py --iters 10 --per-gpu 8192,32768
  done
  bench replay host_time 80 host_time.py --iters 10 --per-gpu 8192  # 'auto' replays no 32K
  for side in before after replay; do
    layouts=whole_docs,pack_zigzag,pack_zigzag+graph
    [ "$side" = before ] && layouts=whole_docs  # 7b3f129 had whole_docs only
    [ "$side" = replay ] && layouts=whole_docs,pack_zigzag
    bench "$side" documents_8k16k 80 documents.py --per-gpu 8192,16384 --heads 16:4:64 \
      --mixes uniform --iters 10 --cudnn-cases none --layouts "$layouts"
  done
elif [ "$part" = megatron ]; then
  for side in before after; do
    bench "$side" documents_32k 70 documents.py --per-gpu 32768 --heads 32:8:128 \
      --mixes uniform,lognormal --iters 8 --cudnn-cases none --layouts whole_docs
  done
  install_wheels
  (cd "$before" && PYTHONPATH=$before:/tmp/site timeout 150 python3 \
    benchmarks/megatron_documents.py --shapes small --iters 8 --timeout 70 \
    --out "$out/megatron_small_before.json" > "$out/megatron_small_before_log.txt" 2>&1)
  echo "megatron before rc=$?"; pack
  PYTHONPATH=$PWD:/tmp/site MEGATRON_BURST_REPLAY=off timeout 190 python3 \
    benchmarks/megatron_documents.py --shapes small --iters 8 --timeout 70 \
    --out "$out/megatron_small_after.json" > "$out/megatron_small_after_log.txt" 2>&1
  echo "megatron after rc=$?"; pack
  PYTHONPATH=$PWD:/tmp/site MEGATRON_BURST_REPLAY=auto timeout 60 python3 \
    benchmarks/megatron_documents.py --shapes small --iters 8 --timeout 70 \
    --only "CP=2, document" --out "$out/megatron_small_replay.json" \
    > "$out/megatron_small_replay_log.txt" 2>&1
  echo "megatron replay rc=$?"; pack
elif [ "$part" = cp1 ]; then
  PYTHONPATH=$PWD timeout 90 torchrun --nproc_per_node=2 benchmarks/newpack_cprofile.py \
    > "$out/newpack_cprofile.txt" 2>&1
  echo "cprofile rc=$?"; grep "^===" "$out/newpack_cprofile.txt"; pack
  install_wheels
  (cd "$before" && PYTHONPATH=$before:/tmp/site timeout 100 python3 \
    benchmarks/megatron_documents.py --shapes small --iters 8 --timeout 90 --only "CP=1, doc" \
    --out "$out/megatron_cp1_before.json" > "$out/megatron_cp1_before_log.txt" 2>&1)
  echo "megatron before rc=$?"; pack
  PYTHONPATH=$PWD:/tmp/site MEGATRON_BURST_REPLAY=off timeout 100 python3 \
    benchmarks/megatron_documents.py --shapes small --iters 8 --timeout 90 --only "CP=1, doc" \
    --out "$out/megatron_cp1_after.json" > "$out/megatron_cp1_after_log.txt" 2>&1
  echo "megatron after rc=$?"; pack
fi
