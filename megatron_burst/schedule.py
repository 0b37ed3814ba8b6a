"""Which query/key blocks each ring member computes at each step, and which K/V rows travel.

The ring loops in ``burst.py`` are one loop for every mask and layout. What differs is only
*which* rectangles of (local queries) x (keys held this step) are computed, with what mask
inside each rectangle, and how many rows of each payload a hop must carry. This module
answers both as data: ``RingSchedule.blocks`` gives a step's ``Block``s, and
``RingSchedule.needed_rows`` how many leading rows of a member's payload anyone still uses
from a step on (``placement`` puts the rows other ranks need first), so a hop sends only
that prefix and a step nobody needs is not sent at all.

Who holds which positions is ``placement``'s job. With Ulysses, a ring member holds the
segments of all U ranks of its group.

Every mask is a *band* on key-minus-query position inside a document: causal keeps
j <= i, a window (left, right) keeps i-left <= j <= i+right. A block is trimmed to the
rows and columns with something visible, so a block is never partly empty and fully
masked pairs cost no FLOPs; steps with no block are skipped.
"""
from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from typing import Callable

from .placement import LAYOUTS, Segment, rank_segments  # noqa: F401  (LAYOUTS re-exported)

INF = 1 << 62
BLOCK_KINDS = ("full", "causal", "band")


@dataclasses.dataclass(frozen=True)
class Mask:
    causal: bool = False
    window: tuple[int, int] = (-1, -1)  # (left, right); -1 = unbounded

    @property
    def plain(self) -> bool:
        return self.window == (-1, -1)


