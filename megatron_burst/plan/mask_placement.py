"""Where a slice mask's tokens go: the layout's placement, and the work it leaves each rank.

A layout places a mask's tokens (``layouts``): ``area`` (the default with a mask) deals
chunks by visible area (``area``); ``zigzag`` and ``contiguous`` place the plain sequence's
chunks, whatever the mask. Everything is a pure function of (layout, world, length, mask):
every rank computes every rank's shard, without communication.
"""
from __future__ import annotations

import functools

from .layouts import MASK, layout_named
from .segments import Shard
from .slices import SliceMask, rows_area


@functools.lru_cache(maxsize=16)  # a mask comes with each batch: keep the recent ones
def mask_placement(layout: str, world: int, total: int, mask: SliceMask
                   ) -> tuple[Shard, ...]:
    """Every rank's shard of a ``total``-token sequence attended under ``mask``."""
    return layout_named(layout, MASK).place_mask(world, total, mask)


def rank_areas(layout: str, world: int, total: int, mask: SliceMask) -> tuple[int, ...]:
    """The visible area each rank's queries hold in ``layout``: the work balance."""
    shards = mask_placement(layout, world, total, mask)
    return tuple(sum(rows_area(mask.cells, s.pos, s.pos + s.valid) for s in shard)
                 for shard in shards)
