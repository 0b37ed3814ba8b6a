"""The link emulator's logic on CPU ranks: which messages cross a virtual node, how long
they take, and that a ring hop across the boundary is slowed while one inside is not."""
from __future__ import annotations

import time

import pytest
import torch

from megatron_burst.tools.emulate import VirtualNodes

from .distributed import run_ranks


def test_parse_and_the_link_model():
    nodes = VirtualNodes.parse("node_size=2, gbps=25, latency_us=5")
    assert nodes == VirtualNodes(2, 25.0, 5.0)
    assert nodes.crosses(1, 2) and not nodes.crosses(2, 3)
    assert nodes.seconds(25_000_000) == pytest.approx(1e-3 + 5e-6)
    assert nodes.cross_bytes_alltoall(0, [0, 1, 2, 3], 100) == 200
    assert nodes.cross_bytes_ring_gather(2, [0, 1, 2, 3], 100) == 300  # 1 -> 2 crosses
    assert nodes.cross_bytes_ring_gather(1, [0, 1, 2, 3], 100) == 0
    for bad in ("gbps=25", "node_size=2,gbps=0", "node_size=2,gbps=2,speed=3", "x"):
        with pytest.raises(ValueError, match="MEGATRON_BURST_EMULATE"):
            VirtualNodes.parse(bad)


def _hop_times(rank, world):
    from megatron_burst.comm import Packed, PeerComm
    from megatron_burst.tools.emulate import Emulation

    emulation = Emulation(VirtualNodes(node_size=2, gbps=0.005, latency_us=0))  # 5 MB/s
    emulation.install()
    try:
        comm, times = PeerComm(None), []
        buf = Packed.holding([torch.ones(250_000)])  # 1 MB: 200 ms across the slow link
        for _ in range(3):
            recv = Packed.like(buf.views)
            t0 = time.perf_counter()
            comm.hop(buf, (rank + 1) % world, recv, (rank - 1) % world).wait()
            times.append(time.perf_counter() - t0)
        return min(times)
    finally:
        emulation.uninstall()


def test_a_hop_across_virtual_nodes_is_slowed_and_one_inside_is_not():
    times = run_ranks(4, _hop_times, timeout=120)
    # Ranks 0 and 2 receive from the other virtual node (3 -> 0, 1 -> 2): >= 200 ms.
    assert times[0] >= 0.19 and times[2] >= 0.19
    # Ranks 1 and 3 receive from their own node: fast, but they wait for nothing slow.
    assert times[1] < 0.1 and times[3] < 0.1
