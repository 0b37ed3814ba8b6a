"""Which of a pass's partial results are written, not folded in: each home row's first.

Every kernel call's result is folded into home accumulators: the forward merges (out,
lse), the backward adds gradients. A row's first partial needs neither: merging it into
zeros and lse -inf, or adding it to zeros, gives the partial itself, after reading the
zeros, and the zeros cost a fill first. A mask whose own step does not cover every row
exactly once (``pass_plan.fresh_of``: a window's band beside the global rows, a document
seen whole on the other rank) used to fill and fold every call; on 2x H100 the causal
blockwise and global window forwards spent 0.7 and 1.1 ms a call in merges
(``benchmarks/slice_mask_profile.py``). Here each call's run of home rows that no earlier
call touched is marked to be written, and a home accumulator starts uninitialised when
every row is first written by such a run (``PassPlan.fresh``).

A backward has one home side and one travelling side (``ring``: dQ home, dK/dV travel;
``burst``: the other way). The travelling accumulator keeps its own rule: written at step
0 where the own calls cover it once, and at a later step where its new rows are covered
once (``StepPlan.acc_fresh``).
"""
from __future__ import annotations

import bisect

from ..kernels.varlen import call_runs, covers
from ..plan.blocks import rows_over

Flags = tuple[bool, ...]  # per run of one call, in ``call_runs`` order


def first_writes(forward, rows: int) -> dict:
    """``forward``'s (a ``call_plan.PassPlan``) fields this module decides, for
    ``dataclasses.replace``: ``writes`` (per step, per call: (query runs' flags, ())), its
    ``fresh`` (every one of ``rows`` query rows is first written: no fill), and its
    ``wide_rows`` (the rows that take more than two partials)."""
    flags, fresh = _home_writes(forward, rows, "q")
    writes = tuple([tuple([(f, ()) for f in step]) for step in flags])
    runs: list[tuple[int, int]] = []  # (plain loops: a new pack's planning is counted)
    for step in forward.steps:
        for call in step.calls:
            runs.extend(call_runs(call, "q"))
    home_from_first = fresh and _first_covers(forward, rows)
    return {"writes": writes, "fresh": (fresh, forward.fresh[1]),
            "home_from_first": home_from_first,
            "home_pieces": not home_from_first and _pieces_cover(forward, flags, rows),
            "wide_rows": rows_over(runs, 2) if len(runs) > 2 else ()}


# From this many runs in a forward's step 0, all first writes that tile every row once, the
# home is joined from them by one copy for out and one for lse (``home_output.pieces_home``)
# rather than written by one launch of the merge a run: on a host-bound rank each launch
# cost about 30 us of host (native profile, README), the two joins about that each.
PIECES_MIN = 3


def _pieces_cover(forward, flags: tuple, rows: int) -> bool:
    """Whether ``forward``'s step 0 writes every one of ``rows`` query rows exactly once, in
    at least ``PIECES_MIN`` runs, each the first partial of its rows (``flags[0]``)."""
    if not forward.steps or not flags:
        return False
    calls = forward.steps[0].calls
    return (sum(len(f) for f in flags[0]) >= PIECES_MIN and all(all(f) for f in flags[0])
            and covers(calls, rows, "q"))


def backward_writes(backward, rows: int, mode: str, forward) -> dict:
    """The same for a backward pass of ``mode`` ('ring': dQ stays home; 'burst': dK/dV
    do): per step, per call, (query runs' flags, key runs' flags), the travelling side's
    by its own rule. ``forward``: the call's forward, with its writes; a 'ring' backward
    whose steps make the forward's calls (the plans make them so) takes its query flags."""
    home = "k" if mode == "burst" else "q"
    if home == "q" and not backward.fresh[0] and _same_calls(forward, backward):
        flags = tuple([tuple([q for q, _ in step]) for step in forward.writes])
        fresh = forward.fresh[0]
    else:  # (a pass whose own step writes every row once is cheap to flag: no search)
        flags, fresh = _home_writes(backward, rows, home)
    away = 1 if home == "q" else 0
    writes = []
    for i, (step, step_flags) in enumerate(zip(backward.steps, flags)):
        travel = backward.fresh[away] if i == 0 else step.acc_fresh
        pairs = []
        for call, f in zip(step.calls, step_flags):
            t = (travel,) * _runs(call, away)
            pairs.append((f, t) if away else (t, f))
        writes.append(tuple(pairs))
    both = (fresh, backward.fresh[1]) if away else (backward.fresh[0], fresh)
    # Only a home dQ is taken from the first call ('ring'); dK/dV's calls are per key run.
    return {"writes": tuple(writes), "fresh": both,
            "home_from_first": bool(away) and fresh and _first_covers(backward, rows)}


