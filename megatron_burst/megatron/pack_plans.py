"""A document pack's ring plans, made before the layers that use them (host work only).

At the first layer's call ``megatron_burst.attention.prepare`` finds a pack's schedule in
``pack.schedules`` under (layout, world, mask, ulysses), and the schedule memoises its
blocks, row tables and kernel-call plans. Everything in it follows from the pack's lengths
and a few values of the run, so the data path can make it a micro-batch early, off the
step (``prefetch``). What a layer's plans depend on is a ``PlanTarget``: the layout the
batch was sharded with, the layer's mask, and the run's CP topology and group.
``plan_pack`` builds, for one target, the same ring spec ``prepare`` builds and plans its
kernel calls on the host; the boundaries go to the device at the step (``upload``), on
the step's own stream, by one non-blocking copy from pinned memory.

Plans are keyed by value, so a target that no layer uses only costs time, and a layer
whose plans were not made ahead makes them itself: exact either way.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from megatron_burst.comm.ring_positions import RingTopology
from megatron_burst.decide.topology import CPTopology
from megatron_burst.megatron import masks
from megatron_burst.megatron.attention import BurstDotProductAttention
from megatron_burst.plan.packs import DocumentPack
from megatron_burst.plan.placement import local_length
from megatron_burst.attention.ring_spec import RingSpec
from megatron_burst.plan.schedule import Mask, RingSchedule
from megatron_burst.attention.sharding import group_ranks
from megatron_burst.kernels.varlen import KernelCall, upload_boundaries

HOST = torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class PlanTarget:
    """What one kind of layer call's ring plans depend on, besides the pack."""

    layout: str
    mask: Mask
    world: int
    ulysses: int
    positions_per_node: int
    backward: str
    group: Any  # the CP process group (held: it is what the layers call on)

    @staticmethod
    def of(layout: str, mask: Mask, topology: CPTopology, group: Any) -> "PlanTarget":
        return PlanTarget(layout, mask, topology.cp, topology.ulysses,
                          topology.positions_per_node, topology.backward, group)

    def ring(self) -> Optional[RingTopology]:
        """This rank's ring position, as ``prepare`` makes it (None: a single member)."""
        if self.world // self.ulysses == 1:
            return None
        members = group_ranks(self.group, self.world)
        me = members.index(dist.get_rank())
        return RingTopology(members[me % self.ulysses::self.ulysses], members[me],
                            self.positions_per_node)


def targets_from_args(layout: str, windows: Sequence[Tuple[int, int]],
                      topology: Optional[CPTopology], group: Any) -> Tuple[PlanTarget, ...]:
    """The targets of a Megatron GPT run: causal masks, one per distinct window of its layers
    (``run_flops.layer_windows``), on the run's topology; none without a decided topology."""
    if topology is None:
        return ()
    return tuple(PlanTarget.of(layout, Mask(True, tuple(w)), topology, group)
                 for w in sorted(set(windows)))


def targets_of_model(model: torch.nn.Module, layout: str) -> Tuple[PlanTarget, ...]:
    """The targets a built model's BurstAttention layers call with (to check the above)."""
    found = {PlanTarget.of(layout, Mask(masks.is_causal(m.attn_mask_type), m.window_size),
                           m.topology, m.cp_group)
             for m in model.modules()
             if isinstance(m, BurstDotProductAttention) and m.topology is not None}
    return tuple(sorted(found, key=lambda t: t.mask.window))


def pack_schedule(pack: DocumentPack, target: PlanTarget) -> RingSchedule:
    """The pack's schedule for ``target``, kept in ``pack.schedules`` as ``prepare`` keeps it."""
    key = (target.layout, target.world, target.mask, target.ulysses)
    found = pack.schedules.get(key)
    if found is None:
        found = RingSchedule.of(target.layout, target.world, pack.lens, target.mask,
                                target.ulysses)
        found = pack.schedules.setdefault(key, found)
    return found


def plan_pack(pack: DocumentPack, target: PlanTarget,
              ring: Optional[RingTopology]) -> Tuple[KernelCall, ...]:
    """Make ``pack``'s plans for ``target`` (``ring``: ``target.ring()``, made once) on the
    host: the kernel calls of every member pair this rank computes in the forward and the
    backward, the row tables the ring moves by, and step 0's coverage. Returns the calls."""
    sched = pack_schedule(pack, target)
    spec = RingSpec(group=target.group, topo=ring, sched=sched, scale=1.0,
                    backward=target.backward, seq_first=False, fixed_shapes=False)
    pairs = spec.pairs(backward=True)
    spec.plan(pairs, HOST)
    if ring is not None:
        spec.needed_rows(False)
        if target.backward == "burst":
            spec.needed_rows(True)
    rows = local_length(target.layout, target.world, pack.lens) * target.ulysses
    spec.fresh_at_step0(1, rows, rows, HOST)
    return tuple(c for q, k in pairs for c in spec.calls(q, k, 1, HOST))


def upload(calls: Sequence[KernelCall], device: torch.device) -> None:
    """The planned calls' boundaries onto ``device``: one pinned buffer, one non-blocking
    copy on the current stream (the step's own). Calls already there are skipped."""
    if device.type != "cpu" and calls:
        upload_boundaries(calls, device)
