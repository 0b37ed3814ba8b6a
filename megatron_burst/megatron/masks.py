"""What `BurstDotProductAttention` reads from Megatron's mask arguments, and what it refuses.

Megatron hands core attention three descriptions of the mask: the layer's `AttnMaskType`,
an `attention_mask` tensor, and `packed_seq_params`. BurstAttention computes causal, full
and sliding-window attention over the ring, and attention within packed documents; any
other mask would be silently dropped, so it is refused with a ValueError naming it:

- the mask type: causal (and padding_causal), or full (no_mask, padding);
- `attention_mask` (bool, True = masked out, rows = this CP rank's queries): not read, so
  accepted only where it says nothing the mask type does not: for a causal layer exactly
  the causal mask of this rank's zigzag rows, for a full layer no masked entry. A padding
  or document mask, a mask together with packed documents, or a non-bool mask is refused;
- `packed_seq_params`: `DocumentParams` (sbhd, boundaries plus the layout the batch was
  sharded with), or Megatron's THD `PackedSeqParams` (per-document zigzag, padded as
  Megatron pads). An sbhd/bshd PackedSeqParams with boundaries does not say how the batch
  was sharded, so it is refused; one without boundaries describes no documents.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType

from megatron_burst.megatron.documents import DocumentParams, graph_warmup_stand_in
from megatron_burst.plan.placement import rank_segments

CAUSAL_MASKS = (AttnMaskType.causal, AttnMaskType.padding_causal)
# Masks with no structure beyond "full": the padding ones carry their padding in the
# attention_mask tensor, which `check_attention_mask` refuses when it is present.
FULL_MASKS = (AttnMaskType.no_mask, AttnMaskType.padding)
PADDING_MASKS = (AttnMaskType.padding, AttnMaskType.padding_causal)


@dataclasses.dataclass(frozen=True)
class Documents:
    """Packed documents for `burst_attn`: boundaries, layout, and the tensors' format."""

    cu_seqlens: Any  # boundaries: a tensor, or the batch's megatron_burst DocumentPack
    layout: str
    qkv_format: str  # "sbhd" ([s, 1, h, d]) or "thd" ([t, h, d])


def is_causal(mask_type: AttnMaskType) -> bool:
    """Whether a layer of `mask_type` is causal; ValueError for types the ring cannot run."""
    if mask_type in CAUSAL_MASKS:
        return True
    if mask_type in FULL_MASKS:
        return False
    raise ValueError(
        f"BurstAttention supports causal and full masks (plus sliding window and packed "
        f"documents), not attn_mask_type={mask_type}")


def documents_of(params: Optional[PackedSeqParams], causal: bool, cp_group: Any
                 ) -> Optional[Documents]:
    """The packed documents `params` describe, or None; ValueError where it is ambiguous."""
    if params is None:
        return None
    if isinstance(params, DocumentParams):
        pack = params.pack if params.pack is not None else params.cu_seqlens_q
        return Documents(pack, params.layout, "sbhd")
    if params.qkv_format == "thd":
        return Documents(thd_boundaries(params, causal, cp_group), "zigzag", "thd")
    bounds = (params.cu_seqlens_q, params.cu_seqlens_kv, params.cu_seqlens_q_padded,
              params.cu_seqlens_kv_padded)
    if all(b is None for b in bounds):
        return None  # no documents: plain [s, b, h, d] attention
    raise ValueError(
        f"packed_seq_params with qkv_format={params.qkv_format!r} and cu_seqlens does not "
        f"say how the batch was sharded over the CP group; pass "
        f"megatron_burst.megatron.documents.DocumentParams (it carries the layout), or THD "
        f"PackedSeqParams")


def boundaries_of(docs: Optional[Documents], tokens: int) -> Any:
    """`docs`' boundaries as `burst_attn` takes them (None: no documents), a stand-in while
    Megatron warms a CUDA graph up (`documents.graph_warmup_stand_in`)."""
    return None if docs is None else graph_warmup_stand_in(docs.cu_seqlens, tokens)


