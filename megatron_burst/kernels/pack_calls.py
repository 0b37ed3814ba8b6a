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

from ..plan.blocks import Block, Mask
from ..plan.segments import Shard
from .varlen import KernelLaunch, Runs, boundaries, document_shape, join_runs


def whole_call(shard: Shard, mask: Mask) -> KernelLaunch | None:
    """The documents ``shard`` holds whole, each against itself under ``mask``, as one
    varlen call (None without any)."""
    if not len(shard.docs):
        return None
    cu = boundaries(shard.lens)
    runs = joined(shard.rows, shard.rows + shard.lens)
    return KernelLaunch((), True, runs, runs, cu, cu, *document_shape(mask))


def with_whole(calls: tuple[KernelLaunch, ...], shard: Shard, mask: Mask
               ) -> tuple[KernelLaunch, ...]:
    """``calls`` (a diagonal pair's split blocks) with ``shard``'s whole documents added."""
    if not len(shard.docs):
        return calls
    shape = document_shape(mask)
    for i, call in enumerate(calls):
        if call.varlen and (call.window, call.causal) == shape and _rebuilt_exactly(call):
            return (*calls[:i], _join(call, shard), *calls[i + 1:])
    return (*calls, whole_call(shard, mask))


def _rebuilt_exactly(call: KernelLaunch) -> bool:
    """Whether each block of ``call`` is the one flash computes from its sequence's lengths
    and the call's window (``KernelLaunch.sequence_blocks`` without the blocks)."""
    for blk in call.blocks:
        n, m = blk.q_stop - blk.q_start, blk.k_stop - blk.k_start
        if Block(0, n, 0, m, blk.kind, blk.lo, blk.hi) != Block.of_window(
                n, m, call.window, call.causal):
            return False
    return True


def _join(call: KernelLaunch, shard: Shard) -> KernelLaunch:
    """One varlen call: ``call``'s sequences, then ``shard``'s whole documents (their query
    rows are disjoint: other documents). Without blocks: ``sequence_blocks`` rebuilds them."""
    runs = joined(shard.rows, shard.rows + shard.lens)
    tail = shard.lens.cumsum()

    def cat(cu: np.ndarray) -> np.ndarray:
        out = np.concatenate((cu, cu[-1] + tail))
        out.flags.writeable = False  # a fresh array: read-only, as every call's boundaries
        return out

    cu_q = cat(call.cu_q)
    cu_k = cu_q if np.array_equal(call.cu_q, call.cu_k) else cat(call.cu_k)
    return KernelLaunch((), True, join_runs(call.q_runs + runs), join_runs(call.k_runs + runs),
                      cu_q, cu_k, call.window, call.causal)


def joined(starts: np.ndarray, stops: np.ndarray) -> Runs:
    """Row ranges ``starts[i]:stops[i]``, in order, with touching ones joined."""
    if not len(starts):
        return ()
    gaps = stops[:-1] != starts[1:]
    if not gaps.any():  # the usual case: a shard's whole documents are its last rows
        return ((int(starts[0]), int(stops[-1])),)
    breaks = np.flatnonzero(gaps) + 1
    firsts = np.concatenate(([0], breaks))
    lasts = np.concatenate((breaks - 1, [len(starts) - 1]))
    return tuple(zip(starts[firsts].tolist(), stops[lasts].tolist()))
