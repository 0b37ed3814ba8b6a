"""Step 0's home joined from its pieces against written run by run, in eager forwards.

    torchrun --nproc_per_node=2 benchmarks/pieces_ab.py --out $OUT/pieces_ab

Why: where a forward's step 0 writes every row's first partial in several runs (block-causal
documents at 8K tokens a GPU: three cuDNN calls and a varlen call of three runs on each
rank), each run was one launch of the fused merge's write, about 30 us of host a launch on
a host-bound rank (``native_profile.py``). ``home_output.pieces_home`` joins the runs into
the home with one copy for out and one for lse (``first_writes.PIECES_MIN`` runs or more).
Both ways run in one process (``ab_rounds``); a way is set by ``PIECES_MIN`` (10**9: every
run written, as before) with the plans and prepared calls dropped, so the next call plans
again (a first run that dropped the plans alone timed one way twice: the prepared call
holds its plan). The outputs
must be the first forward's bit for bit: both ways copy the same partials.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_burst.attention import call_plan, first_writes, prepare  # noqa: E402
from ab_rounds import (eager_forward, run_families, timed_rounds,  # noqa: E402
                       two_way_forward, two_way_report)
from slice_masks import HOST_BOUND  # noqa: E402

WAYS = {"written": 10 ** 9, "joined": first_writes.PIECES_MIN}


def set_way(minimum: int) -> None:
    """Plans from here on join step 0 from ``minimum`` runs: the plans and the prepared
    calls that hold them dropped, so the next call plans again."""
    first_writes.PIECES_MIN = minimum
    call_plan.clear()
    prepare.PREPARED.clear()


def time_family(name: str, args, world: int) -> dict:
    set_way(WAYS["written"])
    forward, first = eager_forward(name, args, world)
    same, joined = [True], []

    def check(way):
        same[0] = same[0] and torch.equal(forward(), first)
        joined.append(any(p.forward.home_pieces for p in call_plan._PLANS.values()))
    ways = {w: (lambda m=m: set_way(m)) for w, m in WAYS.items()}
    times = timed_rounds(ways, {"forward": (forward, args.calls)}, args.rounds, check)
    set_way(WAYS["joined"])
    return dict(family=name, same_bits=same[0], joins=any(joined), **two_way_forward(times))


def report(args, world: int, rows: list) -> None:
    """Rank 0: the table, printed and written with its meta (``write_run``)."""
    two_way_report(args, world, rows, ("written", "joined"),
                   before=(("joins", lambda r: r["joins"]),),
                   after=(("same bits", lambda r: r["same_bits"]),))


def main() -> None:
    run_families(argparse.ArgumentParser(description=__doc__.split("\n")[0]), HOST_BOUND,
                 time_family, report)


if __name__ == "__main__":
    main()
