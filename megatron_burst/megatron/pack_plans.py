"""A document pack's ring plans, made before the layers that use them (host work only).

A layer's call finds its plan with ``attention.call_plan.plan_for`` under a ``PlanKey``
(layout, world, the pack, mask, Ulysses, this rank's ring, backward mode). Everything in it
follows from the pack's lengths and a few values of the run, so the data path can make it
a micro-batch early, off the step (``prefetch``), by the same function from the same key:
what a layer's plan depends on besides the pack is a ``PlanTarget`` (the layout the batch
was sharded with, the layer's mask, and the run's CP topology and group), and
``plan_pack`` asks ``plan_for`` for its key. The boundaries go to the device at the step
(``upload``), on the step's own stream, by one non-blocking copy from pinned memory.

Under a mask builder (``mask_batches``) each micro-batch brings its own slice mask: its
plan is made ahead the same way (``plan_mask``), under the key a layer's call uses once
masks follow the data (shape-free: ``attention.varying_masks``), which is every call of
the shape from the second different mask on.

Plans are keyed by value, so a target that no layer uses only costs time, and a layer
whose plan was not made ahead makes it itself: exact either way.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence, Tuple

import torch

from megatron_burst.attention.call_plan import (CallPlan, PlanKey, RingKey, plan_for,
                                                 plan_key, ring_key)
from megatron_burst.decide.topology import CPTopology
from megatron_burst.plan.packs import DocumentPack
from megatron_burst.plan.schedule import Mask
from megatron_burst.plan.slices import SliceMask
from megatron_burst.kernels.varlen import KernelLaunch, upload_boundaries


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

    def ring(self) -> Optional[RingKey]:
        """This rank's ring, as a call on ``group`` finds it (None: a single member)."""
        return ring_key(self.group, self.world, self.ulysses, self.positions_per_node)

    def key(self, pack: DocumentPack, ring: Optional[RingKey]) -> PlanKey:
        """The key a layer's call on ``pack`` plans under (``prepare._bind_plan``'s)."""
        return plan_key(self.layout, self.world, pack, self.mask, self.ulysses, ring,
                        self.backward)


def targets_from_args(layout: str, windows: Sequence[Tuple[int, int]],
                      topology: Optional[CPTopology], group: Any) -> Tuple[PlanTarget, ...]:
    """The targets of a Megatron GPT run: causal masks, one per distinct window of its layers
    (``run_flops.layer_windows``), on the run's topology; none without a decided topology."""
    if topology is None:
        return ()
    return tuple(PlanTarget.of(layout, Mask(True, tuple(w)), topology, group)
                 for w in sorted(set(windows)))


def plan_pack(pack: DocumentPack, target: PlanTarget, ring: Optional[RingKey]) -> CallPlan:
    """``pack``'s plan for ``target`` (``ring``: ``target.ring()``, read once), made on the
    host by the one plan function, or found where it was made before."""
    return plan_for(target.key(pack, ring))


def plan_mask(mask: SliceMask, total: int, target: PlanTarget,
              ring: Optional[RingKey]) -> CallPlan:
    """The plan of a ``total``-token sequence under the slice ``mask`` for ``target`` (its
    layout and topology; its own mask is not read), under the key a layer's call of that
    sequence uses once masks follow the data: shape-free (``prepare._bind_plan``)."""
    return plan_for(plan_key(target.layout, target.world, (total,), mask, target.ulysses,
                             ring, target.backward, batch=1, dense_min_area=None))


def upload(calls: Sequence[KernelLaunch], device: torch.device) -> None:
    """The planned calls' boundaries onto ``device``: one pinned buffer, one non-blocking
    copy on the current stream (the step's own). Calls already there are skipped."""
    if device.type != "cpu" and calls:
        upload_boundaries(calls, device)
