"""How many kernel calls a mask's forward makes on each rank, by the planner alone (CPU).

    python benchmarks/plan_calls.py --out benchmarks/results/cpu_issue42_band_union/calls.json

No GPU, no communication: ``call_plan.build_plan`` on LongCA-bench's families as
``benchmarks/slice_masks.py`` builds them (8K tokens per rank, layout ``area``), on 2 and 4
ranks: each rank's forward kernel calls, step by step, and the busiest rank's. At 8K tokens
a GPU a window's forward is short (2-3 ms on 2x H200) and every call is a launch the host
makes and the GPU waits between; the eager forward of the window families runs at 0.45-0.58
of one GPU where CUDA graphs, which remove the host's part, reach 0.66-0.84
(``results/h200x2_issue42_flex_cp/``). Run it with each package on ``PYTHONPATH`` to compare
two trees: ``meta.package`` names the one it imported.
"""
from __future__ import annotations

import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ring_rows import planner_main  # noqa: E402
from slice_masks import knobs, pile_like  # noqa: E402

from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key  # noqa: E402
from megatron_burst.kernels.selection import VARLEN_DENSE_MIN_AREA  # noqa: E402
from megatron_burst.plan import mask_families as mf  # noqa: E402


def calls_of(name: str, world: int, per_rank: int) -> dict:
    """Each rank's forward kernel calls per step for ``name`` on ``world`` ranks."""
    total = world * per_rank
    mask = mf.family(name, pile_like(total, seed=zlib.crc32(name.encode())),
                     **knobs(total, per_rank / 8192))
    ranks = []
    for me in range(world):
        plan = build_plan(plan_key("area", world, (total,), mask, 1,
                                   RingKey(tuple(range(world)), me, None), "burst",
                                   dense_min_area=VARLEN_DENSE_MIN_AREA))
        ranks.append([len(step.calls) for step in plan.forward.steps])
    return {"family": name, "world": world, "rows_per_rank": per_rank, "calls": ranks,
            "busiest": max(sum(r) for r in ranks)}


def main() -> None:
    planner_main(__doc__, "benchmarks/plan_calls.py", calls_of,
                 ["family", "ranks", "forward calls, each rank by step", "busiest rank"],
                 lambda r: [r["family"], r["world"],
                            " / ".join("+".join(map(str, c)) for c in r["calls"]),
                            r["busiest"]])


if __name__ == "__main__":
    main()
