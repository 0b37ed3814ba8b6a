"""The Ulysses half of the hybrid: a head-parallel all-to-all inside groups of U ranks.

Before the ring, each rank of a Ulysses group trades heads for sequence: it sends head
slice u of its shard to member u and receives its own head slice of every member's shard,
ending with 1/U of the heads over U shards of the sequence. The burst ring then runs
across groups (USP / BurstEngine's hybrid). After the ring the inverse all-to-all brings
the output back. Both directions are autograd functions whose backward is the other. Every
piece carries the call's header (``tag``), checked on arrival.

Where lse is handed back too, out and lse go back through ONE autograd node
(``outputs_to_heads``): its backward trades both gradients on every rank, a zero one where
that rank's loss leaves lse (or out) out, so no rank skips an all-to-all its peers post.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from ..comm.exchange import exchange
from ..comm.headers import CallTag, HeaderCheck


def _shuffle(x: torch.Tensor, peers: Sequence[int], me: int, group, split_dim: int,
             cat_dim: int, phase: str, tag: CallTag | None) -> torch.Tensor:
    """Split ``x`` in len(peers) along ``split_dim``, piece u to peers[u]; concatenate what
    arrives along ``cat_dim`` in peer order."""
    pieces = x.chunk(len(peers), dim=split_dim)
    sends = {p: pieces[u] for u, p in enumerate(peers) if p != me}
    check = None if tag is None else HeaderCheck(tag, phase, x.device, me, len(peers) - 1)
    got = exchange(group, sends, {p: pieces[peers.index(me)] for p in peers if p != me}, phase,
                   check)
    mine = pieces[peers.index(me)]
    return torch.cat([mine if p == me else got[p] for p in peers], dim=cat_dim)


class _Shuffle(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, peers, me, group, split_dim, cat_dim, tag):
        ctx.args = (peers, me, group, split_dim, cat_dim, tag)
        return _shuffle(x, peers, me, group, split_dim, cat_dim, "forward", tag)

    @staticmethod
    def backward(ctx, grad):
        peers, me, group, split_dim, cat_dim, tag = ctx.args
        return (_shuffle(grad, peers, me, group, cat_dim, split_dim, "backward",
                         tag), None, None, None, None, None, None)


def heads_to_sequence(x: torch.Tensor, peers: Sequence[int], group, seq_dim: int,
                      head_dim: int, tag: CallTag | None = None) -> torch.Tensor:
    """[.., s, .., h, ..] on each of U peers -> [.., U*s, .., h/U, ..] (peer order)."""
    return _Shuffle.apply(x, tuple(peers), dist.get_rank(), group, head_dim, seq_dim, tag)


def sequence_to_heads(x: torch.Tensor, peers: Sequence[int], group, seq_dim: int,
                      head_dim: int, tag: CallTag | None = None) -> torch.Tensor:
    """The inverse of ``heads_to_sequence``."""
    return _Shuffle.apply(x, tuple(peers), dist.get_rank(), group, seq_dim, head_dim, tag)


class _OutputsShuffle(torch.autograd.Function):
    """(out [b, s, h, d], lse [b, h, s]) from sequence back to heads, one node: its backward
    runs both inverse all-to-alls whichever gradients this rank's loss gave (zeros for the
    other: autograd materialises them)."""

    @staticmethod
    def forward(ctx, out, lse, peers, me, group, tag):
        ctx.args = (peers, me, group, tag)
        return (_shuffle(out, peers, me, group, 1, 2, "forward", tag),
                _shuffle(lse, peers, me, group, 2, 1, "forward", tag))

    @staticmethod
    def backward(ctx, dout, dlse):
        peers, me, group, tag = ctx.args
        return (_shuffle(dout.contiguous(), peers, me, group, 2, 1, "backward", tag),
                _shuffle(dlse.contiguous(), peers, me, group, 1, 2, "backward", tag),
                None, None, None, None)


def outputs_to_heads(out: torch.Tensor, lse: torch.Tensor, peers: Sequence[int], group,
                     tag: CallTag | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ring's (out bshd, lse bhs) back to heads in one autograd node (module docstring)."""
    return _OutputsShuffle.apply(out, lse, tuple(peers), dist.get_rank(), group, tag)
