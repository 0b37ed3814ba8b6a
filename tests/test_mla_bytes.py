"""The cost model knows V's head dim: what the ring sends with MLA shapes is what it counts.

MLA's K and V heads differ in size (DeepSeek-V3: Q/K 192, V 128), so the forward K/V hop is
hkv*(d + dv) elements per token, the ring backward's K/V and dK/dV likewise, and the burst
backward's Q, dO and dQ travel at d, dv and d. Each case runs ``burst_attn`` on gloo ranks
under ``count_comm`` and compares every rank's bytes with ``CPTopology.rank_bytes`` (exact,
from the schedule) and with the plain formulas (a bound). Attention sinks change no byte.
"""
from __future__ import annotations

import pytest
import torch

import megatron_burst as mb
from megatron_burst.decide import cost
from megatron_burst.decide.topology import CPTopology, HeadShape

from .distributed import run_ranks

B, S = 2, 8  # batch and local tokens per rank
D, DV = 24, 16  # Q/K and V head dims, unequal as in MLA (a small 192/128)
# (hq, hkv, backward, ulysses, ranks per node, window, sinks)
CASES = {
    2: [(4, 4, "burst", 1, None, (-1, -1), False), (4, 4, "ring", 1, None, (-1, -1), False),
        (8, 2, "burst", 1, None, (-1, -1), True), (8, 2, "ring", 1, None, (-1, -1), True)],
    4: [(4, 4, "burst", 1, None, (-1, -1), False), (4, 4, "ring", 1, None, (-1, -1), False),
        (4, 4, "burst", 1, None, (3, 0), True), (4, 4, "ring", 1, None, (3, 0), True),
        (8, 2, "burst", 1, 2, (-1, -1), False), (8, 2, "ring", 2, None, (-1, -1), True),
        (4, 4, "burst", 2, None, (-1, -1), True)],
}


def mla_bytes_worker(rank, world, cases):
    out = []
    for hq, hkv, backward, ulysses, intra_node_size, window, sinks in cases:
        gen = torch.Generator().manual_seed(rank)
        q = torch.randn(B, S, hq, D, generator=gen, dtype=torch.bfloat16)
        k = torch.randn(B, S, hkv, D, generator=gen, dtype=torch.bfloat16)
        v = torch.randn(B, S, hkv, DV, generator=gen, dtype=torch.bfloat16)
        leaves = [t.requires_grad_() for t in (q, k, v)]
        extra = {"sinks": torch.zeros(hq, requires_grad=True)} if sinks else {}
        with mb.count_comm() as stats:
            o = mb.burst_attn(*leaves, causal=True, backward=backward, ulysses_size=ulysses,
                              intra_node_size=intra_node_size, window_size=window, **extra)
            o.float().sum().backward()
        out.append((tuple(o.shape), stats.forward_bytes, stats.backward_bytes))
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_count_comm_matches_rank_bytes_with_mla_dims(world):
    cases = CASES[world]
    results = run_ranks(world, mla_bytes_worker, cases)
    for rank, per_rank in enumerate(results):
        for case, (shape, fwd, bwd) in zip(cases, per_rank):
            hq, hkv, backward, ulysses, intra_node_size, window, _ = case
            assert shape == (B, S, hq, DV), case  # the output has V's head dim
            topology = CPTopology.build(world, ulysses=ulysses, intra_node_size=intra_node_size,
                                        backward=backward,
                                        heads=HeadShape(hq, hkv, D, 2, v_head_dim=DV))
            assert (fwd, bwd) == topology.rank_bytes(rank, batch=B, s_local=S,
                                                     window=window), (rank, case)
            bound = topology.call_bytes(B * S)
            assert fwd <= bound[0] and bwd <= bound[1], (rank, case)
            # The same shape with V at Q's dim would be counted (and sent) larger.
            square = CPTopology.build(world, ulysses=ulysses, intra_node_size=intra_node_size,
                                      backward=backward, heads=HeadShape(hq, hkv, D, 2))
            if fwd + bwd:
                assert sum(square.rank_bytes(rank, batch=B, s_local=S, window=window)) > \
                    fwd + bwd, (rank, case)


def test_v_head_dim_left_out_is_qk_head_dim():
    """Left out, V's dim is Q/K's: the formulas and heads of one head dim, as before."""
    assert cost.forward_bytes(4, 1000, 16, 192, 2) == cost.forward_bytes(4, 1000, 16, 192, 2,
                                                                         v_head_dim=192)
    assert HeadShape(4, 2, 64) == HeadShape(4, 2, 64, 2, 64)
