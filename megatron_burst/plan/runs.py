"""Which rows of a payload travel, as runs: a window's hop carries the edges it is read at.

``RingSchedule.needed_ranges`` gives, for each member's payload and each ring step, the span
of rows used from that step on. A span is one interval: where two later holders read the
two ends of a shard, the span holds both ends and all between. That happens wherever a
band reaches both neighbours of a member: on 4 ranks a two-sided sliding window's K/V of
member o are read at their end by o+1 (step 1) and at their start by o-1 = o+3 (step 3), so
the span from step 1 on was the whole shard (37.7 MB a hop where the window needs 4.2 MB,
``benchmarks/results/h100x4_checks/``).

Here the rows used from a step on are runs: sorted, disjoint [start, stop) intervals. The
payload held at step s >= 1 is its runs packed one after the other, in row order. The
gradient accumulator that follows a payload (the backward) covers the runs of step 1, and a
holder's kernels write into it from where its held runs begin, so the held runs of every
step must be one interval of step 1's runs packed: where they are not, they are widened to
that interval (rows between that nobody reads any more travel then, as a span's did).
Runs only shrink from step to step, so a holder sends on one interval of what it holds
(a view); only the owner, at step 0, gathers its runs from its shard.

Documents packed on the host keep their spans (one run): their holders read a document's
leading rows, and a pack is planned on every call's path, where the runs' extra Python
would cost more than the rows they save. Slice masks and windows (planned once per shape)
take runs.

``pass_rounds`` says whether a pass goes round the ring both ways instead (a two-sided
window on 4+ members, by ``two_way_reach``: ``attention.ring_rounds``), each round's table
cut at its last step (``needed_runs(..., last=)``).
"""
from __future__ import annotations

from typing import Callable

from .layouts import MASK, PLAIN, layout_named
from .slices import SliceMask

Runs = tuple[tuple[int, int], ...]  # sorted, disjoint, non-empty [start, stop) rows
Source = Callable[[int, int], int]


def gapped(sched: "RingSchedule") -> bool:
    """Whether the schedule's payloads may be read at runs with gaps between (a slice mask,
    or a window without documents): the calls for which runs are computed."""
    masked = isinstance(sched.mask, SliceMask)
    if not masked and (sched.mask.plain or len(sched.doc_lens) != 1):
        return False  # (first: a new pack's plan asks, and pays each Python call)
    # A layout whose launches read a shard from its first row: leading rows travel.
    return not layout_named(sched.layout, MASK if masked else PLAIN).hops_from_first_row


def needed_runs(sched: "RingSchedule", source: Source, side: str = "k",
                last: int | None = None) -> tuple[tuple[Runs, ...], ...]:
    """``runs[o][s]``: the rows of member o's payload used at step s or later (``()``:
    none), as runs (module docstring); side 'k' or 'q' as in ``needed_ranges``. ``last``:
    a pass that stops there (``attention.ring_rounds``: one step each way), whose
    table counts no use after it (a gapped schedule's only)."""
    if not gapped(sched):
        if last is not None:
            raise ValueError("needed_runs: last= is for schedules read at runs (gapped)")
        return tuple(tuple(((a, z),) if z > a else () for a, z in row)
                     for row in sched.needed_ranges(source, side))
    size, on_keys = sched.ring_size, side == "k"
    used: list[list[Runs]] = [[()] * size for _ in range(size)]
    for m in range(size):
        for s in range(size if last is None else last + 1):
            o = source(m, s)
            used[o][s] = sched.split_rows(m, o, "k") if on_keys else sched.split_rows(o, m, "q")
    out = []
    for o, row in enumerate(used):
        for s in range(size - 2, 0, -1):  # from a step on: every use then or later
            row[s] = merged([*row[s], *row[s + 1]])
        for s in range(2, size):
            row[s] = packed_interval(row[s], row[1])
        # Step 0: its own payload, held whole from row 0 where it uses any (as
        # ``needed_ranges`` has it), with the rows used later.
        stop = max(row[0][-1][1] if row[0] else 0, sched.shard(o).whole_end)
        row[0] = merged([*(((0, stop),) if stop else ()), *(row[1] if size > 1 else ())])
        out.append(tuple(row))
    return tuple(out)


def merged(runs: list[tuple[int, int]]) -> Runs:
    """``runs`` sorted and joined where they touch or overlap."""
    out: list[list[int]] = []
    for a, z in sorted(runs):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], z)
        else:
            out.append([a, z])
    return tuple((a, z) for a, z in out)


def packed_at(runs: Runs, of: Runs) -> int:
    """Where ``runs`` (a part of ``of``) begin in ``of``'s rows packed one after the
    other: the row of the first run's start."""
    at, first = 0, runs[0][0]
    for a, z in of:
        if a <= first < z:
            return at + first - a
        at += z - a
    raise ValueError(f"runs {runs} are not within {of}")


