"""Which query/key blocks each ring member computes at each step, and which K/V rows travel.

The ring loops in ``burst.py`` are one loop for every mask and layout. What differs is only
*which* rectangles of (local queries) x (keys held this step) are computed, with what mask
inside each rectangle, and how many rows of each payload a hop must carry. This module
answers both as data: ``RingSchedule.blocks`` gives a step's ``Block``s, and
``RingSchedule.needed_ranges`` which rows of a member's payload anyone still uses from a
step on (``placement`` puts the rows other ranks need first), so a hop sends only that span
and a step nobody needs is not sent at all.

Who holds which positions is ``placement``'s job. With Ulysses, a ring member holds the
segments of all U ranks of its group, in position order (a zigzag group then holds two runs,
not 2U chunks).

Every mask is a *band* on key-minus-query position inside a document (``blocks``). A block
is trimmed to the rows and columns with something visible, so a block is never partly
empty and fully masked pairs cost no FLOPs; steps with no block are skipped.

A document a member holds whole pairs only with itself, on the diagonal (the member's
queries against its own keys), under the plain mask: so the schedule pairs only the
segments of documents that are split (``Shard.split``: a handful per pack), and leaves the
whole ones as the shard's arrays, for the kernel-call plans to take in one piece
(``pack_calls.whole_call``). ``blocks`` still lists every block, whole documents' included,
for whoever wants them one by one; per-pack planning never asks for it.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Callable

from .blocks import BLOCK_KINDS, INF, Block, Mask  # noqa: F401  (re-exported)
from .layouts import MASK, PLAIN, layout_named
from .mask_placement import mask_placement
from .placement import LAYOUTS, placement  # noqa: F401  (LAYOUTS re-exported)
from .runs import gapped, merged, needed_runs
from .segments import Runs, Segment, Shard, concat, in_position_order
from .cell_blocks import slice_blocks, slice_rows
from .slices import SliceMask, at_most_square, band_block

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
    return band_block(a.row, nq, b.row, nk, lo, hi)


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


def whole_blocks(shard: Shard, mask: Mask) -> list[Block]:
    """The diagonal block of each document ``shard`` holds whole, one object each."""
    if not len(shard.docs):
        return []
    rows, lens = shard.rows.tolist(), shard.lens.tolist()
    if mask.plain:
        kind = "causal" if mask.causal else "full"
        return [Block(r, r + n, r, r + n, kind) for r, n in zip(rows, lens)]
    segs = (Segment(r, d, 0, n, n) for r, d, n in zip(rows, shard.docs.tolist(), lens))
    return [blk for s in segs if (blk := _pair_block(s, s, mask)) is not None]


def blocks_between(q_segs: tuple[Segment, ...], k_segs: tuple[Segment, ...],
                   mask: Mask | SliceMask,
                   same: bool = False) -> tuple[Block, ...]:
    """All blocks of queries ``q_segs`` against keys ``k_segs`` under ``mask``.

    ``same``: both sides are the same rows (a member against its own keys). Then, for a
    causal mask without window, a run of one document's segments in increasing positions
    is one causal block: the global mask is the local one there.

    A document held whole by one segment pairs only with itself: under a plain mask its
    block is the mask on the diagonal, made directly; the pairing below only sees the other
    segments. (The whole_docs layout hands its whole documents over as arrays instead,
    ``Shard``: they never reach this function.)
    """
    if isinstance(mask, SliceMask):  # one sequence: the mask's cells cut to the segments
        return _merge_full(slice_blocks(q_segs, k_segs, mask))
    if not same and {a.doc for a in q_segs}.isdisjoint(b.doc for b in k_segs):
        return ()  # no document in common (most pairs of members of a pack of short ones)
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
                found += at_most_square(blk)  # (flash's window: slices.at_most_square)
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
            # (fields compared and blocks made directly: an 8-rank slice-mask plan merges
            # thousands, where ``dataclasses.replace`` and the slice properties cost most)
            if prev is not None and prev.kind == blk.kind == "full":
                if (not rows and prev.q_start == blk.q_start and prev.q_stop == blk.q_stop
                        and prev.k_stop == blk.k_start):
                    out[-1] = Block(prev.q_start, prev.q_stop, prev.k_start, blk.k_stop)
                    continue
                if (rows and prev.k_start == blk.k_start and prev.k_stop == blk.k_stop
                        and prev.q_stop == blk.q_start):
                    out[-1] = Block(prev.q_start, blk.q_stop, prev.k_start, prev.k_stop)
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
    A pure value: its placement is made when it is made; the blocks of a pair of members
    are made at their first use and kept with it (every pass of a call asks for them).
    Calls keep their schedule in their plan (``attention.call_plan``), made once per key.
    """

    layout: str
    world: int
    doc_lens: tuple[int, ...]
    mask: Mask | SliceMask  # a slice mask: ``doc_lens`` is the one sequence's (total,)
    ulysses: int = 1
    _shards: tuple[Shard, ...] = dataclasses.field(init=False, repr=False, compare=False)
    _split: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)
    _rows: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)
    _runs: tuple[Runs, ...] | None = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        u = self.ulysses
        if isinstance(self.mask, SliceMask):  # a slice mask places its own tokens
            placed = mask_placement(self.layout, self.world, sum(self.doc_lens), self.mask)
        else:
            placed = placement(self.layout, self.world, self.doc_lens)
        groups = [placed[m * u:m * u + u] for m in range(self.world // u)]
        role = MASK if isinstance(self.mask, SliceMask) else PLAIN
        if u > 1 and not any(len(shard.docs) for shard in placed) \
                and layout_named(self.layout, role).member_in_position_order:
            shards, runs = zip(*(in_position_order(group) for group in groups))
        else:
            shards, runs = tuple(concat(group) for group in groups), None
        object.__setattr__(self, "_shards", tuple(shards))
        object.__setattr__(self, "_runs", runs)

    @staticmethod
    def of(layout: str, world: int, doc_lens: tuple[int, ...], mask: Mask,
           ulysses: int = 1) -> "RingSchedule":
        return RingSchedule(layout, world, doc_lens, mask, ulysses)

    @property
    def ring_size(self) -> int:
        return self.world // self.ulysses

    def shard(self, member: int) -> Shard:
        """The member's rows: with Ulysses, its U ranks' rows in position order
        (``member_runs``), or, where documents are held whole or the layout's launches are
        bound to each rank's rows, its ranks' shards one after the other."""
        return self._shards[member]

    def member_runs(self, member: int) -> Runs | None:
        """Where a Ulysses group's rows come from, in position order
        (``segments.in_position_order``: which rank of the group, its first row, how many);
        None: the U ranks' shards one after the other."""
        return None if self._runs is None else self._runs[member]

    def segments(self, member: int) -> tuple[Segment, ...]:
        """Every segment of the member's rows, in row order (one object per document)."""
        return self.shard(member).segments

    def split_blocks(self, q_member: int, k_member: int) -> tuple[Block, ...]:
        """The blocks between the members' segments of split documents: all of
        ``blocks(q, k)`` but the diagonal blocks of documents held whole."""
        pair = (q_member, k_member)
        found = self._split.get(pair)
        if found is None:
            found = self._split[pair] = blocks_between(
                self.shard(q_member).split, self.shard(k_member).split, self.mask,
                same=q_member == k_member)
        return found

    def split_rows(self, q_member: int, k_member: int, side: str = "k") -> Runs:
        """The ``side`` ('q' or 'k') rows ``split_blocks`` reads, ``merged``; of a slice mask's
        pair whose blocks are not made, without them (``slice_rows``: a rank reads all)."""
        pair = (q_member, k_member)
        if side not in ("q", "k"):
            raise ValueError(f"RingSchedule.split_rows: side must be 'q' or 'k', got {side!r}")
        if (pair, side) not in self._rows:  # (None: few triples, the blocks made and kept)
            rows = None if pair in self._split or not isinstance(self.mask, SliceMask) else \
                slice_rows(self.shard(q_member).split, self.shard(k_member).split, self.mask, side)
            self._rows[pair, side] = rows if rows is not None else merged(
                [(b.k_start, b.k_stop) if side == "k" else (b.q_start, b.q_stop)
                 for b in self.split_blocks(q_member, k_member)])
        return self._rows[pair, side]

    def blocks(self, q_member: int, k_member: int) -> tuple[Block, ...]:
        """Every block of ``q_member``'s queries against ``k_member``'s keys."""
        found = self.split_blocks(q_member, k_member)
        if q_member != k_member:
            return found
        whole = whole_blocks(self.shard(q_member), self.mask)
        if not whole:
            return found
        return tuple(sorted((*found, *whole), key=lambda b: (b.q_start, b.k_start)))

    def needed_rows(self, source: Source, side: str = "k", last: int | None = None
                    ) -> tuple[tuple[int, ...], ...]:
        """``rows[o][s]``: how many rows of member o's payload a hop carries to a member that
        first uses it at step s (``needed_runs``' rows; zero: nothing is sent); ``last``: a
        round that stops there (``needed_runs``)."""
        if not gapped(self):  # one run a payload: its span (a new pack's path: no more)
            return tuple(tuple(stop - start for start, stop in row)
                         for row in self.needed_ranges(source, side))
        return tuple(tuple(sum(z - a for a, z in runs) for runs in row)
                     for row in self.needed_runs(source, side, last))

    def needed_runs(self, source: Source, side: str = "k", last: int | None = None):
        """``runs[o][s]``: the rows of ``needed_ranges``' spans that are read, as runs
        (``plan.runs``: a window's hop carries the two edges it is read at); ``last``: no
        use after that step counted."""
        return needed_runs(self, source, side, last)

    def needed_ranges(self, source: Source, side: str = "k"
                      ) -> tuple[tuple[tuple[int, int], ...], ...]:
        """``ranges[o][s]``: the rows [start, stop) of member o's payload used at step s or
        later ((0, 0): none), the span of every block that reads it from step s on.

        side 'k': o's keys/values, held at step s by the member m with source(m, s) == o,
        which computes blocks(m, o). Side 'q': o's queries visiting m (the burst backward),
        which computes blocks(o, m). A hop that hands o's payload to a member that first
        uses it at step s carries these rows and no others: a window reaching back across
        the members' edge reads the end of its neighbour's shard, and only that travels.
        Spans only shrink from step to step, so a holder sends on a part of what it holds.
        Step 0 is the member's own payload, held whole (its span starts at row 0). Layout
        'pack_zigzag' reads its documents on the GPU, its kernel launches bound to each
        call's boundaries from the shard's first row (``kernels.device_calls``): its spans
        start at row 0 (leading rows: ``Layout.hops_from_first_row``).
        """
        size, on_keys = self.ring_size, side == "k"
        used = [[(0, 0)] * size for _ in range(size)]
        for m in range(size):  # (plain loops: a new pack plans this on the call's path)
            for s in range(size):
                o = source(m, s)
                first, last = INF, 0
                for b in (self.split_blocks(m, o) if on_keys else self.split_blocks(o, m)):
                    a, z = (b.k_start, b.k_stop) if on_keys else (b.q_start, b.q_stop)
                    first, last = (a if a < first else first), (z if z > last else last)
                if m == o:  # its own payload (step 0), held whole: from row 0
                    first, last = 0, max(last, self.shard(o).whole_end)
                if last > first:
                    used[o][s] = (first, last)
        for row in used:  # from a step on: the span of every use then or later
            a, z = row[size - 1]
            for s in range(size - 2, -1, -1):
                c, d = row[s]
                if z > a and d > c:
                    row[s] = a, z = (c if c < a else a, d if d > z else z)
                elif d > c:
                    a, z = c, d
                else:
                    row[s] = (a, z)
        if layout_named(self.layout, MASK if isinstance(self.mask, SliceMask) else PLAIN
                        ).hops_from_first_row:
            used = [[(0, b) if b else (0, 0) for _, b in row] for row in used]
        return tuple(tuple(row) for row in used)

    def last_step(self, source: Source) -> int:
        """The last ring step at which any member computes anything.

        Steps after this one are not run, and their payloads are never sent: with a sliding
        window on the contiguous layout, or documents kept whole, K/V that no rank still
        needs stay home.
        """
        return last_used_step(self.needed_rows(source))


def last_used_step(rows: tuple[tuple[int, ...], ...]) -> int:
    """The last step of a row table (``RingSchedule.needed_rows``) that uses any row."""
    return max((s for r in rows for s, n in enumerate(r) if n), default=0)


def last_spanned_step(spans: tuple[tuple[tuple[int, int], ...], ...]) -> int:
    """``last_used_step`` of a span table (``RingSchedule.needed_ranges``), in plain loops:
    a new pack plans this on the call's path."""
    last = 0
    for row in spans:
        for step in range(len(row) - 1, last, -1):
            if row[step][1]:
                last = step
                break
    return last
