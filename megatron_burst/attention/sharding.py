"""Sharding a sequence across the context-parallel group, and gathering it back.

Where each position goes is ``placement``'s (the one source of truth); this module copies
rows accordingly. ``zigzag`` (rank r holds chunks r and 2G-1-r of 2G) is Megatron's
``get_batch_on_this_cp_rank`` split; ``contiguous`` gives rank r chunk r of G; with
``cu_seqlens`` every document is placed as ``placement`` says (``whole_docs`` keeps short
documents whole on one rank; padding rows are zeros).
``shard_seq`` is a slice (differentiable, no communication). ``unshard_seq`` all-gathers
and is differentiable too: its backward hands each rank the gradient of its own tokens,
summed over ranks (a reduce-scatter). That is the gradient of the sum of the ranks' losses:
exact for a loss each rank computes on its own part (or that one rank computes alone); a
loss computed alike on every rank (replicated) counts once per rank, so divide it by the
group's size (as ``torch.distributed.nn.functional.all_gather`` does the same).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from ..decide.options import NotGiven, is_given
from ..plan.mask_placement import mask_placement
from ..plan.packs import doc_lengths
from ..plan.layouts import AREA, MASK, PLAIN, Chunked, layout_named
from ..plan.placement import chunks_of, local_length, placement
from ..plan.segments import Shard
from ..plan.slices import SliceMask


def group_ranks(group: dist.ProcessGroup | None, world: int | None = None) -> list[int]:
    """Global ranks of ``group`` in group order (no communication)."""
    if group is None or group == dist.group.WORLD:
        return list(range(world if world is not None else dist.get_world_size()))
    return dist.get_process_group_ranks(group)


def group_size_rank(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(world, rank) of ``group``; (1, 0) when torch.distributed is not initialised."""
    if group.__class__ is _PROCESS_GROUP:  # asked of the group itself: no Python between
        return group.size(), group.rank()
    if not dist.is_available() or not dist.is_initialized():
        return 1, 0
    if group is None:  # the default group, asked of itself (c10d's lookups: ~10 us a call)
        world = dist.group.WORLD
        if world.__class__ is _PROCESS_GROUP:
            return world.size(), world.rank()
    return dist.get_world_size(group), dist.get_rank(group)


_PROCESS_GROUP = dist.ProcessGroup if dist.is_available() else None


def group_name(group: dist.ProcessGroup | None) -> str | None:
    """The group's name (the default group's for None); None without torch.distributed."""
    if group.__class__ is _PROCESS_GROUP:
        return group.group_name
    if not dist.is_available() or not dist.is_initialized():
        return None
    return (group if group is not None else dist.group.WORLD).group_name


def _chunk(layout: str, length: int, world: int, role: str = PLAIN) -> int:
    """Chunk length of a sequence in ``layout`` (ValueError where its divisor fails it)."""
    parts = layout_named(layout, role).divisor(world)
    if length % parts:
        raise ValueError(f"sequence length ({length}) must be divisible by {parts} for layout "
                         f"{layout!r} with {world} ranks")
    return length // parts


def _documents(layout: str, cu_seqlens: torch.Tensor | None, length: int) -> tuple[int, ...] | None:
    """Document lengths to shard by, or None for the plain chunked fast path."""
    chunked = isinstance(layout_named(layout), Chunked)
    if cu_seqlens is None or not layout_named(layout).places_documents:
        return None if chunked else (length,)
    return doc_lengths(cu_seqlens)


def _masked(layout, cu_seqlens, mask, total: int, world: int) -> tuple[Shard, ...] | None:
    """The ranks' shards under slice mask ``mask`` (None without one), checked: a mask
    with boundaries, a layout that cannot place a mask, or slices past the sequence raise
    ValueError. A layout left out is 'area' with a mask."""
    if mask is None:
        return None
    if not isinstance(mask, SliceMask):
        raise ValueError(f"mask must be a megatron_burst.SliceMask or None, got "
                         f"{type(mask).__name__}")
    if cu_seqlens is not None:
        raise ValueError("cu_seqlens cannot be combined with mask= (documents are slices of "
                         "the mask: put them in it)")
    layout = layout if is_given(layout) else AREA.name
    layout_named(layout, MASK)  # a layout that places no mask raises first
    if mask.extent > total:
        raise ValueError(f"mask names positions up to {mask.extent} but the sequence has "
                         f"{total} tokens")
    _chunk(layout, total, world, MASK)
    return mask_placement(layout, world, total, mask)


