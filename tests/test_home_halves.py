"""The backward's home step in two halves by heads (``attention.home_halves``).

The plan defers half of step 0's heads wherever an accumulator comes home after the last
kernel call; on gloo ranks the deferred half runs after the pass's last message is posted,
and the gradients are the bits the undivided step gives (CP=2, bf16: at most two partials a
row, so the order of the two additions cannot show). Exactness against the float64
reference, at every world size, layout and head count, is ``test_burst``'s, which runs
through the split.
"""
from __future__ import annotations

import itertools

import pytest
import torch

import megatron_burst as mb
from megatron_burst.attention import home_halves
from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key
from megatron_burst.plan.schedule import Mask

from .distributed import run_ranks


def _plan(world: int, me: int, docs, backward: str, layout: str):
    ring = RingKey(tuple(range(world)), me, None) if world > 1 else None
    return build_plan(plan_key(layout, world, docs, Mask(True), 1, ring, backward,
                               dense_min_area=float("inf")))


def test_the_plan_defers_half_the_home_step_where_an_accumulator_comes_home():
    pack = mb.pack_documents(torch.tensor([0, *itertools.accumulate((100, 300, 60, 52))]))
    for backward in ("ring", "burst"):
        for me in range(2):
            assert _plan(2, me, (512,), backward, "zigzag").backward.defer_home
            assert not _plan(2, me, (512,), backward, "zigzag").forward.defer_home
        assert not _plan(1, 0, (512,), backward, "zigzag").backward.defer_home
        # whole documents, each on one rank: nothing travels, nothing comes home
        whole = mb.pack_documents(torch.tensor([0, 256, 512]))
        assert not _plan(2, 0, whole, backward, "whole_docs").backward.defer_home
        assert any(_plan(2, me, pack, backward, "whole_docs").backward.defer_home
                   for me in range(2))


def test_the_halves_keep_each_query_head_with_its_k_v_head():
    assert home_halves.halves(8, 1) is None  # MQA: every query head reads the one K/V head
    for hq, hk in ((4, 4), (8, 2), (12, 3), (32, 8)):
        first, second = home_halves.halves(hq, hk)
        group = hq // hk
        assert first.q.start == first.k.start == 0 and second.q.stop == hq
        assert (first.q.stop, second.q.start) == (first.k.stop * group, second.k.start * group)
        assert second.k.stop == hk and 0 < first.k.stop < hk


def _grads(rank: int, world: int, backward: str, split: bool) -> list:
    """bf16 CP=2 causal fwd+bwd (GQA 4:2), and the order of the backward's messages and
    kernel calls (with each call's query heads)."""
    from megatron_burst.attention import burst
    from megatron_burst.comm import messages

    if not split:
        burst.halves = lambda hq, hk: None
    events = []
    post, run = messages.PeerComm.post, home_halves.run_backward

    def logged_post(self, sends, recvs):
        events.append("post")
        return post(self, sends, recvs)

    def logged_run(kernel, call, dout, q, *args):
        events.append(q.shape[2])
        return run(kernel, call, dout, q, *args)

    messages.PeerComm.post, home_halves.run_backward = logged_post, logged_run
    gen = torch.Generator().manual_seed(30 + rank)
    q, k, v = (torch.randn(1, 64, h, 16, generator=gen).bfloat16().requires_grad_()
               for h in (4, 2, 2))
    do = torch.randn(1, 64, 4, 16, generator=gen).bfloat16()
    out = mb.burst_attn(q, k, v, causal=True, backward=backward)
    events.clear()
    out.backward(do)
    return [events, *(t.float().tolist() for t in (q.grad, k.grad, v.grad))]


@pytest.mark.parametrize("backward", ["ring", "burst"])
def test_the_deferred_half_runs_after_the_last_post_and_changes_no_bit(backward):
    split = run_ranks(2, _grads, backward, True, timeout=120)
    whole = run_ranks(2, _grads, backward, False, timeout=120)
    for events, *_ in split:
        last_post = max(i for i, e in enumerate(events) if e == "post")
        calls = [e for e in events if e != "post"]
        assert calls[0] == 2 and calls[-1] == 2, events  # step 0's heads: 2 now, 2 at the end
        assert events[-1] == 2 and last_post < len(events) - 1, events
    for events, *_ in whole:
        assert 2 not in events and 4 in events, events
    assert [r[1:] for r in split] == [r[1:] for r in whole]
