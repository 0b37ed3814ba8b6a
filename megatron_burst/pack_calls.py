"""A document pack's kernel calls for one pair of ring members, made without a loop over
its documents.

A member's documents held whole pair only with themselves, on the diagonal (the member's
queries against its own keys), each under the plain mask: on its square block flash's
bottom-right window is the band, so all of them are one varlen call whose boundaries are
the documents' lengths (``whole_call``), made from the shard's arrays. The few blocks of
documents split over members are grouped as any blocks are (``varlen.plan_calls``); the
whole documents join their call of the same mask shape when flash, given only that call's
lengths and window, computes each of its blocks exactly (``with_whole``), else they are
one call more.
"""
from __future__ import annotations

import numpy as np

from .blocks import Block, Mask
from .segments import Shard, frozen
from .varlen import KernelCall, Runs, boundaries, document_shape, join_runs


def whole_call(shard: Shard, mask: Mask) -> KernelCall | None:
    """The documents ``shard`` holds whole, each against itself under ``mask``, as one
    varlen call (None without any)."""
    if not len(shard.docs):
        return None
    cu = boundaries(shard.lens)
    runs = joined(shard.rows, shard.rows + shard.lens)
    return KernelCall((), True, runs, runs, cu, cu, *document_shape(mask))


def with_whole(calls: tuple[KernelCall, ...], shard: Shard, mask: Mask
               ) -> tuple[KernelCall, ...]:
    """``calls`` (a diagonal pair's split blocks) with ``shard``'s whole documents added."""
    whole = whole_call(shard, mask)
    if whole is None:
        return calls
    for i, call in enumerate(calls):
        if (call.varlen and (call.window, call.causal) == (whole.window, whole.causal)
                and _rebuilt_exactly(call)):
            return (*calls[:i], _join(call, whole), *calls[i + 1:])
    return (*calls, whole)


def _rebuilt_exactly(call: KernelCall) -> bool:
    """Whether each block of ``call`` is the one flash computes from its sequence's lengths
    and the call's window (``KernelCall.sequence_blocks`` without the blocks)."""
    for blk in call.blocks:
        n, m = blk.q_stop - blk.q_start, blk.k_stop - blk.k_start
        if Block(0, n, 0, m, blk.kind, blk.lo, blk.hi) != Block.of_window(
                n, m, call.window, call.causal):
            return False
    return True


def _join(call: KernelCall, whole: KernelCall) -> KernelCall:
    """One varlen call: ``call``'s sequences, then ``whole``'s (their query rows are
    disjoint: other documents). Without blocks: ``sequence_blocks`` rebuilds them."""
    def cat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return frozen(np.concatenate((a, a[-1] + b[1:])))

    return KernelCall((), True, join_runs(call.q_runs + whole.q_runs),
                      join_runs(call.k_runs + whole.k_runs), cat(call.cu_q, whole.cu_q),
                      cat(call.cu_k, whole.cu_k), call.window, call.causal)


def joined(starts: np.ndarray, stops: np.ndarray) -> Runs:
    """Row ranges ``starts[i]:stops[i]``, in order, with touching ones joined."""
    if not len(starts):
        return ()
    breaks = np.flatnonzero(stops[:-1] != starts[1:]) + 1
    firsts = np.concatenate(([0], breaks))
    lasts = np.concatenate((breaks - 1, [len(starts) - 1]))
    return tuple(zip(starts[firsts].tolist(), stops[lasts].tolist()))
