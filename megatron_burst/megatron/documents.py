"""Packed documents in a Megatron run: how a batch says where its documents are.

Long-context pretraining packs many documents into one sequence. Megatron's own ways to
keep them apart do not fit a context-parallel run at 128K tokens: `--reset-attention-mask`
builds a dense [s, s] mask, and its packed-sequence path wants THD data. Here a batch of
ordinary [1, s] samples (GPTDataset, MockGPTDataset) becomes a document batch:

- boundaries from the EOD token: a document ends after each EOD (`document_boundaries`);
- positions that restart at 0 in every document (`document_positions`), which RoPE reads
  (see `megatron_burst.megatron.document_model`);
- tokens, labels, loss mask and positions sharded over the CP group with the layout the
  attention will use (`shard_document_batch`), `whole_docs` by default;
- a `DocumentParams` that travels to core attention as Megatron's `packed_seq_params`
  and tells `BurstDotProductAttention` the boundaries and the layout.

The boundaries stay on the host: every reader (the layouts, `burst_attn`'s checks) wants
host integers, so a CPU tensor costs no device synchronisation per layer. In layout
`pack_zigzag` the GPU reads them instead: they are padded to a fixed count
(`padded_boundaries`: the run's document capacity) and go to the device with the batch, so
every micro-batch has one shape and Megatron's CUDA graphs replay it.
"""
from __future__ import annotations

import dataclasses
import functools
import weakref
from typing import Any, Dict, Mapping, Optional, Tuple

import torch
import torch.distributed as dist
from megatron.core.packed_seq_params import PackedSeqParams

from megatron_burst.attention.sharding import shard_seq
from megatron_burst.plan.packs import DocumentPack, pack_documents
from megatron_burst.plan.layouts import LAYOUTS, PACK_ZIGZAG

# What a document batch holds, in the order forward_step unpacks it.
BATCH_KEYS = ("tokens", "labels", "loss_mask", "position_ids")


@dataclasses.dataclass
class DocumentParams(PackedSeqParams):
    """`packed_seq_params` for packed documents in Megatron's [s, b, h, d] format.

    `cu_seqlens_q` (= `cu_seqlens_kv`) are the boundaries of the whole packed sequence
    [0, n0, n0+n1, ..., s], the same on every CP rank; `layout` is how the batch was
    sharded over the CP group (`megatron_burst.plan.layouts.LAYOUTS`). `max_seqlen_q/kv` hold
    the packed sequence's length, not the longest document's: GPTModel sizes its RoPE
    table from them, and a table that long holds every position of every document.
    Megatron's THD-only fields (padded boundaries, per-batch CP groups) must stay unset.
    """

    qkv_format: str = "sbhd"
    layout: str = "whole_docs"
    # The pack described once (lengths, digest, and the plans every layer and the backward
    # reuse); `document_params` makes it from cu_seqlens_q.
    pack: Optional[DocumentPack] = None

    def __post_init__(self) -> None:
        parent = getattr(super(), "__post_init__", None)  # megatron-core 0.19 has one
        if parent is not None:
            parent()
        _check_params(self)


def _check_params(params: DocumentParams) -> None:
    """Raise ValueError naming the first field the adapter could not honour."""
    if params.qkv_format != "sbhd":
        raise ValueError(f"DocumentParams.qkv_format must be 'sbhd' (Megatron's [s, b, h, d] "
                         f"attention inputs), got {params.qkv_format!r}")
    if params.layout not in LAYOUTS:
        raise ValueError(f"DocumentParams.layout must be one of {LAYOUTS}, got "
                         f"{params.layout!r}")
    cu = params.cu_seqlens_q
    if _graph_placeholder(cu):
        return  # the attention checks the boundaries where it reads them (burst_attn)
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2:
        raise ValueError("DocumentParams.cu_seqlens_q must be a 1-D tensor of document "
                         "boundaries [0, n0, n0+n1, ..., s]")
    kv = params.cu_seqlens_kv
    if kv is not None and kv is not cu and not torch.equal(kv.cpu(), cu.cpu()):
        raise ValueError("DocumentParams: self-attention needs cu_seqlens_kv == cu_seqlens_q")
    if params.layout == PACK_ZIGZAG.name and params.pack is not None:
        raise ValueError("DocumentParams.pack must be None in layout 'pack_zigzag': the GPU "
                         "reads the boundaries, and a pack (another value every batch) would "
                         "keep Megatron's CUDA graphs from replaying the batch")
    if params.pack is not None and params.pack.lens != pack_documents(cu).lens:
        raise ValueError("DocumentParams.pack describes other documents than cu_seqlens_q")
    for name in ("cu_seqlens_q_padded", "cu_seqlens_kv_padded", "cp_group", "local_cp_size"):
        if getattr(params, name, None) is not None:
            raise ValueError(f"DocumentParams.{name} must be None: the layout places the "
                             f"documents (padding included), on the model's CP group")


def _graph_placeholder(value: Any) -> bool:
    """Whether ``value`` is what Megatron's CUDA graph runner puts in a tensor's place when
    it maps the params (``cuda_graphs.tree_map``: ``dataclasses.replace`` reruns
    ``__post_init__`` with an ``ArgMetadata`` or a weak reference for each tensor, while it
    records and captures the graph): not a value to check."""
    if isinstance(value, weakref.ref):
        return True
    placeholder = getattr(_cuda_graphs(), "ArgMetadata", None)
    return placeholder is not None and isinstance(value, placeholder)


