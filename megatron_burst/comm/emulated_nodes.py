"""The link emulator's virtual nodes: what ``$MEGATRON_BURST_EMULATE`` describes.

The emulator (`comm.emulator`) slows the messages between virtual nodes so that one NVLink
host measures like a multi-node cluster. What the variable describes is parsed here, apart
from the emulator, because the cluster view (`decide.cluster`) must know the emulated
GPUs per node to plan a double ring, without installing anything; the variable is read
with the package's other settings (``settings.current().emulate``). Unset (the default),
nothing is emulated.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

ENV = "MEGATRON_BURST_EMULATE"  # e.g. "gpus_per_node=2,gbps=25,latency_us=5"


@dataclasses.dataclass(frozen=True)
class VirtualNodes:
    """``gpus_per_node`` consecutive global ranks per virtual node, joined by a slow link."""

    gpus_per_node: int
    gbps: float
    latency_us: float = 5.0

    @staticmethod
    def parse(text: str) -> "VirtualNodes":
        """'gpus_per_node=2,gbps=25,latency_us=5' (latency optional)."""
        try:
            fields = dict(item.split("=", 1) for item in text.replace(" ", "").split(","))
            nodes = VirtualNodes(int(fields.pop("gpus_per_node")), float(fields.pop("gbps")),
                                 float(fields.pop("latency_us", 5.0)))
        except (KeyError, ValueError) as e:
            raise ValueError(f"{ENV}={text!r}: expected 'gpus_per_node=N,gbps=G[,latency_us=L]' "
                             f"({e})") from None
        if fields or nodes.gpus_per_node < 1 or nodes.gbps <= 0 or nodes.latency_us < 0:
            raise ValueError(f"{ENV}={text!r}: unknown fields {sorted(fields)} or values out "
                             f"of range")
        return nodes

    def crosses(self, a: int, b: int) -> bool:
        return a // self.gpus_per_node != b // self.gpus_per_node

    def seconds(self, nbytes: int) -> float:
        """Emulated time of one message of ``nbytes`` across the slow link."""
        return self.latency_us * 1e-6 + nbytes / (self.gbps * 1e9)

    def cross_bytes_alltoall(self, me: int, ranks: Sequence[int], per_peer: int) -> int:
        """Bytes ``me`` receives from other virtual nodes in an all-to-all of equal pieces."""
        return per_peer * sum(1 for r in ranks if self.crosses(me, r))

    def cross_bytes_ring_gather(self, me: int, ranks: Sequence[int], piece: int) -> int:
        """All-gather / reduce-scatter as NCCL runs them, a ring: each of the world-1 steps
        moves one piece in from the ring neighbour, slow when the neighbour is remote."""
        pos = ranks.index(me)
        prev = ranks[pos - 1]
        return piece * (len(ranks) - 1) if self.crosses(me, prev) else 0

