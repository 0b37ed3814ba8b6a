"""The ring's forward folding through the fused Triton kernel on CPU ranks, under Triton's
interpreter: ``merge.fold_rows``'s row offsets, the first writes, rows kept apart in fp32
(``home_output.WideRows``) and half-precision homes, as on a GPU. Run by
``tests/test_merge_interpreted.py`` as ``TRITON_INTERPRET=1 python -m
tests.fused_ring_interpreted`` (its gloo ranks inherit the variable); one line per case.

Each case of ``tests/test_wide_rows.py`` on 2 and 3 ranks, both backwards: out and every
gradient within bf16 accuracy of float64, with the rows kept apart (on some rank) and with
the whole home in fp32, and the kernel launched on every rank (a test that ran the torch
merge instead would prove nothing)."""
from __future__ import annotations

import os

from .distributed import run_ranks
from .test_wide_rows import CASES, _worker, check_against_whole_and_float64


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("tests.fused_ring_interpreted: run with TRITON_INTERPRET=1")
    for i, (name, lens, world) in enumerate(CASES):
        backward = ("ring", "burst")[i % 2]
        results = run_ranks(world, _worker, name, lens, backward, False, True, timeout=600)
        check_against_whole_and_float64(results, name, lens, world, same_bits=False)
        print(f"{name}/{world}/{backward}: ok", flush=True)


if __name__ == "__main__":
    main()
