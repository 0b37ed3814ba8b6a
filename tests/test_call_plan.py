"""A call's plan as a value: one builder, one bounded cache keyed by value, routes that pair.

Pure functions and single-process checks (no ranks): the plans of every rank of a ring are
built side by side and their hops compared with each other; the Megatron data path's plan
is the call's own; the cache keys by content, never identity; and home accumulators kept
in half precision give the bits an fp32 accumulator gives (on gloo ranks).
"""
from __future__ import annotations

import itertools
import random

import pytest
import torch

import megatron_burst as mb
from megatron_burst.attention import call_plan, ring_rounds
from megatron_burst.attention.call_plan import (PlanKey, RingKey, build_plan, plan_for,
                                                 plan_key)
from megatron_burst.plan.schedule import Mask

from .distributed import run_ranks
from .patching import swap
from .packs import random_pack


def _pack(lens) -> mb.DocumentPack:
    return mb.pack_documents(torch.tensor([0, *itertools.accumulate(lens)]))


def _keys(world: int, docs, mask: Mask, backward: str, layout: str = "whole_docs",
          positions_per_node=None) -> list[PlanKey]:
    """Every rank's key of one call (a pack, or (total,) for a plain sequence)."""
    return [plan_key(layout, world, docs, mask, 1,
                     RingKey(tuple(range(world)), r, positions_per_node) if world > 1 else None,
                     backward, dense_min_area=float("inf"))
            for r in range(world)]


CASES = [(world, kind, mask, backward, ppn)
         for world, ppn in ((2, None), (3, None), (4, None), (4, 2))
         for kind in ("mix", "huge", "tiny", "plain")
         for mask in (Mask(True), Mask(False), Mask(True, (9, 0)))
         for backward in ("ring", "burst")]


@pytest.mark.parametrize("world,kind,mask,backward,ppn", CASES, ids=str)
def test_every_hop_a_rank_posts_is_the_hop_its_peer_expects(world, kind, mask, backward, ppn):
    """Built for each rank alone, the plans agree: at every step of every pass, a send of n
    rows to rank j is matched by rank j's receive of n rows from the sender, and every
    travelling accumulator sent is received, with its rows; the passes end together."""
    rng = random.Random(f"{world}{kind}{mask}{backward}")
    docs = (world * 96,) if kind == "plain" else _pack(random_pack(rng, world * 96, kind))
    layout = "zigzag" if kind == "plain" else "whole_docs"
    plans = [build_plan(k) for k in _keys(world, docs, mask, backward, layout, ppn)]
    for pass_name in ("forward", "backward"):
        passes = [getattr(p, pass_name) for p in plans]
        assert len({len(p.steps) for p in passes}) == 1, "every rank runs the same steps"
        for step in range(len(passes[0].steps)):
            sends = {(r, h.to, h.kind, h.n_send) for r, p in enumerate(passes)
                     for h in p.steps[step].hops if h.n_send}
            recvs = {(h.frm, r, h.kind, h.n_recv) for r, p in enumerate(passes)
                     for h in p.steps[step].hops if h.n_recv}
            assert sends == recvs, (pass_name, step)
            accs = [p.steps[step].acc for p in passes]
            if accs[0] is None:
                continue
            # ... in the dtype its receiver expects (``PassPlan.wire``: the one a rank fills,
            # which is also the one it receives from the holder before it, and its own home)
            wire = [p.wire for p in passes]
            sent = {(r, a.send_to, a.new_rows, wire[r][0]) for r, a in enumerate(accs)
                    if a.send_to is not None}
            got = {(a.recv_next[1], r, a.recv_next[0], wire[r][0]) for r, a in enumerate(accs)
                   if a.recv_next is not None}
            got |= {(a.recv_home[1], r, a.recv_home[0], wire[r][1]) for r, a in enumerate(accs)
                    if a.recv_home is not None}
            assert sent == got, (pass_name, step)


def test_a_plan_is_found_by_value_and_the_cache_is_bounded():
    call_plan.clear()
    lens = (40, 7, 90, 55)
    a, b = _pack(lens), mb.pack_documents(torch.tensor([0, 40, 47, 137, 192], dtype=torch.int32))
    key_a, key_b = (_keys(2, p, Mask(True), "ring")[0] for p in (a, b))
    assert key_a == key_b and hash(key_a) == hash(key_b)
    assert plan_for(key_a) is plan_for(key_b), "equal packs, one plan"
    other = _keys(2, _pack((41, 6, 90, 55)), Mask(True), "ring")[0]
    assert plan_for(other) is not plan_for(key_a)
    for n in range(call_plan.PLAN_CACHE + 5):
        plan_for(_keys(2, (64 * (n + 1),), Mask(True), "ring", "zigzag")[0])
    assert len(call_plan._PLANS) == call_plan.PLAN_CACHE
    call_plan.clear()


def test_the_data_path_plans_under_the_call_s_key():
    """Megatron's data path (``pack_plans``) asks the one builder with the key a layer's
    call makes: the call finds the plan made ahead (same object), nothing is built twice."""
    pytest.importorskip("megatron.core")
    from megatron_burst.attention import prepare
    from megatron_burst.decide.topology import CPTopology
    from megatron_burst.megatron.pack_plans import PlanTarget, plan_pack

    call_plan.clear()
    prepare.PREPARED.clear()
    lens = (5, 40, 11, 8)
    pack = _pack(lens)
    topology = CPTopology.build(1, backward="burst")
    target = PlanTarget.of("whole_docs", Mask(True), topology, None)
    ahead = plan_pack(pack, target, target.ring())
    built = []
    real = swap(call_plan, "build_plan", lambda key: built.append(key) or real(key))
    try:
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 64, h, 8, generator=gen) for h in (4, 2, 2))
        mb.burst_attn(q, k, v, causal=True, layout="whole_docs", cu_seqlens=pack,
                      topology=topology)
    finally:
        call_plan.build_plan = real
    assert built == []
    (prepared,) = prepare.PREPARED.values()
    assert prepared.bound.plan is ahead


