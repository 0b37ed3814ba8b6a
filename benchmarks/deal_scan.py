"""Every deal of a mask's chunks to two ranks, timed against the ``area`` layout's own deal.

    torchrun --nproc_per_node=2 benchmarks/deal_scan.py --families causal_document \
        --chunks 4 --out $OUT/deal_scan

Why: the ``area`` layout deals a mask's chunks so that every rank holds the same visible
area, but the ranks' kernels do not run a visible pair at one rate: on 2x H200 causal
documents' eager forward is bound by rank 0's GPU, whose small documents run on the varlen
flash kernel at about half cuDNN's rate a pair (``results/h200x2_issue42_timeline_in_place/``).
A model of that time (two rates, calls, block sizes) is worth writing only if some deal is
faster; this measures how much faster the best deal is, before any model is trusted.

At two ranks and k chunks a rank there are C(2k-1, k-1) deals with chunk 0 on rank 0 (35 at
k = 4); above ``--max-deals`` a seeded sample of them is timed. Each deal is a way of
``ab_rounds`` (every deal each round, the order rotated): set by replacing the layout's deal
(``area._dealt``), with the placements, plans and prepared calls dropped and the inputs
sharded again. Each deal's output, gathered back to the whole sequence, is compared with the
package deal's. The figures are the eager forward and forward + backward back to back, each
round's the slower rank's (each rank times its own loop); with ``--in-layer``, attention's
spans inside a layer's steps instead (``in_layer.py``): there the host is ahead and the GPU's
time decides, steady within about 1% from run to run, where back to back the host's moment
decided (the first scan's twin deal read 0.935 of itself). ``--summarize JSON --out PREFIX``
prints a run's table again from its JSON.
"""
from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_burst as mb  # noqa: E402
from megatron_burst.attention import call_plan, prepare  # noqa: E402
from megatron_burst.plan import area, mask_placement  # noqa: E402
from ab_rounds import (family_tensors, publish, run_families, run_meta,  # noqa: E402
                       summary, timed_rounds, way_order)

PACKAGE = area._dealt  # the layout's own deal


def deals(world: int, tokens: int, k: int, most: int, seed: int = 0) -> dict:
    """{label: each rank's chunks as (start, length)}: k chunks of ``tokens // k`` a rank,
    rank 0 holding chunk 0 (the label: rank 0's chunk numbers); a seeded sample of
    ``most`` where there are more."""
    if world != 2:
        raise ValueError(f"deal_scan: deals are enumerated for 2 ranks, got {world}")
    if k < 1 or tokens % k:
        raise ValueError(f"deal_scan: --chunks must divide {tokens} tokens a rank, got {k}")
    size = tokens // k
    every = [(0,) + rest for rest in itertools.combinations(range(1, 2 * k), k - 1)]
    if len(every) > most:
        every = random.Random(seed).sample(every, most)
    out = {}
    for mine in every:
        other = [c for c in range(2 * k) if c not in mine]
        out[",".join(map(str, mine))] = [[(c * size, size) for c in sorted(cs)]
                                         for cs in (mine, other)]
    return out


def set_deal(chunks) -> None:
    """Place every mask from here on by ``chunks`` (None: the package's deal); the
    placements, plans and prepared calls dropped, so the next call places and plans again."""
    area._dealt = PACKAGE if chunks is None else (lambda w, t, m: (0, chunks))
    mask_placement.mask_placement.cache_clear()
    call_plan.clear()
    prepare.PREPARED.clear()


