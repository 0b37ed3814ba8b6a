"""The blocks a slice mask's cells make between two lists of segments (``slice_blocks``).

Apart from ``slices`` (the mask, its cells and the one band's arithmetic, ``band_block``):
this is the one hot loop of planning a slice mask, and it has two forms. A plan of 8 ranks
cuts each of 64 pairs of members' ~60 area chunks against every cell: some 250K (query
segment, key segment, cell) triples for a window, 16K of them holding a visible pair, and a
Python test of each took 1-2 s a plan. So the triples are found, cut and trimmed in numpy
passes (``_met``, ``trimmed_bands``: ``band_block``'s arithmetic on arrays), and Python
makes only the blocks that exist. Where there are few triples (a 2-rank plan) those passes'
fixed cost is more than testing each, and they are tested one at a time. Both forms give
the same blocks in the same order (``tests/test_slice_blocks.py``). ``slice_rows`` gives
the rows a pair reads without its blocks: what the ring's reach and runs read of the 56
pairs of an 8-rank plan that a rank does not compute.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from .blocks import INF, Block
from .slices import SliceMask, at_most_square, band_block


def slice_blocks(q_segs, k_segs, mask: SliceMask) -> list[Block]:
    """The blocks of query segments ``q_segs`` against key segments ``k_segs`` (runs of
    sequence positions, ``segments.Segment`` of one document, the sequence) under ``mask``:
    each cell's band cut to each pair of segments, trimmed. Disjoint, as the cells are;
    in the order (query segment, key segment, cell). Through the numpy passes, or one
    triple at a time where there are few (module docstring)."""
    cells = mask.cells
    if not (len(q_segs) and len(k_segs) and len(cells)):
        return []
    if len(q_segs) * len(k_segs) * len(cells) <= _FEW_TRIPLES:
        return _one_at_a_time(q_segs, k_segs, mask.cell_rows)
    found: list[Block] = []
    for bands in _passes(q_segs, k_segs, cells):
        for q0, q1, k0, k1, code, lo, hi in bands.tolist():
            blk = Block(q0, q1, k0, k1, _KIND_OF[code], lo, hi)
            # (``at_most_square``'s own test, inline: most blocks need no cut)
            found += at_most_square(blk) if code == 2 and q1 - q0 > k1 - k0 else [blk]
    return found


def _passes(q_segs, k_segs, cells: np.ndarray) -> Iterator[np.ndarray]:
    """The trimmed bands (``_trimmed``) of every triple, in order, a numpy pass for each run
    of query segments that keeps a pass within ``_TRIPLES_AT_ONCE`` triples."""
    q, k = _spans(q_segs), _spans(k_segs)
    step = max(1, _TRIPLES_AT_ONCE // (len(k) * len(cells)))
    for s in range(0, len(q), step):
        yield _trimmed(*_met(q[s:s + step], k, cells))


_TRIPLES_AT_ONCE = 1 << 22  # query segments x key segments x cells in one numpy pass
# Up to this many triples the numpy passes' fixed cost (some 50 array calls) is more than
# a Python test of each: through them alone, 2-rank plans of a few segments a side (a new
# mask every micro-batch) took 0.2-0.7 ms longer on this repo's CPU machine.
_FEW_TRIPLES = 256
_KIND_OF = ("full", "causal", "band")  # ``trimmed_bands``' kind codes
# From this many triples a pair's rows alone (``slice_rows``) cost less than its blocks: on
# this repo's CPU machine 390-570 us a pair against 870-920 at 16K-131K triples, and within
# 15% either way from 1 to 4K (8-rank plans of every family; NOTES, twenty-second session).
_ROWS_ALONE_FROM = 8192


def _one_at_a_time(q_segs, k_segs, cells: tuple[tuple[int, ...], ...]) -> list[Block]:
    """``slice_blocks`` for few triples: each (query segment, key segment, cell) in that
    order, cut and trimmed by ``band_block`` (the same blocks as the numpy passes)."""
    found: list[Block] = []
    for a in q_segs:
        qa, qb = a.pos, a.pos + a.valid
        for b in k_segs:
            ka, kb = b.pos, b.pos + b.valid
            for q0, q1, k0, k1, dlo, dhi in cells:
                if q0 < qb and q1 > qa and k0 < kb and k1 > ka:
                    q0, q1, k0, k1 = max(q0, qa), min(q1, qb), max(k0, ka), min(k1, kb)
                    off = q0 - k0  # local j - i = D + (q0 - k0)
                    blk = band_block(a.row + q0 - qa, q1 - q0, b.row + k0 - ka, k1 - k0,
                                     max(dlo, -INF) + off, min(dhi, INF) + off)
                    if blk is not None:
                        found += at_most_square(blk)
    return found


def _spans(segs) -> np.ndarray:
    """[n, 3] int64: each segment's first position, its end of valid rows, its first row."""
    return np.array([(s.pos, s.pos + s.valid, s.row) for s in segs], dtype=np.int64)


