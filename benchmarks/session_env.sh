# Sourced by the 2-GPU session scripts (run_2gpu_*.sh) with their output folder: NVLink
# multicast off (every command on these hosts), unbuffered Python, `quiet` (a log without its
# warnings), the device's name in OUTDIR/device.txt, and the steps the scripts share (each
# function below says what it does).
# Usage: . benchmarks/session_env.sh OUTDIR
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
quiet() { grep -v -E "Warning:|warnings\.warn|^\*\*\*|OMP_NUM|return func|^W[0-9]|Guessing device"; }
SESSION_OUT=${1:?output folder}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$SESSION_OUT/device.txt"
# gpu_gate [MAX_C]: each GPU's idle temperature, SM clock and clock-event reasons in
# OUTDIR/gate.txt; returns 3 (saying HOT) where one idles above MAX_C (default 55): a machine
# whose second GPU idled at 70 C timed the backward 3-4x slow (results/h100x2_issue42_throttled).
gpu_gate() {
  nvidia-smi --query-gpu=index,temperature.gpu,clocks.sm,clocks_event_reasons.active \
    --format=csv > "$SESSION_OUT/gate.txt"
  if nvidia-smi --query-gpu=temperature.gpu --format=csv,noheader,nounits \
      | awk -v m="${1:-55}" '$1 > m {hot = 1} END {exit !hot}'; then
    echo "HOT: a GPU idles above ${1:-55} C"; cat "$SESSION_OUT/gate.txt"; return 3
  fi
}
# install_wheels: the wheels carried in .whl/ (megatron-core, einops) into /tmp/site, pip's log
# in OUTDIR/pip.txt; the scripts then put $PWD:/tmp/site on PYTHONPATH.
install_wheels() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/*.whl > "$SESSION_OUT/pip.txt" 2>&1
}
# megatron_steps OUTER INNER: benchmarks/megatron_graphs.py's small model with document masks,
# CP=2 pack_zigzag eager and CP=1 whole_docs eager (each run's Megatron within INNER seconds,
# the whole within OUTER), in OUTDIR/megatron_CP{2,1}.*.
megatron_steps() {
  local only slug
  for only in "CP=2, documents pack_zigzag, eager" "CP=1, documents whole_docs, eager"; do
    slug=${only%%,*}; slug=${slug/=/}
    timeout "$1" python3 benchmarks/megatron_graphs.py --shape small --documents 32 --iters 8 \
      --timeout "$2" --only "$only" --out "$SESSION_OUT/megatron_$slug.json" \
      > "$SESSION_OUT/megatron_$slug.txt" 2>&1
    echo "megatron $slug rc=$?"; tail -1 "$SESSION_OUT/megatron_$slug.md" 2>/dev/null
  done
}
# gpu_tests SECONDS "K EXPRESSION": tests/test_gpu.py's tests that match, log in OUTDIR/gpu_tests.txt.
gpu_tests() {
  PYTHONPATH=$PWD:/tmp/site timeout "$1" python3 -m pytest tests/test_gpu.py -q -s \
    -p no:cacheprovider -k "$2" > "$SESSION_OUT/gpu_tests.txt" 2>&1
  echo "tests rc=$?"; quiet < "$SESSION_OUT/gpu_tests.txt" | tail -3
}
# each_package BEFORE_DIR FUNCTION: FUNCTION run twice, with $which = before (PYTHONPATH on
# BEFORE_DIR's megatron_burst/) and after (this tree's), OUTDIR/$which made for it.
each_package() {
  local before=$1 fn=$2
  for which in before after; do
    local pkg=$PWD; [ "$which" = before ] && pkg=$(cd "$before" && pwd)
    mkdir -p "$SESSION_OUT/$which"
    PYTHONPATH=$pkg:/tmp/site "$fn"
  done
}
# all_gpu_tests SECONDS: tests/test_gpu.py and tests/test_gpu_pack_zigzag.py, log in
# OUTDIR/gpu_tests.txt. pack_timeline LAYOUTS: each rank's GPU timeline of those layouts'
# calls at 16K/GPU 32:8 d128 (kernel_profile.py --timeline), in OUTDIR/timeline.
all_gpu_tests() {
  PYTHONPATH=$PWD:/tmp/site timeout "$1" python3 -m pytest tests/test_gpu.py \
    tests/test_gpu_pack_zigzag.py -q -s -p no:cacheprovider > "$SESSION_OUT/gpu_tests.txt" 2>&1
  echo "tests rc=$?"; quiet < "$SESSION_OUT/gpu_tests.txt" | tail -4
}
pack_timeline() {
  PYTHONPATH=$PWD:/tmp/site timeout 150 torchrun --nproc_per_node=2 \
    benchmarks/kernel_profile.py --per-gpu 16384 --heads 32:8:128 --mix uniform \
    --layouts "$1" --timeline --out "$SESSION_OUT/timeline" > "$SESSION_OUT/timeline_log.txt" 2>&1
  echo "timeline rc=$?"; head -3 "$SESSION_OUT"/timeline/*_timeline_rank0.txt
}
# megatron_lm_checkout TARBALL: Megatron-LM's tree (core_v0.19.0, carried as a tarball in an
# ignored folder) in /tmp/Megatron-LM with patches/ applied and its dataset helpers built;
# "patch applied" in OUTDIR/upstream_patch.txt.
megatron_lm_checkout() {
  local lm=/tmp/Megatron-LM repo=$PWD
  rm -rf "$lm" && mkdir -p "$lm" && tar -xzf "$1" -C "$lm"
  (cd "$lm" && git init -q && git apply "$repo/patches/megatron-lm-core_v0.19.0-burst.patch" \
    && echo "patch applied") > "$SESSION_OUT/upstream_patch.txt" 2>&1
  (cd "$lm/megatron/core/datasets" && make >/dev/null 2>&1 && echo "dataset helpers built")
}