def length(runs: Runs) -> int:
    return sum(z - a for a, z in runs)


def packed_interval(runs: Runs, of: Runs) -> Runs:
    """``runs`` widened to the rows of ``of`` between their first and last row: one
    interval of ``of`` packed (``runs`` unchanged where they are one already)."""
    if len(runs) < 2:
        return runs
    lo, hi = runs[0][0], runs[-1][1]
    within = tuple((max(a, lo), min(z, hi)) for a, z in of if a < hi and z > lo)
    return runs if within == runs else within


def held_map(runs: Runs) -> tuple[tuple[int, int, int], ...]:
    """(start, stop, where it begins in the payload) of each run, packed in order: how a
    block's rows (counted in the member's rows) are found in the payload as held."""
    out, at = [], 0
    for a, z in runs:
        out.append((a, z, at))
        at += z - a
    return tuple(out)


def held_tables(runs: tuple[tuple[Runs, ...], ...]):
    """A pass's tables over its payloads' runs (``needed_runs``), as ``call_plan`` reads a
    span table: (rows(o, s): how many a hop carries; starts(o, s): where the rows held at
    step s >= 1 begin, counted so that two steps' difference is where one begins in the
    other as packed; gather(o, s): the runs the owner sends at step 0; home(o): the runs
    its accumulator covers; held(o, s): how a step's kernel calls find their rows in the
    payload (0 at step 0, a row where one run is held, a ``held_map`` where more are;
    None: nothing used))."""
    def rows(o: int, s: int) -> int:
        return length(runs[o][s])

    def starts(o: int, s: int) -> int:
        if not runs[o][s]:
            return 0
        return runs[o][1][0][0] + packed_at(runs[o][s], runs[o][1]) if s else runs[o][s][0][0]

    def held(o: int, s: int):
        if not s:
            return 0
        here = runs[o][s]
        return None if not here else here[0][0] if len(here) == 1 else held_map(here)

    return rows, starts, (lambda o, s: runs[o][s]), (lambda o: runs[o][1]), held


def last_run_step(runs: tuple[tuple[Runs, ...], ...]) -> int:
    """The last step of a run table that uses any row (``schedule.last_spanned_step``)."""
    return max((s for row in runs for s, r in enumerate(row) if r), default=0)


def two_way_reach(sched: "RingSchedule", topo, ulysses: int) -> tuple[int, int] | None:
    """(a, b): the steps a pass takes round the ring and round the reversed ring, where
    that is fewer than one way round takes (None: one way, as before). Every payload a
    member reads is then at most ``a`` members behind it or ``b`` ahead, and each (query,
    key) pair of members is read in exactly one of the two rounds (``a + b`` is less than
    the members, so no distance is in both). Only a flat ring of 4+ members without
    Ulysses, a schedule read at runs; both sides agree, a pair being the same either way.
    ``topo``: the ring's positions (``comm.RingPositions``). Read through
    ``pass_rounds``, by the plan and the cost models alike."""
    size = topo.size
    if size < 4 or topo.nodes != 1 or ulysses != 1 or not gapped(sched):
        return None
    read = sorted({s for m in range(size) for s in range(1, size)
                   if sched.split_rows(m, topo.source(m, s))})
    if not read:
        return None
    best = None
    for cut in range(read[-1] + 1):  # distances up to ``cut`` one way, the rest the other
        a = max((s for s in read if s <= cut), default=0)
        b = max((size - s for s in read if s > cut), default=0)
        if best is None or a + b < sum(best):
            best = (a, b)
    return best if _fewer_steps(best, read[-1]) else None


def _fewer_steps(reach: tuple[int, int], one_way: int) -> bool:
    """Whether rounds of ``reach`` (a, b) take fewer steps than ``one_way``'s one round, with
    a step each way."""
    return reach[1] > 0 and reach[0] > 0 and sum(reach) < one_way


def pass_rounds(sched: "RingSchedule", topo, ulysses: int, reverse: bool = False) -> tuple:
    """The rounds a pass goes, as (ring, its last step; None: as far as the ring reads):
    one round ``topo``, or one each way where ``two_way_reach`` says so. ``reverse``: each
    ring the other way (the burst backward's queries, round for round). The plan
    (``attention.ring_rounds``) and the cost model (``decide``) both read it here."""
    reach = two_way_reach(sched, topo, ulysses) if topo.size > 1 else None
    rounds = (((topo, None),) if reach is None
              else ((topo, reach[0]), (topo.reversed(), reach[1])))
    return tuple((t.reversed(), last) for t, last in rounds) if reverse else rounds