def _plain(layout) -> str:
    return layout if is_given(layout) else layout.default


def shard_seq(x_full: torch.Tensor, group: dist.ProcessGroup | None = None, *,
              layout: str = NotGiven("zigzag"), seq_dim: int = 1,
              cu_seqlens: torch.Tensor | None = None,
              mask: SliceMask | None = None) -> torch.Tensor:
    """This rank's part of ``x_full`` along ``seq_dim`` (same on every rank's input).
    With ``mask`` (a ``SliceMask``): the rows ``burst_attn(..., mask=mask)`` takes, placed
    by ``layout`` (default 'area': balanced by the mask's visible area)."""
    seq_dim = _dim(seq_dim, x_full, "x_full")
    world, rank = group_size_rank(group)
    shards = _masked(layout, cu_seqlens, mask, x_full.shape[seq_dim], world)
    if shards is not None:
        return shard_documents(x_full, (x_full.shape[seq_dim],), world, rank, seq_dim, "",
                               shards)
    layout = _plain(layout)
    lens = _documents(layout, cu_seqlens, x_full.shape[seq_dim])
    if lens is not None:
        if sum(lens) != x_full.shape[seq_dim]:
            raise ValueError(f"cu_seqlens covers {sum(lens)} tokens but x_full has "
                             f"{x_full.shape[seq_dim]} along seq_dim={seq_dim}")
        local_length(layout, world, lens)  # raises for layouts that cannot place them
        return shard_documents(x_full, lens, world, rank, seq_dim, layout)
    chunk = _chunk(layout, x_full.shape[seq_dim], world)
    parts = [x_full.narrow(seq_dim, c * chunk, chunk) for c in chunks_of(layout, world, rank)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=seq_dim)


def _dim(seq_dim: int, x: torch.Tensor, name: str) -> int:
    """``seq_dim`` as a dimension of ``x`` counted from 0 (a negative one from the end)."""
    if not isinstance(seq_dim, int) or isinstance(seq_dim, bool) or not (
            -x.dim() <= seq_dim < x.dim()):
        raise ValueError(f"seq_dim must be a dimension of {name} (an int in "
                         f"[{-x.dim()}, {x.dim() - 1}]), got {seq_dim!r}")
    return seq_dim % x.dim()


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, world):
        ctx.group, ctx.world = group, world
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        mine = torch.empty_like(grad[0])
        dist.reduce_scatter(mine, list(grad.unbind(0)), group=ctx.group)
        return mine, None, None


