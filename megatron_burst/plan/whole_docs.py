"""The ``whole_docs`` layout, planned with array operations over the document lengths.

What it promises is ``placement``'s (every rank exactly N/G tokens; short documents whole on
one rank, fewer than G cut; ranks balanced by attention work; rows other ranks need first).
How, so that a pack of thousands of tiny documents costs a few array operations and a
Python loop over a number of documents bounded by the ring size, not by the pack:

1. *Split* documents (longer than a rank's share of tokens, or with more work, the squared
   length, than a rank's share of work) go zigzag over every rank. There are fewer than 2G.
2. The *head*: documents longer than 1/BIG of a rank's tokens (at most BIG*G of them), one
   by one, longest first, onto the least loaded rank with room (``_greedy``). They set the
   balance.
3. The *bulk*: dealt to the ranks in proportion to their room left, so every rank gets its
   share of every length and so of work per token (``_deal``); a rank keeps the longest of
   what it is dealt that fits its room, and hands the rest back. A bulk of fewer than FEW
   documents (a pack of a few dozen) goes one by one instead: cheaper than array work.
4. The *tail*: what was handed back, and the RESERVE*G shortest documents, one by one as the
   head (``_greedy``). The shortest come last, so they fill the ranks' room exactly, as
   the one-by-one placement of a whole pack would; a document that fits no rank's room
   is cut into contiguous pieces over the roomiest ranks, each cut filling a rank, so
   fewer than G documents are cut.

Rows: zigzag chunks, then pieces (those another rank needs first), then whole documents in
document order. Whole documents are returned as arrays (``segments.Shard``).
"""
from __future__ import annotations

import itertools

import numpy as np

from .segments import Segment, Shard, frozen

BIG = 16  # documents longer than cap/BIG are placed one by one (at most BIG * G of them)
RESERVE = 4  # the RESERVE * G shortest are kept to fill the ranks' room exactly
FEW = 16  # a bulk of fewer documents is not dealt: they go one by one

Run = tuple[int, int, int]  # (doc, pos, length)


