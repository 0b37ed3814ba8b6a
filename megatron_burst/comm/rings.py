"""Payload rings and gradient-accumulator routes over a ``RingTopology``.

``PayloadRing`` / ``AccumulatorRoute`` move payloads (K/V; Q with dO, lse and delta) and
their gradient accumulators round a flat or double ring (``ring_positions.py``), each hop cut to
the rows its receiver uses (``RowShape``), so the attention loops never see the topology.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from .messages import Packed, Pending, PeerComm
from .ring_positions import RingTopology, Rows, payload_hops


@dataclasses.dataclass(frozen=True)
class RowShape:
    """Shapes and dtypes of a payload's tensors, each cut to its first rows along its row
    dimension: how a hop knows the size of what it receives without asking."""

    shapes: tuple[torch.Size, ...]
    dtypes: tuple[torch.dtype, ...]
    row_dims: tuple[int, ...]
    device: torch.device

    @staticmethod
    def of(tensors: Sequence[torch.Tensor], row_dims: Sequence[int]) -> "RowShape":
        return RowShape(tuple(t.shape for t in tensors), tuple(t.dtype for t in tensors),
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


class PayloadRing:
    """Moves a payload (K/V, or Q with dO/lse/delta) so position p holds source(p, s) at s.

    Each hop carries only the leading rows its receiver will still use (``rows``, from the
    schedule): nothing for a step no one needs, and for packed documents kept whole on one
    rank, never their rows. Within a node the payload hops to the next position every step;
    at the first step of each round it is also sent to the same position of the next node,
    and that inter-node transfer has the whole round of L-1 intra-node steps to complete.
    """

    def __init__(self, topo: RingTopology, comm: PeerComm, row_shape: RowShape, rows: Rows):
        self.topo, self.comm, self.row_shape, self.rows = topo, comm, row_shape, rows
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
                recvs.append((self.row_shape.packed(n_recv), self.topo.rank(frm)))
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
                and self.row_shape.rows_of(held.views) == rows):
            return held  # received by this ring, all of it still needed: send on as is
        return Packed.holding(self.row_shape.cut(payload, rows))  # cut and packed: one copy

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

    def __init__(self, topo: RingTopology, comm: PeerComm, row_shape: RowShape, rows: Rows):
        self.topo, self.comm, self.row_shape, self.rows = topo, comm, row_shape, rows

    def used(self, origin: int, step: int) -> int:
        return self.rows(origin, step) if step < self.topo.size else 0

    def new(self, origin: int, step: int) -> Packed | None:
        """A zero accumulator for ``origin``'s travelling rows, if this position holds that
        payload at ``step`` (None: it does not, or the payload never travels)."""
        rows = self.used(origin, 1)
        return self.row_shape.packed(rows, zero=True) if rows and self.used(origin, step) else None

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
            recvs.append((self.row_shape.packed(self.used(nxt, 1)),
                          topo.rank(topo.holder(nxt, step))))
            kinds.append("forward")
        if self.used(p, step) and not self.used(p, step + 1):  # the last use of our payload
            recvs.append((self.row_shape.packed(self.used(p, 1)),
                          topo.rank(topo.holder(p, step))))
            kinds.append("home")
        pending = self.comm.post(sends, recvs)
        got = dict(zip(kinds, pending))
        return got.get("forward"), got.get("home"), pending[0]
