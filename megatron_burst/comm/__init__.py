"""Point-to-point rings over a process group, and byte accounting.

This layer knows nothing about attention. It moves lists of tensors one hop round a ring
(send to the next rank, receive from the previous one) asynchronously, each hop as one
message, so the caller can compute while the transfer is in flight, and it counts every
byte it sends so that ``count_comm()`` can show what each pass of an algorithm costs.

One module per job:

- ``accounting``: the bytes each pass sends (``count_comm``, ``CommStats``, ``record_sent``);
- ``waits``: host-blocking waits that give up, naming the peer (``wait_bounded``);
- ``headers``: the header every message starts with, checked by its receiver;
- ``messages``: one buffer per hop (``Packed``), posted one batch per step (``PeerComm``);
- ``ring_positions``: who holds what at each step of a flat or double ring (``RingTopology``);
- ``rings``: payloads and gradient accumulators moved round it (``PayloadRing``,
  ``AccumulatorRoute``);
- ``exchange``: the all-to-all among a few peers (Ulysses);
- ``emulated_nodes`` and ``emulator``: for benchmarks, virtual nodes on one host joined by a
  slower link (``$MEGATRON_BURST_EMULATE``; off unless set).

The names below are re-exported so that ``from megatron_burst.comm import X`` keeps working.
"""
from __future__ import annotations

from . import headers
from .accounting import CommStats, count_comm, record_sent
from .exchange import exchange
from .messages import Batch, Packed, Pending, PeerComm
from .rings import AccumulatorRoute, PayloadRing, RowShape
from .ring_positions import RingTopology, Rows, payload_hops
from .waits import DEFAULT_TIMEOUT_S, TIMEOUT_ENV, timeout_s, wait_bounded

__all__ = [
    "AccumulatorRoute", "Batch", "CommStats", "DEFAULT_TIMEOUT_S", "Packed", "PayloadRing",
    "Pending", "PeerComm", "RingTopology", "RowShape", "Rows", "TIMEOUT_ENV", "count_comm",
    "exchange", "headers", "payload_hops", "record_sent", "timeout_s", "wait_bounded",
]
