"""Hops of one span against hops that carry runs, on GPUs: the README's table.

    python benchmarks/runs_table.py benchmarks/results/gpu_issue42_runs/h200x4

Reads what ``benchmarks/run_gpu_runs.sh`` wrote in one machine session (``nvlink_before``,
``nvlink_after``, ``nvlink_before2``: ``benchmarks/slice_masks.py --graph`` on the package of
commit 8d96d08, this tree's, then 8d96d08's again) and prints one row a family: what the
busiest rank sends (forward / backward MB), and the fwd+bwd time eager and captured on each
side, so a change is read against the spread between the two "before" runs.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

SIDES = ("nvlink_before", "nvlink_after", "nvlink_before2")
HEAD = ("| family | busiest rank sends fwd / bwd MB, before -> after | fwd+bwd ms eager, "
        "before / after / before | fwd+bwd ms captured, before / after / before |\n"
        "|---|---|---|---|")


def rows(folder: Path) -> list[str]:
    runs = [{r["family"]: r for r in json.loads((folder / f"{s}.json").read_text())["rows"]}
            for s in SIDES]
    lines = [HEAD]
    for family, before in runs[0].items():
        sides = [run[family] for run in runs]
        sent = [f"{r['sent_mb']['forward']:.1f} / {r['sent_mb']['backward']:.1f}"
                for r in sides[:2]]
        eager = " / ".join(f"{r['burst']['fwd_bwd_ms']:.2f}" for r in sides)
        graph = " / ".join(f"{r['burst_graph']['fwd_bwd_ms']:.2f}" for r in sides)
        lines.append(f"| {family} | {sent[0]} -> {sent[1]} | {eager} | {graph} |")
    return lines


if __name__ == "__main__":
    print("\n".join(rows(Path(sys.argv[1]))))
