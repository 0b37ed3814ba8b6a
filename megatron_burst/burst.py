"""BurstAttention: the forward ring with online-softmax merge and the two backward rings.

One ring loop per pass. Masks and layouts enter only through ``schedule.blocks``, which
says which rectangles to compute at each step; the loops never branch on them.

Forward: Q stays home; K/V go round the ring (G-1 hops, double-buffered, the next hop in
flight while this step computes); each block's (out, lse) is merged into fp32
accumulators.

Backward, two modes (``cost.py`` has their byte counts; ``cp_layout`` resolves
``backward="auto"``):
- ``burst`` (the paper): K, V, dK, dV stay home. (Q, dO, lse, delta) travel; the dQ of the
  queries being visited travels one step behind on a second ring and lands home last.
- ``ring``: Q, dO, O, lse stay home. K/V travel again, and their dK/dV accumulators travel
  one step behind them, landing home last.
All gradient accumulators are fp32, on the wire too, so the error does not grow with G.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from .comm import AccumulatorRoute, Packed, PayloadRing, PeerComm, RingTopology
from .kernels import LocalAttention, select_kernel, surrogate_out
from .merge import merge_partial
from .schedule import Block, RingSchedule


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

    @property
    def me(self) -> int:
        return self.topo.index if self.topo is not None else 0

    @property
    def last_step(self) -> int:
        return 0 if self.topo is None else self.sched.last_step(self.topo.source)

    def source(self, step: int, reverse: bool = False) -> int:
        if self.topo is None:
            return self.me
        return (self.topo.reversed() if reverse else self.topo).source(self.me, step)

    def bshd(self, t: torch.Tensor) -> torch.Tensor:
        """The tensor seen as [b, s, h, d] (a view, never a copy; its own inverse)."""
        return t.transpose(0, 1) if self.seq_first else t

    def movers(self, like, phase: str, reverse: bool = False
               ) -> tuple[PayloadRing | None, AccumulatorRoute | None]:
        """Payload and accumulator movers; ``reverse`` runs the ring the other way."""
        if self.topo is None:
            return None, None
        topo = self.topo.reversed() if reverse else self.topo
        comm = PeerComm(self.group, phase)
        return (PayloadRing(topo, comm, like, self.last_step),
                AccumulatorRoute(topo, comm, self.last_step))

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
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    out_b = spec.bshd(out)
    lse = torch.full((b, hq, s), float("-inf"), dtype=acc, device=q.device)
    ring, _ = spec.movers((k, v), "forward")
    kv, last = (k, v), spec.last_step
    for step in range(last + 1):
        if ring is not None:
            ring.post(step, kv)
        kb, vb = spec.bshd(kv[0]), spec.bshd(kv[1])
        for blk in spec.sched.blocks(spec.me, spec.source(step)):
            o, o_lse = kernel.forward(qb[:, blk.q], kb[:, blk.k], vb[:, blk.k], blk, spec.scale)
            merge_partial(out_b[:, blk.q], lse[:, :, blk.q], o, o_lse)
        if step < last:
            kv = ring.next(step)
    return out.to(q.dtype), lse


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


def ring_backward_kv(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     out: torch.Tensor, lse: torch.Tensor, spec: RingSpec,
                     kernel: LocalAttention) -> Grads:
    """Backward with K/V travelling and dK/dV accumulating behind them (``ring`` mode)."""
    qb, dob, ob = spec.bshd(q), spec.bshd(dout), spec.bshd(out)
    whole = spec.whole_block(qb.shape[1], spec.bshd(k).shape[1])
    if whole is not None:
        grads = kernel.backward(dob, qb, spec.bshd(k), spec.bshd(v), ob, lse, whole, spec.scale)
        return tuple(spec.bshd(g) for g in grads)
    dq = torch.zeros(q.shape, dtype=_acc_dtype(q), device=q.device)
    dq_b = spec.bshd(dq)
    ring, route = spec.movers((k, v), "backward")
    kv, pending, last = (k, v), None, spec.last_step
    for step in range(last + 1):
        if ring is not None:
            ring.post(step, kv)
        kb, vb = spec.bshd(kv[0]), spec.bshd(kv[1])
        # dK and dV in one buffer, so passing them on is one message and no copy.
        acc = Packed([(k.shape, _acc_dtype(q)), (v.shape, _acc_dtype(q))], k.device, zero=True)
        dk, dv = acc.views
        dk_b, dv_b = spec.bshd(dk), spec.bshd(dv)
        for blk in spec.sched.blocks(spec.me, spec.source(step)):
            gq, gk, gv = kernel.backward(dob[:, blk.q], qb[:, blk.q], kb[:, blk.k], vb[:, blk.k],
                                         ob[:, blk.q], lse[:, :, blk.q], blk, spec.scale)
            dq_b[:, blk.q] += gq
            dk_b[:, blk.k] += gk
            dv_b[:, blk.k] += gv
        if pending is not None:  # what earlier holders accumulated for these K/V
            acc_k, acc_v = pending.wait()
            dk += acc_k
            dv += acc_v
        if route is not None:
            pending = route.pass_on(step, acc)
        if step < last:
            kv = ring.next(step)
    if pending is not None:  # our own K/V's gradients, home
        dk, dv = pending.wait()
    return dq, dk, dv


def ring_backward_burst(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor,
                        spec: RingSpec, kernel: LocalAttention) -> Grads:
    """BurstAttention's backward: (Q, dO, lse, delta) travel, K/V/dK/dV stay home."""
    kb, vb = spec.bshd(k), spec.bshd(v)
    dk = torch.zeros(k.shape, dtype=_acc_dtype(q), device=k.device)
    dv = torch.zeros(v.shape, dtype=_acc_dtype(q), device=v.device)
    dk_b, dv_b = spec.bshd(dk), spec.bshd(dv)
    bundle = (q, dout, lse, delta)
    # Queries travel the reverse way K/V did, so at step s this rank holds the queries that
    # held its K/V at step s of the forward: the same pairs, step for step, and the same
    # early stop when a window leaves later steps empty.
    ring, route = spec.movers(bundle, "backward", reverse=True)
    pending, last = None, spec.last_step
    for step in range(last + 1):
        if ring is not None:
            ring.post(step, bundle)
        qj, doj, lsej, deltaj = bundle
        qj_b, doj_b = spec.bshd(qj), spec.bshd(doj)
        oj_b = surrogate_out(doj_b, deltaj)
        dq = torch.zeros(q.shape, dtype=_acc_dtype(q), device=q.device)
        dq_b = spec.bshd(dq)
        # The visitor's queries against our keys: the same blocks the forward computed.
        for blk in spec.sched.blocks(spec.source(step, reverse=True), spec.me):
            gq, gk, gv = kernel.backward(doj_b[:, blk.q], qj_b[:, blk.q], kb[:, blk.k],
                                         vb[:, blk.k], oj_b[:, blk.q], lsej[:, :, blk.q], blk,
                                         spec.scale)
            dq_b[:, blk.q] += gq
            dk_b[:, blk.k] += gk
            dv_b[:, blk.k] += gv
        if pending is not None:  # the visitor's dQ as earlier holders left it
            dq += pending.wait()[0]
        if route is not None:
            pending = route.pass_on(step, [dq])
        if step < last:
            bundle = ring.next(step)
    if pending is not None:  # our own dQ, home
        dq = pending.wait()[0]
    return dq, dk, dv


class BurstAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: ``apply(q, k, v, spec) -> (out, lse)``; differentiable in q, k, v."""

    @staticmethod
    def forward(ctx, q, k, v, spec: RingSpec):
        kernel = select_kernel(spec.bshd(q), spec.bshd(k), spec.kernel)
        out, lse = ring_forward(q, k, v, spec, kernel)
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
        if mode == "burst":
            dq, dk, dv = ring_backward_burst(dout, q, k, v, blse, delta, spec, kernel)
        else:
            # bshd() is its own inverse, so this hands the surrogate back in the user layout.
            o = out if dlse is None else spec.bshd(surrogate_out(spec.bshd(dout), delta))
            dq, dk, dv = ring_backward_kv(dout, q, k, v, o, blse, spec, kernel)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None

