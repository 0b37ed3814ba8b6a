"""Payload rings and gradient-accumulator routes that follow a route planned beforehand.

``PayloadRing`` / ``AccumulatorRoute`` move payloads (K/V; Q with dO, lse and delta) and
their gradient accumulators round a flat or double ring. Where each hop goes and how many
rows it carries is data made once per call plan (``ring_positions.route_hops`` and
``accumulator_steps``, from the schedule's row tables), so a step here only allocates,
packs and posts: no arithmetic on positions, no questions about the schedule.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from .messages import Packed, Pending, PeerComm
from .ring_positions import AccumulatorStep, Hop


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

    def cut(self, tensors: Sequence[torch.Tensor], rows: int, start: int = 0
            ) -> list[torch.Tensor]:
        """Views of ``rows`` rows of each tensor, from row ``start``."""
        return [t.narrow(d, start, rows) for t, d in zip(tensors, self.row_dims)]

    def gathered(self, tensors: Sequence[torch.Tensor], runs: Sequence[tuple[int, int]]
                 ) -> Packed:
        """One buffer of the ``runs`` ([start, stop) rows) of each tensor, one after the
        other (a window's two edges, ``plan.runs``): one copy."""
        out = self.packed(sum(z - a for a, z in runs))
        for dst, t, d in zip(out.views, tensors, self.row_dims):
            # one op a tensor writes every run (a copy a run was 3 ops: ~30 us of host on
            # a slow host, a forward's edges four of them)
            torch.cat([t.narrow(d, a, z - a) for a, z in runs], d, out=dst)
        return out

    def rows_of(self, tensors: Sequence[torch.Tensor]) -> int:
        return tensors[0].shape[self.row_dims[0]]


class PayloadRing:
    """Moves a payload so that each position holds, at each step, the payload its route
    says: ``post(hops, payload)`` starts the step's hops (``ring_positions.Hop``: each
    carries only the span of rows its receiver still uses, nothing for a step no one
    needs); ``next(kind)`` waits for the one that brings the next step's payload.

    Within a node the payload hops to the next position every step; at the first step of
    each round it also goes to the same position of the next node, and that inter-node
    transfer has the whole round of L-1 intra-node steps to complete.
    """

    def __init__(self, comm: PeerComm, row_shape: RowShape):
        self.comm, self.row_shape = comm, row_shape
        self._pending: dict[str, Pending] = {}
        self._held: Packed | None = None  # the buffer the last next() handed out
        self._outgoing: Pending | None = None

    def post(self, hops: Sequence[Hop], payload: Sequence[torch.Tensor] | None) -> None:
        """Start this step's hops (``payload``: what this position holds now)."""
        sends, recvs, kinds = [], [], []
        for hop in hops:
            if hop.n_send:
                sends.append((self.row_shape.gathered(payload, hop.send_runs) if hop.send_runs
                              else self._pack(payload, hop.send_from, hop.n_send), hop.to))
            if hop.n_recv:
                recvs.append((self.row_shape.packed(hop.n_recv), hop.frm))
                kinds.append(hop.kind)
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

    def _pack(self, payload: Sequence[torch.Tensor], start: int, rows: int) -> Packed:
        held = self._held
        if (held is not None and start == 0 and all(a is b for a, b in zip(payload, held.views))
                and self.row_shape.rows_of(held.views) == rows):
            return held  # received by this ring, all of it still needed: send on as is
        # cut and packed: one copy
        return Packed.holding(self.row_shape.cut(payload, rows, start))

    def next(self, kind: str) -> tuple[torch.Tensor, ...] | None:
        """The payload the ``kind`` hop brings for the next step (waits for its transfer);
        None when nothing of it is used."""
        pending = self._pending.pop(kind, None)
        if pending is None:
            self._held = None
            return None
        views = pending.wait()
        self._held = pending.received
        return tuple(views) if views else None


class AccumulatorRoute:
    """Sends gradient accumulators after the payload they belong to, and home, as each
    step's ``ring_positions.AccumulatorStep`` says. ``home_shape``: the accumulator that
    comes home, where its dtype differs from the held ones' (``call_plan.PassPlan.wire``)."""

    def __init__(self, comm: PeerComm, row_shape: RowShape, home_shape: RowShape | None = None):
        self.comm, self.row_shape = comm, row_shape
        self.home_shape = home_shape if home_shape is not None else row_shape

    def new(self, step: AccumulatorStep, zero: bool = True) -> Packed | None:
        """An accumulator for the travelling rows of the payload held at this step: zeros,
        or uninitialised (``zero=False``) where the step's gradients write every row."""
        return self.row_shape.packed(step.new_rows, zero=zero) if step.new_rows else None

    def pass_on(self, step: AccumulatorStep, acc: Packed | None
                ) -> tuple[Pending | None, Pending | None, Pending]:
        """Send the held accumulator ``acc`` on (or home), and post the receives.

        Returns (the accumulator of the payload held next step, as its holder now passes
        it; this position's own, when it comes home now; the batch, to wait on before the
        sent accumulator may be reused)."""
        sends, recvs, kinds = [], [], []
        if acc is not None:
            sends.append((acc, step.send_to))
        if step.recv_next is not None:
            rows, frm = step.recv_next
            recvs.append((self.row_shape.packed(rows), frm))
            kinds.append("next")
        if step.recv_home is not None:
            rows, frm = step.recv_home
            recvs.append((self.home_shape.packed(rows), frm))
            kinds.append("home")
        pending = self.comm.post(sends, recvs)
        got = dict(zip(kinds, pending))
        return got.get("next"), got.get("home"), pending[0]
