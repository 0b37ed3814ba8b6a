#!/usr/bin/env bash
# Issue 39, on a 2-GPU kind, one machine session, MEGATRON_BURST_REPLAY=auto throughout:
#   tests/test_gpu_replay.py and tests/test_gpu_pack_zigzag.py (this tree);
#   Megatron-LM core_v0.19.0's pretrain_gpt.py with patches/ applied against this package's
#     entry point (benchmarks/megatron_upstream.py), document masks eager, whole_docs and
#     pack_zigzag: the losses of every way in, replayed passes included;
#   a torch.profiler trace of four micro-batches of the entry point's CP=2 pack_zigzag eager
#     run (MEGATRON_BURST_TRACE, benchmarks/megatron_graphs.py): where a step's time goes.
# Usage: bash benchmarks/run_2gpu_upstream_replay.sh OUTDIR MEGATRON_LM_TARBALL (wheels in .whl/)
set -uo pipefail
top=${1:?output folder}; tarball=${2:?Megatron-LM tarball}; out=/tmp/run_u; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
install_wheels
export PYTHONPATH=$PWD:/tmp/site MEGATRON_BURST_REPLAY=auto
git rev-parse HEAD > "$out/device_git_head.txt" 2>/dev/null
timeout 200 python3 -m pytest tests/test_gpu_replay.py tests/test_gpu_pack_zigzag.py -q -s \
  -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | grep -E "passed|failed|Error|assert" | tail -6
lm=/tmp/Megatron-LM; megatron_lm_checkout "$tarball"
for only in "document masks" "documents pack_zigzag, eager"; do
  slug=${only// /_}; slug=${slug//,/}
  timeout 200 python3 benchmarks/megatron_upstream.py --megatron-lm "$lm" --gpus 2 --iters 12 \
    --timeout 90 --only "$only" --out "$out/upstream_$slug.json" > "$out/upstream_$slug.txt" 2>&1
  echo "upstream $slug rc=$?"; cat "$out/upstream_$slug.md" 2>/dev/null | tail -3
done
MEGATRON_BURST_TRACE=$out/trace:20:4 timeout 150 python3 benchmarks/megatron_graphs.py \
  --shape small --documents 32 --iters 8 --timeout 120 \
  --only "CP=2, documents pack_zigzag, eager" --out "$out/megatron_trace.json" \
  > "$out/megatron_trace.txt" 2>&1
echo "trace rc=$?"; tail -1 "$out/megatron_trace.md" 2>/dev/null; ls -la "$out/trace" 2>/dev/null
for rank in 0 1; do
  python3 benchmarks/trace_summary.py "$out/trace/rank$rank.json" \
    --out "$out/trace_summary_rank$rank.json" > "$out/trace_summary_rank$rank.txt" 2>&1
done
head -30 "$out/trace_summary_rank0.txt"
mkdir -p "$top"; gzip -c "$out/trace/rank0.json" > "$top/trace_rank0.json.gz" 2>/dev/null
rm -rf "$out/trace"; tar -czf "$top/u.tgz" -C /tmp run_u; ls -la "$top"
