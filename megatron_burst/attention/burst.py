"""BurstAttention: the forward ring with online-softmax merge and the two backward rings.

One ring loop per pass. Masks and layouts enter only through the call's plan
(``call_plan``): for each step, the kernel calls of its blocks (grouped by
``varlen.plan_calls``), the hops to post with the rows each carries, and the travelling
accumulators' route. The loops never branch on masks or layouts; they launch kernels and
post messages.

Forward: Q stays home; K/V go round the ring (the next hop in flight while this step
computes); each block's (out, lse) is merged into fp32 accumulators.

Backward, two modes (``cost.py`` has their byte counts; ``options.resolve`` resolves
``backward="auto"``):
- ``burst`` (the paper): K, V, dK, dV stay home. (Q, dO, lse, delta) travel; the dQ of the
  queries being visited travels one step behind on a second ring and lands home last.
- ``ring``: Q, dO, O, lse stay home. K/V travel again, and their dK/dV accumulators travel
  one step behind them, landing home last.
Gradients of a rank's own payload at step 0 never leave home; the travelling accumulators
carry only the rows other ranks touch. Gradient accumulators are fp32, on the wire too, so
the error does not grow with G; one that takes a single kernel partial a row (CP=2) travels
in the inputs' dtype, which holds that partial exactly (``call_plan.PassPlan.wire``).
"""
from __future__ import annotations

import torch

from ..comm import consensus
from ..comm.headers import CallTag
from ..kernels.merge import fuses
from ..kernels.protocol import surrogate_out, working_dtype
from . import replay
from .bound_plan import BoundPlan
from .home_output import (WideRows, accumulator, first_grad_home, first_home, forward_home,
                          home_dtype, new_home)
from .travelling import Travelling
from ..plan.schedule import Block
from .sinks import merge_sinks, sink_grad
from ..kernels.run_calls import run_backward, run_forward, seen_nothing


def ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bound: BoundPlan,
                 tag: CallTag | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward ring. Returns (out in q's dtype and format, lse [b, hq, s] fp32)."""
    plan, kernel, scale = bound.plan.forward, bound.kernel, bound.scale
    qb = bound.bshd(q)
    b, s, hq, _ = qb.shape
    fresh = plan.fresh[0]  # every row's first partial is written (``first_writes``)
    acc = working_dtype(q.dtype)
    # The output has V's head dim (MLA: Q/K 192, V 128). It accumulates in q's dtype where
    # no row takes more than one merge in the kernel that rounds once (``merge.fuses``).
    home, wide_runs = forward_home(plan, q.dtype, fuses(q.device, q.dtype, v.shape[-1]), s)
    shape = (*q.shape[:-1], v.shape[-1])
    pieces = plan.home_pieces and home == q.dtype  # (a wider home: written run by run)
    out = lse = out_b = wide = None  # made by the first call where it covers every row
    if not plan.home_from_first and not pieces:
        out, lse = new_home(shape, (b, hq, s), home, acc, q.device, fresh)
        out_b = bound.bshd(out)
        wide = WideRows(wide_runs, out_b, fresh) if wide_runs else None
    ring, _ = bound.movers(plan, (k, v), None, "forward", tag)
    kv = (k, v)
    for step, writes in zip(plan.steps, plan.writes, strict=True):
        if ring is not None:
            ring.post(step.hops, kv)
        if kv is not None:  # None: nothing of this step's keys is used here
            kb, vb = bound.bshd(kv[0]), bound.bshd(kv[1])
            for call, (first, _) in zip(step.calls, writes, strict=True):
                if out is None:  # the home is the first call's output, or step 0's pieces
                    out, lse, out_b, wide = first_home(bound, step.calls, qb, kb, vb, shape,
                                                       home, acc, pieces, wide_runs)
                    if pieces:
                        break
                    continue
                run_forward(kernel, bound.launch(call), qb, kb, vb, out_b, lse, scale, first,
                            wide)
        if step.next is not None:  # (no ring: this rank neither sends nor receives)
            kv = ring.next(step.next) if ring is not None else None
    _finish(ring)
    if wide is not None:
        wide.put(out_b)
    return out.to(q.dtype), lse


def _finish(ring, grads=None) -> tuple:
    """Close a pass: the ring's last sends, then the travelling gradients' (their values),
    then the ring's messages (the header check), in this order on every rank."""
    if ring is not None:
        ring.finish()
    values = grads.finish() if grads is not None else ()
    if ring is not None:
        ring.comm.finish()
    return values


def _backward_lse(bound: BoundPlan, lse: torch.Tensor) -> torch.Tensor:
    """lse for the backward kernels: rows that saw no key get 0 instead of -inf.

    Such rows (padding) are in no block, so the value never reaches a kernel as a real
    normaliser; 0 keeps the tensor finite wherever it travels. Where every row sees a key
    (the plan says so) there is nothing to mend.
    """
    if bound.plan.every_row_sees:
        return lse.contiguous()
    return lse.masked_fill(torch.isneginf(lse), 0.0).contiguous()


Grads = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def ring_backward_kv(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     out: torch.Tensor, lse: torch.Tensor, bound: BoundPlan,
                     tag: CallTag | None, wide: bool = False) -> Grads:
    """Backward with K/V travelling and dK/dV accumulating behind them (``ring`` mode).
    ``wide``: fp32 home accumulators, whatever the plan allows (``home_dtype``)."""
    if bound.whole is not None:  # one kernel call: its gradients are the answer
        return _whole_backward(bound, dout, q, k, v, out, lse)
    plan, kernel, scale = bound.plan.backward, bound.kernel, bound.scale
    qb, dob, ob = bound.bshd(q), bound.bshd(dout), bound.bshd(out)
    acc_dtype = working_dtype(q.dtype)
    fresh, (q_home, k_home) = plan.fresh, (home_dtype(q.dtype, n, wide) for n in plan.uses)
    dq = dq_b = None  # made by the first call where it covers every row
    if not plan.home_from_first:
        dq = accumulator(q.shape, q_home, q.device, fresh[0])
        dq_b = bound.bshd(dq)
    ring, route = bound.movers(plan, (k, v), acc_dtype, "backward", tag)
    grads = Travelling(route, (accumulator(k.shape, k_home, k.device, fresh[1]),
                                accumulator(v.shape, k_home, v.device, fresh[1])),
                        bound.row_dim)
    kv = (k, v)
    for i, (step, writes) in enumerate(zip(plan.steps, plan.writes, strict=True)):
        if ring is not None:
            ring.post(step.hops, kv)
        target, acc = grads.target(i, step)
        if kv is not None:
            kb, vb = bound.bshd(kv[0]), bound.bshd(kv[1])
            dk_b, dv_b = bound.bshd(target[0]), bound.bshd(target[1])
            for call, first in zip(step.calls, writes, strict=True):
                if dq is None:
                    dq = first_grad_home(bound, bound.launch(call), dob, qb, kb, vb, ob, lse,
                                         dk_b, dv_b, first[1], q.shape, q_home)
                    dq_b = bound.bshd(dq)
                    continue
                run_backward(kernel, bound.launch(call), dob, qb, kb, vb, ob, lse, scale,
                             dq_b, dk_b, dv_b, first)
        grads.pass_on(i, step, acc)
        if step.next is not None:  # (no ring: this rank neither sends nor receives)
            kv = ring.next(step.next) if ring is not None else None
    dk, dv = _finish(ring, grads)
    return dq, dk, dv


def ring_backward_burst(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                        delta: torch.Tensor, bound: BoundPlan, tag: CallTag | None,
                        wide: bool = False) -> Grads:
    """BurstAttention's backward: (Q, dO, lse, delta) travel, K/V/dK/dV stay home.

    ``out`` is this rank's own output (or the surrogate that folds in a gradient on lse):
    step 0 uses it; visitors' queries come with delta, from which their surrogate is built.
    Queries travel the reverse way K/V did, so at step s this rank holds the queries that
    held its K/V at step s of the forward: the same pairs, step for step, and the same
    early stop when a window or whole documents leave later steps empty.
    """
    plan, kernel, scale = bound.plan.backward, bound.kernel, bound.scale
    kb, vb = bound.bshd(k), bound.bshd(v)
    acc_dtype = working_dtype(q.dtype)
    fresh, (q_home, k_home) = plan.fresh, (home_dtype(q.dtype, n, wide) for n in plan.uses)
    dk = accumulator(k.shape, k_home, k.device, fresh[1])
    dv = accumulator(v.shape, k_home, v.device, fresh[1])
    dk_b, dv_b = bound.bshd(dk), bound.bshd(dv)
    bundle = (q, dout, lse, delta)
    ring, route = bound.movers(plan, bundle, acc_dtype, "backward", tag, (q,))
    grads = Travelling(route, (accumulator(q.shape, q_home, q.device, fresh[0]),),
                        bound.row_dim)
    for i, (step, writes) in enumerate(zip(plan.steps, plan.writes, strict=True)):
        if ring is not None:
            ring.post(step.hops, bundle)
        target, acc = grads.target(i, step)
        if bundle is not None:
            qj, doj, lsej, deltaj = bundle
            qj_b, doj_b = bound.bshd(qj), bound.bshd(doj)
            oj_b = bound.bshd(out) if i == 0 else surrogate_out(doj_b, deltaj)
            dq_b = bound.bshd(target[0])
            # The visitor's queries against our keys: the same blocks the forward computed.
            for call, first in zip(step.calls, writes, strict=True):
                run_backward(kernel, bound.launch(call), doj_b, qj_b, kb, vb, oj_b, lsej,
                             scale, dq_b, dk_b, dv_b, first)
        grads.pass_on(i, step, acc)
        if step.next is not None:
            bundle = ring.next(step.next) if ring is not None else None
    (dq,) = _finish(ring, grads)
    return dq, dk, dv


class BurstAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: ``apply(q, k, v, bound, tag[, kept[, sinks]]) -> (out, lse)``;
    differentiable in q, k, v and the sinks. ``tag``: the call's number, signature and label
    that its messages carry (``comm.headers``; None: untagged, as in a CUDA graph capture).
    ``lse_returned``: the caller was handed lse (``return_lse``, the same on every rank): the
    backward then runs the lse's passes whether or not this rank's loss used it, as its
    peers' may have. ``kept``: (out, lse) of this very call from an
    earlier forward (remat.py): the ring forward is skipped and the backward runs from them.
    ``sinks``: one logit per query head merged into every row (``sinks.py``). The kernel is
    the one ``prepare`` chose and checked against the call's blocks (``bound.kernel``)."""

    @staticmethod
    def forward(ctx, q, k, v, bound: BoundPlan, tag: CallTag | None, kept=None, sinks=None,
                lse_returned: bool = False):
        if kept is not None:  # a recompute: this call's output was kept from its first forward
            out, lse = (t.view_as(t) for t in kept)
        else:
            if bound.whole is not None:  # one kernel call is the whole answer
                out, lse = _whole_forward(bound, q, k, v)
            else:
                out, lse = replay.run("forward", bound, (q, k, v), _untagged_forward) or \
                    ring_forward(q, k, v, bound, tag)
            if sinks is not None:
                out, lse = merge_sinks(out, lse, sinks, bound.seq_first)
        # An unused lse then arrives as None, not a tensor of zeros, so the ring backward
        # can use the real O instead of rebuilding one that folds in dlse.
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.bound, ctx.tag, ctx.lse_returned = bound, tag, lse_returned
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable  # the ring's messages have no derivative:
    def backward(ctx, dout, dlse):  # a second-order gradient raises instead of being wrong
        q, k, v, out, lse, sinks = ctx.saved_tensors
        bound, tag = ctx.bound, ctx.tag
        dsinks = None
        if sinks is not None and ctx.needs_input_grad[6]:
            dsinks = sink_grad(dout, out, lse, dlse, sinks, bound.seq_first)
        if bound.whole is not None and dlse is None and dout is not None:
            return (*_whole_backward(bound, dout.contiguous(), q, k, v, out, lse), None, None,
                    None, dsinks, None)
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        if dlse is None and ctx.lse_returned:  # in no loss here; maybe in a peer's
            dlse = torch.zeros_like(lse)
        if dlse is None:
            dq, dk, dv = replay.run("backward", bound, (q, k, v, dout, out, lse),
                                    _untagged_backward) or \
                _backward(bound, tag, q, k, v, dout, out, lse, None)
        else:
            dq, dk, dv = _backward_with_lse(bound, tag, q, k, v, dout, out, lse, dlse)
        consensus.poll()  # a pass that received another call's message raises here
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, dsinks, None


def _untagged_forward(bound: BoundPlan, q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward ring as a replay captures it: no headers (``replay``)."""
    return ring_forward(q, k, v, bound, None)


def _untagged_backward(bound: BoundPlan, q, k, v, dout, out, lse) -> Grads:
    """The backward rings given O, as a replay captures them: no headers (``replay``)."""
    return _backward(bound, None, q, k, v, dout, out, lse, None)


def _whole_forward(bound: BoundPlan, q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
    """A single member's whole attention as its one kernel call (``BoundPlan.whole``: a dense
    block, or a pack's one varlen call over every row): the kernel's output is the answer."""
    if bound.seq_first:  # sbhd: the kernels take bshd views
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    if isinstance(bound.whole, Block):
        out, lse = bound.kernel.forward(q, k, v, bound.whole, bound.scale)
    else:
        call = bound.launch(bound.whole)
        out, lse = bound.kernel.forward_varlen(q[0], k[0], v[0], call, bound.scale)
        out, lse = out[None], (seen_nothing(lse) if call.keyless else lse)[None]
    return (out.transpose(0, 1) if bound.seq_first else out), lse


def _whole_backward(bound: BoundPlan, dout, q, k, v, out, lse) -> Grads:
    """The gradients of ``_whole_forward``'s call: the kernel's backward, nothing else."""
    if bound.seq_first:
        dout, q, k, v, out = (t.transpose(0, 1) for t in (dout, q, k, v, out))
    if isinstance(bound.whole, Block):
        dq, dk, dv = bound.kernel.backward(dout, q, k, v, out, lse, bound.whole, bound.scale)
    else:
        dq, dk, dv = bound.kernel.backward_varlen(dout[0], q[0], k[0], v[0], out[0], lse[0],
                                                 bound.launch(bound.whole), bound.scale)
        dq, dk, dv = dq[None], dk[None], dv[None]
    if bound.seq_first:
        return dq.transpose(0, 1), dk.transpose(0, 1), dv.transpose(0, 1)
    return dq, dk, dv


def _rowsum(bound: BoundPlan, a: torch.Tensor, b: torch.Tensor, dtype) -> torch.Tensor:
    """rowsum(a * b) over the head dim, [b, h, s] in ``dtype`` (a, b in the caller's format)."""
    return (bound.bshd(a).to(dtype) * bound.bshd(b).to(dtype)).sum(-1).transpose(1, 2)


def _backward(bound: BoundPlan, tag: CallTag | None, q, k, v, dout, out, lse, delta,
              wide: bool = False) -> Grads:
    """The ring backward of ``dout`` given ``delta`` (None: rowsum(dout * out), the plain
    softmax backward). The kernels read O only to form delta, so another delta enters as the
    surrogate O' with rowsum(dout * O') == delta (``surrogate_out``); ``dout`` must then be
    nonzero on every row whose delta is (``_backward_with_lse`` makes it so)."""
    blse = _backward_lse(bound, lse)
    # With one member nothing travels, and the ring mode's single kernel call is cheapest.
    mode = bound.backward if bound.topo is not None else "ring"
    o = out
    if delta is not None:
        delta = delta.contiguous()
        # bshd() is its own inverse, so this hands the surrogate back in the caller's format.
        o = bound.bshd(surrogate_out(bound.bshd(dout), delta))
    elif mode == "burst":  # visitors' queries travel with delta, not O
        delta = _rowsum(bound, dout, out, lse.dtype).contiguous()
    if mode == "burst":
        return ring_backward_burst(dout, q, k, v, o, blse, delta, bound, tag, wide)
    return ring_backward_kv(dout, q, k, v, o, blse, bound, tag, wide)


def _backward_with_lse(bound: BoundPlan, tag: CallTag | None, q, k, v, dout, out, lse,
                       dlse) -> Grads:
    """The backward of (dout, dlse), exact whatever dout is, on every rank the same passes.

    A gradient on lse enters the softmax backward as delta -= dlse (d lse_i / d s_ij = P_ij,
    the factor the softmax backward applies to delta), so one pass with
    delta = rowsum(dout * O) - dlse is the answer on every row whose dout is not zero: the
    kernels take delta through O' with rowsum(dout * O') = delta (``surrogate_out``). A row
    whose dout is zero (a token out of the output's loss) cannot carry its -dlse that way.
    Those rows borrow a stand-in W (a small multiple of |dlse_i| in every element, zero on
    every other row) in two more passes, whose difference is exactly their lse gradient:
    grads(W, rowsum(W * O) - dlse) - grads(W, rowsum(W * O)). Both passes see the same W,
    so what W alone contributes (dV's P^T W, and W's share of dS) is the same bits in both
    and cancels exactly; the real output gradient never shares a pass with it. Every rank
    runs all three passes, whatever its rows: the ring pairs the ranks' passes.
    """
    acc = lse.dtype
    dlse = dlse.to(acc)
    delta = _rowsum(bound, dout, out, acc) - dlse
    grads = _backward(bound, tag, q, k, v, dout, out, lse, delta, wide=True)
    # [b, h, s]: rows out of the output's loss that are in the lse's
    lost = (bound.bshd(dout).abs().amax(-1) == 0).transpose(1, 2) & (dlse != 0)
    size = torch.where(lost, dlse.abs() * STAND_IN, torch.zeros_like(dlse))
    stand_in = bound.bshd(size.transpose(1, 2).unsqueeze(-1).expand(bound.bshd(dout).shape)
                         .to(dout.dtype)).contiguous()
    own = _rowsum(bound, stand_in, out, acc)
    lifted = _backward(bound, tag, q, k, v, stand_in, out, lse,
                       own - torch.where(lost, dlse, torch.zeros_like(dlse)), wide=True)
    alone = _backward(bound, tag, q, k, v, stand_in, out, lse, own, wide=True)
    return tuple(g.to(acc) + (a.to(acc) - b.to(acc)) for g, a, b in zip(grads, lifted, alone))


# The stand-in's elements, per unit of |dlse|: small, so that what it adds to the scores'
# gradient (W . V, rounded with them) is far below the lse's own term it carries.
STAND_IN = 2.0 ** -8
