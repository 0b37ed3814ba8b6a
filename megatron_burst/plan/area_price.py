"""What a placement of a slice mask costs the busiest rank: its blocks priced as the kernels
run them, not by their visible area.

Why: the ``area`` layout balances visible area, but the GPUs do not run area. A kernel runs
whole tiles (128 query rows x 128 keys here), so a block's edges cost partial tiles; and a
block below ``DENSE_MIN_AREA`` visible pairs goes into a varlen flash call, which ran about
half as fast a tile as the dense kernel (cuDNN) does a large block. On 2x H100 (torch 2.11,
causal documents at 8K tokens per GPU, GQA 64:8, d 128; ``benchmarks/gpu_timeline.py``,
NOTES, twentieth session) flash varlen took 102-137 us per million tile pairs and cuDNN
53-64: at an area balance of 1.042, rank 0's attention kernels ran 1.38 ms and rank 1's
1.11, and rank 0 set the pace. Priced this way, the same mask dealt in 1,024-token chunks
instead of 2,048 leaves the busiest rank 22% less: the chunk edges then fall so that more
of the work forms large blocks. So the deal keeps area as its measure, and among the
chunkings whose area is near the least, a price like this one picks (``area._dealt``).

The price is a model, the same on every rank and every device (the placement must be a pure
function of the mask: ``shard_seq`` and ``burst_attn`` place alike without the kernel): one
unit a tile of a dense block, ``VARLEN_TILE_COST`` a tile of a varlen one. Blocks are the
schedule's own (``slice_blocks``, full ones merged, causal runs coalesced as the kernel-call
plan does), a rank's queries against every rank's keys.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .blocks import Block, coalesced, merged_full
from .segments import Shard
from .slices import SliceMask, slice_blocks

# From this many visible pairs a block runs faster alone on the dense kernel (cuDNN, ~550
# TFLOP/s fwd+bwd on H200) than inside a varlen flash call (~325): the launch it saves
# (~20-50 us) is worth less than the slower kernel costs above ~1.5K x 1.5K pairs. The
# kernels' plans read it here (``kernels.selection``): the price and the plans agree.
DENSE_MIN_AREA = float(2 ** 21)
VARLEN_TILE_COST = 2.0  # a varlen flash tile against a dense cuDNN one (the timings above)
TILE = 128  # rows and keys of a kernel's tile


def tiles(block: Block, tile: int = TILE) -> int:
    """The ``tile`` x ``tile`` tiles a kernel visits for ``block``: per row tile, every key
    tile from the first visible key to the last (a band's rows see one run of keys)."""
    n, m = block.q_stop - block.q_start, block.k_stop - block.k_start
    lo, hi = block.lo, block.hi  # visible: lo <= j - i <= hi
    if block.kind == "full":
        lo, hi = -(n - 1), m - 1
    elif block.kind == "causal":  # bottom-right aligned: j <= i + (m - n)
        lo, hi = -(n - 1), m - n
    first = np.arange(0, n, tile)
    last = np.minimum(n, first + tile) - 1
    k0, k1 = np.maximum(0, first + lo), np.minimum(m - 1, last + hi)
    seen = k1 >= k0
    return int((k1[seen] // tile - k0[seen] // tile + 1).sum())


def block_price(block: Block) -> float:
    """One block's tiles, each dense tile one unit and each varlen tile ``VARLEN_TILE_COST``."""
    return tiles(block) * (1.0 if block.area >= DENSE_MIN_AREA else VARLEN_TILE_COST)


def rank_blocks(shards: Sequence[Shard], mask: SliceMask, rank: int) -> list[Block]:
    """The blocks ``rank``'s queries compute against every rank's keys, as the kernel-call
    plans run them (the schedule's blocks of each pair, coalesced)."""
    mine = shards[rank].segments
    return [b for keys in shards
            for b in coalesced(merged_full(slice_blocks(mine, keys.segments, mask)))]


def busiest(shards: Sequence[Shard], mask: SliceMask) -> float:
    """The largest rank's price."""
    return max(sum(block_price(b) for b in rank_blocks(shards, mask, rank))
               for rank in range(len(shards)))


__all__ = ["DENSE_MIN_AREA", "VARLEN_TILE_COST", "block_price", "busiest", "rank_blocks",
           "tiles"]
