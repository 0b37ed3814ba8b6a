"""A new pack's plans, made from arrays, against the per-document enumeration they replace.

Pure functions (no processes): random packs (empty documents, one huge document, thousands
of tiny ones, sliding windows, Ulysses members) are placed, scheduled and planned into
kernel calls; every (query row, key row) pair the calls compute is expanded and compared
with the pairs of the old enumeration (``blocks_between`` over every segment, whole
documents one by one), and on small packs with the visible pairs worked out from the
documents' positions. The placement's promises are checked on the same packs.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import megatron_burst as mb
from megatron_burst.comm import RingPositions
from megatron_burst.plan.placement import local_length, placement
from megatron_burst.attention.call_plan import PairCalls, PlanKey
from megatron_burst.plan.schedule import Block, Mask, RingSchedule, blocks_between

from .packs import random_pack

MASKS = [Mask(True), Mask(False), Mask(True, (7, 0)), Mask(False, (3, 9)), Mask(True, (0, 0))]


def packs(count: int, worlds=(1, 2, 3, 4, 8), per_rank=(64, 200)):
    rng = random.Random(33)
    for i in range(count):
        world = worlds[i % len(worlds)]
        kind = ("tiny", "huge", "mix", "near")[i // len(worlds) % 4]
        yield world, random_pack(rng, world * rng.randint(*per_rank), kind)


# ------------------------------------------------------------------------- placement


@pytest.mark.parametrize("world,lens", list(packs(60)), ids=lambda x: str(x)[:40])
def test_placement_keeps_its_promises(world, lens):
    shards = placement("whole_docs", world, lens)
    cap = local_length("whole_docs", world, lens)
    seen = np.zeros(sum(lens), dtype=int)
    start = np.concatenate(([0], np.cumsum(lens)))
    ranks_of: dict[int, set] = {}
    for r, shard in enumerate(shards):
        assert shard.length == cap == sum(s.length for s in shard)
        rows = 0
        for seg in shard:  # in row order, back to back, no padding
            assert seg.row == rows and 0 < seg.length == seg.valid
            rows += seg.length
            seen[start[seg.doc] + seg.pos:start[seg.doc] + seg.pos + seg.length] += 1
            ranks_of.setdefault(seg.doc, set()).add(r)
        assert (np.diff(shard.rows) > 0).all(), "whole documents in row order"
        whole = set(shard.docs.tolist())
        assert all(s.doc not in whole for s in shard.split)
        assert all(s.pos == 0 and s.length == lens[s.doc] for s in shard if s.doc in whole)
        # rows others need first: every split segment before every whole document
        assert max((s.row + s.length for s in shard.split), default=0) <= shard.rows.min(
            initial=cap)
    assert (seen == 1).all(), "every token exactly once"
    share = sum(n * n for n in lens) / world
    short = [d for d, n in enumerate(lens) if n and n <= cap and n * n <= share]
    assert sum(len(ranks_of[d]) > 1 for d in short) < max(world, 1)
    placement.cache_clear()
    again = placement("whole_docs", world, lens)
    assert [list(s) for s in again] == [list(s) for s in shards], "a pure function"


def test_thousands_of_tiny_documents_stay_whole_so_nothing_travels():
    """The shortest documents come last and fill every rank's room exactly: no document is
    cut, so no ring step is run (as the one-by-one placement of the whole pack did)."""
    rng = random.Random(5)
    for world in (2, 3, 8):
        lens = random_pack(rng, world * 32768, "tiny")
        shards = placement("whole_docs", world, lens)
        assert sum(len(s.docs) for s in shards) == sum(1 for n in lens if n)
        assert not any(s.split for s in shards)
        for mask in (Mask(True), Mask(False)):
            sched = RingSchedule("whole_docs", world, lens, mask)
            assert sched.last_step(RingPositions(list(range(world)), 0).source) == 0


# ------------------------------------------------------------------------- blocks, calls


def visible(block: Block) -> np.ndarray:
    """The block's visible (i, j) pairs as a boolean matrix, in its own coordinates."""
    n, m = block.q_stop - block.q_start, block.k_stop - block.k_start
    d = np.arange(m)[None, :] - np.arange(n)[:, None]
    if block.kind == "full":
        return np.ones((n, m), dtype=bool)
    if block.kind == "causal":
        return d <= 0
    return (d >= block.lo) & (d <= block.hi)


def block_pairs(blocks, width: int) -> np.ndarray:
    """Sorted codes q_row * width + k_row of the pairs ``blocks`` compute (with repeats)."""
    codes = [((i + b.q_start) * width + j + b.k_start) for b in blocks
             for i, j in [np.nonzero(visible(b))]]
    return np.sort(np.concatenate(codes)) if codes else np.zeros(0, dtype=np.int64)


def call_pairs(calls, width: int) -> np.ndarray:
    """Sorted codes of the pairs kernel calls compute, from their runs and boundaries (and
    for varlen calls without blocks, the blocks flash makes of lengths and window)."""
    codes = []
    for call in calls:
        if not call.varlen:
            codes.append(block_pairs(call.blocks, width))
            continue
        q_rows = np.concatenate([np.arange(a, b) for a, b in call.q_runs])
        k_rows = np.concatenate([np.arange(a, b) for a, b in call.k_runs])
        for s, blk in enumerate(call.sequence_blocks()):
            i, j = np.nonzero(visible(blk))
            codes.append(q_rows[call.cu_q[s] + i] * width + k_rows[call.cu_k[s] + j])
    return np.sort(np.concatenate(codes)) if codes else np.zeros(0, dtype=np.int64)


