"""The ``whole_docs`` layout, planned with array operations over the document lengths.

What it promises is ``placement``'s (every rank exactly N/G tokens; short documents whole on
one rank, fewer than G cut; ranks balanced by attention work; rows other ranks need first).
How, so that a pack of thousands of tiny documents costs a few array operations:

1. *Split* documents (longer than a rank's share of tokens, or with more work, the squared
   length, than a rank's share of work) go zigzag over every rank. There are fewer than 2G.
2. *Big* documents (longer than 1/BIG of a rank's tokens, so at most BIG*G of them) go
   longest first onto the least loaded rank with room: they set the balance, and the loop's
   length is bounded by the ring size, not by the pack.
3. The *rest* (all the short documents) form one stream, longest first, cut into one slice
   per rank, each exactly the room that rank has left; the ranks needing the most work per
   token of room take the first (longest) slices. A document across a cut is cut into
   contiguous pieces: at most G-1 documents are cut. Big documents that found no room lead
   the stream.

Rows: zigzag chunks, then pieces (those another rank needs first), then whole documents in
document order. Whole documents are returned as arrays (``segments.Shard``).
"""
from __future__ import annotations

import numpy as np

from .segments import Segment, Shard, frozen

BIG = 16  # documents longer than cap/BIG are placed one by one (at most BIG * G of them)

Run = tuple[int, int, int]  # (doc, pos, length)


