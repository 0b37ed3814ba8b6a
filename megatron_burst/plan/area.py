"""The ``area`` layout: where a slice mask's tokens go so every rank does the same work.

A slice mask's work is its visible area, and where it lies depends on the mask: a prefix-LM
mask puts most of it in the last rows, a shared-question mask in the question's keys. The
``area`` layout (the default for a mask) cuts the sequence into chunks, k per rank, and
deals them out so that the largest rank's share of the area is as small as a greedy can make
it (MagiAttention's dispatch: largest chunk first, onto the least loaded rank), while every
rank keeps exactly N/G tokens (Megatron's [s/cp, b, h] shapes). k is tried at 1, 2, 4, ...
up to ``MAX_CHUNKS`` (chunks no shorter than ``MIN_CHUNK`` unless the shard is tiny), each
k two ways: even chunks (differing in length by at most one token, each rank taking the
same number of the longer ones), and the same with every cut moved to the nearest point
between slices within half a chunk, where one is (a cut there splits no block, so the
ranks' blocks keep the rows a dense kernel's core needs). The deal of least work wins,
counting a chunk's edges too: finer chunks cut the blocks smaller, and a kernel wastes
about a partial tile at each block edge, so each chunk counts ``EDGE_ROWS`` rows of its
keys on top of the area (at most its own rows: a short chunk still runs whole tiles), for
the share of the cuts that cut a slice's rows. On 2x H200 the finest balance cost more
than it gained: a causal sliding window (w 1024, 8K tokens per GPU) dealt in 512-token
chunks balanced to 1.016 ran its forward at 50 TFLOP/s per GPU, one contiguous chunk per
rank (1.032, one band call) at 154 (``benchmarks/results/h200x2_issue42_area_edges/``).
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

import functools
import heapq

import numpy as np

from .segments import Segment, Shard
from .slices import SliceMask, ranges_area

MAX_CHUNKS = 64  # chunks per rank, at most
MIN_CHUNK = 64  # tokens a chunk keeps (a shard of few tokens may cut up to 4 chunks)
EDGE_ROWS = 256  # a chunk's edges cost about this many rows of work: two partial 128-row tiles
SNAP = 0.5  # a cut moves to a point between slices up to this many chunks away
# Whether cuts may move between slices, only the cuts that cut a slice costing edges; False
# is the layout before (even chunks, every cut an edge): an A/B's switch, and the plans of
# the analyses on file made before it (``in_layer.py --no-cuts-between-slices``).
BETWEEN_SLICES = True


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
    """(largest share, each rank's chunks as (start, length)) of the deal of least work
    (``_work``) among each k's (``_options``), dealt in order of their least possible work
    until none can beat the best."""
    if total % world:
        raise ValueError(f"layout 'area' gives every rank the same number of tokens: the "
                         f"sequence's {total} tokens must be divisible by {world} ranks")
    n, best, score = total // world, None, float("inf")
    free = _free(mask, total)
    options = sorted({o for k in _candidates(n) for o in _options(world, n, k, mask, free)})
    for bound, k, sizes in options:
        if bound >= score:
            break
        got = _deal(world, n, k, sizes, mask)
        work = _work(n, got, mask)
        if work < score:
            best, score = got, work
    return best


def _work(n: int, got, mask: SliceMask) -> float:
    """A deal's work: its largest share, each of a rank's chunks' edges (k, on average)
    adding ``EDGE_ROWS`` rows' worth of keys (at most the chunk's own), counted for the
    share of its cuts that cut a slice's rows (a cut between slices cuts no block)."""
    cuts = cut_points(got[1])
    k = (len(cuts) + 1) / len(got[1])
    cutting = _cutting(mask, cuts).mean() if len(cuts) and BETWEEN_SLICES else 1.0
    return got[0] * _edges(n, k, cutting)


def cut_points(chunks: list[list[tuple[int, int]]]) -> np.ndarray:
    """Where a deal's chunks (every rank's, as (start, length)) cut the sequence, sorted."""
    return np.sort(np.array([s for c in chunks for s, _ in c], np.int64))[1:]


def _edges(n: int, k: float, cutting: float) -> float:
    return 1 + min(EDGE_ROWS * k * cutting / n, 1.0)


