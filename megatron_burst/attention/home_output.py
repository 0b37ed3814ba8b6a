"""The home accumulators (out, lse; the 'ring' backward's dQ), taken from the first call.

Where a pass starts with one kernel call over every query row in row order (step 0 of a
causal sequence, which coalesces into one causal block; a window's band; and, where masks
change with the data, the one varlen call that holds a pack's step 0), that call's output
already holds every row's first partial. Copying it into a new accumulator was a full
pass over the output: 87 us a call for 8,192 rows x 64 heads x 128 in bf16 on an H100
(``benchmarks/slice_mask_profile.py --copies``: the causal window's two 45 us device
copies were this one copy). Here the output becomes the accumulator wherever it is laid
out as the accumulator would be: the call's format, contiguous, the home dtype
(``home_dtype``). Anything else is written into a new accumulator, as before, so the
values are the same bits either way. The 'ring' backward's dQ (its home accumulator) is
taken from its first call the same way; the travelling accumulators are not. Whether a
pass starts so is decided once, with its plan (``first_writes``: ``PassPlan.home_from_first``).

A forward whose step 0 writes every row's first partial in several runs that tile the rows
(``PassPlan.home_pieces``: block-causal documents' three cuDNN blocks and a varlen call of
three runs) joins its home from them: one copy for out and one for lse, where each run was a
launch of the merge's write, about 30 us of a host-bound rank's time each
(``benchmarks/results/h200x2_issue42_pieces/``: that forward 0.93 of the time).

The kernels return tensors of their own (none hands back a buffer it reuses on a later
call), so the accumulator owns its memory whichever way it was made.
"""
from __future__ import annotations

from typing import Iterator

import torch

from ..kernels.protocol import working_dtype
from ..kernels.run_calls import backward_partial, forward_partial, partial_runs
from .bound_plan import BoundPlan


def home_dtype(dtype: torch.dtype, uses: int, wide: bool = False) -> torch.dtype:
    """The dtype of a home accumulator whose rows each receive at most ``uses`` partial
    results: the inputs' own half precision where that is at most two (their sum, computed
    in fp32 and rounded once, is what an fp32 accumulator cast at the end gives, bit for
    bit), else fp32 (``working_dtype``); ``wide``: fp32 regardless."""
    if not wide and uses <= 2 and dtype in (torch.bfloat16, torch.float16):
        return dtype
    return working_dtype(dtype)


def forward_home(plan, dtype: torch.dtype, fused: bool, rows: int
                 ) -> tuple[torch.dtype, tuple[tuple[int, int], ...]]:
    """A forward pass's home dtype, and the rows kept apart in fp32 (``WideRows``; none
    where the whole home is fp32 or half). ``fused``: the outputs merge in the fused kernel
    that rounds once (``merge.fuses``). Where at most half the rows take more than two
    partials, the home stays in ``dtype`` and only those rows accumulate in fp32: causal
    blockwise at 8K tokens a GPU has 578 such rows of 8,192 on one rank, and its whole fp32
    home cost that rank 0.35 ms of conversions a forward on an H100 (the first writes into
    fp32 and the cast back), beside a 2 ms forward."""
    merged = not (plan.fresh[0] and plan.uses[0] <= 1)  # some row takes a partial by a merge
    if merged and not fused:
        return working_dtype(dtype), ()
    home = home_dtype(dtype, plan.uses[0])
    wide = plan.wide_rows  # (fp32 where ``dtype`` is half: a wide row is one more than two)
    if wide and home != dtype and 2 * sum([b - a for a, b in wide]) <= rows:
        return dtype, wide
    return home, ()


class WideRows:
    """An fp32 accumulator for a forward's ``runs`` of home rows (sorted, disjoint) beside
    a half-precision home: their partials are written and merged here, then cast into the
    home once at the end, so every row's bits are what an fp32 home cast at the end gives.
    It spans the first run's start to the last's stop, in bshd."""

    def __init__(self, runs: tuple[tuple[int, int], ...], out_b: torch.Tensor, fresh: bool):
        b, _, h, d = out_b.shape
        self.runs, self.lo = runs, runs[0][0]
        self.buf = accumulator((b, runs[-1][1] - self.lo, h, d), torch.float32, out_b.device,
                               fresh)

    def pieces(self, a: int, b: int) -> list[tuple[int, int, bool]]:
        """Rows ``a:b`` cut at the runs: (start, stop, kept apart here)."""
        out, at = [], a
        for x, y in self.runs:
            if y <= at:
                continue
            if x >= b:
                break
            if x > at:
                out.append((at, x, False))
            at = min(y, b)
            out.append((max(x, a), at, True))
        if at < b:
            out.append((at, b, False))
        return out

    def targets(self, out_b: torch.Tensor, a: int, b: int
                ) -> Iterator[tuple[torch.Tensor, int, int, int]]:
        """Where rows ``a:b``'s partials fold: (accumulator, its row for ``start``, start,
        stop) for each piece, the kept rows' in this fp32 buffer, the rest in the home."""
        for x, y, apart in self.pieces(a, b):
            yield (self.buf, x - self.lo, x, y) if apart else (out_b, x, x, y)

    def rows(self, a: int, b: int) -> torch.Tensor:
        return self.buf[:, a - self.lo:b - self.lo]

    def take(self, out_b: torch.Tensor) -> None:
        """The first call's partials of the runs, from a home that was that call's output."""
        for a, b in self.runs:
            self.rows(a, b).copy_(out_b[:, a:b])

    def put(self, out_b: torch.Tensor) -> None:
        """The runs, accumulated, cast into the home."""
        for a, b in self.runs:
            out_b[:, a:b].copy_(self.rows(a, b))


