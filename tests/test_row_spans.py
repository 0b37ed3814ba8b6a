"""Hops that carry the span of rows their receivers use (issue 42), not the sender's leading rows.

A window reaching back across the ranks' edge reads the *end* of its neighbour's shard; a hop
then carries that span alone (``RingSchedule.needed_ranges``), its receiver's kernel calls
are planned on the payload as held (from the span's first row), and the travelling gradient
accumulators are cut to the span and added home at its start. Pure checks of the span table
and the plans (every rank's plan built side by side), then gloo ranks: the bytes a window
call sends are the rows its receivers read, and calls whose hops, accumulators and home
additions all start past row 0 match the float64 reference (batch 2, both formats, both
backwards, the double ring).
"""
from __future__ import annotations

import random

import pytest
import torch

import megatron_burst as mb
from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key
from megatron_burst.plan import mask_families as mf
from megatron_burst.plan.schedule import Mask, RingSchedule

from .distributed import run_ranks
from .grid import reduce_errors
from .test_slice_masks import KNOBS, LENS, SEQ, random_mask, run_mask_case

TOL = 1e-9


def _plans(world: int, mask, backward: str, layout: str = "area", total: int = SEQ,
           positions_per_node=None):
    return [build_plan(plan_key(layout, world, (total,), mask, 1,
                                RingKey(tuple(range(world)), r, positions_per_node), backward))
            for r in range(world)]


def _masks(rng: random.Random):
    for name in mf.FAMILIES:
        yield "area", mf.family(name, LENS, **KNOBS)
    for _ in range(12):
        yield "area", random_mask(rng, SEQ)
    for window in ((3, 0), (5, 2), (11, 0)):
        yield "zigzag", Mask(window[1] == 0, window)
        yield "contiguous", Mask(window[1] == 0, window)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_spans_hold_every_later_block_and_only_shrink(world):
    """From a step on, a payload's span holds every row any later block reads of it, and
    the span of a later step lies inside the span of an earlier one (a holder sends on a
    part of what it holds); its length is ``needed_rows``."""
    for layout, mask in _masks(random.Random(world)):
        sched = RingSchedule(layout, world, (SEQ,), mask)
        source = lambda m, s: (m - s) % world  # noqa: E731  (the flat ring)
        for side in ("k", "q"):
            spans = sched.needed_ranges(source, side)
            runs = sched.needed_runs(source, side)
            assert sched.needed_rows(source, side) == tuple(
                tuple(sum(z - a for a, z in r) for r in row) for row in runs)
            for row, span in zip(runs, spans):  # runs: the parts of the span that are read
                for r, (a, b) in zip(row, span):
                    assert all(a <= c < d <= b for c, d in r), (mask, side, row, span)
            for o in range(world):
                for s in range(1, world):
                    a, b = spans[o][s]
                    later = [spans[o][t] for t in range(s + 1, world) if spans[o][t][1] > 0]
                    assert all(a <= c and d <= b for c, d in later), (mask, side, o, s)
                    m = (o + s) % world  # who holds o's payload at step s
                    blocks = (sched.split_blocks(m, o) if side == "k"
                              else sched.split_blocks(o, m))
                    for blk in blocks:
                        lo, hi = ((blk.k_start, blk.k_stop) if side == "k"
                                  else (blk.q_start, blk.q_stop))
                        assert a <= lo and hi <= b, (mask, side, o, s, blk)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_runs_hold_every_later_block_shrink_and_pack_into_the_first(world):
    """From a step on, a payload's runs hold every row any later block reads of it; a
    later step's runs lie inside an earlier step's (a holder sends on a part of what it
    holds), each step's as one interval of step 1's runs packed (the accumulator that
    follows the payload is written from where they begin); no block crosses a gap."""
    from megatron_burst.plan.runs import packed_at

    for layout, mask in _masks(random.Random(world)):
        sched = RingSchedule(layout, world, (SEQ,), mask)
        source = lambda m, s: (m - s) % world  # noqa: E731  (the flat ring)
        for side in ("k", "q"):
            runs = sched.needed_runs(source, side)
            for o in range(world):
                rows = lambda s: {j for a, z in runs[o][s] for j in range(a, z)}  # noqa
                first = runs[o][1]
                for s in range(1, world):
                    later = set().union(*(rows(t) for t in range(s + 1, world)))
                    assert later <= rows(s), (mask, side, o, s)
                    if runs[o][s]:
                        at = packed_at(runs[o][s], first)
                        packed = sorted(j for a, z in first for j in range(a, z))
                        assert packed[at:at + len(rows(s))] == sorted(rows(s)), (mask, o, s)
                    m = (o + s) % world
                    blocks = (sched.split_blocks(m, o) if side == "k"
                              else sched.split_blocks(o, m))
                    for blk in blocks:
                        lo, hi = ((blk.k_start, blk.k_stop) if side == "k"
                                  else (blk.q_start, blk.q_stop))
                        assert any(a <= lo and hi <= z for a, z in runs[o][s]), (mask, blk)


