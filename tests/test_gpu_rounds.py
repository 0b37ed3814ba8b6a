"""GPU check of windows' rounds each way round the ring (skipped without 4 GPUs).

On 4+ ranks a window whose payloads lie a few ranks away one way or the other runs as two
rounds, one round the ring and one round the reversed ring (``attention.ring_rounds``). On
CPU ranks that is exact in float64 (``tests/test_two_way_rounds.py``); here it runs over
NCCL in bf16, where the second round's hops go to the other neighbour at step 0 beside the
first round's: LongCA-bench's sliding window on the area and contiguous layouts, and a
model's ``window_size`` calls on zigzag (causal and two-sided), both backwards, against
float64 on the GPU (out, lse, dq, dk, dv). The plans are checked to take the rounds first,
so a test that passes has run them.
"""
from __future__ import annotations

import pytest
import torch

import megatron_burst as mb
from megatron_burst.plan import mask_families as mf
from megatron_burst.plan.blocks import Mask

from .distributed import run_ranks
from .reference import reference_attention, slice_allowed
from .test_gpu import NGPU, check_bf16_rows, rel
from .test_two_way_rounds import _plans

pytestmark = pytest.mark.skipif(NGPU < 4, reason="needs 4 GPUs")

ROWS, W = 1024, 256  # a rank's rows; the window (narrower than a rank: one step each way)


def _cases(world: int) -> list[tuple]:
    """(name, layout, SliceMask or None, window_size, causal) of each call."""
    total = ROWS * world
    window = mf.sliding_window(total, W)
    return [("sliding_window-area", "area", window, None, False),
            ("sliding_window-contiguous", "contiguous", window, None, False),
            ("window_size-causal-zigzag", "zigzag", None, (W, 0), True),
            ("window_size-both-zigzag", "zigzag", None, (W, W), False)]


def _reference(q, k, v, do, mask, window, causal):
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    scale = q.shape[-1] ** -0.5
    if mask is not None:
        allowed = slice_allowed(q.shape[1], mask.q_ranges, mask.k_ranges, mask.kinds)
        out, lse = reference_attention(*leaves, causal=False, scale=scale,
                                       allowed=allowed.to(q.device))
    else:
        out, lse = reference_attention(*leaves, causal=causal, scale=scale, window=window)
    out.backward(do.double())
    return out.detach(), lse.detach(), [t.grad for t in leaves]


def rounds_worker(rank: int, world: int, backwards: tuple[str, ...]) -> list[dict]:
    dev = torch.device("cuda", rank)
    gen = torch.Generator(device=dev).manual_seed(4242)
    total, hq, hkv, d = ROWS * world, 16, 4, 64
    rows = []
    for name, layout, mask, window, causal in _cases(world):
        q, do = (torch.randn(1, total, hq, d, device=dev, generator=gen, dtype=torch.bfloat16)
                 for _ in range(2))
        k, v = (torch.randn(1, total, hkv, d, device=dev, generator=gen, dtype=torch.bfloat16)
                for _ in range(2))
        r_out, r_lse, r_grads = _reference(q, k, v, do, mask, window, causal)
        how = dict(layout=layout, mask=mask) if mask is not None else dict(layout=layout)
        call = (dict(mask=mask, layout=layout) if mask is not None
                else dict(window_size=window, causal=causal, layout=layout))

        def shard(t, seq_dim=1):
            return mb.shard_seq(t, seq_dim=seq_dim, **how)

        for backward in backwards:
            local = [shard(t).requires_grad_() for t in (q, k, v)]
            with mb.count_comm() as sent:
                out, lse = mb.burst_attn(*local, backward=backward, return_lse=True, **call)
                out.backward(shard(do))
            torch.cuda.synchronize()
            row = dict(case=name, backward=backward, err_out=rel(out, shard(r_out)),
                       err_lse=rel(lse, shard(r_lse, seq_dim=2)),
                       fwd_msgs=sent.forward_messages, bwd_msgs=sent.backward_messages)
            for n, g, r in zip(("dq", "dk", "dv"), local, r_grads):
                row[f"err_{n}"] = rel(g.grad, shard(r))
            rows.append(row)
    return rows


def test_window_rounds_each_way_in_bf16_over_nccl():
    world = NGPU
    for name, layout, mask, window, causal in _cases(world):
        plan_mask = mask if mask is not None else Mask(causal, window)
        plans = _plans(world, plan_mask, layout, ROWS * world)
        assert any(h.kind == "back" for p in plans for s in p.forward.steps for h in s.hops), \
            f"{name}: the plan keeps the one-way ring; the test would not run the rounds"
    rows = run_ranks(world, rounds_worker, ("burst", "ring"), backend="nccl", timeout=600)[0]
    print(f"\n{world} GPUs, bf16, GQA 16:4, d=64, {ROWS} rows a rank, window {W}")
    check_bf16_rows(rows)
    # one neighbour each way at most: no message relayed round the ring
    assert all(r["fwd_msgs"] <= 2 for r in rows), rows
