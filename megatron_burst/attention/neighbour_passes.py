"""Passes in two rounds, one each way round the ring: a two-sided window on 4+ members.

A band read across both ends of each member's rows (a sliding window (w, w)) needs, per
member, the tail of the member before it in the sequence and the head of the one after.
Round a one-way ring the head of the one after arrives at the last step, relayed by every
other member: on 8 ranks of the contiguous layout seven hops one after another, each
waiting for the one before, with nothing to compute between. Here a pass is two rounds:
``a`` steps round the ring and ``b`` round the reversed ring (``plan.runs.two_way_reach``:
1 and 1 on the contiguous layout; 2 and 2 where the area layout put the sequence's two
ends on their own ranks), and the second round's first hops are posted at step 0 beside the first
round's, so its first payload travels meanwhile. In the backward each round's accumulators
go home within their round. The burst backward's queries come the way K/V went in the
forward, round for round.

Exact as the one-way pass is: every (query member, key member) pair is read in exactly one
round, at the step whose payload holds it, from the same tables (``plan.runs``, cut at the
round's last step). The accumulators travel in fp32 (``PassPlan.wire`` off: the rule that
lets one partial travel in half precision is the one-way ring's).
"""
from __future__ import annotations

import dataclasses

from ..comm.ring_positions import RingPositions
from ..plan.schedule import RingSchedule
from .first_writes import backward_writes, first_writes
from .pair_calls import PairCalls
from .pass_plan import PassPlan, build_pass, fresh_of, uses_of

BACK = "back"  # the kind of the hops that go round the reversed ring


def neighbour_passes(sched: RingSchedule, topo: RingPositions, calls: PairCalls,
                     backward: str, reach: tuple[int, int]) -> tuple[PassPlan, PassPlan]:
    """(forward, backward) in two rounds of ``reach`` (a, b) steps (module docstring);
    ``backward``: the mode, 'ring' or 'burst'."""
    back = topo.reversed()
    (a, b), me, n = reach, topo.index, sched.shard(topo.index).length
    own = fresh_of(calls(me, me), n)
    left, right = sched.needed_runs(topo.source, "k", last=a), sched.needed_runs(
        back.source, "k", last=b)
    on_keys = lambda src, at: calls(me, src, k_from=at)  # noqa: E731
    forward = _joined(build_pass(topo, a, left, on_keys, own, None, True),
                      build_pass(back, b, right, on_keys, own, None, True))
    forward = dataclasses.replace(forward, uses=(uses_of(forward.steps, n, "q"), 0),
                                  **first_writes(forward, n))
    if backward == "burst":  # the queries that held our keys at the forward's steps
        first, then = sched.needed_runs(back.source, "q", last=a), sched.needed_runs(
            topo.source, "q", last=b)
        on_queries = lambda src, at: calls(src, me, q_from=at)  # noqa: E731
        pass_ = _joined(build_pass(back, a, first, on_queries, own, "q", True),
                        build_pass(topo, b, then, on_queries, own, "q", True))
        uses = (uses_of(pass_.steps[:1], n, "q", first[me][1] + then[me][1], True),
                uses_of(pass_.steps, n, "k"))
    else:
        pass_ = _joined(build_pass(topo, a, left, on_keys, own, "k", True),
                        build_pass(back, b, right, on_keys, own, "k", True))
        uses = (uses_of(pass_.steps, n, "q"),
                uses_of(pass_.steps[:1], n, "k", left[me][1] + right[me][1], True))
    return forward, dataclasses.replace(pass_, uses=uses, wire=(False, False),
                                        **backward_writes(pass_, n, backward, forward))


def _joined(first: PassPlan, then: PassPlan) -> PassPlan:
    """One pass: ``first``'s steps, then ``then``'s from step 1. ``then``'s step-0 hops
    are posted beside ``first``'s (kind ``BACK``, as are all its hops), so its first
    payload travels while ``first``'s steps run; it is taken after ``first``'s last step.
    Both are passes of the same member (the same own calls at step 0)."""
    ours, theirs = first.steps, then.steps
    back = [tuple(dataclasses.replace(h, kind=BACK) for h in step.hops) for step in theirs]
    steps = [dataclasses.replace(ours[0], hops=ours[0].hops + back[0])]
    steps += [dataclasses.replace(step, next=step.next or BACK) for step in ours[1:]]
    steps += [dataclasses.replace(step, hops=hops, next=BACK if step.next else None)
              for step, hops in zip(theirs[1:], back[1:])]
    return PassPlan(tuple(steps), first.fresh, first.travels or then.travels,
                    first.receives + then.receives)
