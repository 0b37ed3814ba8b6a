"""The one mechanism the ranks agree by (``comm.consensus``): its pieces on their own."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from megatron_burst.comm import consensus

from .distributed import run_ranks


class _Event:
    """Stands in for a CUDA event: ``query`` says whether the copy home is done."""

    def __init__(self, done: bool) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done


def test_deferred_checks_run_in_order_once_home_and_a_failure_drops_the_rest():
    ran: list[int] = []
    first, second = _Event(False), _Event(True)
    consensus.defer(lambda: ran.append(1), first)
    consensus.defer(lambda: ran.append(2), second)
    consensus.poll()
    assert ran == []  # oldest first: the second waits for the first, never the host
    first.done = True
    consensus.poll()
    assert ran == [1, 2]

    def differ() -> None:
        raise ValueError("the ranks differ")

    consensus.defer(differ, _Event(True))
    consensus.defer(lambda: ran.append(3), _Event(True))
    with pytest.raises(ValueError, match="the ranks differ"):
        consensus.poll()
    consensus.poll()
    assert ran == [1, 2]  # dropped with the failure: the group is broken


def test_an_error_travels_as_one_text():
    assert consensus.error_text(ValueError("bad causal")) == "bad causal"
    assert consensus.error_text(RuntimeError("out of memory")) == "RuntimeError: out of memory"


def _trade(rank: int, world: int) -> dict:
    group = dist.new_group([0, 1])
    return {"device": str(consensus.device(group)), "shared": consensus.shared(group),
            "gather": consensus.gather(group, [rank, 10 + rank], "for a test"),
            "minimum": consensus.minimum(group, torch.tensor([rank + 1, 5 - rank]),
                                         "for a test").tolist(),
            "gathered": consensus.Gathered(group, 7 * rank, "for a test").values(),
            "root": consensus.root(group),
            "from_root": consensus.from_root(group, f"rank {rank}'s figures")}


def test_gloo_ranks_trade_small_numbers():
    for got in run_ranks(2, _trade, timeout=60):
        assert got == {"device": "cpu", "shared": True, "gather": [[0, 10], [1, 11]],
                       "minimum": [1, 4], "gathered": [0, 7], "root": 0,
                       "from_root": "rank 0's figures"}
