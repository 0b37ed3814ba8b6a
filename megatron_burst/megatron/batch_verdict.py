"""Did every rank of the CP group make its batch? One int per rank, gathered a batch ahead.

The data path makes each micro-batch's document batch on a background thread
(``prefetch``). Making it can fail on one rank alone (a data read, memory) or on all (a
malformed pack). A rank that raised alone would leave its peers waiting for it in the
attention's first collective (on NCCL until the process group's timeout). So each rank's
outcome of each batch (``OK``, ``EXHAUSTED``: the data ended, ``FAILED``) is gathered over
the CP group, and every rank goes on, stops, or raises the same error.

Cost: one all-gather of one int64 per batch. On gloo it completes at once. On NCCL it is
started a micro-batch before its batch is used and comes home by an asynchronous copy, so
reading it waits at most for GPU work queued before the previous micro-batch (as
``megatron_burst.attention.call_count`` does), never for the step in flight. The errors' text travels
only when some rank failed, through ``agree.check_outcome``: every rank raises the same
ValueError naming the failed ranks and their errors (the failed rank's chained to its own).
"""
from __future__ import annotations

from typing import Any, List, Optional

import torch
import torch.distributed as dist

from megatron_burst.attention.agree import check_outcome
from megatron_burst.comm.waits import wait_bounded

OK, EXHAUSTED, FAILED = 0, 1, 2


def shared(group: Any) -> bool:
    """Whether ``group`` has peers to tell (torch.distributed up, more than one rank)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def _device(group: Any) -> torch.device:
    """Where the codes must live for the group's backend: CPU unless NCCL only."""
    backend = str(dist.get_backend(group))
    if "nccl" in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class Verdict:
    """Every rank's outcome code of one batch (call on every rank of ``group``, in the same
    order: it is a collective)."""

    def __init__(self, group: Any, code: int) -> None:
        device = _device(group)
        # Filled on the device: torch.tensor([code], device="cuda") would copy from pageable
        # memory, which makes the host wait for the stream's queued work.
        mine = torch.full((1,), code, dtype=torch.int64, device=device)
        table = torch.empty(dist.get_world_size(group), dtype=torch.int64, device=device)
        work = dist.all_gather_into_tensor(table, mine, group=group, async_op=True)
        self._event = None
        if device.type == "cpu":
            wait_bounded(work, device, "for the other ranks to report their document batch")
            self._host = table
            return
        work.wait()  # the current stream waits for the gather; the host does not
        self._host = torch.empty(table.shape, dtype=torch.int64, pin_memory=True)
        self._host.copy_(table, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def codes(self) -> List[int]:
        """The gathered codes, in group rank order (waits only for the copy home)."""
        if self._event is not None:
            self._event.synchronize()
        return self._host.tolist()


def settle(codes: List[int], error: Optional[BaseException], group: Any) -> None:
    """Return if every rank made its batch; raise StopIteration on every rank if every
    rank's data ended; else raise the same ValueError everywhere (``check_outcome``)."""
    if all(c == OK for c in codes):
        return
    if all(c == EXHAUSTED for c in codes):
        raise StopIteration
    said = error
    if isinstance(error, StopIteration):
        said = ValueError("the data iterator ended here while other ranks still had batches")
    try:
        check_outcome(group, said, "the document batch")  # any report raises everywhere
    except ValueError as err:
        raise err from error
    # Some code says a rank failed, yet no rank reported an error: only a broken
    # collective could do that.
    raise RuntimeError(f"document batch outcomes {codes}, but no rank reported an error")
