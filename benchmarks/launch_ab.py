"""The fused merge's direct launch against the compiled kernel's runner, in eager forwards.

    torchrun --nproc_per_node=2 benchmarks/launch_ab.py --out $OUT/launch_ab

Why: on a host-bound rank the merge's launches were a seventh of an eager forward's host
time (py-spy with native frames, NOTES twenty-second session), more than a quarter of it in the
compiled kernel's ``kernel[grid]`` runner (a closure, ``torch.cuda.current_device``,
Triton's launch metadata) rather than the launch itself. ``triton_direct._direct`` now calls
the compiled kernel's ``run`` with its handles fetched once. Two packages timed in two
processes cannot be compared here: these VMs' CPUs switch between two speeds about 2x apart
within seconds (``host_cores.py``), more than the change. So both ways run in one process,
each round timing ``--calls`` forwards back to back under each in turn (``ab_rounds``: the
order rotated), and the table gives each way's median and the median of the per-round ratios.

Exact: the 'runner' way launches the very compiled kernels the direct way adopted, and each
way's first output is compared bitwise with the first forward's.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_burst.kernels import merge, triton_direct  # noqa: E402
from ab_rounds import (eager_forward, run_families, timed_rounds,  # noqa: E402
                       two_way_forward, two_way_report)
from slice_masks import HOST_BOUND  # noqa: E402

WAYS = ("runner", "direct")


def record_compiled() -> dict:
    """From here on, each launcher ``triton_direct`` makes remembers its compiled kernel."""
    compiled_of, make = {}, triton_direct._direct

    def recording(compiled):
        launcher = make(compiled)
        if launcher is not None:
            compiled_of[id(launcher)] = compiled
        return launcher
    triton_direct._direct = recording
    return compiled_of


def tables(compiled_of: dict) -> dict:
    """Each way's launchers for the keys adopted so far: the direct ones, and the same
    compiled kernels through their runner."""
    direct = dict(merge._LAUNCHES._launchers)
    runner = {key: None if fn is None else
              (lambda grid, *args, c=compiled_of[id(fn)]: c[grid](*args))
              for key, fn in direct.items()}
    return dict(direct=direct, runner=runner)


def time_family(name: str, args, world: int, compiled_of: dict) -> dict:
    forward, first = eager_forward(name, args, world)
    ways, same = tables(compiled_of), [True]

    def setter(way):
        return lambda: setattr(merge._LAUNCHES, "_launchers", ways[way])

    def check(way):
        same[0] = same[0] and torch.equal(forward(), first)
    times = timed_rounds({w: setter(w) for w in WAYS}, {"forward": (forward, args.calls)},
                         args.rounds, check)
    merge._LAUNCHES._launchers = ways["direct"]
    return dict(family=name, adopted=sum(f is not None for f in ways["direct"].values()),
                same_bits=same[0], **two_way_forward(times))


def report(args, world: int, rows: list) -> None:
    """Rank 0: the table, printed and written with its meta (``write_run``)."""
    two_way_report(args, world, rows, ("runner", "direct"),
                   after=(("adopted keys", lambda r: r["adopted"]),
                          ("same bits", lambda r: r["same_bits"])))


def main() -> None:
    compiled_of = record_compiled()  # (a module's launcher maker wrapped: no rank needed)
    run_families(argparse.ArgumentParser(description=__doc__.split("\n")[0]), HOST_BOUND,
                 lambda name, args, world: time_family(name, args, world, compiled_of),
                 report, rounds=10, calls=30)


if __name__ == "__main__":
    main()