def _first_covers(pass_, rows: int) -> bool:
    """Whether ``pass_``'s first kernel call covers all ``rows`` query rows in one run, in
    order (a dense block over them, or a varlen call whose sequences follow one another
    over them): where every row is first written, its output is the home accumulator in
    row order (``home_output``)."""
    steps = pass_.steps
    return bool(steps and steps[0].calls) and call_runs(steps[0].calls[0], "q") == ((0, rows),)


def _same_calls(forward, backward) -> bool:
    """Whether the two passes make the same kernel calls, step for step (a 'ring'
    backward's: ``call_plan`` builds both from one ``PairCalls``)."""
    return len(forward.steps) == len(backward.steps) and all(
        f.calls is b.calls for f, b in zip(forward.steps, backward.steps))


def _home_writes(pass_, rows: int, side: str) -> tuple[tuple[tuple[Flags, ...], ...], bool]:
    """(per step, per call: its ``side`` runs' flags; whether every one of ``rows`` rows is
    first written). Plain loops, no generator: a new pack plans anew, and its host work is
    counted (``tests/test_host_path.py``)."""
    index = 0 if side == "q" else 1
    if pass_.fresh[index]:  # step 0 writes every row once (``pass_plan.fresh_of``): the rest
        return tuple([tuple([(i == 0,) * _runs(call, index) for call in step.calls])
                      for i, step in enumerate(pass_.steps)]), True  # fold. Kept cheap.
    touched: list[tuple[int, int]] = []  # rows written so far: disjoint, sorted, joined
    clean = True  # every folded run lies on rows already written
    flags = []
    for step in pass_.steps:
        step_flags = []
        for call in step.calls:
            firsts = []
            for a, b in call_runs(call, side):  # in the order the fold runs them
                write, inside = _seen(touched, a, b)
                firsts.append(write)
                clean = clean and (write or inside)
                if b > a:
                    _insert(touched, a, b)
            step_flags.append(tuple(firsts))
        flags.append(tuple(step_flags))
    return tuple(flags), clean and touched == ([(0, rows)] if rows else [])


def _runs(call, side: int) -> int:
    """How many runs ``call_runs`` gives on side 0 (queries) or 1 (keys), without making
    them: a dense call has one."""
    return len(call.k_runs if side else call.q_runs) if call.varlen else 1


def _seen(touched: list[tuple[int, int]], a: int, b: int) -> tuple[bool, bool]:
    """(no row of [a, b) is in ``touched``, and the run is not empty: written; all of them
    are: folded without a fill). A key row that two blocks of one call use appears in two
    runs: the first writes it, the second adds, in that order."""
    i = bisect.bisect_right(touched, (a, _AFTER))
    left = touched[i - 1] if i else (0, 0)
    overlaps = (i and left[1] > a) or (i < len(touched) and touched[i][0] < b)
    return b > a and not overlaps, b <= a or bool(i and left[0] <= a and left[1] >= b)


def _insert(spans: list[tuple[int, int]], a: int, b: int) -> None:
    """Rows [a, b) added to the sorted, disjoint ``spans``, touching spans joined."""
    lo = bisect.bisect_left(spans, (a, -1))
    if lo and spans[lo - 1][1] >= a:
        lo -= 1
    hi = lo
    while hi < len(spans) and spans[hi][0] <= b:
        hi += 1
    if hi > lo:
        a, b = min(a, spans[lo][0]), max(b, spans[hi - 1][1])
    spans[lo:hi] = [(a, b)]


_AFTER = 1 << 62  # sorts after any row: (a, _AFTER) follows every span starting at a
