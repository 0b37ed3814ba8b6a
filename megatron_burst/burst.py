"""BurstAttention: the forward ring with online-softmax merge and the two backward rings.

One ring loop per pass. Masks and layouts enter only through the schedule, which says
which blocks to compute at each step (grouped into kernel calls by ``varlen.plan_calls``)
and how many rows of each payload a hop must carry; the loops never branch on them.

Forward: Q stays home; K/V go round the ring (the next hop in flight while this step
computes); each block's (out, lse) is merged into fp32 accumulators.

Backward, two modes (``cost.py`` has their byte counts; ``options.resolve`` resolves
``backward="auto"``):
- ``burst`` (the paper): K, V, dK, dV stay home. (Q, dO, lse, delta) travel; the dQ of the
  queries being visited travels one step behind on a second ring and lands home last.
- ``ring``: Q, dO, O, lse stay home. K/V travel again, and their dK/dV accumulators travel
  one step behind them, landing home last.
Gradients of a rank's own payload at step 0 never leave home; the travelling accumulators
carry only the rows other ranks touch. All gradient accumulators are fp32, on the wire
too, so the error does not grow with G.
"""
from __future__ import annotations

import dataclasses
import gc

import torch
import torch.distributed as dist

from .comm import headers
from .comm.headers import CallTag, HeaderCheck
from .comm.messages import PeerComm
from .comm.rings import AccumulatorRoute, PayloadRing, RowLayout
from .comm.topology import RingTopology
from .kernels.protocol import LocalAttention, surrogate_out
from .kernels.selection import select_kernel
from .schedule import Block, RingSchedule
from .varlen import (KernelCall, covers, plan_calls, run_backward, run_forward,
                     upload_boundaries)


