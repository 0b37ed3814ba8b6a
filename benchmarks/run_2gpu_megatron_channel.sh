#!/usr/bin/env bash
# Issue 41's agreement channel in Megatron, on a 2-GPU kind, one machine session: document
# masks (whole_docs, eager: the ranks check every micro-batch's new pack) through both ways in
# (Megatron-LM's pretrain_gpt.py with patches/, and the package's entry point), with the
# agreements over the gloo twin (MEGATRON_BURST_HOST_CHANNEL=gloo, the default) and over the
# NCCL group (=group): the losses and the step times; then --disable-gloo-process-groups both
# ways in with the default channel, which must stop at start-up naming the setting.
# Usage: bash benchmarks/run_2gpu_megatron_channel.sh OUTDIR MEGATRON_LM_TARBALL (wheels in .whl/)
set -uo pipefail
top=${1:?output folder}; tarball=${2:?Megatron-LM tarball}; out=/tmp/run_m; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
install_wheels
export PYTHONPATH=$PWD:/tmp/site
lm=/tmp/Megatron-LM; megatron_lm_checkout "$tarball"
both() {  # both ways in: NAME ONLY SECONDS [EXTRA]
  timeout "$3" python3 benchmarks/megatron_upstream.py --megatron-lm "$lm" --gpus 2 --iters 12 \
    --timeout 80 --only "$2" --extra="${4:-}" --out "$out/upstream_$1.json" \
    > "$out/upstream_$1.txt" 2>&1
  echo "upstream $1 rc=$?"; tail -2 "$out/upstream_$1.md" 2>/dev/null
}
MEGATRON_BURST_HOST_CHANNEL=gloo both masks_gloo "document masks" 200
MEGATRON_BURST_HOST_CHANNEL=group both masks_group "document masks" 200
both no_gloo_groups "document masks" 120 "--disable-gloo-process-groups"
grep -h -o "disable-gloo-process-groups: [^\"]*" "$out"/upstream_no_gloo_groups.txt | sort | uniq -c | head -3
mkdir -p "$top"; tar -czf "$top/m.tgz" -C /tmp run_m
