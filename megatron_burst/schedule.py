"""Which query/key blocks each rank computes at each ring step: layouts and masks as data.

The ring loops in ``burst.py`` are one loop for every mask and layout. What differs is only
*which* rectangles of (local queries) x (keys held this step) are computed, and with what
mask inside each rectangle. This module answers that as a tuple of ``Block``s.

A rank's shard is a list of ``Segment``s: runs of consecutive positions of one document.
- ``zigzag`` cuts each document into 2G equal chunks; rank r holds chunks r and 2G-1-r
  (Megatron's ``get_batch_on_this_cp_rank`` split, and per document TE's THD split).
- ``contiguous`` gives rank r chunk r of G.
- Packed documents (``doc_lens``) are each padded to a multiple of the chunk count, as
  Megatron's PackedSeqParams do; padding tokens see nothing and are seen by nothing.
- With Ulysses, a ring member holds the segments of all U ranks of its group.

Every mask is a *band* on key-minus-query position inside a document: causal keeps
j <= i, a window (left, right) keeps i-left <= j <= i+right. A block is trimmed to the
rows and columns with something visible, so a block is never partly empty and fully
masked pairs cost no FLOPs; steps with no block are skipped.
"""
from __future__ import annotations

import dataclasses
import functools

LAYOUTS = ("zigzag", "contiguous")
INF = 1 << 62


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


@dataclasses.dataclass(frozen=True)
class Mask:
    causal: bool = False
    window: tuple[int, int] = (-1, -1)  # (left, right); -1 = unbounded

    @property
    def plain(self) -> bool:
        return self.window == (-1, -1)


@dataclasses.dataclass(frozen=True)
class Block:
    """One kernel call: query rows ``q_start:q_stop`` against key rows ``k_start:k_stop``.

    ``kind`` is 'full' (every pair visible), 'causal' (square, key j visible to query i
    iff j <= i) or 'band' (visible iff lo <= j - i <= hi). Every row and every column of a
    block has at least one visible pair.
    """

    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    kind: str = "full"
    lo: int = 0
    hi: int = 0

    @property
    def causal(self) -> bool:
        return self.kind == "causal"

    @property
    def q(self) -> slice:
        return slice(self.q_start, self.q_stop)

    @property
    def k(self) -> slice:
        return slice(self.k_start, self.k_stop)

    @property
    def area(self) -> int:
        """Visible (query, key) pairs: what the kernel spends FLOPs on."""
        n, m = self.q_stop - self.q_start, self.k_stop - self.k_start
        if self.kind == "full":
            return n * m
        lo, hi = (-(n - 1), 0) if self.kind == "causal" else (self.lo, self.hi)
        return sum(max(0, min(m - 1, i + hi) - max(0, i + lo) + 1) for i in range(n))


# ------------------------------------------------------------------------- shards


def chunks_of(layout: str, world: int, rank: int) -> tuple[int, ...]:
    """Chunk indices (of ``world * chunks_per_rank``) a rank holds, in local order."""
    if layout == "zigzag":
        return (rank, 2 * world - 1 - rank)
    if layout == "contiguous":
        return (rank,)
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def chunks_per_rank(layout: str) -> int:
    return len(chunks_of(layout, 1, 0))


