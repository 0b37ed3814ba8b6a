"""``host_parts.py`` runs of two packages side by side, each run's host time measured
against a part neither package changed.

    python benchmarks/host_parts_compare.py before=A.json after=B.json [before=C.json ...]

Why: on the 2x H100 hosts the host's speed moves between processes by up to 2x (every
part of a run slower together: ``results/h100x2_issue42_host_trims``), more than a change
of the package's host path moves it, so runs of two packages cannot be compared in
milliseconds. The kernel calls (``forward_partial``: the attention kernels' launches and
their gathers) were not changed by the trims compared there, so each run's host time a
forward (back to back, rank 0) is also given as a multiple of its own kernel calls' time,
and the merge launches' as a fraction of it. Prints a markdown table; labels repeat for
repeated runs of one package.
"""
from __future__ import annotations

import json
import sys


def rows(runs: list[tuple[str, dict]]) -> list[dict]:
    """One row per (family, run): rank 0's back-to-back host, kernel calls, merges, and
    ratios (runs before ``host_parts.py`` gave every rank have rank 0's rows alone)."""
    out = []
    for label, run in runs:
        for r in run["rows"]:
            if r.get("rank", 0) != 0:
                continue
            b2b = r["back_to_back"]
            kernels = b2b["parts_ms"]["kernel calls"]
            out.append(dict(family=r["family"], run=label, host_ms=b2b["host_ms"],
                            kernel_ms=kernels, merge_ms=b2b["parts_ms"]["merge launches"],
                            host_per_kernel=b2b["host_ms"] / kernels,
                            merge_per_kernel=b2b["parts_ms"]["merge launches"] / kernels))
    return sorted(out, key=lambda r: r["family"])


def table(found: list[dict]) -> str:
    lines = ["| family | run | host ms | kernel calls ms | merge launches ms | host / kernel "
             "calls | merges / kernel calls |", "|---|---|---|---|---|---|---|"]
    for r in found:
        lines.append(f"| {r['family']} | {r['run']} | {r['host_ms']:.3f} | "
                     f"{r['kernel_ms']:.3f} | {r['merge_ms']:.3f} | "
                     f"{r['host_per_kernel']:.2f} | {r['merge_per_kernel']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    runs = []
    for arg in argv:
        label, _, path = arg.partition("=")
        if not path:
            raise SystemExit(f"host_parts_compare: give LABEL=PATH, got {arg!r}")
        with open(path) as f:
            runs.append((label, json.load(f)))
    print(table(rows(runs)))


if __name__ == "__main__":
    main(sys.argv[1:])
