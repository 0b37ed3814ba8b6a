"""The ``area`` layout: where a slice mask's tokens go so every rank does the same work.

A slice mask's work is its visible area, and where it lies depends on the mask: a prefix-LM
mask puts most of it in the last rows, a shared-question mask in the question's keys. The
``area`` layout (the default for a mask) cuts the sequence into chunks, k per rank, and
deals them out so that the largest rank's share of the area is as small as a greedy can make
it (MagiAttention's dispatch: largest chunk first, onto the least loaded rank), while every
rank keeps exactly N/G tokens (Megatron's [s/cp, b, h] shapes): chunks differ in length by
at most one token, and each rank takes the same number of the longer ones. k is tried at
1, 2, 4, ... up to ``MAX_CHUNKS`` (chunks no shorter than ``MIN_CHUNK`` unless the shard is
tiny), and the k of the least work wins, counting a chunk's edges too: finer chunks cut the
blocks smaller, and a kernel wastes about a partial tile at each block edge, so each chunk
counts ``EDGE_ROWS`` rows of its keys on top of the area (at most its own rows: a short
chunk still runs whole tiles). On 2x H200 the finest balance cost more than it gained: a
causal sliding window (w 1024, 8K tokens per GPU) dealt in 512-token chunks balanced to
1.016 ran its forward at 50 TFLOP/s per GPU, one contiguous chunk per rank (1.032, one band
call) at 154 (``benchmarks/results/h200x2_issue42_area_edges/``).
Where a chunk holds more than its share of the area (the global window's first rows, which
see every key), even chunks cannot balance it: the rank holding that chunk is over its share
before it takes anything else (on 4 ranks x 8K tokens the global window's 1,024 such rows
left the largest share at 1.69x the mean). So each k is also tried with its heavy chunks
halved until each holds at most its share (or reaches ``MIN_CHUNK``), dealt the same way,
and a piece no rank has room for cut to the room of the least loaded rank that has some
(``_deal_pieces``); a rank's edges are then counted per piece it holds.
A rank's chunks are its rows in sequence order (touching ones joined), so its shard is a
few segments of one document, the sequence (``segments.Shard``), and the schedule pairs
them as it pairs any segments.

Everything is a pure function of (world, length, mask): every rank computes every rank's
shard, without communication.
"""
from __future__ import annotations

import heapq

import numpy as np

from .segments import Segment, Shard
from .slices import SliceMask, rows_area

MAX_CHUNKS = 64  # chunks per rank, at most
MIN_CHUNK = 64  # tokens a chunk keeps (a shard of few tokens may cut up to 4 chunks)
EDGE_ROWS = 256  # a chunk's edges cost about this many rows of work: two partial 128-row tiles
UNEVEN = 1.05  # a largest share above this times the mean tries heavy chunks in pieces


def place(world: int, total: int, mask: SliceMask) -> tuple[Shard, ...]:
    """Every rank's shard of a ``total``-token sequence, dealt by ``mask``'s area."""
    return tuple(_shard(total, chunks) for chunks in _dealt(world, total, mask)[1])


