"""How fast each CPU of this machine runs the host's Python, and a rank pinned to one.

    python benchmarks/host_cores.py --out $OUT/host_cores      # every CPU, twice
    torchrun --nproc_per_node=2 benchmarks/slice_masks.py --chained --pin-cores fast ...

Why: at 8K tokens per GPU an eager forward of the document families is bound by one rank's
host (``gpu_timeline.py``), and the same package's back-to-back forward moved from run to run
on one kind of machine (block-causal documents 0.54 and 0.64 of one GPU in one call,
``results/h100x2_issue42_flash_only/``). On a VM the CPUs
are not alike: a fixed piece of Python (``python_ms``: a loop of small function calls and
dict stores, the host work a forward is made of) takes its own time on each CPU. This times
it on each CPU in turn, the calling thread pinned there, and ``slice_masks.py --pin-cores``
pins each rank's main thread to the fastest (or slowest) CPUs so measured, so a table can
show how much of a forward's time is the CPU it ran on. Only the main thread is pinned: the
threads NCCL and CUDA started before keep every CPU; those started after inherit its one.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import write_run  # noqa: E402


def python_ms(reps: int = 5, loops: int = 200_000) -> float:
    """Median ms over ``reps`` of one fixed loop of Python calls and dict stores."""
    def add(a: int, b: int) -> int:
        return a + b

    times = []
    for _ in range(reps):
        table: dict = {}
        t0 = time.perf_counter()
        for i in range(loops):
            table[i & 255] = add(i, 1)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def core_speeds(cores: list[int] | None = None) -> dict[int, float]:
    """``python_ms`` on each CPU (default: every CPU this thread may use), the calling thread
    pinned to it in turn; its CPUs are given back after."""
    mine = os.sched_getaffinity(0)
    speeds = {}
    try:
        for core in sorted(mine) if cores is None else cores:
            os.sched_setaffinity(0, {core})
            speeds[core] = python_ms()
    finally:
        os.sched_setaffinity(0, mine)
    return speeds


def chosen(speeds: dict[int, float], world: int, which: str) -> list[int]:
    """One CPU per rank, rank 0 first: the ``world`` fastest (``which`` 'fast') or slowest
    ('slow') of ``speeds``."""
    if which not in ("fast", "slow"):
        raise ValueError(f"--pin-cores must be 'fast' or 'slow', got {which!r}")
    if world > len(speeds):
        raise ValueError(f"--pin-cores needs a CPU per rank: {world} ranks, {len(speeds)} CPUs")
    order = sorted(speeds, key=speeds.get, reverse=which == "slow")
    return order[:world]


def pin_main_thread(core: int) -> None:
    """This thread (the process's main one: its later threads inherit it) on ``core`` only."""
    os.sched_setaffinity(0, {core})


def pin_ranks(which: str, rank: int, world: int, from_rank0: Callable[[Any], Any]) -> dict:
    """Each rank's main thread on its CPU of ``chosen(which)``, from rank 0's ``core_speeds``
    (the other ranks wait meanwhile; one node: the ranks share its CPUs). ``from_rank0``:
    the caller's broadcast of rank 0's value to every rank. Returns what was pinned, for the
    run's record."""
    speeds = from_rank0(core_speeds() if rank == 0 else None)
    cores = chosen(speeds, world, which)
    pin_main_thread(cores[rank])
    return dict(which=which, cores=cores, ms=[speeds[c] for c in cores], every_cpu_ms=speeds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="path prefix: writes OUT.json and OUT.md")
    args = p.parse_args()
    first, again = core_speeds(), core_speeds()
    rows = [dict(cpu=c, ms=first[c], ms_again=again[c]) for c in first]
    meta = dict(cpus=len(rows), date=datetime.date.today().isoformat(),
                command=" ".join(sys.argv), loop="python_ms(): 200,000 calls, median of 5")
    lines = [f"{meta['cpus']} CPUs, {meta['date']}, command: `{meta['command']}`", "",
             "| CPU | ms | ms again |", "|---|---|---|"]
    lines += [f"| {r['cpu']} | {r['ms']:.1f} | {r['ms_again']:.1f} |" for r in rows]
    ms = sorted(first.values())
    lines += ["", f"fastest {ms[0]:.1f} ms, median {statistics.median(ms):.1f}, "
                  f"slowest {ms[-1]:.1f} ({ms[-1] / ms[0]:.2f}x)"]
    text = "\n".join(lines)
    print(text)
    write_run(args.out, meta, rows, text)


if __name__ == "__main__":
    main()
