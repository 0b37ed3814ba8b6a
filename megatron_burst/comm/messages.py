"""Messages and their posting: one buffer per hop, every hop of a step in one batch.

This layer moves lists of tensors between ranks asynchronously, each hop as one message
(``Packed``), so the caller can compute while the transfer is in flight; every message
starts with its header (``headers.py``), and every byte sent is counted (``accounting``).

Every rank posts its send and its receive in one ``batch_isend_irecv`` call, in the same
order on every rank: no rank can wait on a peer that is itself waiting (the classic P2P
ring hang, Megatron-LM #1151, ring-flash-attention #39).

On CUDA the transfers run on NCCL's own streams; ``Pending.wait()`` makes the current
stream wait for them without blocking the host, so the kernels queued before it overlap
the transfer. On CPU (gloo) each wait is bounded (``waits.wait_bounded``), and a pass's
first hop between two ranks first trades its header with the message's size as a small
message of its own: gloo ends the receiving process (``std::terminate``, no Python error)
when a message is longer than the buffer posted for it, so calls that pair wrongly must be
caught before a payload moves. Once two ranks' headers matched, their calls (signature and
all) are the same, so every later message between them in the pass has the size expected.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from . import headers
from .accounting import record_sent
from .waits import wait_bounded

_ALIGN = 16  # bytes: every view in a Packed buffer starts aligned for any dtype


class Packed:
    """Several tensors (any shapes and dtypes) laid out in one byte buffer: one message.

    Why: NCCL runs the messages of one ``batch_isend_irecv`` to the same peer one after the
    other. On 8 H200 a hop of K and V as two 67 MB tensors takes 1.0 ms, as one 134 MB
    buffer 0.57 ms (benchmarks/results/h200x8_p2p_default.json). So a hop (K/V; Q, dO,
    lse, delta; dK/dV) is always one buffer. ``views`` are the tensors, living inside ``flat``.
    """

    def __init__(self, specs: Sequence[tuple[torch.Size, torch.dtype]], device: torch.device,
                 *, zero: bool = False):
        sizes = [torch.Size(shape).numel() * dtype.itemsize for shape, dtype in specs]
        offsets, total = [], headers.BYTES  # the message's header comes first (headers.py)
        for size in sizes:
            offsets.append(total)
            total += -(-size // _ALIGN) * _ALIGN
        self.flat = (torch.zeros if zero else torch.empty)(total, dtype=torch.uint8,
                                                           device=device)
        self.header = self.flat[:headers.BYTES].view(torch.int64)
        self.nbytes = sum(sizes)  # what the accounting counts: the tensors, not the padding
        self.views = tuple(self.flat[o:o + size].view(dtype).view(shape)
                           for o, size, (shape, dtype) in zip(offsets, sizes, specs))

    @classmethod
    def like(cls, tensors: Sequence[torch.Tensor], *, zero: bool = False) -> "Packed":
        """An uninitialised (or zero) buffer with the shapes and dtypes of ``tensors``."""
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

    def __init__(self, batch: Batch, received: Packed | None,
                 check: "headers.HeaderCheck | None" = None, sender: int = -1):
        self._batch = batch
        self.received = received  # the Packed buffer, so it can be sent on without a copy
        self._check, self._sender = check, sender

    def wait(self) -> list[torch.Tensor]:
        self._batch.wait()
        received = self.received
        if received is None:
            return []
        if self._check is not None:
            self._check.received(received.header, self._sender)
            self._check = None  # several waits on one hop check it once
        return list(received.views)


class PeerComm:
    """Posts point-to-point hops among the ranks of ``group`` (global ids), one message
    per direction per hop."""

    def __init__(self, group: dist.ProcessGroup | None, phase: str = "forward",
                 check: "headers.HeaderCheck | None" = None):
        self.group = group
        self.phase = phase
        self.check = check  # stamps what is sent, checks what arrives (None: untagged)
        self._traded: set[tuple[str, int]] = set()  # gloo: peers whose header this pass saw

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
        if (sends or recvs) and (sends or recvs)[0][0].flat.device.type == "cpu":
            self._trade_headers(sends, recvs)
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

    def _trade_headers(self, sends: Sequence[tuple[Packed, int]],
                       recvs: Sequence[tuple[Packed, int]]) -> None:
        """gloo: the pass's first hop to or from each peer sends its header and size as a
        message of its own, checked before the payload is posted; a mismatch raises
        ValueError here instead of ending the process."""
        sends = [(buf, to) for buf, to in sends if ("to", to) not in self._traded]
        recvs = [(buf, frm) for buf, frm in recvs if ("from", frm) not in self._traded]
        if not sends and not recvs:
            return
        self._traded.update([("to", to) for _, to in sends] + [("from", f) for _, f in recvs])
        words = self.check.tag.words(self.phase) if self.check is not None else (0, 0, 0, 0)
        ops, got, what = [], [], []
        for buf, to in sends:
            ops.append(dist.P2POp(dist.isend, torch.tensor([*words, buf.flat.numel()]), to,
                                  self.group))
            what.append(f"for rank {to} to take a ring hop's header ({self.phase})")
        for buf, frm in recvs:
            got.append(torch.empty(5, dtype=torch.int64))
            ops.append(dist.P2POp(dist.irecv, got[-1], frm, self.group))
            what.append(f"for a ring hop's header from rank {frm} ({self.phase})")
        Batch(dist.batch_isend_irecv(ops), what=what).wait()
        rank = dist.get_rank()
        for (buf, frm), header in zip(recvs, got):
            header = tuple(header.tolist())
            if self.check is not None and header[:4] != tuple(words):
                raise ValueError(headers.mismatch(rank, frm, header[:4], tuple(words)))
            if header[4] != buf.flat.numel():
                raise ValueError(f"burst_attn: rank {rank} expects a message of {buf.flat.numel()} "
                                 f"bytes from rank {frm} ({self.phase}), which sends "
                                 f"{header[4]}: the ranks' calls pair up wrongly (other shapes)")
