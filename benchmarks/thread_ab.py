"""Where each rank's threads run, timed placement against placement in one process.

    torchrun --nproc_per_node=2 benchmarks/thread_ab.py --out $OUT/thread_ab

Why: at 8K tokens per GPU one rank's host bounds the eager forward of the many-slice
families, and on the lent VMs a CPU runs the host's Python at one speed or about half it
(``host_cores.py``). Pinning each rank's main thread to the CPUs fastest at the start helped
(README, issue 42), but the threads NCCL and CUDA start (NCCL's proxy polls while a message
is in flight) may share the main thread's CPU or its SMT sibling. Ways, set on every thread
of every rank between rounds (``ab_rounds``):

- ``free``: every thread may run on every CPU (a plain ``torchrun``);
- ``main``: each rank's main thread on a CPU of its own, the other threads free;
- ``alone``: as ``main``, and every other thread of every rank kept off the main threads'
  CPUs and their SMT siblings (what ``srun --cpu-bind`` with a core per rank's main thread
  and ``--hint=nomultithread`` give on a cluster);
- ``busy``: as ``free``, with a process spinning on each of the node's last ``SPINNERS``
  CPUs (started by rank 0): a diagnosis, not a setting. On these VMs a lone busy CPU ran
  the host's Python about 2x faster with a spinner on some other CPUs
  (``host_neighbours.py``); this asks whether an eager forward does too.

A rank's main CPU is the first CPU of the physical core ``rank + 1`` (core 0 takes most
interrupts), from ``/sys/devices/system/cpu``. Each way's output is the first forward's, bit
for bit: placement changes no kernel.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_rounds import (add_ab_args, eager_forward, gather_rows, parse_counts,  # noqa: E402
                       publish, run_meta, summary, timed_rounds)
from ranks import start_ranks  # noqa: E402
from slice_masks import HOST_BOUND, add_shape_args  # noqa: E402

WAYS = ("free", "main", "alone", "busy")
SPINNERS = 8
# Spins on its CPU until its parent is gone (a rank that dies leaves no spinner behind).
SPIN = ("import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nparent = os.getppid()\n"
        "while os.getppid() == parent:\n    pass\n")
_SPINNING: list = []
SETTLE_S = 0.5  # seconds for the spinners to start


def physical_cores() -> list[list[int]]:
    """This process's CPUs grouped by physical core (SMT siblings together), in order."""
    groups: dict[tuple, list[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        top = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        with open(f"{top}/physical_package_id") as a, open(f"{top}/core_id") as b:
            groups.setdefault((a.read().strip(), b.read().strip()), []).append(cpu)
    return sorted(groups.values())


def placements(world: int, rank: int) -> tuple[int, set[int], set[int]]:
    """(this rank's main CPU, every CPU, the CPUs the other threads leave in ``alone``)."""
    cores = physical_cores()
    if len(cores) < world + 2:
        raise ValueError(f"thread_ab: {world} ranks need {world + 2} physical cores, "
                         f"this machine shows {len(cores)}")
    every = {c for core in cores for c in core}
    mains = [cores[r + 1] for r in range(world)]
    return mains[rank][0], every, {c for core in mains for c in core}


def spin(on: bool, cpus: list[int]) -> None:
    """Start a spinning process on each of ``cpus`` (none running yet), or stop them."""
    while _SPINNING and not on:
        proc = _SPINNING.pop()
        proc.kill()
        proc.wait()
    if on and not _SPINNING:
        _SPINNING.extend(subprocess.Popen([sys.executable, "-c", SPIN, str(c)]) for c in cpus)
        # Their interpreters start outside the timed stretch: a first run of this way timed
        # 8 Python startups with it (1.0-1.4x; results/h200x2_issue42_host_placement/).
        time.sleep(SETTLE_S)


def place(way: str, main_cpu: int, every: set[int], reserved: set[int],
          spinning: list[int] = ()) -> None:
    """Set every thread of this process for ``way`` (see the module docstring);
    ``spinning``: the CPUs this rank spins on in ``busy`` (rank 0's; none elsewhere)."""
    spin(way == "busy", list(spinning))
    main = os.getpid()  # the main thread's id is the process's
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        if tid == main:
            cpus = every if way in ("free", "busy") else {main_cpu}
        else:
            cpus = every - reserved if way == "alone" else every
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            pass


def time_family(name: str, args, world: int, rank: int) -> dict:
    forward, first = eager_forward(name, args, world)
    main_cpu, every, reserved = placements(world, rank)
    spinning = sorted(every - reserved)[-SPINNERS:] if rank == 0 else []
    same = [True]

    def check(way):
        same[0] = same[0] and torch.equal(forward(), first)
    ways = {w: (lambda w=w: place(w, main_cpu, every, reserved, spinning)) for w in WAYS}
    times = timed_rounds(ways, {"forward": (forward, args.calls)}, args.rounds, check)
    place("free", main_cpu, every, reserved)
    med = summary(times)
    return dict(family=name, rank=rank, main_cpu=main_cpu, reserved=sorted(reserved),
                threads=len(os.listdir("/proc/self/task")), same_bits=same[0],
                ms={w: med[w]["forward"]["ms"] for w in WAYS},
                ratio={w: med[w]["forward"]["ratio"] for w in WAYS},
                times={w: times[w]["forward"] for w in WAYS})


def report(args, world: int, rows: list) -> None:
    """Rank 0: the table, printed and written with its meta (``write_run``)."""
    meta = run_meta(args, world, cores=physical_cores())
    header = ("family", "rank", "main CPU", "threads", *(f"{w} ms" for w in WAYS),
              *(f"{w} / free" for w in WAYS[1:]), "same bits")
    publish(args.out, meta, world, header, [
        (r["family"], r["rank"], r["main_cpu"], r["threads"],
         *(f"{r['ms'][w]:.3f}" for w in WAYS), *(f"{r['ratio'][w]:.3f}" for w in WAYS[1:]),
         r["same_bits"]) for r in sorted(rows, key=lambda r: (r["family"], r["rank"]))], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_ab_args(p, rounds=20, calls=15)
    add_shape_args(p, HOST_BOUND)
    args = parse_counts(p)
    rank, world = start_ranks()  # (this rank's placement needs its rank: its own main)
    mine = [time_family(name, args, world, rank) for name in args.families.split(",")]
    gather_rows(mine, world, rank, lambda rows: report(args, world, rows))


if __name__ == "__main__":
    main()