def accumulator(shape, dtype, device, fresh: bool) -> torch.Tensor:
    """Uninitialised when every row's first partial is written (``fresh``), else zeros."""
    return (torch.empty if fresh else torch.zeros)(shape, dtype=dtype, device=device)


def new_home(shape: tuple, lse_shape: tuple, home: torch.dtype, lse_dtype: torch.dtype,
             device, fresh: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A forward's (out, lse) made before any call: uninitialised where every row is
    written first (``fresh``), else zeros and -inf (nothing seen yet)."""
    lse = torch.empty(lse_shape, dtype=lse_dtype, device=device)
    if not fresh:
        lse.fill_(float("-inf"))
    return accumulator(shape, home, device, fresh), lse


def _adopted(t: torch.Tensor, bound: BoundPlan, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """``t`` (bshd) in the call's format where it is laid out as a new accumulator would be
    (contiguous, ``shape``, ``dtype``), else a new accumulator holding a copy of it."""
    own = bound.bshd(t)
    if t.dtype == dtype and tuple(own.shape) == tuple(shape) and own.is_contiguous():
        return own
    own = torch.empty(shape, dtype=dtype, device=t.device)
    bound.bshd(own).copy_(t)
    return own


def first_call_home(bound: BoundPlan, call, qb: torch.Tensor, kb: torch.Tensor,
                    vb: torch.Tensor, shape: tuple, home: torch.dtype,
                    lse_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(out in the call's format, lse [b, h, s]) after ``call``, which covers every row
    (``PassPlan.home_from_first``): its own output and lse where their layout and dtype
    are the accumulators', else copies."""
    o, o_lse = forward_partial(bound.kernel, call, qb, kb, vb, bound.scale)
    lse = o_lse
    if lse.dtype != lse_dtype or not lse.is_contiguous():
        lse = torch.empty(o_lse.shape, dtype=lse_dtype, device=qb.device)
        lse.copy_(o_lse)
    return _adopted(o, bound, shape, home), lse


def pieces_home(bound: BoundPlan, calls, qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor,
                home: torch.dtype, lse_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(out in the call's format, lse [b, h, s]) after step 0's ``calls``, whose query runs
    are every row's first partial and tile the rows once (``PassPlan.home_pieces``): each
    output cut at its runs, the pieces joined in row order by one copy for out and one for
    lse. The same bits as writing each run into a new home, in two launches, not one a run."""
    pieces = []
    for call in calls:
        o, o_lse = forward_partial(bound.kernel, bound.launch(call), qb, kb, vb, bound.scale)
        pieces += [(a, bound.bshd(x), lse) for a, x, lse in partial_runs(call, o, o_lse)]
    pieces.sort(key=lambda piece: piece[0])
    out = torch.cat([o for _, o, _ in pieces], 0 if bound.seq_first else 1)
    lse = torch.cat([lse for _, _, lse in pieces], 2)
    return out.to(home), lse.to(lse_dtype)  # (no copy where the kernels' dtypes are these)


def first_home(bound: BoundPlan, calls, qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor,
               shape: tuple, home: torch.dtype, lse_dtype: torch.dtype, pieces: bool,
               wide_runs: tuple) -> tuple:
    """A forward's home made by its first call(s): ``pieces_home`` of step 0's ``calls``
    (``pieces``), or ``first_call_home`` of ``calls[0]``. Returns (out, lse, out in bshd,
    the ``WideRows`` of ``wide_runs`` taken from it, or None)."""
    if pieces:
        out, lse = pieces_home(bound, calls, qb, kb, vb, home, lse_dtype)
    else:
        out, lse = first_call_home(bound, bound.launch(calls[0]), qb, kb, vb, shape, home,
                                   lse_dtype)
    out_b = bound.bshd(out)
    wide = WideRows(wide_runs, out_b, True) if wide_runs else None
    if wide is not None:
        wide.take(out_b)
    return out, lse, out_b, wide


def first_grad_home(bound: BoundPlan, call, dob: torch.Tensor, qb: torch.Tensor,
                    kb: torch.Tensor, vb: torch.Tensor, ob: torch.Tensor, lse: torch.Tensor,
                    dk_b: torch.Tensor, dv_b: torch.Tensor, first_keys: tuple[bool, ...],
                    shape: tuple, home: torch.dtype) -> torch.Tensor:
    """dQ in the call's format after ``call``, which covers every row (its dK/dV folded
    into ``dk_b``/``dv_b``): the kernel's own dQ where laid out as the accumulator, else a
    copy."""
    gq = backward_partial(bound.kernel, call, dob, qb, kb, vb, ob, lse, bound.scale, dk_b,
                          dv_b, first_keys)
    return _adopted(gq, bound, shape, home)
