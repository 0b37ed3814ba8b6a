"""What the area layout's deal costs the host for a new mask, with cuts between slices and without.

    python benchmarks/deal_cost.py --out benchmarks/results/cpu_issue42_deal_cost/deal_cost

No GPU, one process. Training places every micro-batch's new mask once (``shard_seq`` and
the call find it in ``mask_placement``'s cache), so the deal's host time is paid once a
micro-batch, on every rank. This times ``plan.area._dealt`` (the whole search) on new packs
of the families whose masks follow the documents, drawn as ``slice_masks.py`` draws them
(8K tokens per GPU), on 2 and 8 ranks, with ``area.BETWEEN_SLICES`` on (the package) and
off (the layout before: even chunks): the median milliseconds over the packs, each pack's
cells made before its timing (the call has them from validation). It also reports the
largest rank's share of the visible area over an even share and the share of the cuts that
cut a slice's rows, averaged over the packs.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_burst.plan import area  # noqa: E402
from ranks import ran_package, write_run  # noqa: E402
from slice_masks import new_packs  # noqa: E402

FAMILIES = ("full_document", "causal_document", "shared_question", "causal_blockwise",
            "prefix_lm_document", "block_causal_document")


def timed(world: int, masks: list, between: bool) -> dict:
    """The deal of every mask with the switch at ``between``: median ms, mean balance, mean
    share of the cuts inside slices."""
    area.BETWEEN_SLICES = between
    times, balance, cutting = [], [], []
    try:
        for mask in masks:
            total = mask.extent
            t0 = time.perf_counter()
            load, chunks = area._dealt(world, total, mask)
            times.append((time.perf_counter() - t0) * 1e3)
            balance.append(load / (mask.area / world))
            cuts = area.cut_points(chunks)
            cutting.append(float(area._cutting(mask, cuts).mean()) if len(cuts) else 1.0)
    finally:
        area.BETWEEN_SLICES = True
    return dict(ms=statistics.median(times), balance=statistics.fmean(balance),
                cutting=statistics.fmean(cutting))


def table(meta: dict, rows: list) -> str:
    head = [f"{meta['machine']}, {meta['packs']} new packs a family, 8K tokens per GPU",
            f"command: `{meta['command']}`", "",
            "| ranks | family | deal ms, cuts between slices / even chunks | balance | "
            "cuts inside slices |", "|---|---|---|---|---|"]
    for r in rows:
        on, off = r["between_slices"], r["even_chunks"]
        head.append(f"| {r['world']} | {r['family']} | {on['ms']:.2f} / {off['ms']:.2f} | "
                    f"{on['balance']:.3f} / {off['balance']:.3f} | "
                    f"{on['cutting']:.2f} / {off['cutting']:.2f} |")
    return "\n".join(head)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="path prefix: writes OUT.json and OUT.md")
    p.add_argument("--packs", type=int, default=20, help="new packs per family and world")
    p.add_argument("--worlds", default="2,8")
    args = p.parse_args()
    if args.packs < 1:
        p.error(f"--packs must be at least 1, got {args.packs}")
    worlds = args.worlds.split(",")
    if not all(w.isdigit() and int(w) > 0 for w in worlds):
        p.error(f"--worlds must be positive rank counts, comma-separated, got {args.worlds!r}")
    rows = []
    for world in map(int, worlds):
        for name in FAMILIES:
            masks = new_packs(name, 8192 * world, 1.0, args.packs)
            for mask in masks:
                mask.cells  # (made by the call's validation before any placement)
            rows.append(dict(world=world, family=name,
                             even_chunks=timed(world, masks, False),
                             between_slices=timed(world, masks, True)))
    meta = dict(machine=f"{platform.processor() or platform.machine()}, "
                        f"{os.cpu_count()} CPUs (this host)",
                packs=args.packs, package=ran_package(), command=" ".join(sys.argv))
    text = table(meta, rows)
    print(text)
    write_run(args.out, meta, rows, text)


if __name__ == "__main__":
    main()
