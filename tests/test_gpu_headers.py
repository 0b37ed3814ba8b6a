"""Message headers over NCCL (skipped without two GPUs): calls that pair up wrongly raise.

On CUDA the headers a pass receives land in a pinned host buffer by asynchronous copies and
are compared later, without waiting for the GPU (``comm.headers``). So here: many calls in
a row that pair rightly raise nothing, and then a call whose ranks run different layers
(same shapes: NCCL delivers the messages) raises the pairing error on both ranks, at that
call's backward or the next call at the latest, never a wrong answer in silence.
"""
from __future__ import annotations

import pytest
import torch

import megatron_burst as mb

from .distributed import run_ranks

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")


def _on_gpu(rank: int, label: int) -> None:
    dev = torch.device("cuda", rank)
    gen = torch.Generator(device=dev).manual_seed(rank)
    q, k, v = (torch.randn(1, 64, h, 64, device=dev, generator=gen, dtype=torch.bfloat16,
                           requires_grad=True) for h in (4, 2, 2))
    out = mb.burst_attn(q, k, v, causal=True, backward="burst", call_label=label)
    out.float().sum().backward()
    torch.cuda.synchronize()


def mispaired_worker(rank: int, world: int) -> list[str]:
    torch.cuda.set_device(rank)
    for label in (2, 3):  # both labels' arguments verified once
        _on_gpu(rank, label)
    for i in range(40):  # rightly paired: nothing raises
        _on_gpu(rank, 2 + i % 2)
    outcomes = ["paired rightly 40 times"]
    for attempt in range(3):  # rank 1 runs layer 2 while rank 0 runs layer 3
        try:
            _on_gpu(rank, 2 if rank == 1 else 3)
            outcomes.append("no error")
        except ValueError as e:
            outcomes.append(f"ValueError: {e}")
            break
    return outcomes


def test_calls_that_pair_wrongly_raise_over_nccl_and_rightly_paired_ones_do_not():
    for outcomes in run_ranks(2, mispaired_worker, backend="nccl", timeout=300):
        assert "pair up wrongly" in outcomes[-1], outcomes
        assert len(outcomes) <= 3, outcomes  # at that call or the next
