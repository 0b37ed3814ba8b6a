"""General slice masks: a union of (query range, key range, kind) slices, as disjoint bands.

A ``SliceMask`` is what MagiAttention and LongCA-bench call a mask: slices of the whole
sequence, each a rectangle of query positions [qs, qe) against key positions [ks, ke) with a
kind inside. Counted from the slice's start (query i, key j, qlen x klen): ``full`` sees
all, ``causal`` sees j <= i + (klen - qlen) (bottom-right aligned), ``inv_causal`` sees
j >= i, ``bi_causal`` both. A pair is visible if any slice shows it.

Why bands: in the sequence's own positions (query q, key k, D = k - q) every kind is a band
on D inside its rectangle: full any D, causal D <= ke - qe, inv_causal D >= ks - qs,
bi_causal both. So the mask is made *disjoint* once (``SliceMask.cells``): the rectangles
are cut at every slice edge, and in each cell the slices' D intervals are joined; every
(cell, interval) is then one band, the same kind of block the kernels already run
(``blocks.Block``, 'band' trimmed to 'full' or 'causal' where it is one). Overlapping
slices are never computed twice. Everything later (the area of a row range, the blocks
between two shards' segments) intersects these cells with rectangles: no [N, N] array.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any, Sequence

import numpy as np

from .blocks import INF, Block

KINDS = ("full", "causal", "inv_causal", "bi_causal")


def _range(value: Any, name: str, index: int) -> tuple[int, int]:
    ok = (isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in value))
    if not ok or not 0 <= value[0] <= value[1]:
        raise ValueError(f"{name}[{index}] must be a pair of ints 0 <= start <= end, got "
                         f"{value!r}")
    return int(value[0]), int(value[1])


@dataclasses.dataclass(frozen=True, eq=False, init=False)
class SliceMask:
    """A union of slices (see the module docstring); compared and hashed by value.

    ``q_ranges``/``k_ranges``: [start, end) on the whole sequence, one pair per slice;
    ``kinds``: one of ``KINDS`` per slice. Empty slices are allowed (they show nothing).
    Raises ValueError naming the argument that is wrong.
    """

    q_ranges: tuple[tuple[int, int], ...]
    k_ranges: tuple[tuple[int, int], ...]
    kinds: tuple[str, ...]

    def __init__(self, q_ranges: Sequence[Sequence[int]], k_ranges: Sequence[Sequence[int]],
                 kinds: Sequence[str]) -> None:
        for name, value in (("q_ranges", q_ranges), ("k_ranges", k_ranges), ("kinds", kinds)):
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise ValueError(f"{name} must be a sequence (one entry per slice), got "
                                 f"{type(value).__name__}")
        if not len(q_ranges) == len(k_ranges) == len(kinds):
            raise ValueError(f"q_ranges, k_ranges and kinds must have one entry per slice, "
                             f"got {len(q_ranges)}, {len(k_ranges)} and {len(kinds)}")
        for i, kind in enumerate(kinds):
            if kind not in KINDS:
                raise ValueError(f"kinds[{i}] must be one of {KINDS}, got {kind!r}")
        set_ = object.__setattr__
        set_(self, "q_ranges", tuple(_range(r, "q_ranges", i) for i, r in enumerate(q_ranges)))
        set_(self, "k_ranges", tuple(_range(r, "k_ranges", i) for i, r in enumerate(k_ranges)))
        set_(self, "kinds", tuple(kinds))
        set_(self, "_hash", hash((self.q_ranges, self.k_ranges, self.kinds)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, SliceMask) and self._hash == other._hash
                                 and (self.q_ranges, self.k_ranges, self.kinds)
                                 == (other.q_ranges, other.k_ranges, other.kinds))

    def __repr__(self) -> str:
        return f"SliceMask({self.described})"

    @functools.cached_property
    def extent(self) -> int:
        """One past the last position any slice names (the sequence must be this long)."""
        return max((e for r in (*self.q_ranges, *self.k_ranges) for e in r[1:]), default=0)

    @functools.cached_property
    def described(self) -> str:
        """The slices as a short string that still pins all of them (by digest): what the
        ranks' agreement check compares."""
        raw = repr((self.q_ranges, self.k_ranges, self.kinds)).encode()
        digest = hashlib.blake2b(raw, digest_size=8).hexdigest()
        head = ", ".join(f"{q}x{k}:{t}" for q, k, t in
                         zip(self.q_ranges[:3], self.k_ranges[:3], self.kinds[:3]))
        more = ", ..." if len(self.kinds) > 3 else ""
        return f"{len(self.kinds)} slices [{head}{more}] #{digest}"

    @functools.cached_property
    def cells(self) -> np.ndarray:
        """[n, 6] int64, rows (q0, q1, k0, k1, dlo, dhi): disjoint bands whose union is the
        mask: the pairs q0 <= q < q1, k0 <= k < k1 with dlo <= k - q <= dhi."""
        out = np.array(_disjoint(self.q_ranges, self.k_ranges, self.kinds), dtype=np.int64)
        out = out.reshape(-1, 6)
        out.flags.writeable = False
        return out

    @functools.cached_property
    def cell_rows(self) -> tuple[tuple[int, ...], ...]:
        """``cells`` as Python ints (read one at a time where there are few)."""
        return tuple(map(tuple, self.cells.tolist()))

    @functools.cached_property
    def area(self) -> int:
        """Visible (query, key) pairs of the whole mask."""
        return int(rows_area(self.cells, 0, self.extent))


