"""``RingSpec``: everything a call's ring loops need besides its tensors, and its plans.

The schedule (``schedule.RingSchedule``) says which blocks each member computes at each
step; a ``RingSpec`` adds the call's ring (topology and position), its scale, backward mode
and message tag, and turns the schedule into what the loops run: the kernel calls of each
pair of members, with their boundaries already on the device (``calls``, planned once per
schedule; ``prepare`` plans a document pack's before the call's first collective: its split
documents' blocks, and the whole ones from arrays, ``pack_calls``), and the
payload and accumulator movers of each pass (``movers``). Its kernel is chosen and checked
against its blocks by ``prepare`` (``kernels.selection.choose_kernel``).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from ..comm.headers import CallTag, HeaderCheck
from ..comm.messages import PeerComm
from ..comm.rings import AccumulatorRoute, PayloadRing, RowShape
from ..comm.ring_positions import RingTopology
from ..kernels.protocol import LocalAttention
from ..plan.schedule import Block, RingSchedule
from ..plan.placement import local_length
from ..kernels.pack_calls import with_whole
from ..kernels.varlen import KernelCall, covers, plan_alone, plan_calls, upload_boundaries


@dataclasses.dataclass(frozen=True)
class RingSpec:
    """Everything the ring loops need besides tensors (resolved and validated)."""

    group: dist.ProcessGroup | None
    topo: RingTopology | None  # None: a single member, nothing to send
    sched: RingSchedule
    scale: float
    backward: str  # 'burst' or 'ring' (auto already resolved)
    seq_first: bool  # tensors are [s, b, h, d]
    kernel: LocalAttention | None = None  # chosen and checked by ``prepare``
    # False for document packs: their block sizes change with every batch, so every block
    # goes to a kernel that builds nothing per shape (varlen.plan_calls, ``shape_free``).
    fixed_shapes: bool = True
    tag: CallTag | None = None  # what this call's ring messages say they belong to
    # A single member's whole attention when it is one kernel call over every row and key:
    # a dense block (``whole_block``) or a pack's one varlen call (``whole_call``); then a
    # pass is that call and nothing else (set by ``prepare``).
    whole: "Block | KernelCall | None" = None

    @property
    def me(self) -> int:
        return self.topo.index if self.topo is not None else 0

    @property
    def row_dim(self) -> int:
        """The sequence dimension of q, k, v, out in the caller's format (``qkv_format``)."""
        return 0 if self.seq_first else 1

    @property
    def last_step(self) -> int:
        if self.topo is None:
            return 0
        return self.sched.memo(("last step", self.topo.intra, self.topo.direction),
                               lambda: self.sched.last_step(self.topo.source))

    def needed_rows(self, reverse: bool) -> tuple[tuple[int, ...], ...]:
        """The schedule's row table for this ring run forward (keys) or in reverse (queries),
        built once per ring shape: every layer and pass of a call asks for it."""
        topo, side = self.ring(reverse), "q" if reverse else "k"
        return self.sched.memo(("rows", topo.intra, topo.direction, side),
                               lambda: self.sched.needed_rows(topo.source, side))

    def ring(self, reverse: bool = False) -> RingTopology:
        return self.topo.reversed() if reverse else self.topo

    def source(self, step: int, reverse: bool = False) -> int:
        if self.topo is None:
            return self.me
        return self.ring(reverse).source(self.me, step)

    def bshd(self, t: torch.Tensor) -> torch.Tensor:
        """The tensor seen as [b, s, h, d] (a view, never a copy; its own inverse)."""
        return t.transpose(0, 1) if self.seq_first else t

    def calls(self, q_member: int, k_member: int, batch: int,
              device: torch.device) -> tuple[KernelCall, ...]:
        """The kernel calls of ``q_member``'s queries against ``k_member``'s keys, with their
        boundaries already on ``device`` (planned and copied once per schedule)."""
        varlen = batch == 1  # packed documents are one row; a batch runs block by block
        area = self._dense_min_area()
        key = ("calls", q_member, k_member, varlen, area)

        def plan():
            if self.alone:  # CP=1 documents: one varlen call from the boundaries
                calls = plan_alone(self.sched.doc_lens, self.sched.mask)
            elif self.fixed_shapes or not varlen:
                calls = plan_calls(self.sched.blocks(q_member, k_member), varlen=varlen,
                                   dense_min_area=area, shape_free=not self.fixed_shapes)
            else:  # a pack: the split documents' blocks, the whole ones from arrays
                calls = plan_calls(self.sched.split_blocks(q_member, k_member), varlen=True,
                                   dense_min_area=area, shape_free=True)
                if q_member == k_member:
                    calls = with_whole(calls, self.sched.shard(q_member), self.sched.mask)
            upload_boundaries(calls, device)
            return calls
        return self.sched.memo(key, plan)

    def _dense_min_area(self) -> float | None:
        """The kernel's dense threshold; None for a pack's shape-free plans, which do not
        depend on the kernel."""
        return None if not self.fixed_shapes else self.kernel.dense_min_area

    def pairs(self, backward: bool) -> tuple[tuple[int, int], ...]:
        """(query member, key member) of every block this rank computes: its queries
        against each step's keys, and with the burst ``backward`` each visitor's queries
        against its keys."""
        pairs = {(self.me, self.source(step)) for step in range(self.last_step + 1)}
        if backward and self.backward == "burst" and self.topo is not None:
            pairs |= {(self.source(step, reverse=True), self.me)
                      for step in range(self.last_step + 1)}
        return tuple(sorted(pairs))

    def plan(self, pairs: tuple[tuple[int, int], ...], device: torch.device) -> None:
        """Plan a document pack's kernel calls for ``pairs`` now: pure host work, done before
        the call's first collective so that it overlaps the GPU's queued work instead of
        following a synchronisation. A plain sequence's plans are made at its first call
        and cached with its shape."""
        if self.fixed_shapes:
            return
        for q_member, k_member in pairs:
            self.calls(q_member, k_member, 1, device)

    def fresh_at_step0(self, batch: int, q_rows: int, k_rows: int,
                       device: torch.device) -> tuple[bool, bool]:
        """Whether step 0 (a member against its own keys) writes every query row, and
        every key row, exactly once: then the accumulators start uninitialised and step 0
        writes into them (most of the work with documents kept whole, all of it on one
        rank, and the diagonal of a plain sequence)."""
        calls = self.calls(self.me, self.me, batch, device)
        return self.sched.memo(
            ("fresh", self.me, batch == 1, self._dense_min_area(), q_rows, k_rows),
            lambda: (covers(calls, q_rows, "q"), covers(calls, k_rows, "k")))

    def movers(self, payload, row_dims, accumulators, phase: str, reverse: bool = False
               ) -> tuple[PayloadRing | None, AccumulatorRoute | None]:
        """Payload and accumulator movers (``reverse``: the ring run the other way, moving
        queries; their rows are the schedule's query side)."""
        if self.topo is None:
            return None, None
        topo = self.ring(reverse)
        table = self.needed_rows(reverse)
        rows = lambda origin, step: table[origin][step]  # noqa: E731
        check = None
        if self.tag is not None:
            check = HeaderCheck(self.tag, phase, payload[0].device, topo.rank(topo.index))
        comm = PeerComm(self.group, phase, check)
        return (PayloadRing(topo, comm, RowShape.of(payload, row_dims), rows),
                AccumulatorRoute(topo, comm, accumulators, rows))

    def accumulators(self, like: tuple[torch.Tensor, ...], dtype: torch.dtype) -> RowShape:
        """The row shape of travelling fp32 gradient accumulators shaped like ``like``."""
        return RowShape(tuple(t.shape for t in like), (dtype,) * len(like),
                        (self.row_dim,) * len(like), like[0].device)

    @property
    def alone(self) -> bool:
        """A pack on a single member whose rows are its documents in order, unpadded: its
        plan needs no blocks (``varlen.plan_alone``)."""
        s = self.sched
        return (self.topo is None and not self.fixed_shapes and s.ulysses == 1
                and local_length(s.layout, s.world, s.doc_lens) == sum(s.doc_lens))

    def whole_call(self, rows: int, device: torch.device) -> KernelCall | None:
        """A single member's pack planned as one varlen call over all ``rows`` queries and
        keys (``alone``), if it is one: its kernel output is then the answer."""
        if not self.alone:
            return None
        calls = self.calls(self.me, self.me, 1, device)
        if len(calls) != 1 or not calls[0].varlen:
            return None
        call = calls[0]
        return call if call.q_runs == call.k_runs == ((0, rows),) else None

    def whole_block(self, q_len: int, k_len: int) -> Block | None:
        """The block when this rank's attention is one kernel call over all its rows and keys.

        That is a single member (CP=1, or TP-only runs that keep the burst layer) without
        padding or documents. Then the kernel's own output and gradients are the answer: no
        fp32 accumulators, merges or casts (with them one GPU ran at 0.92-0.94 of the kernel
        alone at 32K tokens: the one-GPU rows of benchmarks/results/h200x1_attention.md), and
        no row is without a key (the lse needs no mending for the backward).
        """
        if self.topo is not None or not self.fixed_shapes:
            return None
        blocks = self.sched.blocks(self.me, self.me)
        if len(blocks) != 1:
            return None
        blk = blocks[0]
        covers = (blk.q_start, blk.q_stop, blk.k_start, blk.k_stop) == (0, q_len, 0, k_len)
        return blk if covers else None