def test_a_two_sided_window_on_four_ranks_sends_its_edges_not_the_shard():
    """The sliding window on 4 ranks: o's keys are read at their end by one holder and at
    their start by another; the hop carries those two runs (2 x the window), not the shard
    between (``benchmarks/results/h100x4_checks/``: 37.7 MB where 4.2 would do)."""
    total, world = 4 * 8192, 4
    sched = RingSchedule("area", world, (total,), mf.family("sliding_window", (total,),
                                                            window=1024))
    rows = sched.needed_rows(lambda m, s: (m - s) % world)
    assert max(r for row in rows for r in row[1:]) <= 2 * 1024, rows
    assert max(b - a for row in sched.needed_ranges(lambda m, s: (m - s) % world)
               for a, b in row[1:]) == total // world  # the span: the whole shard


def _read(plan, me: int, other: int) -> set[int]:
    return {j for b in plan.sched.split_blocks(me, other) for j in range(b.k_start, b.k_stop)}


def _read_rows(plan, me: int, other: int) -> int:
    return len(_read(plan, me, other))


@pytest.mark.parametrize("name", ["sliding_window", "sliding_window_causal",
                                  "block_causal_document"])
def test_two_ranks_receive_exactly_the_rows_they_read(name):
    """On 2 ranks a forward hop carries the rows its receiver reads, no more (the runs of
    a block-causal document's blocks; a window's one span), and not from the sender's
    first row (before spans, the whole shard went)."""
    mask = mf.family(name, LENS, **KNOBS)
    plans = _plans(2, mask, "burst")
    sent_from = [h.send_from or h.send_runs for p in plans for s in p.forward.steps
                 for h in s.hops if h.n_send]
    assert any(sent_from), "no hop starts past row 0: the test would not see spans"
    for me, plan in enumerate(plans):
        received = sum(h.n_recv for s in plan.forward.steps for h in s.hops)
        read = _read(plan, me, 1 - me)  # (a causal window reads one neighbour alone)
        assert received == len(read) < plan.rows


@pytest.mark.parametrize("world,ppn", [(2, None), (3, None), (4, None), (4, 2)])
def test_each_calls_rows_lie_in_the_payload_it_holds(world, ppn):
    """A step's kernel calls index the payload as held: every key run (query run for the
    burst backward's visitors) lies in [0, the rows that arrived), and a hop sends rows
    that its sender holds."""
    rng = random.Random(7 + world)
    for layout, mask in _masks(rng):
        for backward in ("ring", "burst"):
            for plan in _plans(world, mask, backward, layout, positions_per_node=ppn):
                for pas, side in ((plan.forward, "k"), (plan.backward,
                                                        "q" if backward == "burst" else "k")):
                    held, pending = plan.rows, {}
                    for step in pas.steps:
                        for call in step.calls:
                            runs = (call.k_runs if side == "k" else call.q_runs) \
                                if call.varlen else [
                                    (call.blocks[0].k_start, call.blocks[0].k_stop)
                                    if side == "k" else
                                    (call.blocks[0].q_start, call.blocks[0].q_stop)]
                            assert all(0 <= a < b <= held for a, b in runs), (mask, step)
                        for hop in step.hops:
                            assert hop.send_from + hop.n_send <= held or not hop.n_send
                        pending.update((h.kind, h.n_recv) for h in step.hops)
                        held = pending.pop(step.next, 0) if step.next else held


def window_bytes_worker(rank, world):
    mask = mf.family("sliding_window", (SEQ * world,), **dict(KNOBS, window=3))
    x = torch.randn(1, SEQ * world, 2, 8, dtype=torch.float64)
    q = mb.shard_seq(x, mask=mask).requires_grad_()
    with mb.count_comm() as sent:
        out = mb.burst_attn(q, q, q, mask=mask, backward="burst")
    return sent.forward_bytes, q.shape[1], out.shape[1]


def test_a_window_call_sends_the_rows_its_receiver_reads():
    """The ring sends what the plan says: on 2 gloo ranks a (3, 3) window's forward sends
    each rank's K and V of the rows its neighbour reads, far fewer than the shard."""
    world = 2
    mask = mf.family("sliding_window", (SEQ * world,), **dict(KNOBS, window=3))
    plans = _plans(world, mask, "burst", total=SEQ * world)
    row_bytes = 2 * 2 * 8 * 8  # K and V: 2 heads x 8 dims of float64 each
    for rank, (sent, rows, _) in enumerate(run_ranks(world, window_bytes_worker)):
        read = _read_rows(plans[1 - rank], 1 - rank, rank)
        assert sent == read * row_bytes, (rank, sent, read)
        assert 0 < read < rows


