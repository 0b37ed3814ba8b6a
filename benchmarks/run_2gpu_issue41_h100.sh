#!/usr/bin/env bash
# Issue 41 on nvidia-h100-x2 (the issue's own machine kind; every earlier auto_check ran on
# H200s): benchmarks/auto_check.py on the machine and under emulated 25 and 50 GB/s links,
# each with a fresh profile cache (benchmarks/auto_check_three.sh), after the check also
# times the choice's other backward mode where the model was off.
# Everything lands in OUTDIR/b.tgz.  Usage: bash benchmarks/run_2gpu_issue41_h100.sh OUTDIR
set -uo pipefail
top=${1:?output folder}; out=/tmp/run_b; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
export PYTHONPATH=$PWD:/tmp/site
bash benchmarks/auto_check_three.sh "$out"
mkdir -p "$top"; tar -czf "$top/b.tgz" -C /tmp run_b