def test_half_precision_accumulators_at_cp2_take_at_most_two_partials():
    """At CP=2 (causal zigzag and a pack), no home row takes more than two partials: the
    case where the output and the gradients need no fp32 copy."""
    for docs, layout in (((512,), "zigzag"), (_pack((100, 300, 60, 52)), "whole_docs")):
        for backward in ("ring", "burst"):
            for plan in map(build_plan, _keys(2, docs, Mask(True), backward, layout)):
                assert plan.forward.uses[0] <= 2 and max(plan.backward.uses) <= 2


def _bf16_grads(rank: int, world: int, backward: str, wide: bool) -> list:
    from megatron_burst.attention import burst

    if wide:
        real = burst.home_dtype
        burst.home_dtype = lambda dtype, uses, wide=False: real(dtype, uses, True)
    gen = torch.Generator().manual_seed(10 + rank)
    q, k, v = (torch.randn(1, 64, h, 16, generator=gen).bfloat16().requires_grad_()
               for h in (4, 2, 2))
    do = torch.randn(1, 64, 4, 16, generator=gen).bfloat16()
    out = mb.burst_attn(q, k, v, causal=True, backward=backward)
    out.backward(do)
    return [t.float().tolist() for t in (out, q.grad, k.grad, v.grad)]


@pytest.mark.parametrize("backward", ["ring", "burst"])
def test_half_precision_accumulators_give_the_fp32_accumulators_bits(backward):
    """bf16 home accumulators (at most two partials a row, each sum rounded once) give
    the output and gradients an fp32 accumulator cast at the end gives, bit for bit."""
    half = run_ranks(2, _bf16_grads, backward, False, timeout=120)
    wide = run_ranks(2, _bf16_grads, backward, True, timeout=120)
    assert half == wide


def test_an_accumulator_of_one_partial_travels_in_the_inputs_dtype():
    """Where a travelling accumulator has one holder whose calls touch each of its rows once
    (CP=2; a window that reaches one neighbour), it travels in the inputs' dtype: the one
    bf16 partial is held exactly. Where a second holder adds to it, it stays fp32."""
    cases = [(2, (512,), Mask(True), "zigzag", True), (2, _pack((100, 300, 60, 52)), Mask(True),
             "whole_docs", True), (4, (512,), Mask(True, (63, 0)), "contiguous", True),
             (4, (512,), Mask(True), "zigzag", False)]
    for world, docs, mask, layout, narrow in cases:
        for backward in ("ring", "burst"):
            for plan in map(build_plan, _keys(world, docs, mask, backward, layout)):
                assert plan.backward.wire == (narrow, narrow), (world, layout, backward)
                assert plan.forward.wire == (False, False)  # nothing travels back


def _wire_grads(rank: int, world: int, backward: str, layout: str, fp32_wire: bool) -> list:
    if fp32_wire:  # every accumulator on the wire in fp32, as before ``PassPlan.wire``
        swap(ring_rounds, "one_partial_wire", lambda *args: (False, False))
    gen = torch.Generator().manual_seed(20 + rank)
    q, k, v = (torch.randn(1, 96, h, 16, generator=gen).bfloat16().requires_grad_()
               for h in (4, 2, 2))
    do = torch.randn(1, 96, 4, 16, generator=gen).bfloat16()
    kw = dict(window_size=(40, 0)) if layout == "contiguous" else {}
    out = mb.burst_attn(q, k, v, causal=True, backward=backward, layout=layout, **kw)
    out.backward(do)
    wire = call_plan._PLANS[next(reversed(call_plan._PLANS))].backward.wire
    return [wire, *(t.float().tolist() for t in (out, q.grad, k.grad, v.grad))]


@pytest.mark.parametrize("world,layout,backward", [(2, "zigzag", "ring"), (2, "zigzag", "burst"),
                                                    (3, "contiguous", "ring")])
def test_an_accumulator_in_the_inputs_dtype_gives_the_fp32_wire_bits(world, layout, backward):
    """bf16 on the wire (one partial a row) gives the output and gradients the fp32 wire
    gives, bit for bit, on gloo ranks."""
    narrow = run_ranks(world, _wire_grads, backward, layout, False, timeout=120)
    fp32 = run_ranks(world, _wire_grads, backward, layout, True, timeout=120)
    assert any(True in r[0] for r in narrow), "no accumulator travelled in bf16"
    assert all(r[0] == (False, False) for r in fp32)
    assert [r[1:] for r in narrow] == [r[1:] for r in fp32]


def test_a_device_plan_binds_only_the_launches_it_runs():
    """Deciding the wire plans the holder's calls too (``PairCalls.elsewhere``): they must
    not join this rank's device launches, which every call binds to its boundaries."""
    for backward in ("ring", "burst"):
        for me in range(2):
            key = plan_key("pack_zigzag", 2, (4096,), Mask(True), 1,
                           RingKey((0, 1), me, None), backward, device_docs=True)
            plan = build_plan(key)
            assert plan.backward.wire == (True, True)
            assert {id(c) for c in plan.sides.launches} <= {id(c) for c in plan.calls}, (
                backward, me)
