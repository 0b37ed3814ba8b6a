"""Layout ``pack_zigzag`` on GPUs (skipped without CUDA): documents the GPU reads, in bf16.

Over NCCL on every GPU of the machine: a new pack every call (uniform, tiny, one long
document, boundaries padded with empty documents), causal and full per document, both
backwards, GQA 32:8 d 128, against one GPU's flash kernel run document by document (an
independent path: no ring, no schedule, no boundary table). Then the point of the layout:
the call captured once in a CUDA graph and replayed on new packs gives the eager call's
output and gradients.
"""
from __future__ import annotations

import os

import random

import pytest
import torch

import megatron_burst as mb
from megatron_burst import kernels
from megatron_burst.plan.schedule import Block

from .distributed import run_ranks
from .test_gpu import NGPU, rel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def pack(total: int, low: int, high: int, seed: int, long: int = 0) -> tuple[int, ...]:
    rng = random.Random(seed)
    lens = [long] if long else []
    while sum(lens) < total:
        lens.append(rng.randint(low, high))
    lens[-1] -= sum(lens) - total
    rng.shuffle(lens)
    return tuple(n for n in lens if n)


def boundaries(lens, count: int, device) -> torch.Tensor:
    """cu_seqlens padded to ``count`` entries with empty documents, on ``device``."""
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return torch.cat((cu, cu[-1:].expand(count - len(cu)))).to(device)


def per_document(q, k, v, do, lens, causal: bool):
    """One GPU's flash kernel, one call per document: (out, [dq, dk, dv])."""
    kern, scale = kernels.TorchFlashAttention(), q.shape[-1] ** -0.5
    outs, grads = [], [torch.zeros_like(t) for t in (q, k, v)]
    a = 0
    for n in lens:
        sl = (slice(None), slice(a, a + n))
        blk = Block(0, n, 0, n, "causal" if causal else "full")
        out, lse = kern.forward(q[sl], k[sl], v[sl], blk, scale)
        for g, x in zip(grads, kern.backward(do[sl], q[sl], k[sl], v[sl], out, lse, blk,
                                             scale)):
            g[sl] = x
        outs.append(out)
        a += n
    return torch.cat(outs, dim=1), grads


