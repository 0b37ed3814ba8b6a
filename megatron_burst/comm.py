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

A peer that fails or hangs mid-ring must not leave the others waiting forever: on CPU
(gloo) every host-blocking wait gives up after ``MEGATRON_BURST_TIMEOUT_S`` seconds
(default 600) with an error naming the peer (``wait_bounded``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import time
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist

from . import headers

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
        # By identity: CommStats is a dataclass, so list.remove() would compare values and
        # could drop an enclosing counter that happens to hold the same counts.
        _ACTIVE[:] = [s for s in _ACTIVE if s is not stats]


def record_sent(nbytes: int, phase: str) -> None:
    """Add ``nbytes`` sent in ``phase`` ('forward' or 'backward') to every open counter."""
    for stats in _ACTIVE:
        if phase == "forward":
            stats.forward_bytes += nbytes
            stats.forward_messages += 1
        else:
            stats.backward_bytes += nbytes
            stats.backward_messages += 1


# ---------------------------------------------------------------------------- timeouts

TIMEOUT_ENV = "MEGATRON_BURST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0


def timeout_s() -> float:
    """The bound on one host-blocking wait, in seconds (read per wait, so tests can set it)."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:  # also rejects nan
        raise ValueError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return value


def wait_bounded(work: dist.Work, device: torch.device, waiting_for: str,
                 why: str = "that rank failed or is stuck") -> None:
    """Wait for ``work``; on CPU give up after ``timeout_s()`` with an error naming the peer.

    ``waiting_for`` completes "rank R waited T s ..." (e.g. "for a ring hop from rank 0
    (forward)"). On CUDA (NCCL) nothing is bounded here, because ``wait()`` only makes the
    current stream wait and the host never blocks: a dead peer is caught by the process
    group's own timeout (``init_process_group(timeout=...)``), whose watchdog aborts the
    communicator when ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` is on (the default).
    """
    if device.type != "cpu":
        work.wait()
        return
    start = time.monotonic()
    try:
        work.wait(timeout=datetime.timedelta(seconds=timeout_s()))
    except RuntimeError as e:  # gloo's timeout, or the peer's connection closing
        raise RuntimeError(f"rank {dist.get_rank()} waited {time.monotonic() - start:.1f} s "
                           f"{waiting_for}: {why}") from e


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
        offsets, total = [], headers.BYTES  # the message's header comes first (headers.py)
        for size in sizes:
            offsets.append(total)
            total += -(-size // _ALIGN) * _ALIGN
        if flat is None:
            flat = (torch.zeros if zero else torch.empty)(total, dtype=torch.uint8, device=device)
        self.flat = flat
        self.header = flat[:headers.BYTES].view(torch.int64)
        self.nbytes = sum(sizes)  # what the accounting counts: the tensors, not the padding
        self.views = tuple(flat[o:o + size].view(dtype).view(shape)
                           for o, size, (shape, dtype) in zip(offsets, sizes, specs))

    @classmethod
    def like(cls, tensors: Sequence[torch.Tensor], *, zero: bool = False) -> "Packed":
        """An uninitialised (or zero) buffer with the layout of ``tensors``."""
        return cls([(t.shape, t.dtype) for t in tensors], tensors[0].device, zero=zero)

    @classmethod
    def holding(cls, tensors: "Packed | Sequence[torch.Tensor]") -> "Packed":
        """``tensors`` as one buffer: as is when already packed, otherwise copied in once
        (behind the room for the header)."""
        if isinstance(tensors, Packed):
            return tensors
        packed = cls.like(tensors)
        for view, t in zip(packed.views, tensors):
            view.copy_(t)
        return packed


class Batch:
    """The works of one ``batch_isend_irecv`` and the buffers it sends.

    ``wait()`` waits once: gloo's send/receive works must not be waited on twice (a second
    wait blocks for a message that never comes), and several receives share one batch.
    The sent buffers are held until then: gloo cancels a send whose work is dropped.
    """

    def __init__(self, works: list, sent: object = (), what: Sequence[str] = (),
                 device: torch.device | None = None):
        self._works, self._sent = works, sent
        self._what, self._device = list(what), device  # per op: whom a timeout names

    def wait(self) -> None:
        # gloo hands back one work per op, in op order; NCCL one for the batch, and NCCL
        # waits are never timed (see wait_bounded).
        for i, work in enumerate(self._works):
            what = self._what[i] if i < len(self._what) else "for a ring hop"
            wait_bounded(work, self._device or torch.device("cpu"), what)
        self._works, self._sent = [], ()


class Pending:
    """A posted hop: ``wait()`` returns the received tensors (and frees the sent ones),
    after the header check has seen the message (``headers.HeaderCheck``)."""

    def __init__(self, batch: Batch, received: Packed | Sequence[torch.Tensor] | None,
                 check: "headers.HeaderCheck | None" = None, sender: int = -1):
        self._batch = batch
        self.received = received  # the Packed buffer, so it can be sent on without a copy
        self._check, self._sender = check, sender

    def wait(self) -> list[torch.Tensor]:
        self._batch.wait()
        received = self.received
        if received is None:
            return []
        if self._check is not None and isinstance(received, Packed):
            self._check.received(received.header, self._sender)
            self._check = None  # several waits on one hop check it once
        return list(received.views if isinstance(received, Packed) else received)


class PeerComm:
    """Posts point-to-point hops among the ranks of ``group`` (global ids), one message
    per direction per hop."""

    def __init__(self, group: dist.ProcessGroup | None, phase: str = "forward",
                 check: "headers.HeaderCheck | None" = None):
        self.group = group
        self.phase = phase
        self.check = check  # stamps what is sent, checks what arrives (None: untagged)

    def finish(self) -> None:
        """The pass is over: every message it received has arrived (CUDA: compare them)."""
        if self.check is not None:
            self.check.finish()

    def hop(self, send: Packed | None, to: int, recv: Packed | None, frm: int) -> Pending:
        """Post: send ``send`` to global rank ``to`` and receive into ``recv`` from ``frm``
        (either may be None: nothing to send, or nothing to receive). Waits on nothing."""
        return self.post([(send, to)] if send is not None else [],
                         [(recv, frm)] if recv is not None else [])[0]

    def post(self, sends: Sequence[tuple[Packed, int]], recvs: Sequence[tuple[Packed, int]]
             ) -> list[Pending]:
        """Post every send and receive of this rank for one step as ONE batch.

        One batch per step is what keeps a ring from deadlocking: a send in one batch and
        its peer's receive queued behind another batch on the same stream would wait on
        each other. Returns a Pending per receive (all of them the first when there is none
        to receive: it then only holds the sent buffers until the batch completes).
        """
        ops, what = [], []
        for buf, to in sends:
            if self.check is not None:
                self.check.stamp(buf.header)
            ops.append(dist.P2POp(dist.isend, buf.flat, to, self.group))
            what.append(f"for rank {to} to take a ring hop ({self.phase})")
            record_sent(buf.nbytes, self.phase)
        for buf, frm in recvs:
            ops.append(dist.P2POp(dist.irecv, buf.flat, frm, self.group))
            what.append(f"for a ring hop from rank {frm} ({self.phase})")
        device = ops[0].tensor.device if ops else None
        batch = Batch(dist.batch_isend_irecv(ops) if ops else [], [buf for buf, _ in sends],
                      what, device)
        return ([Pending(batch, buf, self.check, frm) for buf, frm in recvs]
                or [Pending(batch, None)])


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """Shapes and dtypes of a payload's tensors, each cut to its first rows along its row
    dimension: how a hop knows the size of what it receives without asking."""

    shapes: tuple[torch.Size, ...]
    dtypes: tuple[torch.dtype, ...]
    row_dims: tuple[int, ...]
    device: torch.device

    @staticmethod
    def of(tensors: Sequence[torch.Tensor], row_dims: Sequence[int]) -> "RowLayout":
        return RowLayout(tuple(t.shape for t in tensors), tuple(t.dtype for t in tensors),
                         tuple(row_dims), tensors[0].device)

    def _shape(self, i: int, rows: int) -> torch.Size:
        shape = list(self.shapes[i])
        shape[self.row_dims[i]] = rows
        return torch.Size(shape)

    def packed(self, rows: int, *, zero: bool = False) -> Packed:
        """A buffer for the first ``rows`` rows of every tensor."""
        return Packed([(self._shape(i, rows), dt) for i, dt in enumerate(self.dtypes)],
                      self.device, zero=zero)

    def cut(self, tensors: Sequence[torch.Tensor], rows: int) -> list[torch.Tensor]:
        """Views of the first ``rows`` rows of each tensor."""
        return [t.narrow(d, 0, rows) for t, d in zip(tensors, self.row_dims)]

    def rows_of(self, tensors: Sequence[torch.Tensor]) -> int:
        return tensors[0].shape[self.row_dims[0]]


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


Rows = Callable[[int, int], int]  # (origin position, step) -> rows used from that step on


def payload_hops(topo: RingTopology, step: int, rows: Rows
                 ) -> list[tuple[str, int, int, int, int]]:
    """The hops position ``topo.index`` posts at ``step``: (kind, to, rows sent, from,
    rows received), positions not ranks.

    Intra: the payload held now goes to the next position of the node, which uses it from
    step+1. Inter (the first step of each round of L steps): it also goes to the same
    position of the next node, which uses it from the next round on. A hop carries the
    rows its receiver will use, ``rows(origin, first step)``; zero means it is not sent.
    The receiver computes the same number for what it expects, so both sides agree.
    """
    def used(origin: int, first: int) -> int:
        return rows(origin, first) if first < topo.size else 0

    p, sign = topo.index, topo.direction
    t, u = divmod(step, topo.intra)
    n, l_ = divmod(p, topo.intra)
    hops = []
    if u == 0 and topo.nodes > 1:
        first = (t + 1) * topo.intra
        hops.append(("inter", (n + sign) % topo.nodes * topo.intra + l_,
                     used(topo.source(p, step), first),
                     (n - sign) % topo.nodes * topo.intra + l_, used(topo.source(p, first), first)))
    if u + 1 < topo.intra:
        hops.append(("intra", n * topo.intra + (l_ + sign) % topo.intra,
                      used(topo.source(p, step), step + 1),
                      n * topo.intra + (l_ - sign) % topo.intra,
                      used(topo.source(p, step + 1), step + 1)))
    return hops


class PayloadRing:
    """Moves a payload (K/V, or Q with dO/lse/delta) so position p holds source(p, s) at s.

    Each hop carries only the leading rows its receiver will still use (``rows``, from the
    schedule): nothing for a step no one needs, and for packed documents kept whole on one
    rank, never their rows. Within a node the payload hops to the next position every step;
    at the first step of each round it is also sent to the same position of the next node,
    and that inter-node transfer has the whole round of L-1 intra-node steps to complete.
    """

    def __init__(self, topo: RingTopology, comm: PeerComm, layout: RowLayout, rows: Rows):
        self.topo, self.comm, self.layout, self.rows = topo, comm, layout, rows
        self._pending: dict[str, Pending] = {}
        self._held: Packed | None = None  # the buffer the last next() handed out
        self._outgoing: Pending | None = None

    def post(self, step: int, payload: Sequence[torch.Tensor] | None) -> None:
        """Start the transfers that bring the payloads of later steps (call at ``step``)."""
        sends, recvs, kinds = [], [], []
        for kind, to, n_send, frm, n_recv in payload_hops(self.topo, step, self.rows):
            if n_send:
                sends.append((self._pack(payload, n_send), self.topo.rank(to)))
            if n_recv:
                recvs.append((self.layout.packed(n_recv), self.topo.rank(frm)))
                kinds.append(kind)
        self.finish()  # last step's sends: done by now (their receivers posted first)
        if sends or recvs:
            pending = self.comm.post(sends, recvs)
            self._pending.update(zip(kinds, pending))
            self._outgoing = pending[0]  # holds the batch until its sends are done

    def finish(self) -> None:
        """Wait until this ring's last sends are done (call after the last step)."""
        if self._outgoing is not None:
            self._outgoing.wait()
            self._outgoing = None

    def _pack(self, payload: Sequence[torch.Tensor], rows: int) -> Packed:
        held = self._held
        if (held is not None and all(a is b for a, b in zip(payload, held.views))
                and self.layout.rows_of(held.views) == rows):
            return held  # received by this ring, all of it still needed: send on as is
        return Packed.holding(self.layout.cut(payload, rows))  # cut and packed: one copy

    def next(self, step: int) -> tuple[torch.Tensor, ...] | None:
        """The payload for ``step + 1`` (waits for its transfer); None when nothing of it
        is used."""
        kind = "intra" if step % self.topo.intra + 1 < self.topo.intra else "inter"
        pending = self._pending.pop(kind, None)
        views = pending.wait() if pending is not None else []
        self._held = pending.received if pending is not None else None
        return tuple(views) if views else None


class AccumulatorRoute:
    """Sends gradient accumulators after the payload they belong to, and home.

    Step 0's gradients of a position's own payload stay home. From step 1 the holder of
    origin o's payload adds its part to o's accumulator (the payload's leading
    ``rows(o, 1)`` rows: all any other position touches) and passes it to the next
    holder that still uses o's payload, or home after the last one.
    """

    def __init__(self, topo: RingTopology, comm: PeerComm, layout: RowLayout, rows: Rows):
        self.topo, self.comm, self.layout, self.rows = topo, comm, layout, rows

    def used(self, origin: int, step: int) -> int:
        return self.rows(origin, step) if step < self.topo.size else 0

    def new(self, origin: int, step: int) -> Packed | None:
        """A zero accumulator for ``origin``'s travelling rows, if this position holds that
        payload at ``step`` (None: it does not, or the payload never travels)."""
        rows = self.used(origin, 1)
        return self.layout.packed(rows, zero=True) if rows and self.used(origin, step) else None

    def pass_on(self, step: int, acc: Packed | None
                ) -> tuple[Pending | None, Pending | None, Pending]:
        """At ``step`` >= 1: send the accumulator of the origin held now on, or home.

        Returns (the accumulator of the origin held at step+1, as its holder at ``step``
        passes it; this position's own accumulator, when it comes home at ``step``; the
        batch, to wait on before the sent accumulator may be reused).
        """
        topo, p = self.topo, self.topo.index
        sends, recvs, kinds = [], [], []
        if acc is not None:
            origin = topo.source(p, step)
            to = topo.holder(origin, step + 1) if self.used(origin, step + 1) else origin
            sends.append((acc, topo.rank(to)))
        nxt = topo.source(p, step + 1) if step + 1 < topo.size else None
        if nxt is not None and self.used(nxt, step + 1):
            recvs.append((self.layout.packed(self.used(nxt, 1)), topo.rank(topo.holder(nxt, step))))
            kinds.append("forward")
        if self.used(p, step) and not self.used(p, step + 1):  # the last use of our payload
            recvs.append((self.layout.packed(self.used(p, 1)), topo.rank(topo.holder(p, step))))
            kinds.append("home")
        pending = self.comm.post(sends, recvs)
        got = dict(zip(kinds, pending))
        return got.get("forward"), got.get("home"), pending[0]


def exchange(group: dist.ProcessGroup | None, sends: dict[int, torch.Tensor],
             recv_like: dict[int, torch.Tensor], phase: str) -> dict[int, torch.Tensor]:
    """All-to-all among a few peers as one batch of P2P ops: send ``sends[peer]`` to each
    peer (global rank) and receive a tensor shaped like ``recv_like[peer]`` from it. Waits.

    Used by the Ulysses all-to-all inside a group of U ranks, without creating a process
    group per Ulysses group (which would need every rank of the job to take part).
    """
    ops, received, nbytes, what = [], {}, 0, []
    for peer, t in sends.items():
        t = t.contiguous()
        ops.append(dist.P2POp(dist.isend, t, peer, group))
        nbytes += t.numel() * t.element_size()
        what.append(f"for rank {peer} to take its all-to-all piece ({phase})")
    for peer, like in recv_like.items():
        received[peer] = torch.empty_like(like, memory_format=torch.contiguous_format)
        ops.append(dist.P2POp(dist.irecv, received[peer], peer, group))
        what.append(f"for an all-to-all piece from rank {peer} ({phase})")
    if ops:
        Batch(dist.batch_isend_irecv(ops), what=what, device=ops[0].tensor.device).wait()
    record_sent(nbytes, phase)
    return received
