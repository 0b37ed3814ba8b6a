"""The host's time to launch the fused merge: through Triton's binding, and directly.

    python benchmarks/merge_launch.py --out $OUT/merge_launch      (one GPU)

Why: an eager slice-mask forward launches the merge a few times a call, and where the host
is slower than the GPUs the forward waits on it (``host_parts.py``, ``gpu_timeline.py``).
``kernel[grid](*args)`` binds and specialises all 18 arguments in Python on each call;
``kernels.triton_direct`` launches the compiled kernel Triton returned, through its own
launcher, once it was checked against Triton's. For the merges a ring's forward makes (a
[1, rows, 64, 128] view at a row offset, bf16 partials into bf16 and fp32 homes), this
times each way's host microseconds a launch (a loop of launches, timed until the last one
returned; the GPU work of each is shorter than its launch, so the queue never fills) and
checks that both give the same bits. Prints a table, writes ``OUT``.json and ``OUT``.md.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch

from megatron_burst.kernels import merge

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import ran_package, write_run  # noqa: E402

HEADS, DIM = 64, 128


def host_us(launch, iters: int) -> float:
    """Median over 5 rounds of the host's microseconds a launch, ``iters`` launches a round."""
    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            launch()
        rounds.append((time.perf_counter() - t0) / iters * 1e6)
    torch.cuda.synchronize()
    return sorted(rounds)[2]


def row(acc: torch.dtype, rows: int, iters: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(rows)
    out = torch.randn(1, rows + 16, HEADS, DIM, device="cuda", generator=gen).to(acc)[:, 16:]
    lse = torch.randn(1, HEADS, rows + 16, device="cuda", generator=gen)[:, :, 16:]
    blk = torch.randn(1, rows, HEADS, DIM, device="cuda", generator=gen, dtype=torch.bfloat16)
    blse = torch.randn(1, HEADS, rows, device="cuda", generator=gen)
    direct = merge._LAUNCHES

    def launch():
        merge._launch(out, lse, blk, blse)

    def tritons_own():
        with merge.tritons_own_launch():
            launch()

    results = []
    for way in (tritons_own, launch):  # same bits both ways, from the same start
        start = (out.clone(), lse.clone())
        way()
        way()
        results.append((out.clone(), lse.clone()))
        out.copy_(start[0])
        lse.copy_(start[1])
    same = all(torch.equal(a, b) for a, b in zip(*results))
    key = merge._direct_key(out, lse, blk, blse, (rows,), merge.ROW_ALIGN,
                            max(16, 4096 // DIM), 4, False)
    with merge.tritons_own_launch():  # (one launcher for the whole timing)
        tritons_us = host_us(launch, iters)
    return dict(home=str(acc).replace("torch.", ""), rows=rows, same_bits=same,
                adopted=bool(key is not None and direct.adopted(key)),
                tritons_us=tritons_us, direct_us=host_us(launch, iters))


def table(meta: dict, rows: list[dict]) -> str:
    lines = [f"{meta['device']}, torch {meta['torch']}, triton {meta['triton']}, "
             f"{meta['date']}", f"command: `{meta['command']}`", "",
             "| home | rows | Triton's launch us | direct us | adopted | same bits |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['home']} | {r['rows']} | {r['tritons_us']:.1f} | "
                     f"{r['direct_us']:.1f} | {r['adopted']} | {r['same_bits']} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output path without extension")
    p.add_argument("--iters", type=int, default=400)
    args = p.parse_args()
    import triton

    rows = [row(acc, n, args.iters) for acc in (torch.bfloat16, torch.float32)
            for n in (64, 256)]
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, date=str(datetime.date.today()),
                package=ran_package(),
                command="benchmarks/merge_launch.py " + " ".join(sys.argv[1:]))
    text = table(meta, rows)
    print(text)
    write_run(args.out, meta, rows, text)


if __name__ == "__main__":
    main()
