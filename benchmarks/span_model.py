"""A price of a ring forward's plan, fitted to the in-layer spans on file; every deal priced by it.

    python benchmarks/span_model.py --families causal_document,shared_question \
        --out benchmarks/results/cpu_issue42_span_model/span_model

Why: the ``area`` layout gives each rank the same visible pairs, yet inside a layer
(``in_layer.py``) rank 0's forward ran longer in causal documents (1.78 against 1.60 ms) and
shared question (2.86 against 2.47), whose ranks hold the same pairs. A price that
names the slower rank could choose the deal; this one is a prediction for
``deal_scan.py --in-layer`` to test on a GPU, not a rule the package follows.

The price of a rank's forward: ``a`` ms per million pairs in dense (cuDNN) calls, ``b`` ms
per thousand query rows of dense calls, ``c`` ms per thousand query rows of varlen calls,
fitted by least squares to every forward span of ``results/h200x2_issue42_in_layer/`` (each
CP=2 rank and one GPU, both thresholds), the plans rebuilt on the CPU. A call's rows price
the bytes it moves whatever its pairs (its queries read, its partial output written and
merged); a varlen call's rows also carry its small documents' pairs. Each deal of
``deal_scan.deals`` (4 chunks a rank) is then priced by its slower rank.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key  # noqa: E402
from ranks import write_run  # noqa: E402
from slice_masks import family_mask  # noqa: E402

RUNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                    "h200x2_issue42_in_layer")
# (file under RUNS, the ring forward's dense threshold it ran; one GPU's: 2^20)
SPANS = (("before/il/in_layer.json", 2.0 ** 21), ("ab/il/in_layer_1_2097152.json", 2.0 ** 21),
         ("ab/il/in_layer_2_1048576.json", 2.0 ** 20),
         ("ab/il/in_layer_3_2097152.json", 2.0 ** 21))
GPU_BOUND = 2.0 ** 20
TOTAL = 16384  # the runs' tokens: 8K a GPU on two


def features(name: str, world: int, rank: int, dense: float) -> list[float]:
    """[million pairs in dense calls, thousand query rows of dense calls, thousand query
    rows of varlen calls, million pairs in varlen calls] of a rank's forward (the plan as the
    package builds it now; the price reads the first three)."""
    ring = RingKey(tuple(range(world)), rank, None) if world > 1 else None
    plan = build_plan(plan_key("area", world, (TOTAL,), family_mask(name, TOTAL), 1, ring,
                               "burst", dense_min_area=dense, gpu_bound_min_area=GPU_BOUND))
    pairs = dense_rows = varlen_rows = varlen_pairs = 0
    for step in plan.forward.steps:
        for call in step.calls:
            rows = sum(b.q_stop - b.q_start for b in call.blocks)
            if call.varlen:
                varlen_rows += rows
                varlen_pairs += sum(b.area for b in call.blocks)
            else:
                pairs += sum(b.area for b in call.blocks)
                dense_rows += rows
    return [pairs / 1e6, dense_rows / 1e3, varlen_rows / 1e3, varlen_pairs / 1e6]


def spans() -> list[tuple[tuple, float]]:
    """((family, world, rank, dense threshold), forward ms) of every span on file."""
    out = []
    for path, dense in SPANS:
        with open(os.path.join(RUNS, path)) as f:
            for row in json.load(f)["rows"]:
                for rank, got in enumerate(row["burst_ranks"]):
                    out.append(((row["family"], 2, rank, dense), got["in_layer"]["fwd_ms"]))
                if "one_gpu_plan" in row:
                    out.append(((row["family"], 1, 0, GPU_BOUND),
                                row["one_gpu_plan"]["in_layer"]["fwd_ms"]))
    return out


def fit() -> dict:
    """The price's three coefficients, its median and largest relative error over the spans,
    how often it names the slower rank where the two differ by more than 5%, and the median
    error of a price of pairs alone (dense and varlen), fitted the same way."""
    data = spans()
    cases = {key: features(*key) for key in dict.fromkeys(k for k, _ in data)}
    every = np.array([cases[k] for k, _ in data])
    x, by_pairs = every[:, :3], every[:, [0, 3]]
    y = np.array([ms for _, ms in data])
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    err = np.abs(x @ coef / y - 1)
    pairs_only = np.abs(by_pairs @ np.linalg.lstsq(by_pairs, y, rcond=None)[0] / y - 1)
    pairs: dict = {}
    for (key, ms), price in zip(data, x @ coef):
        if key[1] == 2:
            pairs.setdefault(key[:1] + key[3:], []).append((key[2], ms, price))
    named = [max(p, key=lambda r: r[1])[0] == max(p, key=lambda r: r[2])[0]
             for runs in pairs.values() for p in _by_run(runs)
             if abs(p[0][1] - p[1][1]) > 0.05 * max(p[0][1], p[1][1])]
    return dict(coef=[float(c) for c in coef], median_error=float(np.median(err)),
                max_error=float(err.max()), spans=len(y), slower_named=sum(named),
                slower_pairs=len(named), pairs_only_median_error=float(np.median(pairs_only)))


def _by_run(runs: list) -> list:
    """A family's (rank, ms, price) in file order, as (rank 0, rank 1) pairs, one a run."""
    return [runs[i:i + 2] for i in range(0, len(runs) - 1, 2)]


def price_deals(name: str, coef: list[float]) -> dict:
    """{deal: [each rank's price, ms]}: the package's deal and every deal of 4 chunks a
    rank, at the GPU-bound threshold the issue's shape plans its forward with now."""
    import deal_scan

    out = {}
    for label, chunks in {"package": None, **deal_scan.deals(2, TOTAL // 2, 4, 100)}.items():
        deal_scan.set_deal(chunks)
        try:
            out[label] = [float(np.dot(coef, features(name, 2, r, GPU_BOUND)[:3]))
                          for r in (0, 1)]
        finally:
            deal_scan.set_deal(None)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", default="causal_document,shared_question,block_causal_document")
    p.add_argument("--out", required=True, help="path prefix: writes OUT.json and OUT.md")
    args = p.parse_args()
    model = fit()
    lines = [f"fit on {model['spans']} in-layer spans: {model['coef']} (ms per M dense pairs, "
             f"K dense rows, K varlen rows); median error {model['median_error']:.3f}, largest "
             f"{model['max_error']:.3f}; slower rank named in {model['slower_named']} of "
             f"{model['slower_pairs']}; pairs alone: median error "
             f"{model['pairs_only_median_error']:.3f}", f"command: `{' '.join(sys.argv)}`", "",
             "| family | deal (rank 0's chunks) | rank 0 / rank 1 priced ms | / package |",
             "|---|---|---|---|"]
    rows = []
    for name in args.families.split(","):
        deals = price_deals(name, model["coef"])
        base = max(deals["package"])
        for label in sorted(deals, key=lambda w: max(deals[w]))[:5]:
            ratio = max(deals[label]) / base
            rows.append(dict(family=name, deal=label, priced_ms=deals[label], ratio=ratio))
            lines.append(f"| {name} | {label} | {deals[label][0]:.3f} / {deals[label][1]:.3f} | "
                         f"{ratio:.3f} |")
    meta = dict(model=model, date=datetime.date.today().isoformat(), command=" ".join(sys.argv))
    print("\n".join(lines))
    write_run(args.out, meta, rows, "\n".join(lines))


if __name__ == "__main__":
    main()
