"""burst_attn against the float64 reference on gloo ranks: out, lse, dq, dk, dv.

Each test spawns one process group and runs a grid of cases in it (fresh random inputs
per case): causal and full, zigzag and contiguous, MHA 4:4, GQA 8:2, MQA 4:1, head dims
64 and 128, batch 2, every backward mode, bshd and sbhd, fp32 and bf16. Errors are
relative Frobenius norms over the whole sequence (summed across ranks).
"""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

import megatron_burst as mb
from megatron_burst.decide import cost

from .distributed import run_ranks
from .grid import check_grid, make_case_inputs
from .reference import reference_attention

HEADS = [(4, 4), (8, 2), (4, 1)]  # MHA, GQA, MQA


def grid(world):
    layouts = ["contiguous"] if world == 3 else ["zigzag", "contiguous"]
    cases = []
    for layout, causal, (hq, hkv), d, backward, dtype in itertools.product(
            layouts, [True, False], HEADS, [64, 128], ["burst", "ring", "auto"],
            [torch.float32, torch.bfloat16]):
        # sbhd (Megatron's format) on a rotating subset keeps the grid small but covers it.
        fmt = "sbhd" if (d == 64 and backward != "auto") else "bshd"
        cases.append(dict(layout=layout, causal=causal, hq=hq, hkv=hkv, d=d,
                          backward=backward, dtype=dtype, fmt=fmt))
    return cases


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_matches_float64_reference(world):
    check_grid(world, grid(world))


# ------------------------------------------------------------------------- comm bytes


def bytes_worker(rank, world, cases):
    out = []
    for case in cases:
        hq, hkv, d, backward = case
        b, s = 2, 8  # local tokens per rank
        q, k, v = (torch.randn(b, s, h, d, dtype=torch.bfloat16, requires_grad=True)
                   for h in (hq, hkv, hkv))
        with mb.count_comm() as stats:
            o = mb.burst_attn(q, k, v, causal=True, backward=backward)
            o.sum().backward()
        out.append((stats.forward_bytes, stats.backward_bytes))
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_count_comm_matches_the_schedule(world):
    """Each rank sends exactly what CPTopology.rank_bytes counts from the schedule, never more
    than the plain formulas, and the paper's backward claims hold in what is measured."""
    from megatron_burst.decide.topology import HeadShape
    from megatron_burst.decide.options import BurstOptions, resolve

    cases = [(hq, hkv, 64, mode) for hq, hkv in [(8, 8), (8, 2), (4, 1)]
             for mode in ("burst", "ring", "auto")]
    results = run_ranks(world, bytes_worker, cases)
    tokens = 2 * 8
    for rank, per_rank in enumerate(results):
        for (hq, hkv, d, mode), (fwd, bwd) in zip(cases, per_rank):
            # The topology burst_attn resolved for this call ('auto' by the one resolver).
            topology = resolve(BurstOptions(backward=mode), cp=world,
                               heads=HeadShape(hq, hkv, d, 2), tokens=16, max_intra_node_size=None)
            assert (fwd, bwd) == topology.rank_bytes(rank, batch=2, s_local=8)
            assert fwd <= cost.forward_bytes(world, tokens, hkv, d, 2)
            assert bwd <= cost.backward_bytes(topology.backward, world, tokens, hq, hkv, d, 2)
    if world < 4:
        return  # at 2 ranks half of rank 0's payload stays home: the ratios below shift
    total = {case: [sum(x) for x in zip(*(r[i] for r in results))]
             for i, case in enumerate(cases)}
    # The paper's claim, measured: burst moves fewer backward bytes for MHA (0.67x in the
    # plain formulas; 0.77x measured at 4 ranks, where the ring also gains from rank 0's
    # K/V travelling half), ring moves fewer for GQA 4:1, and auto picks the smaller.
    assert total[(8, 8, 64, "burst")][1] <= 0.8 * total[(8, 8, 64, "ring")][1]
    assert total[(8, 2, 64, "ring")][1] < total[(8, 2, 64, "burst")][1]
    for hq, hkv in [(8, 8), (8, 2), (4, 1)]:
        auto = total[(hq, hkv, 64, "auto")][1]
        assert auto == min(total[(hq, hkv, 64, "burst")][1], total[(hq, hkv, 64, "ring")][1])


def test_single_rank_sends_nothing():
    q = torch.randn(1, 8, 2, 16, requires_grad=True)
    with mb.count_comm() as stats:
        mb.burst_attn(q, q, q, causal=True).sum().backward()
    assert (stats.forward_bytes, stats.backward_bytes) == (0, 0)


