"""A pack of documents described once: lengths, a digest, and the plans made for it.

Training hands attention a new pack of documents every micro-batch, and every layer and
the backward see the same pack. ``DocumentPack`` is that pack described once: the lengths
(read to the host once), a digest for the ranks' agreement check, and the ring schedules
(placement, blocks, kernel-call plans, device boundary tensors) made for it, so the layers
after the first and the backward reuse them. Build one per batch with ``pack_documents``
and pass it wherever ``cu_seqlens`` goes; a plain boundaries tensor works too (its pack is
found again from the tensor, and the schedule in a small cache keyed by the lengths).
"""
from __future__ import annotations

import dataclasses
import hashlib
import struct
import weakref

import torch



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
