"""The layouts side by side, from one ``benchmarks/documents.py`` JSON: a markdown table.

    python benchmarks/layouts_table.py benchmarks/results/h100x2_issue39_pack_zigzag_spans/documents_pack_zigzag.json

One row per case (tokens per GPU, heads, mix): each layout's efficiency against one GPU's
varlen flash kernel on the same packs (a new pack every call, and new packs back to back),
and its host time per call, all from the one run. The README's table is this output.
"""
from __future__ import annotations

import json
import sys

COLUMNS = [("whole_docs", "new pack each call"), ("whole_docs", "new packs back to back"),
           ("pack_zigzag", "new pack each call"), ("pack_zigzag+graph", "new pack each call"),
           ("pack_zigzag+graph", "new packs back to back")]


def table(path: str) -> str:
    with open(path) as f:
        data = json.load(f)
    rows, cases = {}, []
    for r in data["rows"]:
        case = (r["per_gpu"], f"{r['heads']} d{r['head_dim']}", r["mix"])
        if case not in cases:
            cases.append(case)
        if r["method"].startswith("burst "):
            layout, how = r["method"][len("burst "):].split(", ", 1)
            rows[(case, layout, how.split(" (")[0])] = r
    head = " | ".join(f"{layout}, {how}" for layout, how in COLUMNS)
    lines = [f"| tokens/GPU | heads | mix | {head} |", "|" + "---|" * (3 + len(COLUMNS))]
    for case in cases:
        cells = []
        for layout, how in COLUMNS:
            r = rows.get((case, layout, how))
            if r is None:
                cells.append("-")
                continue
            host = f" ({r['host_ms']:.2f} ms host)" if "host_ms" in r else ""
            cells.append(f"{r['efficiency_vs_1gpu']:.2f}{host}")
        lines.append(f"| {case[0] // 1024}K | {case[1]} | {case[2]} | " + " | ".join(cells) + " |")
    meta = data["meta"]
    return (f"{meta['device']} x{meta['gpus']}, torch {meta['torch']}, {meta['date']}\n\n"
            + "\n".join(lines) + "\n")


if __name__ == "__main__":
    print(table(sys.argv[1]), end="")
