"""A document pack's kernel calls for one pair of ring members, made without a loop over
its documents.

A member's documents held whole pair only with themselves, on the diagonal (the member's
queries against its own keys), each under the plain mask: on its square block flash's
bottom-right window is the band, so all of them are one varlen call whose boundaries are
the documents' lengths (``whole_call``), made from the shard's arrays. The few blocks of
documents split over members are grouped as any blocks are (``varlen.plan_calls``); the
whole documents join their call of the same mask shape when flash, given only that call's
lengths and window, computes each of its blocks exactly (``with_whole``), else they are
one call more. Where the plan carves (``thresholds.CARVE_PACKS``: a grain), the whole
documents of at least the grain and ``thresholds.PACK_CARVE_MIN`` rows leave the arrays and join the split blocks, which
``plan_calls`` carves into cores of few shapes (``carved_whole``); the small ones stay one
call from the arrays.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from ..plan.blocks import Block, Mask
from ..plan.segments import Shard, frozen
from .varlen import KernelLaunch, Runs, boundaries, document_shape, join_runs, plan_calls


def carved_whole(split: Sequence[Block], shard: Shard, mask: Mask, grain: int | None,
                 least: int = 0) -> tuple[KernelLaunch, ...]:
    """A diagonal pair's calls: its split documents' blocks ``split`` grouped (and carved at
    ``grain``, where given, those of at least ``least`` rows and keys:
    ``thresholds.PACK_CARVE_MIN``, in the plan's key) with ``shard``'s whole documents of at
    least the grain and ``least`` rows, each its own square block under the plain ``mask``;
    the other whole documents joined in from the arrays (``with_whole``)."""
    blocks = list(split)
    if grain and len(shard.docs):
        large = shard.lens >= max(grain, least)
        if large.any():
            kind = "causal" if mask.causal else "full"
            blocks += [Block(r, r + n, r, r + n, kind) for r, n in
                       zip(shard.rows[large].tolist(), shard.lens[large].tolist())]
            small = ~large  # the member's rows are still ``shard.length``: only the
            shard = dataclasses.replace(  # arrays of the whole documents change
                shard, docs=frozen(shard.docs[small]), rows=frozen(shard.rows[small]),
                lens=frozen(shard.lens[small]))
    calls = plan_calls(blocks, varlen=True, dense_min_area=float("inf"), shape_free=True,
                       grain=grain, least=least)
    return with_whole(calls, shard, mask)


def alone_shard(lens: Sequence[int]) -> Shard:
    """A single member's pack as a shard of whole documents in sequence order (empty ones
    dropped): ``carved_whole``'s input where ``varlen.plan_alone`` would take the lengths."""
    n = np.asarray(lens, dtype=np.int64)
    starts = np.concatenate(([0], n.cumsum()[:-1])) if len(n) else n
    keep = n > 0
    return Shard.of((), np.flatnonzero(keep), starts[keep], n[keep])


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
