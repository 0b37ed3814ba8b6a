"""The time model's document term (``decide.pack_load``, issue 41): a pack's work from the
layout's own placement, bucketed so new packs share decisions; a slice mask's or a window's
the same way (``decide.loads``: decided per mask until masks follow the data); and Ulysses
groups that span nodes as candidates, priced on the inter-node link."""
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


def test_a_mask_or_a_window_is_priced_from_its_visible_pairs():
    """A slice mask (and a sliding window) changes the work as documents do: priced as the
    full sequence it is not, a window family came out 3.4x its measured time on 2x H100.
    Its compute follows its visible pairs (at the dense kernel's rate for the keys its rows
    see, so a little more a pair than full attention's), and a window given as
    ``window_size`` is priced like the same band given as a slice mask."""
    from megatron_burst.decide.timing import elementwise_seconds
    from megatron_burst.plan import mask_families as mf
    from megatron_burst.plan.schedule import Mask
    from megatron_burst.plan.slices import SliceMask as mb_slice_mask

    ring = CPTopology.build(2, ulysses=1, backward="ring", heads=HEADS)
    total = 16384
    floor = elementwise_seconds(ring, FAST, total // 2)
    full = predict(ring, FAST, tokens=total // 2, causal=False).compute_s - floor
    masks = {"window": mf.sliding_window(total, 1024),
             "causal window": mf.sliding_window_causal(total, 1024),
             "prefix-LM": mf.family("prefix_lm_causal", (total,), prefix=4096)}
    for name, mask in masks.items():
        got = predict_pack(ring, FAST, PackLoad.of_mask(mask, "area", total)).compute_s - floor
        share = mask.area / total ** 2
        assert share <= got / full <= 2 * share, name
    as_window = PackLoad.of_mask(Mask(True, (1024, 0)), "zigzag", total)
    assert as_window.pairs() == masks["causal window"].area
    assert predict_pack(ring, FAST, as_window).compute_s == pytest.approx(
        predict_pack(ring, FAST, PackLoad.of_mask(masks["causal window"], "area",
                                                  total)).compute_s, rel=0.1)
    assert PackLoad.of_mask(masks["window"], "area", 0) is None
    # One causal (or full) slice over the whole sequence is the plain call, priced as one.
    for kind, causal in (("causal", True), ("full", False)):
        whole = mb_slice_mask([(0, total)], [(0, total)], [kind])
        got = predict_pack(ring, FAST, PackLoad.of_mask(whole, "area", total))
        assert got == predict(ring, FAST, tokens=total // 2, causal=causal)
    part = mb_slice_mask([(0, total // 2)], [(0, total // 2)], ["causal"])
    assert PackLoad.of_mask(part, "area", total).plain is None
    assert PackLoad.of_mask(Mask(True, (-1, -1)), "zigzag", total).plain is True


@pytest.mark.parametrize("window, causal", [((5, 3), False), ((7, 0), True), ((-1, 4), False),
                                            ((3, -1), False)])
def test_a_windows_pairs_are_counted_exactly(window, causal):
    import numpy as np

    from megatron_burst.plan.schedule import Mask

    left, right = window

    def seen(n: int) -> int:
        diff = np.arange(n)[None, :] - np.arange(n)[:, None]
        ok = np.ones((n, n), bool)
        if left >= 0:
            ok &= diff >= -left
        if causal:
            ok &= diff <= 0
        elif right >= 0:
            ok &= diff <= right
        return int(ok.sum())

    lens = (37, 50, 1)
    assert PackLoad.of_pack(lens, "whole_docs", causal, window).pairs() == sum(map(seen, lens))
    assert PackLoad.of_mask(Mask(causal, window), "zigzag", 50).pairs() == seen(50)


def test_masks_are_decided_each_on_its_own_until_they_follow_the_data():
    """A model's layers with two fixed masks get a decision for each; masks that change every
    micro-batch (past ``WORKS_PER_SHAPE`` distinct ones for a call shape) share one key, and
    the first of them is the only one whose load is made."""
    from megatron_burst.decide import loads
    from megatron_burst.decide.options import BurstOptions, decide
    from megatron_burst.plan import mask_families as mf

    loads.clear()
    total, made = 16384, []

    def call(mask):
        def make():
            made.append(mask)
            return PackLoad.of_mask(mask, "area", total)
        return decide(BurstOptions(backward="auto", ulysses_size="auto"), cp=2, heads=HEADS,
                      tokens=total // 2, max_intra_node_size=None, causal=False,
                      machine=FAST, pack=make, work=mask)

    window, prefix = mf.sliding_window(total, 1024), mf.family("prefix_lm_causal", (total,),
                                                                 prefix=4096)
    a, b, again = call(window), call(prefix), call(window)
    assert a.key != b.key and again.key == a.key and made == [window, prefix]
    assert a.ranked[0].total_s < b.ranked[0].total_s  # each priced from its own pairs
    varying = [mf.sliding_window(total, w) for w in (128, 256, 512, 2048, 4096)]
    keys = [call(m).key for m in varying]
    own = loads.WORKS_PER_SHAPE - 2  # the slots the window and the prefix left
    assert len(set(keys[:own])) == own and len(set(keys[own:])) == 1  # the rest share one
    assert keys[own] not in keys[:own]
    assert made == [window, prefix, *varying[:own + 1]]  # ... and its first mask's load
    plain = decide(BurstOptions(backward="auto", ulysses_size="auto"), cp=2, heads=HEADS,
                   tokens=total // 2, max_intra_node_size=None, causal=False, machine=FAST)
    assert plain.key not in {*keys, a.key, b.key}


def test_the_work_of_a_call_is_its_pack_its_mask_or_its_window():
    """``prepare._work``: what 'auto' keys a call by and the load it prices."""
    import types

    import torch

    from megatron_burst.attention.prepare import _work
    from megatron_burst.plan import mask_families as mf
    from megatron_burst.plan.schedule import Mask

    q = torch.zeros(2, 512, 4, 8)  # bshd: batch 2, 512 tokens a rank
    base = dict(device_docs=False, cu_seqlens=None, qkv_format="bshd", mask=None,
                window_size=(-1, -1), causal=True, layout="zigzag")
    call = lambda **kw: types.SimpleNamespace(**{**base, **kw})  # noqa: E731
    assert _work(call(), 2, q) == (None, None)  # plain causal: timing.predict
    work, load = _work(call(window_size=(128, 0)), 2, q)
    assert work == Mask(True, (128, 0))
    assert load() == PackLoad.of_mask(Mask(True, (128, 0)), "zigzag", 1024, batch=2)
    mask = mf.sliding_window(1024, 64)
    work, load = _work(call(mask=mask, causal=False, layout="area"), 2, q)
    assert work == mask and load().mask == mask and load().lens == (1024,)
    pack = types.SimpleNamespace(lens=(300, 724))
    work, load = _work(call(cu_seqlens=pack, layout="whole_docs"), 2, q[:1])
    assert work == ("documents", (-1, -1))
    assert load() == PackLoad.of_pack((300, 724), "whole_docs")
    # The same packs under a window (a model's windowed layers): another work, its own load.
    work, load = _work(call(cu_seqlens=pack, layout="whole_docs", window_size=(128, 0)), 2,
                       q[:1])
    assert work == ("documents", (128, 0))
    assert load() == PackLoad.of_pack((300, 724), "whole_docs", True, (128, 0))
    assert _work(call(cu_seqlens=pack, device_docs=True), 2, q[:1]) == (None, None)
