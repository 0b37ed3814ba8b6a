"""Ring positions: who holds which payload at each step, and which hops bring it there.

Why apart: the ring can be flat or a double ring (K/V go round the ranks of a node every
step and cross to the next node once every L steps). ``RingPositions`` answers who holds
what at each step and ``payload_hops`` which hops a position posts, as plain arithmetic on
positions. A call's plan turns it into data once (``route_hops``, ``accumulator_steps``),
which the rings (``rings.py``) follow step by step; the cost model (``cost.py``) counts
bytes by the same hop plan without any process group.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence


class RingPositions:
    """Ring positions 0..R-1 over global ``ranks``, as M nodes of L positions each.

    K/V (or any payload) move one position round the node's ring every step, and cross to
    the next node once every L steps (BurstAttention's double ring): L is
    ``positions_per_node`` (``intra`` here, in the arithmetic); None (or R) is the flat ring,
    one "node" of R positions.

    ``source(p, step)``: whose payload position p holds at ``step``.
    ``holder(o, step)``: which position holds o's payload at ``step``.
    ``reversed()``: the same ring run the other way, so that position p holds at step s
    the payload of the position that held p's payload at step s on this ring.
    """

    def __init__(self, ranks: Sequence[int], me: int, positions_per_node: int | None = None,
                 direction: int = 1):
        self.ranks = list(ranks)
        self.size = len(self.ranks)
        self.index = self.ranks.index(me)
        self.intra = positions_per_node or self.size
        self.nodes = self.size // self.intra
        self.direction = direction

    def reversed(self) -> "RingPositions":
        return RingPositions(self.ranks, self.ranks[self.index], self.intra, -self.direction)

    def _split(self, p: int, step: int) -> tuple[int, int, int, int]:
        t, u = divmod(step, self.intra)
        n, l_ = divmod(p, self.intra)
        return t * self.direction, u * self.direction, n, l_

    def source(self, p: int, step: int) -> int:
        t, u, n, l_ = self._split(p, step)
        return (n - t) % self.nodes * self.intra + (l_ - u) % self.intra

    def holder(self, owner: int, step: int) -> int:
        t, u, n, l_ = self._split(owner, step)
        return (n + t) % self.nodes * self.intra + (l_ + u) % self.intra

    def rank(self, p: int) -> int:
        return self.ranks[p]


Rows = Callable[[int, int], int]  # (origin position, step) -> rows used from that step on
# (origin position, step) -> the first of those rows, in the origin's payload
Starts = Callable[[int, int], int]


def _from_zero(origin: int, step: int) -> int:
    return 0


def payload_hops(topo: RingPositions, step: int, rows: Rows
                 ) -> list[tuple[str, int, int, int, int, int]]:
    """The hops position ``topo.index`` posts at ``step``: (kind, to, rows sent, from,
    rows received, the step from which the receiver uses what is sent), positions not
    ranks.

    Intra: the payload held now goes to the next position of the node, which uses it from
    step+1. Inter (the first step of each round of L steps): it also goes to the same
    position of the next node, which uses it from the next round on. A hop carries the
    rows its receiver will use, ``rows(origin, first step)``; zero means it is not sent.
    The receiver computes the same number for what it expects, so both sides agree.
    """
    def used(origin: int, first: int) -> int:
        return rows(origin, first) if first < topo.size else 0

    p, sign = topo.index, topo.direction
    t, u = divmod(step, topo.intra)
    n, l_ = divmod(p, topo.intra)
    hops = []
    if u == 0 and topo.nodes > 1:
        first = (t + 1) * topo.intra
        hops.append(("inter", (n + sign) % topo.nodes * topo.intra + l_,
                     used(topo.source(p, step), first),
                     (n - sign) % topo.nodes * topo.intra + l_, used(topo.source(p, first), first),
                     first))
    if u + 1 < topo.intra:
        hops.append(("intra", n * topo.intra + (l_ + sign) % topo.intra,
                      used(topo.source(p, step), step + 1),
                      n * topo.intra + (l_ - sign) % topo.intra,
                      used(topo.source(p, step + 1), step + 1), step + 1))
    return hops


# ------------------------------------------------------------------------- routes as data


@dataclasses.dataclass(frozen=True)
class Hop:
    """One transfer pair a position posts at a step, in global ranks: ``n_send`` rows of the
    payload it holds, from its row ``send_from``, to ``to``; ``n_recv`` rows from ``frm``
    (zero: no message)."""

    kind: str  # 'intra' (next position of the node) or 'inter' (the next node)
    to: int
    n_send: int
    frm: int
    n_recv: int
    send_from: int = 0
    # The owner's runs of its own payload to gather and send instead (``plan.runs``: a
    # window's two edges); empty: the ``n_send`` rows from ``send_from``, a view.
    send_runs: tuple = ()


@dataclasses.dataclass(frozen=True)
class AccumulatorStep:
    """What a position does at step s >= 1 with the travelling gradient accumulators:
    ``new_rows``, a zero accumulator for the payload it holds (0: none); ``send_to``, the
    global rank that accumulator goes to once this step's gradients are in it (the next
    holder, or its owner); ``recv_next`` and ``recv_home``, (rows, global rank) of the
    accumulator of the payload it holds at s+1, and of its own coming home.

    Rows are counted in the spans the schedule gives (``needed_ranges``): an accumulator
    covers the payload's rows any other position uses; ``held_at`` is where the rows held
    this step begin in it, and ``home_at`` where the one coming home begins in the own
    payload's rows."""

    new_rows: int = 0
    send_to: int | None = None
    recv_next: tuple[int, int] | None = None
    recv_home: tuple[int, int] | None = None
    held_at: int = 0
    home_at: int = 0
    # Where the accumulator coming home is added, run by run, when it covers runs of the
    # own payload (``plan.runs``); empty: from ``home_at`` on.
    home_runs: tuple = ()