def _candidates(n: int) -> list[int]:
    """Chunks per rank to try: powers of two up to the cap for a shard of ``n`` tokens."""
    top = min(MAX_CHUNKS, max(min(4, n), n // MIN_CHUNK))
    out, k = [], 1
    while k <= top:
        out.append(k)
        k *= 2
    return out


def _dealt(world: int, total: int, mask: SliceMask):
    """(work, each rank's chunks as (start, length)) of the dealing of least work: a rank's
    work is its share of the area, each of its chunks' edges adding ``EDGE_ROWS`` rows' worth
    of keys (``work``); a dealing's is its largest rank's."""
    if total % world:
        raise ValueError(f"layout 'area' gives every rank the same number of tokens: the "
                         f"sequence's {total} tokens must be divisible by {world} ranks")
    n, best, score = total // world, None, float("inf")
    even = mask.area / world
    for k in _candidates(n):
        if even * _edges(k, n) >= score:  # no finer k can do less work
            break
        largest, chunks = _deal(world, n, k, mask)
        if largest * _edges(k, n) < score:
            best, score = chunks, largest * _edges(k, n)
        if largest > UNEVEN * even:  # a chunk over its share: try it in pieces
            pieces = _deal_pieces(world, n, k, mask)
            got = work(pieces, n, mask) if pieces is not None else float("inf")
            if got < score:
                best, score = pieces, got
    return score, best


def _edges(pieces: int, n: int) -> float:
    """What a rank's work is multiplied by for ``pieces`` chunks of its ``n`` rows: their
    edges, at most the chunks themselves."""
    return 1 + min(EDGE_ROWS * pieces / n, 1.0)


def work(chunks: list[list[tuple[int, int]]], n: int, mask: SliceMask) -> float:
    """The largest rank's work: its visible area times its chunks' edges (``_edges``)."""
    return max(sum(rows_area(mask.cells, s, s + z) for s, z in mine) * _edges(len(mine), n)
               for mine in chunks)


def _deal(world: int, n: int, k: int, mask: SliceMask):
    """k chunks per rank of a sequence of ``world * n`` tokens, dealt largest area first
    onto the least loaded rank with room for a chunk of its length. The first
    ``world * (n % k)`` chunks are one token longer; each rank takes n % k of them."""
    base, extra = divmod(n, k)
    sizes = np.full(world * k, base, dtype=np.int64)
    sizes[:world * extra] += 1
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    areas = [rows_area(mask.cells, int(s), int(s + z)) for s, z in zip(starts, sizes)]
    room = [[extra, k - extra] for _ in range(world)]  # longer, shorter chunks left
    load = [0] * world
    chunks: list[list[tuple[int, int]]] = [[] for _ in range(world)]
    for c in sorted(range(len(sizes)), key=lambda c: (-areas[c], c)):
        kind = 0 if sizes[c] > base else 1
        r = min((r for r in range(world) if room[r][kind]), key=lambda r: (load[r], r))
        room[r][kind] -= 1
        load[r] += areas[c]
        chunks[r].append((int(starts[c]), int(sizes[c])))
    return max(load), [sorted(c) for c in chunks]


def _deal_pieces(world: int, n: int, k: int, mask: SliceMask):
    """Each rank's chunks as ``_deal`` makes them with k chunks per rank, but heavy chunks
    halved until each holds at most a chunk's share of the area or ``MIN_CHUNK`` rows; a
    piece no rank has room for is cut to the room of the least loaded rank with some. None
    where no chunk is heavy (``_deal`` gives that dealing)."""
    share = mask.area / (world * k)
    base, extra = divmod(n, k)
    pieces, heavy, start = [], False, 0
    for c in range(world * k):
        size = base + (c < world * extra)
        todo = [(start, size)]
        while todo:
            s, z = todo.pop()
            a = rows_area(mask.cells, s, s + z)
            if a > share and z >= 2 * MIN_CHUNK:
                heavy, half = True, z // 2
                todo += [(s + half, z - half), (s, half)]
            else:
                pieces.append((-a, s, z))
        start += size
    if not heavy:
        return None
    heapq.heapify(pieces)
    room, load = [n] * world, [0] * world
    chunks: list[list[tuple[int, int]]] = [[] for _ in range(world)]
    while pieces:
        a, s, z = heapq.heappop(pieces)
        fits = [r for r in range(world) if room[r] >= z]
        r = min(fits or [r for r in range(world) if room[r]], key=lambda r: (load[r], r))
        if room[r] < z:  # nowhere to put it whole: fill r's room, the rest goes back
            cut = room[r]
            heapq.heappush(pieces, (-rows_area(mask.cells, s + cut, s + z), s + cut, z - cut))
            z, a = cut, -rows_area(mask.cells, s, s + cut)
        room[r] -= z
        load[r] -= a
        chunks[r].append((s, z))
    return [sorted(c) for c in chunks]


def _shard(total: int, chunks: list[tuple[int, int]]) -> Shard:
    """A rank's chunks as segments of the sequence in position order, touching ones
    joined."""
    runs: list[list[int]] = []
    for start, length in chunks:
        if runs and runs[-1][0] + runs[-1][1] == start:
            runs[-1][1] += length
        else:
            runs.append([start, length])
    segs, row = [], 0
    for start, length in runs:
        segs.append(Segment(row, 0, start, length, total))
        row += length
    return Shard.of(segs)
