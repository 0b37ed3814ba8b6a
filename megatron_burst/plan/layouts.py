"""The ways tokens are placed on the ranks, as values: each layout places its tokens and
states what a sequence's length must be a multiple of (as PyTorch's context-parallel load
balancers do). The one owner of the layouts' names and rules: everything else asks these.

- ``zigzag``: each document cut into 2G equal chunks, rank r holds chunks r and 2G-1-r
  (Megatron's ``get_batch_on_this_cp_rank`` split); length a multiple of 2G.
- ``contiguous``: rank r holds chunk r of G; length a multiple of G.
- ``whole_docs``: short documents whole on one rank, balanced by work (``whole_docs``);
  every rank holds the same number of tokens, so the length is a multiple of G.
- ``area``: a slice mask's chunks dealt by visible area (``area``); a multiple of G.
- ``pack_zigzag``: a document pack cut as one sequence into 2G equal chunks, rank r holding
  chunks r and 2G-1-r, whatever its documents; length a multiple of 2G. The documents are a
  mask the GPU reads (``kernels.device_calls``): the placement, the hops and the kernel calls
  are the same for every pack of a length, so a new pack is planned by nobody on the host,
  and a call can be captured in a CUDA graph and replayed with the next pack.

Numpy is imported only when a layout places tokens, so that what needs only the names and
divisors (the options schema, the configs, the command line) imports no numpy and no torch.
"""
from __future__ import annotations

import dataclasses
from typing import Any

PLAIN, DOCUMENTS, MASK = "plain", "documents", "mask"  # what a layout may place


@dataclasses.dataclass(frozen=True)
class Layout:
    """A way to place a sequence's tokens on G ranks (every rank the same number)."""

    name: str
    places: frozenset  # of PLAIN, DOCUMENTS, MASK
    pads = False  # whether documents are padded to the divisor (their ranks' rows vary)
    places_documents = True  # whether documents move tokens (not so in ``pack_zigzag``)
    # Whether a hop carries a shard's leading rows, not the span its receiver reads: kernel
    # launches bound on the GPU from a shard's first row (``pack_zigzag``) cannot start
    # past it (``schedule.RingSchedule.needed_ranges``).
    hops_from_first_row = False
    # Whether a Ulysses group that is the whole ring may hold its rows in position order
    # (``segments.in_position_order``): not where kernel launches are bound on the GPU
    # from each rank's own rows (``pack_zigzag``).
    member_in_position_order = True

    def divisor(self, world: int) -> int:
        """What the length of a sequence placed on ``world`` ranks must be a multiple of."""
        return world

    def padded(self, doc_lens: tuple[int, ...], world: int) -> tuple[int, ...]:
        """Each document's length as the layout stores it."""
        return doc_lens

    def place(self, world: int, doc_lens: tuple[int, ...]) -> tuple:
        """Every rank's shard (``segments.Shard``) of documents ``doc_lens``."""
        raise ValueError(f"layout {self.name!r} places a slice mask's tokens: it needs mask=")

    def place_mask(self, world: int, total: int, mask: Any) -> tuple:
        """Every rank's shard of a ``total``-token sequence attended under ``mask``."""
        return self.place(world, (total,))


