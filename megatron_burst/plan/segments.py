"""A shard's rows as data: segments of documents, and the documents held whole, as arrays.

A rank's shard (and a ring member's, with Ulysses) is a ``Shard``: the few ``Segment``s of
documents that other ranks hold part of (or that carry padding), as objects, and the
documents it holds whole, as three numpy arrays. A pack of tiny documents has thousands of
the latter and a handful of the former; every consumer that runs per pack (the schedule,
the kernel-call plans, sharding) works on the arrays, so planning a pack does not cost
Python per document. A ``Shard`` is also a sequence of all its segments in row order (made
on first use) for code that wants one object per document.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Iterator, Sequence

import numpy as np


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

    @property
    def valid(self) -> int:
        """Rows of this segment that hold real tokens (the rest is padding)."""
        return max(0, min(self.length, self.doc_len - self.pos))


def frozen(a: np.ndarray | Sequence[int]) -> np.ndarray:
    """``a`` as a read-only int64 array (a shard's arrays are shared by every consumer)."""
    out = np.array(a, dtype=np.int64)
    out.flags.writeable = False
    return out


EMPTY = frozen(())


@dataclasses.dataclass(frozen=True, eq=False)
class Shard(Sequence[Segment]):
    """Local rows of one rank or ring member (see the module docstring).

    ``split``: segments of documents not held whole here, with their own rows. Document
    ``docs[i]`` is held whole in rows ``rows[i]:rows[i]+lens[i]`` (no padding, never
    empty), in row order (``rows`` increases). ``length``: the number of local rows.
    """

    split: tuple[Segment, ...]
    docs: np.ndarray
    rows: np.ndarray
    lens: np.ndarray
    length: int

    @staticmethod
    def of(split: Sequence[Segment], docs=EMPTY, rows=EMPTY, lens=EMPTY) -> "Shard":
        """A shard from its parts; ``length`` counted from them."""
        length = sum(s.length for s in split) + int(np.sum(lens))
        return Shard(tuple(split), frozen(docs), frozen(rows), frozen(lens), length)

    @functools.cached_property
    def segments(self) -> tuple[Segment, ...]:
        """Every segment, the whole documents' included, in row order (one object each:
        for tests and tools, not for per-pack planning)."""
        whole = [Segment(r, d, 0, n, n) for r, d, n in
                 zip(self.rows.tolist(), self.docs.tolist(), self.lens.tolist())]
        return tuple(sorted((*self.split, *whole), key=lambda s: s.row))

    def __iter__(self) -> Iterator[Segment]:
        return iter(self.segments)

    def __len__(self) -> int:
        return len(self.split) + len(self.docs)

    def __getitem__(self, index):
        return self.segments[index]

    @property
    def whole_end(self) -> int:
        """One past the last row of a whole document (0 without any)."""
        return int(self.rows[-1] + self.lens[-1]) if len(self.docs) else 0

    def shifted(self, offset: int) -> "Shard":
        """The same shard with its rows counted from ``offset``."""
        split = tuple(dataclasses.replace(s, row=s.row + offset) for s in self.split)
        return Shard(split, self.docs, frozen(self.rows + offset), self.lens, self.length)


def concat(shards: Sequence[Shard]) -> Shard:
    """Shards one after the other in the rows of one (a ring member's, with Ulysses)."""
    if len(shards) == 1:
        return shards[0]
    parts, row = [], 0
    for shard in shards:
        parts.append(shard.shifted(row))
        row += shard.length
    return Shard(tuple(s for p in parts for s in p.split),
                 frozen(np.concatenate([p.docs for p in parts])),
                 frozen(np.concatenate([p.rows for p in parts])),
                 frozen(np.concatenate([p.lens for p in parts])), row)


Runs = tuple[tuple[int, int, int], ...]  # (which shard, its first row, rows), in row order


def in_position_order(shards: Sequence[Shard]) -> tuple[Shard, Runs]:
    """Shards' split segments as one shard's rows in position order (by document, then
    position), adjacent ones joined; and where each of its runs of rows comes from (which
    shard, from which of its rows, how many). A Ulysses group holds its ranks' zigzag
    chunks: in rank order 2U chunks out of order (22 blocks a pass at U = 8, each a kernel
    call, with merges), in position order two runs (one block at U = 8; ``benchmarks/
    results/cpu_ulysses_order``). Only for shards without whole documents."""
    pieces = sorted((seg.doc, seg.pos, i, seg.row, seg.length, seg.doc_len)
                    for i, shard in enumerate(shards) for seg in shard.split)
    segs: list[Segment] = []
    runs: list[tuple[int, int, int]] = []
    row = 0
    for doc, pos, i, local, n, doc_len in pieces:
        if n == 0:
            continue
        last = segs[-1] if segs else None
        if last is not None and last.doc == doc and last.pos + last.length == pos:
            segs[-1] = dataclasses.replace(last, length=last.length + n)
        else:
            segs.append(Segment(row, doc, pos, n, doc_len))
        if runs and runs[-1][0] == i and runs[-1][1] + runs[-1][2] == local:
            runs[-1] = (i, runs[-1][1], runs[-1][2] + n)
        else:
            runs.append((i, local, n))
        row += n
    return Shard.of(segs), tuple(runs)