# ------------------------------------------------------------------------- bad input

BAD_CALLS = {
    "q": lambda q, k, v: mb.burst_attn(q[0], k, v),
    "dtype": lambda q, k, v: mb.burst_attn(q, k.double(), v),
    "heads": lambda q, k, v: mb.burst_attn(q[:, :, :3], k, v),
    "k and v": lambda q, k, v: mb.burst_attn(q, k, v[:, :, :1]),
    "sequence length": lambda q, k, v: mb.burst_attn(q[:, :3], k[:, :3], v[:, :3]),
    "layout": lambda q, k, v: mb.burst_attn(q, k, v, layout="stripe"),
    "backward": lambda q, k, v: mb.burst_attn(q, k, v, backward="fast"),
    "qkv_format": lambda q, k, v: mb.burst_attn(q, k, v, qkv_format="thd"),
    "softmax_scale": lambda q, k, v: mb.burst_attn(q, k, v, softmax_scale=-1.0),
    "q and k": lambda q, k, v: mb.burst_attn(q[:, :4], k, v),
    "head_dim": lambda q, k, v: mb.burst_attn(q[..., :8], k, v),
}


def bad_input_worker(rank, world):
    q = torch.randn(2, 8, 4, 16)
    k = v = torch.randn(2, 8, 2, 16)
    seen = {}
    for key, call in BAD_CALLS.items():
        try:
            call(q, k, v)
            seen[key] = "no error"
        except ValueError as e:
            seen[key] = str(e)
    # The group is still healthy: a real call right after completes on every rank.
    out = mb.burst_attn(q, k, v, causal=True)
    dist.barrier()
    return seen, bool(torch.isfinite(out).all())


def test_bad_input_raises_on_every_rank_without_hanging():
    results = run_ranks(4, bad_input_worker, timeout=120)
    for seen, finite in results:
        assert finite
        for key, msg in seen.items():
            assert key in msg, f"{key!r}: got {msg!r}"


def lse_grad_worker(rank, world):
    """A loss on lse too: d lse / d s = P enters the backward as delta -= dlse."""
    errs = []
    for backward, layout in itertools.product(["burst", "ring"], ["zigzag", "contiguous"]):
        q, k, v, _ = make_case_inputs(5, 2, 8 * world * 2, 4, 2, 16)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref_out, ref_lse = reference_attention(*leaves, causal=True, scale=0.25)
        (ref_out.square().sum() + ref_lse.sin().sum()).backward()
        local = [mb.shard_seq(t, layout=layout).requires_grad_() for t in (q, k, v)]
        out, lse = mb.burst_attn(*local, causal=True, layout=layout, backward=backward,
                                 return_lse=True)
        (out.square().sum() + lse.sin().sum()).backward()
        for got, ref in zip(local, leaves):
            r = mb.shard_seq(ref.grad, layout=layout)
            errs.append(((got.grad - r).norm() / r.norm()).item())
    return max(errs)


def test_gradient_through_lse_is_exact():
    assert max(run_ranks(2, lse_grad_worker)) < 1e-10


def ulysses_bytes_worker(rank, world, cases):
    out = []
    for hq, hkv, u, intra_node_size in cases:
        q, k, v = (torch.randn(2, 8, h, 32, dtype=torch.bfloat16, requires_grad=True)
                   for h in (hq, hkv, hkv))
        with mb.count_comm() as stats:
            mb.burst_attn(q, k, v, causal=True, ulysses_size=u,
                          intra_node_size=intra_node_size).sum().backward()
        out.append((stats.forward_bytes, stats.backward_bytes))
    return out


def test_count_comm_matches_the_topology_with_ulysses():
    """What CPTopology.call_bytes predicts (ring + all-to-alls) is what a rank sends."""
    from megatron_burst.decide.topology import HeadShape
    from megatron_burst.decide.options import BurstOptions, resolve

    cases = [(8, 8, 2, None), (8, 2, 2, None), (4, 1, 4, None), (8, 4, 2, 4), (8, 8, 1, 2)]
    results = run_ranks(4, ulysses_bytes_worker, cases)
    for rank, per_rank in enumerate(results):
        for (hq, hkv, u, intra_node_size), got in zip(cases, per_rank):
            topology = resolve(BurstOptions(ulysses_size=u, intra_node_size=intra_node_size), cp=4,
                               heads=HeadShape(hq, hkv, 32, 2), tokens=16,
                               max_intra_node_size=None)
            assert got == topology.rank_bytes(rank, batch=2, s_local=8), (
                hq, hkv, u, intra_node_size)
