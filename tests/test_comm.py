"""The comm layer's one-message hops: Packed layouts, and a ring hop of mixed tensors."""
from __future__ import annotations

import torch

from megatron_burst.comm import Packed, PayloadRing, PeerComm, RingPositions, RowShape, count_comm
from megatron_burst.comm.ring_positions import next_kind, route_hops
from tests.distributed import run_ranks


def test_packed_views_hold_mixed_dtypes_aligned_and_disjoint() -> None:
    q = torch.randn(2, 5, 3, 4, dtype=torch.bfloat16)
    lse = torch.randn(2, 3, 5)
    idx = torch.arange(7, dtype=torch.int64)
    packed = Packed.holding([q, lse, idx])
    assert packed.nbytes == q.nbytes + lse.nbytes + idx.nbytes
    for view, t in zip(packed.views, (q, lse, idx)):
        assert view.dtype == t.dtype and view.shape == t.shape and view.is_contiguous()
        assert view.data_ptr() % 16 == 0
        torch.testing.assert_close(view, t, rtol=0, atol=0)
    packed.views[1].zero_()  # writing one view leaves its neighbours alone
    torch.testing.assert_close(packed.views[0], q, rtol=0, atol=0)
    torch.testing.assert_close(packed.views[2], idx, rtol=0, atol=0)


def test_packed_holding_copies_only_when_it_must() -> None:
    t = torch.randn(4, 6)
    lone = Packed.holding([t])  # copied behind the room for the header (headers.py)
    assert lone.views[0].data_ptr() != t.data_ptr() and torch.equal(lone.views[0], t)
    assert lone.header.data_ptr() == lone.flat.data_ptr() and lone.header.numel() == 4
    packed = Packed.holding([t, t])
    assert Packed.holding(packed) is packed
    strided = torch.randn(6, 4).t()
    wrapped = Packed.holding([strided])
    assert wrapped.views[0].data_ptr() != strided.data_ptr()
    torch.testing.assert_close(wrapped.views[0], strided, rtol=0, atol=0)
    zero = Packed([((3, 2), torch.float32), ((5,), torch.bfloat16)], torch.device("cpu"),
                  zero=True)
    assert all(float(v.abs().sum()) == 0 for v in zero.views)


def _ring_hops(rank: int, world: int, keep: dict) -> dict:
    """K-like bf16 and lse-like fp32 go round a ring of `world`; one message per hop, cut to
    the rows its receiver uses (``keep[step]`` rows from that step on)."""
    ranks = list(range(world))
    payload = (torch.arange(3 * 4, dtype=torch.bfloat16).view(3, 4) + 100 * rank,
               torch.arange(2 * 3, dtype=torch.float32).view(2, 3) + 100 * rank)
    rows = lambda origin, step: keep[step]  # noqa: E731
    topo = RingPositions(ranks, rank)
    hops = route_hops(topo, world - 1, rows)
    ring = PayloadRing(PeerComm(None), RowShape.of(payload, (0, 1)))
    seen, held = [], payload
    with count_comm() as stats:
        for step in range(world):
            ring.post(hops[step], held)
            seen.append(None if held is None else [t.tolist() for t in held])
            if step < world - 1:
                held = ring.next(next_kind(topo, step))
        ring.finish()
    return dict(seen=seen, messages=stats.forward_messages, bytes=stats.forward_bytes)


def test_payload_ring_sends_one_message_per_hop_cut_to_what_is_used() -> None:
    world = 4
    keep = {0: 3, 1: 3, 2: 2, 3: 0}  # rows used from each step on
    for rank, out in enumerate(run_ranks(world, _ring_hops, keep, timeout=120)):
        for step, got in enumerate(out["seen"]):
            origin = (rank - step) % world
            rows = 3 if step == 0 else keep[step]
            if rows == 0:
                assert got is None
                continue
            k = (torch.arange(12, dtype=torch.bfloat16).view(3, 4) + 100 * origin)[:rows]
            lse = (torch.arange(6, dtype=torch.float32).view(2, 3) + 100 * origin)[:, :rows]
            assert got == [k.tolist(), lse.tolist()]
        # The hop at step 0 carries 3 rows, at step 1 two, at step 2 none (unused at 3).
        assert out["messages"] == 2
        assert out["bytes"] == (3 * 4 * 2 + 2 * 3 * 4) + (2 * 4 * 2 + 2 * 2 * 4)
