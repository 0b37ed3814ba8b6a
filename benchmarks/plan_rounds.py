"""How many steps and messages a mask's forward takes on each rank, by the planner alone (CPU).

    python benchmarks/plan_rounds.py --world 4 8 \
        --out benchmarks/results/cpu_issue42_two_way/rounds.json

No GPU, no communication: ``call_plan.build_plan`` on LongCA-bench's families as
``benchmarks/slice_masks.py`` builds them (8K tokens per rank, layout ``area``), and plain
``window_size`` calls (a model's window layers, layouts zigzag and contiguous): the forward's
ring steps (each waits for the hop before it), the messages each rank sends and the rows they
carry, and whether a round goes the other way round the ring (``ring_rounds``). A
two-sided window on 4+ ranks went round the whole ring, its far edge relayed by every rank.
Run it with each package on ``PYTHONPATH`` to compare two trees: ``meta.package`` names the
one it imported.
"""
from __future__ import annotations

import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ring_rows import planner_main  # noqa: E402
from slice_masks import knobs, pile_like  # noqa: E402

from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key  # noqa: E402
from megatron_burst.plan import mask_families as mf  # noqa: E402
from megatron_burst.plan.schedule import Mask  # noqa: E402


# A plain window_size call (no mask), as a model's window layers make it: (layout, window).
WINDOWS = {"window (1024, 0) zigzag": ("zigzag", (1024, 0)),
           "window (1024, 1024) zigzag": ("zigzag", (1024, 1024)),
           "window (1024, 1024) contiguous": ("contiguous", (1024, 1024))}


def rounds_of(name: str, world: int, per_rank: int) -> dict:
    """Each rank's forward steps, messages sent and rows sent for ``name`` on ``world``."""
    total = world * per_rank
    if name in WINDOWS:
        layout, window = WINDOWS[name]
        window = tuple(round(w * per_rank / 8192) for w in window)
        mask = Mask(window[1] == 0, window)
    else:
        layout = "area"
        mask = mf.family(name, pile_like(total, seed=zlib.crc32(name.encode())),
                         **knobs(total, per_rank / 8192))
    steps, messages, rows, back = [], [], [], False
    for me in range(world):
        plan = build_plan(plan_key(layout, world, (total,), mask, 1,
                                   RingKey(tuple(range(world)), me, None), "burst"))
        hops = [h for step in plan.forward.steps for h in step.hops]
        steps.append(len(plan.forward.steps))
        messages.append(sum(1 for h in hops if h.n_send))
        rows.append(sum(h.n_send for h in hops))
        back = back or any(h.kind == "back" for h in hops)
    return {"family": name, "world": world, "rows_per_rank": per_rank, "steps": steps,
            "messages": messages, "rows_sent": rows, "two_way": back}


def main() -> None:
    planner_main(__doc__, "benchmarks/plan_rounds.py", rounds_of,
                 ["family", "ranks", "forward steps (most)", "messages sent, each rank",
                  "rows sent (most)", "two rounds"],
                 lambda r: [r["family"], r["world"], max(r["steps"]),
                            " / ".join(map(str, r["messages"])), max(r["rows_sent"]),
                            "yes" if r["two_way"] else "-"], tuple(WINDOWS))


if __name__ == "__main__":
    main()
