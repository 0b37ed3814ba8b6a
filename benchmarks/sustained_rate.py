"""Does the local kernel's rate depend on how long the GPU has been busy? (issue 41)

    torchrun --nproc_per_node=1 benchmarks/sustained_rate.py --out DIR

The first use of 'auto' times the kernel in short bursts (one warm-up, three runs); the
benchmarks time it for minutes. On one GPU, bf16, causal, 32:32 and 32:8 heads, d 128, at
8K, 16K and 32K tokens: the fwd+bwd TFLOP/s of the selected kernel as ``measure.timed`` gives
it after the GPU sat idle for 2 s, then after 1 s and after 5 s of back-to-back calls, with
the SM clock (``torch.cuda.clock_rate``) and the power draw read at each point.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from megatron_burst.attention.measure import timed
from megatron_burst.kernels.selection import select_kernel
from megatron_burst.plan.schedule import Block

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import ran_package, start_ranks  # noqa: E402


def step_of(n: int, hq: int, hkv: int, dev):
    gen = torch.Generator(device=dev).manual_seed(n)
    q, do = (torch.randn(1, n, hq, 128, device=dev, dtype=torch.bfloat16, generator=gen)
             for _ in range(2))
    k, v = (torch.randn(1, n, hkv, 128, device=dev, dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    kern, blk = select_kernel(q, k), Block(0, n, 0, n, "causal")

    def step():
        out, lse = kern.forward(q, k, v, blk, 128 ** -0.5)
        kern.backward(do, q, k, v, out, lse, blk, 128 ** -0.5)
    return step, 3.5 * 4 * n * n / 2 * hq * 128


def busy_for(step, seconds: float) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        torch.cuda.synchronize()


def _read(fn) -> float | None:
    try:  # needs pynvml (or amdsmi): absent, the column is empty
        return fn(0)
    except Exception:  # noqa: BLE001
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    start_ranks()  # measure.timed keeps ranks in step with a barrier
    dev = torch.device("cuda", torch.cuda.current_device())
    rows = []
    for hq, hkv in ((32, 32), (32, 8)):
        for n in (8192, 16384, 32768):
            step, flops = step_of(n, hq, hkv, dev)
            for state, busy in (("after 2 s idle", 0.0), ("after 1 s busy", 1.0),
                                ("after 5 s busy", 5.0)):
                if busy:
                    busy_for(step, busy)
                else:
                    step()
                    torch.cuda.synchronize()
                    time.sleep(2.0)
                s = timed(step, dev, 3)
                rows.append(dict(heads=f"{hq}:{hkv}", tokens=n, state=state,
                                 tflops=flops / s / 1e12, ms=s * 1e3,
                                 sm_mhz=_read(torch.cuda.clock_rate),
                                 milliwatts=_read(torch.cuda.power_draw)))
                print(rows[-1], flush=True)
    os.makedirs(args.out, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__,
                package=ran_package(),
                command=f"torchrun --nproc_per_node=1 benchmarks/sustained_rate.py --out {args.out}",
                date=time.strftime("%Y-%m-%d %H:%M:%S"))
    with open(os.path.join(args.out, "sustained_rate.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