@dataclasses.dataclass(frozen=True)
class RingSpec:
    """Everything the ring loops need besides tensors (resolved and validated)."""

    group: dist.ProcessGroup | None
    topo: RingTopology | None  # None: a single member, nothing to send
    sched: RingSchedule
    scale: float
    backward: str  # 'burst' or 'ring' (auto already resolved)
    seq_first: bool  # tensors are [s, b, h, d]
    kernel: str | None = None  # force a LocalAttention backend by name (tests, benchmarks)
    # False for document packs: their block sizes change with every batch, so every block
    # goes to a kernel that builds nothing per shape (varlen.plan_calls, ``shape_free``).
    fixed_shapes: bool = True
    tag: CallTag | None = None  # what this call's ring messages say they belong to

    @property
    def me(self) -> int:
        return self.topo.index if self.topo is not None else 0

    @property
    def row_dim(self) -> int:
        """The sequence dimension of q, k, v, out in the caller's layout."""
        return 0 if self.seq_first else 1

    @property
    def last_step(self) -> int:
        return 0 if self.topo is None else self.sched.last_step(self.topo.source)

    def ring(self, reverse: bool = False) -> RingTopology:
        return self.topo.reversed() if reverse else self.topo

    def source(self, step: int, reverse: bool = False) -> int:
        if self.topo is None:
            return self.me
        return self.ring(reverse).source(self.me, step)

    def bshd(self, t: torch.Tensor) -> torch.Tensor:
        """The tensor seen as [b, s, h, d] (a view, never a copy; its own inverse)."""
        return t.transpose(0, 1) if self.seq_first else t

    def calls(self, q_member: int, k_member: int, kernel: LocalAttention,
              batch: int, device: torch.device) -> tuple[KernelCall, ...]:
        """The kernel calls of ``q_member``'s queries against ``k_member``'s keys, with their
        boundaries already on ``device`` (planned and copied once per schedule)."""
        varlen = batch == 1  # packed documents are one row; a batch runs block by block
        area = self._dense_min_area(kernel)
        key = ("calls", q_member, k_member, varlen, area)

        def plan():
            calls = plan_calls(self.sched.blocks(q_member, k_member), varlen=varlen,
                               dense_min_area=area, shape_free=not self.fixed_shapes)
            upload_boundaries(calls, device)
            return calls
        return self.sched.memo(key, plan)

    def _dense_min_area(self, kernel: LocalAttention | None) -> float | None:
        """The kernel's dense threshold; None for a pack's shape-free plans, which do not
        depend on the kernel (so ``prepare`` can make them before it is chosen)."""
        return None if not self.fixed_shapes else kernel.dense_min_area

    def prepare(self, device: torch.device, backward: bool) -> None:
        """Plan a document pack's kernel calls now, for the forward and (``backward``) the
        backward pass: pure host work, done before the call's first collective so that it
        overlaps the GPU's queued work instead of following a synchronisation. A plain
        sequence's plans are made at its first call and cached with its shape."""
        if self.fixed_shapes:
            return
        # Planning makes a few small objects per document. In a process that holds a model,
        # the garbage collector's passes over its whole heap, which those allocations
        # trigger, cost several times the planning itself (20 ms instead of 2 for a pack of
        # 500 documents, on H200 hosts); none of these objects forms a cycle.
        collecting = gc.isenabled()
        gc.disable()
        try:
            pairs = {(self.me, self.source(step)) for step in range(self.last_step + 1)}
            if backward and self.backward == "burst" and self.topo is not None:
                pairs |= {(self.source(step, reverse=True), self.me)
                          for step in range(self.last_step + 1)}
            for q_member, k_member in sorted(pairs):
                self.calls(q_member, k_member, None, 1, device)
        finally:
            if collecting:
                gc.enable()

    def fresh_at_step0(self, kernel: LocalAttention, batch: int, q_rows: int,
                       k_rows: int, device: torch.device) -> tuple[bool, bool]:
        """Whether step 0 (a member against its own keys) writes every query row, and
        every key row, exactly once: then the accumulators start uninitialised and step 0
        writes into them (most of the work with documents kept whole, all of it on one
        rank, and the diagonal of a plain sequence)."""
        calls = self.calls(self.me, self.me, kernel, batch, device)
        return self.sched.memo(
            ("fresh", self.me, batch == 1, self._dense_min_area(kernel), q_rows, k_rows),
            lambda: (covers(calls, q_rows, "q"), covers(calls, k_rows, "k")))

    def movers(self, payload, row_dims, accumulators, phase: str, reverse: bool = False
               ) -> tuple[PayloadRing | None, AccumulatorRoute | None]:
        """Payload and accumulator movers (``reverse``: the ring run the other way, moving
        queries; their rows are the schedule's query side)."""
        if self.topo is None:
            return None, None
        topo = self.ring(reverse)
        table = self.sched.needed_rows(topo.source, "q" if reverse else "k")
        rows = lambda origin, step: table[origin][step]  # noqa: E731
        check = None
        if self.tag is not None:
            check = HeaderCheck(self.tag, phase, payload[0].device, topo.rank(topo.index))
        comm = PeerComm(self.group, phase, check)
        return (PayloadRing(topo, comm, RowLayout.of(payload, row_dims), rows),
                AccumulatorRoute(topo, comm, accumulators, rows))

    def accumulators(self, like: tuple[torch.Tensor, ...], dtype: torch.dtype) -> RowLayout:
        """The layout of travelling fp32 gradient accumulators shaped like ``like``."""
        return RowLayout(tuple(t.shape for t in like), (dtype,) * len(like),
                         (self.row_dim,) * len(like), like[0].device)

    def whole_block(self, q_len: int, k_len: int) -> Block | None:
        """The block when this rank's attention is one kernel call over all its rows and keys.

        That is a single member (CP=1, or TP-only runs that keep the burst layer) without
        padding or documents. Then the kernel's own output and gradients are the answer: no
        fp32 accumulators, merges or casts (they cost ~6% of the kernel at 32K tokens).
        """
        if self.topo is not None:
            return None
        blocks = list(self.sched.blocks(self.me, self.me))
        if len(blocks) != 1:
            return None
        blk = blocks[0]
        covers = (blk.q_start, blk.q_stop, blk.k_start, blk.k_stop) == (0, q_len, 0, k_len)
        return blk if covers else None


def ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: RingSpec,
                 kernel: LocalAttention) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward ring. Returns (out in q's dtype and layout, lse [b, hq, s] fp32)."""
    qb = spec.bshd(q)
    b, s, hq, _ = qb.shape
    acc = _acc_dtype(q)
    whole = spec.whole_block(s, spec.bshd(k).shape[1])
    if whole is not None:
        o, o_lse = kernel.forward(qb, spec.bshd(k), spec.bshd(v), whole, spec.scale)
        return spec.bshd(o).contiguous(), o_lse.to(acc)
    fresh, _ = spec.fresh_at_step0(kernel, b, s, spec.bshd(k).shape[1], q.device)
    out = _accumulator(q.shape, acc, q.device, fresh)
    out_b = spec.bshd(out)
    lse = torch.empty((b, hq, s), dtype=acc, device=q.device)
    if not fresh:
        lse.fill_(float("-inf"))
    ring, _ = spec.movers((k, v), (spec.row_dim,) * 2, None, "forward")
    kv, last = (k, v), spec.last_step
    for step in range(last + 1):
        if ring is not None:
            ring.post(step, kv)
        if kv is not None:  # None: nothing of this step's keys is used here
            kb, vb = spec.bshd(kv[0]), spec.bshd(kv[1])
            for call in spec.calls(spec.me, spec.source(step), kernel, b, q.device):
                run_forward(kernel, call, qb, kb, vb, out_b, lse, spec.scale,
                            fresh=fresh and step == 0)
        if step < last:
            kv = ring.next(step)
    if ring is not None:
        ring.finish()
        ring.comm.finish()
    return out.to(q.dtype), lse


def _accumulator(shape, dtype, device, fresh: bool) -> torch.Tensor:
    """Uninitialised when step 0 writes every row (``fresh``), else zeros."""
    return (torch.empty if fresh else torch.zeros)(shape, dtype=dtype, device=device)


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    """Accumulators are fp32, or fp64 for fp64 inputs (so tests can check to 1e-12)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _backward_lse(lse: torch.Tensor) -> torch.Tensor:
    """lse for the backward kernels: rows that saw no key get 0 instead of -inf.

    Such rows (padding) are in no block, so the value never reaches a kernel as a real
    normaliser; 0 keeps the tensor finite wherever it travels.
    """
    return lse.masked_fill(torch.isneginf(lse), 0.0).contiguous()


Grads = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class _Travelling:
    """The gradient accumulators of one backward ring: this rank's own (home) and the
    ones of the payload it holds, which an ``AccumulatorRoute`` passes on from step 1."""

    def __init__(self, route: AccumulatorRoute | None, home: tuple[torch.Tensor, ...],
                 row_dim: int):
        self.route, self.home, self.row_dim = route, home, row_dim
        self._incoming = None  # the accumulator of the next step's payload, in flight
        self._returns: list = []
        self._batches: list = []

    def target(self, step: int, origin: int) -> tuple[tuple[torch.Tensor, ...] | None, object]:
        """(tensors to add this step's gradients into, the travelling buffer or None)."""
        if step == 0 or self.route is None:
            return self.home, None
        acc = self.route.new(origin, step)
        return (acc.views if acc is not None else None), acc

    def pass_on(self, step: int, acc) -> None:
        """Fold in what earlier holders accumulated for this payload, and send it on."""
        if step == 0 or self.route is None:
            return
        if self._incoming is not None:
            for mine, theirs in zip(acc.views, self._incoming.wait()):
                mine += theirs
        self._incoming, home, batch = self.route.pass_on(step, acc)
        if home is not None:
            self._returns.append(home)
        self._batches.append(batch)

    def finish(self) -> tuple[torch.Tensor, ...]:
        """This rank's gradients: its own, plus what the other holders sent home."""
        for pending in self._returns:
            for mine, theirs in zip(self.home, pending.wait()):
                mine.narrow(self.row_dim, 0, theirs.shape[self.row_dim]).add_(theirs)
        for batch in self._batches:  # the sent buffers may be freed after this
            batch.wait()
        return self.home


def ring_backward_kv(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     out: torch.Tensor, lse: torch.Tensor, spec: RingSpec,
                     kernel: LocalAttention) -> Grads:
    """Backward with K/V travelling and dK/dV accumulating behind them (``ring`` mode)."""
    qb, dob, ob = spec.bshd(q), spec.bshd(dout), spec.bshd(out)
    whole = spec.whole_block(qb.shape[1], spec.bshd(k).shape[1])
    if whole is not None:
        grads = kernel.backward(dob, qb, spec.bshd(k), spec.bshd(v), ob, lse, whole, spec.scale)
        return tuple(spec.bshd(g) for g in grads)
    acc_dtype = _acc_dtype(q)
    fresh = spec.fresh_at_step0(kernel, qb.shape[0], qb.shape[1], spec.bshd(k).shape[1],
                                 q.device)
    dq = _accumulator(q.shape, acc_dtype, q.device, fresh[0])
    dq_b = spec.bshd(dq)
    ring, route = spec.movers((k, v), (spec.row_dim,) * 2,
                              spec.accumulators((k, v), acc_dtype), "backward")
    grads = _Travelling(route, (_accumulator(k.shape, acc_dtype, k.device, fresh[1]),
                                _accumulator(v.shape, acc_dtype, v.device, fresh[1])),
                        spec.row_dim)
    kv, last = (k, v), spec.last_step
    for step in range(last + 1):
        if ring is not None:
            ring.post(step, kv)
        src = spec.source(step)
        target, acc = grads.target(step, src)
        if kv is not None:
            kb, vb = spec.bshd(kv[0]), spec.bshd(kv[1])
            dk_b, dv_b = (spec.bshd(t) for t in target)
            for call in spec.calls(spec.me, src, kernel, qb.shape[0], q.device):
                run_backward(kernel, call, dob, qb, kb, vb, ob, lse, spec.scale, dq_b, dk_b,
                             dv_b, fresh if step == 0 else (False, False))
        grads.pass_on(step, acc)
        if step < last:
            kv = ring.next(step)
    if ring is not None:
        ring.finish()
    dk, dv = grads.finish()
    if ring is not None:
        ring.comm.finish()
    return dq, dk, dv


def ring_backward_burst(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                        delta: torch.Tensor, spec: RingSpec, kernel: LocalAttention) -> Grads:
    """BurstAttention's backward: (Q, dO, lse, delta) travel, K/V/dK/dV stay home.

    ``out`` is this rank's own output (or the surrogate that folds in a gradient on lse):
    step 0 uses it; visitors' queries come with delta, from which their surrogate is built.
    """
    kb, vb = spec.bshd(k), spec.bshd(v)
    acc_dtype = _acc_dtype(q)
    fresh = spec.fresh_at_step0(kernel, kb.shape[0], spec.bshd(q).shape[1], kb.shape[1],
                                 q.device)
    dk = _accumulator(k.shape, acc_dtype, k.device, fresh[1])
    dv = _accumulator(v.shape, acc_dtype, v.device, fresh[1])
    dk_b, dv_b = spec.bshd(dk), spec.bshd(dv)
    bundle = (q, dout, lse, delta)
    # Queries travel the reverse way K/V did, so at step s this rank holds the queries that
    # held its K/V at step s of the forward: the same pairs, step for step, and the same
    # early stop when a window or whole documents leave later steps empty.
    ring, route = spec.movers(bundle, (spec.row_dim, spec.row_dim, 2, 2),
                              spec.accumulators((q,), acc_dtype), "backward", reverse=True)
    grads = _Travelling(route, (_accumulator(q.shape, acc_dtype, q.device, fresh[0]),),
                        spec.row_dim)
    last = spec.last_step
    for step in range(last + 1):
        if ring is not None:
            ring.post(step, bundle)
        visitor = spec.source(step, reverse=True)
        target, acc = grads.target(step, visitor)
        if bundle is not None:
            qj, doj, lsej, deltaj = bundle
            qj_b, doj_b = spec.bshd(qj), spec.bshd(doj)
            oj_b = spec.bshd(out) if step == 0 else surrogate_out(doj_b, deltaj)
            dq_b = spec.bshd(target[0])
            # The visitor's queries against our keys: the same blocks the forward computed.
            for call in spec.calls(visitor, spec.me, kernel, qj_b.shape[0], q.device):
                run_backward(kernel, call, doj_b, qj_b, kb, vb, oj_b, lsej, spec.scale, dq_b,
                             dk_b, dv_b, fresh if step == 0 else (False, False))
        grads.pass_on(step, acc)
        if step < last:
            bundle = ring.next(step)
    if ring is not None:
        ring.finish()
    (dq,) = grads.finish()
    if ring is not None:
        ring.comm.finish()
    return dq, dk, dv


class BurstAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: ``apply(q, k, v, spec[, kept]) -> (out, lse)``; differentiable in
    q, k, v. ``kept``: (out, lse) of this very call from an earlier forward (remat.py): the
    ring forward is skipped and the backward runs from them."""

    @staticmethod
    def forward(ctx, q, k, v, spec: RingSpec, kept=None):
        kernel = select_kernel(spec.bshd(q), spec.bshd(k), spec.kernel)
        if kept is None:
            out, lse = ring_forward(q, k, v, spec, kernel)
        else:  # a recompute: this call's output was kept from its first forward (remat.py)
            out, lse = (t.view_as(t) for t in kept)
        # An unused lse then arrives as None, not a tensor of zeros, so the ring backward
        # can use the real O instead of rebuilding one that folds in dlse.
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.spec, ctx.kernel = spec, kernel
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        spec, kernel = ctx.spec, ctx.kernel
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        blse = _backward_lse(lse)
        # delta = rowsum(dO * O); a gradient on lse enters as delta -= dlse, because
        # d lse_i / d s_ij = P_ij, the same factor the softmax backward applies to delta.
        # With one member nothing travels, and the ring mode's single kernel call is cheapest.
        mode = spec.backward if spec.topo is not None else "ring"
        need_delta = mode == "burst" or dlse is not None
        if need_delta:
            acc = lse.dtype
            delta = (spec.bshd(dout).to(acc) * spec.bshd(out).to(acc)).sum(-1).transpose(1, 2)
            if dlse is not None:
                delta = delta - dlse
            delta = delta.contiguous()
        # bshd() is its own inverse, so this hands the surrogate back in the user layout.
        o = out if dlse is None else spec.bshd(surrogate_out(spec.bshd(dout), delta))
        if mode == "burst":
            dq, dk, dv = ring_backward_burst(dout, q, k, v, o, blse, delta, spec, kernel)
        else:
            dq, dk, dv = ring_backward_kv(dout, q, k, v, o, blse, spec, kernel)
        headers.poll()  # a pass that received another call's message raises here
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None

