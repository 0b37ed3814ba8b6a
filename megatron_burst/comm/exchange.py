"""All-to-all among a few peers as one batch of point-to-point messages (Ulysses).

Why not ``all_to_all``: a collective needs a process group per Ulysses group, and creating
one needs every rank of the job to take part; a batch of P2P ops among the group's ranks
needs nothing. Its sends are counted (``accounting``) and its waits bounded (``waits``).
Every piece is one message that starts with its call's header (``headers``), as the ring's
do: a Ulysses group whose ranks pair different calls raises instead of mixing their heads.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .accounting import record_sent
from .headers import HeaderCheck
from .messages import Batch, Packed


def exchange(group: dist.ProcessGroup | None, sends: dict[int, torch.Tensor],
             recv_like: dict[int, torch.Tensor], phase: str,
             check: HeaderCheck | None = None) -> dict[int, torch.Tensor]:
    """All-to-all among a few peers as one batch of P2P ops: send ``sends[peer]`` to each
    peer (global rank) and receive a tensor shaped like ``recv_like[peer]`` from it. Waits.

    Used by the Ulysses all-to-all inside a group of U ranks, without creating a process
    group per Ulysses group (which would need every rank of the job to take part). ``check``
    stamps the header of every piece sent and checks every piece received.
    """
    ops, received, nbytes, what = [], {}, 0, []
    for peer, t in sends.items():
        buf = Packed.holding([t])  # the header, then the piece: one copy, as contiguous() was
        if check is not None:
            check.stamp(buf.header)
        ops.append(dist.P2POp(dist.isend, buf.flat, peer, group))
        nbytes += buf.nbytes
        what.append(f"for rank {peer} to take its all-to-all piece ({phase})")
    for peer, like in recv_like.items():
        received[peer] = Packed.like([like])
        ops.append(dist.P2POp(dist.irecv, received[peer].flat, peer, group))
        what.append(f"for an all-to-all piece from rank {peer} ({phase})")
    if ops:
        Batch(dist.batch_isend_irecv(ops), what=what, device=ops[0].tensor.device).wait()
    record_sent(nbytes, phase)
    if check is not None:
        for peer, buf in received.items():
            check.received(buf.header, peer)
        check.finish()
    return {peer: buf.views[0] for peer, buf in received.items()}
