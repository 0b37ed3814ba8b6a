"""The time model against a slice_masks.py run's own times, before and after masks were
priced from their schedules (issues 41, 42): a table from a run's files, nothing measured.

Reads a run of ``benchmarks/slice_masks.py --log-auto`` (``slice_masks.json`` and the log's
``burst auto`` lines, ``auto_lines.txt``) and the profile first use measured in that run.
For each family: 'auto''s prediction for its same-mask call (the ``decides`` line whose
slice count and visible share are the family's), the time its first-use check measured for
that call, and the prediction before this change (every mask priced as full attention: the
run's own logged prediction for its full family). Writes the table as markdown.

    python benchmarks/mask_pricing_table.py RUN_FOLDER > RUN_FOLDER/mask_pricing.md
"""
from __future__ import annotations

import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron_burst.decide.timing import load_profile, predict  # noqa: E402
from megatron_burst.decide.topology import CPTopology, HeadShape  # noqa: E402

DECIDES = re.compile(r"\((\d+) tokens per rank, (\d+) slices .* in area, ([0-9.e-]+) of tokens "
                     r"squared visible\).* decides: (.*?): ([0-9.]+) ms fwd\+bwd predicted")
CHECK = re.compile(r"burst auto check: (.*?) predicted ([0-9.]+) ms, measured ([0-9.]+) ms")


def main(folder: str) -> None:
    data = json.load(open(os.path.join(folder, "slice_masks.json")))
    meta, rows = data["meta"], data["rows"]
    lines = open(os.path.join(folder, "auto_lines.txt")).read().splitlines()
    decided = [m.groups() for m in map(DECIDES.search, lines) if m]
    checked = {(m.group(1), float(m.group(2))): float(m.group(3))
               for m in map(CHECK.search, lines) if m}
    (profile,) = glob.glob(os.path.join(folder, "profiles", "*.json"))
    hq, hkv = (int(x) for x in meta["heads"].split(":"))
    heads = HeadShape(hq, hkv, meta["head_dim"])
    total = meta["tokens_per_gpu"] * meta["world"]
    # Before, every mask was priced as the full mask: the run's own logged decision for its
    # full family, which the model of that run made (today's model would price it anew);
    # a run without that family is priced by this tree's model.
    full = [d for r in rows if r["family"] == "full" for d in decided
            if int(d[1]) == r["slices"] and d[2] == f"{r['area'] / total ** 2:.3g}"]
    if full:
        described, before = full[0][3], float(full[0][4])
    else:
        flat = CPTopology.build(meta["world"], ulysses=1, backward="ring", heads=heads)
        described, before = flat.describe(), predict(
            flat, load_profile(profile), tokens=meta["tokens_per_gpu"],
            causal=False).total_s * 1e3
    out = [f"{meta['device']} x{meta['world']}, {meta['tokens_per_gpu']} tokens/GPU, GQA "
           f"{meta['heads']}, d {meta['head_dim']}; profile `{os.path.basename(profile)}`; "
           f"before: every mask priced as full attention ({before:.2f} ms, {described})", "",
           "| family | visible share | measured ms (first-use check) | predicted before | "
           "error before | predicted after | error after |", "|---|---|---|---|---|---|---|"]
    within = [0, 0]
    for r in rows:
        share = f"{r['area'] / total ** 2:.3g}"
        found = [d for d in decided if int(d[1]) == r["slices"] and d[2] == share]
        if not found:
            out.append(f"| {r['family']} | {share} | - | - | - | no decision logged | - |")
            continue
        topology, after = found[0][3], float(found[0][4])
        measured = checked.get((topology, after))
        if measured is None:
            out.append(f"| {r['family']} | {share} | - | {before:.2f} | - | {after:.2f} | - |")
            continue
        errs = [measured / before - 1, measured / after - 1]
        within = [w + (abs(e) <= 0.15) for w, e in zip(within, errs)]
        out.append(f"| {r['family']} | {share} | {measured:.2f} | {before:.2f} | "
                   f"{errs[0]:+.0%} | {after:.2f} | {errs[1]:+.0%} |")
    out += ["", f"within the model's 15%: {within[0]} of {len(rows)} before, {within[1]} of "
            f"{len(rows)} after (error = measured / predicted - 1)"]
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