def _options(world: int, n: int, k: int, mask: SliceMask, free: np.ndarray) -> list[tuple]:
    """k chunks per rank of a sequence of ``world * n`` tokens, each option as (least
    possible work, k, chunk lengths): even chunks (k, ()), and where it differs the same
    with every cut moved to the nearest point between slices (``free``) within half a chunk
    (``SNAP``), as (0, their lengths), so a cut leaves blocks whole: on 2x H200 block-causal
    documents' ring ran 0.85 / 0.87 of one GPU where its even chunks ran 0.68 / 0.72
    (``benchmarks/results/h200x2_issue42_snapped_cuts/``). With one chunk a rank on 4+
    ranks only the even deal, which keeps the sequence's order. The least possible work:
    an even share, at the edges of the cuts that cut slices (a deal's own cuts, and at most
    ``world`` more where a chunk is cut to fit)."""
    total, even = world * n, mask.area / world
    cuts = np.arange(1, world * k) * total // (world * k)
    cutting = _cutting(mask, cuts).mean() if len(cuts) and BETWEEN_SLICES else 1.0
    options = [(even * _edges(n, k, cutting), k, ())]
    if not BETWEEN_SLICES or not len(free) or (k == 1 and world >= 4):
        return options
    i = np.searchsorted(free, cuts)
    below, above = free[np.maximum(i - 1, 0)], free[np.minimum(i, len(free) - 1)]
    near = np.where(np.abs(cuts - below) <= np.abs(above - cuts), below, above)
    moved = np.unique(np.where(np.abs(near - cuts) <= SNAP * total / (world * k), near, cuts))
    if np.array_equal(moved, cuts):
        return options
    least = _cutting(mask, moved).sum() / (len(moved) + world)
    sizes = np.diff(np.concatenate(([0], moved, [total])))
    # (the same chunks from a finer k are one option: its k is the chunks a rank holds)
    return options + [(even * _edges(n, len(sizes) / world, least), 0, tuple(sizes.tolist()))]


def _deal(world: int, n: int, k: int, sizes: tuple, mask: SliceMask):
    """The option's deal: ``_deal_even``'s k even chunks, or ``_deal_any``'s ``sizes``."""
    if sizes:
        return _deal_any(world, n, np.array(sizes), mask)
    return _deal_even(world, n, k, mask)


def _free(mask: SliceMask, total: int) -> np.ndarray:
    """The points strictly inside the sequence where a cut cuts no slice's rows."""
    edges = np.unique(_row_edges(mask))
    edges = edges[(edges > 0) & (edges < total)]
    return edges[~_cutting(mask, edges)]


def _cutting(mask: SliceMask, cuts: np.ndarray) -> np.ndarray:
    """Whether each cut falls strictly inside some slice's rows."""
    starts, stops = _row_edges(mask)
    return np.searchsorted(starts, cuts, "left") > np.searchsorted(stops, cuts, "right")


@functools.lru_cache(maxsize=16)  # keyed by the mask's value: a deal asks many times
def _row_edges(mask: SliceMask) -> np.ndarray:
    """The slices' first rows and their ends past the last, each sorted."""
    q = np.asarray(mask.q_ranges, dtype=np.int64).reshape(-1, 2)
    return np.stack([np.sort(q[:, 0]), np.sort(q[:, 1])])


def _deal_any(world: int, n: int, sizes: np.ndarray, mask: SliceMask):
    """Chunks of any lengths dealt as ``_deal_even`` deals even ones, each rank taking
    exactly n tokens: a chunk no rank has room for is cut, the rank with the most room
    taking its head, its tail going back among the chunks (the greedy prices a cut chunk's
    parts by their rows; the loads it returns are counted exactly, in one pass)."""
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    areas = ranges_area(mask.cells, starts, starts + sizes).tolist()
    todo = [(-a, int(s), int(z)) for a, s, z in zip(areas, starts, sizes)]
    heapq.heapify(todo)
    room, load = [n] * world, [0.0] * world
    chunks: list[list[tuple[int, int]]] = [[] for _ in range(world)]
    while todo:
        neg, start, length = heapq.heappop(todo)
        area = -neg
        fits = [r for r in range(world) if room[r] >= length]
        if fits:
            r = min(fits, key=lambda r: (load[r], r))
        else:  # the head fills the roomiest rank; the tail waits for another
            r = max(range(world), key=lambda r: (room[r], -r))
            head = room[r]
            tail = area * (length - head) / length
            heapq.heappush(todo, (-tail, start + head, length - head))
            area, length = area - tail, head
        room[r] -= length
        load[r] += area
        chunks[r].append((start, length))
    chunks = [sorted(c) for c in chunks]
    return max(_loads(chunks, mask)), chunks


def _loads(chunks: list[list[tuple[int, int]]], mask: SliceMask) -> list[int]:
    """Each rank's visible area under ``chunks``."""
    starts = np.array([s for c in chunks for s, _ in c], dtype=np.int64)
    stops = starts + np.array([z for c in chunks for _, z in c], dtype=np.int64)
    areas = ranges_area(mask.cells, starts, stops)
    cut = np.cumsum([0] + [len(c) for c in chunks])
    return [int(areas[a:b].sum()) for a, b in zip(cut, cut[1:])]


def _deal_even(world: int, n: int, k: int, mask: SliceMask):
    """k even chunks per rank, dealt largest area first onto the least loaded rank with
    room for a chunk of its length. The first ``world * (n % k)`` chunks are one token
    longer; each rank takes n % k of them."""
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