def time_family(name: str, args, world: int) -> dict:
    total = args.tokens * world
    mask, full = family_tensors(name, args, world)
    chosen = {"package": None, **deals(world, args.tokens, args.chunks, args.max_deals)}
    local, outs = [], {}

    def setter(label):
        def put():
            set_deal(chosen[label])
            local[:] = [mb.shard_seq(t, mask=mask).contiguous() for t in full]
            for _ in range(2):
                forward(), both()
        return put

    def forward():
        with torch.no_grad():
            return mb.burst_attn(*local[:3], mask=mask)

    def both():
        q, k, v = (t.detach().requires_grad_() for t in local[:3])
        mb.burst_attn(q, k, v, mask=mask).backward(local[3])

    def check(label):
        if label not in outs:
            outs[label] = mb.unshard_seq(forward(), mask=mask).float()
    ways = {label: setter(label) for label in chosen}
    if args.in_layer:
        times = layer_rounds(ways, args.rounds, check, _layer_spans(mask, local, args))
    else:
        steps = {"fwd": (forward, args.calls), "fwd+bwd": (both, max(1, args.calls // 3))}
        times = timed_rounds(ways, steps, args.rounds, check)
    set_deal(None)
    base = outs["package"]
    diff = {w: float((o - base).abs().max() / base.abs().max()) for w, o in outs.items()}
    package_k = len(PACKAGE(world, total, mask)[1][0])
    return dict(family=name, chunks=args.chunks, package_chunks=package_k,
                deals={w: c for w, c in chosen.items() if c is not None},
                summary=summary(times), times=times, rel_diff=diff)


def layer_rounds(ways: dict, rounds: int, check, spans) -> dict:
    """``timed_rounds``' {way: {step: [ms a round]}} from attention's spans inside a layer
    (``in_layer.py``): each round sets every way in turn (``ab_rounds.way_order``), checks
    its output, and takes ``spans()``' forward and forward + backward under it."""
    names = list(ways)
    times = {w: {"fwd": [], "fwd+bwd": []} for w in names}
    for rnd in range(rounds):
        for way in way_order(names, rnd):
            ways[way]()
            check(way)
            got = spans()
            times[way]["fwd"].append(got["fwd_ms"])
            times[way]["fwd+bwd"].append(got["fwd_ms"] + got["bwd_ms"])
    return times


def _layer_spans(mask, local: list, args):
    """A function of no argument: this rank's mean spans of ``burst_attn`` on the current
    shards (``local``, resharded by each deal) inside a Llama-70B layer's steps, the ranks
    meeting before each span (``in_layer.in_layer``; 3 warm-up and ``--layer-steps``)."""
    from types import SimpleNamespace

    import in_layer

    dev = torch.device("cuda", torch.cuda.current_device())
    layer = in_layer.Layer(args.tokens, args.hq, args.hkv, args.d, dev, torch.bfloat16)
    ranks, counts = torch.zeros(1, device=dev), SimpleNamespace(warmup=3, iters=args.layer_steps)

    def burst(q, k, v):
        return mb.burst_attn(q, k, v, mask=mask)

    def spans() -> dict:
        inputs = [t.detach().requires_grad_() for t in local[:3]]
        return in_layer.in_layer(in_layer.same(burst, inputs, local[3]), layer, dev, counts,
                                 ranks)
    return spans


def slowest(rows: list) -> dict:
    """{family: {deal: {step: (ms, ratio)}}}: per round the slower rank's time (the ranks
    time their own loops, and a rank that needs nothing from its peer finishes first), its
    median, and the median of its per-round ratios to the package deal's."""
    by: dict = {}
    for row in rows:
        by.setdefault(row["family"], []).append(row["times"])
    out = {}
    for family, ranks in by.items():
        worst = {w: {s: [max(r[w][s][i] for r in ranks) for i in range(len(ms))]
                     for s, ms in steps.items()} for w, steps in ranks[0].items()}
        base = worst["package"]
        out[family] = {w: {s: (statistics.median(ms), statistics.median(
            a / b for a, b in zip(ms, base[s]))) for s, ms in steps.items()}
            for w, steps in worst.items()}
    return out


HEADER = ("family", "chunks a rank", "rank 0's chunks", "fwd ms", "fwd / package",
          "fwd+bwd ms", "fwd+bwd / package", "rel diff")


def table_cells(rows: list) -> list[tuple]:
    """Per family, the package's deal and the fastest and slowest deals by the slower
    rank's forward."""
    cells = []
    chunks = {r["family"]: r["chunks"] for r in rows}
    diffs = {r["family"]: r["rel_diff"] for r in rows if r["rank"] == 0}
    for family, med in slowest(rows).items():
        order = sorted(med, key=lambda w: med[w]["fwd"][1])
        for w in dict.fromkeys(["package"] + order[:5] + order[-2:]):  # (each once)
            (fms, fr), (bms, br) = med[w]["fwd"], med[w]["fwd+bwd"]
            cells.append((family, chunks[family], w, f"{fms:.3f}", f"{fr:.3f}", f"{bms:.3f}",
                          f"{br:.3f}", f"{diffs[family][w]:.1e}"))
    return cells


def report(args, world: int, rows: list) -> None:
    """Rank 0: the table, printed and written with its meta and every rank's rows."""
    publish(args.out, run_meta(args, world), world, HEADER, table_cells(rows), rows)


def summarize(path: str, out: str) -> None:
    """``--summarize JSON``: a run's table again from its JSON, by the slower rank (the
    first version printed rank 0's times: ``results/h200x2_issue42_deal_scan/``)."""
    import json

    with open(path) as f:
        run = json.load(f)
    meta = dict(run["meta"], summarized_by=" ".join(["benchmarks/deal_scan.py", *sys.argv[1:]]))
    publish(out, meta, run["meta"]["world"], HEADER, table_cells(run["rows"]), run["rows"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chunks", type=int, default=4, help="chunks a rank in every deal")
    p.add_argument("--max-deals", type=int, default=35, help="deals timed at most (sampled)")
    p.add_argument("--in-layer", action="store_true",
                   help="time each deal's attention spans inside a Llama-70B layer's steps "
                        "(in_layer.py: the GPU's time, the host ahead) rather than back to "
                        "back alone")
    p.add_argument("--layer-steps", type=int, default=8,
                   help="timed layer steps a deal a round (--in-layer)")
    if "--summarize" in sys.argv:  # a run's table again (no rank started, nothing timed)
        q = argparse.ArgumentParser(description="deal_scan's table again from a run's JSON")
        q.add_argument("--summarize", required=True, metavar="JSON")
        q.add_argument("--out", required=True, help="path prefix of the new table")
        got = q.parse_args()
        return summarize(got.summarize, got.out)
    run_families(p, "causal_document", time_family, report, rounds=3, calls=12)


if __name__ == "__main__":
    main()
