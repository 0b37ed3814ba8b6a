"""The Ulysses half of the hybrid: a head-parallel all-to-all inside groups of U ranks.

Before the ring, each rank of a Ulysses group trades heads for sequence: it sends head
slice u of its shard to member u and receives its own head slice of every member's shard,
ending with 1/U of the heads over U shards of the sequence, in position order
(``RingSchedule.member_runs``: a zigzag group holds two runs of positions, a whole-ring
group's causal sequence is one kernel call, where the ranks' chunks in rank order were 2U
pieces), or, where documents are held whole, one after the other. The burst ring then runs
across groups (USP / BurstEngine's hybrid). After the ring the inverse all-to-all brings
the output back. Both directions are autograd functions whose backward is the other. Q, K
and V go in one all-to-all (one message a peer holds the three pieces), and so do their
gradients: one post, header and NCCL group where three had been. Every message carries the
call's header (``tag``), checked on arrival.

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
from ..comm.joined import Joined
from ..plan.segments import Runs


Dims = tuple[tuple[int, int], ...]  # (split dim, concatenation dim) of each tensor


def _shuffle(xs: Sequence[torch.Tensor], dims: Dims, peers: Sequence[int], me: int, group,
             phase: str, tag: CallTag | None, runs: Runs | None = None,
             seq_on_cat: bool = True) -> tuple[torch.Tensor, ...]:
    """Split each of ``xs`` in len(peers) along its split dim, piece u of every one to
    peers[u] in one message; concatenate what arrives along each one's concatenation dim in
    peer order. One message a peer for all of them: Q, K and V (or their gradients) cost
    one post, header and NCCL group, not three. ``runs``: the member's rows in position
    order (``RingSchedule.member_runs``) where they are not its peers' rows one after the
    other; the sequence is the concatenation dim (``seq_on_cat``) or the split dim."""
    at = peers.index(me)
    if runs is not None and not seq_on_cat:
        pieces = [_members_rows_back(x, split, runs, len(peers)) for x, (split, _) in
                  zip(xs, dims)]
    else:
        pieces = [x.chunk(len(peers), dim=split) for x, (split, _) in zip(xs, dims)]
    mine = [p[at] for p in pieces]
    sends = {p: [piece[u] for piece in pieces] for u, p in enumerate(peers) if p != me}
    check = None if tag is None else HeaderCheck(tag, phase, xs[0].device, me, len(peers) - 1)
    got = exchange(group, sends, {p: mine for p in peers if p != me}, phase, check)
    held = [mine if p == me else got[p] for p in peers]
    if runs is not None and seq_on_cat:
        return tuple(torch.cat([held[u][i].narrow(cat, start, n) for u, start, n in runs],
                               dim=cat) for i, (_, cat) in enumerate(dims))
    # the own piece (``Joined`` on the way back) is written part by part into its place
    return tuple(Joined(tuple(h[i] for h in held), cat).joined()
                 for i, (_, cat) in enumerate(dims))


def _members_rows_back(x: torch.Tensor, dim: int, runs: Runs, peers: int) -> list[Joined]:
    """The member's rows of ``x`` (along ``dim``, in ``runs``' order) as each peer's own
    rows, in the peer's row order: the pieces the way back sends, each as views of ``x``
    that go into its message one by one (``Joined``: no joined copy first)."""
    back: list[list[tuple[int, torch.Tensor]]] = [[] for _ in range(peers)]
    at = 0
    for u, start, n in runs:
        back[u].append((start, x.narrow(dim, at, n)))
        at += n
    return [Joined(tuple(t for _, t in sorted(rows, key=lambda r: r[0])), dim)
            for rows in back]


class _Shuffle(torch.autograd.Function):
    """``_shuffle`` of several tensors as one autograd node; its backward is the inverse
    shuffle of their gradients (zeros where a loss left one out: every rank trades all)."""

    @staticmethod
    def forward(ctx, peers, me, group, dims, tag, runs, seq_on_cat, *xs):
        ctx.args = (peers, me, group, dims, tag, runs, seq_on_cat)
        return _shuffle(xs, dims, peers, me, group, "forward", tag, runs, seq_on_cat)

    @staticmethod
    def backward(ctx, *grads):
        peers, me, group, dims, tag, runs, seq_on_cat = ctx.args
        back = tuple((cat, split) for split, cat in dims)
        return (None,) * 7 + _shuffle(grads, back, peers, me, group, "backward", tag, runs,
                                      not seq_on_cat)


def heads_to_sequence(xs: Sequence[torch.Tensor], peers: Sequence[int], group, seq_dim: int,
                      head_dim: int, tag: CallTag | None = None, runs: Runs | None = None
                      ) -> tuple[torch.Tensor, ...]:
    """[.., s, .., h, ..] on each of U peers -> [.., U*s, .., h/U, ..] (peer order, or
    ``runs``' order), for each of ``xs`` (Q, K, V: one all-to-all for the three)."""
    dims = ((head_dim, seq_dim),) * len(xs)
    return _Shuffle.apply(tuple(peers), dist.get_rank(), group, dims, tag, runs, True, *xs)


def sequence_to_heads(x: torch.Tensor, peers: Sequence[int], group, seq_dim: int,
                      head_dim: int, tag: CallTag | None = None, runs: Runs | None = None
                      ) -> torch.Tensor:
    """The inverse of ``heads_to_sequence``, for one tensor."""
    return _Shuffle.apply(tuple(peers), dist.get_rank(), group, ((seq_dim, head_dim),), tag,
                          runs, False, x)[0]


def outputs_to_heads(out: torch.Tensor, lse: torch.Tensor, peers: Sequence[int], group,
                     tag: CallTag | None = None, runs: Runs | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ring's (out bshd, lse bhs) back to heads in one autograd node and one message a
    peer (module docstring): its backward trades both gradients on every rank."""
    return _Shuffle.apply(tuple(peers), dist.get_rank(), group, ((1, 2), (2, 1)), tag, runs,
                          False, out, lse)
