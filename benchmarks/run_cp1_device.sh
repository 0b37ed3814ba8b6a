#!/usr/bin/env bash
# One GPU (nvidia-h200 or nvidia-h100-x1): the GPU tests, and the CP=1 host path, new packs,
# attention sinks and MLA of issues 30, 33 and 35, in one run on one machine.
#
#   STEPS="tests host docs sinks megatron" bash benchmarks/run_cp1_device.sh OUT [BEFORE]
#
# OUT: folder that receives results.tgz (the device tool returns at most 8 files); the tarball
# is rewritten after every step, so a run cut off by its time limit still brings back what it
# finished. STEPS (default: all) picks the steps, to split them over calls of at most
# 10 minutes. BEFORE: a folder holding an earlier checkout's megatron_burst package (e.g.
# `git worktree add /tmp/old b87669e; cp -r /tmp/old/megatron_burst .before/`), timed by the
# same scripts for before-and-after host figures; left out, only HEAD is timed. The Megatron
# steps need megatron-core: a wheel in .whl/ is installed to /tmp/site when it is not there.
set -uo pipefail
dest=${1:?usage: run_cp1_device.sh OUT [BEFORE]}
before=${2:-}
steps=" ${STEPS:-tests host docs sinks megatron} "
out=$(mktemp -d)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
if ! python3 -c "import megatron.core" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
site=${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/device.txt"
save() { mkdir -p "$dest" && tar czf "$dest/results.tgz" -C "$out" .; }
has() { [[ "$steps" == *" $1 "* ]]; }

docs() {  # docs TAG PACKAGE_DIR: a new pack each call against the same pack and the kernel
  local p="$2$site"
  PYTHONPATH=$p torchrun --standalone --nproc_per_node=1 benchmarks/documents.py \
    --per-gpu 16384 --heads 16:4:64 --mixes uniform --cudnn-cases none --iters 10 --warmup 2 \
    --out "$out/cp1_docs_16k_$1.json"; save
  PYTHONPATH=$p torchrun --standalone --nproc_per_node=1 benchmarks/documents.py \
    --per-gpu 32768 --heads 32:8:128 --mixes tiny --cudnn-cases none --iters 10 --warmup 2 \
    --out "$out/cp1_docs_32k_$1.json"; save
  PYTHONPATH=$p torchrun --standalone --nproc_per_node=1 benchmarks/documents.py \
    --per-gpu 65536 --heads 32:8:128 --mixes lognormal --cudnn-cases none --iters 6 --warmup 2 \
    --out "$out/cp1_docs_64k_$1.json"; save
}
host() {  # host TAG PACKAGE_DIR: the host's share of a call at CP=1
  PYTHONPATH="$2$site" torchrun --standalone --nproc_per_node=1 benchmarks/host_time.py \
    --per-gpu 8192 --iters 30 --out "$out/cp1_host_$1.json"; save
}
save
if has tests; then
  PYTHONPATH="$PWD$site" python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider 2>&1 \
    | tail -40 | tee "$out/gpu_tests.txt"; save
fi
if has host; then
  host after "$PWD"
  [ -n "$before" ] && host before "$before"
  PYTHONPATH="$PWD$site" python3 benchmarks/host_profile.py --out "$out/host_profile.json"; save
fi
if has docs; then  # after only: documents.py now times the kernel alone with plan_alone,
  docs after "$PWD"  # which a package before issue 33 lacks (its figures: results/h100_cp1)
fi
if has sinks; then
  PYTHONPATH="$PWD$site" python3 benchmarks/sinks_mla.py --out "$out/sinks_mla.json"; save
  PYTHONPATH="$PWD$site" torchrun --standalone --nproc_per_node=1 \
    benchmarks/megatron_sinks_mla.py --out "$out/megatron_sinks_mla.json"; save
fi
if has megatron; then  # Megatron CP=1 with document masks, batches made ahead and on the step
  PYTHONPATH="$PWD$site" python3 benchmarks/megatron_documents.py --gpus 1 --shapes small \
    --prefetch both --trace "$out/trace" --iters 8 --out "$out/megatron_cp1_small.json"; save
fi
ls -la "$out"
