#!/usr/bin/env bash
# One GPU (nvidia-h200 or nvidia-h100-x1): the GPU tests, and the CP=1 host path and new
# packs of issues 30 and 33, before and after, in one run on one machine.
#
#   bash benchmarks/run_cp1_device.sh OUT [BEFORE]
#
# OUT: folder that receives results.tgz (the device tool returns at most 8 files). BEFORE: a folder holding an earlier checkout's megatron_burst
# package (e.g. `git worktree add /tmp/old b87669e; cp -r /tmp/old/megatron_burst .before/`),
# timed by the same scripts for the before-and-after figures; left out, only HEAD is timed.
set -uo pipefail
dest=${1:?usage: run_cp1_device.sh OUT [BEFORE]}
before=${2:-}
out=$(mktemp -d)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/device.txt"

python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider 2>&1 | tail -40 | tee "$out/gpu_tests.txt"

# The CP=1 rows: a new pack each call against the same pack and the varlen kernel.
docs() {  # docs TAG PYTHONPATH
  PYTHONPATH=$2 torchrun --standalone --nproc_per_node=1 benchmarks/documents.py \
    --per-gpu 16384 --heads 16:4:64 --mixes uniform --cudnn-cases none --iters 10 --warmup 2 \
    --out "$out/cp1_docs_16k_$1.json"
  PYTHONPATH=$2 torchrun --standalone --nproc_per_node=1 benchmarks/documents.py \
    --per-gpu 32768 --heads 32:8:128 --mixes tiny --cudnn-cases none --iters 10 --warmup 2 \
    --out "$out/cp1_docs_32k_$1.json"
  PYTHONPATH=$2 torchrun --standalone --nproc_per_node=1 benchmarks/documents.py \
    --per-gpu 65536 --heads 32:8:128 --mixes lognormal --cudnn-cases none --iters 6 --warmup 2 \
    --out "$out/cp1_docs_64k_$1.json"
}
host() {  # host TAG PYTHONPATH: the host's share of a call at CP=1
  PYTHONPATH=$2 torchrun --standalone --nproc_per_node=1 benchmarks/host_time.py \
    --per-gpu 8192 --iters 30 --out "$out/cp1_host_$1.json"
}
save() { mkdir -p "$dest" && tar czf "$dest/results.tgz" -C "$out" .; }  # after each step:
save  # a run cut off by its time limit still brings back what it finished
host after "$PWD"; save
[ -n "$before" ] && { host before "$before"; save; }
docs after "$PWD"; save
[ -n "$before" ] && { docs before "$before"; save; }
ls -la "$out"
