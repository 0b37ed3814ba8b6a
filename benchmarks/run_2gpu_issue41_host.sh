#!/usr/bin/env bash
# Issue 41 on a 2-GPU machine: benchmarks/auto_check_three.sh on this tree (the machine's
# links, then emulated 25 and 50 GB/s links, each with a fresh profile cache), with every
# row's host time (until the call returned) beside its wall time, in whole turns of rounds.
# Usage: bash benchmarks/run_2gpu_issue41_host.sh OUTDIR   (writes OUTDIR/a41h.tgz)
set -uo pipefail
top=${1:?output folder}; out="$top/a41h"; mkdir -p "$out"
. benchmarks/session_env.sh "$out"
PYTHONPATH=$PWD bash benchmarks/auto_check_three.sh "$out"
tar -czf "$top/a41h.tgz" -C "$top" a41h
