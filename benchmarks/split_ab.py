"""How a step's blocks are split into kernel calls, timed way against way in one process.

    torchrun --nproc_per_node=2 benchmarks/split_ab.py --out $OUT/split_ab

Why: at 8K tokens per GPU the eager forward of the many-slice families is bound by one
rank's host, and on these machines a cuDNN call costs that host 100-200 us against flash's
45-60 (``results/h100x2_issue42_flash_only/``). Every block on flash made block-causal
documents' forward faster and other families' slower. Two knobs of the automatic kernel
(``kernels.selection.BandDispatch``) decide the split between them:

- ``dense_min_area``: from this many visible pairs a block runs alone on cuDNN; below it,
  blocks of one mask shape share a varlen flash call (``varlen.plan_calls``);
- ``lone_band_area``: below this many, a block that runs alone anyway (the only one of its
  shape in its step) goes to flash instead of cuDNN;
- ``gpu_bound_min_area``: the dense threshold of the passes the GPU bounds (a ring's
  backward, one GPU's passes); None: ``dense_min_area`` for every pass. While ways are
  timed, a ring's forward takes ``dense_min_area`` at every call size (``set_split``): the
  package's own plan of a large call (its forward at the second threshold) is the way
  ``1M/1M`` there, ``'1048576:0'``.

Each way sets them on the kernel object the calls use (the plan is keyed by the thresholds, so
each way has its own plan: the plans and prepared calls are dropped where they change,
``set_split``); ``ab_rounds`` times the ways in rotated rounds in one process,
burst_attn's forward and forward + backward back to back on all ranks, and the package's plan
on one GPU for the same mask (rank 0; the ratio's denominator in ``slice_masks.py``). Each
way's output is compared with the first way's.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_burst as mb  # noqa: E402
from megatron_burst.attention import call_plan, prepare  # noqa: E402
from megatron_burst.kernels import thresholds  # noqa: E402
from megatron_burst.kernels.selection import pick_kernel  # noqa: E402
from ab_rounds import (add_ab_args, family_tensors, gather_rows, parse_counts,  # noqa: E402
                       publish, run_meta, summary, timed_rounds)
from ranks import start_ranks  # noqa: E402
from slice_masks import HOST_BOUND, add_shape_args  # noqa: E402

# name -> (dense_min_area, lone_band_area, gpu_bound_min_area); "2M" is the package's one
# threshold before, "2M/1M" its threshold per pass.
WAYS = {"2M": (2.0 ** 21, 0.0, None), "2M/1M": (2.0 ** 21, 0.0, 2.0 ** 20),
        "2M lone": (2.0 ** 21, 2.0 ** 21, None), "4M lone": (2.0 ** 22, 2.0 ** 22, None),
        "8M lone": (2.0 ** 23, 2.0 ** 23, None)}
STEPS = ("fwd", "fwd+bwd", "1 GPU fwd", "1 GPU fwd+bwd")


def parse_ways(text: str) -> dict:
    """``--ways``: names of WAYS, or 'DENSE:LONE' or 'DENSE:LONE:GPU_BOUND' numbers
    (visible pairs)."""
    ways = {}
    for item in text.split(","):
        if item in WAYS:
            ways[item] = WAYS[item]
            continue
        try:
            got = [float(x) for x in item.split(":")]
            if len(got) not in (2, 3):
                raise ValueError
        except ValueError:
            raise ValueError(f"--ways: {item!r} is neither one of {sorted(WAYS)} nor "
                             f"'DENSE_MIN_AREA:LONE_BAND_AREA[:GPU_BOUND_MIN_AREA]'") from None
        ways[item] = (got[0], got[1], got[2] if len(got) == 3 else None)
    return ways


PACKAGE_LINE = thresholds.HOST_BOUND_MAX_ELEMENTS  # the package's host-bound line


def set_split(kernel, dense_min_area: float, lone_band_area: float,
              gpu_bound_min_area: float | None = None, line: float | None = None) -> bool:
    """Set the automatic kernel's three knobs, and the host-bound ``line``
    (``thresholds.HOST_BOUND_MAX_ELEMENTS``; None: as it is). The ways set it past every
    call (``math.inf``), so that a way's first threshold is the ring forward's at every call
    size, as its name says: at the package's line a large call's forward takes the second.
    Where a threshold or the line
    changes, drop the plans and the prepared calls, and say so (True: the caller runs every
    step once before timing): a prepared call holds the plan its first call made, so without
    this a new threshold is never planned (the lone rule is read at each call). A first
    version set the attribute alone: its threshold ways timed one plan
    (``results/h200x2_issue42_fewer_flash_flawed/``)."""
    kernel.lone_band_area = lone_band_area
    now = (dense_min_area, gpu_bound_min_area,
           thresholds.HOST_BOUND_MAX_ELEMENTS if line is None else line)
    if (kernel.dense_min_area, kernel.gpu_bound_min_area,
            thresholds.HOST_BOUND_MAX_ELEMENTS) == now:
        return False
    kernel.dense_min_area, kernel.gpu_bound_min_area = now[:2]
    thresholds.HOST_BOUND_MAX_ELEMENTS = now[2]
    call_plan.clear()
    prepare.PREPARED.clear()
    return True


def time_family(name: str, args, ways: dict, world: int, rank: int, solo) -> dict:
    dev = torch.device("cuda", torch.cuda.current_device())
    mask, full = family_tensors(name, args, world)
    local = [mb.shard_seq(t, mask=mask).contiguous() for t in full]
    kernel = pick_kernel(None, torch.bfloat16, args.hq, args.hkv, args.d, dev)
    grads = [t.detach().clone().requires_grad_() for t in local[:3]]
    solo_in = [t.detach().clone().requires_grad_() for t in full[:3]]

    def forward():
        with torch.no_grad():
            return mb.burst_attn(*local[:3], mask=mask)

    def both():
        mb.burst_attn(*grads, mask=mask).backward(local[3])

    def solo_forward():
        if rank == 0:
            with torch.no_grad():
                mb.burst_attn(*full[:3], solo, mask=mask)

    def solo_both():
        if rank == 0:
            mb.burst_attn(*solo_in, solo, mask=mask).backward(full[3])

    def warm() -> None:
        for step, _ in steps.values():
            step()

    def setter(way):
        return lambda: set_split(kernel, *ways[way], line=math.inf) and warm()
    outs = {}

    def check(way):
        outs.setdefault(way, forward().float())
    steps = dict(zip(STEPS, ((forward, args.calls), (both, max(1, args.calls // 3)),
                             (solo_forward, max(1, args.calls // 2)),
                             (solo_both, max(1, args.calls // 6)))))
    before = (kernel.dense_min_area, kernel.lone_band_area, kernel.gpu_bound_min_area)
    for way in ways:  # each way's plans made and kernels warmed before any round
        setter(way)()
        for _ in range(3):
            warm()
    times = timed_rounds({w: setter(w) for w in ways}, steps, args.rounds, check)
    set_split(kernel, *before, line=PACKAGE_LINE)
    base = outs[next(iter(ways))]
    diff = max(float((o - base).norm() / base.norm()) for o in outs.values())
    return dict(family=name, rank=rank, summary=summary(times), times=times,
                max_rel_diff=diff)


def efficiency(med: dict, world: int) -> tuple[float, float]:
    """Forward and backward TFLOP/s per GPU over one GPU's, from rank 0's medians (the
    backward's time: forward + backward less forward)."""
    fwd = med["1 GPU fwd"]["ms"] / (world * med["fwd"]["ms"])
    bwd = (med["1 GPU fwd+bwd"]["ms"] - med["1 GPU fwd"]["ms"]) / (
        world * (med["fwd+bwd"]["ms"] - med["fwd"]["ms"]))
    return fwd, bwd


def report(args, ways: dict, world: int, rows: list) -> None:
    """Rank 0: the table, printed and written with its meta (``write_run``)."""
    meta = run_meta(args, world, ways={w: dict(dense_min_area=a, lone_band_area=b,
                                               gpu_bound_min_area=c)
                                       for w, (a, b, c) in ways.items()})
    header = ("family", "way", "fwd ms r0 / r1", "fwd ratio r0 / r1", "fwd+bwd ms r0 / r1",
              "fwd+bwd ratio r0 / r1", "1 GPU fwd / fwd+bwd ms", "efficiency fwd / bwd",
              "max rel diff")
    by_family: dict = {}
    for r in rows:
        by_family.setdefault(r["family"], {})[r["rank"]] = r
    cells = []
    for family, ranks in by_family.items():
        for way in ways:
            meds = [ranks[i]["summary"][way] for i in sorted(ranks)]
            pair = lambda step, key: " / ".join(f"{m[step][key]:.3f}" for m in meds)  # noqa
            eff = efficiency(meds[0], world)
            cells.append((family, way, pair("fwd", "ms"), pair("fwd", "ratio"),
                          pair("fwd+bwd", "ms"), pair("fwd+bwd", "ratio"),
                          f"{meds[0]['1 GPU fwd']['ms']:.3f} / "
                          f"{meds[0]['1 GPU fwd+bwd']['ms']:.3f}",
                          f"{eff[0]:.2f} / {eff[1]:.2f}", f"{ranks[0]['max_rel_diff']:.1e}"))
    publish(args.out, meta, world, header, cells, rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_ab_args(p, rounds=8, calls=30)
    add_shape_args(p, HOST_BOUND)
    p.add_argument("--ways", default=",".join(WAYS),
                   help=f"ways to time, the first the reference: names of {sorted(WAYS)} or "
                        f"'DENSE_MIN_AREA:LONE_BAND_AREA[:GPU_BOUND_MIN_AREA]'")
    args = parse_counts(p)
    try:
        ways = parse_ways(args.ways)
    except ValueError as err:
        p.error(str(err))
    rank, world = start_ranks()
    solo = dist.new_group([0])
    mine = [time_family(name, args, ways, world, rank, solo)
            for name in args.families.split(",")]
    gather_rows(mine, world, rank, lambda rows: report(args, ways, world, rows))


if __name__ == "__main__":
    main()
