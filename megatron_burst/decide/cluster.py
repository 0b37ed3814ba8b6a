"""How many ranks of a context-parallel group share a node: one answer, one priority order.

The resolver (``options.resolve``) weighs a topology's links by where its ranks sit: a ring
hop inside a node rides NVLink, one between nodes the network. Every entry point asks here,
and the answer (``gpus_per_node``) comes from the first of these that is known:

1. explicit: what the caller states (a config's ``cluster.gpus_per_node``, a double ring's
   ``intra_node_size`` given by value);
2. the link emulator's virtual nodes (``$MEGATRON_BURST_EMULATE``), so that 'auto' plans
   for the network the benchmark emulates rather than for the real NVLink host;
3. torchrun's ``LOCAL_WORLD_SIZE``: nodes are that many consecutive global ranks;
4. the cluster profile's ``gpus_per_node`` (what ``megatron-burst tune`` measured on).

Of those GPUs, the CP group's share (``max_intra_node_size``) is exact with the group's global
ranks; without them, Megatron's rank order (TP innermost, then CP) gives ``gpus_per_node / tp``
of the group per node.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from ..comm.settings import current


@dataclasses.dataclass(frozen=True)
class GpusPerNode:
    """GPUs per node and where that number came from (for logs and plans)."""

    gpus_per_node: int | None
    source: str


def gpus_per_node(explicit: int | None = None, profile_gpus: int | None = None) -> GpusPerNode:
    """GPUs (ranks) per node, by the priority order of the module docstring."""
    if explicit is not None:
        return GpusPerNode(explicit, "explicit")
    found = current()
    if found.emulate is not None:
        return GpusPerNode(found.emulate.gpus_per_node, "emulated nodes ($MEGATRON_BURST_EMULATE)")
    if found.local_world_size:
        return GpusPerNode(found.local_world_size, "LOCAL_WORLD_SIZE")
    if profile_gpus:
        return GpusPerNode(profile_gpus, "the cluster profile")
    return GpusPerNode(None, "unknown")


def max_intra_node_size(cp: int, gpus: GpusPerNode, *, tp: int = 1,
                        group_ranks: Sequence[int] | None = None,
                        rank: int | None = None) -> int | None:
    """Ranks of a CP group of ``cp`` that share this rank's node, so the largest
    ``intra_node_size`` whose inner ring stays inside a node (None: unknown, taken as all of
    them). Exact from ``group_ranks`` (global) and this ``rank``; otherwise from Megatron's
    rank order."""
    per = gpus.gpus_per_node
    if not per or per <= 0:
        return None
    if group_ranks is not None and rank is not None:
        node = rank // per
        return sum(1 for r in group_ranks if r // per == node)
    return max(1, min(cp, per // max(tp, 1)))


def view_key() -> tuple:
    """What 'auto''s decisions read of the process's settings (``comm.settings``, read once):
    the emulated nodes, ranks per node and the profile named, for caches of decisions."""
    found = current()
    return found.emulate_text, found.local_world_size, found.profile