def thd_boundaries(params: PackedSeqParams, causal: bool, cp_group: Any) -> torch.Tensor:
    """cu_seqlens of Megatron's THD packed sequence, which BurstAttention splits per document."""
    if getattr(params, "cp_group", None) not in (None, cp_group):
        raise ValueError("BurstAttention does not support hybrid (per-batch) CP groups")
    if getattr(params, "local_cp_size", None) not in (None, cp_group.size()):
        raise ValueError(f"packed_seq_params.local_cp_size={params.local_cp_size}: "
                         f"BurstAttention does not support hybrid (per-batch) CP sizes")
    if params.cu_seqlens_q is None:
        raise ValueError("THD packed_seq_params needs cu_seqlens_q (the document boundaries), "
                         "got None")
    cu_q = params.cu_seqlens_q if params.cu_seqlens_q_padded is None else params.cu_seqlens_q_padded
    cu_kv = (params.cu_seqlens_kv if params.cu_seqlens_kv_padded is None
             else params.cu_seqlens_kv_padded)
    if cu_kv is not None and not torch.equal(cu_q, cu_kv):
        raise ValueError("BurstAttention packed sequences need cu_seqlens_q == cu_seqlens_kv")
    if (not causal and params.cu_seqlens_q_padded is not None
            and not torch.equal(params.cu_seqlens_q, params.cu_seqlens_q_padded)):
        # Causal attention never looks past a document's end, so the padding Megatron adds
        # to make each document divisible by 2*cp is invisible; full attention would see it.
        raise ValueError(
            "BurstAttention packed full (non-causal) attention needs documents that are "
            "already divisible by 2*cp (cu_seqlens_q == cu_seqlens_q_padded)")
    return cu_q.to(torch.int32)


def check_attention_mask(mask: Optional[torch.Tensor], mask_type: AttnMaskType,
                         documents: Optional[Documents], s_local: int, cp_group: Any) -> None:
    """Refuse an `attention_mask` that says more than the mask type (see module docstring)."""
    if mask is None:
        return
    if documents is not None:
        raise ValueError("attention_mask together with packed documents: the documents "
                         "(packed_seq_params) already define the mask; pass attention_mask=None")
    if mask_type in PADDING_MASKS:
        raise ValueError(
            f"attn_mask_type={mask_type} with an attention_mask: BurstAttention cannot apply "
            f"padding masks; pack the sequences as documents (DocumentParams or THD "
            f"PackedSeqParams) instead")
    if mask.dtype != torch.bool:
        raise ValueError(f"attention_mask must be a bool tensor (True = masked out), got "
                         f"{mask.dtype}")
    if mask_type in CAUSAL_MASKS:
        if not _is_plain_causal(mask, s_local, cp_group):
            raise ValueError(
                "attention_mask is not the plain causal mask of this rank's rows (a document "
                "or custom mask?); BurstAttention does not read it: use --burst-document-mask "
                "(DocumentParams) for packed documents, or pass attention_mask=None")
    elif bool(mask.any()):
        raise ValueError(f"attention_mask masks entries of a full (attn_mask_type={mask_type}) "
                         f"layer; BurstAttention does not read it: pass attention_mask=None")


def _is_plain_causal(mask: torch.Tensor, s_local: int, cp_group: Any) -> bool:
    """Whether `mask` [..., s_local, s] is the causal mask of this rank's zigzag rows."""
    world, rank = cp_group.size(), cp_group.rank()
    total = s_local * world
    if mask.dim() < 2 or tuple(mask.shape[-2:]) != (s_local, total):
        return False
    rows = torch.cat([torch.arange(seg.pos, seg.pos + seg.length)
                      for seg in rank_segments("zigzag", world, rank, (total,))])
    causal = torch.arange(total)[None, :] > rows[:, None]  # True above the diagonal
    return bool((mask == causal.to(mask.device)).all())
