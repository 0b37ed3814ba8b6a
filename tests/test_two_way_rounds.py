"""Two-sided windows on 4+ ranks: a pass in two rounds, one each way round the ring.

The plans (``attention.ring_rounds``): a contiguous two-sided window takes one step
each way (3 steps where the one-way ring took R), its two edges posted together at step 0
and nothing relayed; the area layout, which puts the sequence's two ends on ranks of their
own, takes two each way (5 of 8 steps on 8 ranks); every (query member, key member) pair
is read once; what does not gain keeps the one-way ring (2-3 ranks, a causal window, a
global window, the double ring, Ulysses, document packs). Then exactness on 4-8 gloo ranks
against the float64 dense reference (out, lse, dq, dk, dv), both backwards, with GQA, MQA,
MLA head dims, sinks, batch 2 and sbhd; a plain ``window_size`` call takes the same rounds
and gives the same answers; and each rank sends fewer messages than the one-way ring did.
"""
from __future__ import annotations

import pytest
import torch

import megatron_burst as mb
from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key
from megatron_burst.plan import mask_families as mf
from megatron_burst.plan.schedule import Mask

from .distributed import run_ranks
from .grid import make_case_inputs, reduce_errors
from .test_slice_masks import run_mask_case

TOL = 1e-9


def _plans(world: int, mask, layout: str, total: int, backward: str = "ring", **key):
    return [build_plan(plan_key(layout, world, (total,), mask, key.get("ulysses", 1),
                                RingKey(tuple(range(world)), r, key.get("ppn")), backward))
            for r in range(world)]


def _pairs(plan) -> set:
    """(query member, key member) of every block the plan's forward computes."""
    me = plan.topo.index
    return {(me, s.source) for s in plan.forward.steps if s.calls}


@pytest.mark.parametrize("world", [4, 5, 8])
@pytest.mark.parametrize("backward", ["ring", "burst"])
def test_a_contiguous_window_takes_one_step_each_way(world, backward):
    total, w = 16 * world, 5
    for plan in _plans(world, mf.sliding_window(total, w), "contiguous", total, backward):
        me, steps = plan.topo.index, plan.forward.steps
        assert [s.source for s in steps] == [me, (me - 1) % world, (me + 1) % world]
        assert [s.next for s in steps] == ["intra", "back", None]
        first = sorted(h.kind for h in steps[0].hops)
        assert first == ["back", "intra"] and not steps[1].hops and not steps[2].hops
        assert all(h.n_send in (0, w) and h.n_recv in (0, w) for h in steps[0].hops)
        assert len(plan.backward.steps) == 3


@pytest.mark.parametrize("world", [4, 8])
def test_the_area_layout_keeps_the_sequence_order_and_takes_one_step_each_way(world):
    total = 1024 * world
    plans = _plans(world, mf.sliding_window(total, 128), "area", total)
    assert [p.sched.shard(p.topo.index).segments[0].pos for p in plans] == [
        1024 * r for r in range(world)]
    assert {len(p.forward.steps) for p in plans} == {3}


def test_a_window_wider_than_a_rank_takes_two_steps_each_way_and_reads_each_pair_once():
    world, total = 8, 128  # 16 rows a rank, a window of 20: two ranks each way
    mask = mf.sliding_window(total, 20)
    plans = _plans(world, mask, "contiguous", total)
    assert {len(p.forward.steps) for p in plans} == {5}
    assert any(h.kind == "back" for p in plans for s in p.forward.steps[3:] for h in s.hops)
    one_way = {(q, k) for q in range(world) for k in range(world)
               if plans[0].sched.split_blocks(q, k)}
    seen = [pair for p in plans for pair in _pairs(p)]
    assert sorted(seen) == sorted(one_way)  # every pair read, and once


@pytest.mark.parametrize("world, mask, total, key", [
    (3, mf.sliding_window(48, 5), 48, {}),  # one step each way is all there is
    (4, mf.sliding_window_causal(64, 5), 64, {}),  # one way, one step already
    (4, mf.global_sliding_window(64, 4, 5), 64, {}),  # its global rows read every member
    (8, mf.sliding_window(128, 5), 128, {"ppn": 4}),  # the double ring
])
def test_what_does_not_gain_keeps_the_one_way_ring(world, mask, total, key):
    for plan in _plans(world, mask, "contiguous", total, **key):
        assert all(h.kind != "back" for s in plan.forward.steps for h in s.hops)


