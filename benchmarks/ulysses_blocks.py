"""Blocks a Ulysses group computes in one pass (CPU, the plan only): a causal sequence in
the zigzag layout, 1,024 tokens a rank, member 0's blocks over every step of the ring.

    PYTHONPATH=TREE python benchmarks/ulysses_blocks.py

Each block is a kernel call of the pass, and every block past the first a merge of partial
outputs (forward) and gradient accumulations (backward). Run on two trees (``PYTHONPATH``)
it shows what holding the group's rows in position order (``RingSchedule.member_runs``)
changed; the package it imported is printed first.
"""
from __future__ import annotations

import os

import megatron_burst
from megatron_burst.plan.schedule import Mask, RingSchedule

CASES = ((2, 2), (4, 4), (8, 8), (4, 2), (8, 4), (8, 2))


def main() -> None:
    print(f"package: {os.path.dirname(os.path.abspath(megatron_burst.__file__))}\n")
    print("| ranks | Ulysses | ring | blocks a pass (member 0) |\n|---|---|---|---|")
    for world, u in CASES:
        sched = RingSchedule.of("zigzag", world, (1024 * world,), Mask(True, (-1, -1)), u)
        ring = world // u
        blocks = sum(len(sched.blocks(0, k)) for k in range(ring))
        print(f"| {world} | {u} | {ring} | {blocks} |")


if __name__ == "__main__":
    main()
