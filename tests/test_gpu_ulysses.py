"""Ulysses over NCCL (skipped without two GPUs): the head all-to-alls against one GPU.

Q, K and V travel in one all-to-all (one message a peer), their gradients too, and the
output with its lse; so on 2 GPUs with ``ulysses_size=2`` (the ring of one): causal and full,
GQA 32:8 and MQA-like 32:1 (K/V replicated to the group's size), lse returned or not, bf16,
against PyTorch's SDPA on the whole sequence on one GPU (out, dq, dk, dv; lse finite).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import megatron_burst as mb

from .distributed import run_ranks

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def ulysses_worker(rank: int, world: int, cases) -> list[dict]:
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    rows = []
    for total, causal, hkv, lse_back in cases:
        gen = torch.Generator(device=dev).manual_seed(total + hkv)
        q, do = (torch.randn(1, total, 32, 128, device=dev, generator=gen, dtype=torch.bfloat16)
                 for _ in range(2))
        k, v = (torch.randn(1, total, hkv, 128, device=dev, generator=gen, dtype=torch.bfloat16)
                for _ in range(2))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves),
                                             is_causal=causal, enable_gqa=True).transpose(1, 2)
        ref.backward(do)
        local = [mb.shard_seq(t).requires_grad_() for t in (q, k, v)]
        got = mb.burst_attn(*local, causal=causal, ulysses_size=2, backward="ring",
                            return_lse=lse_back)
        out, lse = got if lse_back else (got, None)
        out.backward(mb.shard_seq(do))
        torch.cuda.synchronize()
        rows.append(dict(case=(total, causal, hkv, lse_back), err_out=rel(out, mb.shard_seq(ref)),
                         **{f"err_d{n}": rel(t.grad, mb.shard_seq(r.grad))
                            for n, t, r in zip("qkv", local, leaves)},
                         lse_finite=lse is None or bool(torch.isfinite(lse).all())))
    return rows


def test_ulysses_over_nccl_matches_one_gpu_sdpa():
    cases = [(16384, causal, hkv, lse_back) for causal in (True, False) for hkv in (8, 1)
             for lse_back in (False, True)]
    for rows in run_ranks(2, ulysses_worker, cases, backend="nccl", timeout=300):
        for r in rows:
            print(r)
            assert r["lse_finite"], r
            for key in ("err_out", "err_dq", "err_dk", "err_dv"):
                assert r[key] < 2e-2, r  # NaN fails too