def padded_doc_lens(doc_lens: tuple[int, ...], world: int, layout: str) -> tuple[int, ...]:
    """Each document's length rounded up to a multiple of the layout's chunk count."""
    parts = world * chunks_per_rank(layout)
    return tuple(-(-n // parts) * parts for n in doc_lens)


@functools.lru_cache(maxsize=1024)
def rank_segments(layout: str, world: int, rank: int, doc_lens: tuple[int, ...]
                  ) -> tuple[Segment, ...]:
    """The segments of ``rank``'s shard. A plain sequence is one document."""
    segs, row = [], 0
    for doc, (n, padded) in enumerate(zip(doc_lens, padded_doc_lens(doc_lens, world, layout))):
        c = padded // (world * chunks_per_rank(layout))
        for chunk in chunks_of(layout, world, rank):
            segs.append(Segment(row, doc, chunk * c, c, n))
            row += c
    return tuple(segs)


def member_segments(layout: str, world: int, members: tuple[int, ...],
                    doc_lens: tuple[int, ...]) -> tuple[Segment, ...]:
    """Segments of several ranks' shards concatenated in ``members`` order (Ulysses)."""
    out, row = [], 0
    for r in members:
        for s in rank_segments(layout, world, r, doc_lens):
            out.append(dataclasses.replace(s, row=row))
            row += s.length
    return tuple(out)


# ------------------------------------------------------------------------- blocks


def _pair_block(a: Segment, b: Segment, mask: Mask) -> Block | None:
    """The trimmed block of query segment ``a`` against key segment ``b``, or None."""
    if a.doc != b.doc:
        return None
    nq = max(0, min(a.length, a.doc_len - a.pos))
    nk = max(0, min(b.length, b.doc_len - b.pos))
    if nq == 0 or nk == 0:
        return None
    # Query i sits at a.pos+i, key j at b.pos+j: key - query = j - i - off.
    off = a.pos - b.pos
    left, right = mask.window
    lo = off - left if left >= 0 else -INF
    hi = off + right if right >= 0 else INF
    if mask.causal:
        hi = min(hi, off)
    i0, i1 = max(0, -hi), min(nq - 1, nk - 1 - lo)
    if i0 > i1:
        return None
    j0, j1 = max(0, i0 + lo), min(nk - 1, i1 + hi)
    n, m = i1 - i0 + 1, j1 - j0 + 1
    lo, hi = max(lo - (j0 - i0), -(n - 1)), min(hi - (j0 - i0), m - 1)
    if lo == -(n - 1) and hi == m - 1:
        kind = "full"
    elif n == m and lo == -(n - 1) and hi == 0:
        kind = "causal"
    else:
        kind = "band"
    return Block(a.row + i0, a.row + i1 + 1, b.row + j0, b.row + j1 + 1, kind,
                 lo if kind == "band" else 0, hi if kind == "band" else 0)


def _monotone(segs: tuple[Segment, ...]) -> bool:
    """One document, positions increasing along the local rows."""
    return all(x.doc == y.doc and x.pos + x.length <= y.pos for x, y in zip(segs, segs[1:]))


@functools.lru_cache(maxsize=8192)
def blocks_between(q_segs: tuple[Segment, ...], k_segs: tuple[Segment, ...],
                   mask: Mask) -> tuple[Block, ...]:
    """All blocks of queries ``q_segs`` against keys ``k_segs`` under ``mask``."""
    if q_segs == k_segs and mask.causal and mask.plain and _monotone(q_segs) and all(
            s.pos + s.length <= s.doc_len for s in q_segs):
        # Same positions on both sides, in increasing order, no padding: the global causal
        # mask is the local one, so a single diagonal call covers the whole shard.
        n = q_segs[-1].row + q_segs[-1].length - q_segs[0].row
        return (Block(q_segs[0].row, q_segs[0].row + n, q_segs[0].row, q_segs[0].row + n,
                      "causal"),)
    found = [blk for a in q_segs for b in k_segs
             if (blk := _pair_block(a, b, mask)) is not None]
    return _merge_full(found)


def _merge_full(found: list[Block]) -> tuple[Block, ...]:
    """Merge full blocks that touch: same rows and adjacent columns, then the reverse."""
    def merge(blocks: list[Block], rows: bool) -> list[Block]:
        out: list[Block] = []
        key = (lambda b: (b.k_start, b.q_start)) if rows else (lambda b: (b.q_start, b.k_start))
        for blk in sorted(blocks, key=key):
            prev = out[-1] if out else None
            if prev is not None and prev.kind == blk.kind == "full":
                if not rows and prev.q == blk.q and prev.k_stop == blk.k_start:
                    out[-1] = dataclasses.replace(prev, k_stop=blk.k_stop)
                    continue
                if rows and prev.k == blk.k and prev.q_stop == blk.q_start:
                    out[-1] = dataclasses.replace(prev, q_stop=blk.q_stop)
                    continue
            out.append(blk)
        return out

    return tuple(merge(merge(found, rows=False), rows=True))


# ------------------------------------------------------------------------- the ring


@dataclasses.dataclass(frozen=True)
class RingSchedule:
    """The whole schedule of one call: who holds which positions, and the mask.

    ``world`` ranks shard the sequence; with ``ulysses`` U > 1 they form world/U ring
    members, member g holding the shards of ranks gU .. gU+U-1 (after the all-to-all).
    """

    layout: str
    world: int
    doc_lens: tuple[int, ...]
    mask: Mask
    ulysses: int = 1

    @property
    def ring_size(self) -> int:
        return self.world // self.ulysses

    def segments(self, member: int) -> tuple[Segment, ...]:
        u = self.ulysses
        return member_segments(self.layout, self.world, tuple(range(member * u, member * u + u)),
                               self.doc_lens)

    def blocks(self, q_member: int, k_member: int) -> tuple[Block, ...]:
        return blocks_between(self.segments(q_member), self.segments(k_member), self.mask)

    def last_step(self, source) -> int:
        """The last ring step at which any member computes anything.

        ``source(member, step)`` is the topology's answer to "whose keys does ``member``
        hold at ``step``". Steps after this one are not run, and their payloads are never
        sent: with a sliding window on the contiguous layout, K/V that no rank still needs
        stay home.
        """
        return _last_step(self, tuple(tuple(source(m, s) for s in range(self.ring_size))
                                      for m in range(self.ring_size)))


@functools.lru_cache(maxsize=1024)
def _last_step(sched: RingSchedule, sources: tuple[tuple[int, ...], ...]) -> int:
    last = 0
    for member, row in enumerate(sources):
        for step, src in enumerate(row):
            if step > last and sched.blocks(member, src):
                last = step
    return last
