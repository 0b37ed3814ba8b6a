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
from typing import Iterator

import torch
import torch.distributed as dist

from ..comm.ring_positions import RingPositions
from ..kernels import thresholds
from ..kernels.device_calls import BoundarySides
from ..kernels.varlen import KernelLaunch, call_runs, upload_boundaries
from ..plan.packs import DocumentPack
from ..plan.schedule import Block, Mask, RingSchedule
from ..plan.segments import Runs
from ..plan.slices import SliceMask
from .first_writes import backward_writes, first_writes
from .pair_calls import PairCalls
from .pass_plan import PassPlan, StepPlan, fresh_of, uses_of
from .ring_rounds import ring_passes
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
    gpu_bound_min_area: float | None = None  # passes the GPU bounds; None: dense_min_area
    grain: int | None = None  # a shape-free slice mask's carving (``blocks.carved``)
    least: int = 0  # a carving pack's shortest carved side (``thresholds.PACK_CARVE_MIN``)

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
             gpu_bound_min_area: float | None = None, device_docs: bool = False) -> PlanKey:
    """The key of a call's plan: the one place it is made, for ``prepare`` at a call and for
    the Megatron data path ahead of it, so both find the same plan. ``batch``: rows of the
    call (one: blocks may share varlen calls); ``dense_min_area``: a ring forward's (the
    kernel's, or its GPU-bound one for a large call: ``thresholds.forward_min_area``), which
    only a plain sequence's plan reads (a pack's blocks all go varlen), or None for a sequence
    whose blocks go varlen too (a slice mask that follows the data: ``varying_masks``;
    a single member's full and causal blocks carved at ``thresholds.SHAPE_FREE_GRAIN``, a
    ring's too where ``thresholds.CARVE_RINGS``; a document pack's under a plain mask where
    ``thresholds.CARVE_PACKS``);
    ``gpu_bound_min_area``: the kernel's threshold for the passes the GPU bounds (a ring's
    backward, a single member's both; ``build_plan``), None where it is the same;
    ``device_docs``: a plain sequence's plan whose documents the GPU reads."""
    pack = isinstance(documents, DocumentPack)
    dense = None if pack or device_docs else dense_min_area
    gpu = None if dense is None or gpu_bound_min_area in (None, dense) else gpu_bound_min_area
    shape_free = dense is None and not pack and not device_docs and batch == 1
    packed = (pack and thresholds.CARVE_PACKS and not device_docs and batch == 1
              and mask.plain)
    carve = (shape_free or packed) and (ring is None or thresholds.CARVE_RINGS)
    return PlanKey(layout, world, documents, mask, ulysses, ring, backward, batch == 1,
                   dense, device_docs, gpu, thresholds.SHAPE_FREE_GRAIN if carve else None,
                   thresholds.PACK_CARVE_MIN if carve and packed else 0)


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
    # The passes the GPU bounds take their own threshold: a small call's ring forward is
    # bound by its host, where each dense call costs more than the varlen call it leaves
    # (a large call's forward is GPU-bound, and its key's two thresholds are then one,
    # ``thresholds.forward_min_area``); a ring's backward and a single member's passes by
    # the GPU, where a dense call of a smaller block is already faster
    # (results/h200x2_issue42_dense_threshold{,_per_pass}/, h200x2_issue42_in_layer/).
    gpu_bound = calls if key.gpu_bound_min_area is None else PairCalls(
        key, sched, topo, key.gpu_bound_min_area)
    if topo is None:  # one member: one step against its own keys, nothing travels
        calls = gpu_bound
        steps = (StepPlan(me, calls(me, me)),)
        alone = PassPlan(steps, fresh_of(calls(me, me), rows), False, 0,
                         (uses_of(steps, rows, "q"), uses_of(steps, rows, "k")))
        forward = dataclasses.replace(alone, **first_writes(alone, rows))
        backward = dataclasses.replace(alone, **backward_writes(alone, rows, key.backward, forward))
    else:
        forward, backward = ring_passes(sched, topo, calls, gpu_bound, key.backward,
                                        key.ulysses)
    used = forward.steps + backward.steps
    every = tuple({id(c): c for s in used for c in s.calls}.values())
    pairs = {(me, s.source) for s in forward.steps}
    if topo is not None and key.backward == "burst":
        pairs |= {(s.source, me) for s in backward.steps}
    return CallPlan(key, sched, topo, rows, forward, backward,
                    _whole(key, sched, topo, calls, rows), _all_rows_see(forward, rows),
                    every, tuple(sorted(pairs)), calls.sides)


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
