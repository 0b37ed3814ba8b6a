"""Ways of running one package, timed in one process round by round: the A/B these VMs allow.

Why: the GPU machines' CPUs switch between two speeds about 2x apart within seconds
(``host_cores.py``), more than most host-side changes. Two processes, or one way timed after
the other, compare those moments, not the ways. So each round sets every way in turn (the
order rotated, and reversed every other lap, so that no way always follows another) and times
each step back to back under it; a way's figure is the median of its rounds, and its ratio
to the first way is the median of the per-round ratios.

A way is a function that sets it (module globals, a kernel's attribute); a step is a function
of no argument, timed ``calls`` times back to back and synchronised once, as a model's layers
call it (the host runs ahead while the GPU works). Every rank runs the same rounds in the same
order, so the ranks' collectives pair; they meet at a barrier before each timed stretch.
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from typing import Callable

import torch
import torch.distributed as dist


def way_order(names: list[str], rnd: int) -> list[str]:
    """Round ``rnd``'s order: rotated by the round, reversed every other lap."""
    k = rnd % len(names)
    order = names[k:] + names[:k]
    return order[::-1] if (rnd // len(names)) % 2 else order


def timed_rounds(ways: dict[str, Callable[[], None]],
                 steps: dict[str, tuple[Callable[[], object], int]], rounds: int,
                 first: Callable[[str], None] | None = None) -> dict:
    """{way: {step: [ms a call, one per round]}}; ``steps``: name -> (function, calls).
    ``first(way)``, if given, runs once per round right after the way is set, untimed (a
    check of the way's output)."""
    if rounds < 1:
        raise ValueError(f"timed_rounds: rounds must be at least 1, got {rounds}")
    names = list(ways)
    times = {w: {s: [] for s in steps} for w in names}
    for rnd in range(rounds):
        for way in way_order(names, rnd):
            ways[way]()
            if first is not None:
                first(way)
            for name, (step, calls) in steps.items():
                torch.cuda.synchronize()
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    step()
                torch.cuda.synchronize()
                times[way][name].append((time.perf_counter() - t0) / calls * 1e3)
    return times


def summary(times: dict) -> dict:
    """Each way's median ms per step, and the median of its per-round ratios to the first
    way's (the first way's own ratio is 1)."""
    base = next(iter(times))
    out = {}
    for way, by_step in times.items():
        out[way] = {step: dict(ms=statistics.median(ms), ratio=statistics.median(
            a / b for a, b in zip(ms, times[base][step]))) for step, ms in by_step.items()}
    return out


def two_way_forward(times: dict) -> dict:
    """A two-way A/B's figures of its "forward" step (``timed_rounds``' ``times``): each
    way's median ms, the second way's median ratio to the first, and the per-round ms."""
    med, (first, second) = summary(times), list(times)
    return dict(ms={w: med[w]["forward"]["ms"] for w in (first, second)},
                ratio=med[second]["forward"]["ratio"],
                times={w: times[w]["forward"] for w in (first, second)})


def add_ab_args(p: argparse.ArgumentParser, rounds: int, calls: int) -> None:
    """--out, --rounds and --calls, as every in-process A/B takes them."""
    p.add_argument("--out", required=True, help="path prefix: writes OUT.json and OUT.md")
    p.add_argument("--rounds", type=int, default=rounds, help="rounds of every way")
    p.add_argument("--calls", type=int, default=calls, help="forwards a round, back to back")


def parse_counts(p: argparse.ArgumentParser) -> argparse.Namespace:
    """The arguments, a count below one refused before any rank starts (no rank waits)."""
    args = p.parse_args()
    for name in ("rounds", "calls", "tokens", "layer_steps"):  # (the last: deal_scan's)
        if getattr(args, name, 1) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


def table_text(meta: dict, world: int, header: tuple, rows: list[tuple]) -> str:
    """The run's Markdown table under its device, date, shape and command lines."""
    lines = [f"{meta['device']} x{world}, {meta['date']}, {meta['shape']}",
             f"command: `{meta['command']}`", "", "| " + " | ".join(header) + " |",
             "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in cells) + " |" for cells in rows]
    return "\n".join(lines)


def gather_rows(mine: list, world: int, rank: int, report: Callable[[list], None]) -> None:
    """Every rank's rows to rank 0, which ``report``s them all; then the ranks leave
    together."""
    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        report([r for rows in every for r in rows])
    dist.barrier()
    dist.destroy_process_group()


def family_tensors(name: str, args: argparse.Namespace, world: int
                   ) -> tuple[object, list[torch.Tensor]]:
    """Family ``name``'s mask over ``world`` ranks' tokens and fresh whole-sequence q, k, v
    and dout ([1, s, h, d] bf16 on this rank's GPU; ``args``: ``slice_masks.add_shape_args``'),
    the same on every rank (one seed)."""
    from slice_masks import family_mask

    dev = torch.device("cuda", torch.cuda.current_device())
    total = args.tokens * world
    gen = torch.Generator(device=dev).manual_seed(1)
    return family_mask(name, total), [
        torch.randn(1, total, h, args.d, device=dev, dtype=torch.bfloat16, generator=gen)
        for h in (args.hq, args.hkv, args.hkv, args.hq)]


def eager_forward(name: str, args: argparse.Namespace, world: int
                  ) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
    """burst_attn's eager forward of family ``name`` on this rank's shard of fresh inputs
    (``args``: ``slice_masks.add_shape_args``'), and its first output, after five warm-up
    calls."""
    import megatron_burst as mb

    mask, full = family_tensors(name, args, world)
    q, k, v = (mb.shard_seq(t, mask=mask).contiguous() for t in full[:3])

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return mb.burst_attn(q, k, v, mask=mask)
    first = forward()
    for _ in range(5):
        forward()
    return forward, first


def run_families(p: argparse.ArgumentParser, families: str,
                 time_family: Callable[[str, argparse.Namespace, int], dict],
                 report: Callable[[argparse.Namespace, int, list], None],
                 rounds: int = 20, calls: int = 20) -> None:
    """An A/B's main: its arguments (``rounds`` rounds of ``calls`` forwards unless given;
    the shape, ``families`` by default), every rank's ``time_family`` of each family (its
    row, with the rank), and rank 0's ``report`` of them all."""
    from ranks import start_ranks
    from slice_masks import add_shape_args

    add_ab_args(p, rounds=rounds, calls=calls)
    add_shape_args(p, families)
    args = parse_counts(p)
    rank, world = start_ranks()
    mine = [{"rank": rank, **time_family(name, args, world)}
            for name in args.families.split(",")]
    gather_rows(mine, world, rank, lambda rows: report(args, world, rows))


def publish(out: str, meta: dict, world: int, header: tuple, cells: list[tuple],
            rows: list) -> None:
    """Rank 0's end of an A/B: its table (``table_text``) printed, and written with the
    meta and rows (``ranks.write_run``)."""
    from ranks import write_run

    text = table_text(meta, world, header, cells)
    print(text)
    write_run(out, meta, rows, text)


def two_way_report(args: argparse.Namespace, world: int, rows: list, ways: tuple[str, str],
                   before: tuple = (), after: tuple = ()) -> None:
    """Rank 0's end of a two-way A/B whose rows carry ``two_way_forward``'s figures: family,
    rank, the ``before`` columns, each way's ms and the second's ratio to the first, the
    ``after`` columns (each (header, row -> cell)); printed and written (``publish``)."""
    first, second = ways
    header = ("family", "rank", *(h for h, _ in before), f"{first} ms", f"{second} ms",
              f"{second} / {first}", *(h for h, _ in after))
    cells = [(r["family"], r["rank"], *(cell(r) for _, cell in before),
              f"{r['ms'][first]:.3f}", f"{r['ms'][second]:.3f}", f"{r['ratio']:.3f}",
              *(cell(r) for _, cell in after))
             for r in sorted(rows, key=lambda r: (r["family"], r["rank"]))]
    publish(args.out, run_meta(args, world), world, header, cells, rows)


def run_meta(args: argparse.Namespace, world: int, **extra) -> dict:
    """A run's record: the device, world, torch, date, the command as given, and the shape
    and rounds timed (``extra``: the benchmark's own fields)."""
    return dict(device=torch.cuda.get_device_name(), world=world, torch=torch.__version__,
                date=datetime.date.today().isoformat(), command=" ".join(sys.argv),
                shape=f"{args.tokens} tokens/GPU, GQA {args.hq}:{args.hkv}, d {args.d}, "
                      f"bf16, {args.rounds} rounds x {args.calls} forwards a way", **extra)
