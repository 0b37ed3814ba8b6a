"""The time model for calls whose ring steps differ (sliding windows, document packs), step
by step.

``timing.predict`` prices a causal or full layer from one step's work: under the zigzag
layout every step of every rank does the same. A sliding window breaks that. Step 0 holds
nearly all of a rank's work (its own band) and later steps a sliver or nothing, and the
hops carry the span of rows their receivers use (a rank that needs the last W keys of a
payload's second zigzag chunk receives the rows of that span, the chunk between included).
So here the schedule the ring runs (``schedule.RingSchedule``) gives, for
every ring member and step, the visible (query, key) pairs it computes, and the hop plan the
ring follows (``comm.ring_positions.payload_hops``) the rows each hop carries. A document
pack (``predict_pack``) is the same walk over the schedule its layout places: every member's
blocks at each step (documents held whole load their rank), hops of the rows a later step
needs (none where every document is held whole). A step then takes
the slowest member's larger of its compute and its hop; an inter-node hop of the double ring
overlaps its whole round, as in ``timing``. The profile, the kernel law, the host's and the
all-to-all's terms are ``timing``'s.

Approximations, as in ``timing``: the backward's FLOPs are 2.5 forwards'; a step's blocks
run at the kernel rate of a block as long as the keys its queries see on average; a
travelling gradient accumulator leaves after the compute that fills it, so it shares the
next step's intra-node hop, and the last step's comes home after everything (``timing``'s
``_backward_exposed``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import cost
from .host_time import host_seconds, overlapped
from .topology import CPTopology, accumulator_wire_bytes
from .timing import (FWD_BWD_PASSES, Prediction, Profile, alltoall_seconds, attention_flops,
                     elementwise_seconds, predict)

if TYPE_CHECKING:
    from ..plan.schedule import RingSchedule
    from .pack_load import PackLoad


def predict_scheduled(topology: CPTopology, prof: Profile, *, batch: int, s_local: int,
                      window: tuple[int, int], causal: bool = True,
                      max_intra_node_size: int | None = None) -> Prediction:
    """Seconds of one attention call (fwd+bwd) of ``batch`` sequences of ``s_local`` tokens
    per CP rank under ``window`` (flash-attn's (left, right)), zigzag as Megatron shards: the
    load a call with that window makes (``PackLoad.of_mask``), priced as ``auto`` prices it."""
    from ..plan.schedule import Mask  # numpy, for windowed layers only: not for plan
    from .pack_load import PackLoad

    load = PackLoad.of_mask(Mask(causal, tuple(window)), "zigzag", s_local * topology.cp, batch)
    return predict_pack(topology, prof, load, max_intra_node_size=max_intra_node_size)


def predict_pack(topology: CPTopology, prof: Profile, pack: PackLoad,
                 max_intra_node_size: int | None = None) -> Prediction:
    """Seconds of one call on a document pack or under a mask (``pack_load``): the schedule
    its layout places. A pack's blocks run at the varlen kernel's rate for its documents (a
    causal document of n tokens is the measured point n: its rows see n/2 keys on average),
    and its host plans it (``host_time.host_seconds``); a sequence under a mask runs, as
    ``predict_scheduled`` prices a window, at the dense kernel's rate for the keys its rows
    see; a mask that is one plain causal or full sequence as that call (``PackLoad.plain``).
    """
    from ..plan.schedule import RingSchedule  # as above

    tokens = pack.batch * sum(pack.lens) // topology.cp
    if pack.plain is not None:
        return predict(topology, prof, tokens=tokens, causal=pack.plain,
                       max_intra_node_size=max_intra_node_size)
    sched = RingSchedule.of(pack.layout, topology.cp, pack.lens, pack.schedule_mask,
                            topology.ulysses)
    if not pack.documents:
        return _predict(topology, prof, sched, pack.batch, tokens, max_intra_node_size,
                        lambda pairs, rows: prof.dense.tflops(pairs / rows), docs=None)
    per_row = 2 if pack.causal else 1
    return _predict(topology, prof, sched, 1, tokens, max_intra_node_size,
                    lambda pairs, rows: prof.varlen.tflops(per_row * pairs / rows),
                    docs=len(pack.lens))


def _predict(topology: CPTopology, prof: Profile, sched: "RingSchedule", batch: int,
             tokens: int, max_intra_node_size: int | None, rate,
             docs: int | None) -> Prediction:
    """The prediction from a schedule; ``rate(pairs, rows)``: TFLOP/s of a step's blocks;
    ``docs``: a document pack's documents, which the host plans at every call
    (``host_seconds``; None: no pack)."""
    max_intra_node_size = max_intra_node_size or topology.cp
    forward = _pass(topology, prof, sched, batch, max_intra_node_size, rate, backward=False)
    backward = _pass(topology, prof, sched, batch, max_intra_node_size, rate, backward=True)
    compute = forward[0] + backward[0]
    exposed = forward[1] + backward[1]
    steps = forward[2] + backward[2]
    host = host_seconds(topology, prof, steps, docs=docs)
    a2a, elementwise = (alltoall_seconds(topology, prof, tokens, max_intra_node_size),
                        elementwise_seconds(topology, prof, tokens))
    gpu = compute + elementwise + exposed + a2a
    return Prediction(topology, overlapped(gpu, host), compute + elementwise, exposed, a2a,
                      host)


def _pass(topology: CPTopology, prof: Profile, sched: RingSchedule, batch: int,
          max_intra_node_size: int, rate, *, backward: bool) -> tuple[float, float, int]:
    """(compute, exposed ring, steps run) of one pass: the forward (K/V travel), or the
    backward of the topology's mode ('ring': K/V again, with dK/dV; 'burst': the queries, the
    other way round, with dQ)."""
    ring = topology.ring_size
    plan = _HopPlan(topology, sched, batch, backward)
    passes = FWD_BWD_PASSES - 1 if backward else 1.0
    compute = [[_step_compute(topology, rate, sched, batch, p, plan.source(p, s),
                              plan.burst, passes) for s in range(plan.steps)]
               for p in range(ring)]
    last = max((s for p in range(ring) for s in range(plan.steps) if compute[p][s]),
               default=0)
    # A flat ring over nodes waits on IB.
    crosses = ring > max(1, max_intra_node_size // topology.ulysses)
    near = prof.inter if crosses and not topology.double else prof.intra
    step_s, inter_s = [0.0] * (last + 1), [0.0] * (last + 1)
    home = 0.0  # the accumulators filled at the last step, sent after its compute
    for p in range(ring):
        for s in range(last + 1):
            hops = plan.hops(p, s)
            inter = sum(n for kind, n in hops if kind == "inter")
            inter_s[s] = max(inter_s[s], prof.inter.seconds(inter))
            # The accumulator filled at step s-1 rides beside this step's payload.
            near_bytes = sum(n for kind, n in hops if kind == "intra") + plan.acc_after(p, s - 1)
            step_s[s] = max(step_s[s], compute[p][s], near.seconds(near_bytes))
        home = max(home, near.seconds(plan.acc_after(p, last)))
    total = sum(step_s) + home
    for s in range(0, last + 1, plan.inner):  # the double ring's crossing overlaps its round
        total += max(0.0, inter_s[s] - sum(step_s[s:s + plan.inner]))
    busy = sum(max(compute[p][s] for p in range(ring)) for s in range(last + 1))
    return busy, total - busy, last + 1


class _HopPlan:
    """The hops of one pass, member by member and step by step, with their bytes: the plan
    the ring follows (``payload_hops``) over the rows the schedule says are used. Where the
    call's plan goes round the ring both ways (``plan.runs.pass_rounds``), so does this:
    a round of ``a`` steps and one of ``b`` after it, the second's first hops at step 0."""

    def __init__(self, topology: CPTopology, sched: RingSchedule, batch: int, backward: bool):
        # The comm package imports torch: not for plan.
        from ..comm.ring_positions import RingPositions
        from ..plan.runs import pass_rounds

        self.ring = topology.ring_size
        self.inner = topology.positions_per_node if topology.double else self.ring
        self.burst = backward and topology.backward == "burst"
        topo = RingPositions(range(self.ring), 0, self.inner)
        self.topo = topo.reversed() if self.burst else topo
        self.side = "q" if self.burst else "k"
        self.topology, self.sched, self.batch, self.backward = topology, sched, batch, backward
        self.payload = batch * _row_bytes(topology, backward, 4)[0]
        self._acc: dict[int, int] = {}
        # (the round's ring, its rows table, its last step): one round, or one each way
        ways = pass_rounds(sched, topo, topology.ulysses, reverse=self.burst)
        self.rounds = [(t, sched.needed_rows(t.source, self.side, last),
                        self.ring - 1 if last is None else last) for t, last in ways]
        self.rows = self.rounds[0][1]
        self.steps = (1 + sum(last for _, _, last in self.rounds) if len(ways) > 1
                      else self.ring)
        # Each member's view of each round's ring, made once: hops and accumulators ask.
        self._mine = [[RingPositions(range(self.ring), m, self.inner, t.direction)
                       for m in range(self.ring)] for t, _, _ in self.rounds]

    def _at(self, step: int) -> tuple[int, int] | None:
        """(round, its step) of the pass's ``step`` (step 0 is every round's); None past
        the pass's steps."""
        for r, (_, _, last) in enumerate(self.rounds):
            if step <= last:
                return r, step
            step -= last
        return None

    def source(self, member: int, step: int) -> int:
        """Whose payload ``member`` holds at ``step``."""
        r, s = self._at(step)
        return self.rounds[r][0].source(member, s)

    def acc(self, member: int, mine) -> int:
        """Bytes per row of the gradient accumulator ``member`` fills and passes on, as wide
        as the call's plan makes it there (``topology.accumulator_wire_bytes``: one holder
        whose blocks touch each row once sends it in the inputs' dtype; fp32 in rounds
        both ways)."""
        if not self.backward:
            return 0
        if member not in self._acc:
            width = 4 if len(self.rounds) > 1 else accumulator_wire_bytes(
                self.sched, mine, self.rows, self.side, self.topology.heads.elem_bytes)
            self._acc[member] = self.batch * _row_bytes(self.topology, True, width)[1]
        return self._acc[member]

    def hops(self, member: int, step: int) -> list[tuple[str, int]]:
        """(kind, bytes) of each payload hop ``member`` posts at ``step``, 'intra' or
        'inter' (posted ahead of the step's compute); at step 0 every round's."""
        from ..comm.ring_positions import payload_hops  # as in __init__

        at = self._at(step)
        if at is None:
            return []
        rounds = range(len(self.rounds)) if step == 0 else (at[0],)
        return [(kind, sent * self.payload) for r in rounds
                for kind, _, sent, *_ in payload_hops(
                    self._mine[r][member], at[1] if step else 0,
                    lambda o, s, rows=self.rounds[r][1]: rows[o][s])
                if at[1] < self.rounds[r][2] or step == 0]

    def acc_after(self, member: int, step: int) -> int:
        """Bytes of the gradient accumulator ``member`` sends on (or home) after ``step``'s
        compute: from step 1, as ``cost.ring_pass_bytes`` counts it; 0 in the forward."""
        at = self._at(step)
        if not self.backward or step < 1 or at is None:
            return 0
        r, s = at
        mine, rows = self._mine[r][member], self.rounds[r][1]
        origin = mine.source(member, s)
        return rows[origin][1] * self.acc(member, mine) if rows[origin][s] else 0


