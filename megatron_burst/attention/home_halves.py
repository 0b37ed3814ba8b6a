"""A backward ring's home step in two halves by heads: the second half runs while the
gradient accumulator of this rank's payload comes home.

A backward pass ends with a hop that nothing overlapped: after its last kernel call each
rank sends the travelling accumulator (dK/dV in the ``ring`` mode, dQ in the ``burst``
mode) to its owner and waits for its own. On 2x H100 that wait was the largest idle stretch
of a CP=2 call (``benchmarks/results/h100x2_issue39_wire/README.md``). Step 0, a member's own
queries against its own keys, needs nothing that travels, so half of its heads can wait
until that hop is posted and compute while it is in flight; the other half still covers the
first payload hop, as the whole step did.

Split by K/V heads (with the query heads of their groups), every (row, head) of every
accumulator takes its partials from the same kernel calls as before, so the rule that picks
the home accumulators' dtype (``burst._home_dtype``) holds unchanged. What changes is the
order in which a deferred head's home accumulator takes the home step's partial and the
later steps'; for the at most two partials of a half-precision accumulator the sum is the
same bits either way. The home accumulator that later steps add into starts at zero, and the
deferred half adds into it instead of writing.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from ..kernels.varlen import run_backward


@dataclasses.dataclass(frozen=True)
class Heads:
    """A range of query heads and the K/V heads their groups read."""

    q: slice
    k: slice


def defers(steps: Sequence) -> bool:
    """Whether a backward pass leaves half of step 0's heads for its end (``PassPlan``'s
    ``defer_home``): step 0 computes, a later step exists, and an accumulator comes home."""
    return len(steps) > 1 and bool(steps[0].calls) and any(
        s.acc is not None and s.acc.recv_home is not None for s in steps)


def halves(hq: int, hk: int) -> tuple[Heads, Heads] | None:
    """Step 0's heads now and at the end, split at half the K/V heads (None: one K/V head,
    which every query head reads, so no split keeps one partial per row)."""
    if hk < 2:
        return None
    cut = hk // 2
    group = hq // hk
    return (Heads(slice(0, cut * group), slice(0, cut)),
            Heads(slice(cut * group, hq), slice(cut, hk)))


Tensors = tuple[torch.Tensor, ...]  # dO, Q, K, V, O, lse, dQ, dK, dV


def run_calls(bound, calls: Sequence, tensors: Tensors, fresh: tuple[bool, bool],
              heads: Heads | None = None) -> None:
    """The backward of ``calls`` on ``tensors`` ([b, s, h, d] views; lse [b, h, s]), added
    into (or, ``fresh``, written to) dQ, dK, dV; on ``heads`` alone when given (views)."""
    dout, q, k, v, out, lse, dq, dk, dv = tensors
    if heads is not None:  # (no generators: this is on every call's host path)
        every = slice(None)
        hq, hk = (every, every, heads.q), (every, every, heads.k)
        dout, q, out, dq, lse = dout[hq], q[hq], out[hq], dq[hq], lse[every, heads.q]
        k, v, dk, dv = k[hk], v[hk], dk[hk], dv[hk]
    for call in calls:
        run_backward(bound.kernel, bound.launch(call), dout, q, k, v, out, lse, bound.scale,
                     dq, dk, dv, fresh)
