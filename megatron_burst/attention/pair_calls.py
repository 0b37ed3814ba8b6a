"""The kernel calls of each pair of ring members a plan runs, each pair planned once.

Apart from ``call_plan`` because it is the one place that picks how a pair's blocks become
kernel calls: a plain sequence's blocks grouped by ``varlen.plan_calls``; a pack's split
documents' blocks with its whole documents joined in (``pack_calls``); a single member's
pack as one call from its boundaries (``varlen.plan_alone``); documents the GPU reads as
launches bound to each call's boundary table (``device_calls``).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from ..comm.ring_positions import RingPositions
from ..kernels.device_calls import BoundarySides, pair_launches
from ..kernels.pack_calls import alone_shard, carved_whole, with_whole
from ..kernels.varlen import KernelLaunch, call_runs, plan_alone, plan_calls
from ..plan.blocks import one_partial
from ..plan.placement import local_length
from ..plan.schedule import Block, RingSchedule


class PairCalls:
    """The kernel calls of a pair of members, each pair planned once per build (``key``:
    the plan's ``call_plan.PlanKey``, which imports this module). ``min_area``: the dense
    threshold these calls are planned with (the key's ``dense_min_area`` unless given: a
    plan's passes bound by the GPU take the key's ``gpu_bound_min_area``)."""

    def __init__(self, key, sched: RingSchedule, topo: RingPositions | None,
                 min_area: float | None = None):
        self.key, self.sched = key, sched
        self.min_area = key.dense_min_area if min_area is None else min_area
        self.alone = (topo is None and key.pack and key.ulysses == 1
                      and local_length(key.layout, key.world, key.lens) == sum(key.lens))
        self.sides = BoundarySides(sum(key.lens)) if key.device_docs else None
        # (query member, key member, q_from, k_from) -> its calls
        self._made: dict[tuple, tuple[KernelLaunch, ...]] = {}

    def __call__(self, q_member: int, k_member: int, q_from=0, k_from=0
                 ) -> tuple[KernelLaunch, ...]:
        """The pair's calls on payloads held from row ``q_from`` of the query member's rows
        and ``k_from`` of the key member's (a hop carries a span: ``needed_ranges``), or
        packed from runs (``plan.runs.held_map``)."""
        pair = (q_member, k_member, q_from, k_from)
        if pair not in self._made:
            self._made[pair] = self._plan(q_member, k_member, q_from, k_from)
        return self._made[pair]

    def elsewhere(self, q_member: int, k_member: int) -> tuple[KernelLaunch, ...]:
        """The calls of a pair another member runs, to read their shape (``call_plan``'s
        wire): planned as this member would, but never bound or launched here, so a device
        plan's launches (``sides``) stay the ones this member runs."""
        if (q_member, k_member, 0, 0) in self._made or self.sides is None:
            return self(q_member, k_member)
        own = self.sides
        self.sides = BoundarySides(own.total)
        try:
            return self._plan(q_member, k_member)
        finally:
            self.sides = own

    def _plan(self, q_member: int, k_member: int, q_from=0, k_from=0
              ) -> tuple[KernelLaunch, ...]:
        key, sched = self.key, self.sched
        if (q_from or k_from) and (self.alone or self.sides is not None or q_member == k_member):
            raise ValueError(f"PairCalls: members ({q_member}, {k_member}) planned on payloads "
                             f"from rows ({q_from}, {k_from}); a member's own rows, a single "
                             f"member's pack and device-read documents are held from row 0")
        if self.alone and key.grain:  # a single member's pack, its large documents carved
            return carved_whole((), alone_shard(sched.doc_lens), sched.mask, key.grain,
                                key.least)
        if self.alone:  # a single member's pack: one varlen call from the boundaries
            return plan_alone(sched.doc_lens, sched.mask)
        if self.sides is not None:
            return pair_launches(sched.shard(q_member), sched.shard(k_member),
                                 key.mask.causal, self.sides)
        if not key.pack or not key.varlen:
            return plan_calls(_from(sched.blocks(q_member, k_member), q_from, k_from),
                              varlen=key.varlen, dense_min_area=self.min_area,
                              shape_free=key.dense_min_area is None, grain=key.grain)
        # A pack: the split documents' blocks, the whole ones from the shard's arrays (the
        # large ones as blocks where the plan carves).
        split = _from(sched.split_blocks(q_member, k_member), q_from, k_from)
        if q_member == k_member and key.grain:
            return carved_whole(split, sched.shard(q_member), sched.mask, key.grain, key.least)
        calls = plan_calls(split, varlen=True, dense_min_area=None, shape_free=True,
                           grain=key.grain, least=key.least)
        if q_member == k_member:  # (inline: a new pack's host path counts its calls)
            calls = with_whole(calls, sched.shard(q_member), sched.mask)
        return calls


def one_partial_wire(ring: RingPositions, last: int, calls: PairCalls,
                     pair: Callable[[int, int], tuple[int, int]], side: str
                     ) -> tuple[bool, bool]:
    """``call_plan.PassPlan.wire``: whether the travelling accumulator this member fills,
    and the one it receives home, each take at most one kernel partial per row. That needs a single
    holder (``last == 1``: it goes home from there, nothing added on the way) whose calls
    on the payload (those of ``pair(holder, origin)``, its (query, key) members) touch each
    of its rows once (``plan.blocks.one_partial``). The holder's calls are planned here from
    the same key (``PairCalls.elsewhere``), so sender and receiver decide the same (a
    mismatch would garble the message)."""
    if last != 1:  # (not one holder: no need to plan the holder's calls)
        return False, False
    me = ring.index
    fills = calls(*pair(me, ring.source(me, 1)))
    comes_home = calls.elsewhere(*pair(ring.holder(me, 1), me))
    return (one_partial(last, runs_of(fills, side)),
            one_partial(last, runs_of(comes_home, side)))


def runs_of(calls, side: str) -> list[tuple[int, int]]:
    """Every run of ``calls`` on ``side`` (a run as often as it appears): what
    ``plan.blocks.one_partial`` and the call plan's ``uses`` count."""
    return [run for call in calls for run in call_runs(call, side)]


def _from(blocks: tuple[Block, ...], q_from, k_from) -> tuple[Block, ...]:
    """``blocks`` on payloads as held: from rows ``q_from`` and ``k_from`` of the members'
    rows (a span), or packed from runs (``plan.runs.held_map``: a hop that carries a
    window's two edges). The same rectangles moved (a band's bounds are counted from its
    block's corner, so they stay)."""
    if not q_from and not k_from:
        return blocks
    out = []
    for b in blocks:
        q0, q1 = _moved(b.q_start, b.q_stop, q_from)
        k0, k1 = _moved(b.k_start, b.k_stop, k_from)
        out.append(dataclasses.replace(b, q_start=q0, q_stop=q1, k_start=k0, k_stop=k1))
    return tuple(out)


def _moved(start: int, stop: int, by) -> tuple[int, int]:
    """Rows [start, stop) of a member's rows in its payload as held (``_from``)."""
    if isinstance(by, int):
        return start - by, stop - by
    for a, z, at in by:
        if a <= start < z:
            if stop > z:
                raise ValueError(f"PairCalls: a block's rows [{start}, {stop}) cross the end "
                                 f"of the held run [{a}, {z}): runs {by}")
            return start - a + at, stop - a + at
    raise ValueError(f"PairCalls: a block's rows [{start}, {stop}) are in no held run {by}")
