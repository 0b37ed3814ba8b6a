"""One pass of a call's plan: its steps (``StepPlan``) and what holds for the whole pass
(``PassPlan``), and how a pass round a ring is built from its payloads' row tables
(``build_pass``).

Apart from ``call_plan`` so that ``ring_rounds`` builds a call's ring passes, in one round
or two, from these pieces without importing the plan that holds them.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from ..comm.ring_positions import (AccumulatorStep, Hop, RingPositions, accumulator_steps,
                                   next_kind, route_hops)
from ..kernels.varlen import KernelLaunch, covers
from ..plan.blocks import most_per_row
from ..plan.runs import held_tables
from .pair_calls import runs_of


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """One ring step of one pass: whose payload this position holds (``source``), the
    kernel calls of its blocks, the hops that bring the next step's payload (and which of
    them to wait on, ``next``: None at the last step), and the travelling accumulators'
    traffic (backward passes from step 1)."""

    source: int
    calls: tuple[KernelLaunch, ...]
    hops: tuple[Hop, ...] = ()
    next: str | None = None
    acc: AccumulatorStep | None = None
    # The calls write each row of the travelling accumulator exactly once: it starts
    # uninitialised and they write into it (else it starts at zero and they add).
    acc_fresh: bool = False


@dataclasses.dataclass(frozen=True)
class PassPlan:
    """One pass round the ring: its steps, and whether step 0 (a member against its own
    keys) writes each query row and each key row exactly once (``fresh``), so that the
    accumulators start uninitialised instead of zeroed."""

    steps: tuple[StepPlan, ...]
    fresh: tuple[bool, bool]
    travels: bool  # any hop at all: the pass needs a ring and its messages
    receives: int = 0  # messages this rank receives in the pass (headers to check)
    # The most partial results any one home row of the queries' and of the keys'
    # accumulators receives (kernel calls, and a travelling accumulator coming home).
    # At most two: the sum is exact in the inputs' half precision (one rounding, as an
    # fp32 accumulator cast at the end gives), so no fp32 copy of them is needed.
    uses: tuple[int, int] = (0, 0)
    # Whether the travelling accumulator this rank fills (first) and the one it receives
    # home (second) take at most one kernel partial per row on their whole route. Such an
    # accumulator travels in the inputs' own dtype: a kernel's gradients come in it, so the
    # one partial is held exactly (the same bits as fp32), in half the bytes.
    wire: tuple[bool, bool] = (False, False)
    writes: tuple = ()  # per step, per call: (query runs', key runs') written (first_writes)
    # The forward's query rows that take more than two partials (``blocks.rows_over``): in
    # half precision the rest need no fp32 copy (``home_output.WideRows``).
    wide_rows: tuple[tuple[int, int], ...] = ()
    home_from_first: bool = False  # the home accumulator is the first call's output (same)
    # The forward's home joined from step 0's outputs, whose runs tile every row once
    # (``first_writes.PIECES_MIN``, ``home_output.pieces_home``).
    home_pieces: bool = False


def build_pass(topo: RingPositions, last: int, spans: tuple, calls_with: Callable,
               fresh: tuple[bool, bool], accumulate: str | None, runs: bool = False
               ) -> PassPlan:
    """The steps of one pass round ``topo`` (``spans``: its payload's span table,
    ``RingSchedule.needed_ranges``, or with ``runs`` its run table, ``needed_runs``);
    ``calls_with(source, held)``: the calls on the source's payload as held (from a row,
    or packed from runs); ``accumulate``: the side ('k' or 'q') of the payload whose
    gradients travel, if any."""
    gather = home = held = None
    if runs:
        rows, starts, gather, home, held = held_tables(spans)
    else:
        rows = lambda origin, step: spans[origin][step][1] - spans[origin][step][0]  # noqa
        starts = lambda origin, step: spans[origin][step][0]  # noqa: E731
    hops = route_hops(topo, last, rows, starts, gather)
    accs = (accumulator_steps(topo, last, rows, starts, home) if accumulate
            else (None,) * (last + 1))
    steps = []
    for step in range(last + 1):
        source = topo.source(topo.index, step)
        if held is not None:
            at = held(source, step)
            calls = calls_with(source, at) if at is not None else ()
        else:
            first, stop = spans[source][step] if step else (0, 1)  # step 0: its own, whole
            calls = calls_with(source, first) if stop > first else ()  # else nothing used
        acc = accs[step]
        acc_fresh = bool(acc is not None and acc.new_rows and not acc.held_at
                         and covers(calls, acc.new_rows, accumulate))
        steps.append(StepPlan(source, calls, hops[step],
                              next_kind(topo, step) if step < last else None, acc, acc_fresh))
    receives = sum(bool(h.n_recv) for hop in hops for h in hop) + sum(
        (a.recv_next is not None) + (a.recv_home is not None) for a in accs if a is not None)
    return PassPlan(tuple(steps), fresh, any(hops), receives)


def uses_of(steps: tuple[StepPlan, ...], rows: int, side: str, returned=None,
            runs: bool = False) -> int:
    """The most kernel calls of ``steps`` that touch any one of the ``rows`` rows on
    ``side``, with one more on the ``returned`` rows (an accumulator come home: a span, or
    with ``runs`` its runs)."""
    spans = runs_of([call for step in steps for call in step.calls], side)
    if runs:
        return most_per_row(spans + list(returned or ()))
    return most_per_row(spans + ([returned] if returned and returned[1] > returned[0] else []))


def fresh_of(own: tuple[KernelLaunch, ...], rows: int) -> tuple[bool, bool]:
    """Whether a member's own calls write every query row, and every key row, once."""
    return covers(own, rows, "q"), covers(own, rows, "k")
