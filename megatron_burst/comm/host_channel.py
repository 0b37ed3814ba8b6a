"""The hosts' own channel between the ranks of an NCCL group: a gloo twin of the group.

Why: the ranks' agreements (``consensus.gather``: a call's arguments, an error, a mode) are
a few int64s each host must read. Over NCCL they are uploaded from pageable memory and
all-gathered behind all the work the GPU has queued, and the read-back waits for that queue
to drain: 0.3-0.6 ms of host time with the ranks lined up on 2x H100 (``benchmarks/
agree_phases.py``), and the GPU then idles while the host launches what comes next. Over a
gloo twin of the group the host trades host numbers over its own sockets, and the GPU's
queue is never waited for.

The twin is made at the group's first host exchange, on every member together (an exchange
is a collective): first the members compare ``MEGATRON_BURST_HOST_CHANNEL`` over the group
itself (all raise the same ValueError if it differs: a rank on the twin and a rank on the
group would each wait for the other), then each makes a ``ProcessGroupGloo`` on a prefix of
the default store named by value: the members' global ranks and how many twins of those
ranks this process made before (the members make them together, so the count agrees).
Twins are kept by their ranks (two groups of the same ranks share one: each posts its
exchanges in program order on every member), and dropped when their group or the world is
destroyed (``teardown``). ``MEGATRON_BURST_HOST_CHANNEL=group`` keeps the exchanges on the
group itself, for clusters where gloo cannot connect (gloo picks its network interface as
Megatron's own gloo groups do: ``GLOO_SOCKET_IFNAME``).
"""
from __future__ import annotations

import datetime
from typing import Any, Callable

import torch
import torch.distributed as dist

from . import teardown
from .settings import HOST_CHANNEL_ENV, current

_TWINS: dict[tuple[int, ...], Any] = {}  # members' global ranks -> twin (None: the group)
_MADE: dict[tuple[int, ...], int] = {}  # members' global ranks -> twins made so far
HOST_CHANNEL_CODES = {"gloo": 1, "group": 2}  # the setting, as the members compare it


def twin(group: dist.ProcessGroup | None,
         agree: Callable[[list[int]], list[list[int]]]) -> Any:
    """The gloo twin of ``group`` (an NCCL group with peers), or None where the exchanges stay
    on the group itself. Call on every member together; ``agree(values)`` gathers every
    member's int64s over the group itself (used once, at the group's first exchange)."""
    ranks = _ranks(group)
    if ranks in _TWINS:
        return _TWINS[ranks]
    channel = current().host_channel
    said = agree([HOST_CHANNEL_CODES[channel]])
    if len({row[0] for row in said}) > 1:
        names = {code: name for name, code in HOST_CHANNEL_CODES.items()}
        told = ", ".join(f"rank {r}: {names.get(row[0], row[0])!r}"
                         for r, row in zip(ranks, said))
        raise ValueError(f"burst_attn: {HOST_CHANNEL_ENV} differs between the ranks of a group "
                         f"({told}); set it alike on every rank")
    made = _make(ranks, dist.get_rank(group)) if channel == "gloo" else None
    teardown.on_destroy(_drop)
    _TWINS[ranks] = made
    return made


def _make(ranks: tuple[int, ...], rank: int) -> Any:
    """A gloo backend among ``ranks`` on a prefix of the default store named by value."""
    default_store = getattr(dist.distributed_c10d, "_get_default_store", None)
    if default_store is None:  # the same torch on every rank: every rank raises this
        raise ValueError(f"{HOST_CHANNEL_ENV}=gloo needs torch.distributed's default store, "
                         f"which torch {torch.__version__} does not expose; set "
                         f"{HOST_CHANNEL_ENV}=group")
    store = default_store()
    count = _MADE.get(ranks, 0)
    _MADE[ranks] = count + 1
    prefix = f"megatron_burst/host_channel/{'-'.join(map(str, ranks))}/{count}/"
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, len(ranks),
                                 datetime.timedelta(seconds=current().timeout_s))


def all_gather(made: Any, mine: torch.Tensor) -> tuple[Any, list[torch.Tensor]]:
    """Post an all-gather of ``mine`` (CPU int64s) on a twin: (its work, the rows it fills)."""
    rows = [torch.empty_like(mine) for _ in range(made.size())]
    return made.allgather([rows], [mine]), rows


def _ranks(group: dist.ProcessGroup | None) -> tuple[int, ...]:
    """The global ranks of ``group``'s members (None: the world), a twin's key."""
    if group is None or group == dist.group.WORLD:
        return tuple(range(dist.get_world_size()))
    return tuple(dist.get_process_group_ranks(group))


def _drop(group: dist.ProcessGroup | None) -> None:
    """Before ``destroy_process_group(group)``: drop the twin of its ranks (every twin, for
    the world)."""
    if group is None or group == dist.group.WORLD:
        _TWINS.clear()
        return
    _TWINS.pop(_ranks(group), None)