def truth(q_segs, k_segs, mask: Mask, width: int) -> np.ndarray:
    """Codes of the visible pairs, from each row's (document, position) alone."""
    def where(segs):
        doc, pos = [], []
        for s in segs:
            doc += [s.doc if s.pos + i < s.doc_len else -1 for i in range(s.length)]
            pos += [s.pos + i for i in range(s.length)]
        return np.array(doc), np.array(pos)
    (dq, pq), (dk, pk) = where(q_segs), where(k_segs)
    rel = pk[None, :] - pq[:, None]
    ok = (dq[:, None] == dk[None, :]) & (dq[:, None] >= 0)
    left, right = mask.window
    if mask.causal:
        ok &= rel <= 0
    if left >= 0:
        ok &= rel >= -left
    if right >= 0:
        ok &= rel <= right
    i, j = np.nonzero(ok)
    return i * width + j


def pack_spec(sched: RingSchedule) -> PairCalls:
    """The kernel calls of any pair of members of ``sched``'s pack, as a plan makes them."""
    topo = RingPositions(list(range(sched.ring_size)), 0) if sched.ring_size > 1 else None
    key = PlanKey(sched.layout, sched.world, mb.pack_documents(
        torch.tensor([0, *np.cumsum(sched.doc_lens)], dtype=torch.int64)), sched.mask,
        sched.ulysses, None, "burst", True, None)
    return PairCalls(key, sched, topo)


def check_pair(sched, spec, m, o, small: bool) -> None:
    q_segs, k_segs = sched.segments(m), sched.segments(o)
    width = max(sched.shard(o).length, 1)
    old = blocks_between(q_segs, k_segs, sched.mask, same=m == o)  # one by one
    want = block_pairs(old, width)
    assert len(np.unique(want)) == len(want)
    assert np.array_equal(block_pairs(sched.blocks(m, o), width), want)
    assert np.array_equal(call_pairs(spec(m, o), width), want)
    if small:
        assert np.array_equal(np.sort(truth(q_segs, k_segs, sched.mask, width)), want)


@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("layout,ulysses", [("whole_docs", 1), ("whole_docs", 2),
                                            ("zigzag", 1)])
def test_plans_compute_exactly_the_visible_pairs(mask, layout, ulysses):
    """Every pair of members, every mask: blocks and kernel calls cover each visible pair
    once and nothing else, as the per-document enumeration does."""
    for world, lens in packs(20, worlds=(2, 4, 8) if ulysses > 1 else (1, 2, 3, 4, 8)):
        sched = RingSchedule(layout, world, lens, mask, ulysses)
        spec = pack_spec(sched)
        for m in range(sched.ring_size):
            for o in range(sched.ring_size):
                check_pair(sched, spec, m, o, small=sum(lens) <= 2048)


def test_large_packs_of_tiny_documents_plan_exactly():
    rng = random.Random(7)
    for world, mask in ((2, Mask(True)), (8, Mask(True, (5, 0))), (4, Mask(False))):
        lens = random_pack(rng, world * 4096, "tiny")
        sched = RingSchedule("whole_docs", world, lens, mask)
        spec = pack_spec(sched)
        for m in range(world):
            check_pair(sched, spec, m, m, small=False)
            check_pair(sched, spec, m, (m + 1) % world, small=False)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_whole_documents_never_travel(world):
    """What a hop carries (``needed_ranges`` from step 1) covers every key row another
    member uses, and stops before the rows of documents held whole."""
    topo = RingPositions(list(range(world)), 0)
    for _, lens in packs(16, worlds=(world,)):
        for mask in MASKS:
            sched = RingSchedule("whole_docs", world, lens, mask)
            spans = sched.needed_ranges(topo.source)
            for o in range(world):
                shard = sched.shard(o)
                tail = shard.rows.min(initial=shard.length)  # where whole documents start
                for s in range(1, world):
                    used = [(b.k_start, b.k_stop) for m in range(world)
                            for t in range(s, world) if topo.source(m, t) == o
                            for b in sched.blocks(m, o)]
                    first, stop = spans[o][s]
                    assert all(first <= a and b <= stop for a, b in used)
                    assert stop <= tail


@pytest.mark.parametrize("world", [2, 3, 8])
def test_large_packs_shard_and_gather_back_by_index(world):
    """``shard_documents`` gathers a rank's rows by one index (split segments and whole
    documents alike) and ``unshard_documents`` puts every token back."""
    from megatron_burst.attention.sharding import shard_documents, unshard_documents

    rng = random.Random(world)
    for kind in ("tiny", "huge", "mix"):
        lens = random_pack(rng, world * 2048, kind)
        x = torch.arange(sum(lens), dtype=torch.float64)[None, :, None].expand(2, -1, 3)
        shards = [shard_documents(x, lens, world, r, 1, "whole_docs") for r in range(world)]
        for r, part in enumerate(shards):
            want = torch.cat([x[:, sum(lens[:s.doc]) + s.pos:][:, :s.length]
                              for s in placement("whole_docs", world, lens)[r]], dim=1)
            assert torch.equal(part, want)
        assert torch.equal(unshard_documents(torch.stack(shards), lens, world, 1,
                                             "whole_docs"), x)
