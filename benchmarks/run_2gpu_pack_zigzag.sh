#!/usr/bin/env bash
# Issue 39, layout pack_zigzag (documents the GPU reads; CUDA graphs of document packs), on
# nvidia-h100-x2 or nvidia-h200-x2:
#   part a: tests/test_gpu_pack_zigzag.py (bf16 exactness over NCCL with a new pack every
#     call; graph replays on new packs equal the eager call; one GPU), then
#     benchmarks/documents.py with whole_docs, pack_zigzag and pack_zigzag+graph side by side
#     (8K and 16K tokens per GPU, 32:8 d128 and 16:4 d64, lognormal / uniform / tiny packs),
#     every row against one GPU's varlen kernel on the same packs, in the same run.
# Everything lands in OUTDIR/<part>.tgz (the device returns 8 files).
# Usage: bash benchmarks/run_2gpu_pack_zigzag.sh a OUTDIR   (wheels installed in /tmp/site)
set -uo pipefail
part=${1:?a}; top=${2:?output folder}; out=/tmp/run_$part; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
export PYTHONPATH=$PWD:/tmp/site
if [ "$part" = a ]; then
  timeout 200 python3 -m pytest tests/test_gpu_pack_zigzag.py -q -s -p no:cacheprovider \
    > "$out/gpu_tests.txt" 2>&1; echo "tests rc=$?"; quiet < "$out/gpu_tests.txt" | tail -4
  timeout 330 torchrun --nproc_per_node=2 benchmarks/documents.py --per-gpu 8192,16384 \
    --heads 32:8:128,16:4:64 --mixes lognormal,uniform,tiny --cudnn-cases none \
    --layouts whole_docs,pack_zigzag,pack_zigzag+graph --pyprofile "${PYPROFILE:-}" \
    --out "$out/documents_pack_zigzag.json" \
    > "$out/documents_log.txt" 2>&1; echo "documents rc=$?"
  quiet < "$out/documents_log.txt" | grep -E "Error|error" | tail -5
fi
mkdir -p "$top"; tar -czf "$top/$part.tgz" -C /tmp "run_$part"
