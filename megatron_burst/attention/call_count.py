"""Once per micro-batch: did every rank of a CP group make the same number of attention calls?

The headers (``comm.headers``) catch a message that pairs with another call; the one thing
they cannot see by design is a rank making one call more than its peers at the same call
site with the same label, since each later message then pairs positionally with a call of
the same number and signature. Counting closes it: the Megatron layer (``megatron.attention``)
compares the ranks' call counts (``api.calls_made``) when a micro-batch's first forward
reaches its first layer, so a rank that went astray is caught within one step.

Cost: one all-gather of one int64 per micro-batch. On CPU (gloo) it is compared at once.
On CUDA nothing waits for it: the comparison runs on the device, its result comes home by
an asynchronous copy, and the next ``burst_attn`` call raises (``poll``), as the headers do.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from ..comm.waits import wait_bounded
from .sharding import group_ranks


@dataclasses.dataclass
class _Pending:
    event: Any
    host: torch.Tensor
    ranks: list[int]


_PENDING: list[_Pending] = []


def check_calls(group: dist.ProcessGroup | None, count: int) -> None:
    """Compare ``count`` (this rank's calls on ``group`` so far) with every rank's."""
    if not dist.is_initialized() or dist.get_world_size(group) < 2:
        return
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return  # a replayed graph makes no new calls to count
    backend = str(dist.get_backend(group))
    on_gpu = "nccl" in backend and "gloo" not in backend
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    # A fill, not a copy from the host: a pageable host-to-device copy would wait for the GPU.
    mine = torch.full((1,), count, dtype=torch.int64, device=device)
    table = torch.empty(dist.get_world_size(group), dtype=torch.int64, device=device)
    work = dist.all_gather_into_tensor(table, mine, group=group, async_op=True)
    ranks = group_ranks(group)
    if not on_gpu:
        wait_bounded(work, device, "for the other ranks to compare their attention calls")
        _raise_if_differ(table.tolist(), ranks)
        return
    work.wait()  # the current stream waits; the host does not
    host = torch.empty(table.shape, dtype=torch.int64, pin_memory=True)
    host.copy_(table, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    _PENDING.append(_Pending(event, host, ranks))


def poll() -> None:
    """Raise for the first finished comparison whose counts differ (never waits)."""
    if not _PENDING or torch.cuda.is_current_stream_capturing():
        return
    while _PENDING and _PENDING[0].event.query():
        done = _PENDING.pop(0)
        try:
            _raise_if_differ(done.host.tolist(), done.ranks)
        except ValueError:
            _PENDING.clear()
            raise


def _raise_if_differ(counts: list[int], ranks: list[int]) -> None:
    if len(set(counts)) > 1:
        said = ", ".join(f"rank {r}: {c}" for r, c in zip(ranks, counts))
        raise ValueError(f"burst_attn: the ranks of a context-parallel group made different "
                         f"numbers of attention calls ({said}); a rank ran a layer its peers "
                         f"did not (every rank of the group must run the same calls)")
