"""A micro-batch under a mask builder, made off the step and handed to it.

``MaskBatchMaker`` turns one sample into a ``PreparedMaskBatch``: the builder's slice mask,
this rank's tokens, labels, loss mask and positions placed for it by visible area
(``mask_batches.shard_mask_batch``), the mask's ring plans for the run's layers
(``pack_plans.plan_mask``), and the step's tensors in pinned memory. All of it is host work
(the builder gets host tensors), so it runs on the data path's background thread
(``prefetch``) two micro-batches ahead, as document batches do: on the step only the
copies to the GPU remain. A builder is the user's code: there it runs on that thread, one
sample after another, never beside itself; ``$MEGATRON_BURST_PREFETCH=0`` runs it on the
step instead.

The plans are made under the key a layer's call uses once masks follow the data
(shape-free, ``attention.varying_masks``): from the second different mask on, every layer
finds its plan made. A mask equal to the batch before's is not planned again (its plan is
the layers' from that batch). A prepared batch pickles as its sample, as document batches do
(Megatron's rerun machinery may save what it replays).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

from megatron_burst.kernels.varlen import KernelLaunch
from megatron_burst.megatron.document_batches import on_host, pinned
from megatron_burst.megatron.documents import BATCH_KEYS
from megatron_burst.megatron.mask_batches import MaskParams, shard_mask_batch
from megatron_burst.megatron.pack_plans import PlanTarget, plan_mask, upload
from megatron_burst.plan.schedule import Mask
from megatron_burst.plan.slices import SliceMask


@dataclasses.dataclass(eq=False)
class PreparedMaskBatch:
    """One micro-batch made ahead (see the module docstring)."""

    sample: Mapping[str, Any]  # as the data iterator gave it
    local: Dict[str, torch.Tensor]  # BATCH_KEYS -> this rank's [1, s_local], on the host
    params: MaskParams  # the builder's mask and the layout the batch was placed with
    calls: Tuple[KernelLaunch, ...]  # the mask's planned kernel calls, for their boundaries

    def __reduce__(self) -> Tuple[Any, ...]:
        return (dict, (dict(self.sample),))

    def to_step(self, device: torch.device) -> Tuple[Any, ...]:
        """(tokens, labels, loss_mask, position_ids, params) on ``device``: asynchronous
        copies on the current stream; from pinned memory they never wait for the GPU."""
        upload(self.calls, device)
        return (*(self.local[key].to(device, non_blocking=True) for key in BATCH_KEYS),
                self.params)


class MaskBatchMaker:
    """Makes each ``PreparedMaskBatch`` of one run: its builder, EOD token, CP group, the
    layers' plan targets (``pack_plans.PlanTarget``: layout and topology), and whether the
    step's tensors are staged in pinned memory."""

    def __init__(self, builder: Callable, eod: int, group: Any,
                 targets: Tuple[PlanTarget, ...], pin: bool, layout: str = "area") -> None:
        self.builder, self.eod, self.group, self.pin = builder, eod, group, pin
        self.layout, self.targets = layout, targets
        self.rings = {t: t.ring() for t in targets}  # read the group's ranks here, once
        self._last: Optional[SliceMask] = None  # the mask of the batch made before

    def __call__(self, sample: Mapping[str, Any]) -> PreparedMaskBatch:
        host = {key: value.cpu() for key, value in sample.items()
                if isinstance(value, torch.Tensor)}
        local, params = shard_mask_batch({**sample, **host}, self.builder, self.eod,
                                         self.group, self.layout)
        calls: Tuple[KernelLaunch, ...] = ()
        if params.mask != self._last:  # the same mask again: the layers hold its plan
            total = int(sample["tokens"].shape[1])
            calls = tuple(c for t in self.targets
                          for c in plan_mask(params.mask, total, t, self.rings[t]).calls)
        self._last = params.mask
        if self.pin:
            local = {key: pinned(value) for key, value in local.items()}
        return PreparedMaskBatch(sample, local, params, calls)

    def ahead(self, sample: Any) -> Any:
        """What the background thread makes of ``sample``: its batch, or the sample itself
        where it lives on the GPU (reading it there would wait for the step's stream)."""
        if isinstance(sample, Mapping) and on_host(sample):
            return self(sample)
        return sample


def mask_targets(layout: str, topology: Any, group: Any) -> Tuple[PlanTarget, ...]:
    """The plan target of a mask-builder run's layers: its layout on the run's topology
    (none without a decided topology: 'auto' decides at the layers' calls). The target's
    own mask is not read (each batch brings one): a causal placeholder."""
    if topology is None:
        return ()
    return (PlanTarget.of(layout, Mask(True), topology, group),)
