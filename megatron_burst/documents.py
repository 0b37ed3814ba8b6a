"""Packed documents (THD): sharding each document zigzag-wise, and gathering it back.

Each document is padded to a multiple of the layout's chunk count (2G for zigzag), as
Megatron's PackedSeqParams do, then cut like a sequence of its own; a rank's shard is its
chunks of every document in order. ``schedule.rank_segments`` is the single source of
truth for which positions land where; this module only copies rows accordingly.
"""
from __future__ import annotations

import torch

from .schedule import rank_segments


def doc_lengths(cu_seqlens: torch.Tensor) -> tuple[int, ...]:
    """Document lengths from cumulative boundaries [0, n0, n0+n1, ...]."""
    bounds = [int(x) for x in cu_seqlens.tolist()]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


def shard_documents(x_full: torch.Tensor, cu_seqlens: torch.Tensor, world: int, rank: int,
                    seq_dim: int, layout: str = "zigzag") -> torch.Tensor:
    """This rank's rows of every (padded) document; padding rows are zeros."""
    starts = [int(s) for s in cu_seqlens.tolist()[:-1]]
    pieces = []
    for seg in rank_segments(layout, world, rank, doc_lengths(cu_seqlens)):
        valid = max(0, min(seg.length, seg.doc_len - seg.pos))
        piece = x_full.narrow(seq_dim, starts[seg.doc] + seg.pos, valid)
        if valid < seg.length:
            pad_shape = list(x_full.shape)
            pad_shape[seq_dim] = seg.length - valid
            piece = torch.cat([piece, x_full.new_zeros(pad_shape)], dim=seq_dim)
        pieces.append(piece)
    return torch.cat(pieces, dim=seq_dim)


def unshard_documents(stacked: torch.Tensor, cu_seqlens: torch.Tensor, world: int,
                      seq_dim: int, layout: str = "zigzag") -> torch.Tensor:
    """The packed, unpadded sequence from every rank's shard (``stacked[r]``)."""
    lens = doc_lengths(cu_seqlens)
    placed: dict[tuple[int, int], torch.Tensor] = {}
    for r in range(world):
        for seg in rank_segments(layout, world, r, lens):
            valid = max(0, min(seg.length, seg.doc_len - seg.pos))
            if valid:
                placed[(seg.doc, seg.pos)] = stacked[r].narrow(seq_dim, seg.row, valid)
    return torch.cat([placed[key] for key in sorted(placed)], dim=seq_dim)