def _row_bytes(topology: CPTopology, backward: bool, acc_bytes: int) -> tuple[int, int]:
    """(payload, gradient accumulator) bytes per travelling row of one sequence, the
    accumulator ``acc_bytes`` an element (``topology.accumulator_wire_bytes``)."""
    h = topology.heads
    hq, hkv = topology.ring_heads
    if not backward:
        return cost.kv_row_bytes(hkv, h.head_dim, h.elem_bytes, h.v_head_dim), 0
    return cost.backward_row_bytes(topology.backward, hq, hkv, h.head_dim, h.elem_bytes,
                                   h.v_head_dim, acc_bytes)


def _step_compute(topology: CPTopology, rate, sched: RingSchedule, batch: int,
                  member: int, other: int, burst: bool, passes: float) -> float:
    """Seconds ``member`` computes at a step with ``other``'s payload: the blocks of its
    queries against other's keys, or (the burst backward) other's queries against its keys."""
    blocks = sched.blocks(other, member) if burst else sched.blocks(member, other)
    pairs = sum(b.area for b in blocks)
    if not pairs:
        return 0.0
    rows = sum(b.q_stop - b.q_start for b in blocks)
    h = topology.heads
    flops = attention_flops(batch * pairs, topology.ring_heads[0], h.head_dim, h.v_head_dim,
                            passes=passes)
    return flops / (rate(pairs, rows) * 1e12)
