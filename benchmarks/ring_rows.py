"""How many K/V rows a mask's forward ring sends against how many its receivers use (CPU).

    python benchmarks/ring_rows.py --out benchmarks/results/cpu_issue42_row_spans/ring_rows.json

No GPU, no communication: the planner alone (``call_plan.build_plan``) on LongCA-bench's
families as ``benchmarks/slice_masks.py`` builds them (8K tokens per rank, layout ``area``).
For every rank it adds up the K/V rows its forward receives (the hops' ``n_recv``: a hop
carries the rows of the sender's shard that its receiver and later holders use, as runs,
``RingSchedule.needed_runs``) and the distinct rows its blocks read from the other ranks'
shards. On 2 ranks a hop carries exactly what the receiver reads; on more, a hop also
relays rows that only a later holder reads. Before runs (``results/cpu_issue42_row_spans/``)
a hop carried one span, so where two holders read the two ends of a shard, it carried the
shard between; before spans (``results/cpu_issue42_ring_rows/``) the sender's leading rows
up to the last one used, so a receiver reading the end of a shard got all of it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import zlib
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slice_masks import knobs, pile_like  # noqa: E402

from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key  # noqa: E402
from megatron_burst.kernels.selection import VARLEN_DENSE_MIN_AREA  # noqa: E402
from megatron_burst.plan import mask_families as mf  # noqa: E402


def rows_of(name: str, world: int, per_rank: int) -> dict:
    total = world * per_rank
    lens = pile_like(total, seed=zlib.crc32(name.encode()))
    mask = mf.family(name, lens, **knobs(total, per_rank / 8192))
    sent = used = 0
    for me in range(world):
        plan = build_plan(plan_key("area", world, (total,), mask, 1,
                                   RingKey(tuple(range(world)), me, None), "burst",
                                   dense_min_area=VARLEN_DENSE_MIN_AREA))
        sent += sum(h.n_recv for step in plan.forward.steps for h in step.hops)
        for other in range(world):
            if other != me:
                read = set()
                for b in plan.sched.split_blocks(me, other):
                    read.update(range(b.k_start, b.k_stop))
                used += len(read)
    return {"family": name, "world": world, "rows_per_rank": per_rank,
            "kv_rows_received": sent, "kv_rows_read": used,
            "received_over_read": round(sent / used, 2) if used else None}


def main() -> None:
    planner_main(__doc__, "benchmarks/ring_rows.py", rows_of,
                 ["family", "ranks", "K/V rows received", "rows read", "received / read"],
                 lambda r: [r["family"], r["world"], r["kv_rows_received"], r["kv_rows_read"],
                            r["received_over_read"]])


def planner_main(doc: str, script: str, row_of: Callable[[str, int, int], dict],
                 header: list[str], cells: Callable[[dict], list],
                 names: tuple[str, ...] = ()) -> None:
    """The planner benchmarks' command line (``--world``, ``--per-rank``, ``--out``): a row
    per family and world (``row_of(family, world, rows per rank)``; ``names``: more rows
    after the families, which ``row_of`` knows), printed as a table (``header``; ``cells``:
    a row's) and written to OUT (JSON: the rows, and a meta naming the package and the
    command) and OUT's .md (the table)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--world", type=int, nargs="+", default=[2, 4])
    p.add_argument("--per-rank", type=int, default=8192)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    rows = [row_of(name, w, a.per_rank) for w in a.world for name in (*mf.FAMILIES, *names)]
    import megatron_burst

    package = os.path.dirname(os.path.abspath(megatron_burst.__file__))
    lines = [f"package: {package}", "", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in cells(r)) + " |" for r in rows]
    print("\n".join(lines))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"meta": {"device": "CPU (the planner only)", "package": package,
                            "command": "python " + " ".join([script, *sys.argv[1:]])},
                   "rows": rows}, f, indent=1)
    with open(os.path.splitext(a.out)[0] + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