@dataclasses.dataclass(frozen=True)
class Chunked(Layout):
    """Each document cut into equal chunks (padded to fill them): G of them, rank r holding
    chunk r; or, ``mirrored``, 2G, rank r holding chunks r and 2G-1-r."""

    mirrored: bool = False
    pads = True

    def divisor(self, world: int) -> int:
        return 2 * world if self.mirrored else world

    def chunks(self, world: int, rank: int) -> tuple[int, ...]:
        """Chunk indices (of ``divisor(world)``) that ``rank`` holds, in local order."""
        return (rank, 2 * world - 1 - rank) if self.mirrored else (rank,)

    def padded(self, doc_lens: tuple[int, ...], world: int) -> tuple[int, ...]:
        parts = self.divisor(world)
        return tuple(-(-n // parts) * parts for n in doc_lens)

    def place(self, world: int, doc_lens: tuple[int, ...]) -> tuple:
        from .segments import Segment, Shard

        shards = []
        for rank in range(world):
            segs, row = [], 0
            for doc, (n, padded) in enumerate(zip(doc_lens, self.padded(doc_lens, world))):
                c = padded // self.divisor(world)
                for chunk in self.chunks(world, rank):
                    if c:
                        segs.append(Segment(row, doc, chunk * c, c, n))
                        row += c
            shards.append(Shard.of(segs))
        return tuple(shards)


@dataclasses.dataclass(frozen=True)
class PackChunked(Chunked):
    """A pack cut as one sequence (``pack_zigzag``): its documents do not move a token."""

    pads = False
    places_documents = False
    hops_from_first_row = True
    member_in_position_order = False

    def padded(self, doc_lens: tuple[int, ...], world: int) -> tuple[int, ...]:
        total, parts = sum(doc_lens), self.divisor(world)
        if total % parts:
            raise ValueError(f"layout {self.name!r} cuts a pack into {parts} equal chunks: "
                             f"its {total} tokens must be divisible by {parts}")
        return doc_lens

    def place(self, world: int, doc_lens: tuple[int, ...]) -> tuple:
        return super().place(world, (sum(self.padded(doc_lens, world)),))


@dataclasses.dataclass(frozen=True)
class WholeDocs(Layout):
    """Short documents whole on one rank, long ones split (``whole_docs.place``)."""

    def place(self, world: int, doc_lens: tuple[int, ...]) -> tuple:
        import numpy as np

        from . import whole_docs

        cap = local_rows(self, world, doc_lens)
        return whole_docs.place(world, np.asarray(doc_lens, dtype=np.int64), cap)


@dataclasses.dataclass(frozen=True)
class Area(Layout):
    """A slice mask's chunks dealt so every rank holds the same visible area (``area``)."""

    def place_mask(self, world: int, total: int, mask: Any) -> tuple:
        from . import area

        return area.place(world, total, mask)


ZIGZAG = Chunked("zigzag", frozenset({PLAIN, DOCUMENTS, MASK}), mirrored=True)
CONTIGUOUS = Chunked("contiguous", frozenset({PLAIN, DOCUMENTS, MASK}))
WHOLE_DOCS = WholeDocs("whole_docs", frozenset({PLAIN, DOCUMENTS}))
AREA = Area("area", frozenset({MASK}))
PACK_ZIGZAG = PackChunked("pack_zigzag", frozenset({PLAIN, DOCUMENTS}), mirrored=True)
_ALL = (AREA, ZIGZAG, CONTIGUOUS, WHOLE_DOCS, PACK_ZIGZAG)

LAYOUTS = tuple(x.name for x in _ALL if PLAIN in x.places)
# How Megatron document batches may be placed: `whole_docs` (the default) keeps short
# documents on one rank; `zigzag` splits every document over all ranks, padded;
# `pack_zigzag` places the pack as one sequence and the GPU reads its documents.
DOCUMENT_LAYOUTS = tuple(x.name for x in (WHOLE_DOCS, ZIGZAG, PACK_ZIGZAG))
# How a slice mask's tokens may be placed: `area` (the default with a mask) deals chunks so
# every rank holds the same share of the visible area; `zigzag` and `contiguous` as for a
# plain sequence.
MASK_LAYOUTS = tuple(x.name for x in _ALL if MASK in x.places)
_BY_NAME = {x.name: x for x in _ALL}


def layout_named(name: str, role: str = PLAIN) -> Layout:
    """The layout called ``name``; ValueError where it cannot place ``role``'s tokens."""
    found = _BY_NAME.get(name) if isinstance(name, str) else None
    if found is None or role not in found.places:
        if role == MASK:
            raise ValueError(f"layout must be one of {MASK_LAYOUTS} with a mask, got {name!r}")
        raise ValueError(f"layout must be one of {LAYOUTS}, got {name!r}"
                         + (" (layout 'area' places a mask: it needs mask=)"
                            if name == "area" else ""))
    return found


def local_rows(layout: Layout, world: int, doc_lens: tuple[int, ...]) -> int:
    """Rows every rank holds; ValueError where the layout cannot place the tokens."""
    total = sum(layout.padded(doc_lens, world))
    if total % world:
        raise ValueError(f"layout {layout.name!r} gives every rank the same number of tokens: "
                         f"the {total} tokens of cu_seqlens must be divisible by {world} ranks")
    return total // world