def unshard_seq(x_local: torch.Tensor, group: dist.ProcessGroup | None = None, *,
                layout: str = NotGiven("zigzag"), seq_dim: int = 1,
                cu_seqlens: torch.Tensor | None = None,
                mask: SliceMask | None = None) -> torch.Tensor:
    """The full sequence from every rank's shard (inverse of ``shard_seq``, the same
    ``layout``, ``cu_seqlens`` and ``mask``); its gradient is the sum of the ranks' losses'
    (see the module docstring)."""
    seq_dim = _dim(seq_dim, x_local, "x_local")
    world, _ = group_size_rank(group)
    total = x_local.shape[seq_dim] * world
    shards = _masked(layout, cu_seqlens, mask, total, world)
    if shards is not None:
        stacked = _GatherSeq.apply(x_local, group, world) if world > 1 else x_local[None]
        return unshard_documents(stacked, (total,), world, seq_dim, "", shards)
    layout = _plain(layout)
    lens = _documents(layout, cu_seqlens, x_local.shape[seq_dim] * world)
    if lens is not None:
        if local_length(layout, world, lens) != x_local.shape[seq_dim]:
            raise ValueError(f"cu_seqlens gives {local_length(layout, world, lens)} rows per "
                             f"rank in layout {layout!r}, but x_local has "
                             f"{x_local.shape[seq_dim]} along seq_dim={seq_dim}")
        stacked = _GatherSeq.apply(x_local, group, world) if world > 1 else x_local[None]
        return unshard_documents(stacked, lens, world, seq_dim, layout)
    if world == 1:
        return x_local
    chunk = _chunk(layout, x_local.shape[seq_dim] * world, world)
    stacked = _GatherSeq.apply(x_local, group, world)  # [world, ...]
    pieces: list[torch.Tensor | None] = [None] * layout_named(layout).divisor(world)
    for r in range(world):
        for i, c in enumerate(chunks_of(layout, world, r)):
            pieces[c] = stacked[r].narrow(seq_dim, i * chunk, chunk)
    return torch.cat(pieces, dim=seq_dim)


def shard_documents(x_full: torch.Tensor, lens: tuple[int, ...], world: int, rank: int,
                    seq_dim: int, layout: str, shards: tuple[Shard, ...] | None = None
                    ) -> torch.Tensor:
    """This rank's rows of every document (padding rows are zeros): one gather by index.
    ``shards``: the ranks' shards, where ``placement`` does not make them (a mask's)."""
    shards = shards if shards is not None else placement(layout, world, lens)
    index = rank_index(shards[rank], _starts(lens))
    if len(index) and index[0] >= 0 and (np.diff(index) == 1).all():
        return x_full.narrow(seq_dim, int(index[0]), len(index))  # one run: a view
    pad = index < 0
    rows = x_full.index_select(seq_dim, _on(np.where(pad, 0, index), x_full))
    if pad.any():
        rows = rows.index_fill(seq_dim, _on(np.flatnonzero(pad), rows), 0)
    return rows


def _on(index: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A host index as a tensor on ``like``'s device (index ops take no index elsewhere)."""
    return torch.from_numpy(index).to(like.device)


def unshard_documents(stacked: torch.Tensor, lens: tuple[int, ...], world: int,
                      seq_dim: int, layout: str, shards: tuple[Shard, ...] | None = None
                      ) -> torch.Tensor:
    """The packed, unpadded sequence from every rank's shard (``stacked[r]``): one gather
    by index from the ranks' shards laid end to end."""
    shards = shards if shards is not None else placement(layout, world, lens)
    starts = _starts(lens)
    local = stacked.shape[seq_dim + 1]
    source = np.empty(int(starts[-1]), dtype=np.int64)  # each position's row in the ranks'
    for r, shard in enumerate(shards):
        index = rank_index(shard, starts)
        held = np.flatnonzero(index >= 0)
        source[index[held]] = r * local + held
    rows = stacked.movedim(0, seq_dim).flatten(seq_dim, seq_dim + 1)
    return rows.index_select(seq_dim, _on(source, rows))


def rank_index(shard: Shard, starts: np.ndarray) -> np.ndarray:
    """The packed position of each of ``shard``'s rows (-1: padding), ``starts`` being the
    documents' first positions: a loop over its split segments, arrays for the rest."""
    index = np.full(shard.length, -1, dtype=np.int64)
    for s in shard.split:
        index[s.row:s.row + s.valid] = starts[s.doc] + s.pos + np.arange(s.valid)
    n = shard.lens
    if len(n):
        offset = np.repeat(shard.rows - (np.cumsum(n) - n), n)  # local row - rank in order
        rows = offset + np.arange(int(n.sum()))
        index[rows] = np.repeat(starts[shard.docs] - shard.rows, n) + rows
    return index


def _starts(lens: tuple[int, ...]) -> np.ndarray:
    """First packed position of each document, and the total after the last."""
    return np.concatenate(([0], np.cumsum(np.asarray(lens, dtype=np.int64))))
