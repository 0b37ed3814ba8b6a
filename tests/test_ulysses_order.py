"""A Ulysses group holds its rows in position order (issue 41's
finding: in rank order a causal sequence over U ranks' zigzag chunks was 2U pieces, 4 kernel
calls a pass at U = 2 on 2x H100, 22 at U = 8, with merges and adds; in position order it is
one block, one kernel call). The all-to-alls place and return the rows by
``RingSchedule.member_runs``; everything else reads the member's shard.

- the plans: one block and one kernel call for a plain sequence at U = world; one block a
  pair of members in Ulysses x ring; the runs joined where a rank's rows are contiguous;
  rank order kept where documents are held whole, and in ``pack_zigzag``;
- exactness against the float64 reference on 2 and 4 gloo ranks (out, lse, dq, dk, dv):
  causal, full and windows, MHA, GQA and MQA (K/V heads replicated to U), zigzag and
  contiguous, bshd and sbhd, documents split by the zigzag layout, and a loss on lse.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from megatron_burst.plan.blocks import Mask
from megatron_burst.plan.schedule import RingSchedule

from .grid import check_grid


def test_a_whole_ring_ulysses_group_holds_a_causal_sequence_as_one_block():
    for world in (2, 4, 8):
        sched = RingSchedule.of("zigzag", world, (64 * world,), Mask(True, (-1, -1)), world)
        (block,) = sched.blocks(0, 0)
        assert (block.q_start, block.q_stop, block.k_start, block.k_stop) == \
            (0, 64 * world, 0, 64 * world)
        runs = sched.member_runs(0)
        # zigzag: rank r holds chunks r and 2W-1-r; the last rank's two are adjacent
        assert runs[:world] == tuple((r, 0, 32) for r in range(world - 1)) + \
            ((world - 1, 0, 64),)
        assert runs[world:] == tuple((r, 32, 32) for r in range(world - 2, -1, -1))
        assert sum(n for _, _, n in runs) == 64 * world
    hybrid = RingSchedule.of("zigzag", 8, (512,), Mask(True, (-1, -1)), 4)  # a ring of 2
    # a group of 4 holds its ranks' first chunks, then their second ones: two runs of
    # positions, the ring's own zigzag; its diagonal is one causal block, and every other
    # pair one block too
    assert hybrid.member_runs(0) == ((0, 0, 32), (1, 0, 32), (2, 0, 32), (3, 0, 64),
                                     (2, 32, 32), (1, 32, 32), (0, 32, 32))
    assert len(hybrid.shard(0).split) == 2 and len(hybrid.shard(1).split) == 1
    assert [len(hybrid.blocks(a, b)) for a, b in ((0, 0), (1, 0), (0, 1), (1, 1))] == [1] * 4
    whole = RingSchedule.of("whole_docs", 2, (100, 60, 40, 56), Mask(True, (-1, -1)), 2)
    assert whole.member_runs(0) is None  # documents held whole: rank order, one call anyway
    device = RingSchedule.of("pack_zigzag", 2, (256,), Mask(True, (-1, -1)), 2)
    assert device.member_runs(0) is None  # launches bound on the GPU from each rank's rows


def test_the_plan_of_a_whole_ring_ulysses_call_is_one_kernel_call():
    from megatron_burst.attention.call_plan import build_plan, plan_key, ring_key

    for layout in ("zigzag", "contiguous"):
        key = plan_key(layout, 4, (256,), Mask(True, (-1, -1)), 4, ring_key(None, 4, 4, 1),
                       "ring", batch=2)
        plan = build_plan(key)
        assert plan.whole is not None, layout


def _cases(world, u):
    cases = []
    for layout, (causal, window), (hq, hkv), fmt in itertools.product(
            ("zigzag", "contiguous"), ((True, (-1, -1)), (False, (-1, -1)), (True, (3, 0)),
                                       (False, (2, 2))),
            ((4, 4), (8, 2), (4, 1)), ("bshd", "sbhd")):
        cases.append(dict(layout=layout, causal=causal, window=window, hq=hq, hkv=hkv, d=16,
                          backward=("ring", "burst")[hkv == 2], dtype=torch.float32, fmt=fmt,
                          ulysses_size=u))
    for causal in (True, False):  # documents the zigzag layout splits: one block each
        cases.append(dict(layout="zigzag", causal=causal, hq=4, hkv=2, d=16, backward="burst",
                          dtype=torch.float32, doc_lens=(20, 36, 8, 16 * world),
                          ulysses_size=u))
    cases.append(dict(layout="zigzag", causal=True, hq=4, hkv=4, d=16, backward="ring",
                      dtype=torch.bfloat16, ulysses_size=u))
    return cases


@pytest.mark.parametrize("world, u", [(2, 2), (4, 4), (4, 2)])
def test_ulysses_in_position_order_matches_the_float64_reference(world, u):
    """The whole ring as one group (2, 4), and Ulysses 2 x ring 2 (both backwards)."""
    check_grid(world, _cases(world, u))


def _lse_loss(rank, world):
    """A loss on out and lse through a whole-ring Ulysses group, against the reference."""
    import megatron_burst as mb
    from .reference import reference_attention

    gen = torch.Generator().manual_seed(5)
    full = [torch.randn(1, 16 * world, h, 8, generator=gen, dtype=torch.float64)
            for h in (4, 2, 2)]
    leaves = [t.clone().requires_grad_() for t in full]
    out, lse = reference_attention(*leaves, causal=True, scale=8 ** -0.5)
    (out.square().sum() + lse.sum()).backward()
    local = [mb.shard_seq(t).requires_grad_() for t in full]
    got, got_lse = mb.burst_attn(*local, causal=True, ulysses_size=world, return_lse=True)
    (got.square().sum() + got_lse.sum()).backward()
    return [float((mb.shard_seq(ref.grad) - t.grad).abs().max())
            for ref, t in zip(leaves, local)]


def test_a_loss_on_lse_goes_back_through_the_position_order():
    from .distributed import run_ranks

    for errors in run_ranks(2, _lse_loss, timeout=120):
        assert max(errors) < 1e-9, errors


def test_the_way_back_sends_views_of_the_output_copied_once_into_the_message():
    """A position-order group's way back: each peer's rows are views of the member's
    output (``Joined``), copied straight into the message, which then holds what one
    joined tensor would have (no joined copy made first)."""
    from megatron_burst.attention.ulysses import _members_rows_back
    from megatron_burst.comm.joined import Joined
    from megatron_burst.comm.messages import Packed

    x = torch.arange(2 * 12 * 3, dtype=torch.float32).view(2, 12, 3)
    runs = ((0, 0, 2), (1, 0, 4), (0, 4, 3), (0, 2, 2), (1, 4, 1))  # (peer, start, rows)
    pieces = _members_rows_back(x, 1, runs, 2)
    assert all(isinstance(p, Joined) for p in pieces)
    assert all(t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
               for p in pieces for t in p.parts)  # views, nothing copied yet
    # peer 0's rows in its own order: start 0 (x rows 0-1), 2 (x 9-10), 4 (x 6-8)
    want = [torch.cat([x[:, 0:2], x[:, 9:11], x[:, 6:9]], 1),
            torch.cat([x[:, 2:6], x[:, 11:12]], 1)]
    for piece, expected in zip(pieces, want):
        assert piece.shape == expected.shape and torch.equal(piece.joined(), expected)
        packed = Packed.holding([piece, x[:, :1]])
        assert torch.equal(packed.views[0], expected) and torch.equal(packed.views[1], x[:, :1])


def test_the_own_piece_goes_into_the_joined_output_part_by_part():
    """The way back's own piece (views along the sequence) joins the peers' pieces along the
    head dim by being written part by part into its place: what ``torch.cat`` of the joined
    pieces gives, with no joined copy of the own piece first."""
    from megatron_burst.comm.joined import Joined

    x = torch.arange(2 * 6 * 4, dtype=torch.float32).view(2, 6, 4)
    own = Joined((x[:, 4:6, :2], x[:, 0:3, :2]), 1)  # 5 rows, heads 0-1
    peer = torch.randn(2, 5, 3)
    got = Joined((own, peer), 2).joined()
    assert torch.equal(got, torch.cat([torch.cat([x[:, 4:6, :2], x[:, 0:3, :2]], 1), peer], 2))
    assert Joined((peer,), 1).joined() is peer  # one plain part: itself, no copy