def graph_warmup_stand_in(cu_seqlens: Any, tokens: int) -> Any:
    """`cu_seqlens`, or, while Megatron warms a layer up for its local CUDA graphs, one
    document of all `tokens` in the place of boundaries that are all zeros.

    Why: the graph runner warms every layer up on zeros in each input's place
    (`cuda_graphs.ArgMetadata.zeros_like`), the boundaries included, and burst_attn's device
    check would report them (no pack ends at 0) at the next call. The warm-up's outputs are
    thrown away; the capture after it runs on the graph's input buffer as it is (nothing is
    checked in a capture), and every replay refills that buffer with the batch's boundaries.
    Outside a warm-up, or for boundaries that are not all zeros, nothing changes."""
    if not isinstance(cu_seqlens, torch.Tensor) or not _megatron_graph_warmup():
        return cu_seqlens
    if bool(cu_seqlens.any()):  # a host read, in a warm-up (never in a capture)
        return cu_seqlens
    stand_in = torch.full_like(cu_seqlens, tokens)
    stand_in[0] = 0
    return stand_in


def _megatron_graph_warmup() -> bool:
    warming = getattr(_cuda_graphs(), "is_graph_warmup", None)
    return warming is not None and bool(warming())


@functools.lru_cache(maxsize=1)
def _cuda_graphs() -> Any:
    """Megatron's local CUDA graphs module, or None (a Megatron without them maps nothing
    and warms nothing up); looked up once, not at every layer's call."""
    try:
        from megatron.core.transformer import cuda_graphs
    except ImportError:
        return None
    return cuda_graphs


def document_params(cu_seqlens: torch.Tensor, layout: str = "whole_docs",
                    capacity: Optional[int] = None) -> DocumentParams:
    """The DocumentParams of a packed sequence with boundaries `cu_seqlens` (in layout
    `pack_zigzag`, padded to `capacity` documents: `padded_boundaries`)."""
    pack = pack_documents(cu_seqlens)
    total = sum(pack.lens)
    if layout == PACK_ZIGZAG.name:
        cu = padded_boundaries(pack.cu_seqlens, capacity)
        return DocumentParams(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=total,
                              max_seqlen_kv=total, layout=layout)
    return DocumentParams(cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                          max_seqlen_q=total, max_seqlen_kv=total, layout=layout, pack=pack)


def padded_boundaries(cu_seqlens: torch.Tensor, capacity: Optional[int]) -> torch.Tensor:
    """`cu_seqlens` padded with empty documents to `capacity` + 1 entries (unset: the next
    power of two of its own count); ValueError for a sequence of more documents."""
    count = len(cu_seqlens)
    if capacity is None:
        capacity = 1 << (count - 2).bit_length()
    if count - 1 > capacity:
        raise ValueError(f"a sample holds {count - 1} documents, more than the run's document "
                         f"capacity {capacity} (--burst-document-capacity, "
                         f"data.document_capacity): raise it")
    return torch.cat((cu_seqlens, cu_seqlens[-1:].expand(capacity + 1 - count)))


def unpadded(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """`padded_boundaries`' input again: the repeats of the last boundary dropped (the
    boundaries of EOD never repeat it: `document_boundaries`)."""
    return cu_seqlens[:int((cu_seqlens < cu_seqlens[-1]).sum()) + 1]


def document_boundaries(tokens: torch.Tensor, eod: int) -> torch.Tensor:
    """int32 boundaries [0, ..., len] of the documents in a 1-D token sequence.

    A document ends after each EOD token; tokens after the last EOD are one more
    document (a pack usually ends mid-document). Computed on the host.
    """
    if tokens.dim() != 1:
        raise ValueError(f"document_boundaries takes one sequence [s], got shape "
                         f"{tuple(tokens.shape)}")
    length = tokens.numel()
    ends = (torch.nonzero(tokens.cpu() == eod).flatten() + 1).tolist()
    bounds = [0] + [e for e in ends if e < length] + [length]
    return torch.tensor(bounds, dtype=torch.int32)


def document_positions(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Position of every token inside its own document (int64, restarts at 0)."""
    cu = cu_seqlens.to(torch.int64)
    index = torch.arange(int(cu[-1]), device=cu.device)
    doc = torch.bucketize(index, cu[1:], right=True)  # boundaries at or before the token
    return index - cu[doc]


def shard_document_batch(data: Mapping[str, torch.Tensor], eod: int,
                         cp_group: Optional[dist.ProcessGroup],
                         layout: str = "whole_docs", capacity: Optional[int] = None
                         ) -> Tuple[Dict[str, torch.Tensor], DocumentParams]:
    """This CP rank's part of a packed [1, s] batch, and the DocumentParams of its documents.

    `data` holds tokens, labels and loss_mask (Megatron's GPTDataset keys); positions are
    rebuilt per document whatever the dataset put there, and the loss mask is kept as it
    is (so `--eod-mask-loss` still masks EOD). Every tensor is sharded with `layout`, the
    same one the attention uses, so row i of every shard is the same token.
    """
    tokens = data["tokens"]
    if tokens.dim() != 2 or tokens.shape[0] != 1:
        raise ValueError(f"document masks need one packed sequence per micro batch "
                         f"(--micro-batch-size 1), got tokens of shape {tuple(tokens.shape)}")
    cu = document_boundaries(tokens[0], eod)
    params = document_params(cu, layout, capacity)
    full: Dict[str, Any] = {key: data[key] for key in BATCH_KEYS if key != "position_ids"}
    full["position_ids"] = document_positions(cu).to(tokens.device)[None]
    for key, value in full.items():
        if value.shape != tokens.shape:
            raise ValueError(f"batch[{key!r}] has shape {tuple(value.shape)}, tokens "
                             f"{tuple(tokens.shape)}")
    local = {key: shard_seq(value, cp_group, layout=layout, seq_dim=1,
                           cu_seqlens=params.pack)
             for key, value in full.items()}
    return local, params
