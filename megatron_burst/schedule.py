"""Which query/key blocks each rank computes at each ring step: layouts and masks as data.

The ring loop in ``burst.py`` is one loop for every mask and layout. What differs is only
*which* rectangles of (local queries) x (keys held this step) are computed, and with what
mask inside the rectangle. This module answers that question as a list of ``Block``s.

A rank's shard is a list of *chunks* of the global sequence. ``zigzag`` cuts the sequence
into 2G equal chunks and gives rank r chunks r and 2G-1-r (Megatron's
``get_batch_on_this_cp_rank`` split, so RoPE and the data path need no change);
``contiguous`` gives rank r chunk r. With a causal mask a pair of chunks is either fully
visible (query chunk after key chunk), causal on the diagonal (same chunk), or skipped.
Adjacent fully visible pairs are merged into one rectangle so the kernel sees few, large
calls: with zigzag every step after the first is a single rectangle of half the work.
"""
from __future__ import annotations

import dataclasses
import functools

LAYOUTS = ("zigzag", "contiguous")


@dataclasses.dataclass(frozen=True)
class Block:
    """One kernel call: local query rows ``q_start:q_stop`` against key rows ``k_start:k_stop``.

    ``causal`` means the block is square and on the diagonal (query i sees keys <= i of the
    block); otherwise every key of the block is visible to every query.
    """

    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    causal: bool = False

    @property
    def q(self) -> slice:
        return slice(self.q_start, self.q_stop)

    @property
    def k(self) -> slice:
        return slice(self.k_start, self.k_stop)

    @property
    def area(self) -> int:
        """Visible (query, key) pairs: what the kernel spends FLOPs on."""
        n, m = self.q_stop - self.q_start, self.k_stop - self.k_start
        return n * (n + 1) // 2 if self.causal else n * m


def chunks_of(layout: str, world: int, rank: int) -> tuple[int, ...]:
    """Global chunk indices a rank holds, in local order (always increasing)."""
    if layout == "zigzag":
        return (rank, 2 * world - 1 - rank)
    if layout == "contiguous":
        return (rank,)
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def chunks_per_rank(layout: str) -> int:
    return len(chunks_of(layout, 1, 0))


@functools.lru_cache(maxsize=4096)
def blocks(layout: str, world: int, q_rank: int, k_rank: int, local_len: int,
           causal: bool) -> tuple[Block, ...]:
    """The blocks rank ``q_rank``'s queries compute against rank ``k_rank``'s keys."""
    q_chunks = chunks_of(layout, world, q_rank)
    k_chunks = chunks_of(layout, world, k_rank)
    c = local_len // len(q_chunks)
    if not causal:
        return (Block(0, local_len, 0, local_len),)
    if q_rank == k_rank:
        # Same positions on both sides and local order is increasing, so the global causal
        # mask is the local causal mask: one diagonal call over the whole shard.
        return (Block(0, local_len, 0, local_len, causal=True),)
    # Per query chunk, the key chunks it fully sees (causal pairs only occur when q == k).
    rows = []
    for qi, qc in enumerate(q_chunks):
        seen = [ki for ki, kc in enumerate(k_chunks) if kc < qc]
        rows.append((qi, seen))
    return _merge_full(rows, c)


def _merge_full(rows: list[tuple[int, list[int]]], c: int) -> tuple[Block, ...]:
    """Turn per-query-chunk lists of visible key chunks into few rectangles.

    Key chunks seen by one query chunk merge when consecutive; consecutive query chunks
    that see the same key range merge into one taller rectangle.
    """
    spans = []  # (q_chunk, k_first, k_last) runs
    for qi, seen in rows:
        run = None
        for ki in seen:
            if run is not None and ki == run[2] + 1:
                run = (qi, run[1], ki)
            else:
                if run is not None:
                    spans.append(run)
                run = (qi, ki, ki)
        if run is not None:
            spans.append(run)
    out: list[list[int]] = []  # [q_first, q_last, k_first, k_last]
    for qi, k0, k1 in spans:
        if out and out[-1][1] == qi - 1 and out[-1][2:] == [k0, k1]:
            out[-1][1] = qi
        else:
            out.append([qi, qi, k0, k1])
    return tuple(Block(q0 * c, (q1 + 1) * c, k0 * c, (k1 + 1) * c) for q0, q1, k0, k1 in out)


def step_area(layout: str, world: int, rank: int, step: int, local_len: int,
              causal: bool) -> int:
    """Visible pairs rank ``rank`` computes at ring step ``step`` (for balance checks)."""
    src = (rank - step) % world
    return sum(b.area for b in blocks(layout, world, rank, src, local_len, causal))