def _band(q: tuple[int, int], k: tuple[int, int], kind: str) -> tuple[int, int]:
    """The slice's D = k - q interval (clipped to what its rectangle can hold)."""
    lo, hi = k[0] - (q[1] - 1), k[1] - 1 - q[0]  # every D the rectangle holds
    if kind in ("causal", "bi_causal"):
        hi = min(hi, k[1] - q[1])
    if kind in ("inv_causal", "bi_causal"):
        lo = max(lo, k[0] - q[0])
    return lo, hi


def _disjoint(q_ranges, k_ranges, kinds) -> list[tuple[int, ...]]:
    """The cells of ``SliceMask.cells``: a sweep over query edges keeps the slices that
    cover each run of rows; key edges of those cut it into cells, where the slices' D
    intervals are joined. Cells alike in neighbouring runs are joined again, so a mask of
    few slices stays few cells."""
    live = [(q, k, _band(q, k, t)) for q, k, t in zip(q_ranges, k_ranges, kinds)
            if q[0] < q[1] and k[0] < k[1]]
    live = [s for s in live if s[2][0] <= s[2][1]]
    edges = sorted({e for q, _, _ in live for e in q})
    starts = sorted(range(len(live)), key=lambda i: live[i][0][0])
    active: list[int] = []
    nxt = 0
    open_cells: dict[tuple, int] = {}  # (k0, k1, dlo, dhi) -> q0 of a cell still growing
    done: list[tuple[int, ...]] = []
    for a, b in zip(edges, edges[1:]):
        while nxt < len(starts) and live[starts[nxt]][0][0] <= a:
            active.append(starts[nxt])
            nxt += 1
        active = [i for i in active if live[i][0][1] > a]
        row = set(_row_cells([live[i] for i in active], a, b))
        for key in [key for key in open_cells if key not in row]:
            done.append((open_cells.pop(key), a, *key))
        for key in row:
            open_cells.setdefault(key, a)
    last = edges[-1] if edges else 0
    done += [(q0, last, *key) for key, q0 in open_cells.items()]
    return sorted(done)


