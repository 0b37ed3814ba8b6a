"""Ranks that disagree, bad arguments and faults: every rank must fail fast and clearly.

A context-parallel call is only correct when every rank passes the same arguments, and
a rank that dies mid-ring must not leave its peers waiting forever. These tests spawn
small gloo groups (one spawn per test, many cases inside) and check that each such case
ends on every rank in a ValueError (RuntimeError for faults) whose message names the
culprit, in bounded time, and that the group still works afterwards where it can.
"""
from __future__ import annotations

import math
import os
import re
import time

import torch
import torch.distributed as dist

from megatron_burst.attention import prepare
from megatron_burst.comm import count_comm, record_sent, settings
from megatron_burst.decide.topology import CPTopology

from .burst_call import call
from .distributed import run_ranks


# ------------------------------------------------------------ ranks that disagree

# field -> (what every rank passes, what rank 1 passes instead); 3 ranks, 8 tokens each.
DISAGREEMENTS = {
    "causal": ({}, {"causal": False}),
    "dtype": ({}, {"dtype": torch.bfloat16}),
    "softmax_scale": ({}, {"softmax_scale": 0.5}),
    "layout": ({}, {"layout": "contiguous"}),
    "window_size": ({}, {"window_size": (4, 0)}),
    # Same padded shard (24 tokens in 6-token chunks), other boundaries.
    "cu_seqlens": ({"docs": (12, 12)}, {"docs": (6, 18)}),
    "s_local": ({}, {"s": 16}),
    "backward": ({}, {"backward": "ring"}),
    "hkv": ({}, {"hkv": 1}),
    "ulysses_size": ({}, {"ulysses_size": 3}),
    # (intra_node_size is not among them: on 3 ranks every value is the flat ring, and the
    # check compares the topology each rank resolved, so 1 and None rightly agree.)
    "qkv_format": ({}, {"qkv_format": "sbhd"}),
    "requires_grad": ({}, {"grad": True}),
}


def disagree_worker(rank: int, world: int) -> dict:
    seen = {}
    for field, (common, odd) in DISAGREEMENTS.items():
        options = {**common, **(odd if rank == 1 else {})}
        with count_comm() as stats:
            try:
                call(rank, **options)
                seen[field] = "no error"
            except ValueError as e:
                seen[field] = str(e)
        assert stats.total_bytes == 0, f"{field}: the ring ran before the check"
    # Two fields at once: both named, in one message.
    try:
        call(rank, **({"causal": False, "layout": "contiguous"} if rank == 1 else {}))
        seen["causal+layout"] = "no error"
    except ValueError as e:
        seen["causal+layout"] = str(e)
    # The group is still healthy: a correct call right after completes on every rank.
    out = call(rank)
    dist.barrier()
    return {"seen": seen, "finite": bool(torch.isfinite(out).all())}


def test_ranks_that_disagree_all_get_the_same_error() -> None:
    results = run_ranks(3, disagree_worker, timeout=120)
    assert all(r["finite"] for r in results)
    for field in [*DISAGREEMENTS, "causal+layout"]:
        messages = [r["seen"][field] for r in results]
        assert len(set(messages)) == 1, f"{field}: ranks got different errors {messages}"
        msg = messages[0]
        for name in field.split("+"):
            assert f"'{name}'" in msg, f"{field}: {msg}"
        assert "ranks [0, 2] passed" in msg and "rank 1 passed" in msg, msg
    assert ("'causal': ranks [0, 2] passed True, rank 1 passed False"
            in results[0]["seen"]["causal"])


# ------------------------------------------------------------ a rank outside the group


def membership_worker(rank: int, world: int) -> dict:
    sub = dist.new_group([1, 2])  # every rank must call new_group, member or not
    if rank == 0:
        try:
            call(rank, group=sub, hq=4, hkv=2)
            return {"outsider": "no error"}
        except ValueError as e:
            return {"outsider": str(e)}
    try:  # members disagreeing inside the subgroup: messages give global ranks
        call(rank, group=sub, hq=4, hkv=2, causal=rank == 1)
        msg = "no error"
    except ValueError as e:
        msg = str(e)
    out = call(rank, group=sub, hq=4, hkv=2)
    return {"member": msg, "finite": bool(torch.isfinite(out).all())}


def test_rank_outside_the_group_is_refused() -> None:
    outsider, *members = run_ranks(3, membership_worker, timeout=120)
    assert "group" in outsider["outsider"] and "global rank 0" in outsider["outsider"]
    for m in members:
        assert m["finite"]
        assert "'causal': rank 1 passed True, rank 2 passed False" in m["member"], m


# ------------------------------------------------------------ bad arguments

