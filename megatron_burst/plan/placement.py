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

Each layout is a value that places its own tokens (``layouts``); these functions take its
name.

Everything here is a pure function of (layout, world size, document lengths): every rank
computes every rank's shard, without communication.
"""
from __future__ import annotations

import functools

from .layouts import LAYOUTS, layout_named, local_rows  # noqa: F401  (LAYOUTS re-exported)
from .segments import Shard


def chunks_of(layout: str, world: int, rank: int) -> tuple[int, ...]:
    """Chunk indices (of ``divisor(world)``) a chunked layout's rank holds, in local order."""
    return layout_named(layout).chunks(world, rank)


@functools.lru_cache(maxsize=32)  # every call of a pack asks, in validation and planning
def local_length(layout: str, world: int, doc_lens: tuple[int, ...]) -> int:
    """Rows every rank holds; raises ValueError where the layout cannot place the tokens."""
    return local_rows(layout_named(layout), world, doc_lens)


def rank_segments(layout: str, world: int, rank: int, doc_lens: tuple[int, ...]) -> Shard:
    """The segments of ``rank``'s shard (a ``Shard``: a sequence of them, and arrays of the
    documents it holds whole). A plain sequence is one document."""
    return placement(layout, world, doc_lens)[rank]


@functools.lru_cache(maxsize=16)  # boundaries change every batch: keep only recent ones
def placement(layout: str, world: int, doc_lens: tuple[int, ...]) -> tuple[Shard, ...]:
    """Every rank's shard: the layout places them (``layouts``)."""
    return layout_named(layout).place(world, doc_lens)
