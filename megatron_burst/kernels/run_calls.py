"""Running a ring step's kernel calls and folding their results into the accumulators.

A call (``varlen.KernelLaunch``: one dense block, or a varlen call of many) gives its
partial results over its query runs back to back (``forward_partial``,
``backward_partial``; a forward read in place gives every local row at its own row,
``partial_offsets``); ``run_forward`` and ``run_backward`` fold them into the pass's
accumulators run by run: the forward merges (out, lse) by the online softmax
(``merge.fold_rows``: row offsets into the fused kernel, views elsewhere), the backward adds
gradients (views). A run whose rows nothing has touched
yet is written instead (``attention.first_writes`` decides which), and a pass whose first
call covers every row can take that call's output as its accumulator
(``attention.home_output``).
"""
from __future__ import annotations

import torch

from .merge import fold_rows
from .varlen import KernelLaunch, Runs, call_runs, gather


def run_offsets(runs: Runs):
    """(start, stop, offset in the packed rows) of each run."""
    off = 0
    for a, b in runs:
        yield a, b, off
        off += b - a


def partial_offsets(call: KernelLaunch, rows: int):
    """(start, stop, offset in the partial) of each query run of ``call``, whose partial
    (``forward_partial``'s) has ``rows`` rows: packed back to back, or at the runs' own rows
    where it holds every local query row (the in-place form). The runs are disjoint local
    rows, so the packed partial has that many rows only where they tile them, and there
    the two offsets agree."""
    runs = call_runs(call, "q")
    if len(runs) == 1:  # (most calls: a tuple, no generator)
        a, b = runs[0]
        return ((a, b, 0 if rows == b - a else a),)
    if sum(b - a for a, b in runs) == rows:
        return run_offsets(runs)
    return ((a, b, a) for a, b in runs)


def _rows(t: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop`` of a [b, s, ...] view; the tensor itself when that is all of it
    (a slice is an op of its own on the host: most blocks of a plain sequence span it)."""
    return t if start == 0 and stop == t.shape[1] else t[:, start:stop]


def _lse_rows(lse: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return lse if start == 0 and stop == lse.shape[2] else lse[:, :, start:stop]


def forward_partial(kernel, call: KernelLaunch, q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``call``'s (out, lse) over its query runs back to back (``call_runs``), or over every
    local query row where the kernel reads the call in place (``varlen.InPlaceBounds``;
    ``partial_offsets`` finds the runs in either): bshd [b, rows, h, d] and [b, h, rows]."""
    if not call.varlen:
        blk = call.blocks[0]
        a, b, c, d = blk.q_start, blk.q_stop, blk.k_start, blk.k_stop
        return kernel.forward(_rows(q, a, b), _rows(k, c, d), _rows(v, c, d), blk, scale)
    if kernel.varlen_in_place and call.in_place is not None:  # every local row, no gather
        o, o_lse = kernel.forward_varlen_in_place(q[0], k[0], v[0], call, scale)
    else:
        o, o_lse = kernel.forward_varlen(gather(q[0], call.q_runs), gather(k[0], call.k_runs),
                                         gather(v[0], call.k_runs), call, scale)
    return o[None], (seen_nothing(o_lse) if call.keyless else o_lse)[None]


def run_forward(kernel, call: KernelLaunch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                out: torch.Tensor, lse: torch.Tensor, scale: float,
                first: tuple[bool, ...], wide=None) -> None:
    """Compute ``call`` and fold it into the accumulators (bshd views, lse [b, h, s]).

    ``first``: per query run of the call (``call_runs``), whether nothing has been written
    to its rows yet: then the partial is written there, not merged. ``wide``: the rows kept
    apart in fp32 (``attention.home_output.WideRows``: it says where each piece of a run
    folds), or None (every row folds into ``out``).
    """
    o, o_lse = forward_partial(kernel, call, q, k, v, scale)
    for (a, b, off), write in zip(partial_offsets(call, o.shape[1]), first, strict=True):
        pieces = ((out, a, a, b),) if wide is None else wide.targets(out, a, b)
        for target, at, x, y in pieces:
            fold_rows(target, lse, at, x, o, o_lse, off + x - a, y - x, write)


def partial_runs(call: KernelLaunch, o: torch.Tensor, o_lse: torch.Tensor):
    """``call``'s partial (``forward_partial``'s) cut at its query runs: (the run's first
    home row, its out rows, its lse rows) per run, views, the tensors themselves where one
    run is all of them."""
    for a, b, off in partial_offsets(call, o.shape[1]):
        yield a, _rows(o, off, off + b - a), _lse_rows(o_lse, off, off + b - a)


def seen_nothing(lse: torch.Tensor) -> torch.Tensor:
    """lse with flash's +inf (a sequence with queries and no keys) made -inf: the merge's
    "nothing seen". The output rows are zeros already."""
    return lse.masked_fill(lse == float("inf"), float("-inf"))


def backward_partial(kernel, call: KernelLaunch, dout: torch.Tensor, q: torch.Tensor,
                     k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                     scale: float, dk: torch.Tensor, dv: torch.Tensor,
                     first_keys: tuple[bool, ...]) -> torch.Tensor:
    """``call``'s gradients: dK/dV folded into ``dk``/``dv`` (written where ``first_keys``,
    per key run), dQ over its query runs back to back (bshd) returned for the caller.
    A key row that two blocks use appears twice: the first may write it, the second adds."""
    if not call.varlen:
        blk = call.blocks[0]
        a, b, c, d = blk.q_start, blk.q_stop, blk.k_start, blk.k_stop
        gq, gk, gv = kernel.backward(_rows(dout, a, b), _rows(q, a, b), _rows(k, c, d),
                                     _rows(v, c, d), _rows(out, a, b), _lse_rows(lse, a, b),
                                     blk, scale)
        _fold(_rows(dk, c, d), gk, first_keys[0])
        _fold(_rows(dv, c, d), gv, first_keys[0])
        return gq
    qr, kr = call.q_runs, call.k_runs
    gq, gk, gv = kernel.backward_varlen(
        gather(dout[0], qr), gather(q[0], qr), gather(k[0], kr), gather(v[0], kr),
        gather(out[0], qr), gather(lse[0], qr, dim=1).contiguous(), call, scale)
    for (a, b, off), write in zip(run_offsets(kr), first_keys, strict=True):
        _fold(dk[0, a:b], gk[off:off + b - a], write)
        _fold(dv[0, a:b], gv[off:off + b - a], write)
    return gq[None]


def run_backward(kernel, call: KernelLaunch, dout: torch.Tensor, q: torch.Tensor,
                 k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 scale: float, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                 first: tuple[tuple[bool, ...], tuple[bool, ...]]) -> None:
    """Gradients of ``call``'s blocks, folded into the accumulators dq, dk, dv.

    ``first``: per query run and per key run of the call (``call_runs``), whether nothing
    has been written to its rows yet: then the gradient is written there, not added.
    """
    gq = backward_partial(kernel, call, dout, q, k, v, out, lse, scale, dk, dv, first[1])
    if not call.varlen:
        blk = call.blocks[0]
        _fold(_rows(dq, blk.q_start, blk.q_stop), gq, first[0][0])
        return
    for (a, b, off), write in zip(run_offsets(call.q_runs), first[0], strict=True):
        _fold(dq[0, a:b], gq[0, off:off + b - a], write)


def _fold(acc: torch.Tensor, grad: torch.Tensor, fresh: bool) -> None:
    if fresh:
        acc.copy_(grad)
    else:
        acc += grad
