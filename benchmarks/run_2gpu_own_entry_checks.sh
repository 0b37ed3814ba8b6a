#!/usr/bin/env bash
# The package's entry point against Megatron-LM's pretrain_gpt.py with patches/ applied, on a
# 2-GPU kind, one machine session, after the entry point took Megatron's loss checks
# (--check-for-nan-in-loss-and-grad, --check-for-spiky-loss) and the virtual pipeline stage:
#   document masks, pack_zigzag, eager, MEGATRON_BURST_REPLAY=auto: both ways in, with the
#     checks (Megatron's default) and with --no-check-for-nan-in-loss-and-grad;
#   an interleaved pipeline (PP=2, 2 chunks a stage, CP=1) through both ways: the losses;
#   the entry point's CP=2 pack_zigzag eager step against its CP=1 step (megatron_graphs.py).
# Usage: bash benchmarks/run_2gpu_own_entry_checks.sh OUTDIR MEGATRON_LM_TARBALL (wheels in .whl/)
set -uo pipefail
top=${1:?output folder}; tarball=${2:?Megatron-LM tarball}; out=/tmp/run_o; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
install_wheels
export PYTHONPATH=$PWD:/tmp/site MEGATRON_BURST_REPLAY=auto
lm=/tmp/Megatron-LM; megatron_lm_checkout "$tarball"
both() {  # both ways in: NAME ONLY [EXTRA]
  timeout 170 python3 benchmarks/megatron_upstream.py --megatron-lm "$lm" --gpus 2 --iters 12 \
    --timeout 80 --only "$2" --extra="${3:-}" --out "$out/upstream_$1.json" \
    > "$out/upstream_$1.txt" 2>&1
  echo "upstream $1 rc=$?"; tail -2 "$out/upstream_$1.md" 2>/dev/null
}
both zigzag_checks "documents pack_zigzag, eager"
both zigzag_nocheck "documents pack_zigzag, eager" "--no-check-for-nan-in-loss-and-grad"
both interleaved "default flags" \
  "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 --context-parallel-size 1"
megatron_steps 120 100
mkdir -p "$top"; tar -czf "$top/o.tgz" -C /tmp run_o
