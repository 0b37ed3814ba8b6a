"""Did every rank of the CP group make its batch? One int per rank, gathered a batch ahead.

The data path makes each micro-batch's document batch on a background thread
(``prefetch``). Making it can fail on one rank alone (a data read, memory) or on all (a
malformed pack). A rank that raised alone would leave its peers waiting for it in the
attention's first collective (on NCCL until the process group's timeout). So each rank's
outcome of each batch (``OK``, ``EXHAUSTED``: the data ended, ``FAILED``) is gathered over
the CP group, and every rank goes on, stops, or raises the same error.

Cost: one all-gather of one int64 per batch. On gloo it completes at once. On NCCL it is
started a micro-batch before its batch is used and comes home by an asynchronous copy, so
reading it waits at most for GPU work queued before the previous micro-batch
(``comm.consensus.Gathered``, as ``attention.call_count`` uses it), never for the step in
flight. The errors' text travels
only when some rank failed, through ``agree.check_outcome``: every rank raises the same
ValueError naming the failed ranks and their errors (the failed rank's chained to its own).
"""
from __future__ import annotations

from typing import Any, List, Optional

from megatron_burst.attention.agree import check_outcome
from megatron_burst.comm.consensus import Gathered

OK, EXHAUSTED, FAILED = 0, 1, 2


class Verdict:
    """Every rank's outcome code of one batch (call on every rank of ``group``, in the same
    order: it is a collective; ``consensus.Gathered``)."""

    def __init__(self, group: Any, code: int) -> None:
        self._gathered = Gathered(group, code, "for the other ranks to report their document "
                                               "batch")

    def codes(self) -> List[int]:
        """The gathered codes, in group rank order (waits only for the copy home)."""
        return self._gathered.values()


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
