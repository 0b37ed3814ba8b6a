"""Masks and topologies against the float64 reference: windows, documents, double ring,
Ulysses hybrid; byte counts for skipped window steps; their bad-input errors.

Four gloo ranks run as a flat ring, a double ring of 2 "nodes" x 2, and Ulysses 2 x
ring 2. Windows cover one smaller than a chunk and one larger than G chunks; documents
cover one shorter than 2G tokens and one spanning every rank.
"""
from __future__ import annotations

import itertools

import pytest
import torch

import megatron_burst as mb
from megatron_burst.decide import cost

from .distributed import run_ranks
from .grid import check_grid

TOPOLOGIES = {"flat": {}, "double2x2": {"intra_node_size": 2}, "ulysses2": {"ulysses_size": 2}}
# chunk = 8 tokens, so with 4 ranks: zigzag has 8 chunks (64 tokens), contiguous 4 (32).
MASKS = {
    "full": dict(causal=False),
    "causal": dict(causal=True),
    "causal-window3": dict(causal=True, window=(3, 0)),       # window < one chunk
    "window5+2": dict(causal=False, window=(5, 2)),
    "causal-window40": dict(causal=True, window=(40, 0)),     # window > G chunks
    "window20+20": dict(causal=False, window=(20, 20)),
    "doc-causal": dict(causal=True, doc_lens=(5, 37, 22)),     # 5 < 2G; 37 spans all ranks
    "doc-full": dict(causal=False, doc_lens=(13, 3, 32)),
    "doc-causal-window": dict(causal=True, window=(6, 0), doc_lens=(5, 37, 22)),
    # Documents of one token, one longer than a rank's shard, a pack ending in a 1-token one.
    "doc-tiny": dict(causal=True, doc_lens=(1, 40, 1, 21, 1)),
}


def mask_grid(topologies):
    cases = []
    for topo, mask, layout, backward in itertools.product(
            topologies, MASKS, ["zigzag", "contiguous", "whole_docs"], ["burst", "ring"]):
        if layout == "whole_docs" and "doc_lens" not in MASKS[mask] and mask != "causal":
            continue  # whole_docs places a plain sequence as zigzag: causal covers it
        heads = (8, 2) if backward == "ring" else (4, 4)
        cases.append(dict(layout=layout, hq=heads[0], hkv=heads[1], d=32, backward=backward,
                          dtype=torch.float32, **MASKS[mask], **TOPOLOGIES[topo]))
    # bf16 and MQA (fewer K/V heads than Ulysses slots: replicated) on a few cases.
    for topo in topologies:
        for mask, layout in (("causal", "zigzag"), ("doc-causal", "zigzag"),
                             ("causal-window3", "zigzag"), ("doc-tiny", "whole_docs")):
            cases.append(dict(layout=layout, hq=4, hkv=1, d=64, backward="auto",
                              dtype=torch.bfloat16, **MASKS[mask], **TOPOLOGIES[topo]))
    return cases


@pytest.mark.parametrize("topology", list(TOPOLOGIES))
def test_masks_match_float64_reference(topology):
    check_grid(4, mask_grid([topology]))


def ring_equivalence_worker(rank, world, intra):
    """The double ring gives the flat ring's numbers (same math, another visiting order)."""
    diffs = []
    for causal, backward in itertools.product([True, False], ["burst", "ring"]):
        gen = torch.Generator().manual_seed(11)
        q, k, v, do = (torch.randn(2, 16, 4, 32, generator=gen) for _ in range(4))
        results = []
        for topo in (None, intra):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = mb.burst_attn(*leaves, causal=causal, backward=backward,
                                intra_node_size=topo)
            out.backward(do)
            results.append([out.detach()] + [t.grad for t in leaves])
        diffs.append(max(((a - b).norm() / b.norm()).item() for a, b in zip(*results)))
    return max(diffs)


@pytest.mark.parametrize("world,intra", [(4, 2), (8, 4)])
def test_double_ring_equals_flat_ring(world, intra):
    for diff in run_ranks(world, ring_equivalence_worker, intra):
        assert diff < 1e-6


def window_bytes_worker(rank, world):
    q = torch.randn(1, 8, 4, 16, requires_grad=True)
    with mb.count_comm() as narrow:  # keys within 3 tokens: only the left neighbour's
        mb.burst_attn(q, q, q, causal=True, window_size=(3, 0), layout="contiguous",
                      backward="ring").sum().backward()
    with mb.count_comm() as local:  # window 0: every rank only attends to itself
        mb.burst_attn(q, q, q, causal=True, window_size=(0, 0), layout="contiguous",
                      backward="burst").sum().backward()
    return (narrow.forward_bytes, narrow.backward_bytes, local.forward_bytes,
            local.backward_bytes)


def test_skipped_window_steps_send_nothing():
    from megatron_burst.decide.topology import CPTopology, HeadShape

    tokens, h, d = 8, 4, 16
    topology = CPTopology.build(4, backward="ring", heads=HeadShape(h, h, d, 4))
    results = run_ranks(4, window_bytes_worker)
    for rank, (fwd, bwd, fwd0, bwd0) in enumerate(results):
        assert (fwd, bwd) == topology.rank_bytes(rank, batch=1, s_local=tokens,
                                                 layout="contiguous", window=(3, 0))
        assert (fwd0, bwd0) == (0, 0)
    # One hop for each rank's K/V to its right neighbour (none from the last rank), and one
    # dK/dV accumulator home for each: 3 hops in all, instead of 3 per rank; each carries
    # the 3 rows the window reads, the end of the sender's shard, not all 8.
    assert sum(r[0] for r in results) == cost.forward_bytes(4, 3, h, d, 4, hops=3)
    assert sum(r[1] for r in results) == cost.backward_bytes("ring", 4, 3, h, h, d, 4, hops=3)


BAD = {
    "window_size": lambda q, cu: mb.burst_attn(q, q, q, window_size=(-2, 0)),
    "window_size ": lambda q, cu: mb.burst_attn(q, q, q, window_size=(1, 2, 3)),
    "ulysses_size": lambda q, cu: mb.burst_attn(q[:, :, :3], q[:, :, :1], q[:, :, :1],
                                                ulysses_size=2),
    "ulysses_size  ": lambda q, cu: mb.burst_attn(q, q, q, ulysses_size=3),
    "intra_node_size": lambda q, cu: mb.burst_attn(q, q, q, intra_node_size=3),
    "cu_seqlens": lambda q, cu: mb.burst_attn(q, q, q, cu_seqlens=cu),
    "cu_seqlens ": lambda q, cu: mb.burst_attn(q, q, q, cu_seqlens=cu.flip(0)),
    "cu_seqlens  ": lambda q, cu: mb.burst_attn(q.expand(2, -1, -1, -1), q.expand(2, -1, -1, -1),
                                                q.expand(2, -1, -1, -1), cu_seqlens=cu),
}


def bad_worker(rank, world):
    q = torch.randn(1, 8, 4, 16)
    cu = torch.tensor([0, 5, 40], dtype=torch.int32)  # needs 48/4 = 12 local tokens, not 8
    seen = {}
    for key, call in BAD.items():
        try:
            call(q, cu)
            seen[key] = "no error"
        except ValueError as e:
            seen[key] = str(e)
    mb.burst_attn(q, q, q, causal=True)  # the group still works afterwards
    return seen


def test_bad_masks_raise_on_every_rank():
    for seen in run_ranks(4, bad_worker, timeout=120):
        for key, msg in seen.items():
            assert key.strip() in msg, f"{key!r}: {msg}"
