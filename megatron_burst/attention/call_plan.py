"""A call's plan: one frozen value, made by one function from one key, behind one cache.

Everything the ring loops of a call run that its tensors' values do not change is decided
here, once per ``PlanKey`` (the layout, the world, the documents or sequence length, the
mask, Ulysses, this rank's ring, the backward mode, and the kernel's one planning knob):
the schedule (``plan.schedule.RingSchedule``), this rank's ring position, and for each pass
and each ring step the kernel calls (their boundaries uploaded once per device), the hops
to post with the rows each carries (``comm.ring_positions.Hop``), the travelling gradient
accumulators' route, and whether step 0 writes every row (``fresh``). The loops in
``burst`` then only launch kernels and post messages.

``plan_for`` is the only way to a plan: ``prepare`` asks at a call, and the Megatron data
path asks a micro-batch early for each layer kind (``megatron.pack_plans``), with the same
key, so the layers' calls find the plan the data path made. The cache is bounded and keyed
by value (a ``DocumentPack`` compares and hashes by its lengths).
"""
from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from ..comm.ring_positions import (AccumulatorStep, Hop, RingPositions, accumulator_steps,
                                   next_kind, route_hops)
from ..kernels.device_calls import BoundarySides
from ..kernels.varlen import KernelLaunch, call_runs, covers, upload_boundaries
from ..plan.blocks import most_per_row
from ..plan.packs import DocumentPack
from ..plan.runs import gapped, held_tables, last_run_step
from ..plan.schedule import Block, Mask, RingSchedule, last_spanned_step
from ..plan.segments import Runs
from ..plan.slices import SliceMask
from .first_writes import backward_writes, first_writes
from .pair_calls import PairCalls, one_partial_wire, runs_of
from .sharding import group_ranks


@dataclasses.dataclass(frozen=True)
class RingKey:
    """This rank's ring: the global ranks of its positions, its own, ranks per node."""

    ranks: tuple[int, ...]
    me: int
    positions_per_node: int | None

    def topology(self) -> RingPositions:
        return RingPositions(self.ranks, self.me, self.positions_per_node)


def ring_key(group: dist.ProcessGroup | None, world: int, ulysses: int,
             positions_per_node: int | None) -> RingKey | None:
    """This rank's ring in ``group``: the same Ulysses slot of every Ulysses group (None: a
    single ring member). ``prepare`` and the data path's planning both read it here."""
    if world // ulysses == 1:
        return None
    members = group_ranks(group, world)
    me = members.index(dist.get_rank())
    return RingKey(tuple(members[me % ulysses::ulysses]), members[me], positions_per_node)


@dataclasses.dataclass(frozen=True)
class PlanKey:
    """Everything a call's plan depends on, by value (see the module docstring)."""

    layout: str
    world: int
    documents: DocumentPack | tuple[int, ...]  # a pack, or (total,) for one sequence
    mask: Mask | SliceMask
    ulysses: int
    ring: RingKey | None  # None: a single ring member, nothing travels
    backward: str  # the backward ring's mode: 'ring' or 'burst'
    varlen: bool  # a batch of one row: blocks may share varlen calls
    dense_min_area: float | None  # the kernel's threshold; None: shape-free (see plan_key)
    device_docs: bool = False  # documents the GPU reads (``kernels.device_calls``)

    @property
    def lens(self) -> tuple[int, ...]:
        docs = self.documents
        return docs.lens if isinstance(docs, DocumentPack) else docs

    @property
    def pack(self) -> bool:
        return isinstance(self.documents, DocumentPack)


def plan_key(layout: str, world: int, documents: DocumentPack | tuple[int, ...],
             mask: Mask | SliceMask, ulysses: int, ring: RingKey | None, backward: str, *,
             batch: int = 1, dense_min_area: float | None = None,
             device_docs: bool = False) -> PlanKey:
    """The key of a call's plan: the one place it is made, for ``prepare`` at a call and for
    the Megatron data path ahead of it, so both find the same plan. ``batch``: rows of the
    call (one: blocks may share varlen calls); ``dense_min_area``: the kernel's, which only
    a plain sequence's plan reads (a pack's blocks all go varlen), or None for a sequence
    whose blocks go varlen too (a slice mask that follows the data: ``varying_masks``);
    ``device_docs``: a plain sequence's plan whose documents the GPU reads."""
    pack = isinstance(documents, DocumentPack)
    return PlanKey(layout, world, documents, mask, ulysses, ring, backward, batch == 1,
                   None if pack or device_docs else dense_min_area, device_docs)


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
    home_from_first: bool = False  # the home accumulator is the first call's output (same)