def test_ulysses_groups_keep_the_one_way_ring():
    from megatron_burst.plan.runs import two_way_reach
    from megatron_burst.comm.ring_positions import RingPositions
    from megatron_burst.plan.schedule import RingSchedule

    sched = RingSchedule("contiguous", 4, (64,), mf.sliding_window(64, 5), 1)
    topo = RingPositions(range(4), 1)
    assert two_way_reach(sched, topo, 1) == (1, 1)
    assert two_way_reach(sched, topo, 2) is None


def _cases() -> list[dict]:
    cases = []
    for i, extra in enumerate([{}, dict(hkv=1), dict(sinks=True), dict(b=2), dict(fmt="sbhd"),
                               dict(dv=6, d=12), dict(dtype=torch.float32, kernel="cpu-flash")]):
        cases.append(dict(backward=("ring", "burst")[i % 2], **extra))
        cases.append(dict(backward=("burst", "ring")[i % 2], **extra))
    return cases


def _worker(rank, world, layout, window):
    seq = 16 * world
    mask = mf.sliding_window(seq, window)
    return [run_mask_case(rank, world, 31 * i + world, mask=mask, layout=layout, seq=seq, **case)
            for i, case in enumerate(_cases())]


@pytest.mark.parametrize("world, layout, window", [(4, "contiguous", 5), (5, "contiguous", 16),
                                                   (8, "area", 3), (6, "contiguous", 2),
                                                   (8, "contiguous", 20)])
def test_two_way_rounds_are_exact_on_ranks(world, layout, window):
    seq = 16 * world
    plans = _plans(world, mf.sliding_window(seq, window), layout, seq)
    assert any(h.kind == "back" for p in plans for s in p.forward.steps for h in s.hops)
    errors = reduce_errors(run_ranks(world, _worker, layout, window))
    bad = [f"{case} {name}: {e:.3g}" for case, err in zip(_cases(), errors)
           for name, e in err.items()
           if not e <= (2e-5 if case.get("dtype") == torch.float32 else TOL)]
    assert not bad, "\n".join(bad[:10])


def _window_call(rank, world, backward):
    """A plain two-sided ``window_size`` call (contiguous layout): its output and gradients,
    gathered, and the messages this rank sent in each pass."""
    seq, w = 16 * world, 5
    q, k, v, dout = make_case_inputs(7, 1, seq, 4, 2, 8)
    local = [mb.shard_seq(t, layout="contiguous").clone().requires_grad_() for t in (q, k, v)]
    with mb.count_comm() as sent:
        out = mb.burst_attn(*local, window_size=(w, w), layout="contiguous", backward=backward)
        out.backward(mb.shard_seq(dout, layout="contiguous"))
    got = [mb.unshard_seq(t.detach(), layout="contiguous") for t in (out, *[x.grad for x in local])]
    return got, sent.forward_messages, sent.backward_messages


@pytest.mark.parametrize("backward", ["ring", "burst"])
def test_a_window_size_call_takes_the_rounds_and_sends_fewer_messages(backward):
    from .reference import reference_attention

    world, seq, w = 6, 96, 5
    results = run_ranks(world, _window_call, backward)
    q, k, v, dout = make_case_inputs(7, 1, seq, 4, 2, 8)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref, _ = reference_attention(*leaves, causal=False, scale=8 ** -0.5, window=(w, w))
    ref.backward(dout)
    for got, _, _ in results:
        for mine, want in zip(got, [ref.detach(), *[t.grad for t in leaves]]):
            torch.testing.assert_close(mine, want, rtol=0, atol=1e-9)
    # one edge each way (none past the sequence's ends); the one-way ring relayed the far
    # edge through every rank: world - 1 messages from each
    assert [fwd for _, fwd, _ in results] == [1] + [2] * (world - 2) + [1]
