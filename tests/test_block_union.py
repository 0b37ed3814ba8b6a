"""Blocks that together are one causal, full or band block run as that one
(``plan.blocks.as_one``).

A causal slice mask dealt two chunks a rank (the ``area`` layout, as zigzag) is three blocks
on a rank's own keys that are one causal triangle in the shard's row order: one kernel call
instead of three, and no merge (a plain zigzag sequence's schedule makes the one block
itself). Checked on the blocks the schedule really makes (every layout, plain masks,
windows, documents, every LongCA-bench family and random slice masks, 1-4 ranks, every pair
of members): wherever ``as_one`` answers, its block's visible pairs are exactly the union
of the blocks' (dense, pair by pair), and it answers for the causal diagonal it was made
for, and for a window's band cut where it meets the sequence's ends.
"""
from __future__ import annotations

import random

import torch

from megatron_burst.plan import mask_families as mf
from megatron_burst.plan.blocks import Block, as_one, coalesced
from megatron_burst.plan.schedule import Mask, RingSchedule

from .test_slice_masks import KNOBS, random_mask


def _visible(b: Block, rows: int, cols: int) -> torch.Tensor:
    out = torch.zeros(rows, cols, dtype=torch.bool)
    i = torch.arange(b.q_start, b.q_stop)[:, None] - b.q_start
    j = torch.arange(b.k_start, b.k_stop)[None, :] - b.k_start
    lo, hi = {"full": (-(1 << 30), 1 << 30), "causal": (-(1 << 30), 0)}.get(b.kind, (b.lo, b.hi))
    out[b.q_start:b.q_stop, b.k_start:b.k_stop] = (j - i >= lo) & (j - i <= hi)
    return out


def _schedules():
    rng = random.Random(7)
    for world in (1, 2, 3, 4):
        total = 24 * world
        for mask in (Mask(True), Mask(False), Mask(True, (5, 0)), Mask(False, (3, 4))):
            for layout in ("zigzag", "contiguous"):
                yield RingSchedule(layout, world, (total,), mask, 1)
            yield RingSchedule("whole_docs", world, (7, total - 20, 13), mask, 1)
        lens = (5, 7, 3, total - 15)
        for name in mf.FAMILIES:
            yield RingSchedule("area", world, (total,), mf.family(name, lens, **KNOBS), 1)
        for _ in range(6):
            yield RingSchedule("area", world, (total,), random_mask(rng, total), 1)


def _pairs():
    """(every pair of members' blocks, as a grid's size) of every schedule above."""
    for sched in _schedules():
        for m in range(sched.ring_size):
            for o in range(sched.ring_size):
                blocks = sched.blocks(m, o)
                if blocks:
                    yield blocks, max(b.q_stop for b in blocks), max(b.k_stop for b in blocks)


def test_one_block_is_exactly_the_union_wherever_it_is_given():
    answered = 0
    for blocks, rows, cols in _pairs():
        one = as_one(blocks)
        if one is None:
            continue
        answered += 1
        union = torch.zeros(rows, cols, dtype=torch.bool)
        for b in blocks:
            assert not (union & _visible(b, rows, cols)).any()  # disjoint
            union |= _visible(b, rows, cols)
        assert torch.equal(union, _visible(one, rows, cols)), blocks
    assert answered >= 9


def test_coalesced_blocks_are_the_same_pairs_each_once():
    merged = 0
    for blocks, rows, cols in _pairs():
        out = coalesced(blocks)
        merged += len(out) < len(blocks)
        count = torch.zeros(rows, cols, dtype=torch.int64)
        for b in out:
            count += _visible(b, rows, cols).long()
        union = torch.zeros(rows, cols, dtype=torch.bool)
        for b in blocks:
            union |= _visible(b, rows, cols)
        assert count.max() <= 1 and torch.equal(count > 0, union), blocks
    assert merged >= 9


def test_a_run_of_diagonal_blocks_beside_others_becomes_one_causal_block():
    """A shared question's first two documents (one causal slice) beside later documents:
    the run's three blocks are one causal call, the other document stays as it is."""
    run = [Block(0, 4, 0, 4, "causal"), Block(4, 10, 0, 4, "full"),
           Block(4, 10, 4, 10, "causal")]
    other = Block(10, 16, 10, 16, "causal")
    assert coalesced([*run, other]) == (Block(0, 10, 0, 10, "causal"), other)


