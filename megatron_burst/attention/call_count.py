"""Once per micro-batch: did every rank of a CP group make the same number of attention calls?

The headers (``comm.headers``) catch a message that pairs with another call; the one thing
they cannot see by design is a rank making one call more than its peers at the same call
site with the same label, since each later message then pairs positionally with a call of
the same number and signature. Counting closes it: the Megatron layer (``megatron.attention``)
compares the ranks' call counts (``api.calls_made``) when a micro-batch's first forward
reaches its first layer, so a rank that went astray is caught within one step.

Cost: one all-gather of one int64 per micro-batch. On CPU (gloo) it is compared at once.
On CUDA nothing waits for it: the comparison runs on the device, its result comes home by
an asynchronous copy, and the next ``burst_attn`` call raises (``consensus.poll``), as the
headers do.
"""
from __future__ import annotations

import torch.distributed as dist

from ..comm import consensus
from .sharding import group_ranks


def check_calls(group: dist.ProcessGroup | None, count: int) -> None:
    """Compare ``count`` (this rank's calls on ``group`` so far) with every rank's."""
    if not consensus.shared(group) or consensus.capturing():
        return  # nobody to compare with; or a replayed graph, which makes no new calls
    gathered = consensus.Gathered(group, count,
                                  "for the other ranks to compare their attention calls")
    ranks = group_ranks(group)
    compare = lambda: _raise_if_differ(gathered.values(), ranks)  # noqa: E731
    if gathered.event is None:  # here already (CPU)
        compare()
    else:
        consensus.defer(compare, gathered.event)


def _raise_if_differ(counts: list[int], ranks: list[int]) -> None:
    if len(set(counts)) > 1:
        said = ", ".join(f"rank {r}: {c}" for r, c in zip(ranks, counts))
        raise ValueError(f"burst_attn: the ranks of a context-parallel group made different "
                         f"numbers of attention calls ({said}); a rank ran a layer its peers "
                         f"did not (every rank of the group must run the same calls)")
