"""Megatron's local CUDA graphs warm each layer up on zeros in every input's place, the
document boundaries included (on 2x H100 the graphed pack_zigzag runs stopped there: the
device check reported the zeros). While Megatron warms up, zero boundaries stand for one
document; at any other time they are still refused."""
from __future__ import annotations

import pytest
import torch

cuda_graphs = pytest.importorskip("megatron.core.transformer.cuda_graphs")

import megatron_burst as mb  # noqa: E402
from megatron_burst.megatron import masks  # noqa: E402
from megatron_burst.megatron.documents import document_params  # noqa: E402


@pytest.fixture
def warmup(monkeypatch):
    monkeypatch.setattr(cuda_graphs, "_IS_GRAPH_WARMUP", True)


def _zeros_as_megatron_makes_them(tokens: int) -> masks.Documents:
    """The params as the graph runner warms a layer up on them: ArgMetadata, then zeros."""
    params = document_params(torch.tensor([0, 5, tokens], dtype=torch.int32), "pack_zigzag", 8)
    meta = cuda_graphs.tree_map(
        lambda x: cuda_graphs.ArgMetadata(x) if torch.is_tensor(x) else x, params)
    zeros = cuda_graphs.tree_map(
        lambda x: x.zeros_like() if isinstance(x, cuda_graphs.ArgMetadata) else x, meta)
    assert not zeros.cu_seqlens_q.any() and zeros.cu_seqlens_q.shape == (9,)
    return masks.documents_of(zeros, True, None)


def _qkv(tokens: int):
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(1, tokens, 2, 8, dtype=torch.float64, generator=gen) for _ in range(3)]


def test_zero_boundaries_in_a_warmup_stand_for_one_document(warmup):
    tokens = 24
    cu = masks.boundaries_of(_zeros_as_megatron_makes_them(tokens), tokens)
    assert cu.tolist() == [0] + [tokens] * 8
    q, k, v = _qkv(tokens)
    out = mb.burst_attn(q, k, v, causal=True, layout="pack_zigzag", cu_seqlens=cu)
    want = mb.burst_attn(q, k, v, causal=True)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_real_boundaries_in_a_warmup_are_left_as_they_are(warmup):
    cu = torch.tensor([0, 5, 24, 24], dtype=torch.int32)
    docs = masks.Documents(cu, "pack_zigzag", "sbhd")
    assert masks.boundaries_of(docs, 24) is cu
    assert masks.boundaries_of(None, 24) is None


def test_zero_boundaries_outside_a_warmup_are_refused():
    tokens = 24
    docs = _zeros_as_megatron_makes_them(tokens)
    cu = masks.boundaries_of(docs, tokens)
    assert not cu.any()
    q, k, v = _qkv(tokens)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0, never decrease and end"):
        mb.burst_attn(q, k, v, causal=True, layout="pack_zigzag", cu_seqlens=cu)
