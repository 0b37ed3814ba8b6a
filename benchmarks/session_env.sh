# Sourced by the 2-GPU session scripts (run_2gpu_nov26_*.sh) with their output folder:
# NVLink multicast off (every command on these hosts), unbuffered Python, `quiet` (a log
# without its warnings), and the device's name in OUTDIR/device.txt.
# Usage: . benchmarks/session_env.sh OUTDIR
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
quiet() { grep -v -E "Warning:|warnings\.warn|^\*\*\*|OMP_NUM|return func|^W[0-9]|Guessing device"; }
SESSION_OUT=${1:?output folder}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$SESSION_OUT/device.txt"
# gpu_tests SECONDS "K EXPRESSION": tests/test_gpu.py's tests that match, log in OUTDIR/gpu_tests.txt.
gpu_tests() {
  PYTHONPATH=$PWD:/tmp/site timeout "$1" python3 -m pytest tests/test_gpu.py -q -s \
    -p no:cacheprovider -k "$2" > "$SESSION_OUT/gpu_tests.txt" 2>&1
  echo "tests rc=$?"; quiet < "$SESSION_OUT/gpu_tests.txt" | tail -3
}
