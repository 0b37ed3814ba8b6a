"""Packed documents: where every layout puts them, and sharding them there and back.

Pure functions (no processes): ``placement`` and ``shard_documents`` / ``unshard_documents``
are what every rank computes for every rank.
"""
from __future__ import annotations

import itertools
import random

import pytest
import torch

import megatron_burst as mb
from megatron_burst.attention.sharding import shard_documents, unshard_documents
from megatron_burst.plan.placement import local_length, placement

MIXES = [(4, 5), (1, 40, 1, 21, 1), (5, 37, 22), (64,), (3, 3, 3, 3, 3, 3, 3, 3, 8),
         (100, 2, 2, 2, 2), (17, 0, 15)]


def _lognormal_mix(total: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    lens = []
    while sum(lens) < total:
        lens.append(max(8, min(int(rng.lognormvariate(6.5, 1.0)), 4096)))
    lens[-1] -= sum(lens) - total
    return tuple(n for n in lens if n)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous", "whole_docs"])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("lens", MIXES, ids=str)
def test_every_rank_shards_and_the_shards_unshard(layout, world, lens):
    """Every rank gets the same number of rows (a document ending the pack that is not a
    multiple of 2G included: it once raised IndexError on some ranks only), and gathering
    them gives the packed sequence back."""
    total = sum(lens)
    if layout == "whole_docs" and total % world:
        with pytest.raises(ValueError, match="divisible"):
            local_length(layout, world, lens)
        return
    x = torch.arange(total, dtype=torch.float64)[None, :, None] + 1  # never 0: padding is
    shards = [shard_documents(x, lens, world, r, 1, layout) for r in range(world)]
    assert {s.shape[1] for s in shards} == {local_length(layout, world, lens)}
    back = unshard_documents(torch.stack(shards), lens, world, 1, layout)
    assert torch.equal(back, x)
    real = torch.cat([s[0, :, 0] for s in shards])
    assert sorted(real[real > 0].tolist()) == x[0, :, 0].tolist()  # each token once


@pytest.mark.parametrize("world", [2, 4, 8])
def test_whole_docs_keeps_short_documents_whole_and_balances_work(world):
    for seed in range(5):
        lens = _lognormal_mix(8192 * world, seed)
        shards = placement("whole_docs", world, lens)
        cap = sum(lens) // world
        assert all(sum(s.length for s in shard) == cap for shard in shards)
        ranks_of = {}
        for r, shard in enumerate(shards):
            for seg in shard:
                ranks_of.setdefault(seg.doc, set()).add(r)
        work = [0.0] * world
        share = sum(x * x for x in lens) / world
        cut = 0
        for doc, ranks in ranks_of.items():
            if lens[doc] <= cap and lens[doc] ** 2 <= share:  # short: whole on one rank...
                cut += len(ranks) > 1
            else:
                assert ranks == set(range(world)), "a long document is split over every rank"
        # ... except where the ranks' room ran out: the one document cut into pieces there.
        assert cut < world, f"{cut} short documents were cut"
        for r, shard in enumerate(shards):
            for seg in shard:
                work[r] += seg.length * (seg.pos + seg.length / 2)  # causal pairs it computes
        assert max(work) <= 1.3 * (sum(work) / world), work


def test_whole_docs_rows_other_ranks_need_come_first():
    lens = (300, 40, 50, 60, 30, 20, 12)  # 512: one long document, the rest short
    for shard in placement("whole_docs", 4, lens):
        split = [s.doc == 0 for s in shard]
        assert split == sorted(split, reverse=True), "the split document's rows lead"


@pytest.mark.parametrize("bad, match", [
    (torch.tensor([1, 5, 9], dtype=torch.int32), "start at 0"),
    (torch.tensor([0, 5, 3, 9], dtype=torch.int32), "never decrease"),
    (torch.tensor([0, 5, 8], dtype=torch.int32), "covers 8 tokens"),
    (torch.tensor([0.0, 9.0]), "int32/int64"),
    (torch.tensor([[0, 9]], dtype=torch.int32), "1-D"),
])
def test_bad_boundaries_are_refused(bad, match):
    x = torch.randn(1, 9, 2)
    with pytest.raises(ValueError, match=match):
        mb.shard_seq(x, cu_seqlens=bad, layout="whole_docs")


def test_a_plain_sequence_in_whole_docs_is_zigzag():
    x = torch.arange(64)[None]
    for world, rank in itertools.product([2, 4], range(2)):
        parts = placement("whole_docs", world, (64,))[rank]
        zig = placement("zigzag", world, (64,))[rank]
        assert [(s.pos, s.length) for s in parts] == [(s.pos, s.length) for s in zig]
    assert torch.equal(mb.shard_seq(x, layout="whole_docs"), x)  # one rank: everything