@dataclasses.dataclass(frozen=True, eq=False)
class CallPlan:
    """A call's plan (see the module docstring). ``whole``: a single member's whole
    attention as one kernel call (a dense block, or a pack's one varlen call), when it is
    one; then the passes are that call. ``every_row_sees``: every query row has a key in
    some block (else rows that see none carry lse -inf, mended for the backward)."""

    key: PlanKey
    sched: RingSchedule
    topo: RingPositions | None
    rows: int  # this member's rows (a rank's, or a Ulysses group's)
    forward: PassPlan
    backward: PassPlan
    whole: Block | KernelLaunch | None
    every_row_sees: bool
    calls: tuple[KernelLaunch, ...]  # every kernel call of both passes (for uploads)
    pairs: tuple[tuple[int, int], ...]  # (query member, key member) of every block run here
    sides: BoundarySides | None = None  # a call's boundary table's rows (``device_docs``)

    def upload(self, device: torch.device) -> None:
        """Every varlen call's boundaries onto ``device`` (one pinned copy; once)."""
        upload_boundaries(self.calls, device)

    @property
    def member_runs(self) -> Runs | None:
        """Where this rank's Ulysses group's rows come from (``RingSchedule.member_runs``)."""
        return self.sched.member_runs(self.topo.index if self.topo is not None else 0)

    def blocks(self) -> Iterator[Block]:
        """Every block this rank computes (what a forced kernel is checked against)."""
        for pair in self.pairs:
            yield from self.sched.blocks(*pair)


# ------------------------------------------------------------------------- the builder


def build_plan(key: PlanKey) -> CallPlan:
    """The plan of ``key`` (host work only: no communication, no device)."""
    sched = RingSchedule(key.layout, key.world, key.lens, key.mask, key.ulysses)
    topo = key.ring.topology() if key.ring is not None else None
    me = topo.index if topo is not None else 0
    rows = sched.shard(me).length
    calls = PairCalls(key, sched, topo)
    if topo is None:  # one member: one step against its own keys, nothing travels
        steps = (StepPlan(me, calls(me, me)),)
        alone = PassPlan(steps, _fresh(calls(me, me), rows), False, 0,
                         (_uses(steps, rows, "q"), _uses(steps, rows, "k")))
        forward = dataclasses.replace(alone, **first_writes(alone, rows))
        backward = dataclasses.replace(alone, **backward_writes(alone, rows, key.backward, forward))
    else:
        forward, backward = _ring_passes(key, sched, topo, calls)
    used = forward.steps + backward.steps
    every = tuple({id(c): c for s in used for c in s.calls}.values())
    pairs = {(me, s.source) for s in forward.steps}
    if topo is not None and key.backward == "burst":
        pairs |= {(s.source, me) for s in backward.steps}
    return CallPlan(key, sched, topo, rows, forward, backward,
                    _whole(key, sched, topo, calls, rows), _all_rows_see(forward, rows),
                    every, tuple(sorted(pairs)), calls.sides)


def _ring_passes(key: PlanKey, sched: RingSchedule, topo: RingPositions,
                 calls: PairCalls) -> tuple[PassPlan, PassPlan]:
    """(forward, backward) of a ring of several members.

    Forward: K/V go round ``topo``. Backward 'ring': K/V go round again, their dK/dV one
    step behind. Backward 'burst': the queries (with dO, lse, delta) go round the reversed
    ring, so at step s a member holds the queries that held its K/V at step s of the
    forward (the same pairs step for step, and the same last step); dQ one step behind."""
    runs = gapped(sched)  # a window's hop carries its edges as runs (``plan.runs``)
    k_spans = (sched.needed_runs if runs else sched.needed_ranges)(topo.source, "k")
    last = last_spanned_step(k_spans) if not runs else last_run_step(k_spans)
    me, n = topo.index, sched.shard(topo.index).length
    own = _fresh(calls(me, me), n)
    forward = _pass(topo, last, k_spans, lambda src, at: calls(me, src, k_from=at), own, None,
                    runs)
    forward = dataclasses.replace(forward, uses=(_uses(forward.steps, n, "q"), 0),
                                  **first_writes(forward, n))
    if key.backward == "burst":
        back = topo.reversed()
        q_spans = (sched.needed_runs if runs else sched.needed_ranges)(back.source, "q")
        backward = _pass(back, last, q_spans, lambda src, at: calls(src, me, q_from=at), own,
                         "q", runs)
        uses = (_uses(backward.steps[:1], n, "q", q_spans[me][1] if last else None, runs),
                _uses(backward.steps, n, "k"))
        wire = one_partial_wire(back, last, calls, lambda holder, origin: (origin, holder), "q")
    else:
        backward = _pass(topo, last, k_spans, lambda src, at: calls(me, src, k_from=at), own,
                         "k", runs)
        uses = (_uses(backward.steps, n, "q"),
                _uses(backward.steps[:1], n, "k", k_spans[me][1] if last else None, runs))
        wire = one_partial_wire(topo, last, calls, lambda holder, origin: (holder, origin), "k")
    return forward, dataclasses.replace(backward, uses=uses, wire=wire,
                                        **backward_writes(backward, n, key.backward, forward))


