"""``BoundPlan``: a prepared call's plan with what the loops need beside it.

The plan (``call_plan.CallPlan``: schedule, ring position, each pass's steps with their
kernel calls, hops and accumulator routes) is shared by every call of its key; a
``BoundPlan`` adds this call's process group, softmax scale, tensor format and the kernel
``prepare`` chose and checked against the plan's blocks, and makes each pass's movers
(``movers``): the payload ring and the accumulator route, over one ``PeerComm`` whose
messages carry the call's header.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import torch.distributed as dist

from ..comm.headers import CallTag, HeaderCheck
from ..comm.messages import PeerComm
from ..comm.rings import AccumulatorRoute, PayloadRing, RowShape
from ..comm.ring_positions import RingPositions
from ..kernels.protocol import HALF, LocalAttention
from ..kernels.varlen import KernelLaunch
from ..plan.schedule import Block
from .call_plan import CallPlan, PassPlan


@dataclasses.dataclass(frozen=True)
class BoundPlan:
    """Everything the ring loops need besides tensors (resolved and validated)."""

    group: dist.ProcessGroup | None
    plan: CallPlan
    scale: float
    seq_first: bool  # tensors are [s, b, h, d]
    kernel: LocalAttention  # chosen and checked by ``prepare``
    # This call's boundaries, where the GPU reads the documents (``device_calls``): the
    # plan's device launches are bound to them once a call (``_launches``), for every pass.
    boundaries: torch.Tensor | None = None
    # Whether the ring passes replay from CUDA graphs once their work repeated (``replay``).
    replay: bool = False

    def with_boundaries(self, cu_seqlens: torch.Tensor) -> "BoundPlan":
        """This plan bound to one call's boundaries (``layout='pack_zigzag'``): its launches'
        boundaries made on the boundaries' device, nothing read on the host.

        Where the passes may replay, the launches are bound only if a pass runs eagerly: a
        replayed pass binds the boundaries inside its graph, so binding them here too would
        be some fifteen launches a call for nothing. The boundaries are then kept as this
        call saw them (a copy on the device): a backward that binds or replays later must
        not read what the caller has written into ``cu_seqlens`` since."""
        if self.replay:
            return dataclasses.replace(self, boundaries=cu_seqlens.clone())
        bound = dataclasses.replace(self, boundaries=cu_seqlens)
        bound._launches  # noqa: B018  (bound now, as the forward runs: the same reason)
        return bound

    @functools.cached_property
    def _launches(self) -> tuple:
        return self.plan.sides.bind(self.boundaries)

    def launch(self, call: KernelLaunch):
        """The kernel call as the kernels run it: a device launch bound to this call's
        boundaries, any other call as it is."""
        return call if self.boundaries is None else self._launches[call.index]

    @property
    def topo(self) -> RingPositions | None:
        """This rank's ring (None: a single member, nothing to send)."""
        return self.plan.topo

    @property
    def backward(self) -> str:
        """The backward ring's mode, 'burst' or 'ring' ('auto' resolved)."""
        return self.plan.key.backward

    @property
    def whole(self) -> Block | KernelLaunch | None:
        """A single member's whole attention as one kernel call, when it is one."""
        return self.plan.whole

    @property
    def row_dim(self) -> int:
        """The sequence dimension of q, k, v, out in the caller's format (``qkv_format``)."""
        return 0 if self.seq_first else 1

    def bshd(self, t: torch.Tensor) -> torch.Tensor:
        """The tensor seen as [b, s, h, d] (a view, never a copy; its own inverse)."""
        return t.transpose(0, 1) if self.seq_first else t

    def movers(self, plan: PassPlan, payload: tuple[torch.Tensor, ...],
               acc_dtype: torch.dtype | None, phase: str, tag: CallTag | None,
               acc_like: tuple[torch.Tensor, ...] | None = None
               ) -> tuple[PayloadRing | None, AccumulatorRoute | None]:
        """The pass's payload ring and (with ``acc_dtype``) the route of its travelling
        accumulators, shaped like ``acc_like`` (default: the payload) in ``acc_dtype``;
        (None, None) where the pass moves nothing. The payload's [b, h, s] tensors (lse,
        delta) travel by their last dim, the others by the sequence dim."""
        if not plan.travels:
            return None, None
        rows = self.row_dim
        check = None
        if tag is not None:
            check = HeaderCheck(tag, phase, payload[0].device, self.plan.key.ring.me,
                                plan.receives)
        comm = PeerComm(self.group, phase, check)
        if len(payload) == 2:  # K and V
            shape = RowShape((payload[0].shape, payload[1].shape),
                             (payload[0].dtype, payload[1].dtype), (rows, rows),
                             payload[0].device)
        else:  # Q, dO, and lse and delta ([b, h, s]: their rows are the last dim)
            shape = RowShape.of(payload, [rows if t.dim() == 4 else 2 for t in payload])
        ring = PayloadRing(comm, shape)
        if acc_dtype is None:
            return ring, None
        like = acc_like if acc_like is not None else payload

        def shape(narrow: bool) -> RowShape:  # ``PassPlan.wire``: one partial, own dtype
            return RowShape(tuple([t.shape for t in like]),
                            tuple([t.dtype if narrow and t.dtype in HALF else acc_dtype
                                   for t in like]), (rows,) * len(like), like[0].device)

        return ring, AccumulatorRoute(comm, shape(plan.wire[0]), shape(plan.wire[1]))
