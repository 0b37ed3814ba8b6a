"""Which positions of which document each rank holds: the layouts, as lists of segments.

A rank's shard is a tuple of ``Segment``s: runs of consecutive positions of one document,
in the order of the rank's local rows. Three layouts:

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
  ranks. No padding: every rank holds exactly N/G tokens, so Megatron's [s/cp, b, h] shapes
  hold. Local rows come in the order zigzag chunks, then pieces, then whole documents:
  rows that other ranks need come first, so what a ring hop must carry is a prefix.

Everything here is a pure function of (layout, world size, document lengths): every rank
computes every rank's shard, without communication.
"""
from __future__ import annotations

import dataclasses
import functools
import heapq

LAYOUTS = ("zigzag", "contiguous", "whole_docs")
# How Megatron document batches may be placed: `whole_docs` keeps short documents on one
# rank; `zigzag` splits every document over all ranks, padded to 2*cp.
DOCUMENT_LAYOUTS = ("whole_docs", "zigzag")


@dataclasses.dataclass(frozen=True)
class Segment:
    """Local rows ``row:row+length`` hold positions ``pos:pos+length`` of document ``doc``.

    Positions at or past ``doc_len`` are padding.
    """

    row: int
    doc: int
    pos: int
    length: int
    doc_len: int

    @property
    def valid(self) -> int:
        """Rows of this segment that hold real tokens (the rest is padding)."""
        return max(0, min(self.length, self.doc_len - self.pos))


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


def rank_segments(layout: str, world: int, rank: int, doc_lens: tuple[int, ...]
                  ) -> tuple[Segment, ...]:
    """The segments of ``rank``'s shard. A plain sequence is one document."""
    return placement(layout, world, doc_lens)[rank]


@functools.lru_cache(maxsize=16)  # boundaries change every batch: keep only recent ones
def placement(layout: str, world: int, doc_lens: tuple[int, ...]
              ) -> tuple[tuple[Segment, ...], ...]:
    """Every rank's segments."""
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
        shards.append(tuple(segs))
    return tuple(shards)


# ------------------------------------------------------------------------- whole_docs


def _whole_docs(world: int, doc_lens: tuple[int, ...]) -> tuple[tuple[Segment, ...], ...]:
    cap = local_length("whole_docs", world, doc_lens)
    share = sum(n * n for n in doc_lens) / world
    split = [d for d, n in enumerate(doc_lens) if n and (n > cap or n * n > share)]
    held = [0] * world  # tokens per rank so far
    work = [0.0] * world  # attention work per rank so far (squared lengths)
    runs: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]  # (doc, pos, length)
    for d in split:
        for r, (first, second) in enumerate(_zigzag_chunks(doc_lens[d], world, held)):
            runs[r] += [(d, *first), (d, *second)]
            held[r] += first[1] + second[1]
            work[r] += doc_lens[d] ** 2 / world
    pieces: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]
    whole: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]
    kept = set(range(len(doc_lens))) - set(split)
    rest = sorted((d for d in kept if doc_lens[d]), key=lambda d: (-doc_lens[d], d))
    lightest = [(work[r], r) for r in range(world)]  # a heap: the least loaded rank first
    heapq.heapify(lightest)
    for d in rest:
        n = doc_lens[d]
        full: list[tuple[float, int]] = []  # popped ranks without room for this document
        while lightest and cap - held[lightest[0][1]] < n:
            full.append(heapq.heappop(lightest))
        if lightest:  # longest first onto the least loaded rank with room: balance by work
            _, r = heapq.heappop(lightest)
            whole[r].append((d, 0, n))
            held[r] += n
            work[r] += n * n
            heapq.heappush(lightest, (work[r], r))
            for entry in full:
                heapq.heappush(lightest, entry)
            continue
        for entry in full:
            heapq.heappush(lightest, entry)
        pos = 0  # no rank has room: cut it into contiguous pieces, roomiest ranks first
        for r in sorted(range(world), key=lambda r: (held[r] - cap, r)):
            take = min(cap - held[r], n - pos)
            if take > 0:
                pieces[r].append((d, pos, take))
                held[r] += take
                work[r] += take * (pos + take)
                pos += take
            if pos == n:
                break
        lightest = [(work[r], r) for r in range(world)]
        heapq.heapify(lightest)
    return tuple(_segments(runs[r] + pieces[r] + sorted(whole[r]), doc_lens)
                 for r in range(world))


def _zigzag_chunks(n: int, world: int, held: list[int]
                   ) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(pos, length) of chunks r and 2G-1-r of a document of ``n`` tokens, for every rank.

    Rank r gets n // G tokens, and the n % G left over go to the ranks holding the fewest
    tokens so far, so ranks stay within one token of each other. A rank's count is split
    between its two chunks as evenly as it goes.
    """
    base, extra = divmod(n, world)
    lucky = set(sorted(range(world), key=lambda r: (held[r], r))[:extra])
    counts = [base + (r in lucky) for r in range(world)]
    sizes = [0] * (2 * world)
    for r, c in enumerate(counts):
        sizes[r], sizes[2 * world - 1 - r] = c // 2, c - c // 2
    starts = [sum(sizes[:c]) for c in range(2 * world)]
    return [((starts[r], sizes[r]), (starts[2 * world - 1 - r], sizes[2 * world - 1 - r]))
            for r in range(world)]


def _segments(runs: list[tuple[int, int, int]], doc_lens: tuple[int, ...]
              ) -> tuple[Segment, ...]:
    """Segments in local row order from (doc, pos, length) runs; empty runs dropped."""
    segs, row = [], 0
    for doc, pos, length in runs:
        if length:
            segs.append(Segment(row, doc, pos, length, doc_lens[doc]))
            row += length
    return tuple(segs)
