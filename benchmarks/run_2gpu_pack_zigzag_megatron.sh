#!/usr/bin/env bash
# Issue 39, Megatron with document masks in CUDA graphs (layout pack_zigzag), on a 2-GPU kind:
# benchmarks/megatron_graphs.py --documents 32: the small model (4 layers, hidden 1024,
# 16:4 heads, 16K tokens, mock data) at CP=2 with whole_docs eager (today's default),
# pack_zigzag eager and pack_zigzag in CUDA graphs (--cuda-graph-impl local), and at CP=1
# with whole_docs eager and pack_zigzag in graphs; losses and steady ms per iteration.
# Usage: [ONLY=part-of-a-run-name] bash benchmarks/run_2gpu_pack_zigzag_megatron.sh OUTDIR
# (wheels in .whl/; a failed run's whole log lands beside the JSON)
set -uo pipefail
top=${1:?output folder}; out=/tmp/run_m; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/*.whl > "$out/pip.txt" 2>&1
. benchmarks/session_env.sh "$out"
export PYTHONPATH=$PWD:/tmp/site
timeout 480 python3 benchmarks/megatron_graphs.py --shape small --documents 32 --iters 8 \
  --timeout 90 --only "${ONLY:-}" --out "$out/megatron_graphs_documents.json" > "$out/log.txt" 2>&1
echo "megatron_graphs rc=$?"
cat "$out/megatron_graphs_documents.md" 2>/dev/null || quiet < "$out/log.txt" | tail -20
mkdir -p "$top"; tar -czf "$top/m.tgz" -C /tmp run_m
