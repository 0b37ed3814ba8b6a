#!/usr/bin/env bash
# The 8-GPU runs on nvidia-h200-x8 for benchmarks/results/ (issue: 8-GPU runs).
# Usage: bash benchmarks/run_h200x8.sh attention|e2e|tests OUTDIR
#   attention: the attention benchmark at 8 GPUs, 8K and 32K tokens/GPU, causal and full,
#              MHA and GQA 32:8 (burst flat ring and double ring 2x4 against native CP,
#              Ulysses and all-gather); then python benchmarks/report.py OUTDIR/*.json
#   e2e:       pretrain_gpt, Llama-3.2 1B shape, CP=8 burst against TP=8 + SP at 128K, 256K
#              (megatron-core from the carried wheels on PYTHONPATH)
#   tests:     the GPU tests (tests/test_gpu.py) on this host
#   report:    (no GPU) tables and plots for every result, oldest first so newer runs win
#   nccl:      ring send/recv GB/s under NCCL channel settings, then burst (flat ring and
#              Ulysses x ring) at 8K/GPU MHA with the default and with more P2P channels
set -uo pipefail
what=${1:?attention, e2e or tests}
out=${2:?output folder}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
case $what in
  attention)
    timeout 450 torchrun --nproc_per_node=8 benchmarks/attention.py --per-gpu 8192,32768 \
      --heads 32:32,32:8 --masks causal,full --iters 4 --warmup 1 \
      --out "$out/h200x8_attention.json" 2>&1 | grep -v -i "warn\|^\*\*\*\|OMP_NUM" ;;
  e2e)
    python benchmarks/megatron_e2e.py --suite h200x8 --seqs 131072,262144 --iters 6 \
      --timeout 135 --out "$out/megatron_h200x8.json" 2>&1 | tee "$out/megatron_h200x8.log" ;;
  tests)
    timeout 200 python -m pytest tests/test_gpu.py -q -s 2>&1 | tee "$out/gpu_tests_h200x8.log" ;;
  nccl)
    more=(NCCL_MIN_P2P_NCHANNELS=32 NCCL_NCHANNELS_PER_PEER=32)
    p2p() { local tag=$1; shift; env "$@" timeout 90 torchrun --nproc_per_node=8 \
      benchmarks/p2p_ring.py --label "$tag $*" --out "$out/p2p_$tag.json" 2>&1 | grep "GB/s"; }
    attn() { local tag=$1; shift; env "$@" timeout 150 torchrun --nproc_per_node=8 \
      benchmarks/attention.py --per-gpu 8192 --heads 32:32 --masks causal,full --iters 4 \
      --warmup 1 --methods "burst (auto,usp,ulysses,native" \
      --out "$out/h200x8_8k_nccl_$tag.json" 2>&1 | grep "^#"; }
    p2p default
    p2p perpeer16 NCCL_NCHANNELS_PER_PEER=16
    p2p p2p32 "${more[@]}"
    attn default
    attn p2p32 "${more[@]}" ;;
  report)
    cd "$out" && python ../report.py h200x1_attention.json h200x2_attention.json \
      h200x4_attention.json h200x4_causal_final.json h200x4_window128k.json \
      h200x8_causal.json h200x8_attention_unpacked.json h200x8_8k_nccl_default.json \
      h200x8_8k_nccl_p2p32.json h200x1_packed_on_x8.json h200x2_packed_on_x8.json \
      h200x4_packed_on_x8.json h200x8_attention.json megatron_h200x8.json \
      h200x4_documents_first.json h200x4_documents_lognormal_fresh.json h200x4_auto.json \
      h200x4_documents.json megatron_features_h200x2.json megatron_remat_h200x2.json \
      megatron_ckpt_h200x2.json > /dev/null ;;
  *) echo "unknown: $what" >&2; exit 2 ;;
esac
