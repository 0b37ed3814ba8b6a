#!/usr/bin/env bash
# benchmarks/auto_check.py three times on one 2-GPU machine: on its own links and under
# emulated 25 and 50 GB/s inter-node links, each with a fresh profile cache (first use
# measured). Copies each run's JSON, log and measured profile into OUTDIR
# (auto_check[_25gbps|_50gbps].*, profile[_25gbps|_50gbps].json).
# Usage: bash benchmarks/auto_check_three.sh OUTDIR   (PYTHONPATH and NCCL settings exported)
set -uo pipefail
out=${1:?output folder}; mkdir -p "$out"
quiet() { grep -v -E "Warning:|warnings\.warn|^\*\*\*|OMP_NUM|return func|^W[0-9]|Guessing device"; }
for emu in "" "gpus_per_node=1,gbps=25,latency_us=5" "gpus_per_node=1,gbps=50,latency_us=5"; do
  gbps=${emu#*gbps=}; tag=${emu:+_${gbps%%,*}gbps}
  MEGATRON_BURST_EMULATE=$emu timeout 240 torchrun --nproc_per_node=2 \
    benchmarks/auto_check.py --out "/tmp/a41$tag" > "$out/auto_check${tag}_log.txt" 2>&1
  echo "auto_check$tag rc=$?"
  quiet < "$out/auto_check${tag}_log.txt" | grep -E "^#|wrote" | tail -9
  cp "/tmp/a41$tag"/auto_check*.json "$out/auto_check${tag}.json" 2>/dev/null
  cp "/tmp/a41$tag"/profile-cache/*.json "$out/profile${tag}.json" 2>/dev/null  # what auto measured
done
