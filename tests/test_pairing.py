"""Calls that pair up wrongly, and checks that fail in other ways.

Every ring message carries its call's number, signature and label (``headers.py``); on gloo
the receiver checks it as it arrives. These tests make ranks whose calls differ in ways the
argument check cannot see (a call at another layer, a signature verified earlier, the check
turned off) and require a ValueError naming the pairing wherever such a message arrives;
ranks that only wait on a peer that stopped raise the timeout's error naming it. Nothing may
compute with another call's messages, and nothing may hang.
"""
from __future__ import annotations

import os
import time

import pytest
import torch

import megatron_burst as mb

from .burst_call import call
from .distributed import run_ranks

TIMEOUT_S = "6"


def _outcome(fn) -> str:
    start = time.monotonic()
    try:
        fn()
        return "no error"
    except ValueError as e:
        return f"ValueError after {time.monotonic() - start:.1f}s: {e}"
    except RuntimeError as e:
        return f"RuntimeError after {time.monotonic() - start:.1f}s: {e}"


def pairing_worker(rank: int, world: int, case: str) -> str:
    os.environ["MEGATRON_BURST_TIMEOUT_S"] = TIMEOUT_S
    if case == "other layer":  # both labels verified; then rank 1 runs layer 2, its peers 3
        call(rank, call_label=2)
        call(rank, call_label=3)
        return _outcome(lambda: call(rank, call_label=2 if rank == 1 else 3))
    if case == "cached signature":  # both verified, then rank 1 repeats the other one
        call(rank)
        call(rank, softmax_scale=0.5)
        return _outcome(lambda: call(rank, **({} if rank == 1 else {"softmax_scale": 0.5})))
    if case == "check off":
        os.environ["MEGATRON_BURST_AGREE"] = "off"
        return _outcome(lambda: call(rank, causal=rank != 1))
    if case == "other shapes":  # messages of other sizes: gloo used to end the process
        os.environ["MEGATRON_BURST_AGREE"] = "off"
        return _outcome(lambda: call(rank, s=16 if rank == 1 else 8, grad=True))
    raise ValueError(case)


@pytest.mark.parametrize("case", ["other layer", "cached signature", "check off",
                                  "other shapes"])
def test_calls_that_pair_wrongly_raise(case: str) -> None:
    outcomes = run_ranks(3, pairing_worker, case, timeout=120, barrier=False)
    assert all(o != "no error" for o in outcomes), outcomes
    told = [o for o in outcomes if "pair up wrongly" in o]
    assert told, outcomes  # the ranks that received a wrong message say so
    for o in outcomes:
        assert o.startswith("ValueError") or "waited" in o, o  # the others name whom
        assert float(o.split("after ")[1].split("s")[0]) < 30, o


def failing_check_worker(rank: int, world: int) -> str:
    """Rank 1's own argument check fails with something other than ValueError."""
    os.environ["MEGATRON_BURST_TIMEOUT_S"] = "60"
    cu = torch.tensor([0, 8, 16, 24])
    if rank == 1:
        cu = cu.to("meta")
    q, k, v = (torch.randn(1, 8, h, 8) for h in (4, 2, 2))
    start = time.monotonic()
    try:
        mb.burst_attn(q, k, v, causal=True, layout="whole_docs", cu_seqlens=cu)
        return "no error"
    except Exception as e:  # noqa: BLE001  (the test names what it wants)
        return f"{type(e).__name__} after {time.monotonic() - start:.1f}s: {e}"


def test_a_check_that_fails_otherwise_still_tells_the_peers() -> None:
    zero, one, two = run_ranks(3, failing_check_worker, timeout=120)
    assert one.split(" after")[0] != "no error", one
    for peer in (zero, two):
        assert peer.startswith("ValueError") and "failed on rank 1" in peer, peer
        assert float(peer.split("after ")[1].split("s")[0]) < 10, peer  # not the timeout
