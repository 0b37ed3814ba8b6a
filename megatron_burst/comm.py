"""Point-to-point rings over a process group, and byte accounting.

This layer knows nothing about attention. It moves lists of tensors one hop round a ring
(send to the next rank, receive from the previous one) asynchronously, each hop as one
message (``Packed``), so the caller can
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


_ALIGN = 16  # bytes: every view in a Packed buffer starts aligned for any dtype


class Packed:
    """Several tensors (any shapes and dtypes) laid out in one byte buffer: one message.

    Why: NCCL runs the messages of one ``batch_isend_irecv`` to the same peer one after the
    other. On 8 H200 a hop of K and V as two 67 MB tensors takes 1.0 ms, as one 134 MB
    buffer 0.57 ms (benchmarks/results/p2p_*.json). So a hop (K/V; Q, dO, lse, delta; dK/dV)
    is always one buffer. ``views`` are the tensors, living inside ``flat``.
    """

    def __init__(self, specs: Sequence[tuple[torch.Size, torch.dtype]], device: torch.device,
                 *, zero: bool = False, flat: torch.Tensor | None = None):
        sizes = [torch.Size(shape).numel() * dtype.itemsize for shape, dtype in specs]
        offsets, total = [], 0
        for size in sizes:
            offsets.append(total)
            total += -(-size // _ALIGN) * _ALIGN
        if flat is None:
            flat = (torch.zeros if zero else torch.empty)(total, dtype=torch.uint8, device=device)
        self.flat = flat
        self.nbytes = sum(sizes)  # what the accounting counts: the tensors, not the padding
        self.views = tuple(flat[o:o + size].view(dtype).view(shape)
                           for o, size, (shape, dtype) in zip(offsets, sizes, specs))

    @classmethod
    def like(cls, tensors: Sequence[torch.Tensor], *, zero: bool = False) -> "Packed":
        """An uninitialised (or zero) buffer with the layout of ``tensors``."""
        return cls([(t.shape, t.dtype) for t in tensors], tensors[0].device, zero=zero)

    @classmethod
    def holding(cls, tensors: "Packed | Sequence[torch.Tensor]") -> "Packed":
        """``tensors`` as one buffer: as is when already packed, or a lone contiguous tensor
        (wrapped, no copy); otherwise copied in once."""
        if isinstance(tensors, Packed):
            return tensors
        if len(tensors) == 1 and tensors[0].is_contiguous():
            t = tensors[0]
            return cls([(t.shape, t.dtype)], t.device, flat=t.reshape(-1).view(torch.uint8))
        packed = cls.like(tensors)
        for view, t in zip(packed.views, tensors):
            view.copy_(t)
        return packed


class Pending:
    """A posted hop: ``wait()`` returns the received tensors (and frees the sent ones)."""

    def __init__(self, works: list, received: Packed | Sequence[torch.Tensor],
                 sent: object = ()):
        self._works = works
        self.received = received  # the Packed buffer, so it can be sent on without a copy
        self._sent = sent  # held so the caching allocator cannot reuse it mid-flight

    def wait(self) -> list[torch.Tensor]:
        for work in self._works:
            work.wait()
        self._works, self._sent = [], ()
        received = self.received
        return list(received.views if isinstance(received, Packed) else received)


class PeerComm:
    """Posts point-to-point hops among the ranks of ``group`` (global ids), one message
    per hop."""

    def __init__(self, group: dist.ProcessGroup | None, phase: str = "forward"):
        self.group = group
        self.phase = phase

    def send_recv(self, payload: Packed | Sequence[torch.Tensor], to: int, frm: int,
                  recv_into: Packed | None = None) -> Pending:
        """Post: send ``payload`` to global rank ``to``, receive the same layout from ``frm``.

        ``recv_into`` is the receive buffer (double buffering); without it a fresh one is
        allocated. Nothing is waited on here.
        """
        send = Packed.holding(payload)
        recv = recv_into if recv_into is not None else Packed.like(send.views)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send.flat, to, self.group),
                                        dist.P2POp(dist.irecv, recv.flat, frm, self.group)])
        record_sent(send.nbytes, self.phase)
        return Pending(works, recv, send)


class Done(Pending):
    """A hop to oneself: nothing is sent, the tensors are simply handed back."""

    def __init__(self, tensors: Packed | Sequence[torch.Tensor]):
        super().__init__([], tensors)


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
        self._buffers: list[Packed | None] = [None, None]
        self._slot = 0
        self._intra: Pending | None = None
        self._inter: Pending | None = None
        self._held: Packed | None = None  # the buffer the last next() handed out

    def post(self, step: int, payload: Sequence[torch.Tensor]) -> None:
        """Start the transfers that bring the payloads of later steps (call at ``step``)."""
        topo, p, sign = self.topo, self.topo.index, self.topo.direction
        t, u = divmod(step, topo.intra)
        n, l_ = divmod(p, topo.intra)
        send_inter = u == 0 and (t + 1) * topo.intra <= self.last
        send_intra = u + 1 < topo.intra and step + 1 <= self.last
        if not (send_inter or send_intra):
            return
        held = self._held
        if held is not None and all(a is b for a, b in zip(payload, held.views)):
            packed = held  # received by this ring: send on as is
        else:
            packed = Packed.holding(payload)  # the caller's own tensors: packed once
        if send_inter:
            to = topo.rank((n + sign) % topo.nodes * topo.intra + l_)
            frm = topo.rank((n - sign) % topo.nodes * topo.intra + l_)
            self._inter = self.comm.send_recv(packed, to, frm)
        if send_intra:
            slot = self._slot
            if self._buffers[slot] is None:
                self._buffers[slot] = Packed.like(self._like)
            self._slot = 1 - slot
            to = topo.rank(n * topo.intra + (l_ + sign) % topo.intra)
            frm = topo.rank(n * topo.intra + (l_ - sign) % topo.intra)
            self._intra = self.comm.send_recv(packed, to, frm, self._buffers[slot])

    def next(self, step: int) -> tuple[torch.Tensor, ...]:
        """The payload for ``step + 1`` (waits for its transfer)."""
        u = step % self.topo.intra
        pending = self._intra if u + 1 < self.topo.intra else self._inter
        views = tuple(pending.wait())
        self._held = pending.received
        return views


class AccumulatorRoute:
    """Sends gradient accumulators one step behind the payload they belong to.

    At ``step`` position p has added its part to the accumulator of payload
    source(p, step); it goes to whoever holds that payload at step+1, and p receives the
    accumulator of the payload it will hold at step+1. After ``last_step`` each
    accumulator goes straight home to its owner.
    """

    def __init__(self, topo: RingTopology, comm: PeerComm, last_step: int):
        self.topo, self.comm, self.last = topo, comm, last_step

    def pass_on(self, step: int, tensors: Packed | Sequence[torch.Tensor]) -> Pending:
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
