"""What planning a slice mask costs the host, on CPU: ``build_plan`` per LongCA-bench family.

    python benchmarks/slice_plan_cpu.py --out benchmarks/results/cpu_slice_plans/after
    PYTHONPATH=OLD python benchmarks/slice_plan_cpu.py --out .../before   # another checkout

No GPU, no communication: the plan of ranks 0 and 1 (their schedule, ring rounds, hops and
kernel calls, ``attention.call_plan.build_plan``) of each family of ``slice_masks.py`` (the
same masks: 8K tokens per rank, the 'area' layout, the 'ring' backward) on 2 and 8 ranks,
milliseconds, the best of ``--repeat`` builds. A mask that follows the data (documents) is
planned at every micro-batch, once for all layers; a fixed one once a run. The JSON records
which package it imported.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import ran_package, write_run  # noqa: E402
from slice_masks import family_mask  # noqa: E402

from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key  # noqa: E402
from megatron_burst.plan import mask_families as mf  # noqa: E402


def plan_ms(name: str, world: int, rank: int, tokens: int, repeat: int) -> float:
    """The best of ``repeat`` builds of ``rank``'s plan of family ``name``, ms, each from a
    new mask object (its cells made inside the build, as a new micro-batch's are)."""
    best = float("inf")
    for _ in range(repeat):
        mask = family_mask(name, tokens * world)
        key = plan_key("area", world, (tokens * world,), mask, 1,
                       RingKey(tuple(range(world)), rank, None), "ring")
        t0 = time.perf_counter()
        build_plan(key)
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="path prefix: writes OUT.json and OUT.md")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per rank")
    p.add_argument("--worlds", default="2,8")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    rows = [dict(family=name, world=world, rank0_ms=plan_ms(name, world, 0, args.tokens,
                                                            args.repeat),
                 rank1_ms=plan_ms(name, world, 1, args.tokens, args.repeat))
            for world in map(int, args.worlds.split(",")) for name in mf.FAMILIES]
    meta = dict(package=ran_package(), tokens_per_rank=args.tokens, repeat=args.repeat,
                machine=platform.processor() or platform.machine(), cpus=os.cpu_count(),
                date=datetime.date.today().isoformat(), command=" ".join(sys.argv))
    lines = [f"{meta['date']}, {meta['cpus']} CPUs, package {meta['package']}",
             f"command: `{meta['command']}`", "",
             "| family | ranks | plan ms, rank 0 / rank 1 |", "|---|---|---|"]
    lines += [f"| {r['family']} | {r['world']} | {r['rank0_ms']:.1f} / {r['rank1_ms']:.1f} |"
              for r in rows]
    text = "\n".join(lines)
    print(text)
    write_run(args.out, meta, rows, text)


if __name__ == "__main__":
    main()