def place(world: int, lens: np.ndarray, cap: int) -> tuple[Shard, ...]:
    """Every rank's shard of documents ``lens`` (int64), ``cap`` tokens each."""
    squares = lens * lens  # < 2**62: lengths fit int32
    # n*n > sum/G exactly, in integers: n*n is an integer, so it exceeds sum/G iff it
    # exceeds floor(sum/G).
    split = (lens > 0) & ((lens > cap) | (squares > int(squares.sum()) // world))
    held, work, runs = [0] * world, [0] * world, [[] for _ in range(world)]
    for d in np.flatnonzero(split).tolist():
        n = int(lens[d])
        for r, (first, second) in enumerate(_zigzag_chunks(n, world, held)):
            runs[r] += [(d, *first), (d, *second)]
            held[r] += first[1] + second[1]
            work[r] += n * n // world
    rest = np.flatnonzero((lens > 0) & ~split)
    rest = rest[_longest_first(lens[rest])]
    big = rest[lens[rest] * BIG > cap].tolist()
    room = [cap - h for h in held]
    pieces: list[list[Run]] = [[] for _ in range(world)]
    owner = _greedy(big, lens, room, work, pieces)
    stream = _deal(rest[lens[rest] * BIG <= cap], lens, room)
    more, whole_rank, whole_doc = _cut(stream, lens, room)
    pieces = [p + m for p, m in zip(pieces, more)]
    whole_rank = np.concatenate([np.asarray(list(owner.values()), dtype=np.int64), whole_rank])
    whole_doc = np.concatenate([np.asarray(list(owner), dtype=np.int64), whole_doc])
    return _shards(cap, lens, runs, pieces, whole_rank, whole_doc)


def _longest_first(n: np.ndarray) -> np.ndarray:
    """The order of lengths ``n`` longest first, ties by index: a stable sort, and a radix
    sort (linear) where the lengths fit 16 bits, as a pack of many documents' do."""
    key = n.max(initial=0) - n
    small = len(n) and int(key.max()) < 1 << 16
    return np.argsort(key.astype(np.uint16) if small else key, kind="stable")


def _greedy(big: list[int], lens: np.ndarray, room: list[int], work: list[int],
            pieces: list[list[Run]]) -> dict[int, int]:
    """Big documents, longest first, onto the least loaded rank with room; one that fits
    nowhere is cut into contiguous pieces at once, roomiest ranks first, each filled but the
    last (so each cut empties a rank, and fewer than G are cut in all). ``room``, ``work``
    and ``pieces`` are updated. Returns {document held whole: its rank}."""
    owner = {}
    for d in big:
        n = int(lens[d])
        fits = [r for r in range(len(room)) if room[r] >= n]
        if fits:
            r = min(fits, key=lambda r: (work[r], r))
            owner[d] = r
            room[r] -= n
            work[r] += n * n
            continue
        pos = 0
        for r in sorted(range(len(room)), key=lambda r: (-room[r], r)):
            take = min(room[r], n - pos)
            if take > 0:
                pieces[r].append((d, pos, take))
                room[r] -= take
                work[r] += take * (pos + take)
                pos += take
    return owner


def _deal(small: np.ndarray, lens: np.ndarray, room: list[int]) -> np.ndarray:
    """The short documents (longest first) dealt to ranks in proportion to their room, so
    that every rank gets its share of every length, and so of work per token. Document i
    goes to the rank whose share of [0, 1) holds frac(i / golden ratio), in integers (the
    same on every rank): any run of neighbours, of like lengths, is shared out evenly. A
    rank's count is off its share by O(log n) documents; ``_cut`` makes it exact. Returns
    them rank by rank, a rank's shortest at both ends (where a cut takes from or adds to)."""
    world, total = len(room), int(lens[small].sum())
    if not total:
        return small
    spot = (np.arange(len(small), dtype=np.int64) * _PHI + _PHI // 2) % _ONE
    shares = np.cumsum(room, dtype=np.int64) * _ONE // total
    rank = np.minimum(np.searchsorted(shares, spot, side="right"), world - 1)
    count = np.bincount(rank, minlength=world)
    start = np.cumsum(count) - count
    k = np.empty_like(rank)  # place among the rank's documents, longest first
    k[np.argsort(rank.astype(np.int16), kind="stable")] = (
        np.arange(len(small)) - np.repeat(start, count))
    c = count[rank]
    back = c - 1 - k  # from the shortest: alternately to the front and to the back
    out = np.empty_like(small)
    out[start[rank] + np.where(back % 2 == 0, back // 2, c - 1 - back // 2)] = small
    return out


_ONE = 1 << 31  # [0, 1) in integers; i * _PHI stays below 2**63 for i < 2**31
_PHI = 1327217884  # round(_ONE / golden ratio): Weyl's sequence, evenly spread


def _cut(stream: np.ndarray, lens: np.ndarray, room: list[int]
         ) -> tuple[list[list[Run]], np.ndarray, np.ndarray]:
    """The stream of documents cut into consecutive slices of ``room[r]`` tokens, rank after
    rank. Returns (each rank's pieces, (rank, document) of each document kept whole)."""
    n = lens[stream]
    ends = np.cumsum(n)
    starts = ends - n
    bounds = np.concatenate(([0], np.cumsum(room)))
    assert int(bounds[-1]) == (int(ends[-1]) if len(ends) else 0), "room != tokens left"
    # A slice of no room repeats a bound: 'right' skips to the slice that holds the token.
    first = np.searchsorted(bounds, starts, side="right") - 1
    last = np.searchsorted(bounds, ends - 1, side="right") - 1
    whole = first == last
    pieces: list[list[Run]] = [[] for _ in room]
    for i in np.flatnonzero(~whole).tolist():  # fewer than G documents
        for slot in range(int(first[i]), int(last[i]) + 1):
            a, b = max(starts[i], bounds[slot]), min(ends[i], bounds[slot + 1])
            if b > a:
                pieces[slot].append((int(stream[i]), int(a - starts[i]), int(b - a)))
    return pieces, first[whole], stream[whole]


def _shards(cap: int, lens: np.ndarray, runs: list[list[Run]], pieces: list[list[Run]],
            whole_rank: np.ndarray, whole_doc: np.ndarray) -> tuple[Shard, ...]:
    """Each rank's shard: zigzag chunks, pieces others need (a later piece exists) first,
    then the rest of the pieces, then whole documents in document order."""
    world = len(runs)
    rank_of = np.full(len(lens), -1, dtype=np.int16)  # ranks fit 16 bits: a radix sort
    rank_of[whole_doc] = whole_rank
    by = np.argsort(rank_of, kind="stable")  # by rank, then by document
    edges = np.searchsorted(rank_of[by], np.arange(world + 1))
    docs = frozen(by[edges[0]:])
    n = frozen(lens[docs])
    splits = [_segments(runs[r] + sorted(pieces[r], key=lambda p: (
        p[1] + p[2] == int(lens[p[0]]), p[0], p[1])), lens) for r in range(world)]
    head = np.array([sum(s.length for s in split) for split in splits], dtype=np.int64)
    edges = edges - edges[0]
    before = np.cumsum(n) - n  # tokens of whole documents before each, over all ranks
    rank = np.repeat(np.arange(world), np.diff(edges))
    rows = frozen(head[rank] + before - before[edges[rank]] if len(n) else n)
    return tuple(Shard(splits[r], docs[edges[r]:edges[r + 1]], rows[edges[r]:edges[r + 1]],
                       n[edges[r]:edges[r + 1]], cap) for r in range(world))


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


def _segments(runs: list[Run], lens: np.ndarray) -> tuple[Segment, ...]:
    """Segments in local row order from (doc, pos, length) runs; empty runs dropped."""
    segs, row = [], 0
    for doc, pos, length in runs:
        if length:
            segs.append(Segment(row, doc, pos, length, int(lens[doc])))
            row += length
    return tuple(segs)