def _met(q: np.ndarray, k: np.ndarray, cells: np.ndarray) -> tuple[np.ndarray, ...]:
    """``band_block``'s arguments (q_row, nq, k_row, nk, lo, hi), as arrays, for every
    (query span, key span, cell) that meet, in that order: the cell cut to both spans, its
    D interval counted from the cut's corner."""
    (qa, qb, qrow), (ka, kb, krow) = q.T, k.T
    on_q = (cells[None, :, 0] < qb[:, None]) & (cells[None, :, 1] > qa[:, None])
    on_k = (cells[None, :, 2] < kb[:, None]) & (cells[None, :, 3] > ka[:, None])
    a, b, c = np.nonzero(on_q[:, None, :] & on_k[None, :, :])
    cell = cells[c]
    q0, q1 = np.maximum(cell[:, 0], qa[a]), np.minimum(cell[:, 1], qb[a])
    k0, k1 = np.maximum(cell[:, 2], ka[b]), np.minimum(cell[:, 3], kb[b])
    off = q0 - k0  # local j - i = D + (q0 - k0)
    return (qrow[a] + q0 - qa[a], q1 - q0, krow[b] + k0 - ka[b], k1 - k0,
            np.maximum(cell[:, 4], -INF) + off, np.minimum(cell[:, 5], INF) + off)


def slice_rows(q_segs, k_segs, mask: SliceMask, side: str
               ) -> tuple[tuple[int, int], ...] | None:
    """The rows on ``side`` ('q' or 'k') that ``slice_blocks`` gives blocks over, sorted and
    joined where they touch (``runs.merged`` of its blocks' rows), without making the
    blocks: the ring reads every pair of members' rows, where a rank computes the blocks of
    its own pairs only. (Cutting, merging and ``at_most_square`` keep a block's rows.)
    None under ``_ROWS_ALONE_FROM`` triples: making (and keeping) the blocks costs as much."""
    cells, at = mask.cells, (0, 1) if side == "q" else (2, 3)
    if not (len(q_segs) and len(k_segs) and len(cells)):
        return ()
    if len(q_segs) * len(k_segs) * len(cells) < _ROWS_ALONE_FROM:
        return None
    bands = np.concatenate(list(_passes(q_segs, k_segs, cells)))
    return _joined(bands[:, at[0]], bands[:, at[1]])


def _joined(starts: np.ndarray, stops: np.ndarray) -> tuple[tuple[int, int], ...]:
    """[start, stop) intervals sorted and joined where they touch or overlap."""
    if not len(starts):
        return ()
    order = np.argsort(starts, kind="stable")
    first_rows, ends = starts[order], np.maximum.accumulate(stops[order])
    new = np.flatnonzero(np.r_[True, first_rows[1:] > ends[:-1]])
    return tuple(zip(first_rows[new].tolist(), ends[np.r_[new[1:] - 1, len(ends) - 1]].tolist()))


def trimmed_bands(q_row, nq, k_row, nk, lo, hi) -> list[list[int]]:
    """``band_block`` on arrays of its arguments: for each that holds a visible pair,
    [q_start, q_stop, k_start, k_stop, kind (0 full, 1 causal, 2 band), lo, hi], in order
    (``tests/test_slice_blocks.py`` holds it to ``band_block`` on random bands)."""
    return _trimmed(q_row, nq, k_row, nk, lo, hi).tolist()


def _trimmed(q_row, nq, k_row, nk, lo, hi) -> np.ndarray:
    """``trimmed_bands`` as an [n, 7] int64 array."""
    i0, i1 = np.maximum(0, -hi), np.minimum(nq - 1, nk - 1 - lo)
    seen = (nq > 0) & (nk > 0) & (i0 <= i1)
    q_row, k_row, lo, hi, i0, i1 = (x[seen] for x in (q_row, k_row, lo, hi, i0, i1))
    j0, j1 = np.maximum(0, i0 + lo), np.minimum(nk[seen] - 1, i1 + hi)
    n, m, shift = i1 - i0 + 1, j1 - j0 + 1, j0 - i0
    lo, hi = np.maximum(lo - shift, -(n - 1)), np.minimum(hi - shift, m - 1)
    full = (lo == -(n - 1)) & (hi == m - 1)
    causal = ~full & (n == m) & (lo == -(n - 1)) & (hi == 0)
    code = np.where(full, 0, np.where(causal, 1, 2))
    band = code == 2
    return np.stack([q_row + i0, q_row + i1 + 1, k_row + j0, k_row + j1 + 1, code,
                     np.where(band, lo, 0), np.where(band, hi, 0)], axis=1).reshape(-1, 7)
