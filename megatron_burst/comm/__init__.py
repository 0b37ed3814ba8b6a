"""Point-to-point rings over a process group, and byte accounting.

This layer knows nothing about attention. It moves lists of tensors one hop round a ring
(send to the next rank, receive from the previous one) asynchronously, each hop as one
message, so the caller can compute while the transfer is in flight, and it counts every
byte it sends so that ``count_comm()`` can show what each pass of an algorithm costs.

One module per job:

- ``accounting``: the bytes each pass sends (``count_comm``, ``CommStats``, ``record_sent``);
- ``settings``: every ``MEGATRON_BURST_*`` setting, read from the environment once into one
  validated value (``BurstSettings``, ``current()``), for this layer and those above;
- ``waits``: host-blocking waits that give up, naming the peer (``wait_bounded``);
- ``consensus``: how the ranks of a group learn what the others hold: the device a group's
  collectives take, bounded gathers, checks deferred until the GPU's result is home;
- ``host_channel``: the gloo twin of an NCCL group that those gathers travel on, so the host
  never waits for the GPU's queue to read what its peers said;
- ``teardown``: what the package holds on process groups (replayed graphs, twins), let go
  before ``destroy_process_group``;
- ``headers``: the header every message starts with, checked by its receiver;
- ``messages``: one buffer per hop (``Packed``), posted one batch per step (``PeerComm``);
- ``joined``: a message's piece made of several views, copied into it one by one (``Joined``);
- ``ring_positions``: who holds what at each step of a flat or double ring (``RingPositions``),
  and the hops and accumulator routes that follow, as data (``route_hops``,
  ``accumulator_steps``);
- ``rings``: payloads and gradient accumulators moved round it by those routes
  (``PayloadRing``, ``AccumulatorRoute``);
- ``exchange``: the all-to-all among a few peers (Ulysses);
- ``emulated_nodes`` and ``emulator``: for benchmarks, virtual nodes on one host joined by a
  slower link (``$MEGATRON_BURST_EMULATE``; off unless set);
- ``lazy``: names a package exports on first use (this one, ``megatron`` and the front door).

The names below are re-exported so that ``from megatron_burst.comm import X`` keeps working,
imported on first use: the planner reads the torch-free modules here (``ring_positions``,
``emulated_nodes``) and must not import torch for them.
"""
from __future__ import annotations

from .lazy import lazy_names

_LAZY = {
    "CommStats": ".accounting", "count_comm": ".accounting", "record_sent": ".accounting",
    "exchange": ".exchange", "Batch": ".messages", "Packed": ".messages", "Joined": ".joined",
    "Pending": ".messages", "PeerComm": ".messages", "AccumulatorRoute": ".rings",
    "PayloadRing": ".rings", "RowShape": ".rings", "RingPositions": ".ring_positions",
    "Rows": ".ring_positions", "payload_hops": ".ring_positions", "Hop": ".ring_positions",
    "AccumulatorStep": ".ring_positions", "route_hops": ".ring_positions",
    "accumulator_steps": ".ring_positions", "next_kind": ".ring_positions",
    "DEFAULT_TIMEOUT_S": ".settings", "TIMEOUT_ENV": ".settings", "timeout_s": ".waits",
    "wait_bounded": ".waits", "BurstSettings": ".settings",
}
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
