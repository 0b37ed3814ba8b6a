"""Which positions of which document each rank holds: the layouts, as shards of segments.

A rank's shard is a ``segments.Shard``: a sequence of ``Segment``s (runs of consecutive
positions of one document, in the order of the rank's local rows), with the documents it
holds whole also as arrays, so per-pack planning never loops over them. Three layouts:

- ``zigzag``: each document is cut into 2G equal chunks and rank r holds chunks r and
  2G-1-r (Megatron's ``get_batch_on_this_cp_rank`` split; per document it is
  TransformerEngine's THD split). Packed documents are each padded to a multiple of 2G, as
  Megatron's PackedSeqParams do: padding rows see nothing and are seen by nothing.
- ``contiguous``: rank r holds chunk r of G (documents padded to a multiple of G).
- ``whole_docs``: for packed documents. A document short enough to stay whole is put on one
  rank, so its keys and values never travel; ranks are balanced by attention work (the sum
  of squared lengths), not tokens. Documents too long for that (longer than a rank's share
  of tokens, or with more work than a rank's share) are split zigzag over all ranks, with
  chunk sizes chosen so every rank holds the same number of tokens; when the whole
  documents do not fill the ranks exactly, one is cut into contiguous pieces on several
  ranks (fewer than G documents are cut). No padding: every rank holds exactly N/G tokens,
  so Megatron's [s/cp, b, h] shapes hold. Local rows come in the order zigzag chunks, then
  pieces, then whole documents: rows that other ranks need come first, so what a ring hop
  must carry is a prefix. Placed with array operations over the lengths (``whole_docs``).

Everything here is a pure function of (layout, world size, document lengths): every rank
computes every rank's shard, without communication.
"""
from __future__ import annotations

import functools

import numpy as np

from . import whole_docs
from .segments import Segment, Shard

from .layouts import DOCUMENT_LAYOUTS, LAYOUTS  # noqa: F401  (re-exported)


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def chunks_of(layout: str, world: int, rank: int) -> tuple[int, ...]:
    """Chunk indices (of ``world * chunks_per_rank``) a rank holds, in local order.

    ``whole_docs`` places a single sequence (one document) like ``zigzag``.
    """
    check_layout(layout)
    if layout == "contiguous":
        return (rank,)
    return (rank, 2 * world - 1 - rank)


def chunks_per_rank(layout: str) -> int:
    return len(chunks_of(layout, 1, 0))


def padded_doc_lens(doc_lens: tuple[int, ...], world: int, layout: str) -> tuple[int, ...]:
    """Each document's length as the layout stores it (padded for zigzag and contiguous)."""
    if layout == "whole_docs":
        return doc_lens
    parts = world * chunks_per_rank(layout)
    return tuple(-(-n // parts) * parts for n in doc_lens)


@functools.lru_cache(maxsize=32)  # every call of a pack asks, in validation and planning
def local_length(layout: str, world: int, doc_lens: tuple[int, ...]) -> int:
    """Rows every rank holds; raises ValueError where the layout cannot place the tokens."""
    total = sum(padded_doc_lens(doc_lens, world, layout))
    if layout == "whole_docs" and total % world:
        raise ValueError(f"layout 'whole_docs' gives every rank the same number of tokens: "
                         f"the {total} tokens of cu_seqlens must be divisible by {world} ranks")
    return total // world


def rank_segments(layout: str, world: int, rank: int, doc_lens: tuple[int, ...]) -> Shard:
    """The segments of ``rank``'s shard (a ``Shard``: a sequence of them, and arrays of the
    documents it holds whole). A plain sequence is one document."""
    return placement(layout, world, doc_lens)[rank]


@functools.lru_cache(maxsize=16)  # boundaries change every batch: keep only recent ones
def placement(layout: str, world: int, doc_lens: tuple[int, ...]) -> tuple[Shard, ...]:
    """Every rank's shard."""
    check_layout(layout)
    if layout == "whole_docs":
        return _whole_docs(world, doc_lens)
    shards = []
    for rank in range(world):
        segs, row = [], 0
        for doc, (n, padded) in enumerate(zip(doc_lens, padded_doc_lens(doc_lens, world,
                                                                         layout))):
            c = padded // (world * chunks_per_rank(layout))
            for chunk in chunks_of(layout, world, rank):
                if c:
                    segs.append(Segment(row, doc, chunk * c, c, n))
                    row += c
        shards.append(Shard.of(segs))
    return tuple(shards)


def _whole_docs(world: int, doc_lens: tuple[int, ...]) -> tuple[Shard, ...]:
    """The ``whole_docs`` layout (``whole_docs.place``: array operations over the lengths)."""
    cap = local_length("whole_docs", world, doc_lens)
    return whole_docs.place(world, np.asarray(doc_lens, dtype=np.int64), cap)
