"""The forward's varlen calls read in place against packed first, in eager forwards.

    torchrun --nproc_per_node=2 benchmarks/in_place_ab.py --out $OUT/in_place_ab

Why: a varlen call whose blocks' rows are not one run a side gathered them back to back
before the kernel (a cat of narrows per tensor: block-causal documents' step 0 on 2x H200 is
16 host ops and a copy of most of Q). Read in place (``varlen.InPlaceBounds``: flash's
``seqused_k``, rows between blocks as sequences of no keys) it is the kernel's launch alone.
Both ways run in one process (``ab_rounds``); a way sets ``varlen_in_place`` on the automatic
kernel, which the probe admitted (``kernels.in_place``; the column says whether it did).
No plan changes between the ways. Each way's output is compared with the packed first
forward's: the kernel's tiles may split the keys otherwise with more sequences, so the
difference is reported, not required to be zero.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_burst.kernels import selection  # noqa: E402
from ab_rounds import (eager_forward, run_families, timed_rounds,  # noqa: E402
                       two_way_forward, two_way_report)

WAYS = ("packed", "in place")
# The families whose plans have a varlen call of several runs at 8K tokens a GPU on 2 ranks.
IN_PLACE_FAMILIES = "block_causal_document,causal_blockwise,shared_question,causal_document"


ADMITTED: dict[tuple, bool] = {}  # an automatic kernel's key -> whether its probe admitted it


def dispatches() -> dict:
    """The automatic kernels made so far, by their key in ``selection``'s cache (a value:
    the head shape, dtype and device), which the ways switch."""
    return {key: k for key, k in selection._CHECKED.items()
            if isinstance(k, selection.BandDispatch)}


def set_way(way: str) -> None:
    """Every automatic kernel reads in place under way 'in place' where its probe admitted
    it (what the probe said is kept the first time a way is set), and packs otherwise."""
    for key, k in dispatches().items():
        ADMITTED.setdefault(key, k.varlen_in_place)
        k.varlen_in_place = way == "in place" and ADMITTED[key]


def time_family(name: str, args, world: int) -> dict:
    forward, _ = eager_forward(name, args, world)  # (the kernel is chosen and probed here)
    set_way("packed")
    first = forward()
    diff = {w: 0.0 for w in WAYS}

    def check(way):
        got = forward().float()
        diff[way] = max(diff[way], (got - first.float()).abs().max().item())
    ways = {w: (lambda w=w: set_way(w)) for w in WAYS}
    times = timed_rounds(ways, {"forward": (forward, args.calls)}, args.rounds, check)
    set_way("in place")
    return dict(family=name, admitted=any(ADMITTED.values()), diff=diff,
                **two_way_forward(times))


def report(args, world: int, rows: list) -> None:
    """Rank 0: the table, printed and written with its meta (``write_run``)."""
    two_way_report(args, world, rows, ("packed", "in place"),
                   before=(("admitted", lambda r: r["admitted"]),),
                   after=(("max diff to packed's first",
                           lambda r: f"{r['diff']['in place']:.1e}"),))


def main() -> None:
    run_families(argparse.ArgumentParser(description=__doc__.split("\n")[0]), IN_PLACE_FAMILIES,
                 time_family, report)


if __name__ == "__main__":
    main()