def place(world: int, lens: np.ndarray, cap: int) -> tuple[Shard, ...]:
    """Every rank's shard of documents ``lens`` (int64), ``cap`` tokens each."""
    squares = lens * lens  # < 2**62: lengths fit int32
    # n*n > sum/G exactly, in integers: n*n is an integer, so it exceeds sum/G iff it
    # exceeds floor(sum/G). Either test fails for an empty document.
    split = (lens > cap) | (squares > int(squares.sum()) // world)
    held, work, runs = [0] * world, [0] * world, [[] for _ in range(world)]
    for d in np.flatnonzero(split).tolist():
        n = int(lens[d])
        for r, (first, second) in enumerate(_zigzag_chunks(n, world, held)):
            runs[r] += [(d, *first), (d, *second)]
            held[r] += first[1] + second[1]
            work[r] += n * n // world
    rest = np.flatnonzero(lens * ~split)  # the documents left, not empty
    rest = rest[_longest_first(lens[rest])]
    ones = int(np.count_nonzero(lens[rest] * BIG > cap))
    last = len(rest) - RESERVE * world  # the bulk is rest[ones:last]
    if last - ones < FEW:  # too few to be worth dealing: all one by one
        ones = last = len(rest)
    room = [cap - h for h in held]
    pieces: list[list[Run]] = [[] for _ in range(world)]
    rank_of = np.full(len(lens), -1, dtype=np.int16)  # the rank holding a document whole
    _greedy(rest[:ones], lens, room, work, pieces, rank_of)
    tail = rest[last:]
    if last > ones:
        back = _deal(rest[ones:last], lens, room, work, rank_of)
        tail = np.concatenate((back[_longest_first(lens[back])], tail))
    _greedy(tail, lens, room, work, pieces, rank_of)
    return _shards(cap, lens, runs, pieces, rank_of)


def _longest_first(n: np.ndarray) -> np.ndarray:
    """The order of lengths ``n`` longest first, ties by index: a stable sort, and a radix
    sort (linear) where the lengths fit 16 bits, as a pack of many documents' do."""
    top = int(n.max(initial=0))
    key = top - n  # >= 0, at most the longest length
    return np.argsort(key.astype(np.uint16) if top < 1 << 16 else key, kind="stable")


def _greedy(docs: np.ndarray, lens: np.ndarray, room: list[int], work: list[int],
            pieces: list[list[Run]], rank_of: np.ndarray) -> None:
    """``docs``, longest first, each onto the least loaded rank with room; one that fits
    nowhere is cut into contiguous pieces at once, roomiest ranks first, each filled but the
    last (so each cut empties a rank, and fewer than G are cut in all). ``room``, ``work``,
    ``pieces`` and ``rank_of`` (the rank of a document held whole) are updated."""
    ranks = range(len(room))
    for d, n in zip(docs.tolist(), lens[docs].tolist()):
        best = -1
        for r in ranks:  # the first of the least loaded with room (a plain loop: fastest)
            if room[r] >= n and (best < 0 or work[r] < work[best]):
                best = r
        if best >= 0:
            rank_of[d] = best
            room[best] -= n
            work[best] += n * n
            continue
        pos = 0
        for r in sorted(ranks, key=lambda r: (-room[r], r)):
            take = min(room[r], n - pos)
            if take > 0:
                pieces[r].append((d, pos, take))
                room[r] -= take
                work[r] += take * (pos + take)
                pos += take


def _deal(bulk: np.ndarray, lens: np.ndarray, room: list[int], work: list[int],
          rank_of: np.ndarray) -> np.ndarray:
    """The bulk (longest first) dealt to ranks in proportion to their room: document i goes
    to the rank whose share of [0, 1) holds frac(i / golden ratio), in integers (the same
    on every rank), so any run of neighbours, of like lengths, is shared out evenly, and a
    rank's count is off its share by O(log n) documents. A rank keeps the longest of its
    documents that fit its room (``room``, ``work``, ``rank_of`` updated) and hands the
    others back: returned, to be placed one by one."""
    world = len(room)
    spot = (np.arange(len(bulk), dtype=np.int64) * _PHI + _PHI // 2) % _ONE
    shares = np.cumsum(room, dtype=np.int64) * _ONE // max(sum(room), 1)
    rank = np.minimum(np.searchsorted(shares, spot, side="right"), world - 1)
    by = np.argsort(rank.astype(np.int16), kind="stable")  # by rank, longest first in each
    bulk, rank = bulk[by], rank[by]
    n = lens[bulk]
    count = np.bincount(rank, minlength=world)
    upto = np.cumsum(n)
    before = np.concatenate(([0], upto))[np.cumsum(count) - count]  # each rank's first
    keep = upto - np.repeat(before, count) <= np.asarray(room)[rank]  # its longest that fit
    rank_of[bulk[keep]] = rank[keep]
    tokens = np.bincount(rank[keep], weights=n[keep], minlength=world)
    squares = np.bincount(rank[keep], weights=(n * n)[keep], minlength=world)
    for r in range(world):
        room[r] -= int(tokens[r])
        work[r] += int(squares[r])
    return bulk[~keep]


_ONE = 1 << 31  # [0, 1) in integers; i * _PHI stays below 2**63 for i < 2**31
_PHI = 1327217884  # round(_ONE / golden ratio): Weyl's sequence, evenly spread


def _shards(cap: int, lens: np.ndarray, runs: list[list[Run]], pieces: list[list[Run]],
            rank_of: np.ndarray) -> tuple[Shard, ...]:
    """Each rank's shard: zigzag chunks, pieces others need (a later piece exists) first,
    then the rest of the pieces, then whole documents (``rank_of`` >= 0) in document
    order."""
    world = len(runs)
    by = np.argsort(rank_of, kind="stable")  # int16: a radix sort; by rank, then document
    count = np.bincount(rank_of[by] + 1, minlength=world + 1)  # count[0]: not whole
    docs = frozen(by[count[0]:])
    n = frozen(lens[docs])
    edges = [0, *itertools.accumulate(count[1:].tolist())]
    splits = [_segments(runs[r] + sorted(pieces[r], key=lambda p: (
        p[1] + p[2] == int(lens[p[0]]), p[0], p[1])), lens) for r in range(world)]
    head = [sum(s.length for s in split) for split in splits]  # rows before whole ones
    before = np.cumsum(n) - n  # whole documents' tokens before each, over all ranks
    base = np.array(head) - np.append(before, 0)[edges[:-1]]
    rows = frozen(before + np.repeat(base, count[1:]))
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
