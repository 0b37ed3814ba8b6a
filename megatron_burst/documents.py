"""Packed documents (THD): a pack described once, and copying each rank's rows in and out.

Training hands attention a new pack of documents every micro-batch, and every layer and
the backward see the same pack. ``DocumentPack`` is that pack described once: the lengths
(read to the host once), a digest for the ranks' agreement check, and the ring schedules
(placement, blocks, kernel-call plans, device boundary tensors) made for it, so the layers
after the first and the backward reuse them. Build one per batch with ``pack_documents``
and pass it wherever ``cu_seqlens`` goes; a plain boundaries tensor works too (the
schedule is then found in a small cache keyed by the lengths).

``placement`` is the single source of truth for which positions land where (per-document
zigzag or contiguous chunks padded like Megatron's PackedSeqParams, or ``whole_docs``);
this module only copies rows accordingly. Padding rows are zeros.
"""
from __future__ import annotations

import dataclasses
import hashlib
import struct
import weakref

import torch

from .placement import rank_segments


@dataclasses.dataclass(eq=False)
class DocumentPack:
    """One pack of documents, described once (see the module docstring).

    ``lens``: document lengths (host ints); ``described``: what the agreement check
    compares; ``schedules``: the ring schedules made for this pack, by
    (layout, world, mask, ulysses), filled by ``burst_attn``.
    """

    cu_seqlens: torch.Tensor  # int32, on the host
    lens: tuple[int, ...]
    described: str
    schedules: dict = dataclasses.field(default_factory=dict, repr=False)


def pack_documents(cu_seqlens: "torch.Tensor | DocumentPack") -> DocumentPack:
    """The ``DocumentPack`` of boundaries ``cu_seqlens`` [0, n0, n0+n1, ...], checked.

    Raises ValueError naming ``cu_seqlens`` unless it is a 1-D integer tensor of at least
    two entries that starts at 0 and never decreases. The boundaries are read to the host
    once per tensor: the same tensor, unchanged, gives the same pack back (a CUDA tensor
    passed to every layer would otherwise cost a device synchronisation per layer, and
    each layer would plan the pack again).
    """
    if isinstance(cu_seqlens, DocumentPack):
        return cu_seqlens
    if (not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1
            or cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.numel() < 2):
        raise ValueError("cu_seqlens must be a 1-D int32/int64 tensor of document boundaries "
                         "[0, n0, n0+n1, ...]")
    seen = _PACKS.get(id(cu_seqlens))
    if seen is not None and seen[0]() is cu_seqlens and seen[1] == cu_seqlens._version:
        return seen[2]
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0 or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens must start at 0 and never decrease, got {bounds[:8]}"
                         f"{'...' if len(bounds) > 8 else ''}")
    lens = tuple(b - a for a, b in zip(bounds, bounds[1:]))
    pack = DocumentPack(torch.tensor(bounds, dtype=torch.int32), lens, describe_lengths(lens))
    key = id(cu_seqlens)  # by identity: tensors compare elementwise, so no WeakKeyDictionary
    _PACKS[key] = (weakref.ref(cu_seqlens, lambda _: _PACKS.pop(key, None)),
                   cu_seqlens._version, pack)
    return pack


_PACKS: dict[int, tuple[weakref.ref, int, DocumentPack]] = {}


def doc_lengths(cu_seqlens: "torch.Tensor | DocumentPack") -> tuple[int, ...]:
    """Document lengths of boundaries ``cu_seqlens`` (checked as ``pack_documents`` does)."""
    return pack_documents(cu_seqlens).lens


def describe_lengths(lens: tuple[int, ...]) -> str:
    """Document lengths as a short string that still pins all of them (by digest)."""
    digest = hashlib.blake2b(struct.pack(f"<{len(lens)}q", *lens), digest_size=8).hexdigest()
    head = ", ".join(map(str, lens[:6])) + (", ..." if len(lens) > 6 else "")
    return f"{len(lens)} documents [{head}] #{digest}"


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