def _pass(topo: RingPositions, last: int, spans: tuple, calls_with: Callable,
          fresh: tuple[bool, bool], accumulate: str | None, runs: bool = False) -> PassPlan:
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


def _uses(steps: tuple[StepPlan, ...], rows: int, side: str, returned=None,
          runs: bool = False) -> int:
    """The most kernel calls of ``steps`` that touch any one of the ``rows`` rows on
    ``side``, with one more on the ``returned`` rows (an accumulator come home: a span, or
    with ``runs`` its runs)."""
    spans = runs_of([call for step in steps for call in step.calls], side)
    if runs:
        return most_per_row(spans + list(returned or ()))
    return most_per_row(spans + ([returned] if returned and returned[1] > returned[0] else []))


def _fresh(own: tuple[KernelLaunch, ...], rows: int) -> tuple[bool, bool]:
    """Whether a member's own calls write every query row, and every key row, once."""
    return covers(own, rows, "q"), covers(own, rows, "k")


def _all_rows_see(forward: PassPlan, rows: int) -> bool:
    """Whether some block of the forward has each of ``rows`` query rows."""
    spans = sorted((a, b) for s in forward.steps for c in s.calls for a, b in call_runs(c, "q"))
    reach = 0
    for a, b in spans:
        if a > reach:
            return False
        reach = max(reach, b)
    return reach >= rows


def _whole(key: PlanKey, sched: RingSchedule, topo: RingPositions | None, calls: PairCalls,
           rows: int) -> Block | KernelLaunch | None:
    """A single member's whole attention when it is one kernel call over all its rows and
    keys: a plain sequence's one dense block (no fp32 accumulators, merges or casts: the
    kernel's output and gradients are the answer), or a pack's one varlen call."""
    if topo is not None or (key.ulysses != 1 and sched.member_runs(0) is None):
        return None  # Ulysses: only a group holding its rows in position order
    if not key.pack and not key.device_docs:
        blocks = sched.blocks(0, 0)
        if len(blocks) == 1 and (blocks[0].q_start, blocks[0].q_stop, blocks[0].k_start,
                                 blocks[0].k_stop) == (0, rows, 0, rows):
            return blocks[0]
        return None
    own = calls(0, 0)
    if (calls.alone or key.device_docs) and len(own) == 1 and own[0].varlen and \
            own[0].q_runs == own[0].k_runs == ((0, rows),):
        return own[0]
    return None


# ------------------------------------------------------------------------- the cache

PLAN_CACHE = 64  # plans of distinct keys kept (every layer kind of a few micro-batches)
_PLANS: "collections.OrderedDict[PlanKey, CallPlan]" = collections.OrderedDict()
_LOCK = threading.Lock()  # the data path's prefetch thread plans while the step calls


def plan_for(key: PlanKey) -> CallPlan:
    """The plan of ``key``: from the cache, or built (and kept, the oldest dropped)."""
    with _LOCK:
        found = _PLANS.get(key)
        if found is not None:
            _PLANS.move_to_end(key)
            return found
    plan = build_plan(key)
    with _LOCK:
        plan = _PLANS.setdefault(key, plan)  # a plan another thread made first wins
        while len(_PLANS) > PLAN_CACHE:
            _PLANS.popitem(last=False)
    return plan


def clear() -> None:
    """Drop every kept plan (tests)."""
    with _LOCK:
        _PLANS.clear()
