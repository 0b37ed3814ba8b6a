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

import dataclasses
import functools
from typing import Sequence

import torch
import torch.distributed as dist

from . import emulator, headers
from .accounting import record_sent
from .joined import Joined
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
        layout = _layout(tuple(specs))
        self.nbytes = layout.nbytes
        alloc = torch.zeros if zero else torch.empty
        if layout.dtype is not None:  # one dtype (K and V; fp32 accumulators): one split
            self.flat = alloc(layout.elements, dtype=layout.dtype, device=device)
            parts = self.flat.split_with_sizes(layout.parts)
            self.header = parts[0].view(torch.int64)
            self.views = tuple([parts[i].view(shape) for i, shape in layout.picks])
            return
        self.flat = flat = alloc(layout.elements, dtype=torch.uint8, device=device)
        self.header = flat[:headers.BYTES].view(torch.int64)
        self.views = tuple([flat[o:o + size].view(dtype).view(shape) for o, size, (shape, dtype)
                            in zip(layout.offsets, layout.sizes, specs)])

    @classmethod
    def like(cls, tensors: "Sequence[torch.Tensor | Joined]", *, zero: bool = False
             ) -> "Packed":
        """An uninitialised (or zero) buffer with the shapes and dtypes of ``tensors``."""
        return cls([(t.shape, t.dtype) for t in tensors], tensors[0].device, zero=zero)

    @classmethod
    def holding(cls, tensors: "Packed | Sequence[torch.Tensor | Joined]") -> "Packed":
        """``tensors`` as one buffer: as is when already packed, otherwise copied in once
        (behind the room for the header; a ``Joined`` piece by piece)."""
        if isinstance(tensors, Packed):
            return tensors
        packed = cls.like(tensors)
        for view, t in zip(packed.views, tensors):
            if isinstance(t, Joined):
                t.write(view)
            else:
                view.copy_(t)
        return packed


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where each tensor of a message sits: byte ``offsets`` and ``sizes`` behind the
    header, each view aligned to ``_ALIGN`` bytes, ``elements`` in the buffer's dtype.
    Where every tensor has one ``dtype``, the buffer is of that dtype and ``parts`` split
    it (header, then each tensor and its padding) so that one op makes every view
    (``picks``: (part, shape) of each tensor)."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    nbytes: int  # what the accounting counts: the tensors, not the header or padding
    elements: int
    dtype: torch.dtype | None
    parts: tuple[int, ...] = ()
    picks: tuple[tuple[int, torch.Size], ...] = ()


