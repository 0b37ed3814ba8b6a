"""The time model of this tree replayed on recorded ``auto_check.py`` runs: each row's
prediction again, from the profile that run measured, against the time it measured.

    python benchmarks/model_replay.py RUN_FOLDER [TAG ...] [--row-host]

RUN_FOLDER holds ``auto_check{TAG}.json`` and ``profile{TAG}.json`` pairs
(``auto_check_three.sh``'s output; tags "", "_25gbps", "_50gbps" by default). A change to
the model is read here first, on runs already paid for, before a GPU run confirms it; the
link figures are the recorded profile's, so a change to how links are measured is not.
Documents rows are predicted over the packs the run fed (``auto_check._Cell.order``). On a
run made by the same model it gives back the recorded predictions exactly (all 96 rows of
``results/h100x2_issue41_queued``, at commit ``c15f515``). ``--row-host``: each row's own
measured host time (``host_ms``, runs from commit ``5a31289`` on) in place of the model's
host term, so what is left is the GPU term's error (rows without one are left out).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from megatron_burst.decide.pack_load import PackLoad  # noqa: E402
from megatron_burst.decide.timing import Profile  # noqa: E402
from megatron_burst.decide.topology import CPTopology, HeadShape  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from auto_check import _forced, doc_lens, pack_order, predicted_ms  # noqa: E402


def replay(run: dict, prof: Profile, row_host: bool = False) -> list[dict]:
    """Every row of ``run`` with ``replayed_ms``: this tree's prediction for its topology
    (``row_host``: with the row's own host time, ``auto_check.predicted_ms``)."""
    gpus_per_node = dict(prof.machine).get("gpus_per_node") or prof.gpus_per_node
    emulated = run["meta"].get("emulated")
    out = []
    for r in run["rows"]:
        if "ms" not in r or "predicted_ms" not in r or (row_host and "host_ms" not in r):
            continue
        hq, hkv = (int(x) for x in r["heads"].split(":"))
        heads = HeadShape(hq, hkv, 128, 2)
        world = r["world"]
        forced = _forced(world, hq, hkv, r["mask"] == "documents")
        by_name = {n: CPTopology.build(world, ulysses=o["ulysses_size"],
                                       intra_node_size=o.get("intra_node_size"),
                                       backward=o["backward"], heads=heads)
                   for n, o in forced.items()}
        top = by_name.get(r["method"]) or next(
            (t for t in by_name.values() if t.describe() == r.get("topology")), None)
        if top is None:
            continue
        loads = [None]
        if r["mask"] == "documents":  # the packs the cell ran (``auto_check._Cell.order``)
            total = r["per_gpu"] * world
            runs = (run["rows"][0].get("packs") or {}).get("orders_run", 1)
            loads = [PackLoad.of_pack(pack_order(doc_lens(total), total + hq + hkv, c),
                                      "whole_docs") for c in range(runs)]
        out.append({**r, "replayed_ms": predicted_ms(
            top, prof, r["per_gpu"], loads, 1 if emulated else gpus_per_node,
            r["host_ms"] if row_host else None)})
    return out


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--row-host"]
    row_host = "--row-host" in sys.argv
    folder = Path(args[0])
    print(f"command: `python {' '.join(sys.argv)}` (package {Path(__file__).parents[1]})\n")
    for tag in args[1:] or ["", "_25gbps", "_50gbps"]:
        run = json.loads((folder / f"auto_check{tag}.json").read_text())
        prof = Profile.from_json(json.loads((folder / f"profile{tag}.json").read_text()))
        rows = replay(run, prof, row_host)
        print(f"## {folder.name}{tag or ' (machine)'}")
        print("| cell | method | measured ms | recorded model | replayed model |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['per_gpu']} {r['heads']} {r['mask']} | {r['method']} | {r['ms']:.2f} | "
                  f"{r['predicted_ms']:.2f} ({r['ms'] / r['predicted_ms']:.2f}) | "
                  f"{r['replayed_ms']:.2f} ({r['ms'] / r['replayed_ms']:.2f}) |")
        within = [abs(r["ms"] / r[k] - 1) <= 0.15 for k in ("predicted_ms", "replayed_ms")
                  for r in rows]
        n = len(rows)
        print(f"\nwithin 15%: recorded {sum(within[:n])} of {n}, replayed {sum(within[n:])} "
              f"of {n}\n")


if __name__ == "__main__":
    main()
