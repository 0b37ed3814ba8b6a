"""The time model's document term (``decide.pack_load``, issue 41): a pack's work from the
layout's own placement, bucketed so new packs share decisions; and Ulysses groups that span
nodes as candidates, priced on the inter-node link."""
from __future__ import annotations

import dataclasses

import pytest

from megatron_burst.decide.pack_load import PackLoad
from megatron_burst.decide.scheduled_time import predict_pack
from megatron_burst.decide.timing import Link, candidates, choose, predict
from megatron_burst.decide.topology import CPTopology, HeadShape

from .test_timing import FAST

HEADS = HeadShape(32, 8, 128, 2)


def test_a_pack_is_priced_from_its_own_pairs_at_the_varlen_rate():
    """Ulysses over the whole group: one member, every document, the heads split: its
    compute is exactly the pack's pairs at the varlen kernel's rate."""
    from megatron_burst.decide.timing import attention_flops, elementwise_seconds

    lens = (3277, 1802, 1229, 819, 492, 328, 164, 81)  # the benchmarks' mix of 8192 tokens
    pack = PackLoad.of_pack(lens, "whole_docs")
    ulysses = CPTopology.build(2, ulysses=2, backward="ring", heads=HEADS)
    got = predict_pack(ulysses, FAST, pack)
    rows, pairs = sum(lens), pack.pairs()
    rate = FAST.varlen.tflops(2 * pairs / rows) * 1e12
    want = attention_flops(pairs, HEADS.hq // 2, 128) / rate
    # (A document split between the two ranks' shards is two blocks of its rows in the
    # member's schedule, which the rate's keys-per-row reads as more rows: within 15%.)
    assert got.compute_s - elementwise_seconds(ulysses, FAST, 4096) == pytest.approx(
        want, rel=0.15)
    # Fewer pairs than one causal sequence of the same tokens, on the flat ring too.
    ring = CPTopology.build(2, ulysses=1, backward="ring", heads=HEADS)
    assert (predict_pack(ring, FAST, pack).compute_s
            < predict(ring, FAST, tokens=4096).compute_s)
    assert PackLoad.of_pack((0, 0), "whole_docs") is None


def test_documents_held_whole_send_nothing_and_a_split_one_waits_on_a_slow_link():
    """whole_docs keeps every document on one rank where it can: no later step needs
    another rank's keys, so no hop waits, however slow the link; a document split across
    the ranks needs its first half's keys on the other rank."""
    slow = dataclasses.replace(FAST, intra=Link(5.0, 0.01))
    ring = CPTopology.build(2, ulysses=1, backward="ring", heads=HEADS)
    whole = PackLoad.of_pack((4096, 4096), "whole_docs")
    split = PackLoad.of_pack((2048, 4096, 2048), "whole_docs")
    assert predict_pack(ring, slow, whole).exposed_comm_s == 0
    assert predict_pack(ring, slow, split).exposed_comm_s > 0.01


def test_a_document_decision_is_made_once_per_shape_from_its_first_pack():
    """Training feeds a new pack every micro-batch: 'auto' decides (and checks) once per
    shape, from the first pack's load; later packs do not even compute theirs."""
    from megatron_burst.decide.options import BurstOptions, decide

    made = []

    def load(lens):
        def make():
            made.append(lens)
            return PackLoad.of_pack(lens, "whole_docs")
        return make

    opts = BurstOptions(backward="auto", ulysses_size="auto")
    first = decide(opts, cp=2, heads=HEADS, tokens=4096, max_intra_node_size=None,
                   machine=FAST, pack=load((4000, 96, 4096)))
    later = decide(opts, cp=2, heads=HEADS, tokens=4096, max_intra_node_size=None,
                   machine=FAST, pack=load((10, 8000, 182)))
    assert made == [(4000, 96, 4096)] and later.key == first.key
    assert later.ranked == first.ranked
    plain = decide(opts, cp=2, heads=HEADS, tokens=4096, max_intra_node_size=None,
                   machine=FAST)
    assert plain.key != first.key  # one causal sequence: its own decision
    assert PackLoad.of_pack((0, 0), "whole_docs") is None


def test_a_ulysses_group_may_span_nodes_priced_on_the_inter_node_link():
    tops = candidates(2, HEADS, max_intra_node_size=1)
    assert any(t.ulysses == 2 for t in tops)
    slow = dataclasses.replace(FAST, inter=Link(5.0, 1.0))
    ulysses = CPTopology.build(2, ulysses=2, backward="ring", heads=HEADS)
    across = predict(ulysses, slow, tokens=8192, max_intra_node_size=1)
    inside = predict(ulysses, slow, tokens=8192)
    assert across.alltoall_s > 50 * inside.alltoall_s
    # On a slow inter-node link the ring, which hides its hops, still wins.
    assert choose(2, HEADS, tokens=8192, prof=slow, max_intra_node_size=1)[0].topology.ulysses == 1


def test_the_burst_backward_pays_its_delta_and_surrogate_passes():
    """The burst backward's own memory passes (``elementwise_seconds``): delta = rowsum(dO
    * O) in fp32 (28 bytes an element of Q) and each visiting step's surrogate O' (6 more);
    the ring backward's are the accumulators' alone, and one member has no visitors."""
    from megatron_burst.decide.timing import elementwise_seconds

    tokens, q_elems = 8192, 8192 * HEADS.hq * HEADS.head_dim
    for cp in (2, 4):
        ring, burst = (CPTopology.build(cp, ulysses=1, backward=b, heads=HEADS)
                       for b in ("ring", "burst"))
        extra = elementwise_seconds(burst, FAST, tokens) - elementwise_seconds(ring, FAST, tokens)
        assert extra == pytest.approx(q_elems * (28 + 6 * (cp - 1)) / (FAST.memory_gbps * 1e9))
        assert predict(burst, FAST, tokens=tokens).total_s > predict(ring, FAST,
                                                                     tokens=tokens).total_s
    alone = CPTopology.build(2, ulysses=2, backward="burst", heads=HEADS)
    same = CPTopology.build(2, ulysses=2, backward="ring", heads=HEADS)
    assert elementwise_seconds(alone, FAST, tokens) == elementwise_seconds(same, FAST, tokens)
