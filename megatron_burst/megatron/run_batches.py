"""A Megatron run's micro-batches with document masks, as its training step takes them.

It exists so that both entry points get their document batches from one function
(`document_batch`), made the same way: every rank reads the data (`dataset_on_every_rank`),
and each micro-batch is made by `document_batches.DocumentBatchMaker` (boundaries from EOD,
positions restarted per document, tokens, labels, loss mask and positions sharded with the
attention's layout, and the `DocumentParams` the layers read, its pack's ring plans made),
off the step on the data path's background thread (`prefetch`). Under a mask builder
(`mask_batch`) each micro-batch is made the same way by `mask_batch_maker.MaskBatchMaker`
(the builder's slice mask, the batch placed by its area, the mask's ring plans made).
"""
from __future__ import annotations

from typing import Any, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from megatron_burst.megatron import prefetch
from megatron_burst.megatron.burst_run import configured_topology
from megatron_burst.megatron.document_batches import DocumentBatches, DocumentBatchMaker
from megatron_burst.megatron.mask_batch_maker import (MaskBatchMaker, PreparedMaskBatch,
                                                      mask_targets)
from megatron_burst.megatron.mask_batches import load_builder
from megatron_burst.megatron.pack_plans import targets_from_args
from megatron_burst.megatron.printer import say
from megatron_burst.megatron.run_flops import FlopsCounter, layer_windows
from megatron_burst.megatron.trace import StepTrace
from megatron_burst.plan.layouts import DOCUMENT_LAYOUTS


def dataset_on_every_rank(args: Any) -> bool:
    """Whether every rank needs the dataset: document batches are made on every tensor and
    pipeline rank (middle stages need the boundaries and positions too)."""
    return bool(getattr(args, "burst_document_mask", False)
                or getattr(args, "burst_mask_builder", None))


def mask_batch(data_iterator: Iterator, args: Any) -> Tuple[Any, ...]:
    """(tokens, labels, loss_mask, position_ids, packed_seq_params) of the next micro-batch
    under ``--burst-mask-builder``: the builder's mask, the batch placed by mask area on the
    host and the mask's ring plans made (``mask_batch_maker.MaskBatchMaker``), two
    micro-batches ahead on the data path's background thread under Megatron's
    RerunDataIterator, as document batches are ($MEGATRON_BURST_PREFETCH=0: on the step);
    this step only copies this rank's rows to the device."""
    maker, agree = _mask_maker(args)
    source = data_iterator
    if prefetch.enabled():
        source = prefetch.prefetching(data_iterator, maker.ahead, agree)
    item = next(source)
    batch = item if isinstance(item, PreparedMaskBatch) else maker(item)
    return batch.to_step(_device())


# [((builder, topology), CP group, MaskBatchMaker, agree group)]: the run's
_MASK_MAKERS: List[Any] = []


def _mask_maker(args: Any) -> Tuple[MaskBatchMaker, Any]:
    """The run's mask batch maker (its builder loaded once) and the ranks that must stop
    together when one fails to make its batch; made again for another builder or topology
    (by value) or another CP group (a new run in-process)."""
    from megatron.core import parallel_state
    from megatron.training import get_tokenizer

    group = parallel_state.get_context_parallel_group()
    key = (args.burst_mask_builder, configured_topology())
    if _MASK_MAKERS and _MASK_MAKERS[0][0] == key and _MASK_MAKERS[0][1] is group:
        return _MASK_MAKERS[0][2], _MASK_MAKERS[0][3]
    targets = mask_targets("area", key[1], group)
    maker = MaskBatchMaker(load_builder(key[0]), get_tokenizer().eod, group, targets,
                           pin=torch.cuda.is_available())
    agree = parallel_state.get_tensor_and_context_parallel_group(check_initialized=False)
    _MASK_MAKERS[:] = [(key, group, maker, agree or group)]
    return maker, agree or group


def document_batch(data_iterator: Iterator, args: Any) -> Tuple[Any, ...]:
    """(tokens, labels, loss_mask, position_ids, packed_seq_params) of the next micro-batch.

    Made by ``document_batches.DocumentBatchMaker``: sharded on the host, where the
    dataloader leaves the sample, so only this rank's rows go to the GPU and the boundaries
    never need a device read; the pack's ring plans made for the run's layers. Made two
    micro-batches ahead on a background thread (``prefetch``; $MEGATRON_BURST_PREFETCH=0
    makes them here instead) under Megatron's RerunDataIterator; this step only copies them
    to the GPU from pinned memory. The documents' lengths also go to Megatron's FLOPs count
    where it keeps one (0.19+), and to this package's (``run_flops``), printed every few packs.
    Under --burst-mask-builder it is ``mask_batch``'s: Megatron-LM's pretrain_gpt.py with the
    patch calls this for every batch the package makes (``dataset_on_every_rank``), so the
    builder is honoured there exactly as through this package's entry point.
    """
    if getattr(args, "burst_mask_builder", None):
        return mask_batch(data_iterator, args)
    batches = _document_batches(args)
    _trace().step()
    source = data_iterator
    if prefetch.enabled():
        source = prefetch.prefetching(data_iterator, batches.maker.ahead, batches.agree_group)
    return batches.take(next(source))


_BATCHES: List[Any] = []  # [(args, CP group, DocumentBatches)]: the run's, made once


def _document_batches(args: Any) -> DocumentBatches:
    """The run's document batches (maker, FLOPs report, device), made at the first call and
    again only if the run's arguments or CP group are other objects (a new run in-process)."""
    from megatron.core import parallel_state
    from megatron.training import get_tokenizer

    group = parallel_state.get_context_parallel_group()
    if _BATCHES and _BATCHES[0][0] is args and _BATCHES[0][1] is group:
        return _BATCHES[0][2]
    layout = args.burst_document_layout or DOCUMENT_LAYOUTS[0]
    targets = targets_from_args(layout, layer_windows(args), configured_topology(), group)
    maker = DocumentBatchMaker(get_tokenizer().eod, group, layout, targets,
                               FlopsCounter(args), pin=torch.cuda.is_available(),
                               capacity=getattr(args, "burst_document_capacity", None))
    # A batch that fails on one rank stops every rank that would wait for it: its CP peers
    # in the ring, and its TP peers (they read the same samples) in the layers' collectives.
    agree = parallel_state.get_tensor_and_context_parallel_group(check_initialized=False)
    batches = DocumentBatches(maker, _device(), say, agree or group, _megatron_seqlen_stats())
    _BATCHES[:] = [(args, group, batches)]
    return batches


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")  # CPU ranks (tests): the batch stays where it is


def _megatron_seqlen_stats() -> Optional[Any]:
    """Megatron's per-iteration sum of L and L^2 (0.19+, on the device), or None."""
    if not torch.cuda.is_available():
        return None
    try:
        from megatron.training.training import update_seqlen_stats_from_cu_seqlens
    except ImportError:  # before 0.19 Megatron counts full causal attention regardless
        return None
    return update_seqlen_stats_from_cu_seqlens


def _trace() -> StepTrace:
    if not _TRACE:
        _TRACE.append(StepTrace.from_env(dist.get_rank() if dist.is_initialized() else 0))
    return _TRACE[0]


_TRACE: List[StepTrace] = []
