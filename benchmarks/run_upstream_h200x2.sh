#!/usr/bin/env bash
# Issue 22 on nvidia-h200-x2: Megatron-LM core_v0.19.0's pretrain_gpt.py with patches/
# applied, against this package's entry point (benchmarks/megatron_upstream.py).
# Usage: bash benchmarks/run_upstream_h200x2.sh OUTDIR MEGATRON_LM_TARBALL [ONLY [EXTRA_FLAGS]]
# The tarball holds Megatron-LM's tree at core_v0.19.0 (pretrain_gpt.py, gpt_builders.py,
# model_provider.py, megatron/); it travels in an ignored folder, never in this repo.
set -uo pipefail
out=${1:?output folder}
tarball=${2:?Megatron-LM tarball}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
lm=/tmp/Megatron-LM
rm -rf "$lm" && mkdir -p "$lm" && tar -xzf "$tarball" -C "$lm"
(cd "$lm" && git init -q && git apply --check "$OLDPWD/patches/megatron-lm-core_v0.19.0-burst.patch" \
  && git apply "$OLDPWD/patches/megatron-lm-core_v0.19.0-burst.patch" && echo "patch applied") \
  | tee "$out/upstream_patch.txt"
(cd "$lm/megatron/core/datasets" && make >/dev/null 2>&1 && echo "dataset helpers built")
only=${3:-}
extra=${4:-}
name=megatron_upstream_h200x2${only:+_${only// /_}}${extra:+_nocheck}
timeout 560 python benchmarks/megatron_upstream.py --megatron-lm "$lm" --gpus 2 --iters 12 \
  --timeout 120 --only "$only" --extra "$extra" --out "$out/$name.json" 2>&1 \
  | grep -v -i "warn\|^\*\*\*\|OMP_NUM"
