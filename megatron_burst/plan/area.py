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
A rank's chunks are its rows in sequence order (touching ones joined), so its shard is a
few segments of one document, the sequence (``segments.Shard``), and the schedule pairs
them as it pairs any segments. With one chunk a rank every deal leaves the same loads, and
on 4+ ranks the chunks keep the sequence's order, rank by rank: a window's neighbours in
the sequence are then neighbours in the ring (on 2 or 3 ranks every rank is; their deals
are as they were).

Everything is a pure function of (world, length, mask): every rank computes every rank's
shard, without communication.
"""
from __future__ import annotations

import numpy as np

from .segments import Segment, Shard
from .slices import SliceMask, ranges_area

MAX_CHUNKS = 64  # chunks per rank, at most
MIN_CHUNK = 64  # tokens a chunk keeps (a shard of few tokens may cut up to 4 chunks)
EDGE_ROWS = 256  # a chunk's edges cost about this many rows of work: two partial 128-row tiles


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
    """(largest share, each rank's chunks as (start, length)) of the k of least work: the
    largest share, each of its k chunks' edges adding ``EDGE_ROWS`` rows' worth of keys."""
    if total % world:
        raise ValueError(f"layout 'area' gives every rank the same number of tokens: the "
                         f"sequence's {total} tokens must be divisible by {world} ranks")
    n, best, score = total // world, None, float("inf")
    even = mask.area / world
    for k in _candidates(n):
        edges = 1 + min(EDGE_ROWS * k / n, 1.0)  # a chunk's edges cost at most the chunk
        if even * edges >= score:  # no finer k can do less work
            break
        got = _deal(world, n, k, mask)
        if got[0] * edges < score:
            best, score = got, got[0] * edges
    return best


def _deal(world: int, n: int, k: int, mask: SliceMask):
    """k chunks per rank of a sequence of ``world * n`` tokens, dealt largest area first
    onto the least loaded rank with room for a chunk of its length. The first
    ``world * (n % k)`` chunks are one token longer; each rank takes n % k of them."""
    base, extra = divmod(n, k)
    sizes = np.full(world * k, base, dtype=np.int64)
    sizes[:world * extra] += 1
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    areas = ranges_area(mask.cells, starts, starts + sizes).tolist()
    room = [[extra, k - extra] for _ in range(world)]  # longer, shorter chunks left
    load = [0] * world
    chunks: list[list[tuple[int, int]]] = [[] for _ in range(world)]
    if k == 1 and world >= 4:  # any deal of one chunk a rank leaves the same loads: keep
        # the sequence's order, so neighbours in the sequence are neighbours in the ring
        # (a window then reads one rank each way: ``attention.ring_rounds``)
        return max(areas), [[(int(starts[r]), int(sizes[r]))] for r in range(world)]
    for c in sorted(range(len(sizes)), key=lambda c: (-areas[c], c)):
        kind = 0 if sizes[c] > base else 1
        r = min((r for r in range(world) if room[r][kind]), key=lambda r: (load[r], r))
        room[r][kind] -= 1
        load[r] += areas[c]
        chunks[r].append((int(starts[c]), int(sizes[c])))
    return max(load), [sorted(c) for c in chunks]


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
