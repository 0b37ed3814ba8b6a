"""A pack of documents described once: lengths, a digest, and the plans made for it.

Training hands attention a new pack of documents every micro-batch, and every layer and
the backward see the same pack. ``DocumentPack`` is that pack described once: the lengths
(read to the host once), a digest for the ranks' agreement check, and the ring schedules
(placement, blocks, kernel-call plans, device boundary tensors) made for it, so the layers
after the first and the backward reuse them. Build one per batch with ``pack_documents``
and pass it wherever ``cu_seqlens`` goes; a plain boundaries tensor works too (it is read at
every call and its pack found again by content, in a small cache keyed by the lengths).
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import struct
import threading

import numpy as np
import torch


@dataclasses.dataclass(eq=False)
class DocumentPack:
    """One pack of documents, described once (see the module docstring).

    ``lens``: document lengths (host ints); ``described``: what the agreement check
    compares; ``schedules``: the ring schedules made for this pack, by
    (layout, world, mask, ulysses), filled by ``burst_attn``. Two packs of the same lengths
    are equal (and hash alike): caches keyed by a pack are keyed by its content.
    """

    cu_seqlens: torch.Tensor  # int32, on the host
    lens: tuple[int, ...]
    described: str
    schedules: dict = dataclasses.field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._hash = hash(self.lens)  # a pack keys every layer's call: hash it once

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, DocumentPack) and self._hash == other._hash
                                 and self.lens == other.lens)


INT32_MAX = 2 ** 31 - 1  # the kernels read boundaries as int32
PACK_CACHE = 16  # packs kept by content (a batch's pack, found again by every layer)


def pack_documents(cu_seqlens: "torch.Tensor | DocumentPack") -> DocumentPack:
    """The ``DocumentPack`` of boundaries ``cu_seqlens`` [0, n0, n0+n1, ...], checked.

    Raises ValueError naming ``cu_seqlens`` unless it is a 1-D integer tensor of at least
    two entries that starts at 0, never decreases and fits int32. The boundaries are read
    every time (a CUDA tensor: one small copy to the host, which waits for the stream): the
    pack is found by their content, so a buffer rewritten in place by any means is seen.
    Build the pack once per batch and pass it instead to read them once.
    """
    if isinstance(cu_seqlens, DocumentPack):
        return cu_seqlens
    if (not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1
            or cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.numel() < 2):
        raise ValueError("cu_seqlens must be a 1-D int32/int64 tensor of document boundaries "
                         "[0, n0, n0+n1, ...]")
    bounds = cu_seqlens.detach().cpu().numpy().astype(np.int64)  # one array op per check
    steps = bounds[1:] - bounds[:-1]
    if bounds[0] != 0 or (steps < 0).any():
        raise ValueError(f"cu_seqlens must start at 0 and never decrease, got "
                         f"{bounds[:8].tolist()}{'...' if len(bounds) > 8 else ''}")
    if bounds[-1] > INT32_MAX:
        raise ValueError(f"cu_seqlens must fit int32 (the kernels read boundaries as int32): "
                         f"its last boundary is {bounds[-1]} > {INT32_MAX}")
    lens = tuple(steps.tolist())
    with _LOCK:  # the data path's prefetch thread makes packs while the step uses them
        pack = _PACKS.get(lens)
        if pack is None:
            pack = DocumentPack(torch.from_numpy(bounds.astype(np.int32)), lens,
                                describe_lengths(lens, steps))
            _PACKS[lens] = pack
            if len(_PACKS) > PACK_CACHE:
                _PACKS.popitem(last=False)
        else:
            _PACKS.move_to_end(lens)
    return pack


_PACKS: "collections.OrderedDict[tuple[int, ...], DocumentPack]" = collections.OrderedDict()
_LOCK = threading.Lock()


def doc_lengths(cu_seqlens: "torch.Tensor | DocumentPack") -> tuple[int, ...]:
    """Document lengths of boundaries ``cu_seqlens`` (checked as ``pack_documents`` does)."""
    return pack_documents(cu_seqlens).lens


def describe_lengths(lens: tuple[int, ...], array: np.ndarray | None = None) -> str:
    """Document lengths as a short string that still pins all of them (by digest).
    ``array``: the same lengths as an int64 array, if at hand (hashed without a copy)."""
    raw = (array.astype("<i8").tobytes() if array is not None
           else struct.pack(f"<{len(lens)}q", *lens))
    digest = hashlib.blake2b(raw, digest_size=8).hexdigest()
    head = ", ".join(map(str, lens[:6])) + (", ..." if len(lens) > 6 else "")
    return f"{len(lens)} documents [{head}] #{digest}"


@dataclasses.dataclass(frozen=True)
class DeviceBoundaries:
    """Boundaries the host never reads (layout ``pack_zigzag``): a call is keyed, agreed and
    planned by how many entries they have, and the GPU reads their values
    (``kernels.device_calls``). Pad them to a fixed count (repeat the last boundary: empty
    documents cost nothing) so that one plan, and one captured graph, serves every pack."""

    count: int  # entries of cu_seqlens: documents + 1

    @property
    def described(self) -> str:
        return f"{self.count - 1} documents read on the device"


def device_boundaries(cu_seqlens: "torch.Tensor | DocumentPack") -> DeviceBoundaries:
    """What a call keys on for boundaries read on the device; ValueError naming
    ``cu_seqlens`` unless it is a 1-D int32/int64 tensor of at least two entries (its values
    are checked on the device, ``attention.agree.check_boundaries``)."""
    if isinstance(cu_seqlens, DocumentPack):
        cu_seqlens = cu_seqlens.cu_seqlens
    if (not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1
            or cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.numel() < 2):
        raise ValueError("cu_seqlens must be a 1-D int32/int64 tensor of document boundaries "
                         "[0, n0, n0+n1, ...]")
    return DeviceBoundaries(cu_seqlens.numel())