def spans_worker(rank, world, cases):
    return [run_mask_case(rank, world, 31 * i + world, **case) for i, case in enumerate(cases)]


SPAN_CASES = [
    (3, dict(mask=mf.family("sliding_window", LENS, **KNOBS), backward="ring", b=2)),
    (3, dict(mask=mf.family("sliding_window", LENS, **KNOBS), backward="burst", fmt="sbhd")),
    (3, dict(mask=mf.family("causal_blockwise", LENS, **KNOBS), backward="burst", b=2)),
    (3, dict(mask=mf.family("shared_question", LENS, **KNOBS), backward="ring", fmt="sbhd")),
    (4, dict(mask=mf.family("causal", LENS, **KNOBS), backward="burst", b=2)),
    (4, dict(mask=mf.family("sliding_window_causal", LENS, **KNOBS), backward="ring", b=2)),
    (4, dict(mask=mf.family("causal_blockwise", LENS, **KNOBS), backward="burst",
             intra_node_size=2, fmt="sbhd")),
    (4, dict(mask=mf.family("causal_document", LENS, **KNOBS), backward="ring",
             intra_node_size=2, b=2)),
]


def _offsets(world: int, case: dict) -> set[str]:
    """Which of the span offsets the case's plans use on some rank."""
    found = set()
    for plan in _plans(world, case["mask"], case["backward"],
                       positions_per_node=case.get("intra_node_size")):
        for step in plan.forward.steps + plan.backward.steps:
            found |= {"send_from"} if any(h.send_from for h in step.hops) else set()
            if step.acc is not None:
                found |= {"held_at"} if step.acc.held_at else set()
                found |= {"home_at"} if step.acc.home_at else set()
    return found


@pytest.mark.parametrize("world", [3, 4])
def test_calls_whose_spans_start_past_row_zero_are_exact(world):
    """Cases whose plans send from past a shard's first row, add into an accumulator past
    its first row (``held_at``) and add one home past the home's first row (``home_at``),
    each somewhere in the set: out, lse, dq, dk, dv against the float64 reference."""
    cases = [case for w, case in SPAN_CASES if w == world]
    used = set().union(*(_offsets(world, case) for case in cases))
    assert used == {"send_from", "held_at", "home_at"}, used
    errors = reduce_errors(run_ranks(world, spans_worker, cases))
    bad = [f"{c['mask']} {c['backward']} {n}: {e:.3g}" for c, err in zip(cases, errors)
           for n, e in err.items() if not e <= TOL]
    assert not bad, "\n".join(bad)


def _uses_runs(world: int, total: int, case: dict) -> bool:
    """Whether some rank's plan of the case gathers runs or adds an accumulator home by
    runs (``plan.runs``)."""
    for r in range(world):
        plan = build_plan(plan_key("area", world, (total,), case["mask"], 1,
                                   RingKey(tuple(range(world)), r,
                                           case.get("intra_node_size")), case["backward"]))
        for step in plan.forward.steps + plan.backward.steps:
            if any(h.send_runs for h in step.hops) or (step.acc and step.acc.home_runs):
                return True
    return False


def test_runs_are_exact_on_four_ranks_at_a_larger_size():
    """Random masks and the families with gaps at 384 tokens on 4 ranks (the flat ring, the
    double ring 2x2, Ulysses 2 x ring 2), both backwards: out, lse, dq, dk, dv against the
    float64 reference, and most cases move runs."""
    from .test_slice_masks import mask_worker

    rng, total, world = random.Random(42), 384, 4
    cases = []
    for i in range(15):  # (the families' windows on 4 ranks read one rank each way since
        # the area layout keeps the sequence's order: their hops carry one run; more masks)
        mask = random_mask(rng, total) if i % 3 or i >= 12 else mf.family(
            ("sliding_window", "block_causal_document", "global_sliding_window",
             "shared_question")[i // 3], (128, 128, 128), window=rng.randint(3, 40),
            global_size=rng.randint(1, 20), block=rng.randint(5, 40), prefix=10)
        case = dict(mask=mask, seq=total, backward=("burst", "ring")[i % 2])
        case.update(({}, {}, {"intra_node_size": 2}, {"ulysses_size": 2})[i % 4])
        cases.append(case)
    assert sum(_uses_runs(world, total, c) for c in cases if "ulysses_size" not in c) >= 5
    errors = reduce_errors(run_ranks(world, mask_worker, cases, timeout=300))
    bad = [(i, n, e) for i, err in enumerate(errors) for n, e in err.items() if not e <= TOL]
    assert not bad, bad
