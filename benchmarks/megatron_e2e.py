"""End-to-end Megatron runs on one GPU host: loss tracking and the memory plan's accuracy.

    python benchmarks/megatron_e2e.py --out benchmarks/results/megatron_h200x4.json

1. A small Llama-style model (GQA, RMSNorm, SwiGLU, RoPE, mock data, bf16) trained for
   --iters iterations with `python -m megatron_burst.pretrain_gpt` at CP=1 (one GPU),
   CP=4 and TP=2 x CP=2, same global batch and seed: the loss curves, tokens/s and peak
   memory, from Megatron's own log lines.
2. configs/llama3.2-1b-128k-4gpu.yaml for a few iterations: Megatron's measured max
   allocated memory against `megatron-burst plan`'s estimate.
Every run's command and log tail go into the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from megatron_burst.launch.config import load_config  # noqa: E402
from megatron_burst.launch.flags import megatron_flags  # noqa: E402
from megatron_burst.launch.memory import estimate_memory  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "llama3.2-1b-128k-4gpu.yaml")
SMALL = ["--num-layers", "8", "--hidden-size", "1024", "--ffn-hidden-size", "4096",
         "--num-attention-heads", "16", "--num-query-groups", "4", "--seq-length", "16384",
         "--max-position-embeddings", "16384", "--vocab-size", "32000",
         "--untie-embeddings-and-output-weights"]
ITER = re.compile(r"iteration\s+(\d+)/\s*\d+ .*?elapsed time per iteration \(ms\): ([\d.]+)"
                  r".*?lm loss: ([\d.E+-]+)")
MEM = re.compile(r"max allocated: ([\d.]+)")


def run(name: str, nproc: int, extra: list[str], iters: int, timeout: int) -> dict:
    flags = megatron_flags(load_config(CONFIG)) + extra + ["--train-iters", str(iters)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "megatron_burst.pretrain_gpt", *flags]
    env = {**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
        log, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        log, rc = (e.stdout or b"").decode() + (e.stderr or b"").decode(), "timeout"
    iters_seen = [(int(i), float(ms), float(loss)) for i, ms, loss in ITER.findall(log)]
    mem = [float(m) for m in MEM.findall(log)]
    layout = [line for line in log.splitlines() if "context parallelism" in line][:1]
    seq = int(extra[extra.index("--seq-length") + 1]) if "--seq-length" in extra else 131072
    gbs = int(extra[extra.index("--global-batch-size") + 1])
    steady = [ms for i, ms, _ in iters_seen if i > 2]
    tokens_s = gbs * seq / (sum(steady) / len(steady) / 1e3) if steady else None
    print(f"{name}: rc={rc} {len(iters_seen)} iterations, last loss "
          f"{iters_seen[-1][2] if iters_seen else None}, tokens/s {tokens_s}, "
          f"max allocated MB {max(mem) if mem else None} ({time.time() - t0:.0f}s)", flush=True)
    return dict(name=name, gpus=nproc, rc=rc, command=" ".join(cmd), layout=layout,
                losses=[loss for _, _, loss in iters_seen],
                ms_per_iter=[ms for _, ms, _ in iters_seen], tokens_per_s=tokens_s,
                max_allocated_MiB=max(mem) if mem else None,
                error=_first_traceback(log) if rc != 0 else [])


def _first_traceback(log: str) -> list[str]:
    """The first Python traceback in a failed run's log (what the JSON keeps of it)."""
    lines = log.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Traceback")), None)
    return lines[start:start + 40] if start is not None else lines[-40:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    small = SMALL + ["--global-batch-size", "4", "--micro-batch-size", "1"]
    plans = [("cp1", 1, ["--context-parallel-size", "1"]),
             ("cp4", 4, ["--context-parallel-size", "4"]),
             # No --sequence-parallel: Megatron's torch norms (no TE/apex here) refuse it.
             ("tp2xcp2", 4, ["--context-parallel-size", "2", "--tensor-model-parallel-size", "2"])]
    runs = []
    for name, nproc, extra in plans:
        runs.append(run(name, nproc, small + extra, args.iters, 240))
        if runs[-1]["rc"] != 0:  # the same error would repeat: stop and report it
            print("\n".join(runs[-1]["error"]))
            break
    # The plan's memory estimate against the measured peak, at the config's own shape.
    cfg = load_config(CONFIG)
    est = estimate_memory(cfg)
    if runs[-1]["rc"] != 0:
        sys.exit(1)
    mem_run = run("plan-check llama3.2-1b 128K CP=4", 4,
                  ["--global-batch-size", "1", "--micro-batch-size", "1"], 3, 300)
    # Megatron's "max allocated" is the caching allocator's peak: compare it with the plan
    # less its reserve for the CUDA context, NCCL and fragmentation (not allocations).
    planned = (est.total - est.reserved) / 2**20
    measured = mem_run["max_allocated_MiB"]
    result = dict(
        device=_device(), date=time.strftime("%Y-%m-%d %H:%M:%S"),
        command=" ".join([sys.executable] + sys.argv), runs=runs,
        memory_check=dict(config=os.path.relpath(CONFIG, ROOT),
                          plan_MiB={k: v / 2**20 for k, v in est.rows()},
                          planned_allocations_MiB=planned, measured_max_allocated_MiB=measured,
                          error=None if not measured else (planned - measured) / measured,
                          run=mem_run))
    print(f"memory: planned {planned:.0f} MiB, measured {measured} MiB", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


def _device() -> str:
    import torch
    return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"


if __name__ == "__main__":
    main()
