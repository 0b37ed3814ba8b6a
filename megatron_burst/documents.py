"""Packed documents (THD): copying each rank's rows out of the packed sequence, and back.

``placement`` is the single source of truth for which positions land where (per-document
zigzag or contiguous chunks padded like Megatron's PackedSeqParams, or ``whole_docs``);
this module only copies rows accordingly. Padding rows are zeros.
"""
from __future__ import annotations

import torch

from .placement import rank_segments


def doc_lengths(cu_seqlens: torch.Tensor) -> tuple[int, ...]:
    """Document lengths from cumulative boundaries [0, n0, n0+n1, ...], checked.

    Raises ValueError naming ``cu_seqlens`` unless it is a 1-D integer tensor of at least
    two entries that starts at 0 and never decreases. One device-to-host read.
    """
    if (not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1
            or cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.numel() < 2):
        raise ValueError("cu_seqlens must be a 1-D int32/int64 tensor of document boundaries "
                         "[0, n0, n0+n1, ...]")
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0 or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens must start at 0 and never decrease, got {bounds[:8]}"
                         f"{'...' if len(bounds) > 8 else ''}")
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


def shard_documents(x_full: torch.Tensor, lens: tuple[int, ...], world: int, rank: int,
                    seq_dim: int, layout: str) -> torch.Tensor:
    """This rank's rows of every document (padding rows are zeros)."""
    starts = [0]
    for n in lens[:-1]:
        starts.append(starts[-1] + n)
    pieces = []
    for seg in rank_segments(layout, world, rank, lens):
        if seg.valid:
            pieces.append(x_full.narrow(seq_dim, starts[seg.doc] + seg.pos, seg.valid))
        if seg.valid < seg.length:
            pad_shape = list(x_full.shape)
            pad_shape[seq_dim] = seg.length - seg.valid
            pieces.append(x_full.new_zeros(pad_shape))
    if not pieces:
        shape = list(x_full.shape)
        shape[seq_dim] = 0
        return x_full.new_zeros(shape)
    return torch.cat(pieces, dim=seq_dim) if len(pieces) > 1 else pieces[0]


def unshard_documents(stacked: torch.Tensor, lens: tuple[int, ...], world: int,
                      seq_dim: int, layout: str) -> torch.Tensor:
    """The packed, unpadded sequence from every rank's shard (``stacked[r]``)."""
    placed: dict[tuple[int, int], torch.Tensor] = {}
    for r in range(world):
        for seg in rank_segments(layout, world, r, lens):
            if seg.valid:
                placed[(seg.doc, seg.pos)] = stacked[r].narrow(seq_dim, seg.row, seg.valid)
    return torch.cat([placed[key] for key in sorted(placed)], dim=seq_dim)
