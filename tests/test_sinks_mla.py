"""Attention sinks and MLA head dims through every way the ring runs, against float64.

The reference is plain attention with an explicit sink column per head (``reference.py``)
and V heads of their own dim. Every case compares out, lse and every gradient, the sinks'
included (summed over the ranks: each rank's covers its own rows, as Megatron's gradient
reduction over the CP group expects), at world 1-4: zigzag, contiguous and packed
documents (whole_docs, and pack_zigzag's read on the device), both backwards, causal, full and windowed masks, GQA and MHA,
Ulysses and the double ring, and a loss that reads lse as well as the output.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

import megatron_burst as mb

from .distributed import run_ranks
from .reference import reference_attention

TOL = 1e-10
D, DV_MLA = 12, 8  # Q/K 12 dims, V 8: MLA's 192/128 shape, small


def _case_inputs(seed: int, s: int, hq: int, hkv: int, dv: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, s, hq, D, generator=gen, dtype=torch.float64)
    k = torch.randn(1, s, hkv, D, generator=gen, dtype=torch.float64)
    v = torch.randn(1, s, hkv, dv, generator=gen, dtype=torch.float64)
    sinks = torch.randn(hq, generator=gen, dtype=torch.float64)
    w_out = torch.randn(1, s, hq, dv, generator=gen, dtype=torch.float64)
    w_lse = torch.randn(1, hq, s, generator=gen, dtype=torch.float64)
    return q, k, v, sinks, w_out, w_lse


def run_case(rank: int, world: int, seed: int, *, layout="zigzag", causal=True,
             window=(-1, -1), backward="burst", hq=4, hkv=2, dv=D, sinks=True, lse_loss=False,
             docs=None, **extra) -> dict:
    """One case on this rank: {name: (squared error, squared norm)} to sum over ranks."""
    s = sum(docs) if docs else 4 * world
    q, k, v, sk, w_out, w_lse = _case_inputs(seed, s, hq, hkv, dv)
    cu = None if docs is None else torch.tensor([0, *itertools.accumulate(docs)])
    ids = None if docs is None else torch.repeat_interleave(torch.arange(len(docs)),
                                                            torch.tensor(docs))
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sk)]
    ref_out, ref_lse = reference_attention(*leaves[:3], causal=causal, scale=D ** -0.5,
                                           window=window, doc_ids=ids,
                                           sinks=leaves[3] if sinks else None)
    ((ref_out * w_out).sum() + ((ref_lse * w_lse).sum() if lse_loss else 0)).backward()
    shard = lambda t, dim=1: mb.shard_seq(t, layout=layout, seq_dim=dim, cu_seqlens=cu)  # noqa
    local = [shard(t).requires_grad_() for t in (q, k, v)]
    local_sinks = sk.clone().requires_grad_() if sinks else None
    out, lse = mb.burst_attn(*local, causal=causal, window_size=window, layout=layout,
                             backward=backward, cu_seqlens=cu, return_lse=True,
                             sinks=local_sinks, **extra)
    loss = (out * shard(w_out)).sum()
    if lse_loss:
        loss = loss + (lse * shard(w_lse, 2)).sum()
    loss.backward()
    got = {"out": out, "lse": lse, "dq": local[0].grad, "dk": local[1].grad,
           "dv": local[2].grad}
    want = {"out": shard(ref_out), "lse": shard(ref_lse, 2), "dq": shard(leaves[0].grad),
            "dk": shard(leaves[1].grad), "dv": shard(leaves[2].grad)}
    parts = {}
    for name, g in got.items():
        g, w = g.detach(), want[name].detach()
        if name == "lse":  # padding rows: -inf (no sink) or the sink's lse; not compared
            keep = torch.isfinite(w) & torch.isfinite(g)
            g, w = g[keep], w[keep]
        parts[name] = (float((g - w).square().sum()), float(w.square().sum()),
                       bool(torch.isnan(g).any()))
    if sinks:  # each rank's sink gradient covers its rows: the sum is the whole gradient
        parts["dsinks"] = local_sinks.grad.tolist(), leaves[3].grad.tolist()
    return parts


def grid_worker(rank: int, world: int, cases: list[dict]) -> list[dict]:
    return [run_case(rank, world, 31 * i + world, **c) for i, c in enumerate(cases)]


def _check(world: int, cases: list[dict]) -> None:
    results = run_ranks(world, grid_worker, cases, timeout=600) if world > 1 else \
        [grid_worker(0, 1, cases)]
    failures = []
    for i, case in enumerate(cases):
        per_rank = [r[i] for r in results]
        for name in ("out", "lse", "dq", "dk", "dv"):
            num = sum(p[name][0] for p in per_rank)
            den = sum(p[name][1] for p in per_rank)
            err = float("nan") if any(p[name][2] for p in per_rank) else math.sqrt(
                num / max(den, 1e-300))
            if not err <= TOL:
                failures.append(f"{case} {name}: {err:.3g}")
        if case.get("sinks", True):
            total = sum(torch.tensor(p["dsinks"][0], dtype=torch.float64) for p in per_rank)
            ref = torch.tensor(per_rank[0]["dsinks"][1], dtype=torch.float64)
            err = float((total - ref).norm() / ref.norm())
            if not err <= TOL:
                failures.append(f"{case} dsinks: {err:.3g}")
    assert not failures, "\n".join(failures)


def grid(world: int) -> list[dict]:
    layouts = ["contiguous"] if world == 3 else ["zigzag", "contiguous"]
    cases = []
    for layout, backward, (hq, hkv), dv in itertools.product(
            layouts, ("burst", "ring"), ((4, 4), (4, 1)), (D, DV_MLA)):
        cases.append(dict(layout=layout, backward=backward, hq=hq, hkv=hkv, dv=dv))
    # Masks, sinks off, a loss on lse, documents: over the flat ring.
    cases += [dict(causal=False, dv=DV_MLA), dict(window=(3, 0), backward="ring"),
              dict(window=(2, 3), causal=False, dv=DV_MLA), dict(sinks=False, dv=DV_MLA),
              dict(lse_loss=True), dict(lse_loss=True, backward="ring", dv=DV_MLA),
              dict(layout="whole_docs", docs=_docs(world), dv=DV_MLA),
              dict(layout="whole_docs", docs=_docs(world), window=(2, 0), lse_loss=True)]
    if world != 3:  # documents the GPU reads (their sum, a multiple of 2 x world)
        cases += [dict(layout="pack_zigzag", docs=_docs(world), dv=DV_MLA),
                  dict(layout="pack_zigzag", docs=_docs(world), lse_loss=True, backward="ring",
                       causal=False)]
    if world in (2, 4):  # Ulysses: each rank merges the sinks of its head slice
        cases += [dict(ulysses_size=2, dv=DV_MLA), dict(ulysses_size=2, hkv=1, lse_loss=True)]
    if world == 4:
        cases += [dict(intra_node_size=2, dv=DV_MLA, backward="ring"),
                  dict(ulysses_size=2, intra_node_size=4)]
    return cases


def _docs(world: int) -> tuple[int, ...]:
    return {1: (3, 1, 4), 2: (5, 0, 2, 9), 3: (7, 2, 3, 3, 6), 4: (13, 1, 2, 7, 1, 8)}[world]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_sinks_and_mla_match_float64(world: int) -> None:
    _check(world, grid(world))


def test_sinks_are_validated_before_any_communication() -> None:
    q, k, v = (torch.randn(1, 8, h, 8) for h in (4, 2, 2))
    with pytest.raises(ValueError, match=r"sinks must have shape \[hq\] = \[4\]"):
        mb.burst_attn(q, k, v, sinks=torch.zeros(2))
    with pytest.raises(ValueError, match="sinks must be a floating-point tensor"):
        mb.burst_attn(q, k, v, sinks=torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="k and v must have the same shape but for V's"):
        mb.burst_attn(q, k, torch.randn(1, 8, 3, 8))


def test_off_by_one_is_a_zero_sink_and_a_row_without_keys_is_zero() -> None:
    """Softmax off by one (Megatron's 'off-by-one') is sinks of zero; a padding row (no
    key visible) gives a zero output and the sink's lse, never NaN."""
    q, k, v = (torch.randn(1, 6, 2, 4, dtype=torch.float64) for _ in range(3))
    zero = torch.zeros(2, dtype=torch.float64)
    out, lse = mb.burst_attn(q, k, v, causal=True, sinks=zero, return_lse=True)
    ref, ref_lse = reference_attention(q, k, v, causal=True, scale=0.5, sinks=zero)
    assert torch.allclose(out, ref) and torch.allclose(lse, ref_lse)
    # Zigzag pads each document to an even length: documents of 3 and 3 tokens take 8 rows,
    # two of them padding that see nothing.
    q, k, v = (torch.randn(1, 8, 2, 4, dtype=torch.float64) for _ in range(3))
    out, lse = mb.burst_attn(q, k, v, causal=True, layout="zigzag", return_lse=True,
                             cu_seqlens=torch.tensor([0, 3, 6]), sinks=zero)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert out[0, 3].abs().max() == 0 and out[0, 7].abs().max() == 0  # the padding rows
    assert torch.equal(lse[0, :, 3], zero) and torch.equal(lse[0, :, 7], zero)
