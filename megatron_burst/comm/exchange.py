"""All-to-all among a few peers as one batch of point-to-point messages (Ulysses).

Why not ``all_to_all``: a collective needs a process group per Ulysses group, and creating
one needs every rank of the job to take part; a batch of P2P ops among the group's ranks
needs nothing. The pieces go as the ring's hops do (``messages.PeerComm``): counted, waits
bounded, each one message that starts with its call's header (``headers``), so a Ulysses
group whose ranks pair different calls raises instead of mixing their heads.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from .headers import HeaderCheck
from .messages import Packed, PeerComm


def exchange(group: dist.ProcessGroup | None, sends: dict[int, Sequence[torch.Tensor]],
             recv_like: dict[int, Sequence[torch.Tensor]], phase: str,
             check: HeaderCheck | None = None) -> dict[int, tuple[torch.Tensor, ...]]:
    """All-to-all among a few peers as one batch of P2P ops: send the tensors ``sends[peer]``
    to each peer (global rank) as ONE message, and receive from it tensors shaped like
    ``recv_like[peer]``. Waits.

    Used by the Ulysses all-to-all inside a group of U ranks, without creating a process
    group per Ulysses group (which would need every rank of the job to take part). Several
    tensors (Q, K and V; their gradients) travel as one message a peer: one post, one
    header and one NCCL group instead of one each. ``check`` stamps the header of every
    message sent and checks every message received.
    """
    comm = PeerComm(group, phase, check)
    received = {peer: Packed.like(like) for peer, like in recv_like.items()}
    pending = comm.post([(Packed.holding(ts), peer) for peer, ts in sends.items()],
                        list((buf, peer) for peer, buf in received.items()))
    for p in pending:
        p.wait()  # checks each header as it arrives (CUDA: compared in finish)
    comm.finish()
    return {peer: buf.views for peer, buf in received.items()}