def _row_cells(slices, a: int, b: int) -> list[tuple[int, int, int, int]]:
    """(k0, k1, dlo, dhi) of the disjoint bands of query rows [a, b), from ``slices``
    (all covering those rows); neighbouring key runs with the same intervals joined."""
    cuts = sorted({e for _, k, _ in slices for e in k})
    found: list[tuple[int, int, int, int]] = []
    for c, d in zip(cuts, cuts[1:]):
        bands = sorted(band for _, k, band in slices if k[0] <= c and k[1] >= d)
        joined: list[list[int]] = []
        low, high = c - (b - 1), d - 1 - a  # the D values this cell holds
        for lo, hi in bands:
            lo, hi = max(lo, low), min(hi, high)
            if lo > hi:
                continue
            if joined and lo <= joined[-1][1] + 1:
                joined[-1][1] = max(joined[-1][1], hi)
            else:
                joined.append([lo, hi])
        for lo, hi in joined:
            # An edge at the cell's own edge is no edge: spelt unbounded, so that cells
            # alike (a document's causal rows, say) join across runs.
            lo, hi = -INF if lo == low else lo, INF if hi == high else hi
            prev = found[-1] if found else None
            if prev is not None and prev[1] == c and prev[2:] == (lo, hi):
                found[-1] = (prev[0], d, lo, hi)  # the same band over the next keys
            else:
                found.append((c, d, lo, hi))
    return found


def band_area(n, m, lo, hi):
    """Pairs (i, j), 0 <= i < n, 0 <= j < m with lo <= j - i <= hi (numpy, elementwise;
    the bounds clipped first so that nothing overflows)."""
    n, m = np.asarray(n, dtype=np.int64), np.asarray(m, dtype=np.int64)
    lo, hi = np.clip(lo, -n, m), np.clip(hi, -n - 1, m)
    return _count_up_to(n, m, hi) - _count_up_to(n, m, lo - 1)


def _count_up_to(n, m, x):
    """``blocks._pairs_up_to`` over arrays."""
    a = x + 1
    first = np.minimum(np.maximum(1 - a, 0), n)
    full = np.minimum(np.maximum(m - a, 0), n)
    return (full - first) * (first + full - 1) // 2 + (full - first) * a + (n - full) * m


def rows_area(cells: np.ndarray, start: int, stop: int) -> int:
    """Visible pairs of the query rows [start, stop) (every key)."""
    return int(ranges_area(cells, [start], [stop])[0])


def ranges_area(cells: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Visible pairs of the query rows [starts[i], stops[i]) (every key) of every range at
    once: one numpy pass over ranges x cells (the area layout sizes up to hundreds of chunks
    per new mask)."""
    starts, stops = np.asarray(starts)[:, None], np.asarray(stops)[:, None]
    q0, q1 = np.maximum(cells[None, :, 0], starts), np.minimum(cells[None, :, 1], stops)
    n = np.maximum(q1 - q0, 0)
    c = cells[None]
    area = band_area(n, c[..., 3] - c[..., 2], c[..., 4] - (c[..., 2] - q0),
                     c[..., 5] - (c[..., 2] - q0))
    return np.where(n > 0, area, 0).sum(axis=1)


def band_block(q_row: int, nq: int, k_row: int, nk: int, lo: int, hi: int) -> Block | None:
    """The block of ``nq`` query rows from ``q_row`` against ``nk`` key rows from ``k_row``
    where local key j is visible to local query i iff lo <= j - i <= hi, trimmed to the
    rows and columns that see something (None: nothing visible), of kind 'full', 'causal'
    or 'band'."""
    if nq <= 0 or nk <= 0:
        return None
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
    return Block(q_row + i0, q_row + i1 + 1, k_row + j0, k_row + j1 + 1, kind,
                 lo if kind == "band" else 0, hi if kind == "band" else 0)


def at_most_square(blk: Block) -> list[Block]:
    """``blk``, or for a band of more rows than columns its rows in runs of at most as many
    rows as the run keeps columns (each trimmed again). flash-attn's window on a band block
    of n > m rows gave some rows no keys (lse +inf, out NaN; 192 x 64, H100 and H200); runs
    of n <= m are the shapes its window is known to compute (windows, documents)."""
    n, m = blk.q_stop - blk.q_start, blk.k_stop - blk.k_start
    if blk.kind != "band" or n <= m:
        return [blk]
    runs: list[Block] = []
    for r in range(0, n, m):
        part = band_block(blk.q_start + r, min(m, n - r), blk.k_start, m, blk.lo + r,
                          blk.hi + r)
        if part is not None:
            runs += at_most_square(part)
    return runs


__all__ = ["KINDS", "SliceMask", "at_most_square", "band_area", "band_block", "rows_area"]