@functools.lru_cache(maxsize=512)  # by value: a call's hops repeat the same few layouts
def _layout(specs: tuple[tuple[torch.Size, torch.dtype], ...]) -> _Layout:
    """The ``_Layout`` of a message holding tensors of ``specs`` (shape, dtype)."""
    sizes = tuple(torch.Size(shape).numel() * dtype.itemsize for shape, dtype in specs)
    offsets, total = [], headers.BYTES  # the message's header comes first (headers.py)
    for size in sizes:
        offsets.append(total)
        total += -(-size // _ALIGN) * _ALIGN
    dtypes = {dtype for _, dtype in specs}
    if len(dtypes) != 1:
        return _Layout(tuple(offsets), sizes, sum(sizes), total, None)
    (dtype,) = dtypes
    parts, picks = [headers.BYTES // dtype.itemsize], []
    for (shape, _), size, start in zip(specs, sizes, offsets):
        picks.append((len(parts), torch.Size(shape)))
        parts.append(size // dtype.itemsize)
        room = -(-size // _ALIGN) * _ALIGN - size
        if room:
            parts.append(room // dtype.itemsize)
    return _Layout(tuple(offsets), sizes, sum(sizes), total // dtype.itemsize, dtype,
                   tuple(parts), tuple(picks))


class Batch:
    """The works of one posted batch and the buffers it sends.

    ``wait()`` waits once: gloo's send/receive works must not be waited on twice (a second
    wait blocks for a message that never comes), and several receives share one batch.
    The sent buffers are held until then: gloo cancels a send whose work is dropped.
    ``peers``: (verb, global rank, phase) per op, for the error of a wait that times out.
    """

    def __init__(self, works: list, sent: object = (), peers: Sequence[tuple] = (),
                 device: torch.device | None = None):
        self._works, self._sent = works, sent
        self._peers, self._device = peers, device

    def wait(self) -> None:
        if self._device is not None and self._device.type != "cpu":
            for work in self._works:  # NCCL: one work per batch; the stream waits, not us
                work.wait()
        else:  # gloo: one work per op, in op order; each wait bounded, naming its peer
            for i, work in enumerate(self._works):
                wait_bounded(work, _CPU, _waiting_for, (self._peers, i))
        self._works, self._sent = [], ()


_CPU = torch.device("cpu")


def _waiting_for(peers: Sequence[tuple], i: int) -> str:
    """What op ``i`` of a batch waits for, in words (made only when a wait needs them):
    ``peers[i]`` is (verb, global rank, what moves, phase)."""
    if i >= len(peers):
        return "for a ring hop"
    verb, rank, what, phase = peers[i]
    if verb == "send":
        return f"for rank {rank} to take a {what} ({phase})"
    return f"for a {what} from rank {rank} ({phase})"


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
        self._pg: dict[str, tuple] = {}  # device type -> _process_group, read once a pass

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
        first = sends[0][0] if sends else (recvs[0][0] if recvs else None)
        device = first.flat.device if first is not None else None
        if device is not None and device.type == "cpu":
            self._trade_headers(sends, recvs)
        check, phase = self.check, self.phase
        out, into, peers = [], [], []
        for buf, to in sends:
            if check is not None:
                check.stamp(buf.header)
            record_sent(buf.nbytes, phase)
            out.append((buf.flat, to))
            peers.append(("send", to, "ring hop", phase))
        for buf, frm in recvs:
            into.append((buf.flat, frm))
            peers.append(("recv", frm, "ring hop", phase))
        works = []
        if device is not None:
            pg = self._pg.get(device.type)
            if pg is None:
                pg = self._pg[device.type] = _process_group(self.group, device.type)
            works = post_ops(self.group, device, out, into, pg, peers)
        batch = Batch(works, sends, peers, device)
        return ([Pending(batch, buf, check, frm) for buf, frm in recvs]
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
        got = [torch.empty(5, dtype=torch.int64) for _ in recvs]
        cpu = torch.device("cpu")
        what = "ring hop's header"
        peers = [("send", to, what, self.phase) for _, to in sends] + [
            ("recv", frm, what, self.phase) for _, frm in recvs]
        works = post_ops(self.group, cpu,
                         [(torch.tensor([*words, buf.flat.nbytes]), to) for buf, to in sends],
                         [(g, frm) for g, (_, frm) in zip(got, recvs)], None, peers)
        Batch(works, peers=peers, device=cpu).wait()
        for (buf, frm), header in zip(recvs, got):  # (the rank is read only for an error)
            header = tuple(header.tolist())
            if self.check is not None and header[:4] != tuple(words):
                raise ValueError(headers.mismatch(dist.get_rank(), frm, header[:4],
                                                  tuple(words)))
            if header[4] != buf.flat.nbytes:
                raise ValueError(f"burst_attn: rank {dist.get_rank()} expects a message of "
                                 f"{buf.flat.nbytes} bytes from rank {frm} ({self.phase}), "
                                 f"which sends {header[4]}: the ranks' calls pair up wrongly "
                                 f"(other shapes)")


def post_ops(group: dist.ProcessGroup | None, device: torch.device,
             sends: Sequence[tuple[torch.Tensor, int]],
             recvs: Sequence[tuple[torch.Tensor, int]], resolved: tuple | None = None,
             peers: Sequence[tuple] = ()) -> list:
    """Post sends and receives (tensor, global rank) as one batch; returns its works.

    What ``dist.batch_isend_irecv`` does, through the process group's own calls: one
    coalesced NCCL group (sends and receives launched together, so no rank waits on a
    peer's later op), one work per op on gloo. The Python of ``batch_isend_irecv`` and
    ``P2POp`` (about 70 calls per hop, most of a small hop's host time) is skipped.
    Under the link emulator the messages go through ``batch_isend_irecv``, which it wraps.
    ``resolved``: ``_process_group(group, device.type)``, where the caller read it already.
    ``peers``: (verb, rank, what, phase) of each op: on gloo, an op that cannot be posted
    (its peer's process is gone) raises the error a wait for that peer raises.
    """
    if emulator.wraps_p2p():
        ops = [dist.P2POp(dist.isend, t, to, group) for t, to in sends] + [
            dist.P2POp(dist.irecv, t, frm, group) for t, frm in recvs]
        return dist.batch_isend_irecv(ops) if ops else []
    pg, peer, coalesce = resolved or _process_group(group, device.type)
    if coalesce:
        pg._start_coalescing(device)
        for t, to in sends:
            pg.send([t], peer[to], 0)
        for t, frm in recvs:
            pg.recv([t], peer[frm], 0)
        return [pg._end_coalescing(device)]
    works = []
    try:
        for t, to in sends:
            works.append(pg.send([t], peer[to], 0))
        for t, frm in recvs:
            works.append(pg.recv([t], peer[frm], 0))
    except RuntimeError as err:  # gloo: the peer's connection is closed
        raise RuntimeError(f"rank {dist.get_rank()} waited 0.0 s "
                           f"{_waiting_for(peers, len(works))}: that rank failed or is "
                           f"stuck") from err
    return works


_GROUPS: dict[tuple[str, str], tuple] = {}  # (group name, device type) -> _process_group


def _process_group(group: dist.ProcessGroup | None, device_type: str
                   ) -> tuple[dist.ProcessGroup, dict[int, int], bool]:
    """(the process group, global rank -> its rank in the group, whether the backend for
    ``device_type`` coalesces point-to-point ops), read once per group name and device."""
    pg = group if group is not None else dist.group.WORLD
    key = (pg.group_name, device_type)
    found = _GROUPS.get(key)
    if found is None or found[0] is not pg:  # a name reused by a new group: read again
        ranks = dist.get_process_group_ranks(pg)
        coalesce = (type(pg) is dist.ProcessGroup
                    and pg._get_backend(torch.device(device_type)).supports_coalescing)
        found = _GROUPS[key] = (pg, {r: i for i, r in enumerate(ranks)}, coalesce)
    return found