@dataclasses.dataclass(frozen=True)
class Block:
    """One kernel call's worth: query rows ``q_start:q_stop`` against key rows ``k_start:k_stop``.

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
    def flash_window(self) -> tuple[int, int]:
        """(left, right) of flash-attn's bottom-right-aligned window that equals this block's
        mask ((-1, -1): every pair, (-1, 0): causal). Flash aligns query i with key
        i + m - n; blocks are trimmed so that a band's two values are >= 0 (the last row and
        the last column each see something)."""
        if self.kind == "full":
            return -1, -1
        if self.kind == "causal":
            return -1, 0
        n, m = self.q_stop - self.q_start, self.k_stop - self.k_start
        return (m - n) - self.lo, self.hi - (m - n)

    @staticmethod
    def of_window(n: int, m: int, window: tuple[int, int], causal: bool) -> "Block":
        """The n x m block flash computes under its bottom-right ``window`` (and
        ``causal``), trimmed to a kind: the inverse of ``flash_window``."""
        if causal:
            window = (window[0], 0)
        left, right = window
        lo = (m - n) - left if left >= 0 else -(n - 1)
        hi = (m - n) + right if right >= 0 else m - 1
        lo, hi = max(lo, -(n - 1)), min(hi, m - 1)
        if (lo, hi) == (-(n - 1), m - 1):
            return Block(0, n, 0, m, "full")
        if n == m and (lo, hi) == (-(n - 1), 0):
            return Block(0, n, 0, m, "causal")
        return Block(0, n, 0, m, "band", lo, hi)

    def describe(self) -> str:
        """e.g. 'band block of 64 x 80 (key - query in [-16, 0])'."""
        n, m = self.q_stop - self.q_start, self.k_stop - self.k_start
        mask = f" (key - query in [{self.lo}, {self.hi}])" if self.kind == "band" else ""
        return f"{self.kind} block of {n} x {m}{mask}"

    @property
    def area(self) -> int:
        """Visible (query, key) pairs: what the kernel spends FLOPs on."""
        n, m = self.q_stop - self.q_start, self.k_stop - self.k_start
        if self.kind == "full":
            return n * m
        lo, hi = (-(n - 1), 0) if self.kind == "causal" else (self.lo, self.hi)
        return _pairs_up_to(n, m, hi) - _pairs_up_to(n, m, lo - 1)


def _pairs_up_to(n: int, m: int, x: int) -> int:
    """Pairs (i, j), 0 <= i < n, 0 <= j < m, with j - i <= x: sum_i clamp(i + x + 1, 0, m),
    in closed form (a per-row loop cost 30-130 ms per new document pack at 32K-128K rows)."""
    a = x + 1
    first = min(max(1 - a, 0), n)  # first row that sees a key
    full = min(max(m - a, 0), n)  # first row that sees all m keys
    return (full - first) * (first + full - 1) // 2 + (full - first) * a + (n - full) * m


# ------------------------------------------------------------------------- blocks


def _pair_block(a: Segment, b: Segment, mask: Mask) -> Block | None:
    """The trimmed block of query segment ``a`` against key segment ``b`` (same document)."""
    nq, nk = a.valid, b.valid
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


def _diagonal_runs(segs: tuple[Segment, ...]) -> list[list[Segment]]:
    """Consecutive local segments of one document, positions increasing, no padding."""
    runs: list[list[Segment]] = []
    for s in segs:
        prev = runs[-1][-1] if runs else None
        if (prev is not None and prev.doc == s.doc and prev.pos + prev.length <= s.pos
                and prev.row + prev.length == s.row and prev.valid == prev.length):
            runs[-1].append(s)
        else:
            runs.append([s])
    return runs


def _whole(s: Segment) -> bool:
    """A document held whole (no padding) in this one segment: it pairs with nothing else."""
    return s.pos == 0 and s.length == s.doc_len


def blocks_between(q_segs: tuple[Segment, ...], k_segs: tuple[Segment, ...], mask: Mask,
                   same: bool = False) -> tuple[Block, ...]:
    """All blocks of queries ``q_segs`` against keys ``k_segs`` under ``mask``.

    ``same``: both sides are the same rows (a member against its own keys). Then, for a
    causal mask without window, a run of one document's segments in increasing positions
    is one causal block: the global mask is the local one there.

    A document held whole by one segment (most documents of most packs) pairs only with
    itself: under a plain mask its block is the mask on the diagonal, made directly; the
    pairing below only sees the other segments, so a pack's planning cost follows the
    documents that are split, not all of them.
    """
    found: list[Block] = []
    if same and mask.plain:
        kind = "causal" if mask.causal else "full"
        found += [Block(a.row, a.row + a.length, a.row, a.row + a.length, kind)
                  for a in q_segs if _whole(a)]
    keep_whole = same and not mask.plain  # a window: a whole document's band block
    q_rest = [a for a in q_segs if keep_whole or not _whole(a)]
    run_of: dict[int, int] = {}  # segment row -> its run, where a run is one causal block
    if same and mask.causal and mask.plain:
        for index, run in enumerate(_diagonal_runs(q_rest)):
            if len(run) > 1 and run[-1].valid == run[-1].length:
                start, stop = run[0].row, run[-1].row + run[-1].length
                found.append(Block(start, stop, start, stop, "causal"))
                run_of.update((seg.row, index) for seg in run)
    by_doc: dict[int, list[Segment]] = defaultdict(list)
    for b in (q_rest if same else k_segs):
        if keep_whole or not _whole(b):
            by_doc[b.doc].append(b)
    for a in q_rest:
        for b in by_doc.get(a.doc, ()):
            if a.row in run_of and run_of.get(b.row) == run_of[a.row]:
                continue  # inside a run's causal block
            if (blk := _pair_block(a, b, mask)) is not None:
                found.append(blk)
    return _merge_full(found)


def _merge_full(found: list[Block]) -> tuple[Block, ...]:
    """Merge full blocks that touch: same rows and adjacent columns, then the reverse."""
    order = lambda b: (b.q_start, b.k_start)  # noqa: E731
    if sum(b.kind == "full" for b in found) < 2:
        return tuple(sorted(found, key=order))

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

    return tuple(sorted(merge(merge(found, rows=False), rows=True), key=order))


# ------------------------------------------------------------------------- the ring

Source = Callable[[int, int], int]  # (member, step) -> whose payload member holds then


@dataclasses.dataclass(frozen=True, eq=False)
class RingSchedule:
    """The whole schedule of one call: who holds which positions, and the mask.

    ``world`` ranks shard the sequence; with ``ulysses`` U > 1 they form world/U ring
    members, member g holding the shards of ranks gU .. gU+U-1 (after the all-to-all).
    Build it with ``RingSchedule.of`` so that the layers of a model share one instance and
    its memoised blocks (the same documents reach every layer).
    """

    layout: str
    world: int
    doc_lens: tuple[int, ...]
    mask: Mask
    ulysses: int = 1
    _memo: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @staticmethod
    @functools.lru_cache(maxsize=16)  # boundaries change every batch: keep only recent ones
    def of(layout: str, world: int, doc_lens: tuple[int, ...], mask: Mask,
           ulysses: int = 1) -> "RingSchedule":
        return RingSchedule(layout, world, doc_lens, mask, ulysses)

    @property
    def ring_size(self) -> int:
        return self.world // self.ulysses

    def memo(self, key, compute):
        """``compute()`` once per key for this schedule (its blocks, rows, kernel calls)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def segments(self, member: int) -> tuple[Segment, ...]:
        def compute():
            u, out, row = self.ulysses, [], 0
            for rank in range(member * u, member * u + u):
                segs = rank_segments(self.layout, self.world, rank, self.doc_lens)
                if u == 1:
                    return segs  # rows already count from 0
                for s in segs:
                    out.append(Segment(row, s.doc, s.pos, s.length, s.doc_len))
                    row += s.length
            return tuple(out)
        return self.memo(("segments", member), compute)

    def blocks(self, q_member: int, k_member: int) -> tuple[Block, ...]:
        return self.memo(("blocks", q_member, k_member), lambda: blocks_between(
            self.segments(q_member), self.segments(k_member), self.mask,
            same=q_member == k_member))

    def needed_rows(self, source: Source, side: str = "k") -> tuple[tuple[int, ...], ...]:
        """``rows[o][s]``: leading rows of member o's payload used at step s or later.

        side 'k': o's keys/values, held at step s by the member m with source(m, s) == o,
        which computes blocks(m, o). Side 'q': o's queries visiting m (the burst backward),
        which computes blocks(o, m). A hop that hands o's payload to a member that first
        uses it at step s carries rows[o][s] rows; zero means nothing is sent.
        """
        sources = tuple(tuple(source(m, s) for s in range(self.ring_size))
                        for m in range(self.ring_size))
        return self.memo(("needed", sources, side), lambda: self._needed(sources, side))

    def _needed(self, sources, side) -> tuple[tuple[int, ...], ...]:
        size = self.ring_size
        used = [[0] * size for _ in range(size)]
        for m in range(size):
            for s, o in enumerate(sources[m]):
                blocks = self.blocks(m, o) if side == "k" else self.blocks(o, m)
                used[o][s] = max((b.k_stop if side == "k" else b.q_stop for b in blocks),
                                 default=0)
        for o in range(size):  # from a step on: the largest use at that step or later
            for s in range(size - 2, -1, -1):
                used[o][s] = max(used[o][s], used[o][s + 1])
        return tuple(tuple(row) for row in used)

    def last_step(self, source: Source) -> int:
        """The last ring step at which any member computes anything.

        Steps after this one are not run, and their payloads are never sent: with a sliding
        window on the contiguous layout, or documents kept whole, K/V that no rank still
        needs stay home.
        """
        rows = self.needed_rows(source)
        return max((s for r in rows for s, n in enumerate(r) if n), default=0)
