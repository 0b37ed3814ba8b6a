"""A float64, single-process, O(N^2) attention: the ground truth every test compares with.

It supports every mask the package does (causal, sliding window, documents, slice masks)
by building the full boolean mask from positions, independently of the package's schedules
(a slice mask from its slices' definitions, never from the package's cells).
"""
from __future__ import annotations

import torch


def allowed_mask(seq_len: int, *, causal: bool, window=(-1, -1), doc_ids=None) -> torch.Tensor:
    """[S, S] bool: query i may see key j. ``doc_ids`` [S] (-1 = padding: sees nothing)."""
    i = torch.arange(seq_len)[:, None]
    j = torch.arange(seq_len)[None, :]
    ok = torch.ones(seq_len, seq_len, dtype=torch.bool)
    if causal:
        ok &= j <= i
    if window[0] >= 0:
        ok &= j >= i - window[0]
    if window[1] >= 0:
        ok &= j <= i + window[1]
    if doc_ids is not None:
        ok &= (doc_ids[:, None] == doc_ids[None, :]) & (doc_ids[:, None] >= 0)
    return ok


def slice_allowed(seq_len: int, q_ranges, k_ranges, kinds) -> torch.Tensor:
    """[S, S] bool of a slice mask: query q sees key k if some slice shows the pair. Within a
    slice of qlen x klen, i = q - q_start, j = k - k_start: full sees all, causal
    j <= i + (klen - qlen), inv_causal j >= i, bi_causal both."""
    q = torch.arange(seq_len)[:, None]
    k = torch.arange(seq_len)[None, :]
    ok = torch.zeros(seq_len, seq_len, dtype=torch.bool)
    for (qs, qe), (ks, ke), kind in zip(q_ranges, k_ranges, kinds):
        i, j = q - qs, k - ks
        show = (i >= 0) & (i < qe - qs) & (j >= 0) & (j < ke - ks)
        if kind in ("causal", "bi_causal"):
            show &= j <= i + ((ke - ks) - (qe - qs))
        if kind in ("inv_causal", "bi_causal"):
            show &= j >= i
        ok |= show
    return ok


def reference_attention(q, k, v, *, causal: bool, scale: float, window=(-1, -1),
                        doc_ids=None, sinks=None, allowed=None):
    """q [b, S, hq, d], k [b, S, hkv, d], v [b, S, hkv, dv] -> (out [b, S, hq, dv],
    lse [b, hq, S]). ``sinks`` [hq]: one more column of every row's scores, the head's sink
    logit, whose value is zero (gpt-oss's attention sinks). ``allowed`` [S, S] bool: the
    mask itself (``slice_allowed``), instead of causal/window/doc_ids."""
    hq, hkv = q.shape[2], k.shape[2]
    k = k.repeat_interleave(hq // hkv, dim=2)
    v = v.repeat_interleave(hq // hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    ok = allowed if allowed is not None else allowed_mask(q.shape[1], causal=causal,
                                                           window=window, doc_ids=doc_ids)
    s = s.to(q.dtype).masked_fill(~ok.to(s.device), float("-inf"))
    if sinks is not None:  # the sink column: a logit per head, in every row
        s = torch.cat([s, sinks.to(s.dtype)[None, :, None, None].expand(*s.shape[:3], 1)], -1)
    lse = torch.logsumexp(s, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - safe.unsqueeze(-1))
    if sinks is not None:
        p = p[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse
