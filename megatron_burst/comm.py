"""Point-to-point rings over a process group, and byte accounting.

This layer knows nothing about attention. It moves lists of tensors one hop round a ring
(send to the next rank, receive from the previous one) asynchronously, so the caller can
compute while the transfer is in flight, and it counts every byte it sends so that
``count_comm()`` can show what each pass of an algorithm costs.

Every rank posts its send and its receive in one ``batch_isend_irecv`` call, in the same
order on every rank: no rank can wait on a peer that is itself waiting (the classic P2P
ring hang, Megatron-LM #1151, ring-flash-attention #39).

The ring can be flat or a double ring (K/V go round the ranks of a node every step and
cross to the next node once every L steps): ``RingTopology`` answers who holds what at
each step, and ``PayloadRing`` / ``AccumulatorRoute`` move payloads and gradient
accumulators accordingly, so the attention loops never see the topology.

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


class PeerComm:
    """Posts batched point-to-point transfers among the ranks of ``group`` (global ids)."""

    def __init__(self, group: dist.ProcessGroup | None, phase: str = "forward"):
        self.group = group
        self.phase = phase

    def send_recv(self, tensors: Sequence[torch.Tensor], to: int, frm: int,
                  recv_into: Sequence[torch.Tensor] | None = None) -> Pending:
        """Post: send ``tensors`` to global rank ``to``, receive the same shapes from ``frm``.

        ``recv_into`` gives the receive buffers (double buffering); without it fresh ones
        are allocated. Nothing is waited on here.
        """
        if recv_into is None:
            recv_into = [torch.empty_like(t) for t in tensors]
        ops, nbytes = [], 0
        for t, r in zip(tensors, recv_into):
            if not t.is_contiguous():
                raise ValueError("PeerComm sends contiguous tensors only (got a strided view)")
            ops.append(dist.P2POp(dist.isend, t, to, self.group))
            ops.append(dist.P2POp(dist.irecv, r, frm, self.group))
            nbytes += t.numel() * t.element_size()
        works = dist.batch_isend_irecv(ops)
        record_sent(nbytes, self.phase)
        return Pending(works, list(recv_into), tensors)


class Done(Pending):
    """A hop to oneself: nothing is sent, the tensors are simply handed back."""

    def __init__(self, tensors: Sequence[torch.Tensor]):
        super().__init__([], list(tensors), ())


class RingTopology:
    """Ring positions 0..R-1 over global ``ranks``, as M nodes of L positions each.

    K/V (or any payload) move one position round the node's ring every step, and cross to
    the next node once every L steps (BurstAttention's double ring). ``intra_size=None``
    (or R) is the flat ring: one "node" of R positions.

    ``source(p, step)``: whose payload position p holds at ``step``.
    ``holder(o, step)``: which position holds o's payload at ``step``.
    ``reversed()``: the same ring run the other way, so that position p holds at step s
    the payload of the position that held p's payload at step s on this ring.
    """

    def __init__(self, ranks: Sequence[int], me: int, intra_size: int | None = None,
                 direction: int = 1):
        self.ranks = list(ranks)
        self.size = len(self.ranks)
        self.index = self.ranks.index(me)
        self.intra = intra_size or self.size
        self.nodes = self.size // self.intra
        self.direction = direction

    def reversed(self) -> "RingTopology":
        return RingTopology(self.ranks, self.ranks[self.index], self.intra, -self.direction)

    def _split(self, p: int, step: int) -> tuple[int, int, int, int]:
        t, u = divmod(step, self.intra)
        n, l_ = divmod(p, self.intra)
        return t * self.direction, u * self.direction, n, l_

    def source(self, p: int, step: int) -> int:
        t, u, n, l_ = self._split(p, step)
        return (n - t) % self.nodes * self.intra + (l_ - u) % self.intra

    def holder(self, owner: int, step: int) -> int:
        t, u, n, l_ = self._split(owner, step)
        return (n + t) % self.nodes * self.intra + (l_ + u) % self.intra

    def rank(self, p: int) -> int:
        return self.ranks[p]


class PayloadRing:
    """Moves a payload (K/V, or Q with dO/lse/delta) so position p holds source(p, s) at s.

    Within a node the payload hops to the next position every step through two fixed
    buffers (double buffering: memory does not grow with the ring). At the first step of
    each round the payload held then is also sent to the same position of the next node;
    that inter-node transfer has the whole round of L-1 intra-node steps to complete.
    Steps after ``last_step`` are never needed, so nothing is sent for them.
    """

    def __init__(self, topo: RingTopology, comm: PeerComm, like: Sequence[torch.Tensor],
                 last_step: int):
        self.topo, self.comm, self.last = topo, comm, last_step
        self._like = like
        self._buffers: list = [None, None]
        self._slot = 0
        self._intra: Pending | None = None
        self._inter: Pending | None = None

    def post(self, step: int, payload: Sequence[torch.Tensor]) -> None:
        """Start the transfers that bring the payloads of later steps (call at ``step``)."""
        topo, p, sign = self.topo, self.topo.index, self.topo.direction
        t, u = divmod(step, topo.intra)
        n, l_ = divmod(p, topo.intra)
        if u == 0 and (t + 1) * topo.intra <= self.last:
            to = topo.rank((n + sign) % topo.nodes * topo.intra + l_)
            frm = topo.rank((n - sign) % topo.nodes * topo.intra + l_)
            self._inter = self.comm.send_recv(payload, to, frm)
        if u + 1 < topo.intra and step + 1 <= self.last:
            slot = self._slot
            if self._buffers[slot] is None:
                self._buffers[slot] = [torch.empty_like(x) for x in self._like]
            self._slot = 1 - slot
            to = topo.rank(n * topo.intra + (l_ + sign) % topo.intra)
            frm = topo.rank(n * topo.intra + (l_ - sign) % topo.intra)
            self._intra = self.comm.send_recv(payload, to, frm, self._buffers[slot])

    def next(self, step: int) -> tuple[torch.Tensor, ...]:
        """The payload for ``step + 1`` (waits for its transfer)."""
        u = step % self.topo.intra
        pending = self._intra if u + 1 < self.topo.intra else self._inter
        return tuple(pending.wait())


class AccumulatorRoute:
    """Sends gradient accumulators one step behind the payload they belong to.

    At ``step`` position p has added its part to the accumulator of payload
    source(p, step); it goes to whoever holds that payload at step+1, and p receives the
    accumulator of the payload it will hold at step+1. After ``last_step`` each
    accumulator goes straight home to its owner.
    """

    def __init__(self, topo: RingTopology, comm: PeerComm, last_step: int):
        self.topo, self.comm, self.last = topo, comm, last_step

    def pass_on(self, step: int, tensors: Sequence[torch.Tensor]) -> Pending:
        topo, p = self.topo, self.topo.index
        if step < self.last:
            to = topo.holder(topo.source(p, step), step + 1)
            frm = topo.holder(topo.source(p, step + 1), step)
        else:
            to, frm = topo.source(p, step), topo.holder(p, step)
        if to == p:
            return Done(tensors)
        return self.comm.send_recv(tensors, topo.rank(to), topo.rank(frm))


def exchange(group: dist.ProcessGroup | None, sends: dict[int, torch.Tensor],
             recv_like: dict[int, torch.Tensor], phase: str) -> dict[int, torch.Tensor]:
    """All-to-all among a few peers as one batch of P2P ops: send ``sends[peer]`` to each
    peer (global rank) and receive a tensor shaped like ``recv_like[peer]`` from it. Waits.

    Used by the Ulysses all-to-all inside a group of U ranks, without creating a process
    group per Ulysses group (which would need every rank of the job to take part).
    """
    ops, received, nbytes = [], {}, 0
    for peer, t in sends.items():
        t = t.contiguous()
        ops.append(dist.P2POp(dist.isend, t, peer, group))
        nbytes += t.numel() * t.element_size()
    for peer, like in recv_like.items():
        received[peer] = torch.empty_like(like, memory_format=torch.contiguous_format)
        ops.append(dist.P2POp(dist.irecv, received[peer], peer, group))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    record_sent(nbytes, phase)
    return received