def _held_from(starts: Starts, origin: int, step: int) -> int:
    """The first row of origin's payload that its holder at ``step`` has: all of it at
    step 0 (its own), else the span the hop that brought it carried."""
    return starts(origin, step) if step else 0


def route_hops(topo: RingPositions, last: int, rows: Rows, starts: Starts = _from_zero,
               runs: Callable[[int, int], tuple] | None = None
               ) -> tuple[tuple[Hop, ...], ...]:
    """The hops of steps 0..last (``payload_hops``, ranks global, empty hops left out).
    ``starts``: where the rows each hop carries begin in the origin's payload, so a hop
    sends from its held payload's row ``starts(origin, first) - _held_from(origin, step)``.
    ``runs(origin, first)``: the runs a hop carries (``plan.runs``): at step 0 the owner
    sends them from its own payload's rows (gathered where they are more than one; later
    holders send one interval of what they hold packed)."""
    out = []
    for step in range(last + 1):
        origin = topo.source(topo.index, step)
        held = _held_from(starts, origin, step)
        hops = []
        for kind, to, n_send, frm, n_recv, first in payload_hops(topo, step, rows):
            if not (n_send or n_recv):
                continue
            sent = runs(origin, first) if runs is not None and n_send and not step else ()
            at = (sent[0][0] if sent else starts(origin, first) - held) if n_send else 0
            hops.append(Hop(kind, topo.rank(to), n_send, topo.rank(frm), n_recv, at,
                            sent if sent[1:] else ()))  # (a slice: no call)
        out.append(tuple(hops))
    return tuple(out)


def next_kind(topo: RingPositions, step: int) -> str:
    """Which hop brings the payload of ``step + 1``: the intra-node one, except at the last
    step of a round, where it comes from the previous node."""
    return "intra" if step % topo.intra + 1 < topo.intra else "inter"


def accumulator_steps(topo: RingPositions, last: int, rows: Rows,
                      starts: Starts = _from_zero,
                      home_runs: Callable[[int], tuple] | None = None
                      ) -> tuple[AccumulatorStep, ...]:
    """Each step's accumulator traffic (step 0's gradients stay home: an empty step).

    From step 1 the holder of origin o's payload adds its part to o's accumulator (the
    ``rows(o, 1)`` rows from ``starts(o, 1)``: all any other position touches) and passes it
    to the next holder that still uses o's payload, or home after the last one."""
    def used(origin: int, step: int) -> int:
        return rows(origin, step) if step < topo.size else 0

    p, out = topo.index, [AccumulatorStep()]
    for step in range(1, last + 1):
        origin = topo.source(p, step)
        new = used(origin, 1) if used(origin, 1) and used(origin, step) else 0
        send_to = None
        if new:
            to = topo.holder(origin, step + 1) if used(origin, step + 1) else origin
            send_to = topo.rank(to)
        nxt = topo.source(p, step + 1) if step + 1 < topo.size else None
        recv_next = recv_home = None
        if nxt is not None and used(nxt, step + 1):
            recv_next = (used(nxt, 1), topo.rank(topo.holder(nxt, step)))
        if used(p, step) and not used(p, step + 1):  # the last use of our payload
            recv_home = (used(p, 1), topo.rank(topo.holder(p, step)))
        runs = home_runs(p) if recv_home and home_runs is not None else ()
        out.append(AccumulatorStep(new, send_to, recv_next, recv_home,
                                   starts(origin, step) - starts(origin, 1) if new else 0,
                                   starts(p, 1) if recv_home else 0,
                                   runs if runs[1:] else ()))
    return tuple(out)
