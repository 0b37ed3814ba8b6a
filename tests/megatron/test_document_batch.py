"""The document batch: boundaries from EOD, positions restarted per document, and the
shards every CP rank keeps. Pure functions: the CP rank is faked, no processes start."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron_burst.attention import sharding as mb_sharding  # noqa: E402
from megatron_burst.megatron.documents import (DocumentParams, document_boundaries,
                                               document_params, document_positions,
                                               shard_document_batch)
from megatron_burst.plan.placement import rank_segments  # noqa: E402

EOD = 99


def _pack(lens: tuple, eod_last: bool) -> torch.Tensor:
    """Tokens 0.. in order, EOD closing each document (the last one only if eod_last)."""
    tokens = torch.arange(sum(lens))
    ends = torch.tensor(lens).cumsum(0) - 1
    tokens[ends if eod_last else ends[:-1]] = EOD
    return tokens


@pytest.mark.parametrize("lens, eod_last", [
    ((5, 40, 11, 8), False), ((5, 40, 11, 8), True), ((64,), False), ((1, 1, 30, 32), True),
])
def test_boundaries_and_positions_follow_the_eod_tokens(lens, eod_last):
    cu = document_boundaries(_pack(lens, eod_last), EOD)
    assert cu.dtype == torch.int32 and cu.device.type == "cpu"
    assert cu.tolist() == [0, *torch.tensor(lens).cumsum(0).tolist()]
    assert document_positions(cu).tolist() == [p for n in lens for p in range(n)]


def test_a_document_ends_after_each_eod_even_a_repeated_one():
    tokens = torch.tensor([3, EOD, 4, 5, EOD, EOD, 6])
    assert document_boundaries(tokens, EOD).tolist() == [0, 2, 5, 6, 7]


@pytest.mark.parametrize("layout", ["whole_docs", "zigzag"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_tensor_is_sharded_with_the_attention_layout(monkeypatch, layout, world):
    lens = (5, 40, 11, 8)
    tokens = _pack(lens, eod_last=False)[None]
    data = {"tokens": tokens, "labels": tokens + 1000, "loss_mask": (tokens != EOD).float()}
    starts = [0, 5, 45, 56]
    seen = []
    for rank in range(world):
        monkeypatch.setattr(mb_sharding, "group_size_rank", lambda group, r=rank: (world, r))
        local, params = shard_document_batch(data, EOD, None, layout)
        assert isinstance(params, DocumentParams) and params.layout == layout
        assert params.cu_seqlens_q.tolist() == starts + [64]  # the whole pack, every rank
        assert params.max_seqlen_q == params.max_seqlen_kv == 64
        for seg in rank_segments(layout, world, rank, lens):
            rows = slice(seg.row, seg.row + seg.valid)
            where = torch.arange(seg.valid) + starts[seg.doc] + seg.pos
            assert torch.equal(local["tokens"][0, rows], tokens[0, where])
            assert torch.equal(local["labels"][0, rows], tokens[0, where] + 1000)
            assert torch.equal(local["loss_mask"][0, rows], data["loss_mask"][0, where])
            assert torch.equal(local["position_ids"][0, rows], torch.arange(seg.valid) + seg.pos)
            pad = slice(seg.row + seg.valid, seg.row + seg.length)  # zigzag pads to 2*world
            assert not local["loss_mask"][0, pad].any()
            seen += where.tolist()
    assert sorted(seen) == list(range(64))  # every token on exactly one rank


def test_the_eod_loss_mask_is_kept():
    tokens = _pack((5, 11), eod_last=True)[None]
    mask = (tokens != EOD).float()
    local, _ = shard_document_batch({"tokens": tokens, "labels": tokens, "loss_mask": mask},
                                    EOD, None)
    assert torch.equal(local["loss_mask"], mask)


def test_more_than_one_sequence_per_micro_batch_is_refused():
    tokens = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="--micro-batch-size 1"):
        shard_document_batch({"tokens": tokens, "labels": tokens, "loss_mask": tokens}, EOD,
                             None)


@pytest.mark.parametrize("change, match", [
    (dict(qkv_format="thd"), "qkv_format must be 'sbhd'"),
    (dict(layout="diagonal"), "layout must be one of"),
    (dict(cu_seqlens_q_padded=torch.tensor([0, 8])), "cu_seqlens_q_padded must be None"),
    (dict(cu_seqlens_kv=torch.tensor([0, 4, 8])), "cu_seqlens_kv == cu_seqlens_q"),
    (dict(cu_seqlens_q=None), "cu_seqlens_q must be a 1-D tensor"),
])
def test_document_params_refuse_what_the_adapter_cannot_honour(change, match):
    fields = dict(cu_seqlens_q=torch.tensor([0, 3, 8], dtype=torch.int32), layout="whole_docs")
    with pytest.raises(ValueError, match=match):
        DocumentParams(**{**fields, **change})


def test_document_params_of_boundaries():
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    params = document_params(cu, "zigzag")
    assert (params.qkv_format, params.layout, params.max_seqlen_q) == ("sbhd", "zigzag", 8)
    assert params.cu_seqlens_kv is cu
