"""BurstAttention: the forward ring with online-softmax merge and the two backward rings.

One ring loop per pass. Masks and layouts enter only through ``schedule.blocks``, which
says which rectangles to compute at each step; the loops never branch on them.

Forward: Q stays home; K/V go round the ring (G-1 hops, double-buffered, the next hop in
flight while this step computes); each block's (out, lse) is merged into fp32
accumulators.

Backward, two modes (``cost.py`` has their byte counts, ``backward="auto"`` picks the
cheaper):
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

from . import cost
from .comm import KVRing, RingComm
from .kernels import LocalAttention, select_kernel, surrogate_out
from .merge import merge_partial
from .schedule import blocks


@dataclasses.dataclass(frozen=True)
class RingSpec:
    """Everything the ring loops need besides tensors (resolved and validated)."""

    group: dist.ProcessGroup | None
    world: int
    rank: int
    layout: str
    causal: bool
    scale: float
    backward: str  # 'burst' or 'ring' (auto already resolved)
    seq_first: bool  # qkv_format == 'sbhd'
    kernel: str | None = None  # force a LocalAttention backend by name (tests, benchmarks)

    def bshd(self, t: torch.Tensor) -> torch.Tensor:
        """The user's tensor seen as [b, s, h, d] (a view, never a copy)."""
        return t.transpose(0, 1) if self.seq_first else t

    def blocks(self, q_rank: int, k_rank: int, local_len: int):
        return blocks(self.layout, self.world, q_rank, k_rank, local_len, self.causal)


def ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: RingSpec,
                 kernel: LocalAttention) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward ring. Returns (out in q's dtype and layout, lse [b, hq, s] fp32)."""
    qb = spec.bshd(q)
    b, s, hq, _ = qb.shape
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    out_b = spec.bshd(out)
    lse = torch.full((b, hq, s), float("-inf"), dtype=torch.float32, device=q.device)
    ring = KVRing(RingComm(spec.group, "forward"), like=(k, v)) if spec.world > 1 else None
    kv = (k, v)
    for step in range(spec.world):
        pending = ring.forward(kv) if step < spec.world - 1 else None
        src = (spec.rank - step) % spec.world
        kb, vb = spec.bshd(kv[0]), spec.bshd(kv[1])
        for blk in spec.blocks(spec.rank, src, s):
            o, l = kernel.forward(qb[:, blk.q], kb[:, blk.k], vb[:, blk.k], blk, spec.scale)
            merge_partial(out_b[:, blk.q], lse[:, :, blk.q], o, l)
        if pending is not None:
            kv = tuple(pending.wait())
    return out.to(q.dtype), lse


def _backward_lse(lse: torch.Tensor) -> torch.Tensor:
    """lse for the backward kernels: rows that saw no key get 0 instead of -inf.

    Such rows have every score masked in every block, so P = exp(s - lse) is 0 whatever
    finite lse they carry, while -inf would give exp(-inf + inf) = NaN.
    """
    return lse.masked_fill(torch.isneginf(lse), 0.0).contiguous()


def ring_backward_kv(dout, q, k, v, out, lse, spec: RingSpec, kernel: LocalAttention):
    """Backward with K/V travelling and dK/dV accumulating as they go (``ring`` mode)."""
    qb, dob, ob = spec.bshd(q), spec.bshd(dout), spec.bshd(out)
    s = qb.shape[1]
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dq_b = spec.bshd(dq)
    kv_ring = KVRing(RingComm(spec.group, "backward"), like=(k, v)) if spec.world > 1 else None
    grad_ring = RingComm(spec.group, "backward") if spec.world > 1 else None
    kv, pending_grad = (k, v), None
    for step in range(spec.world):
        pending_kv = kv_ring.forward(kv) if step < spec.world - 1 else None
        src = (spec.rank - step) % spec.world
        kb, vb = spec.bshd(kv[0]), spec.bshd(kv[1])
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        dk_b, dv_b = spec.bshd(dk), spec.bshd(dv)
        for blk in spec.blocks(spec.rank, src, s):
            gq, gk, gv = kernel.backward(dob[:, blk.q], qb[:, blk.q], kb[:, blk.k], vb[:, blk.k],
                                         ob[:, blk.q], lse[:, :, blk.q], blk, spec.scale)
            dq_b[:, blk.q] += gq
            dk_b[:, blk.k] += gk
            dv_b[:, blk.k] += gv
        if pending_grad is not None:  # the accumulator for `src` from the previous rank
            acc_k, acc_v = pending_grad.wait()
            dk += acc_k
            dv += acc_v
        if grad_ring is not None:  # on to the rank that holds `src`'s K/V next step
            pending_grad = grad_ring.send_recv([dk, dv])
        if pending_kv is not None:
            kv = tuple(pending_kv.wait())
    if pending_grad is not None:  # after G sends our own accumulator has come home
        dk, dv = pending_grad.wait()
    return dq, dk, dv


def ring_backward_burst(dout, q, k, v, lse, delta, spec: RingSpec, kernel: LocalAttention):
    """BurstAttention's backward: (Q, dO, lse, delta) travel, K/V/dK/dV stay home."""
    kb, vb = spec.bshd(k), spec.bshd(v)
    s = kb.shape[1]
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    dk_b, dv_b = spec.bshd(dk), spec.bshd(dv)
    bundle = (q, dout, lse, delta)
    q_ring = KVRing(RingComm(spec.group, "backward"), like=bundle) if spec.world > 1 else None
    dq_ring = RingComm(spec.group, "backward") if spec.world > 1 else None
    pending_dq = None
    for step in range(spec.world):
        pending_bundle = q_ring.forward(bundle) if step < spec.world - 1 else None
        owner = (spec.rank - step) % spec.world
        qj, doj, lsej, deltaj = bundle
        qj_b, doj_b = spec.bshd(qj), spec.bshd(doj)
        oj_b = surrogate_out(doj_b, deltaj)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dq_b = spec.bshd(dq)
        for blk in spec.blocks(owner, spec.rank, s):
            gq, gk, gv = kernel.backward(doj_b[:, blk.q], qj_b[:, blk.q], kb[:, blk.k],
                                         vb[:, blk.k], oj_b[:, blk.q], lsej[:, :, blk.q], blk,
                                         spec.scale)
            dq_b[:, blk.q] += gq
            dk_b[:, blk.k] += gk
            dv_b[:, blk.k] += gv
        if pending_dq is not None:  # `owner`'s dQ so far, from the previous rank
            dq += pending_dq.wait()[0]
        if dq_ring is not None:
            pending_dq = dq_ring.send_recv([dq])
        if pending_bundle is not None:
            bundle = tuple(pending_bundle.wait())
    if pending_dq is not None:  # our own dQ, home after G hops
        dq = pending_dq.wait()[0]
    return dq, dk, dv


class BurstAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: ``apply(q, k, v, spec) -> (out, lse)``; differentiable in q, k, v."""

    @staticmethod
    def forward(ctx, q, k, v, spec: RingSpec):
        kernel = select_kernel(spec.bshd(q), spec.bshd(k), spec.kernel)
        out, lse = ring_forward(q, k, v, spec, kernel)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.spec, ctx.kernel = spec, kernel
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        spec, kernel = ctx.spec, ctx.kernel
        dout = dout.contiguous()
        blse = _backward_lse(lse)
        # delta = rowsum(dO * O); a gradient on lse enters as delta -= dlse, because
        # d lse_i / d s_ij = P_ij, the same factor the softmax backward applies to delta.
        need_delta = spec.backward == "burst" or dlse is not None
        if need_delta:
            delta = (spec.bshd(dout).float() * spec.bshd(out).float()).sum(-1).transpose(1, 2)
            if dlse is not None:
                delta = delta - dlse
            delta = delta.contiguous()
        if spec.backward == "burst":
            dq, dk, dv = ring_backward_burst(dout, q, k, v, blse, delta, spec, kernel)
        else:
            # bshd() is its own inverse, so this hands the surrogate back in the user layout.
            o = out if dlse is None else spec.bshd(surrogate_out(spec.bshd(dout), delta))
            dq, dk, dv = ring_backward_kv(dout, q, k, v, o, blse, spec, kernel)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def resolve_backward(backward: str, world: int, hq: int, hkv: int, head_dim: int,
                     elem_bytes: int) -> str:
    if backward == "auto":
        return cost.choose_backward(world, hq, hkv, head_dim, elem_bytes)
    return backward