def fresh_worker(rank, world, cases):
    dev = torch.device("cuda", rank)
    rows = []
    for name, lens, causal, backward in cases:
        total = sum(lens)
        gen = torch.Generator(device=dev).manual_seed(total + len(lens))
        q, do = (torch.randn(1, total, 32, 128, device=dev, generator=gen,
                             dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(1, total, 8, 128, device=dev, generator=gen, dtype=torch.bfloat16)
                for _ in range(2))
        ref, ref_grads = per_document(q, k, v, do, lens, causal)
        shard = lambda t: mb.shard_seq(t, layout="pack_zigzag")  # noqa: E731
        local = [shard(t).requires_grad_() for t in (q, k, v)]
        out, lse = mb.burst_attn(*local, causal=causal, layout="pack_zigzag",
                                 cu_seqlens=boundaries(lens, len(lens) + 9, dev),
                                 backward=backward, return_lse=True)
        out.backward(shard(do))
        torch.cuda.synchronize()
        errs = [rel(out, shard(ref))] + [rel(t.grad, shard(g)) for t, g in zip(local, ref_grads)]
        rows.append(dict(case=name, docs=len(lens), lse_finite=bool(torch.isfinite(lse).all()),
                         err_out=errs[0], err_dq=errs[1], err_dk=errs[2], err_dv=errs[3]))
    return rows


@pytest.mark.skipif(NGPU < 2, reason="needs 2 GPUs")
def test_pack_zigzag_fresh_packs_over_nccl():
    total = 8192 * NGPU
    cases = [(f"uniform-{s}", pack(total, 1, 4096, s), True, b)
             for s, b in ((0, "ring"), (1, "burst"))]
    cases += [("tiny", pack(total, 1, 64, 2), True, "ring"),
              ("long", pack(total, 1, 1024, 3, long=total // 2), True, "burst"),
              ("one document", (total,), True, "ring"),
              ("full per document", pack(total, 1, 4096, 4), False, "ring"),
              ("full per document, burst", pack(total, 1, 4096, 5), False, "burst")]
    rows = run_ranks(NGPU, fresh_worker, cases, backend="nccl", timeout=900)[0]
    for r in rows:
        print(r)
    for r in rows:
        assert r["lse_finite"], r
        for key in ("err_out", "err_dq", "err_dk", "err_dv"):
            assert r[key] < 2e-2, r  # NaN fails too


def graph_worker(rank, world, backward):
    """Captured once (make_graphed_callables, boundaries a graph input), replayed on new
    packs, against the eager call on the same inputs and pack. A run that captures its own
    graphs keeps the package's replay off (``attention.replay``), whatever the environment."""
    from megatron_burst.comm import settings

    os.environ[settings.REPLAY_ENV] = "off"
    settings.reload()
    dev = torch.device("cuda", rank)
    total, count = 4096 * world, 64
    gen = torch.Generator(device=dev).manual_seed(rank + 11)
    make = lambda: [torch.randn(1, total // world, h, 64, device=dev, generator=gen,  # noqa
                                dtype=torch.bfloat16, requires_grad=True) for h in (16, 4, 4)]

    def fn(q, k, v, cu):
        return mb.burst_attn(q, k, v, causal=True, layout="pack_zigzag", cu_seqlens=cu,
                             backward=backward)

    graphed = torch.cuda.make_graphed_callables(
        fn, (*make(), boundaries(pack(total, 1, 2048, 0), count, dev)), num_warmup_iters=3)
    rows = []
    for trial in range(3):  # new data, new packs (one of a single document)
        lens = pack(total, 1, 2048, 100 + trial) if trial != 1 else (total,)
        cu = boundaries(lens, count, dev)
        inputs = make()
        do = torch.randn(1, total // world, 16, 64, device=dev, generator=gen,
                         dtype=torch.bfloat16)
        eager_in = [t.detach().clone().requires_grad_() for t in inputs]
        out = graphed(*inputs, cu)
        out.backward(do)
        ref = fn(*eager_in, cu)
        ref.backward(do)
        torch.cuda.synchronize()
        errs = [rel(out, ref)] + [rel(a.grad, b.grad) for a, b in zip(inputs, eager_in)]
        rows.append(dict(backward=backward, trial=trial, docs=len(lens), err_out=errs[0],
                         err_dq=errs[1], err_dk=errs[2], err_dv=errs[3]))
    return rows


@pytest.mark.skipif(NGPU < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("backward", ["ring", "burst"])
def test_pack_zigzag_graph_replays_new_packs_over_nccl(backward):
    rows = run_ranks(NGPU, graph_worker, backward, backend="nccl", timeout=600)[0]
    for r in rows:
        print(r)
        for key in ("err_out", "err_dq", "err_dk", "err_dv"):
            assert r[key] < 1e-3, r  # the same kernels on the same data; NaN fails too


def test_pack_zigzag_on_one_gpu_is_one_varlen_call_per_pack():
    """CP=1: the whole pack is one launch bound to the call's boundaries, exact."""
    dev = torch.device("cuda")
    lens = pack(8192, 1, 3000, 7)
    gen = torch.Generator(device=dev).manual_seed(3)
    q, do = (torch.randn(1, 8192, 16, 128, device=dev, generator=gen, dtype=torch.bfloat16)
             for _ in range(2))
    k, v = (torch.randn(1, 8192, 4, 128, device=dev, generator=gen, dtype=torch.bfloat16)
            for _ in range(2))
    ref, ref_grads = per_document(q, k, v, do, lens, True)
    local = [t.clone().requires_grad_() for t in (q, k, v)]
    out = mb.burst_attn(*local, causal=True, layout="pack_zigzag",
                        cu_seqlens=boundaries(lens, len(lens) + 5, dev))
    out.backward(do)
    assert rel(out, ref) < 2e-2
    for t, g in zip(local, ref_grads):
        assert rel(t.grad, g) < 2e-2