def test_a_causal_mask_dealt_as_zigzag_is_one_causal_call_on_a_ranks_own_keys():
    for world in (2, 3, 4):
        total = 16 * world
        sched = RingSchedule("area", world, (total,), mf.family("causal", (total,)), 1)
        split = 0
        for m in range(world):  # a rank holding chunks 0 and 2G-1 (the zigzag pair)
            blocks = sched.blocks(m, m)
            if len(blocks) == 3:
                split += 1
                assert as_one(blocks) == Block(0, 16, 0, 16, "causal")
            else:  # touching chunks: the schedule's own one block
                assert len(blocks) == 1 and as_one(blocks) is None
        assert split >= 1


def test_blocks_that_are_not_one_block_stay_apart():
    assert as_one([Block(0, 4, 0, 4, "causal"), Block(4, 8, 4, 8, "causal")]) is None
    assert as_one([Block(0, 4, 0, 4, "full"), Block(4, 8, 4, 8, "full")]) is None
    assert as_one([Block(0, 4, 0, 4, "causal")]) is None  # one block is already one
    # The right area but above the diagonal: not causal.
    assert as_one([Block(0, 2, 0, 2, "causal"), Block(0, 2, 2, 4, "full"),
                   Block(2, 4, 2, 4, "causal")]) is None


def test_a_window_cut_at_the_sequence_s_ends_is_one_band_call_on_a_rank_s_own_keys():
    """A sliding window's slices cut its band at the sequence's ends (the first w rows see a
    causal-like triangle, the rest the band): on the rank holding them, one band again, one
    kernel call where the schedule makes two. The global window's band beside its full
    columns: the band one call, the columns as they are."""
    total, w = 64, 6
    for name, mask in (("sliding_window", mf.sliding_window(total, w)),
                       ("sliding_window_causal", mf.sliding_window_causal(total, w))):
        sched = RingSchedule("contiguous", 2, (total,), mask, 1)
        blocks = sched.blocks(0, 0)
        assert len(blocks) == 2, (name, blocks)
        hi = w if name == "sliding_window" else 0
        assert as_one(blocks) == Block(0, 32, 0, 32, "band", -w, hi), name
    sched = RingSchedule("contiguous", 2, (total,), mf.global_sliding_window(total, 8, w), 1)
    blocks = sched.blocks(0, 0)
    out = coalesced(blocks)
    bands = [b for b in out if b.kind == "band"]
    assert len(bands) == 1 and len(out) < len(blocks), (blocks, out)
    assert [b for b in out if b.kind == "full"] == [b for b in blocks if b.kind == "full"]


def test_a_band_of_the_triangle_s_area_is_not_made_causal():
    """Two causal blocks on the diagonal with single pairs beside them that make, together,
    the band of offsets -1..1: as many pairs as the causal triangle over their square, but
    not it. The run is not merged into a causal block (``as_one`` calls it a band)."""
    run = [Block(0, 2, 0, 2, "causal"), Block(2, 4, 2, 4, "causal")]
    pairs = [Block(2, 3, 1, 2), Block(0, 1, 1, 2), Block(1, 2, 2, 3), Block(2, 3, 3, 4)]
    far = Block(10, 12, 10, 12, "causal")
    assert as_one([*run, *pairs]) == Block(0, 4, 0, 4, "band", -1, 1)
    blocks = [*run, *pairs, far]
    out = coalesced(blocks)
    assert all(b.kind != "causal" or b.q_stop - b.q_start == 2 for b in out), out
    count = torch.zeros(12, 12, dtype=torch.int64)
    for b in out:
        count += _visible(b, 12, 12).long()
    union = torch.zeros(12, 12, dtype=torch.bool)
    for b in blocks:
        union |= _visible(b, 12, 12)
    assert count.max() <= 1 and torch.equal(count > 0, union)


def test_a_full_block_beside_a_band_on_the_same_rows_stays_apart():
    """A long document that sees every earlier key (causal blockwise's last one): full on
    the earlier keys, causal on its own. Together one band (exactly), but the full block
    stays a dense call: a band of many rows would go to FlexAttention, slower on dense work."""
    full, own = Block(0, 4, 0, 8, "full"), Block(0, 4, 8, 12, "causal")
    assert as_one([full, own]) == Block(0, 4, 0, 12, "band", -3, 8)
    assert coalesced([full, own]) == (full, own)
