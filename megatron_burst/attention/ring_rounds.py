"""A call's ring passes, in rounds: one round the ring, or one each way round it.

Forward: K/V go round the ring. Backward 'ring': K/V go round again, their dK/dV one step
behind. Backward 'burst': the queries (with dO, lse, delta) go the reversed way, so at step
s a member holds the queries that held its K/V at step s of the forward (the same pairs
step for step, and the same last step); dQ one step behind.

Usually a pass is one round, to the last step anything is read. Where every payload a
member reads is a few members away one way or the other (``plan.runs.pass_rounds``: a
window on 4+ members; round a one-way ring the far neighbour's edge came at the last step,
relayed by every other member), a pass is two rounds: ``a`` steps round the ring, then
``b`` round the reversed ring, the second round's first hops posted at step 0 beside the
first round's (kind ``BACK``), so its first payload travels meanwhile. Each round is built
by the same pass builder (``pass_plan.build_pass``) from its own tables, cut at its last
step. In the backward each round's accumulators go home within their round, in fp32
(``PassPlan.wire`` off: the rule that lets one partial travel in half precision is the one
holder's of a single round). Exact either way: every (query member, key member) pair is
read in exactly one round, at the step whose payload holds it.
"""
from __future__ import annotations

import dataclasses

from ..comm.ring_positions import RingPositions
from ..plan.runs import gapped, last_run_step, pass_rounds
from ..plan.schedule import RingSchedule, last_spanned_step
from .first_writes import backward_writes, first_writes
from .pair_calls import PairCalls, one_partial_wire
from .pass_plan import PassPlan, build_pass, fresh_of, uses_of

BACK = "back"  # the kind of the hops of a second round, the reversed ring's


def ring_passes(sched: RingSchedule, topo: RingPositions, calls: PairCalls,
                back_calls: PairCalls, backward: str, ulysses: int) -> tuple[PassPlan, PassPlan]:
    """(forward, backward) of a ring of several members (module docstring), their kernel
    calls from ``calls`` and ``back_calls`` (one object where one threshold serves both);
    ``backward``: the mode, 'ring' or 'burst'. A new document pack plans this on its
    call's path: one round takes no step that two need (no loop, no generator)."""
    runs = gapped(sched)  # a window's hop carries its edges as runs (``plan.runs``)
    rounds = pass_rounds(sched, topo, ulysses)
    one = not rounds[1:]
    table = sched.needed_runs if runs else sched.needed_ranges
    if one:  # as far as the ring reads
        k_tables = (table(topo.source, "k"),)
        rounds = ((topo, last_run_step(k_tables[0]) if runs
                   else last_spanned_step(k_tables[0])),)
    else:
        k_tables = _cut(sched, rounds, "k")
    me, n = topo.index, sched.shard(topo.index).length
    own = fresh_of(calls(me, me), n)
    forward, _ = _built(rounds, k_tables, lambda src, at: calls(me, src, k_from=at), own,
                        None, runs, me)
    forward = dataclasses.replace(forward, uses=(uses_of(forward.steps, n, "q"), 0),
                                  **first_writes(forward, n))
    if back_calls is not calls:
        own = fresh_of(back_calls(me, me), n)
    if backward == "burst":  # the queries that held our keys, round for round
        rounds = tuple([(t.reversed(), last) for t, last in rounds])
        tables = (table(rounds[0][0].source, "q"),) if one else _cut(sched, rounds, "q")
        pass_, home = _built(rounds, tables, lambda src, at: back_calls(src, me, q_from=at),
                             own, "q", runs, me)
        uses = (uses_of(pass_.steps[:1], n, "q", home, runs), uses_of(pass_.steps, n, "k"))
        pair, side = (lambda holder, origin: (origin, holder)), "q"
    else:
        pass_, home = _built(rounds, k_tables, lambda src, at: back_calls(me, src, k_from=at),
                             own, "k", runs, me)
        uses = (uses_of(pass_.steps, n, "q"), uses_of(pass_.steps[:1], n, "k", home, runs))
        pair, side = (lambda holder, origin: (holder, origin)), "k"
    wire = one_partial_wire(*rounds[0], back_calls, pair, side) if one else (False, False)
    return forward, dataclasses.replace(pass_, uses=uses, wire=wire,
                                        **backward_writes(pass_, n, backward, forward))


def _cut(sched: RingSchedule, rounds, side: str) -> tuple:
    """Each round's table of the rows read from each step on, cut at its last step."""
    return tuple([sched.needed_runs(t.source, side, last=last) for t, last in rounds])


def _built(rounds, tables, calls_with, own: tuple[bool, bool], side: str | None, runs: bool,
           me: int) -> tuple[PassPlan, object]:
    """(the pass of ``rounds`` over their ``tables``, joined; the own rows whose
    accumulators come home, ``pass_plan.uses_of``'s ``returned``: one round's span or runs
    where it travels at all, both rounds' runs)."""
    first = build_pass(*rounds[0], tables[0], calls_with, own, side, runs)
    if not rounds[1:]:  # (a slice: no call on a new pack's path)
        return first, (tables[0][me][1] if rounds[0][1] else None)
    then = build_pass(*rounds[1], tables[1], calls_with, own, side, runs)
    return _joined(first, then), tables[0][me][1] + tables[1][me][1]


def _joined(first: PassPlan, then: PassPlan) -> PassPlan:
    """One pass: ``first``'s steps, then ``then``'s from step 1. ``then``'s step-0 hops are
    posted beside ``first``'s (kind ``BACK``, as are all its hops), so its first payload
    travels while ``first``'s steps run; it is taken after ``first``'s last step. Both are
    passes of the same member (the same own calls at step 0)."""
    ours, theirs = first.steps, then.steps
    back = [tuple(dataclasses.replace(h, kind=BACK) for h in step.hops) for step in theirs]
    steps = [dataclasses.replace(ours[0], hops=ours[0].hops + back[0])]
    steps += [dataclasses.replace(step, next=step.next or BACK) for step in ours[1:]]
    steps += [dataclasses.replace(step, hops=hops, next=BACK if step.next else None)
              for step, hops in zip(theirs[1:], back[1:])]
    return PassPlan(tuple(steps), first.fresh, first.travels or then.travels,
                    first.receives + then.receives)
