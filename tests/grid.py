"""The float64-reference grid that the gloo tests run: one case of ``burst_attn`` on a rank
(out, lse, dq, dk, dv against ``reference_attention``), a grid of cases in one group, and
their relative errors checked per case (printed per family of cases).

Errors are relative Frobenius norms over the whole sequence (summed across ranks).
"""
from __future__ import annotations

import itertools
import math

import torch

import megatron_burst as mb

from .distributed import run_ranks
from .reference import reference_attention

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}
NAMES = ("out", "lse", "dq", "dk", "dv")


def make_case_inputs(seed, b, seq, hq, hkv, d):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, seq, hq, d, generator=gen, dtype=torch.float64)
    k = torch.randn(b, seq, hkv, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, seq, hkv, d, generator=gen, dtype=torch.float64)
    dout = torch.randn(b, seq, hq, d, generator=gen, dtype=torch.float64)
    return q, k, v, dout


def run_case(rank, world, seed, *, layout, causal, hq, hkv, d, backward, dtype, fmt="bshd",
             chunk=8, b=2, group=None, window=(-1, -1), doc_lens=None, **extra):
    """One case on this rank: returns {name: (squared error, squared ref norm, NaN?)}.

    ``doc_lens`` packs documents into one sequence (batch 1) sharded per document;
    ``extra`` goes to burst_attn (intra_node_size, ulysses_size, kernel).
    """
    per_rank = 2 if layout == "zigzag" else 1
    cu = doc_ids = None
    if doc_lens is not None:
        b, seq = 1, sum(doc_lens)
        cu = torch.tensor([0, *itertools.accumulate(doc_lens)], dtype=torch.int32)
        doc_ids = torch.repeat_interleave(torch.arange(len(doc_lens)), torch.tensor(doc_lens))
    else:
        seq = chunk * per_rank * world
    q, k, v, dout = make_case_inputs(seed, b, seq, hq, hkv, d)
    scale = 1.0 / math.sqrt(d)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = reference_attention(*leaves, causal=causal, scale=scale, window=window,
                                           doc_ids=doc_ids)
    ref_out.backward(dout)
    refs = {"out": ref_out.detach(), "lse": ref_lse.detach().transpose(1, 2),
            "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad}

    def shard(t):
        return mb.shard_seq(t, group, layout=layout, seq_dim=1, cu_seqlens=cu)

    def local(t):  # this rank's shard, in the test dtype and the requested format
        x = shard(t).to(dtype)
        return x.transpose(0, 1).contiguous() if fmt == "sbhd" else x

    ql, kl, vl = (local(t).requires_grad_() for t in (q, k, v))
    out, lse = mb.burst_attn(ql, kl, vl, group, causal=causal, layout=layout,
                             backward=backward, qkv_format=fmt, return_lse=True,
                             window_size=window, cu_seqlens=cu, **extra)
    out.backward(local(dout))
    got = {"out": out, "lse": lse.transpose(1, 2), "dq": ql.grad, "dk": kl.grad, "dv": vl.grad}
    partial = {}
    for name in NAMES:
        x = got[name].detach().double()
        nan = bool(torch.isnan(x).any())
        if name == "lse":  # rows that see nothing (padding) carry -inf; the reference 0
            x = x.masked_fill(torch.isneginf(x), 0.0)
        if fmt == "sbhd" and name != "lse":
            x = x.transpose(0, 1)
        r = shard(refs[name].masked_fill(torch.isinf(refs[name]), 0.0))
        partial[name] = ((x - r).square().sum().item(), r.square().sum().item(), nan)
    return partial


def grid_worker(rank, world, cases):
    return [run_case(rank, world, i * 7919 + world, **case) for i, case in enumerate(cases)]


def reduce_errors(per_rank: list[list[dict]]) -> list[dict]:
    """Relative error per case and tensor from every rank's partial sums."""
    errors = []
    for parts in zip(*per_rank):
        err = {}
        for name in NAMES:
            num = sum(p[name][0] for p in parts)
            den = sum(p[name][1] for p in parts)
            nan = any(p[name][2] for p in parts)
            err[name] = float("nan") if nan else math.sqrt(num / max(den, 1e-300))
        errors.append(err)
    return errors


def check_grid(world, cases):
    errors = reduce_errors(run_ranks(world, grid_worker, cases))
    worst: dict[tuple, float] = {}
    failures = []
    for case, err in zip(cases, errors):
        tol = TOL[case["dtype"]]
        mask = "causal" if case["causal"] else "full"
        if case.get("window", (-1, -1)) != (-1, -1):
            mask += f"-window{case['window'][0]}+{case['window'][1]}"
        if case.get("doc_lens"):
            mask += "-docs"
        topo = ("double" if case.get("intra_node_size") else
                "ulysses" if case.get("ulysses_size", 1) > 1 else "flat")
        family = (str(case["dtype"]).split(".")[-1], mask, case["layout"], topo,
                  f"{case['hq']}:{case['hkv']}", case["backward"])
        for name, e in err.items():
            worst[family] = max(worst.get(family, 0.0), e) if not math.isnan(e) else e
            if not e <= tol:  # NaN fails too
                failures.append(f"{case} {name}: rel err {e:.3g} > {tol}")
    print(f"\nworld={world}: max relative error per family")
    for fam, e in sorted(worst.items()):
        print("  ", " ".join(fam), f"{e:.2e}")
    assert not failures, "\n".join(failures[:20])
