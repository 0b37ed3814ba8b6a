"""Slice masks in a Megatron run: a mask builder makes each micro-batch's ``SliceMask``.

``--burst-mask-builder module:function`` names a function that gets the micro-batch (its
[1, s] tensors: tokens, labels, loss_mask, position_ids, and ``eod``, the tokenizer's EOD
id) and returns a ``megatron_burst.SliceMask``, or ``(mask, position_ids)`` where the
positions RoPE reads are not 0..s-1. The batch is then sharded with the mask's layout
('area': balanced by the mask's visible area; ``shard_mask_batch``) and a ``MaskParams``
travels to core attention as Megatron's ``packed_seq_params``, as ``DocumentParams`` do for
documents; ``BurstDotProductAttention`` passes its mask to ``burst_attn``. The model must
read the batch's position ids (``document_model.as_document_model``), since the area layout
places tokens anywhere.

Shipped builders (``megatron_burst.megatron.mask_batches:<name>``):

- ``documents``: causal within each document (a document ends after each EOD), positions
  restarting in each: today's ``--burst-document-mask``, as a slice mask;
- ``prefix_lm``: the prefix is ``batch["prefix_length"]`` where the data gives one, else the
  first document (up to and including the first EOD); it sees itself fully, the rest is
  causal over everything;
- ``shared_question``: document 0 is the question; documents 0 and 1 are one causal slice;
  every later document is causal on itself and sees the question.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch
from megatron.core.packed_seq_params import PackedSeqParams

from megatron_burst.attention.sharding import shard_seq
from megatron_burst.megatron.documents import (BATCH_KEYS, document_boundaries,
                                               document_positions)
from megatron_burst.plan import mask_families
from megatron_burst.plan.layouts import MASK_LAYOUTS
from megatron_burst.plan.slices import SliceMask

FLAG = "--burst-mask-builder"


@dataclasses.dataclass
class MaskParams(PackedSeqParams):
    """`packed_seq_params` carrying a micro-batch's slice mask and the layout its tokens
    were sharded with (sbhd, batch 1). Megatron's boundary fields must stay unset."""

    qkv_format: str = "sbhd"
    mask: Optional[SliceMask] = None
    layout: str = "area"

    def __post_init__(self) -> None:
        parent = getattr(super(), "__post_init__", None)  # megatron-core 0.19 has one
        if parent is not None:
            parent()
        if not isinstance(self.mask, SliceMask):
            raise ValueError(f"MaskParams.mask must be a megatron_burst.SliceMask, got "
                             f"{type(self.mask).__name__}")
        if self.layout not in MASK_LAYOUTS:
            raise ValueError(f"MaskParams.layout must be one of {MASK_LAYOUTS}, got "
                             f"{self.layout!r}")
        if self.qkv_format != "sbhd":
            raise ValueError(f"MaskParams.qkv_format must be 'sbhd', got {self.qkv_format!r}")
        for name in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded",
                     "cu_seqlens_kv_padded", "cp_group", "local_cp_size"):
            if getattr(self, name, None) is not None:
                raise ValueError(f"MaskParams.{name} must be None: the mask says everything")


def load_builder(spec: str) -> Callable[[Mapping[str, Any]], Any]:
    """The function ``module:function`` names; ValueError naming the flag otherwise."""
    module, _, name = (spec or "").partition(":")
    if not module or not name:
        raise ValueError(f"{FLAG} must be module:function, got {spec!r}")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{FLAG} {spec!r}: {err}") from None
    if not callable(found):
        raise ValueError(f"{FLAG} {spec!r} is not callable")
    return found


def _lens(batch: Mapping[str, Any]) -> Tuple[int, ...]:
    cu = document_boundaries(batch["tokens"][0], batch["eod"])
    return tuple((cu[1:] - cu[:-1]).tolist())


def documents(batch: Mapping[str, Any]) -> Tuple[SliceMask, torch.Tensor]:
    cu = document_boundaries(batch["tokens"][0], batch["eod"])
    lens = tuple((cu[1:] - cu[:-1]).tolist())
    return mask_families.causal_document(lens), document_positions(cu)[None]


def prefix_lm(batch: Mapping[str, Any]) -> SliceMask:
    total = batch["tokens"].shape[1]
    given = batch.get("prefix_length")
    prefix = int(given.reshape(-1)[0]) if isinstance(given, torch.Tensor) else (
        int(given) if given is not None else _lens(batch)[0])
    return mask_families.prefix_lm_causal(total, prefix)


def shared_question(batch: Mapping[str, Any]) -> SliceMask:
    return mask_families.shared_question(_lens(batch))


def shard_mask_batch(data: Mapping[str, torch.Tensor], builder: Callable, eod: int,
                     cp_group: Any, layout: str = "area"
                     ) -> Tuple[Dict[str, torch.Tensor], MaskParams]:
    """This CP rank's part of a [1, s] batch placed for the mask ``builder`` makes of it,
    and the MaskParams the layers read. Positions are 0..s-1 unless the builder gives its
    own; every tensor is sharded alike, so row i of every shard is the same token."""
    tokens = data["tokens"]
    if tokens.dim() != 2 or tokens.shape[0] != 1:
        raise ValueError(f"{FLAG} needs one sequence per micro batch (--micro-batch-size 1), "
                         f"got tokens of shape {tuple(tokens.shape)}")
    made = builder({**data, "eod": eod})
    mask, positions = made if isinstance(made, tuple) else (made, None)
    if not isinstance(mask, SliceMask):
        raise ValueError(f"{FLAG}: the builder must return a SliceMask (or (mask, "
                         f"position_ids)), got {type(mask).__name__}")
    full: Dict[str, Any] = {key: data[key] for key in BATCH_KEYS if key != "position_ids"}
    full["position_ids"] = (positions if positions is not None
                            else torch.arange(tokens.shape[1])[None]).to(tokens.device)
    local = {key: shard_seq(value, cp_group, layout=layout, seq_dim=1, mask=mask)
             for key, value in full.items()}
    total = tokens.shape[1]
    return local, MaskParams(max_seqlen_q=total, max_seqlen_kv=total, mask=mask, layout=layout)
