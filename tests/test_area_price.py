"""The price of a slice mask's placement (``plan.area_price``) and the deal that uses it.

The price counts what the kernels run: whole tiles (checked against a count cell by cell),
of the blocks the kernel-call plans compute (checked against a real plan's calls), a varlen
tile at ``VARLEN_TILE_COST`` dense ones. The ``area`` deal takes the least area's chunking
unless a neighbour near it is priced at least ``PRICE_GAIN`` cheaper.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key
from megatron_burst.kernels.selection import VARLEN_DENSE_MIN_AREA
from megatron_burst.plan import area, area_price
from megatron_burst.plan import mask_families as mf
from megatron_burst.plan.blocks import Block
from megatron_burst.plan.mask_placement import mask_placement
from megatron_burst.plan.slices import band_block

from .test_slice_masks import _pile_like


def _visible(block: Block) -> np.ndarray:
    """The block's visible pairs, cell by cell."""
    n, m = block.q_stop - block.q_start, block.k_stop - block.k_start
    i, j = np.arange(n)[:, None], np.arange(m)[None, :]
    if block.kind == "full":
        return np.ones((n, m), dtype=bool)
    if block.kind == "causal":
        return j <= i + (m - n)
    return (j - i >= block.lo) & (j - i <= block.hi)


@pytest.mark.parametrize("seed", range(40))
def test_tiles_are_each_row_tile_s_key_tiles_from_its_first_visible_key_to_its_last(seed):
    rng = random.Random(seed)
    n, m = rng.randint(1, 40), rng.randint(1, 40)
    kind = rng.choice(["full", "causal", "band"])
    if kind == "causal":
        m = max(m, n)
        block = Block(0, n, 0, m, "causal")
    elif kind == "full":
        block = Block(0, n, 0, m, "full")
    else:
        lo = rng.randint(-n, m)
        block = band_block(0, n, 0, m, lo, lo + rng.randint(0, m))
        if block is None:
            return
    seen, tile, want = _visible(block), 4, 0
    for r in range(0, seen.shape[0], tile):
        cols = np.flatnonzero(seen[r:r + tile].any(axis=0))
        if len(cols):
            want += cols[-1] // tile - cols[0] // tile + 1
    assert area_price.tiles(block, tile) == want, block


@pytest.mark.parametrize("world", [2, 3])
def test_the_price_s_blocks_are_the_blocks_a_real_plan_calls(world):
    """Each rank's priced blocks are, shape for shape, the blocks its forward's kernel calls
    compute (every family at 4K tokens a rank): the price sees what runs."""
    total = 4096 * world
    lens = _pile_like(total, seed=3)
    for name in mf.FAMILIES:
        mask = mf.family(name, lens, prefix=total // 3, window=512, global_size=256,
                         block=512)
        shards = mask_placement("area", world, total, mask)
        for rank in range(world):
            plan = build_plan(plan_key("area", world, (total,), mask, 1,
                                       RingKey(tuple(range(world)), rank, None), "ring",
                                       dense_min_area=VARLEN_DENSE_MIN_AREA))
            ran = sorted(_shape(b) for step in plan.forward.steps for call in step.calls
                         for b in call.blocks)
            priced = sorted(_shape(b) for b in area_price.rank_blocks(shards, mask, rank))
            assert ran == priced, (name, rank)


def _shape(b: Block) -> tuple:
    return b.q_stop - b.q_start, b.k_stop - b.k_start, b.kind, b.lo, b.hi, b.area


def test_a_varlen_tile_costs_more_than_a_dense_one():
    big = Block(0, 2048, 0, 2048, "full")  # 4M pairs: dense
    small = Block(0, 1024, 0, 1024, "full")  # 1M pairs: varlen
    assert big.area >= area_price.DENSE_MIN_AREA > small.area
    assert area_price.block_price(big) == 16 * 16
    assert area_price.block_price(small) == 8 * 8 * area_price.VARLEN_TILE_COST


@pytest.mark.parametrize("world", [2, 4])
def test_the_deal_is_the_least_area_or_a_neighbour_priced_cheaper(world):
    """At benchmark size (8K tokens a rank), every family's deal is the chunking of least
    area work (the search without its early stop), or its neighbour k/2 or 2k within
    ``PRICE_WITHIN`` of that work and priced at least ``PRICE_GAIN`` below it; and a
    least-area deal had no such neighbour."""
    for seed in range(3):
        _checked(world, _pile_like(8192 * world, seed=seed), mf.FAMILIES)


def test_the_price_moves_some_packs_of_documents():
    """Over ten packs of causal documents on 2 ranks, the price moves some deals (the case it
    was made for: 1,024-token chunks, not 2,048), each by the rule above."""
    moved = [seed for seed in range(10)
             if _checked(2, _pile_like(16384, seed=seed), ["causal_document"])]
    assert 1 <= len(moved) < 10, moved


def _checked(world: int, lens: tuple[int, ...], names) -> list[str]:
    """The families of ``names`` whose deal the price moved, each deal checked."""
    total = sum(lens)
    n, moved = total // world, []
    for name in names:
        mask = mf.family(name, lens, prefix=total // 3, window=1024, global_size=512,
                         block=1024)
        work = {k: area._deal(world, n, k, mask) for k in area._candidates(n)}
        score = {k: got[0] * (1 + min(area.EDGE_ROWS * k / n, 1)) for k, got in work.items()}
        least = min(score, key=lambda k: (score[k], k))
        chosen = area._dealt(world, total, mask)
        k = len(chosen[1][0])
        price = {j: area_price.busiest([area._shard(total, c) for c in work[j][1]], mask)
                 for j in (least // 2, least, 2 * least) if j in work
                 and score[j] <= area.PRICE_WITHIN * score[least]
                 and world * j <= area.PRICE_MAX_CHUNKS}
        if k == least:
            assert chosen[1] == work[least][1], name
            assert world * least > area.PRICE_MAX_CHUNKS or all(
                p >= (1 - area.PRICE_GAIN) * price[least] for p in price.values()), name
        else:
            moved.append(name)
            assert k in price and price[k] < (1 - area.PRICE_GAIN) * price[least], name
            assert price[k] == min(p for j, p in price.items() if j != least), name
    return moved
