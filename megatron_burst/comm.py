"""Point-to-point rings over a process group, and byte accounting.

This layer knows nothing about attention. It moves lists of tensors one hop round a ring
(send to the next rank, receive from the previous one) asynchronously, so the caller can
compute while the transfer is in flight, and it counts every byte it sends so that
``count_comm()`` can show what each pass of an algorithm costs.

Every rank posts its send and its receive in one ``batch_isend_irecv`` call, in the same
order on every rank: no rank can wait on a peer that is itself waiting (the classic P2P
ring hang, Megatron-LM #1151, ring-flash-attention #39).

On CUDA the transfers run on NCCL's own streams; ``Pending.wait()`` makes the current
stream wait for them without blocking the host, so the kernels queued before it overlap
the transfer.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

# ---------------------------------------------------------------------------- accounting


@dataclasses.dataclass
class CommStats:
    """Bytes this rank sent while the ``count_comm()`` block was open, split by pass."""

    forward_bytes: int = 0
    backward_bytes: int = 0
    forward_messages: int = 0
    backward_messages: int = 0

    @property
    def total_bytes(self) -> int:
        return self.forward_bytes + self.backward_bytes


_ACTIVE: list[CommStats] = []


@contextlib.contextmanager
def count_comm() -> Iterator[CommStats]:
    """Count the bytes this rank sends inside the block (nested blocks all see them)."""
    stats = CommStats()
    _ACTIVE.append(stats)
    try:
        yield stats
    finally:
        _ACTIVE.remove(stats)


def record_sent(nbytes: int, phase: str) -> None:
    """Add ``nbytes`` sent in ``phase`` ('forward' or 'backward') to every open counter."""
    for stats in _ACTIVE:
        if phase == "forward":
            stats.forward_bytes += nbytes
            stats.forward_messages += 1
        else:
            stats.backward_bytes += nbytes
            stats.backward_messages += 1


# ---------------------------------------------------------------------------- the ring


class Pending:
    """A posted hop: ``wait()`` returns the received tensors (and frees the sent ones)."""

    def __init__(self, works: list, received: list[torch.Tensor], sent: Sequence[torch.Tensor]):
        self._works = works
        self._received = received
        self._sent = sent  # held so the caching allocator cannot reuse them mid-flight

    def wait(self) -> list[torch.Tensor]:
        for work in self._works:
            work.wait()
        self._works, self._sent = [], ()
        return self._received


class RingComm:
    """One ring over ``group``: rank i sends to i+1 and receives from i-1 (mod size).

    ``ranks`` optionally restricts the ring to a subset of the group's members given by
    their global ranks, in ring order (used by the double ring, where K/V go round the
    ranks of one node and, separately, across nodes).
    """

    def __init__(self, group: dist.ProcessGroup | None, phase: str = "forward",
                 ranks: Sequence[int] | None = None, offset: int = 1):
        self.group = group
        self.phase = phase
        if ranks is None:
            ranks = dist.get_process_group_ranks(group) if group is not None else list(
                range(dist.get_world_size()))
        me = dist.get_rank()
        self.ranks = list(ranks)
        self.size = len(self.ranks)
        self.index = self.ranks.index(me)
        self.next_rank = self.ranks[(self.index + offset) % self.size]
        self.prev_rank = self.ranks[(self.index - offset) % self.size]

    def send_recv(self, tensors: Sequence[torch.Tensor],
                  recv_into: Sequence[torch.Tensor] | None = None) -> Pending:
        """Post: send ``tensors`` to the next rank, receive the same shapes from the previous.

        ``recv_into`` gives the receive buffers (double buffering); without it fresh ones
        are allocated. Nothing is waited on here.
        """
        if recv_into is None:
            recv_into = [torch.empty_like(t) for t in tensors]
        ops = []
        nbytes = 0
        for t, r in zip(tensors, recv_into):
            if not t.is_contiguous():
                raise ValueError("RingComm sends contiguous tensors only (got a strided view)")
            ops.append(dist.P2POp(dist.isend, t, self.next_rank, self.group))
            ops.append(dist.P2POp(dist.irecv, r, self.prev_rank, self.group))
            nbytes += t.numel() * t.element_size()
        works = dist.batch_isend_irecv(ops)
        record_sent(nbytes, self.phase)
        return Pending(works, list(recv_into), tensors)


class KVRing:
    """A ring that forwards the same payload hop after hop through two fixed buffers.

    Step s receives into buffer s % 2 while the payload of step s-1 (the other buffer)
    is computed on and forwarded, so memory stays at two payloads whatever the ring size.
    The buffer written at step s is reused at step s+2 only after the kernels reading it
    were queued (CUDA stream order) or ran (CPU), so nothing is overwritten early.
    """

    def __init__(self, ring: RingComm, like: Sequence[torch.Tensor]):
        self.ring = ring
        self._buffers = [None, None]
        self._like = like
        self._slot = 0

    def forward(self, payload: Sequence[torch.Tensor]) -> Pending:
        """Send ``payload`` one hop on, receiving the previous rank's into the free buffer."""
        slot = self._slot
        if self._buffers[slot] is None:
            self._buffers[slot] = [torch.empty_like(t) for t in self._like]
        self._slot = 1 - slot
        return self.ring.send_recv(payload, self._buffers[slot])
