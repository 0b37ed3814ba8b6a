"""On GPUs (skipped without 2): an NCCL group's agreements go over its gloo twin
(``comm.host_channel``), so the host reads its peers' values without waiting for the GPU.

The proof that this test can fail: the same gather over the NCCL group itself
(``consensus.Exchange(..., on_group=True)``, what every agreement did before the twin)
waits for the queue.
"""
from __future__ import annotations

import time

import pytest
import torch

from .distributed import run_ranks

NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0


def _busy_gather_worker(rank: int, world: int, _) -> dict:
    from megatron_burst.comm import consensus

    consensus.gather(None, [rank], "for a warm-up")  # the twin is made here
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(int(2e8))
    end.record()
    end.synchronize()
    cycles = int(2e8 * 300 / start.elapsed_time(end))  # about 300 ms of queued GPU work
    times = {}
    for name, gather in (("twin", lambda: consensus.gather(None, [rank, 5], "for a test")),
                         ("group", lambda: consensus.Exchange(
                             None, [rank, 5], "for a test", on_group=True).values())):
        torch.cuda._sleep(cycles)
        began = time.perf_counter()
        table = gather()
        times[name] = (time.perf_counter() - began) * 1e3
        times[name + " table"] = table
        torch.cuda.synchronize()
    return times


@pytest.mark.skipif(NGPU < 2, reason="needs 2 GPUs")
def test_an_agreement_does_not_wait_for_a_busy_gpu_over_nccl():
    rows = run_ranks(2, _busy_gather_worker, None, backend="nccl", timeout=300)
    for got in rows:
        assert got["twin table"] == got["group table"] == [[0, 5], [1, 5]]
        assert got["twin"] < 50, got  # ms: the host never waited for the 300 ms queue
        assert got["group"] > 200, got  # over NCCL it did