BAD_ARGUMENTS = {
    "softmax_scale": [dict(softmax_scale=math.inf), dict(softmax_scale=math.nan),
                      dict(softmax_scale=True)],
    "causal": [dict(causal="False"), dict(causal=1), dict(causal=None)],
    "head_dim": [dict(d=0, softmax_scale=1.0), dict(d=0)],
    "window_size": [dict(window_size=(True, 0)), dict(window_size=(0, False))],
    # Before the Ulysses all-to-all too: a kernel name is checked with the arguments.
    "kernel": [dict(kernel="bogus"), dict(kernel="bogus", ulysses_size=2, hq=4, hkv=2)],
    # A decided topology is used as it is: what it cannot honour is refused, not dropped.
    "topology": [dict(topology="flat ring"), dict(topology=CPTopology.build(3)),
                 dict(topology=CPTopology.build(2, backward="ring")),  # call() fixes 'burst'
                 dict(topology=CPTopology.build(2), ulysses_size=2, hq=4, hkv=2)],
}


def bad_argument_worker(rank: int, world: int) -> dict:
    seen = {}
    for name, cases in BAD_ARGUMENTS.items():
        for i, options in enumerate(cases):
            with count_comm() as stats:
                try:
                    call(rank, **options)
                    seen[f"{name} {i}"] = "no error"
                except ValueError as e:
                    seen[f"{name} {i}"] = str(e)
            assert stats.total_bytes == 0
    out = call(rank)
    return {"seen": seen, "finite": bool(torch.isfinite(out).all())}


def test_bad_arguments_raise_on_every_rank() -> None:
    for result in run_ranks(2, bad_argument_worker, timeout=120):
        assert result["finite"]
        for key, msg in result["seen"].items():
            assert key.split()[0] in msg, f"{key}: {msg}"


# ------------------------------------------------------------ nested counters


def one_bad_rank_worker(rank: int, world: int) -> dict:
    seen = {}
    for name, bad in (("causal", {"causal": "False"}), ("layout", {"layout": "stripe"})):
        try:
            call(rank, **(bad if rank == 1 else {}))
            seen[name] = "no error"
        except ValueError as e:
            seen[name] = str(e)
    call(rank)  # the group is still healthy
    return seen


def test_a_bad_argument_on_one_rank_raises_on_every_rank() -> None:
    """Its peers hear of it through the argument check instead of waiting in the ring."""
    results = run_ranks(3, one_bad_rank_worker, timeout=120)
    for name, said in (("causal", "causal must be a bool"), ("layout", "layout must be one")):
        assert len({r[name] for r in results}) == 1, [r[name] for r in results]
        assert "failed on rank 1" in results[0][name] and said in results[0][name]


def test_nested_count_comm_blocks_each_see_their_bytes() -> None:
    with count_comm() as outer:
        with count_comm() as inner:
            # Both counters now hold equal values: exiting the inner block must still
            # remove the inner one, not the (equal) outer one.
            record_sent(10, "forward")
        record_sent(7, "backward")
    assert (outer.forward_bytes, outer.backward_bytes) == (10, 7)
    assert (inner.forward_bytes, inner.backward_bytes) == (10, 0)
    record_sent(5, "forward")  # after both blocks closed nobody counts
    assert outer.total_bytes == 17 and inner.total_bytes == 10


# ------------------------------------------------------------ a rank that fails mid-ring


class _FailingKernel:
    """A local kernel that raises: called at step 0, after the ring's first hop is posted."""

    name = "failing"
    dense_min_area = float("inf")
    gpu_bound_min_area = None

    def forward(self, *args):
        raise RuntimeError("injected fault")


def fault_worker(rank: int, world: int, timeout_s: float, folder: str) -> dict:
    os.environ["MEGATRON_BURST_TIMEOUT_S"] = str(timeout_s)
    if rank == 1:
        prepare.pick_kernel = lambda *args, **kwargs: _FailingKernel()
        prepare.check_kernel = lambda *args, **kwargs: None
    start = time.monotonic()
    try:
        call(rank, causal=False, layout="contiguous")
        outcome = "returned"
    except Exception as e:  # the peers' RuntimeError is the point of the test
        outcome = f"{type(e).__name__}: {e}"
    elapsed = time.monotonic() - start
    done = [os.path.join(folder, f"done{r}") for r in range(world) if r != 1]
    if rank == 1:  # stuck, not gone, until the peers are done: they must time out
        until = time.monotonic() + 60
        while not all(map(os.path.exists, done)) and time.monotonic() < until:
            time.sleep(0.05)
    else:
        open(os.path.join(folder, f"done{rank}"), "w").close()
    return {"outcome": outcome, "elapsed": elapsed}


