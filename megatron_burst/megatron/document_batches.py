"""A micro-batch of packed documents, made off the step and handed to it.

``DocumentBatchMaker`` turns one sample of the data iterator into a ``PreparedBatch``:
boundaries from EOD, the ``DocumentPack`` with its ring plans made for the run's layers
(``pack_plans``), this rank's tokens, labels, loss mask and per-document positions sharded
with the attention's layout (``documents.shard_document_batch``), the FLOPs the batch
does, and every tensor the step copies to the GPU in pinned memory. All of it is host work,
so it can run on the data path's background thread (``prefetch``). ``PreparedBatch.to_step``
runs on the step: non-blocking copies from pinned memory on the step's own stream (the
tensors and the plans' boundaries, one copy for all of them), nothing else.

A prepared batch pickles as the sample it was made from (Megatron's rerun machinery may
save the micro-batches it replays), and is made again from it where it is loaded.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

from megatron_burst.decide.flops import StepFlops
from megatron_burst.megatron.documents import (BATCH_KEYS, DocumentParams,
                                               shard_document_batch, unpadded)
from megatron_burst.plan.layouts import PACK_ZIGZAG
from megatron_burst.plan.packs import DocumentPack, pack_documents
from megatron_burst.megatron.pack_plans import PlanTarget, plan_pack, upload
from megatron_burst.megatron.run_flops import FlopsCounter, FlopsReport
from megatron_burst.kernels.varlen import KernelLaunch


@dataclasses.dataclass(eq=False)
class PreparedBatch:
    """One micro-batch made ahead (see the module docstring)."""

    sample: Mapping[str, torch.Tensor]  # as the data iterator gave it
    local: Dict[str, torch.Tensor]  # BATCH_KEYS -> this rank's [1, s_local], on the host
    params: DocumentParams  # the pack, its plans made; boundaries on the host
    pack: DocumentPack  # the documents, described on the host (the FLOPs, the report)
    cu_seqlens: torch.Tensor  # the pack's boundaries, staged for Megatron's FLOPs count
    calls: Tuple[KernelLaunch, ...]  # the pack's planned kernel calls, for their boundaries
    flops: Optional[StepFlops]
    share: float  # causal attention pairs done, as a share of the whole sequence's

    def __reduce__(self) -> Tuple[Any, ...]:
        return (dict, (dict(self.sample),))

    def to_step(self, device: torch.device) -> Tuple[Any, ...]:
        """(tokens, labels, loss_mask, position_ids, params) on ``device``: asynchronous
        copies on the current stream; from pinned memory they never wait for the GPU."""
        upload(self.calls, device)
        tensors = tuple(self.local[key].to(device, non_blocking=True) for key in BATCH_KEYS)
        params = self.params
        if params.layout == PACK_ZIGZAG.name:  # the GPU reads these boundaries
            cu = params.cu_seqlens_q.to(device, non_blocking=True)
            params = dataclasses.replace(params, cu_seqlens_q=cu, cu_seqlens_kv=cu)
        return (*tensors, params)


def pinned(t: torch.Tensor) -> torch.Tensor:
    """``t`` in pinned memory (as is where it is on the GPU or pinned already)."""
    return t if t.is_cuda or t.is_pinned() else t.pin_memory()


def on_host(sample: Mapping[str, Any]) -> bool:
    """Whether no tensor of ``sample`` lives on the GPU."""
    return all(not (isinstance(v, torch.Tensor) and v.is_cuda) for v in sample.values())


class DocumentBatchMaker:
    """Makes each ``PreparedBatch`` of one run: its EOD token, CP group, layout, the layers'
    plan targets and FLOPs count. ``pin``: stage the step's tensors in pinned memory."""

    def __init__(self, eod: int, group: Any, layout: str, targets: Tuple[PlanTarget, ...],
                 counter: Optional[FlopsCounter], pin: bool,
                 capacity: Optional[int] = None) -> None:
        self.eod, self.group, self.layout, self.pin = eod, group, layout, pin
        self.capacity = capacity
        # pack_zigzag plans nothing per pack: its plan is the sequence length's
        self.targets = () if layout == PACK_ZIGZAG.name else targets
        self.rings = {t: t.ring() for t in targets}  # read the group's ranks here, once
        self.counter = counter

    def __call__(self, sample: Mapping[str, torch.Tensor]) -> PreparedBatch:
        local, params = shard_document_batch(sample, self.eod, self.group, self.layout,
                                             self.capacity)
        pack = params.pack or pack_documents(unpadded(params.cu_seqlens_q))
        calls = tuple(c for t in self.targets for c in plan_pack(pack, t, self.rings[t]).calls)
        flops, share = (self.counter.count(pack.lens) if self.counter is not None
                        else (None, 0.0))
        cu = pack.cu_seqlens
        if self.pin:
            local = {key: pinned(value) for key, value in local.items()}
            cu = pinned(cu)
            if params.pack is None:  # the step copies them to the GPU
                bounds = pinned(params.cu_seqlens_q)
                params = dataclasses.replace(params, cu_seqlens_q=bounds, cu_seqlens_kv=bounds)
        return PreparedBatch(sample, local, params, pack, cu, calls, flops, share)

    def ahead(self, sample: Any) -> Any:
        """What the background thread makes of ``sample``: its batch, or the sample itself
        where it lives on the GPU (reading it there would wait for the step's stream)."""
        if isinstance(sample, Mapping) and on_host(sample):
            return self(sample)
        return sample


class DocumentBatches:
    """The step's side: takes a made batch (or makes one that was not), reports its FLOPs,
    and moves it to the step's device. ``agree_group``: the ranks that read the same samples
    and must stop together when one of them fails to make its batch (Megatron's tensor- and
    context-parallel group)."""

    def __init__(self, maker: DocumentBatchMaker, device: torch.device,
                 say: Callable[[str], None], agree_group: Any = None,
                 count_seqlens: Optional[Callable[[torch.Tensor], None]] = None) -> None:
        self.maker, self.device, self.say = maker, device, say
        self.agree_group = agree_group
        self.count_seqlens = count_seqlens
        self.report = FlopsReport()

    def take(self, item: Any) -> Tuple[Any, ...]:
        batch = item if isinstance(item, PreparedBatch) else self.maker(item)
        pack = batch.pack
        self.report.add(batch.flops, batch.share, len(pack.lens), sum(pack.lens), self.say)
        if self.count_seqlens is not None:
            self.count_seqlens(batch.cu_seqlens.to(self.device, non_blocking=True))
        return batch.to_step(self.device)