def test_a_rank_failing_mid_ring_does_not_hang_its_peers(tmp_path) -> None:
    timeout_s = 3.0
    results = run_ranks(3, fault_worker, timeout_s, str(tmp_path), timeout=120, barrier=False)
    assert results[1]["outcome"] == "RuntimeError: injected fault"
    # Rank 2 waits to receive from rank 1; rank 0 waits for rank 1 to take its send.
    # (On gloo a hop's header goes first, as a message of its own.)
    expected = {0: r"rank 0 waited [\d.]+ s for rank 1 to take a ring hop('s header)? "
                   r"\(forward\)",
                2: r"rank 2 waited [\d.]+ s for a ring hop('s header)? from rank 1 "
                   r"\(forward\)"}
    for rank, pattern in expected.items():
        outcome, elapsed = results[rank]["outcome"], results[rank]["elapsed"]
        assert re.fullmatch(f"RuntimeError: {pattern}: that rank failed or is stuck",
                            outcome), outcome
        assert timeout_s <= elapsed < timeout_s + 10, elapsed


# ------------------------------------------------------------ the verdict cache


def cache_worker(rank: int, world: int) -> dict:
    from megatron_burst.attention import agree  # here, so the other tests run against older code

    collectives = []
    real = dist.all_gather

    def counting(*args, **kwargs):  # agree's one collective per check
        collectives.append(1)
        return real(*args, **kwargs)

    dist.all_gather = counting

    def cost(mode: str, **options) -> int:
        os.environ["MEGATRON_BURST_AGREE"] = mode
        settings.reload()  # the package reads its settings once; this rank changes one
        before = len(collectives)
        call(rank, hq=4, hkv=2, **options)
        return len(collectives) - before

    seen = {"first": cost("first"), "repeat": cost("first"), "new shape": cost("first", s=16),
            "old shape": cost("first"), "always": [cost("always") for _ in range(3)],
            "off": cost("off", s=24), "after off": cost("first", s=24)}
    # New document boundaries every batch: each is checked, and the cache stays bounded.
    agree.CACHE_SIZE = 3
    batches = [(4, 12), (8, 8), (12, 4), (16,), (4, 4, 8)]
    seen["documents"] = [cost("first", docs=docs) for docs in batches]
    seen["newest again"] = cost("first", docs=batches[-1])
    seen["evicted again"] = cost("first", docs=batches[0])
    return seen


def test_the_check_runs_once_per_signature_by_default() -> None:
    """One collective per new signature; the group's first check trades the ranks'
    MEGATRON_BURST_AGREE modes first (one more, once)."""
    for seen in run_ranks(2, cache_worker, timeout=120):
        assert seen == {"first": 2, "repeat": 0, "new shape": 1, "old shape": 0,
                        "always": [1, 1, 1], "off": 0, "after off": 1,
                        "documents": [1] * 5, "newest again": 0, "evicted again": 1}


# ------------------------------------------------------------ the check travels while planning


def overlap_worker(rank: int, world: int) -> dict:
    """A new signature's exchange is posted once the call is signed, read after its plan;
    a plan that fails after that raises alike everywhere, or the disagreement comes first."""
    from megatron_burst.comm import consensus

    events, plan = [], prepare._bind_plan
    exchange_init, exchange_values = consensus.Exchange.__init__, consensus.Exchange.values

    def posted(self, *a, **k):
        events.append("posted")
        exchange_init(self, *a, **k)

    def read(self):
        events.append("read")
        return exchange_values(self)

    def planned(*a, **k):
        events.append("planned")
        if os.environ.get("FAIL_PLAN") in ("all", str(rank)):
            raise ValueError(f"a plan refused on rank {rank}")
        return plan(*a, **k)

    consensus.Exchange.__init__, consensus.Exchange.values = posted, read
    prepare._bind_plan = planned
    call(rank, docs=(4, 12))
    order = list(events)
    said = {}
    for case, fail, docs, odd in (
            ("all fail", "all", (8, 8), {}),
            ("disagree, rank 0 fails", "0", (12, 4), {"causal": False} if rank == 1 else {})):
        os.environ["FAIL_PLAN"] = fail
        try:
            call(rank, docs=docs, **odd)
            said[case] = "no error"
        except ValueError as e:
            said[case] = str(e)
    os.environ.pop("FAIL_PLAN")
    out = call(rank, docs=(16,))  # the group is healthy after
    return {"order": order, "said": said, "finite": bool(torch.isfinite(out).all())}


def test_a_new_signature_is_checked_while_the_call_is_planned() -> None:
    results = run_ranks(2, overlap_worker, timeout=120)
    for r in results:
        # The group's first check compares the modes first (posted, read), then the call's.
        assert r["order"][-3:] == ["posted", "planned", "read"], r["order"]
        assert r["finite"]
    all_fail = [r["said"]["all fail"] for r in results]
    assert all_fail == ["a plan refused on rank 0", "a plan refused on rank 1"]
    disagree = [r["said"]["disagree, rank 0 fails"] for r in results]
    assert disagree == ["burst_attn failed on rank 0: a plan refused on rank 0 (every rank "
                        "of the group raises this error)"] * 2, disagree
